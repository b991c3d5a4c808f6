"""Choosing the slope-window cutoff T, measured: perplexity, lost attention mass and speed per T.

    python -m experiments.slope_windows [--family lm|wikitext2|encoder|translation]
                                        [--out DIR] [--cutoffs 2,4,6,8,12,16]
                                        [--sinks 0] [--multiples 1,2,4,8,16,64] [--L 64]
                                        [--max-update N]
                                        [--checkpoint PATH --data DIR] [--sample-tokens N]
                                        [--rounds R] [--threads 1] [--smoke]

``--family`` picks the model measured: ``lm`` (the default, below); ``wikitext2``, the same
language model trained on WikiText-2 (its validation split; the first ``--heldout-lines`` lines
of its test split scored), measured the same way; ``encoder``, configurations of the encoder
study (masked-LM perplexity: :mod:`experiments.slope_windows_encoder`); ``translation``, a
gettext French→English ``alibi_transformer`` (BLEU per source-length bucket:
:mod:`experiments.slope_windows_translation`).

The quickstart's language model (its embedded corpus, its ``tiny`` model and its training
command, :func:`fairseq_alibi.cli.quickstart.train_command`, at ``L`` = 64), or an existing
causal ALiBi model (``--checkpoint PATH --data DIR``, a folder written by
``fairseq-preprocess`` with a ``test`` split), is scored on the held-out ``test`` text with
``fairseq-eval-lm`` in non-overlapping blocks of ``N = L, 2L, 4L, 8L, 16L, 64L`` tokens
(``--tokens-per-sample N --max-tokens N``, through :func:`fairseq_alibi.cli.sweep.run_sweep`,
which checks that every run scores every token), dense (``T`` off) and with the load-time
override ``--model-overrides "{'alibi_window_cutoff': T}"`` for each ``T`` (with ``--sinks
0,1,4``, language models: each ``T`` with each number of attention sinks ``S``, the override
``{'alibi_window_cutoff': T, 'alibi_window_sinks': S}``, and the mass beyond the windows
counts no sink). The runs of one
length follow each other (dense first and again last), so their tokens/s are taken side by
side; ``--rounds R`` repeats them and reports the median.

Per ``T`` and ``N`` the report gives the perplexity and its change against dense
``ppl_T / ppl_dense - 1``, the eval-lm tokens/s and its ratio to dense at that length, and the
largest attention mass a query lost: in this process, the dense model's attention
probabilities ``p_h[i, j]`` (every layer and head, the first ``--sample-tokens`` test tokens in
blocks of ``N``) summed over the keys beyond the head's window ``W_h``
(:func:`fairseq_alibi.alibi.variant_windows` of the layer's effective slopes),

    lost(T, N) = max over layers, heads, blocks, queries i of  sum_{j : i - j > W_h} p_h[i, j]

(and ``j - i`` beyond the look-ahead window for bidirectional variants): what the windowed
model renormalises away. The report names the smallest ``T`` whose perplexity is within
0.1 % of dense at every length measured (the goal), or says that none is: the bound a
recommendation must respect, not the recommendation itself (a larger ``T`` keeps a margin).

Outputs in ``--out``: ``slope_windows.md``, ``slope_windows.csv`` (one row per T and N),
``run.json``, ``eval/`` (each length's sweep and fairseq logs), ``logs/``. ``--smoke``: the
quickstart's smoke model, a few updates, T = 4 and N = L, 4L (used by the tests).
"""

import argparse
import csv
import importlib
import math
import os
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from benchmarks.tables import machine, table, today
from experiments.lm_runs import (DEFAULT_WIKITEXT, comma_list, command_line, prepare_model,
                                 publish, start_run, wikitext_files)
from fairseq_alibi.cli.quickstart import SIZES, SMOKE_L, eval_tokens_per_second
from fairseq_alibi.cli.sweep import SweepModel, run_sweep
from fairseq_alibi.cli.windows_check import head_weights

