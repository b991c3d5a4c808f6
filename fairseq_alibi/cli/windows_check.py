"""``fairseq-alibi windows``: the check before turning slope windows on, on your own model.

    fairseq-alibi windows CKPT DATA [--gen-subset valid] [--lengths L1,L2,...] [--tokens N]
        [--cutoffs 4,6,8,12,16] [--sinks 0,4] [--tolerance 0.1] [--sink-mass 0.05]
        [--seed 1] [--out DIR] [--bleu N] [--cpu]

``--alibi-window-cutoff T`` makes head ``h`` drop the keys beyond ``W_h = ceil(T / m_h)``
(:func:`fairseq_alibi.alibi.window_lengths` of its effective slope ``m_h``). The bound ``e^-T``
holds against a key at distance 0 *with the same logit*, not against the keys a head prefers: a
head that learned an attention sink (most of its weight on the first tokens, whatever the
distance) loses that weight under windows, unless its first positions are kept beside them
(``--alibi-window-sinks S``, attention sinks). This tool measures, on a causal ALiBi language
model (``alibi_transformer_lm`` and the ``alibi_<arch>`` mirrors) and a binarized
``language_modeling`` folder, what the cutoffs would change, at the cost of the few sequences
its verdict needs:

* **perplexity, per cutoff, as few tokens as the verdict needs.** The cutoffs of ``--cutoffs``
  are tried in increasing order, each first without sinks (``S = 0``) and, where that fails
  (not within, or a sink head that needs its first positions kept), with each ``S > 0`` of
  ``--sinks`` in increasing order; the first ``(T, S)`` that passes is the verdict: the later
  ones are not evaluated. A candidate is scored with the checkpoint loaded with the load-time
  overrides ``{'alibi_window_cutoff': T, 'alibi_window_sinks': S}`` (what
  ``--model-overrides`` gives), against the checkpoint
  with the cutoff off, on the same sequences of split ``--gen-subset`` (read as one stream, as
  ``fairseq-alibi eval-lm-stream`` reads it) at each length of ``--lengths`` (default: the
  checkpoint's training ``tokens_per_sample`` times :data:`DEFAULT_MULTIPLE`, at most the
  split), longest first. The sequences do not overlap (offsets on a grid of the length, its
  phase and order drawn uniformly, ``--seed``; the same every run) and are scored one at a
  time, each adding its per-token
  changes of the negative log-likelihood, until the **stopping rule** decides: with ``Δ`` the
  perplexity change (percent of dense, on the tokens scored so far) and ``σ`` its standard
  error (the per-token changes' means over blocks of :data:`.windows_report.BLOCK` tokens, at
  least :data:`.windows_report.MIN_BLOCKS` blocks), the cutoff is *within* at that length
  when ``|Δ| + Z·σ <= --tolerance`` (``Z`` = :data:`.windows_report.Z`), *beyond* when
  ``|Δ| - Z·σ > --tolerance``, and otherwise one more sequence is scored, up to ``--tokens``
  tokens (default: :data:`DEFAULT_TOKENS`, at most the split's, in whole sequences); still
  undecided there, it is not within (*undecided*: more ``--tokens`` may decide it). Every
  ``S`` of a cutoff is scored on the same sequences (dense's are computed once). ``(T, S)``
  passes when it is within at every length, keeps the first positions its sink heads need
  (below) and drops keys of the sequences scored (windows as long as them change every score
  by exactly 0: the tool stops there, with no verdict).
* **the attention mass beyond each window**, per layer and head (both counted from 0) and per
  ``T``: the dense model's attention probabilities ``p[i, j]`` (its own, asked with
  ``need_head_weights`` through forward hooks, one sequence at a time) summed over the keys
  beyond the window, ``beyond_i = sum_{j < i - W_h} p[i, j]``: mean, 99th percentile and max
  over the queries that have such keys (``i > W_h``), and, for each ``S`` of ``--sinks``, the
  share of that mass on the first ``S`` positions of the sequence (with a document mask, of
  the query's document: the sinks of ``--alibi-window-sinks`` then). Explicit weights cost
  ``L²`` per head, so they are asked on their own sample, :data:`MASS_TOKENS` tokens in
  sequences of ``min(shortest length, MASS_LENGTH)`` (:data:`MASS_LENGTH`): a head whose
  window is that long or longer has no key beyond it there (the perplexity, at every length,
  still counts it). A head whose mean mass beyond its window on the first ``max(--sinks)``
  positions is at least ``--sink-mass`` is a *sink head* (``layer L head h``; ``--sinks 0``
  alone turns this off). A sink head *needs* the smallest ``S`` of ``--sinks`` whose first
  positions leave less than ``--sink-mass`` of that mass beyond them (``max(--sinks)`` at
  most): ``(T, S)`` passes only with ``S`` at least what every sink head at ``T`` needs;
* per ``(T, S)``, computed from the windows: the attention kept (the share of the score entries
  ``(i, j)``, ``j <= i``, within them or on the first ``S`` positions: what a windowed backend
  computes and holds; not timed, the backends' timings are in docs/benchmarks.md) and the keys
  a decoding cache keeps (``max_h W_h + S``).

Outputs: a table on stdout, ``windows.md``, ``windows_heads.csv`` (a row per layer, head and
``T``), ``windows_cutoffs.csv`` (a row per ``(T, S)`` evaluated, and one per ``T`` not
evaluated) and ``windows.png`` (mass beyond the window by head and ``T``; needs matplotlib) in
``--out``. The last line of stdout is the verdict: ``recommended: --alibi-window-cutoff T``
(the smallest ``T`` of ``--cutoffs`` that passes without sinks), ``recommended:
--alibi-window-cutoff T --alibi-window-sinks S`` (it passes only with its first ``S`` positions
kept) or ``not recommended: <reason>`` (what failed: the closest change, with the largest ``S``
tried, and the sink heads). A model with a document mask is checked alike, its sinks being the
first positions of each document. An ALiBi encoder (``alibi_roberta`` pre-trained with
``masked_lm``) is checked alike on its masked tokens (:class:`MaskedStream`), each head's
window ``back/ahead`` and its mass beyond counted on both sides. A translation model
(``alibi_transformer``) is checked on the split's sentence pairs, consecutive pairs end to end
up to ``L`` source tokens (:class:`Pairs`; ``--lengths`` by default 1: each pair as it is), its
target tokens scored teacher-forced, with the cutoff on each side that has an
ALiBi self-attention (``--encoder-alibi-window-cutoff T --decoder-alibi-window-cutoff T``);
its layers are numbered encoder first; with ``--bleu N`` the recommended cutoff's translations
of the split's first ``N`` sources are scored against dense's (:func:`bleu_lines`), since the
verdict is on perplexity. What it reads, and how each kind of model scores a
sequence: :mod:`fairseq_alibi.cli.windows_inputs`; the stopping rule, the rows, the verdict and
the report: :mod:`fairseq_alibi.cli.windows_report`. Bad input is one line naming the argument,
exit status 2. The checkpoint is only read.
"""

