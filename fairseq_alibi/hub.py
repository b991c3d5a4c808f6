"""``from_pretrained`` of the ALiBi models: offline, of the class asked for, at any length.

Stock ``from_pretrained`` (``fairseq.hub_utils``) has four surprises for ALiBi checkpoints:

* RoBERTa's default BPE is GPT-2's, whose files default to URLs: offline, building it fails deep
  inside (``No module named 'requests'``), online it downloads. Here ``encoder.json`` and
  ``vocab.bpe`` are taken from the checkpoint's folder or the data folder when they are there
  (as fairseq already does for ``sentencepiece.bpe.model``, ``merges.txt``, ...); otherwise a
  one-line error names the files and the arguments, and nothing is downloaded.
* it builds whatever model the checkpoint names, so a stock checkpoint silently comes back as a
  stock model: here that is a :class:`WrongCheckpointError` naming the class to use (or, for an
  unconverted checkpoint of Press's ALiBi fork, the convert command), shown as one line.
* a ``model_overrides`` argument, as the command lines take it, is an option of that name to
  it, silently ignored: here its options are the keyword arguments they are; and a checkpoint
  that is not there fails with a ``TypeError``: here, one line naming it.
* the language-model hub batches with the training run's ``--max-tokens`` and asserts that no
  sentence is longer; an ALiBi model scores any length, so a longer sentence gets a batch of its
  own (:class:`AlibiLanguageModelHubInterface`).
"""

import logging
import numbers
import os
import pickle
from typing import Dict, Iterable, Optional

import torch
from fairseq import hub_utils
from omegaconf import open_dict

from fairseq_alibi.config_access import cfg_get, overrides_dict
from fairseq_alibi.error_hints import (CheckpointMismatchError, OneLineError, hint_for,
                                       raised_by_plugin)
from fairseq_alibi.models.override_keys import overrides_named
from fairseq_alibi.options import keyword_names
from fairseq_alibi.safe_loading import read_mapped

logger = logging.getLogger(__name__)

#: ``from_pretrained`` argument -> the GPT-2 BPE file it names
GPT2_BPE_FILES = {"gpt2_encoder_json": "encoder.json", "gpt2_vocab_bpe": "vocab.bpe"}


def _is_url(path) -> bool:
    return "://" in str(path)


def local_gpt2_bpe(folders: Iterable[Optional[str]]) -> Dict[str, str]:
    """``{argument: path}`` of the first folder holding both GPT-2 BPE files (else ``{}``)."""
    for folder in folders:
        if not folder or _is_url(folder):
            continue
        found = {arg: os.path.join(folder, name) for arg, name in GPT2_BPE_FILES.items()}
        if all(os.path.isfile(path) for path in found.values()):
            return found
    return {}


class MissingBpeFilesError(OneLineError):
    """The GPT-2 BPE's files are not local (nothing is downloaded); the message is the fix."""


def check_gpt2_bpe(bpe_cfg, searched, given=()):
    """A one-line error unless a ``gpt2`` BPE config names local files (nothing downloads).

    ``given``: the arguments the caller passed explicitly (a URL there is their choice).
    """
    if bpe_cfg is None or cfg_get(bpe_cfg, "_name") != "gpt2":
        return
    for arg, name in GPT2_BPE_FILES.items():
        path = cfg_get(bpe_cfg, arg)
        if arg in given and _is_url(path):
            continue
        if path and not _is_url(path) and os.path.isfile(path):
            continue
        folders = list(dict.fromkeys(os.path.normpath(str(f)) for f in searched if f))
        where = (f"neither {' nor '.join(folders)} holds" if len(folders) > 1
                 else f"{folders[0]} does not hold") if folders else "no folder holds"
        raise MissingBpeFilesError(
            f"the GPT-2 BPE needs {name} (found {path!r}, not a local file; {where} both "
            f"encoder.json and vocab.bpe): put them beside the checkpoint, or pass "
            f"gpt2_encoder_json='.../encoder.json', gpt2_vocab_bpe='.../vocab.bpe' to "
            f"from_pretrained (or bpe='sentencepiece', sentencepiece_model='.../spm.model')"
        )


class WrongCheckpointError(OneLineError):
    """``from_pretrained`` was given a checkpoint of another model; the message is the fix."""


def _a(name: str) -> str:
    """``name`` with its indefinite article."""
    return f"{'an' if name[:1].upper() in 'AEIOU' else 'a'} {name}"


def check_model_class(model, expected_class, expected_name: str, checkpoint: str):
    """A clear error when the checkpoint built a model of another class (a stock checkpoint)."""
    if isinstance(model, expected_class):
        return
    built = type(model).__name__
    raise WrongCheckpointError(
        f"{checkpoint} holds {_a(built)}, not an {expected_name} model (it was trained by another "
        f"architecture): load it with {built}.from_pretrained, or give an {expected_name} "
        f"checkpoint"
    )


