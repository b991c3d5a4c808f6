"""What ``fairseq-alibi windows`` (:mod:`fairseq_alibi.cli.windows_check`) reads: the kind of
model a checkpoint holds, and the split's sequences as that kind reads them, one reader per
kind, each saying how a model scores a sequence:

* :class:`Stream`, a causal language model's: ``length`` consecutive tokens of the split's
  stream (as ``fairseq-alibi eval-lm-stream`` reads it) from start offsets drawn uniformly,
  every token scored (:func:`token_nll`);
* :class:`MaskedStream`, an encoder's (``alibi_roberta`` pre-trained with ``masked_lm``): the
  same, with ``<s>`` first and :data:`MASK_SHARE` of the tokens masked (:class:`Masking`),
  the masked tokens scored (:func:`masked_token_nll`);
* :class:`Pairs`, a translation model's: sentence pairs as they are, or consecutive pairs end
  to end up to ``length`` source tokens, the target scored teacher-forced (:func:`pair_nll`).

Bad input is a :class:`WindowsInputError`, one line naming the argument.
"""

import copy
import math
import os
from dataclasses import dataclass
from typing import List

from fairseq_alibi.error_hints import OneLineError

#: what the tool reads, said when a checkpoint holds something else
SUPPORTED = ("the windows check reads causal ALiBi language models (alibi_transformer_lm or an "
             "alibi_<arch> mirror), ALiBi encoders (alibi_roberta, a masked LM) and ALiBi "
             "translation models (alibi_transformer): give one as CKPT")
#: why an encoder fine-tuned for another task than masked_lm is refused (its fine-tuned models
#: inherit the pretrained encoder's windows)
FINE_TUNED = "the windows check scores an encoder's masked-token predictions"
#: what a checkpoint holds, as :func:`checkpoint_config` says it
LM, ENCODER, TRANSLATION = "lm", "encoder", "translation"
KIND_NAMES = {LM: "causal language model", ENCODER: "masked-LM encoder",
              TRANSLATION: "translation model"}
#: an encoder's sequences: this share of their tokens (after <s>) is masked and predicted
MASK_SHARE = 0.15
#: --lengths by default: the training length times this (at most the split's tokens)
DEFAULT_MULTIPLE = 16


class WindowsInputError(OneLineError):
    """Bad input: printed as ``fairseq-alibi windows: error: <message>``, exit status 2."""