import argparse
import contextlib
import math
import os
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from fairseq_alibi.cli.windows_inputs import (DEFAULT_MULTIPLE, ENCODER, KIND_NAMES, LM,
                                              TRANSLATION, SUPPORTED, WindowsInputError,
                                              checkpoint_config, read_sequences)
from fairseq_alibi.cli.windows_report import (BLOCK, MIN_BLOCKS, Z, Candidate, CutoffRow,
                                              WINDOWED_ATTENTION, HeadRow, Judged, judge, plot,
                                              recommended, summary_lines, verdict, write_csvs,
                                              write_report, write_table)

PROG = "fairseq-alibi windows"
DEFAULT_CUTOFFS = (4.0, 6.0, 8.0, 12.0, 16.0)
DEFAULT_SINKS = (0, 4)
#: percent of dense perplexity (docs/benchmarks.md's goal for T)
DEFAULT_TOLERANCE = 0.1
DEFAULT_SINK_MASS = 0.05
#: --tokens by default (at most the split's tokens): the count at which the verdict was the same
#: as with twice as many for every seed tried (docs/benchmarks.md, "Before you turn windows on")
DEFAULT_TOKENS = 16384
#: the attention mass's own sample: this many tokens, in sequences of at most MASS_LENGTH
MASS_TOKENS = 1024
MASS_LENGTH = 1024
DEFAULT_OUT = os.path.join("outputs", "windows")
#: queries whose running sums over the keys are held at once (memory: this times L doubles)
QUERY_CHUNK = 512
#: the heads the stdout table shows (the most mass beyond their windows); the report has all
SHOWN_HEADS = 12
#: --bleu's beam size: fairseq-generate's default
BEAM = 5


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line naming the flag, not argparse's usage block
        raise WindowsInputError(message)


def _value(kind, rule: str, ok):
    """argparse type: a ``kind`` for which ``ok`` holds; otherwise '<text> is not <rule>'."""
    def parse(text: str):
        try:
            value = kind(text.strip())
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"{text.strip()!r} is not {rule}")
        return value
    return parse


def _list_of(kind, rule: str, ok):
    """argparse type: comma-separated :func:`_value` s, sorted, without repeats."""
    one = _value(kind, rule, ok)
    return lambda text: sorted({one(part) for part in text.split(",")})