def _read_on_error(checkpoint: str) -> Optional[dict]:
    """``checkpoint`` read again, only on an error path, or ``None`` where it cannot be read:
    then the caller's error stands (:func:`~fairseq_alibi.safe_loading.read_mapped`)."""
    return read_mapped(checkpoint) if os.path.isfile(checkpoint) else None


def refuse_unconverted_press_file(checkpoint: str):
    """The Press-fork error (:func:`~fairseq_alibi.models.checks.is_unconverted_press_config`)
    if ``checkpoint`` is an unconverted checkpoint of that fork (read again from the file:
    building the stock model drops the fork's ``max_tokens`` from the loaded config)."""
    from fairseq_alibi.models.checks import refuse_unconverted_press_checkpoint

    state = _read_on_error(checkpoint)
    if state is not None:
        refuse_unconverted_press_checkpoint(state, checkpoint)


def refuse_failed_load(checkpoint: str, model_class, expected_name: str, data_dir: str,
                       failure: BaseException):
    """Why fairseq's loader failed on ``checkpoint``, where the checkpoint says it: it holds
    another kind of model (whose task reads other files: a language model's ``dict.txt`` in a
    translation folder), or a file its task reads is missing from ``data_dir`` (a fine-tuned
    classifier given its pre-training data). Nothing to say: the failure stands."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY

    from fairseq_alibi.config_access import architecture_of

    state = _read_on_error(checkpoint)
    cfg = (state or {}).get("cfg") or {}
    model_cfg = cfg.get("model") if hasattr(cfg, "get") else None
    model_cfg = model_cfg if model_cfg is not None else (state or {}).get("args")
    if model_cfg is None:
        return
    arch = architecture_of(model_cfg)
    found = ARCH_MODEL_REGISTRY.get(arch) or MODEL_REGISTRY.get(arch)
    if found is not None and not issubclass(found, model_class):
        raise WrongCheckpointError(
            f"{checkpoint} holds {_a(found.__name__)} ({arch}), not an {expected_name} model: "
            f"load it with {found.__name__}.from_pretrained, or give an {expected_name} "
            "checkpoint") from None
    missing = getattr(failure, "filename", None)
    inside = missing and os.path.abspath(str(missing)).startswith(
        os.path.join(os.path.abspath(data_dir), ""))  # another file (a BPE's): its own error
    if isinstance(failure, FileNotFoundError) and inside:
        task = cfg_get(cfg.get("task") if hasattr(cfg, "get") else None, "_name") or \
            cfg_get(model_cfg, "task")
        raise HubArgumentError(
            f"{checkpoint} was trained with the task {task}, which reads {missing}, not in "
            f"{data_dir}: give data_name_or_path the folder it was trained on (a fine-tuned "
            "classifier's: its GLUE <TASK>-bin folder, with input0/ and label/)") from None


class HubArgumentError(OneLineError):
    """A ``from_pretrained`` argument that cannot be what it names; the message is the fix."""


def with_model_overrides(kwargs: dict) -> dict:
    """``kwargs`` with a ``model_overrides`` argument (the command lines' ``--model-overrides``,
    a dict or its text, e.g. ``"{'alibi_window_cutoff': 8}"``) merged in as keyword arguments,
    which is how ``from_pretrained`` overrides options: stock ``hub_utils`` would take it for
    an option of that name and silently ignore it."""
    if "model_overrides" not in kwargs:
        return kwargs
    kwargs = dict(kwargs)
    given = kwargs.pop("model_overrides")
    overrides = overrides_dict(given)
    if overrides is None:
        raise HubArgumentError(
            f"model_overrides={given!r} is not a dict of option names: give the options as "
            "keyword arguments, e.g. from_pretrained(..., alibi_window_cutoff=8), or "
            "model_overrides=\"{'alibi_window_cutoff': 8}\"")
    both = sorted(k for k in overrides if k in kwargs and kwargs[k] != overrides[k])
    if both:
        raise HubArgumentError(f"{both[0]} is given twice with different values, as a keyword "
                               "argument and in model_overrides: give it once")
    return {**kwargs, **overrides}


def check_checkpoint_files(model_class, model_name_or_path, checkpoint_file: str,
                           data_dir: str):
    """A one-line error naming a local checkpoint or data folder that is not there (fairseq's
    loader fails on either with a ``TypeError``); a name of ``hub_models()`` or a URL is
    fairseq's to fetch."""
    model = str(model_name_or_path)
    if model in model_class.hub_models() or _is_url(model):
        return
    if not _is_url(data_dir) and not os.path.isdir(data_dir.split(os.pathsep)[0]):  # shards
        raise HubArgumentError(
            f"no data folder {data_dir}: from_pretrained's third argument, data_name_or_path, "
            "is the folder of the model's dictionary (its dict.txt: the data folder it was "
            "trained on, or the checkpoint's own with '.')")
    for name in checkpoint_file.split(os.pathsep):  # an ensemble: "a.pt:b.pt"
        path = os.path.join(model, name)
        if not os.path.isfile(path):
            where = "" if os.path.isdir(model) else f" (no folder {model})"
            raise HubArgumentError(
                f"no checkpoint at {path}{where}: from_pretrained takes the folder that "
                "holds the checkpoint, the checkpoint's file name in it, and the data folder "
                "(its dict.txt), e.g. from_pretrained('checkpoints', 'checkpoint_best.pt', "
                "'data-bin')")