CUTOFFS = (2, 4, 6, 8, 12, 16)
MULTIPLES = (1, 2, 4, 8, 16, 64)
SMOKE_CUTOFFS, SMOKE_MULTIPLES = (4,), (1, 4)
#: the issue's quality goal: perplexity within this fraction of dense at every length
GOAL = 0.001
DENSE = "off"
#: dense again after the windowed runs of a length: its tokens/s shows the run-to-run noise
DENSE_AGAIN = "off (again)"
#: fairseq-eval-lm prints the loss (base 2) to 4 decimals: perplexity to ±ln(2)·5e-5
RESOLUTION = math.log(2) * 5e-5
LOST_MASS_TITLE = ("Largest attention mass a query of the dense model puts beyond its head's "
                   "window (every layer and head):")
#: the most bytes of one layer's explicit attention weights (heads × N² float32) the lost mass
#: is measured with: a longer block is not measured (its forward holds a few such tensors)
MASS_BYTES = 2 << 30


#: the model families measured (``--family``); per family its training length, evaluation
#: lengths (multiples of L) and training updates, and the same for ``--smoke``
FAMILIES = {
    "lm": dict(L=64, multiples=MULTIPLES, max_update=SIZES["tiny"]["max_update"]),
    "wikitext2": dict(L=64, multiples=(1, 4, 16), max_update=600),
    "encoder": dict(L=32, multiples=(1, 4, 16), max_update=600),
    "translation": dict(L=16, multiples=(), max_update=1200),
}
SMOKE_FAMILIES = {
    "lm": dict(L=SMOKE_L, multiples=SMOKE_MULTIPLES, max_update=6),
    "wikitext2": dict(L=SMOKE_L, multiples=SMOKE_MULTIPLES, max_update=6),
    "encoder": dict(L=16, multiples=SMOKE_MULTIPLES, max_update=6),
    "translation": dict(L=16, multiples=(), max_update=6),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), default="lm",
                        help="lm: the quickstart LM; wikitext2: an LM trained on WikiText-2; "
                        "encoder: alibi_roberta of the encoder study (masked-LM perplexity); "
                        "translation: alibi_transformer on gettext French->English (BLEU)")
    parser.add_argument("--out", default=None, help="default outputs/slope_windows[_FAMILY]")
    parser.add_argument("--cutoffs", default=None,
                        help="cutoffs T in nats, comma-separated (default 2,4,6,8,12,16)")
    parser.add_argument("--sinks", default="0",
                        help="lm, wikitext2, translation: attention sinks S tried with every "
                             "cutoff (--alibi-window-sinks S; translation: on both sides), "
                             "comma-separated (default 0: none)")
    parser.add_argument("--multiples", default=None,
                        help="evaluation lengths as multiples of L (default: lm 1,2,4,8,16,64; "
                        "wikitext2, encoder 1,4,16; translation: its source-length buckets)")
    parser.add_argument("--L", type=int, default=None,
                        help="training length (default: lm, wikitext2 64; encoder 32; "
                        "translation 16 source tokens)")
    parser.add_argument("--max-update", type=int, default=None,
                        help="training updates (default: lm the quickstart's 1000; wikitext2 "
                        "and encoder 600; translation 1200)")
    parser.add_argument("--checkpoint", default=None,
                        help="lm: score this causal ALiBi model instead of training one "
                        "(needs --data and --L, its training length)")
    parser.add_argument("--data", default=None, help="binarized corpus (with a test split)")
    parser.add_argument("--wikitext", default=str(DEFAULT_WIKITEXT),
                        help="wikitext2, encoder: the WikiText-2 folder")
    parser.add_argument("--heldout-lines", type=int, default=None,
                        help="wikitext2, encoder: the first lines of WikiText-2's test split "
                        "that are scored (default 400; --smoke 40)")
    parser.add_argument("--variants", default="offset,one_sided",
                        help="encoder: the encoder study's configurations measured")
    parser.add_argument("--per-bucket", type=int, default=None,
                        help="translation: test sentences per source-length bucket (default "
                        "50; --smoke 3)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="translation: fairseq-generate runs at a time")
    parser.add_argument("--sample-tokens", type=int, default=16384,
                        help="test tokens whose attention mass is measured (at least one "
                        "block per length)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="eval-lm rounds per length (tokens/s: their median)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="threads of each process")
    parser.add_argument("--smoke", action="store_true", help="toy model, every step")
    args = parser.parse_args(argv)
    if args.checkpoint and (not args.data or args.family != "lm"):
        parser.error("--checkpoint needs --family lm and --data (the binarized corpus it is "
                     "scored on)")
    family = (SMOKE_FAMILIES if args.smoke else FAMILIES)[args.family]
    args.out = args.out or "outputs/slope_windows" + (
        "" if args.family == "lm" else f"_{args.family}")
    args.L = args.L or family["L"]
    args.heldout_lines = args.heldout_lines or (40 if args.smoke else 400)
    args.per_bucket = args.per_bucket or (3 if args.smoke else 50)
    args.max_update = args.max_update or family["max_update"]
    args.cutoffs = number_list(parser, args.cutoffs, SMOKE_CUTOFFS if args.smoke else CUTOFFS,
                               float)
    args.multiples = number_list(parser, args.multiples, family["multiples"], int)
    args.variants = [v for v in args.variants.split(",") if v]
    if any(t <= 0 or not math.isfinite(t) for t in args.cutoffs):
        parser.error("--cutoffs must be finite numbers of nats > 0 (dense is always measured)")
    args.sinks = number_list(parser, args.sinks, (0,), int)
    if any(s < 0 for s in args.sinks):
        parser.error("--sinks must be 0 or more")
    if args.sinks != [0] and args.family not in ("lm", "wikitext2", "translation"):
        parser.error(f"--sinks: the {args.family} family is measured without sinks; drop it")
    return args


def number_list(parser, text: Optional[str], default: Sequence, kind) -> list:
    """``text`` (``a,b``) as numbers of ``kind``, sorted, once each; ``default`` if not given."""
    if text is None:
        return sorted(set(default))
    try:
        return comma_list(kind)(text)
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))