def build_parser() -> argparse.ArgumentParser:
    finite = math.isfinite
    parser = _Parser(prog=PROG, description=(
        "The check before --alibi-window-cutoff T: the perplexity change of each T against "
        "dense, in increasing T until one passes (without sinks, then with each S > 0 of "
        "--sinks kept: --alibi-window-sinks S), each on as many sampled sequences as its "
        "verdict needs; per layer and head, the dense attention mass beyond each window (and "
        "on the first --sinks positions: attention sinks); the attention kept. The last line "
        "of stdout is the verdict, 'recommended: --alibi-window-cutoff T [--alibi-window-sinks "
        "S]' or 'not recommended: <reason>'."))
    parser.add_argument("checkpoint", metavar="CKPT", help="a causal ALiBi LM checkpoint, an "
                        "ALiBi encoder's masked_lm one (scored on its masked tokens) or an ALiBi "
                        "translation model's (its target tokens)")
    parser.add_argument("data", metavar="DATA", help="a folder written by fairseq-preprocess "
                        "(the language_modeling, masked_lm or translation task's data)")
    parser.add_argument("--gen-subset", default="valid", help="the split sampled (default: valid)")
    parser.add_argument("--lengths", metavar="L1,L2,...", type=_list_of(
        int, "a sequence length >= 2 (e.g. --lengths 512,2048)", lambda v: v >= 2),
        help=f"sequence lengths, each checked (default: the checkpoint's tokens_per_sample "
        f"times {DEFAULT_MULTIPLE}, at most the split)")
    parser.add_argument("--tokens", type=_value(int, "a number of tokens >= 1", lambda v: v >= 1),
                        metavar="N", help=f"the most tokens scored per cutoff and length, in "
                        f"whole sequences, at least one (default: {DEFAULT_TOKENS:,}, at most "
                        "the split's); a cutoff's verdict often needs fewer")
    parser.add_argument("--cutoffs", metavar="T1,T2,...", default=list(DEFAULT_CUTOFFS),
                        type=_list_of(float, "a positive finite number of nats (e.g. --cutoffs "
                                      "4,8)", lambda v: finite(v) and v > 0),
                        help="the cutoffs T checked, in increasing order until one passes "
                        "(default: 4,6,8,12,16)")
    parser.add_argument("--sinks", metavar="S1,S2,...",
                        type=_list_of(int, "a number of first positions >= 0 (e.g. --sinks 0,4)",
                                      lambda v: v >= 0),
                        help="the attention sinks tried (--alibi-window-sinks S), each S > 0 in "
                        "increasing order where a cutoff fails without, and the share of the "
                        "mass beyond each window on the first S positions (of each document, "
                        "with a document mask; default: 0,4); sink heads are judged on the "
                        "largest S")
    parser.add_argument("--tolerance", default=DEFAULT_TOLERANCE, metavar="PERCENT",
                        type=_value(float, "a finite percentage >= 0 (e.g. --tolerance 0.1)",
                                  lambda v: finite(v) and v >= 0),
                        help=f"largest perplexity change recommended, in percent of dense at "
                        f"every length, its {Z:g}-sigma margin included (default: 0.1)")
    parser.add_argument("--sink-mass", default=DEFAULT_SINK_MASS, metavar="P",
                        type=_value(float, "a share of attention in (0, 1] (e.g. --sink-mass "
                                  "0.05)", lambda v: finite(v) and 0 < v <= 1),
                        help="a head whose mean mass beyond its window on the first "
                        "max(--sinks) positions reaches this is a sink head (default: 0.05)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the start offsets")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"report folder (default: "
                        f"{DEFAULT_OUT}); files of other names there are left alone")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier report in --out")
    parser.add_argument("--bleu", type=_value(int, "a number of sentence pairs >= 1",
                                              lambda v: v >= 1), metavar="N",
                        help=f"a translation model's: also translate the split's first N "
                        f"sources (beam {BEAM}) with the recommended cutoff and without it, and "
                        "report both BLEU scores (the target dictionary's tokens) and the "
                        "translations (windows_bleu.tsv)")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even with CUDA")
    return parser


# ---------------------------------------------------------------------------------------------
# reading the checkpoint and the data


def resolve_lengths(args, cfg, reader) -> List[int]:
    """``--lengths`` (each at most the split's tokens, ``reader.total``), or the reader's
    default (``reader.default_lengths``: a language model's or an encoder's training length
    times :data:`DEFAULT_MULTIPLE`, a translation model's sentence pairs as they are); checks
    ``--sinks`` against the sequences the attention mass is measured on (of whole lengths)."""
    lengths, total = args.lengths, reader.total
    if lengths and max(lengths) > total:
        raise WindowsInputError(
            f"--lengths {max(lengths)}: the split {args.gen_subset!r} of {args.data} holds "
            f"{total:,} tokens; give --lengths of at most {total} (or a longer --gen-subset)")
    lengths = lengths or reader.default_lengths(cfg)
    if reader.whole_sequences and max(args.sinks) > mass_length(lengths) and \
            not getattr(args, "sinks_given", True):
        raise WindowsInputError(
            f"--gen-subset {args.gen_subset!r} of {args.data}: sequences of "
            f"{mass_length(lengths)} tokens are too short to check windows (the default "
            f"--sinks {','.join(map(str, args.sinks))} keeps the first {max(args.sinks)}): give "
            "a longer split or --lengths")
    if reader.whole_sequences and max(args.sinks) > mass_length(lengths):
        raise WindowsInputError(f"--sinks {max(args.sinks)} is more than the sequences the "
                                f"attention is measured on ({mass_length(lengths)} tokens: the "
                                f"shortest of the lengths, at most {MASS_LENGTH}): give --sinks "
                                f"of at most {mass_length(lengths)} first positions")
    return lengths