def load_pretrained(model_class, expected_name, model_name_or_path, checkpoint_file,
                    data_name_or_path, **kwargs) -> dict:
    """``hub_utils.from_pretrained`` for an ALiBi model class, offline; see the module doc."""
    where = "from_pretrained's keyword arguments" + (" or model_overrides"
                                                     if "model_overrides" in kwargs else "")
    kwargs = with_model_overrides(kwargs)
    model_dir = str(model_name_or_path)
    data_dir = str(data_name_or_path)
    if data_dir.startswith("."):  # as hub_utils: relative to the checkpoint's folder
        data_dir = os.path.join(model_dir, data_dir)
    check_checkpoint_files(model_class, model_name_or_path, checkpoint_file, data_dir)
    searched = [model_dir, data_dir]
    given = {arg for arg in GPT2_BPE_FILES if arg in kwargs}
    if not given:
        kwargs.update(local_gpt2_bpe(searched))
    checkpoint = os.path.join(model_dir, checkpoint_file)
    try:
        with overrides_named(where):
            loaded = hub_utils.from_pretrained(
                model_name_or_path, checkpoint_file, data_name_or_path,
                archive_map=model_class.hub_models(), **kwargs,
            )
        check_model_class(loaded["models"][0], model_class, expected_name, checkpoint)
    except WrongCheckpointError:
        try:
            refuse_unconverted_press_file(checkpoint)  # the more precise error, if it is one
        except ValueError as press:
            raise WrongCheckpointError(str(press)) from None
        raise
    except ValueError as refused:
        # the plugin's checks refuse a fork's checkpoint from deep inside fairseq's loader:
        # the message is the fix, the loader's frames would only bury it (a OneLineError, such
        # as a misspelt ALiBi option among the keyword arguments, already is one: kept as is)
        if isinstance(refused, OneLineError) and \
                not isinstance(refused, CheckpointMismatchError):
            raise type(refused)(keyword_names(str(refused))) from None  # named as given
        if not raised_by_plugin(refused):
            refuse_failed_load(checkpoint, model_class, expected_name, data_dir, refused)
            raise
        raise WrongCheckpointError(keyword_names(str(refused))) from None
    except (OSError, AttributeError, KeyError, EOFError, RuntimeError,
            pickle.UnpicklingError) as failed:  # fairseq's, on another kind of model or file
        refuse_failed_load(checkpoint, model_class, expected_name, data_dir, failed)
        hint = hint_for(failed)  # an empty, truncated or foreign file: what the hook would say
        if hint is not None:
            raise HubArgumentError(hint) from None
        raise
    check_gpt2_bpe(loaded["args"].bpe, searched, given)
    warn_unencoded_pieces(loaded)
    return loaded


#: sentencepiece's mark of a word's start; a dictionary of mostly such symbols is of pieces
PIECE_START = "\u2581"


def warn_unencoded_pieces(loaded):
    """Warn when the dictionary holds sentencepiece pieces and no BPE is given: ``encode``
    would split text at spaces, and nearly every word would be ``<unk>`` (the pipelines
    binarize with sentencepiece themselves, so the checkpoint names no BPE)."""
    if cfg_get(loaded["args"], "bpe") is not None:
        return
    task = loaded["task"]
    dictionary = getattr(task, "source_dictionary", None) or task.target_dictionary
    words = dictionary.symbols[dictionary.nspecial:]
    if sum(w.startswith(PIECE_START) for w in words) > len(words) / 4:
        logger.warning(
            "this model's dictionary holds sentencepiece pieces and no BPE was given: encode() "
            "would split text at spaces and read most words as <unk>; pass bpe='sentencepiece', "
            "sentencepiece_model='.../spm.model' (the model the data was encoded with) to "
            "from_pretrained")