def label(cutoff: Optional[float], sinks: int = 0) -> str:
    """A run's name: ``off`` (dense), ``T=8``, or ``T=8 S=4`` (with 4 attention sinks)."""
    return DENSE if not cutoff else f"T={cutoff:g}" + (f" S={sinks}" if sinks else "")


def setting(key) -> Tuple[float, int]:
    """``(T, S)`` of a windowed run's key: a cutoff ``T`` (no sinks) or a pair ``(T, S)``."""
    return tuple(key) if isinstance(key, tuple) else (key, 0)


def cutoff_overrides(cutoff: float, sinks: int = 0):
    """``SweepModel.overrides``: the load-time window cutoff (and sinks), at every length."""
    extra = {"alibi_window_sinks": sinks} if sinks else {}
    return lambda length: {"alibi_window_cutoff": cutoff, **extra}


def evaluate(checkpoint, data, cutoffs, lengths, out: Path, threads: int, log,
             rounds: int = 1) -> List[dict]:
    """One row per ``(T, N)`` (``cutoffs``: cutoffs ``T`` or pairs ``(T, S)``, :func:`setting`):
    perplexity, tokens and eval-lm tokens/s of ``fairseq-eval-lm`` in non-overlapping blocks of
    ``N`` (one block a batch): dense, each ``T`` in turn, dense again, ``rounds`` times
    (tokens/s: the median of the rounds); ``speed_vs_dense`` against the mean of the two dense
    runs."""
    models = {DENSE: SweepModel(str(checkpoint))}
    models.update({label(*setting(c)): SweepModel(str(checkpoint),
                                                  overrides=cutoff_overrides(*setting(c)))
                   for c in cutoffs})
    models[DENSE_AGAIN] = models[DENSE]
    values = {label(*setting(c)): setting(c) for c in cutoffs}
    rows = []
    for n in lengths:
        speeds = {name: [] for name in models}
        for turn in range(rounds):
            log(f"fairseq-eval-lm at N={n} (round {turn + 1} of {rounds}): "
                f"{', '.join(models)} ...")
            folder = out / "eval" / f"N{n}" / (f"round{turn + 1}" if rounds > 1 else "")
            result = run_sweep(models, str(data), [n], folder, modes=["nonoverlapping"],
                               extra_eval_args=["--cpu", "--max-tokens", str(n)], jobs=1,
                               threads=threads, progress=False, title=f"Slope windows at N={n}")
            result.check()
            for point in result.points:
                speeds[point.model].append(eval_tokens_per_second(point.log))
        for point in result.points:  # perplexities: the same every round
            measured = sorted(v for v in speeds[point.model] if v is not None)
            t, sinks = values.get(point.model, (None, None))
            rows.append({"cutoff": point.model, "T": t, "S": sinks, "length": n,
                         "tokens": point.tokens, "perplexity": point.perplexity,
                         "tokens_per_s": measured[len(measured) // 2] if measured else None,
                         "tokens_per_s_rounds": speeds[point.model],
                         "run_seconds": point.seconds})
    for row in rows:
        dense = [r for r in rows if r["length"] == row["length"]
                 and r["cutoff"] in (DENSE, DENSE_AGAIN)]
        row["change"] = row["perplexity"] / dense[0]["perplexity"] - 1.0
        speeds = [r["tokens_per_s"] for r in dense]
        row["speed_vs_dense"] = (row["tokens_per_s"] / (sum(speeds) / len(speeds))
                                 if row["tokens_per_s"] and all(speeds) else None)
    return rows


def held_out_stream(data) -> "torch.Tensor":
    """The binarized ``test`` split as one stream of token ids (end-of-line tokens included),
    as ``fairseq-eval-lm`` reads it in non-overlapping blocks."""
    import torch
    from fairseq.data import data_utils

    dataset = data_utils.load_indexed_dataset(os.path.join(str(data), "test"), None)
    if dataset is None or len(dataset) == 0:
        raise SystemExit(f"no test split in {data}")
    return torch.cat([dataset[i].long() for i in range(len(dataset))])


def lost_mass(probs, windows) -> float:
    """The largest attention mass a query puts beyond its head's window, of ``probs``
    ``(H, B, T, S)`` (queries aligned to the end of the keys) and ``windows`` ``(back, ahead)``
    (per head, ``None`` = unbounded): ``max_{h, b, i} sum_{j : i' - j > back_h or
    j - i' > ahead_h} p``, ``i' = i + S - T``; summed from the far end in float64, so that a
    small mass is not lost to rounding."""
    return lost_masses(probs, {None: windows})[None]


def lost_masses(probs, windows_by_cutoff: dict, padding=None, sinks=None) -> dict:
    """:func:`lost_mass` of each ``{cutoff: windows}``, the running sums computed once;
    ``padding`` ``(B, S)`` (a key padding mask): padded queries are not counted (a padded
    encoder position's query may see no key at all, and spreads its weight evenly); ``sinks``
    ``{cutoff: number}``: the first keys kept beyond the windows (attention sinks) are not
    lost."""
    import torch

    H, _, T, S = probs.shape
    positions = torch.arange(T) + (S - T)
    real = None if padding is None else ~padding[:, S - T:].to(torch.bool)
    worst = dict.fromkeys(windows_by_cutoff, 0.0)
    for h in range(H):
        p = probs[h].double()
        sums = {}  # running sums over the keys: back (False), ahead (True: flipped keys)
        for cutoff, windows in windows_by_cutoff.items():
            kept = (sinks or {}).get(cutoff, 0)
            lost = p.new_zeros(p.shape[:2])  # (B, T): both directions of a query add up
            for limit, flipped in ((windows[0][h], False), (windows[1][h], True)):
                if limit is None:
                    continue
                if flipped not in sums:
                    sums[flipped] = (p.flip(-1) if flipped else p).cumsum(-1)
                # the keys j <= i' - limit - 1 (back), or j >= i' + limit + 1 (ahead), but for
                # the sinks j < kept: back, the sum up to kept - 1 taken off; ahead, j >= kept
                last = (S - 2 - positions - limit) if flipped else positions - limit - 1
                if flipped:
                    last = last.clamp(max=S - 1 - kept)
                picked = sums[flipped].gather(
                    -1, last.clamp(min=0).view(1, -1, 1).expand(p.size(0), -1, 1))
                lost += picked.squeeze(-1) * (last >= 0)
                if kept and not flipped:
                    lost -= sums[flipped][:, :, min(kept, S) - 1] * (last >= kept - 1)
                    lost -= picked.squeeze(-1) * ((last >= 0) & (last < kept - 1))
            if real is not None:
                lost = lost * real
            worst[cutoff] = max(worst[cutoff], float(lost.max()))
    return worst


def load_dense(checkpoint, overrides: dict):
    """``(model, task)`` of ``checkpoint`` in eval mode with ``overrides`` (the caller's turn the
    cutoff off: the dense reference, whatever the model was saved with)."""
    from fairseq import checkpoint_utils

    import fairseq_alibi  # noqa: F401  (registers the models)

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides=overrides)
    return models[0].eval(), task