def checkpoint_config(path):
    """``(cfg, kind)``: the configuration of checkpoint ``path`` (read as fairseq reads it) and
    what it holds, :data:`LM`, :data:`ENCODER` (a RoBERTa-style masked LM) or
    :data:`TRANSLATION` (an encoder-decoder), refused otherwise; the weights are loaded later,
    per cutoff."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY, FairseqEncoderDecoderModel
    from fairseq.models.roberta import RobertaModel

    from fairseq_alibi.cli.checkpoint_io import (
        ConversionError,
        language_model_refusal,
        model_config,
        read_model_checkpoint,
    )
    from fairseq_alibi.config_access import architecture_of

    try:  # an unconverted fork's checkpoint would be misread (a stock model) or fail deep down
        state = read_model_checkpoint(path, FINE_TUNED)
    except ConversionError as exc:
        raise WindowsInputError(f"CKPT: {exc}") from None
    refusal = language_model_refusal(path, state, SUPPORTED)
    if refusal is None:
        return state["cfg"], LM
    arch = architecture_of(model_config(state))
    model_class = ARCH_MODEL_REGISTRY.get(arch) or MODEL_REGISTRY.get(arch) or object
    if issubclass(model_class, FairseqEncoderDecoderModel):
        return state["cfg"], TRANSLATION
    if issubclass(model_class, RobertaModel):
        return state["cfg"], ENCODER
    raise WindowsInputError(f"CKPT {refusal}")


def read_stream(cfg, data, subset: str, kind: str = LM):
    """``(task, source, target)``: split ``subset`` of ``data`` as one stream
    (:func:`~fairseq_alibi.cli.stream_eval_lm.split_as_one_block`, the checkpoint's task); an
    encoder's (``kind`` :data:`ENCODER`): its task (``masked_lm``: its dictionary holds
    ``<mask>``) and the split's lines end to end, ``source`` and ``target`` alike
    (:class:`Masking` makes its sequences)."""
    import torch
    from fairseq import tasks
    from fairseq.data import data_utils

    from fairseq_alibi.cli.stream_eval_lm import split_as_one_block, split_tokens
    from fairseq_alibi.config_access import cfg_set

    if not os.path.isfile(os.path.join(str(data), "dict.txt")):
        raise WindowsInputError(f"DATA {data}: no dict.txt there; give a folder written by "
                                "fairseq-preprocess")
    cfg = copy.deepcopy(cfg)
    if kind == ENCODER:
        cfg_set(cfg.task, "data", str(data))
        split_tokens(data, subset, WindowsInputError)
        task = tasks.setup_task(cfg.task)
        lines = data_utils.load_indexed_dataset(os.path.join(str(data), subset),
                                                task.source_dictionary)
        stream = torch.cat([lines[i] for i in range(len(lines))])
        return task, stream, stream
    for key, value in (("data", str(data)), ("sample_break_mode", "none"),
                       ("add_bos_token", False)):
        cfg_set(cfg.task, key, value)
    return split_as_one_block(cfg, subset, error=WindowsInputError)


def read_pairs(cfg, data, subset: str):
    """``(task, pairs)``: the checkpoint's translation task on ``data`` and split ``subset``'s
    sentence pairs, ``[(source, target)]`` in the split's order."""
    from fairseq import tasks

    from fairseq_alibi.config_access import cfg_set

    cfg = copy.deepcopy(cfg)
    cfg_set(cfg.task, "data", str(data))
    try:
        task = tasks.setup_task(cfg.task)
    except FileNotFoundError as exc:
        raise WindowsInputError(f"DATA {data}: {exc}; give the folder fairseq-preprocess wrote "
                                "for this translation model (its dict.<lang>.txt)") from None
    except Exception as exc:  # noqa: BLE001 - fairseq says a folder of no pair with a bare one
        if "Could not infer language pair" not in str(exc):
            raise
        raise WindowsInputError(f"DATA {data}: no translation data there (no "
                                "<split>.<src>-<tgt>.* files, from which fairseq finds the "
                                "languages of a model saved without them); give the folder "
                                "fairseq-preprocess wrote for this translation model") from None
    try:
        task.load_dataset(subset)
    except FileNotFoundError as exc:
        raise WindowsInputError(f"--gen-subset {subset!r}: {exc}; give a split that "
                                "fairseq-preprocess wrote there (both languages)") from None
    dataset = task.dataset(subset)
    pairs = [(item["source"], item["target"]) for item in (dataset[i]
                                                          for i in range(len(dataset)))]
    if not pairs or any(target is None for _, target in pairs):
        raise WindowsInputError(f"--gen-subset {subset!r}: the split of {data} holds no "
                                "sentence pairs: give a split with source and target text")
    return task, pairs


def read_sequences(cfg, data, subset: str, kind: str, seed: int, least_tokens: int = 0):
    """``(task, reader)``: the checkpoint's task on ``data`` and split ``subset``'s sequences as
    ``kind`` reads them: a :class:`Stream` (a language model), a :class:`MaskedStream` (an
    encoder: ``seed`` draws its masks) or :class:`Pairs` (a translation model, decided on
    ``least_tokens`` at least)."""
    if kind == TRANSLATION:
        task, pairs = read_pairs(cfg, data, subset)
        return task, Pairs(pairs, task.target_dictionary.eos(), least_tokens)
    task, source, target = read_stream(cfg, data, subset, kind)
    if kind == LM:
        return task, Stream(source, target)
    words = task.source_dictionary
    if "<mask>" not in words.indices:
        raise WindowsInputError(f"DATA {data}: the task's dictionary has no <mask>: give the "
                                "data of the encoder's masked_lm pre-training")
    return task, MaskedStream(source, Masking(words.bos(), words.index("<mask>"), words.pad(),
                                              seed))


def sample_starts(total: int, length: int, tokens: int, seed: int) -> List[int]:
    """``ceil(tokens / length)`` start offsets (all there are, if fewer) of sequences of
    ``length`` in a stream of ``total`` tokens that do not overlap: the offsets ``phase + k ·
    length`` of the ``total // length`` sequences that fit, ``phase`` drawn from what the stream
    leaves over, in an order drawn uniformly (a cutoff reads a prefix of them, so no token is
    scored twice at one length); the same for the same arguments."""
    import torch

    generator = torch.Generator().manual_seed(seed * 1_000_003 + length)
    fits = total // length
    phase = int(torch.randint(total - fits * length + 1, (1,), generator=generator))
    count = min(math.ceil(tokens / length), fits)
    order = torch.randperm(fits, generator=generator)[:count]
    return (phase + length * order).tolist()