def mass_length(lengths: Sequence[int]) -> int:
    """The length of the sequences whose attention mass is measured."""
    return min(min(lengths), MASS_LENGTH)


def saved_windows(cfg, kind: str, sinks: int = 0) -> Tuple[float, int, str]:
    """``(T, S, attention)``: the largest cutoff and sinks the checkpoint was saved with
    (``(0, 0)``: dense), over the sides a cutoff sets, and its ``--alibi-attention`` where that
    backend cannot serve a cutoff with ``sinks`` sinks (``fold``: a cutoff at load would be
    refused, :func:`~fairseq_alibi.modules.attention.dispatch.check_options`; ``""``
    otherwise)."""
    from fairseq_alibi.config_access import cfg_get
    from fairseq_alibi.modules.attention.dispatch import check_options
    from fairseq_alibi.options import default_of

    model = cfg_get(cfg, "model")
    sides = window_sides(cfg, kind)
    attention = str(cfg_get(model, "alibi_attention") or default_of("attention"))
    try:
        for side in sides:
            check_options(attention, str(cfg_get(model, f"{side}_variant")), True, sinks, 0)
    except ValueError:
        refused = attention
    else:
        refused = ""
    no_cutoff, no_sinks = default_of("window_cutoff"), default_of("window_sinks")
    return (max(float(cfg_get(model, f"{side}_window_cutoff") or no_cutoff) for side in sides),
            max(int(cfg_get(model, f"{side}_window_sinks") or no_sinks) for side in sides),
            refused)


def load_model(path, task, overrides: Dict[str, float], device):
    """The checkpoint's model in eval mode on ``device``, loaded with the load-time
    ``overrides`` (what ``--model-overrides`` gives: ``{}`` as saved, ``{'alibi_window_cutoff':
    T, 'alibi_window_sinks': S}``), for ``task``'s dictionary."""
    from fairseq import checkpoint_utils

    from fairseq_alibi.error_hints import raised_by_plugin

    try:
        models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
            [str(path)], arg_overrides=overrides, task=task)
    except ValueError as exc:  # the plugin's checks (e.g. DATA's dictionary): its line
        if not raised_by_plugin(exc):
            raise
        raise WindowsInputError(f"CKPT {path}: {exc}") from None
    return models[0].eval().to(device)


def alibi_attentions(model, path, kind: str = LM) -> list:
    """The ALiBi self-attentions of ``model`` (in layer order: a translation model's encoder's
    first), refused unless there is one and some head has a distance bias; causal ones for a
    language model (``kind`` :data:`LM`)."""
    from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention

    found = [m for m in model.modules()
             if isinstance(m, AlibiMultiheadAttention) and m.alibi is not None]
    what = f"CKPT {path}: {type(model).__name__}"
    if not found:
        raise WindowsInputError(f"{what} has no ALiBi self-attention (a stock model or a "
                                f"variant none): it has no slope windows; {SUPPORTED}")
    variants = sorted({m.alibi.variant for m in found} - {"causal"})
    if variants and kind == LM:
        raise WindowsInputError(f"{what}'s ALiBi attention is {', '.join(variants)}; {SUPPORTED}")
    if not any(bool((m.alibi.head_slopes()[0] > 0).any()) for m in found):
        raise WindowsInputError(f"{what}: no head has a distance bias (every slope is 0), so no "
                                "head has a window")
    return found


def saved_cutoff(model) -> float:
    """The largest ``--alibi-window-cutoff`` the model's stacks were loaded with (0: dense)."""
    from fairseq_alibi.modules.bias import AlibiBias

    return max([m.window_cutoff for m in model.modules() if isinstance(m, AlibiBias)] + [0.0])


# ---------------------------------------------------------------------------------------------
# measuring