class LostMassMeter:
    """Hooks on a dense model's ALiBi self-attentions (every family's: LM, encoder, both sides of
    a translation model): while ``with meter.at(key):`` runs forward passes, ``found[(T, key)]``
    is the largest :func:`lost_mass` of any layer's attention probabilities for each cutoff
    ``T``, each layer with the windows of its own effective slopes
    (:func:`~fairseq_alibi.alibi.variant_windows`); a pair ``(T, S)`` of ``cutoffs``: the same
    with ``S`` attention sinks (:func:`setting`)."""

    def __init__(self, model, cutoffs):
        import torch

        from fairseq_alibi.alibi import variant_windows
        from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention

        self.attentions = [m for m in model.modules() if isinstance(m, AlibiMultiheadAttention)
                           and m.alibi is not None]
        if not self.attentions:
            raise SystemExit("no ALiBi self-attention in this model: nothing has a window")
        self.windows = []
        with torch.no_grad():
            for m in self.attentions:  # each layer's effective slopes (scales included)
                slopes, future = m.alibi.head_slopes()
                self.windows.append({c: variant_windows(slopes, setting(c)[0],
                                                        m.alibi.variant, future)
                                     for c in cutoffs})
        self.sinks = {c: setting(c)[1] for c in cutoffs}
        self.found, self.key = {}, None

    def at(self, key):
        """A context in which the forward passes count towards ``found[(T, key)]``."""
        import contextlib

        @contextlib.contextmanager
        def hooked():
            self.key = key
            for t in self.windows[0]:
                self.found.setdefault((t, key), 0.0)

            def receive(index, weights, kwargs):
                masses = lost_masses(weights, self.windows[index], kwargs.get("key_padding_mask"),
                                     self.sinks)
                for t, mass in masses.items():
                    self.found[(t, self.key)] = max(self.found[(t, self.key)], mass)

            with head_weights(self.attentions, receive):
                yield self
        return hooked()