def _nll(log_probs, target):
    """``-log_probs[t, target[t]]`` (``(N, V)``, ``(N,)``): nats, float64, on the CPU."""
    return -log_probs.gather(-1, target[:, None])[:, 0].double().cpu()


def token_nll(model, source, target):
    """Per-token negative log-likelihood (nats, float64, on the CPU) of ``target`` given
    ``source`` (one sequence)."""
    out = model(source[None])
    return _nll(model.get_normalized_probs(out, log_probs=True)[0], target)


def masked_token_nll(model, source, target, pad: int):
    """An encoder's per-token negative log-likelihood (nats, float64, on the CPU) of the tokens
    of ``target`` that are not ``pad`` (the masked ones), given ``source`` (one sequence, those
    tokens masked): its masked-LM head at those positions only."""
    import torch

    masked = target.ne(pad)
    logits = model(source[None], masked_tokens=masked[None])[0]
    return _nll(torch.log_softmax(logits.float(), dim=-1), target[masked])


@dataclass
class Masking:
    """An encoder's sequence from ``length`` tokens of the stream, as ``masked_lm`` gives it:
    ``<s>`` then the first ``length - 1`` tokens; :data:`MASK_SHARE` of those (at least one)
    replaced by ``<mask>`` at positions drawn from the sequence's start offset and ``seed``
    (the same for the dense model and every cutoff), the target ``pad`` elsewhere."""

    bos: int
    mask: int
    pad: int
    seed: int

    def unmasked(self, tokens):
        import torch

        return torch.cat([tokens.new_tensor([self.bos]), tokens[:-1]])

    def __call__(self, tokens, start: int):
        import torch

        source = self.unmasked(tokens)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + start)
        count = max(1, round(MASK_SHARE * (source.numel() - 1)))
        at = torch.randperm(source.numel() - 1, generator=generator)[:count] + 1
        target = torch.full_like(source, self.pad)
        target[at] = source[at]
        source[at] = self.mask
        return source, target


def pair_nll(model, source, previous, target):
    """A translation model's per-token negative log-likelihood (nats, float64, on the CPU) of
    ``target`` given ``source`` and the target shifted right (``previous``: teacher forcing)."""
    import torch

    lengths = torch.tensor([source.numel()], device=source.device)
    out = model(source[None], lengths, previous[None])
    return _nll(model.get_normalized_probs(out, log_probs=True)[0], target)


class Stream:
    """A language model's sequences (:func:`read_stream`): ``length`` consecutive tokens of the
    split's stream from start offsets drawn uniformly (:func:`sample_starts`), every token
    scored (:func:`token_nll`)."""

    def __init__(self, source, target):
        self.source, self.target = source, target

    @property
    def total(self) -> int:
        """The split's tokens."""
        return self.source.numel()

    #: its sequences are ``length`` tokens (``--sinks`` are checked against them)
    whole_sequences = True
    #: the fewest tokens the stopping rule decides on (one sequence of a language model: its
    #: ``length`` tokens are a sample of the text)
    least_tokens = 0

    def default_lengths(self, cfg) -> List[int]:
        """``--lengths`` by default: the checkpoint's training length times
        :data:`DEFAULT_MULTIPLE`, at most the split's."""
        from fairseq_alibi.config_access import cfg_get

        trained = cfg_get(cfg_get(cfg, "task"), "tokens_per_sample")
        if not isinstance(trained, int) or trained < 2:
            raise WindowsInputError(f"--lengths: CKPT records no training length "
                                    f"(tokens_per_sample {trained!r}); give --lengths")
        return [min(trained * DEFAULT_MULTIPLE, self.total)]

    def starts(self, length: int, tokens: int, seed: int) -> List[int]:
        return sample_starts(self.total, length, tokens, seed)

    def kept_length(self, length: int) -> int:
        """The sequence length whose attention kept stands for ``length``'s: itself."""
        return length

    def inputs(self, length: int, start: int) -> tuple:
        """What :meth:`score` reads of the sequence of ``length`` at ``start``."""
        return self.source[start:start + length], self.target[start:start + length]

    def forward_args(self, length: int, start: int) -> tuple:
        """The dense model's inputs for that sequence (the attention mass's pass)."""
        return (self.source[None, start:start + length],)

    def score(self, model, inputs):
        return token_nll(model, *inputs)