@contextlib.contextmanager
def head_weights(attentions, receive):
    """Within this context each forward call of an attention of ``attentions``
    (:class:`~fairseq_alibi.modules.alibi_multihead_attention.AlibiMultiheadAttention` s)
    computes its attention probabilities per head (``need_head_weights``: ``(H, B, T, S)``,
    explicitly, whatever the backend) and hands them to ``receive(index, weights, kwargs)``
    (``index`` in ``attentions``, ``kwargs`` the call's); the call then returns no weights (no
    layer reads a self-attention's). The hooks are removed on exit, even on an error."""
    def ask_weights(module, args, kwargs):
        return args, dict(kwargs, need_head_weights=True)

    def hand_over(index):
        def hook(module, args, kwargs, output):
            receive(index, output[1], kwargs)
            return output[0], None
        return hook

    handles = [m.register_forward_pre_hook(ask_weights, with_kwargs=True) for m in attentions]
    handles += [m.register_forward_hook(hand_over(i), with_kwargs=True)
                for i, m in enumerate(attentions)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class MassMeter:
    """Forward hooks on the dense model's ALiBi self-attentions: within :meth:`hooked`, every
    forward pass asks each for its head weights (``need_head_weights``) and reduces them, per
    head and cutoff, to the mass beyond the window of each query that has keys beyond it, and
    the part of it on the first ``S`` positions for each ``S`` of ``sinks`` (of the query's
    document, where the model has a document mask on that side: :func:`document_firsts`; else
    of the sequence); the weights are not passed on (the layers never read a self-attention's
    weights).

    A causal head's window is ``W_h`` (the keys ``j < i - W_h`` are beyond it); an encoder
    head's is ``(back, ahead)`` (:func:`~fairseq_alibi.alibi.variant_windows`: the keys
    ``j < i - back`` and ``j > i + ahead`` are beyond it; ``0``: the side its variant hides,
    where no key is beyond it; the sinks count on the side before the query)."""

    def __init__(self, attentions, cutoffs: Sequence[float], sinks: Sequence[int]):
        import torch

        from fairseq_alibi.alibi import variant_windows, window_lengths

        self.attentions, self.cutoffs, self.sinks = attentions, list(cutoffs), list(sinks)
        self.slopes, self.windows = [], []
        for m in attentions:
            with torch.no_grad():
                slopes, future = (None if x is None else x.double().cpu().tolist()
                                  for x in m.alibi.head_slopes())
            self.slopes.append(slopes)
            if m.alibi.variant == "causal":
                self.windows.append({t: window_lengths(slopes, t) for t in cutoffs})
            else:
                self.windows.append({t: list(zip(*variant_windows(
                    slopes, t, m.alibi.variant, future))) for t in cutoffs})
        self.beyond: Dict[tuple, list] = {}  # (layer, head, T) -> [per-query masses]
        self.on_sinks: Dict[tuple, float] = {}  # (layer, head, T, S) -> summed over queries

    def hooked(self):
        """A context in which the forward passes are counted."""
        return head_weights(self.attentions, lambda layer, weights, _: self.add(layer,
                                                                               weights[:, 0]))

    def add(self, layer: int, probs):
        """Count one sequence's ``(H, L, L)`` attention probabilities of layer ``layer``: each
        query's keys beyond its head's window, behind it (and ahead of it, an encoder's),
        summed from the row's running sums."""
        import torch

        length = probs.size(-1)
        alibi = self.attentions[layer].alibi
        exempt = alibi.global_tokens  # every query reads them, and they read every key
        firsts = document_firsts(alibi, length)
        if firsts is not None:  # and each position's document's last key
            firsts = firsts.to(probs.device)
            ends = torch.searchsorted(firsts, firsts, right=True) - 1
        for head in range(probs.size(0)):
            # a causal head's W_h is its (back, ahead) with nothing ahead to drop
            sides = {t: w[head] if isinstance(w[head], tuple) else (w[head], 0)
                     for t, w in self.windows[layer].items()}
            windows = {t: (back, ahead) for t, (back, ahead) in sides.items()
                       if any(0 < (side or length) < length - 1 for side in (back, ahead))}
            for start in range(exempt, length if windows else 0, QUERY_CHUNK):
                rows = torch.arange(start, min(length, start + QUERY_CHUNK), device=probs.device)
                weights = probs[head, rows].double()
                weights[:, :exempt] = 0  # never beyond a window: they weigh 0 here
                sums = weights.cumsum(-1)  # from the farthest key: exact
                first, end = (0, length - 1) if firsts is None else (firsts[rows], ends[rows])
                for t, (back, ahead) in windows.items():
                    self._count(layer, head, t, rows - back - 1 if back else rows - length,
                                (first, end), sums, rows + ahead if ahead else rows + length,
                                exempt)

    def _count(self, layer, head, t, last, document, sums, ahead_last, exempt=0):
        """``document``: each query's document's first and last key (the keys outside it weigh
        0, and only its own count as beyond the window); ``last``: each query's last key beyond
        the window behind it (``< first``: none); ``ahead_last``: its last key within the
        window ahead (the keys after it are beyond, ``>= end``: none); ``exempt``: the global
        tokens, the first keys, which every query reads (they weigh 0 in ``sums``; a model
        with them has no document mask, so ``first`` is 0)."""
        length, (first, end) = sums.size(-1), document
        # the queries with keys beyond the window: first (after the global tokens) … i - W - 1
        behind = last >= first + exempt
        kept = behind | (ahead_last < end)
        if not bool(kept.any()):
            return
        if not isinstance(first, int):
            first = first[kept][:, None]
        behind, last, sums = behind[kept][:, None], last[kept][:, None].clamp(min=0), sums[kept]
        ahead_last = ahead_last[kept][:, None].clamp(max=length - 1)
        mass = (sums.gather(1, last)[:, 0] * behind[:, 0]
                + sums[:, -1] - sums.gather(1, ahead_last)[:, 0])
        self.beyond.setdefault((layer, head, t), []).append(mass.cpu())
        for s in self.sinks:
            key = (layer, head, t, s)
            mass = ((sums.gather(1, last.clamp(max=first + s - 1)) * behind).sum().item()
                    if s else 0.0)
            self.on_sinks[key] = self.on_sinks.get(key, 0.0) + mass


def document_firsts(alibi, length: int):
    """``(L,)``: where the document of each of the last ``length`` positions of the forward
    pass that ``alibi`` (an attention's :class:`~fairseq_alibi.modules.bias.LayerBias`) just
    ran begins, as its stack found them (``--alibi-document-mask``, from the ``</s>`` of the
    tokens it read: a translation model's source on the encoder side, the target on the
    decoder's); ``None`` without a document mask on that side (the sequence's first
    positions are its sinks)."""
    import torch

    stack = getattr(alibi, "stack", None)
    if getattr(stack, "document_mask", "none") == "none":
        return None
    ids = stack.documents_of(1, length, length).ids[0]
    opens = torch.ones_like(ids, dtype=torch.bool)
    opens[1:] = ids[1:] != ids[:-1]
    steps = torch.arange(length, device=ids.device)
    return torch.where(opens, steps, torch.zeros_like(steps)).cummax(0).values


class Sample:
    """The sequences cutoffs are scored on: per length, start offsets in the order drawn, and
    the dense model's per-token negative log-likelihood of each, computed when a cutoff first
    reads it."""

    def __init__(self, dense, reader, lengths, tokens: int, seed: int, device, bar):
        self.dense, self.reader, self.device, self.bar = dense, reader, device, bar
        self.starts = {n: reader.starts(n, tokens, seed) for n in lengths}
        self.dense_nll: Dict[int, list] = {n: [] for n in lengths}

    def score(self, model, length: int, index: int):
        """``model``'s per-token negative log-likelihoods of sequence ``index`` of ``length``
        (:class:`Stream`, :class:`MaskedStream` or :class:`Pairs`)."""
        inputs = self.reader.inputs(length, self.starts[length][index])
        return self.reader.score(model, tuple(x.to(self.device) for x in inputs))

    def dense_of(self, length: int, index: int):
        found = self.dense_nll[length]
        while len(found) <= index:
            found.append(self.score(self.dense, length, len(found)))
            self.bar.update(1)
        return found[index]

    @property
    def scored(self) -> Dict[int, int]:
        """Tokens the dense model scored, per length."""
        return {n: sum(x.numel() for x in found) for n, found in self.dense_nll.items()}

    def evaluate(self, model, tolerance: float) -> Dict[int, Judged]:
        """``model`` (a cutoff) judged at each length, longest first, until one is not within;
        at each, one sequence at a time until the stopping rule decides or the sample ends."""
        import torch

        judged = {}
        for length in sorted(self.starts, reverse=True):
            diffs, dense = [], 0.0
            for index in range(len(self.starts[length])):
                reference = self.dense_of(length, index)
                diffs.append(self.score(model, length, index) - reference)
                dense += float(reference.sum())
                self.bar.update(1)
                judged[length] = judge(torch.cat(diffs), dense, tolerance)
                if (judged[length].status != "undecided"
                        and judged[length].tokens >= self.reader.least_tokens):
                    break
            if judged[length].status != "within":
                break
        return judged


def window_sides(cfg, kind: str) -> Tuple[str, ...]:
    """The prefixes of the window options a cutoff sets: ``alibi`` (a language model, an
    encoder), or each side of a translation model with an ALiBi self-attention
    (``encoder_alibi``, ``decoder_alibi``)."""
    from fairseq_alibi.config_access import cfg_get

    if kind != TRANSLATION:
        return ("alibi",)
    model = cfg_get(cfg, "model")
    return tuple(f"{side}_alibi" for side in ("encoder", "decoder")
                 if str(cfg_get(model, f"{side}_alibi_variant", "none")) != "none")


def window_overrides(sides: Sequence[str], cutoff: float, sinks: int = 0,
                     attention: str = "") -> Dict[str, object]:
    """The load-time overrides of ``cutoff`` and ``sinks`` on every side of ``sides`` (and of
    ``--alibi-attention`` by ``attention``, where the saved one cannot drop keys)."""
    found = {"alibi_attention": attention} if attention and cutoff else {}
    for side in sides:
        found.update({f"{side}_window_cutoff": cutoff, f"{side}_window_sinks": sinks})
    return found


def measure(args, cfg, reader, task, lengths: List[int], tokens: int, bar,
            kind: str = LM, saved: Tuple[float, int, str] = (0.0, 0, "")) -> tuple:
    """The attention mass (the dense model hooked, :class:`MassMeter`, on its own sample), then
    the cutoffs in increasing order until one passes (within at every length, keeping what the
    sink heads at its ``T`` need): each without sinks, and where that fails with each ``S > 0``
    of ``--sinks`` in increasing order, on the same sequences of ``reader``, until one drops
    no key of them (a larger ``T`` or more sinks would drop none either), each with the
    ``--alibi-attention`` :data:`WINDOWED_ATTENTION` where the saved one (``saved``,
    :func:`saved_windows`) cannot drop keys; returns ``(meter, heads, sample, candidates)``."""
    import torch

    from fairseq_alibi.modules.attention.windowed import decoding_reach

    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    sides = window_sides(cfg, kind)
    attention = WINDOWED_ATTENTION if saved[2] else ""
    dense = load_model(args.checkpoint, task, {}, device)
    attentions = alibi_attentions(dense, args.checkpoint, kind)
    if saved_cutoff(dense):  # saved with windows: dense is the cutoff off
        dense = load_model(args.checkpoint, task, window_overrides(sides, 0.0), device)
        attentions = alibi_attentions(dense, args.checkpoint, kind)
    meter = MassMeter(attentions, args.cutoffs, args.sinks)
    length = mass_length(lengths)
    with torch.no_grad(), meter.hooked():
        for start in reader.starts(length, MASS_TOKENS, args.seed):
            dense(*(x.to(device) for x in reader.forward_args(length, start)))
            bar.update(1)
    del attentions
    heads = head_rows(meter, args.sink_mass)
    sample = Sample(dense, reader, lengths, tokens, args.seed, device, bar)
    candidates = []
    for t in args.cutoffs:
        for s in [0] + [s for s in args.sinks if s]:
            model = load_model(args.checkpoint, task, window_overrides(sides, t, s, attention),
                               device)
            decoder = set(model.decoder.modules()) if kind != ENCODER else set()
            reaches = [decoding_reach(m.alibi) for m in
                       alibi_attentions(model, args.checkpoint, kind) if m in decoder]
            with torch.no_grad():
                judged = sample.evaluate(model, args.tolerance)
            del model
            cache = None if not reaches or None in reaches else max(reaches) + s
            candidates.append(Candidate(t, s, judged, cache, decodes=kind != ENCODER,
                                        sides=sides, saved_sinks=saved[1], attention=attention))
            row = cutoff_row(meter, heads, t, candidates, reader.kept_length)
            if row.passes(candidates[-1]) or not row.drops(candidates[-1]):
                return meter, heads, sample, candidates  # the verdict, or nothing more to learn
    return meter, heads, sample, candidates


def head_rows(meter: "MassMeter", sink_mass: float) -> List[HeadRow]:
    """A :class:`HeadRow` per layer, head and ``T`` of what ``meter`` counted; a sink head has
    a mean mass beyond its window on the first ``max(sinks)`` positions of ``sink_mass`` or
    more, and needs the fewest first positions ``S`` of ``sinks`` that leave less than
    ``sink_mass`` of it on the others."""
    import numpy as np

    rows, judged = [], max(meter.sinks)
    positive = [s for s in meter.sinks if s]
    for layer, slopes in enumerate(meter.slopes):
        for head, slope in enumerate(slopes):
            for t in meter.cutoffs:
                found = meter.beyond.get((layer, head, t))
                masses = np.concatenate([x.numpy() for x in found]) if found else np.zeros(0)
                total, count = float(masses.sum()), masses.size
                on = {s: meter.on_sinks.get((layer, head, t, s), 0.0) for s in meter.sinks}
                stats = (float(masses.mean()), float(np.percentile(masses, 99)),
                         float(masses.max())) if count else (0.0, 0.0, 0.0)
                mean_on = {s: on[s] / count if count else 0.0 for s in on}
                sink = judged > 0 and count > 0 and mean_on[judged] >= sink_mass
                needs = next(s for s in positive if mean_on[judged] - mean_on[s] < sink_mass
                             ) if sink else 0  # judged itself at most
                rows.append(HeadRow(
                    layer, head, slope, t, meter.windows[layer][t][head], count, *stats,
                    {s: on[s] / total if total > 0 else 0.0 for s in on}, mean_on, sink,
                    needs))
    return rows


def bleu_lines(args, task, sample: "Sample", chosen, out: Path) -> List[str]:
    """``--bleu N``: the translations of the split's first ``N`` sources by the recommended
    ``(T, S)`` (``chosen``, a :class:`Candidate`, or ``None``) and by the dense model the
    verdict was measured against (``sample.dense``), their BLEU against the references
    (sacrebleu on the target dictionary's tokens, as ``fairseq-generate`` scores without
    ``--remove-bpe``), written with the references to ``windows_bleu.tsv``; the report's
    lines."""
    import sacrebleu

    from fairseq_alibi.cli.windows_inputs import translations

    if chosen is None:
        return [f"BLEU not compared (--bleu {args.bleu}): no cutoff is recommended", ""]
    device, pairs = sample.device, sample.reader.pairs
    count = min(args.bleu, len(pairs))
    found = {"dense": translations(sample.dense, task, pairs, count, BEAM, device)}
    model = load_model(args.checkpoint, task,
                       window_overrides(chosen.sides, chosen.cutoff, chosen.sinks,
                                        chosen.attention), device)
    found["windowed"] = translations(model, task, pairs, count, BEAM, device)
    del model
    # as fairseq-generate scores: an <unk> in a reference matches no hypothesis's
    references = [task.target_dictionary.string(target, escape_unk=True)
                  for _, target in pairs[:count]]
    dense, windowed = (sacrebleu.corpus_bleu(found[n], [references], tokenize="none").score
                       for n in ("dense", "windowed"))
    rows = zip(references, found["dense"], found["windowed"])
    write_table(out / "windows_bleu.tsv", ["reference", "dense", "windowed"], rows, "\t")
    differ = sum(a != b for a, b in zip(found["dense"], found["windowed"]))
    return [f"BLEU on the first {count} sentence pairs of {args.gen_subset} (beam {BEAM}, the "
            f"target dictionary's tokens): dense {dense:.2f}; with {chosen.flags}: "
            f"{windowed:.2f} ({windowed - dense:+.2f}); {differ} of {count} translations "
            "differ (windows_bleu.tsv)", ""]


def cutoff_row(meter: "MassMeter", heads: List[HeadRow], t: float,
               candidates: List[Candidate], at) -> CutoffRow:
    """The row of ``T`` = ``t`` (``at``: the reader's ``kept_length``)."""
    return CutoffRow(t, [w for layer in meter.windows for w in layer[t]],
                     [h for h in heads if h.cutoff == t],
                     [c for c in candidates if c.cutoff == t], at)


def cutoff_rows(meter: "MassMeter", heads: List[HeadRow], candidates: List[Candidate],
                at) -> List[CutoffRow]:
    return [cutoff_row(meter, heads, t, candidates, at) for t in meter.cutoffs]


# ---------------------------------------------------------------------------------------------
# command line

#: a run of more forward passes than this shows a progress bar (on stderr)
LONG_RUN = 50


def run(args, command: str) -> str:
    """Measure, report (``command``: the command line, for the report), return the verdict."""
    from fairseq_alibi.preprocess.pipeline_io import progress_bar

    cfg, kind = checkpoint_config(args.checkpoint)
    if args.bleu and kind != TRANSLATION:
        raise WindowsInputError(f"--bleu {args.bleu}: BLEU needs a translation model, and "
                                f"CKPT {args.checkpoint} holds a {KIND_NAMES[kind]}: leave "
                                "--bleu out")
    out = Path(args.out)
    if out.exists() and not out.is_dir():  # before the work, not after it
        raise WindowsInputError(f"--out {out} is a file: give a folder for the report")
    if (out / "windows.md").exists() and not args.overwrite:
        raise WindowsInputError(f"--out {out} holds an earlier report (windows.md): give "
                                "another --out, or pass --overwrite to replace it")
    args.sinks_given, args.sinks = bool(args.sinks), args.sinks or list(DEFAULT_SINKS)
    task, reader = read_sequences(cfg, args.data, args.gen_subset, kind, args.seed,
                                  least_tokens=BLOCK * MIN_BLOCKS)
    lengths = resolve_lengths(args, cfg, reader)
    tokens = min(args.tokens or DEFAULT_TOKENS, reader.total)
    saved = saved_windows(cfg, kind, max(args.sinks))
    # at most: the mass's passes, dense's and every (T, S)'s at every length
    tried = len(args.cutoffs) * len({0, *args.sinks})
    passes = (len(reader.starts(mass_length(lengths), MASS_TOKENS, args.seed))
              + (1 + tried) * sum(len(reader.starts(n, tokens, args.seed)) for n in lengths))
    bar = progress_bar(total=passes, desc="windows", unit="pass", enabled=passes > LONG_RUN)
    try:
        meter, heads, sample, candidates = measure(args, cfg, reader, task, lengths, tokens,
                                                   bar, kind, saved)
    finally:
        bar.close()
    rows = cutoff_rows(meter, heads, candidates, reader.kept_length)
    line = verdict(rows, args.tolerance, args.sinks)
    out.mkdir(parents=True, exist_ok=True)
    write_csvs(out, rows, heads, lengths, args.sinks, reader.kept_length)
    png_note = plot(out, heads, args.cutoffs)
    mass = (len(reader.starts(mass_length(lengths), MASS_TOKENS, args.seed)),
            mass_length(lengths))
    summary = (args, lengths, tokens, sample, rows, heads, mass, saved)
    chosen = recommended(rows)
    bleu = bleu_lines(args, task, sample, chosen, out) if args.bleu else []
    write_report(out, command, summary_lines(*summary) + bleu, line, png_note)
    print("\n".join(summary_lines(*summary, SHOWN_HEADS) + bleu))
    files = ["windows_heads.csv", "windows_cutoffs.csv"] + ([] if png_note else ["windows.png"])
    files += ["windows_bleu.tsv"] if args.bleu and chosen is not None else []
    print(*([png_note] if png_note else []), f"report: {out / 'windows.md'} (and "
          f"{', '.join(files)})", sep="\n")
    return line


def main(argv=None) -> int:
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        line = run(build_parser().parse_args(argv), " ".join([PROG, *argv]))
    except WindowsInputError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(line)  # the last line of stdout: the verdict
    return 0


if __name__ == "__main__":
    sys.exit(main())