class AlibiLanguageModelHubInterface(hub_utils.GeneratorHubInterface):
    """fairseq's language-model hub interface, scoring and generating at any length.

    Sentences are batched with the training run's ``--max-tokens`` as usual; one longer than
    that (which stock fairseq refuses with ``Sentences lengths should not exceed max_tokens``)
    gets a batch sized to it, since an ALiBi model has no maximum length.
    """

    def generate(self, tokenized_sentences, *args, **kwargs):
        """fairseq's ``generate``, refusing a length limit that leaves no room after a prompt:
        for a language model ``max_len_a·P + max_len_b`` counts the prompt's ``P`` tokens,
        and stock fairseq returns the prompt cut to that many tokens, generating nothing
        (``score`` generates nothing: ``score_reference``); also a ``beam`` below 1 (stock: a
        reshape error deep in the search) and, for ``score``, an empty sentence."""
        from fairseq.models import FairseqLanguageModel

        beam = args[0] if args else kwargs.get("beam", 1)
        if isinstance(beam, bool) or not isinstance(beam, numbers.Integral) or beam < 1:
            raise HubArgumentError(f"beam={beam!r}: the number of hypotheses kept at each step "
                                   "is a whole number, at least 1 (1: greedy)")
        # a translation's limit counts target tokens (the translation hub is this class too)
        if not isinstance(self.models[0], FairseqLanguageModel):
            return super().generate(tokenized_sentences, *args, **kwargs)
        prompts = ([tokenized_sentences] if torch.is_tensor(tokenized_sentences)
                   and tokenized_sentences.dim() == 1 else tokenized_sentences)
        if kwargs.get("score_reference"):
            self._refuse_empty(prompts)
            return super().generate(tokenized_sentences, *args, **kwargs)
        self._refuse_inner_boundaries(prompts)
        longest = max((len(t) for t in prompts), default=0)
        get = lambda k: kwargs.get(k, cfg_get(self.cfg.generation, k))  # noqa: E731
        limit = get("max_len_a") * longest + get("max_len_b")
        if longest and limit <= longest:
            raise HubArgumentError(
                f"max_len_b={get('max_len_b')} leaves no room after the {longest}-token prompt: "
                "for a language model it counts the prompt's tokens too (fairseq would return "
                f"the prompt cut to {int(limit)} tokens); to generate N tokens give "
                f"max_len_b={longest} + N")
        return super().generate(tokenized_sentences, *args, **kwargs)

    def _refuse_empty(self, sentences):
        """A sentence with no token but ``</s>`` is refused by ``score``: the language-model
        task scores the tokens before the final ``</s>``, none here, and their mean was NaN."""
        eos = self.src_dict.eos()
        for index, sentence in enumerate(sentences):
            if not bool((sentence != eos).any()):
                raise HubArgumentError(
                    f"sentence {index} is empty: it has no token to score (its mean log-"
                    "probability would be NaN); drop it, or give text of at least one token")

    def _refuse_inner_boundaries(self, prompts):
        """A prompt holding ``</s>`` between its tokens is refused: fairseq's language-model
        task strips a prompt's ``</s>`` at its ends only, and its generator ends a hypothesis
        at a ``</s>`` of its prefix, so it returned the text before the first one and read
        nothing after it. With a document mask that text cannot reach what follows the last
        boundary anyway: the last document alone generates the same."""
        from fairseq_alibi.alibi import document_starts
        from fairseq_alibi.modules.bias import AlibiBias

        eos = self.src_dict.eos()
        for index, prompt in enumerate(prompts):
            real = torch.nonzero(prompt != eos)
            if real.numel() == 0:
                continue
            inside = prompt[int(real[0]):int(real[-1]) + 1]
            if not bool((inside == eos).any()):
                continue
            modes = {m.document_mask for m in self.models[0].modules()
                     if isinstance(m, AlibiBias)} - {"none"}
            # a boundary of the model's mask between the prompt's tokens
            masked = any(bool(document_starts((inside == eos)[None], mode)[:, 1:].any())
                         for mode in modes)
            raise HubArgumentError(
                f"prompt {index} holds </s> between its tokens: fairseq's generator ends a "
                "hypothesis at a </s> of its prompt, so the text after it would never be read; "
                + ("with this model's document mask the text before a boundary cannot reach "
                   "what follows it: give the last document alone, which generates the same"
                   if masked else "give text without </s> (one line)"))

    def _build_batches(self, tokens, skip_invalid_size_inputs):
        limit = self.cfg.dataset.max_tokens
        longest = max((t.numel() for t in tokens), default=0)
        if limit is None or longest <= limit:
            return super()._build_batches(tokens, skip_invalid_size_inputs)
        with open_dict(self.cfg):
            self.cfg.dataset.max_tokens = longest  # the batches are made right here
            try:
                return super()._build_batches(tokens, skip_invalid_size_inputs)
            finally:
                self.cfg.dataset.max_tokens = limit