class MaskedStream(Stream):
    """An encoder's sequences: the stream's, as :class:`Masking` makes them, its masked tokens
    scored (:func:`masked_token_nll`); the attention mass on them unmasked."""

    def __init__(self, stream, masking: Masking):
        super().__init__(stream, stream)
        self.masking = masking

    def inputs(self, length: int, start: int) -> tuple:
        return self.masking(self.source[start:start + length], start)

    def forward_args(self, length: int, start: int) -> tuple:
        return (self.masking.unmasked(self.source[start:start + length])[None],)

    def score(self, model, inputs):
        return masked_token_nll(model, *inputs, self.masking.pad)


class Pairs:
    """A translation model's sequences (:func:`read_pairs`): from a sentence pair drawn
    uniformly, that pair and the next ones of the split until their sources hold ``length``
    tokens (or the split ends), each side's sentences end to end (each keeps its ``</s>``): at
    ``length`` 1 (the default) each pair as it is, what ``fairseq-validate`` and
    ``fairseq-generate`` read; the target's tokens scored given the source, teacher-forced
    (:func:`pair_nll`)."""

    whole_sequences = False

    def __init__(self, pairs, eos: int, least_tokens: int = 0):
        import torch

        self.pairs, self.eos = pairs, eos  # [(source, target)]
        # sentence pairs are short, and a window drops nothing of the shortest (their changes
        # are exactly 0): the stopping rule decides only on a sample of the split this large
        # (the tool's: as many tokens as a language model's default sequence)
        self.least_tokens = least_tokens
        self.ends = torch.tensor([source.numel() for source, _ in pairs]).cumsum(0)

    @property
    def total(self) -> int:
        return int(self.ends[-1])

    def default_lengths(self, cfg) -> List[int]:
        """``--lengths`` by default: 1, each sentence pair as it is."""
        return [1]

    def kept_length(self, length: int) -> int:
        """A sequence of ``length`` holds at least one pair: the pairs' mean source length."""
        return max(length, round(self.total / len(self.pairs)))

    def starts(self, length: int, tokens: int, seed: int) -> List[int]:
        """About ``tokens`` source tokens' worth of sequences of ``length`` (the pairs' mean
        source length at least), as different first pairs (all there are, if fewer), drawn
        uniformly (:func:`sample_starts` over the pairs), in the order drawn; the same for the
        same arguments."""
        count = math.ceil(tokens / max(length, self.total / len(self.pairs)))
        return sample_starts(len(self.pairs), 1, count, seed + length - 1)

    def inputs(self, length: int, start: int) -> tuple:
        import torch

        before = int(self.ends[start - 1]) if start else 0
        last = int(torch.searchsorted(self.ends, before + length))  # the pair that reaches it
        chosen = self.pairs[start:last + 1]
        source = torch.cat([s for s, _ in chosen])
        target = torch.cat([t for _, t in chosen])
        return source, torch.cat([target.new_tensor([self.eos]), target[:-1]]), target

    def forward_args(self, length: int, start: int) -> tuple:
        import torch

        source, previous, _ = self.inputs(length, start)
        return source[None], torch.tensor([source.numel()]), previous[None]

    def score(self, model, inputs):
        return pair_nll(model, *inputs)


def translations(model, task, pairs, count: int, beam: int, device) -> List[str]:
    """``model``'s best beam-search translations of the first ``count`` sources of ``pairs``
    (``(source, target)`` tensors), one sentence at a time, as the target dictionary's tokens
    (what ``fairseq-generate`` writes as ``H`` without ``--remove-bpe``)."""
    from argparse import Namespace

    import torch

    generator = task.build_generator([model], Namespace(beam=beam))
    found = []
    for source, _ in pairs[:count]:
        sample = {"net_input": {"src_tokens": source[None].to(device),
                                "src_lengths": torch.tensor([source.numel()], device=device)}}
        with torch.no_grad():
            best = generator.generate([model], sample)[0][0]
        found.append(task.target_dictionary.string(best["tokens"].cpu()))
    return found