def mass_measurable(length: int, heads: int) -> bool:
    """Whether one layer's explicit weights at ``length`` fit :data:`MASS_BYTES`."""
    return heads * length * length * 4 <= MASS_BYTES


def attention_losses(checkpoint, data, cutoffs, lengths, sample_tokens: int, log) -> dict:
    """``{(T, N): largest lost mass}`` of the dense model (:class:`LostMassMeter`) on the first
    ``sample_tokens`` test tokens, cut into blocks of ``N`` (at least one block)."""
    import torch

    model, _ = load_dense(checkpoint, {"data": str(data), "alibi_window_cutoff": 0.0})
    meter = LostMassMeter(model, cutoffs)
    stream = held_out_stream(data)
    heads = max(m.num_heads for m in meter.attentions)
    with torch.no_grad():
        for n in lengths:
            if not mass_measurable(n, heads):
                log(f"attention mass beyond the windows: not measured at {n} tokens ({heads} "
                    f"heads' weights of {n}² would exceed {MASS_BYTES >> 30} GiB)")
                continue
            count = max(1, min(sample_tokens, len(stream)) // n)
            blocks = stream[:count * n].view(count, n) if len(stream) >= n else stream[None]
            log(f"attention mass beyond the windows: {blocks.size(0)} block(s) of "
                f"{blocks.size(1)} tokens")
            with meter.at(n):
                for batch in blocks.split(max(1, 4096 // n)):
                    model(batch)
    return meter.found


def smallest_within_goal(rows, cutoffs, sinks: int = 0) -> Optional[float]:
    """The smallest ``T`` whose perplexity (with ``sinks`` attention sinks) is within
    :data:`GOAL` of dense at every length."""
    for t in sorted(setting(c)[0] for c in cutoffs if setting(c)[1] == sinks):
        if all(abs(r["change"]) <= GOAL for r in rows if r["cutoff"] == label(t, sinks)):
            return t
    return None


def write_csv(path: Path, rows: List[dict], extra: Sequence[str] = ()):
    """One line per row: the fields every family has, then ``extra`` (a family's own)."""
    fields = ["cutoff", "T", "length", "tokens", "perplexity", "change", "tokens_per_s",
              "speed_vs_dense", "run_seconds", "lost_mass", *extra]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k) for k in fields})


def grid(rows, names, keys, show) -> List[list]:
    """Table rows: one per run name (``row["cutoff"]``), a cell ``show(row, name)`` per column
    key (``row["length"]``: a block length, a bucket)."""
    by = {(r["cutoff"], r["length"]): r for r in rows}
    return [[name] + [show(by[(name, key)], name) for key in keys] for name in names]


def report_tables(rows, cutoffs, lengths, L: int) -> str:
    """The three tables of the report: perplexity change, largest lost mass, tokens/s."""
    names = [DENSE] + [label(*setting(c)) for c in cutoffs]
    heads = ["T"] + [f"{n // L}L = {n}" for n in lengths]
    change = grid(rows, names[:1], lengths, lambda r, _: f"{r['perplexity']:.3f}")
    change += grid(rows, names[1:], lengths, lambda r, _: f"{r['change']:+.3%}")
    lost = grid(rows, names[1:], lengths, lambda r, _: "not measured"
                if r["lost_mass"] is None else f"{r['lost_mass']:.1e}")
    speed = grid(rows, names[:1] + [DENSE_AGAIN] + names[1:], lengths,
                 lambda r, name: f"{r['tokens_per_s']:,.0f}" + (
                     "" if name in (DENSE, DENSE_AGAIN) else f" ({r['speed_vs_dense']:.2f}×)"))
    tokens = sorted({r["tokens"] for r in rows})
    return "\n".join([
        "Perplexity (dense row) and its change against dense, non-overlapping blocks of N, "
        f"{', '.join(f'{c:,}' for c in tokens)} test tokens at every point:", "",
        table(heads, change), "",
        f"(fairseq-eval-lm prints the loss to 4 decimals: a change within ±{RESOLUTION:.4%} "
        "reads as 0.)", "",
        LOST_MASS_TITLE, "",
        table(heads, lost), "",
        "fairseq-eval-lm tokens/s (× the mean of the two dense runs at the same N, one before "
        "and one after the windowed runs; one block a batch; the median of the rounds):", "",
        table(heads, speed),
    ])


def report_head(what: str, command: str, machine_line: str, seconds: float) -> List[str]:
    """The first lines of a family's report: title (``what`` the model measured), command,
    machine, date and wall time."""
    return ["# Choosing the slope-window cutoff T" + (f": {what}" if what else ""), "",
            f"Command: `{command}`  ", f"Machine: {machine_line}  ",
            f"Date: {today()}; total wall time {seconds:.0f} s  "]


def wikitext_data(args, out: Path, vocab: int, env: dict, log) -> Path:
    """WikiText-2 binarized for the LM: its validation split the training text (the train split
    is not at hand), the first ``--heldout-lines`` lines of its test split the scored text; a
    sentencepiece BPE of ``vocab`` pieces (:func:`~fairseq_alibi.cli.quickstart.prepare_text_data`,
    as experiments/wikitext2_extrapolation.py prepares it)."""
    from fairseq_alibi.cli.quickstart import prepare_text_data

    wiki = wikitext_files(args.wikitext)
    raw = out / "data" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    lines = {split: wiki[split].read_text(encoding="utf-8").splitlines(keepends=True)
             for split in ("train", "test")}
    lines["test"] = lines["test"][: args.heldout_lines]
    if args.smoke:  # a corner of the training text: every step, not a model
        lines["train"] = lines["train"][: 20 * args.heldout_lines]
    for split, kept in lines.items():
        (raw / f"{split}.txt").write_text("".join(kept), encoding="utf-8")
    log(f"WikiText-2: {len(lines['train']):,} training lines, the first {len(lines['test']):,} "
        f"test lines; sentencepiece ({vocab} pieces) and fairseq-preprocess ...")
    return prepare_text_data({s: raw / f"{s}.txt" for s in lines}, out / "data", vocab, env,
                             args.seed)


def main(argv=None):
    args = parse_args(argv)
    out, env, log = start_run(args.out, "slope-windows", args.threads)
    command = command_line("experiments.slope_windows", argv)
    if args.family in ("encoder", "translation"):
        module = importlib.import_module(f"experiments.slope_windows_{args.family}")
        return module.main(args, command, out, env, log)
    started = time.time()
    machine_line = machine()
    make_data = None
    if args.family == "wikitext2":
        def make_data(vocab):
            return wikitext_data(args, out, vocab, env, log)
    model = prepare_model(args, out, env, log, make_data)
    lengths = [m * args.L for m in args.multiples]
    settings = [(t, sinks) for sinks in args.sinks for t in args.cutoffs]
    rows = evaluate(model["checkpoint"], model["data"], settings, lengths, out,
                    args.threads, log, max(1, args.rounds))
    losses = attention_losses(model["checkpoint"], model["data"], settings, lengths,
                              args.sample_tokens, log)
    for row in rows:
        row["lost_mass"] = (None if row["T"] is None
                            else losses.get(((row["T"], row["S"]), row["length"])))
    write_csv(out / "slope_windows.csv", rows, extra=["S"])
    chosen = {sinks: smallest_within_goal(rows, settings, sinks) for sinks in args.sinks}
    verdict = " ".join(
        (f"Smallest T within {GOAL:.1%} of dense at every length measured"
         + (f" with S = {sinks} sinks" if sinks else "") + ": " +
         (f"T = {t:g}." if t is not None else "none of the cutoffs measured."))
        for sinks, t in chosen.items()) + (
        " (The goal's bound: a larger T keeps a margin; read the lost mass too.)")
    total = time.time() - started
    report = "\n".join([
        *report_head("" if args.family == "lm" else f"the {args.family} LM", command,
                     machine_line, total),
        f"Model: {model['checkpoint']} (trained at L = {args.L}"
        + (f": {model['trained_line']}" if model.get("trained_line") else "")
        + f"); data {model['data']}", "",
        report_tables(rows, settings, lengths, args.L), "", verdict, ""])
    return publish(out, "slope_windows.md", report, {
        "command": command, "machine": machine_line, "L": args.L, "lengths": lengths,
        "cutoffs": args.cutoffs, "sinks": args.sinks, "rows": rows,
        "smallest_within_goal": chosen[args.sinks[0]],
        "smallest_within_goal_by_sinks": {str(k): v for k, v in chosen.items()},
        "checkpoint": str(model["checkpoint"]), "data": str(model["data"]),
        "training": model["trained"], "total_s": round(total, 1)}, log, total)


if __name__ == "__main__":
    sys.exit(main())
