"""Slope windows: windowed ALiBi attention against dense ALiBi and the dense limit.

    python -m benchmarks.windows [--quick] [--tables targets,cutoffs,thresholds,sinks,chunks]
        [--lengths 1024,2048,4096,8192] [--cutoff 8] [--cutoffs 2,4,6,8,12,16] [--sinks 4]
        [--variants causal,symmetric] [--passes forward,fwd+bwd] [--rounds 3] [--threads 1]
        [--batch 1] [--json FILE]
    python -m benchmarks.windows --fit FILE[,FILE...]

The attention alone, ``(B, H, L, D)`` float32 queries, keys and values, Press's slopes of ``H``
heads; every table times its cases in interleaved paired rounds (:class:`benchmarks.timing.Rounds`:
a ratio is the median of the same round's ratios, so load from other processes hits both sides
alike). ``windowed`` is the backend (``dispatch.attend("windowed", ...)``) with the windows of a
cutoff ``T`` (``W_h = ceil(T / m_h)``; 8 heads, ``T = 8``: 16, 32, …, 2048 keys back).

* ``targets`` (causal, ``--cutoff``): ``no bias`` (``scaled_dot_product_attention(is_causal=
  True)``, the dense limit), ``dense auto`` (today's ALiBi without a cutoff,
  ``dispatch.attend("auto", ...)``: on the CPU from ``tuning.FOLD_MIN_LENGTH`` keys on the
  fold) and ``windowed``, forward and forward+backward; the speed-ups ``dense auto ÷ windowed``
  and ``no bias ÷ windowed``.
* ``cutoffs`` (attention time and memory per T; ``--variants``, ``--cutoffs``): per variant and
  length, the forward time of ``windowed`` at each cutoff ÷ ``dense auto`` (all cutoffs and
  ``dense auto`` in the same rounds), and the peak memory of one forward call of each. Peak
  memory is :func:`benchmarks.timing.peak_bytes`: the tensor bytes alive at once during the
  call from ``torch.profiler``'s allocation events, with a fresh bias (so ``sdpa``'s dense bias,
  memoised in a model once per forward pass for every layer, counts): exact, repeatable and
  blind to other processes and the allocator's cache, which the resident set size is not.
* ``thresholds`` (``auto``'s choice for windowed calls; ``--variants``, ``--cutoffs``,
  ``--passes``): per variant, length and pass, in the same rounds, ``sdpa`` with the dense
  windowed bias (what ``auto`` runs when it does not pick ``windowed``: ``fold``, ``flex`` and
  ``flash`` refuse windows; its cost does not depend on ``T``, the same ``(H, L, L)`` tensor is
  read whatever its values, so it is timed once, with the largest cutoff's bias), ``dense auto``
  without a cutoff, and ``windowed`` at each cutoff. Each row gives the cost model's
  prediction of ``windowed ÷ sdpa`` (:func:`~fairseq_alibi.modules.attention.dispatch.
  windowed_cost`, what ``auto`` decides on for the bidirectional variants; ``by length`` for
  causal and one_sided, which it sends to ``windowed`` from ``ONE_WAY_WINDOWED_MIN_LENGTH`` keys
  on), the
  measured ``windowed ÷ sdpa``, ``auto``'s choice and ``auto ÷ sdpa``, ``auto ÷ dense auto``
  (time ratios: below 1 is faster); two check lines say whether ``auto`` with a cutoff was
  ever slower than the dense choice, or than ``dense auto`` without a cutoff, by more than
  :data:`NOISE`.
* ``sinks`` (causal, ``--cutoff``, ``--sinks S``): attention sinks' cost, ``windowed`` with
  ``S`` sinks (``--alibi-window-sinks``) ÷ ``windowed`` without, forward and
  forward+backward, in the same rounds.
* ``--fit FILES`` (no timing): ``tuning.WINDOWED_COST`` re-fitted to ``thresholds`` records
  written with ``--json`` (:func:`fit_cost`), with the measured and predicted ratio of every
  cell, before and after, and what ``auto`` would choose with the new constants.
* ``chunks`` (the chunk sizes of ``tuning``; ``--variants``, ``--windows``, ``--chunks``): one
  head, a window of ``W`` keys back (and ahead, for a bidirectional variant), at each length,
  ``windowed.attention`` with each chunk size in the same rounds, forward and
  forward+backward, and the size ``windowed.chunk_size`` picks.
"""

import argparse
import functools
import gc
import json
import math
import sys

import torch
import torch.nn.functional as F

from benchmarks.tables import (comma_choices, comma_numbers, command_line, fill_unset, machine,
                              table)
from benchmarks.timing import Rounds, backward_call, forward_call, mib, peak_bytes
from fairseq_alibi.alibi import VARIANTS, get_slopes, variant_windows
from fairseq_alibi.modules.attention import dispatch, tuning, windowed
from fairseq_alibi.modules.bias import AlibiBias

CASES = ("no bias", "dense auto", "windowed")
TABLES = ("targets", "cutoffs", "thresholds", "sinks", "chunks")
PASSES = ("forward", "fwd+bwd")
CUTOFFS = (2.0, 4.0, 6.0, 8.0, 12.0, 16.0)

#: a time ratio above ``1 + NOISE`` counts as slower in the check line (paired medians of a
#: shared machine move by a few percent from run to run)
NOISE = 0.05


def layer_of(heads: int, variant: str, cutoff: float = 0.0, sinks: int = 0):
    """A layer's view of a fresh :class:`AlibiBias` (its own bias cache) with ``cutoff`` and
    ``sinks`` attention sinks."""
    return AlibiBias(heads, variant=variant, window_cutoff=cutoff, window_sinks=sinks).layer(0)


def attending(name: str, layer, scale: float):
    """``(q, k, v) -> out`` through ``dispatch.attend(name, ...)``."""
    return lambda q, k, v: dispatch.attend(name, q, k, v, layer, scale=scale)


def inputs(batch, heads, length, head_dim):
    """Queries, keys, values, the output gradient, and leaves for the backward."""
    q, k, v = (torch.randn(batch, heads, length, head_dim) for _ in range(3))
    grad = torch.randn(batch, heads, length, head_dim)
    return (q, k, v), grad, [t.clone().requires_grad_() for t in (q, k, v)]


def timed(found, length, rounds, batch, heads, head_dim, which=PASSES):
    """``{pass: Rounds}`` of the functions ``found`` (name -> ``f(q, k, v)``) at ``length``."""
    (q, k, v), grad, leaves = inputs(batch, heads, length, head_dim)
    makers = {"forward": lambda f: forward_call(f, q, k, v),
              "fwd+bwd": lambda f: backward_call(f, leaves, grad)}
    return {p: Rounds({n: makers[p](f) for n, f in found.items()}, rounds) for p in which}


def targets(lengths, cutoff=8.0, rounds=3, batch=1, heads=8, head_dim=64, log=print):
    """``(shape line, Markdown table)``: causal, per length and pass, the seconds of ``no
    bias``, ``dense auto`` and ``windowed`` and the windowed path's speed-ups."""
    scale = 1 / math.sqrt(head_dim)
    found = {
        "no bias": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                  scale=scale),
        "dense auto": attending("auto", layer_of(heads, "causal"), scale),
        "windowed": attending("windowed", layer_of(heads, "causal", cutoff), scale),
    }
    rows = []
    for L in lengths:
        for name, rounds_of in timed(found, L, rounds, batch, heads, head_dim).items():
            rows.append([L, name] + [f"{rounds_of.median(case):.3f}" for case in CASES] + [
                f"{rounds_of.ratio('dense auto', 'windowed'):.2f}",
                f"{rounds_of.ratio('no bias', 'windowed'):.2f}",
            ])
            log(f"[windows] L={L} {name}: " + ", ".join(
                f"{case} {rounds_of.median(case):.3f}s" for case in CASES))
    windows = variant_windows(get_slopes(heads), cutoff, "causal")[0]
    shape = (f"B={batch}, H={heads}, D={head_dim}, float32, causal, cutoff T={cutoff:g} "
             f"(windows {', '.join(str(w) for w in windows)}), {rounds} interleaved round(s), "
             "median")
    body = table(["L", "pass", "no bias s", "dense auto s", "windowed s",
                  "× faster than dense auto", "× faster than no bias"], rows)
    return shape, body


def sinks_table(lengths, cutoff=8.0, sinks=4, rounds=3, batch=1, heads=8, head_dim=64,
                log=print):
    """``(shape line, Markdown table)``: causal ``windowed`` with ``sinks`` attention sinks and
    without, per length and pass, and the ratio (time with ÷ time without)."""
    scale = 1 / math.sqrt(head_dim)
    with_sinks = f"S={sinks}"
    found = {"S=0": attending("windowed", layer_of(heads, "causal", cutoff), scale),
             with_sinks: attending("windowed", layer_of(heads, "causal", cutoff, sinks), scale)}
    rows = []
    for L in lengths:
        for name, rounds_of in timed(found, L, rounds, batch, heads, head_dim).items():
            ratio = rounds_of.ratio(with_sinks, "S=0")
            rows.append([L, name, f"{rounds_of.median('S=0'):.3f}",
                         f"{rounds_of.median(with_sinks):.3f}", f"{ratio:.3f}"])
            log(f"[windows] L={L} {name}: {with_sinks} ÷ S=0 {ratio:.3f}")
    shape = (f"B={batch}, H={heads}, D={head_dim}, float32, causal, cutoff T={cutoff:g}, "
             f"{rounds} interleaved round(s), median")
    body = table(["L", "pass", "windowed S=0 s", f"windowed {with_sinks} s",
                  f"{with_sinks} ÷ S=0"], rows)
    return shape, body


def chunks_table(lengths, variants, widths, sizes, rounds=3, batch=1, head_dim=64, log=print):
    """``(shape line, Markdown table)``: per variant, length, window and pass, the seconds of one
    head's windowed attention with each chunk size, and the size :func:`.windowed.chunk_size`
    picks (``*``)."""
    slope = torch.tensor([0.01])  # the windows are given: the slope only sets the bias
    rows = []
    for variant in variants:
        for L in lengths:
            for W in widths:
                windows = ([W], [0 if variant in ("causal", "one_sided") else W])
                found = {c: functools.partial(windowed.attention, slopes=slope,
                                              future_slopes=slope if variant == "asymmetric"
                                              else None, variant=variant, windows=windows,
                                              chunk=c) for c in sizes}
                picked = windowed.chunk_size(W, windows[1][0])
                for name, rounds_of in timed(found, L, rounds, batch, 1, head_dim).items():
                    rows.append([variant, L, W, name] + [
                        f"{rounds_of.median(c) * 1000:.1f}{'*' if c == picked else ''}"
                        for c in sizes])
                    log(f"[windows] chunks {variant} L={L} W={W} {name}: " + ", ".join(
                        f"c={c} {rounds_of.median(c) * 1000:.1f}ms" for c in sizes))
    shape = (f"B={batch}, one head, D={head_dim}, float32, milliseconds per call by chunk size "
             f"(* the size chunk_size picks), {rounds} interleaved round(s), median")
    body = table(["variant", "L", "W", "pass"] + [f"c = {c}" for c in sizes], rows)
    return shape, body


def _label(cutoff: float) -> str:
    return f"T={cutoff:g}"


def _peak(fn, q, k, v) -> int:
    """:func:`peak_bytes` of one forward call, after a garbage collection: a tensor of an earlier
    case freed during the profiled call would count as a negative allocation."""
    gc.collect()
    return peak_bytes(forward_call(fn, q, k, v))


def cutoffs_table(lengths, variants, cutoffs, rounds=3, batch=1, heads=8, head_dim=64,
                  log=print):
    """``(shape line, Markdown table)``: per variant and length, ``windowed`` forward time ÷
    ``dense auto`` and the peak MiB of one forward call, per cutoff."""
    scale = 1 / math.sqrt(head_dim)
    rows = []
    for variant in variants:
        for L in lengths:
            found = {"dense auto": attending("auto", layer_of(heads, variant), scale)}
            found.update({_label(c): attending("windowed", layer_of(heads, variant, c), scale)
                          for c in cutoffs})
            rounds_of = timed(found, L, rounds, batch, heads, head_dim, ("forward",))["forward"]
            ratios = [f"{rounds_of.ratio(_label(c), 'dense auto'):.2f}" for c in cutoffs]
            dense_s = rounds_of.median("dense auto")
            (q, k, v), _, _ = inputs(batch, heads, L, head_dim)
            del rounds_of
            peaks = {"dense auto": _peak(attending("auto", layer_of(heads, variant), scale),
                                         q, k, v)}
            for c in cutoffs:  # a fresh layer: nothing memoised before the measured call
                peaks[_label(c)] = _peak(attending("windowed", layer_of(heads, variant, c),
                                                   scale), q, k, v)
            rows.append([variant, L, "time ÷ dense auto", f"{dense_s:.3f} s"] + ratios)
            rows.append([variant, L, "peak MiB", mib(peaks["dense auto"])]
                        + [mib(peaks[_label(c)]) for c in cutoffs])
            log(f"[windows] {variant} L={L}: " + ", ".join(
                f"{_label(c)} {ratio}" for c, ratio in zip(cutoffs, ratios)))
    shape = (f"B={batch}, H={heads}, D={head_dim}, float32, forward, {rounds} interleaved "
             "round(s), median; peak MiB: torch.profiler's allocation events of one call, "
             "fresh bias")
    body = table(["variant", "L", "figure", "dense auto"] + [_label(c) for c in cutoffs], rows)
    return shape, body


def thresholds(lengths, variants, cutoffs, passes=PASSES, rounds=3, batch=1, heads=8,
               head_dim=64, log=print):
    """``(shape line, Markdown table, check line, records)``: ``auto``'s choice for whole
    windowed sequences against the measured times (module docstring, ``thresholds``)."""
    scale = 1 / math.sqrt(head_dim)
    rows, records, slower, slower_than_dense = [], [], [], []
    for variant in variants:
        layers = {c: layer_of(heads, variant, c) for c in cutoffs}
        found = {"sdpa": attending("sdpa", layers[max(cutoffs)], scale),
                 "dense auto": attending("auto", layer_of(heads, variant), scale)}
        found.update({_label(c): attending("windowed", layers[c], scale) for c in cutoffs})
        for L in lengths:
            for pass_name, rounds_of in timed(found, L, rounds, batch, heads, head_dim,
                                              passes).items():
                q, k = torch.empty(batch, heads, L, 1), torch.empty(batch, heads, L, 1)
                with torch.set_grad_enabled(pass_name != "forward"):
                    for c in cutoffs:
                        call = dispatch.call_of(q.requires_grad_(pass_name != "forward"), k, k,
                                                layers[c])
                        chosen = dispatch.auto_backend(call)
                        # the cost model decides the calls not sent to windowed by length
                        by_length = variant in dispatch.ONE_WAY_VARIANTS
                        predicted = dispatch.windowed_cost(call.windows, variant, L)
                        win = rounds_of.ratio(_label(c), "sdpa")
                        auto = win if chosen == "windowed" else 1.0
                        auto_dense = rounds_of.ratio(
                            _label(c) if chosen == "windowed" else "sdpa", "dense auto")
                        records.append(dict(variant=variant, length=L, pass_name=pass_name,
                                            cutoff=c, heads=heads, predicted=None if by_length else predicted,
                                            windowed_over_sdpa=win, chosen=chosen,
                                            auto_over_dense_auto=auto_dense))
                        rows.append([variant, L, pass_name, f"{c:g}",
                                     "by length" if by_length else f"{predicted:.2f}",
                                     f"{win:.2f}", chosen, f"{auto:.2f}", f"{auto_dense:.2f}"])
                        if auto > 1 + NOISE:
                            slower.append(f"{variant} L={L} {pass_name} T={c:g} ({auto:.2f})")
                        if auto_dense > 1 + NOISE:
                            slower_than_dense.append(
                                f"{variant} L={L} {pass_name} T={c:g} ({auto_dense:.2f})")
                log(f"[windows] {variant} L={L} {pass_name}: sdpa "
                    f"{rounds_of.median('sdpa'):.3f}s, windowed ÷ sdpa " + ", ".join(
                        f"{_label(c)} {rounds_of.ratio(_label(c), 'sdpa'):.2f}"
                        for c in cutoffs))
    shape = (f"B={batch}, H={heads}, D={head_dim}, float32, {rounds} interleaved round(s), "
             f"median; auto: causal and one_sided from ONE_WAY_WINDOWED_MIN_LENGTH="
             f"{tuning.ONE_WAY_WINDOWED_MIN_LENGTH}, the others from WINDOWED_MIN_LENGTH="
             f"{tuning.WINDOWED_MIN_LENGTH}, "
             f"WINDOWED_COST={tuning.WINDOWED_COST}, "
             f"WINDOWED_MAX_COST={tuning.WINDOWED_MAX_COST:g}")
    body = table(["variant", "L", "pass", "T", "predicted", "windowed ÷ sdpa", "auto",
                  "auto ÷ sdpa", "auto ÷ dense auto"], rows)
    check = ("Check: auto with a cutoff was never slower than the dense choice (sdpa, windowed "
             f"bias) by more than {NOISE:.0%} in {len(records)} cases" if not slower else
             f"Check: auto with a cutoff was SLOWER than the dense choice by more than "
             f"{NOISE:.0%} in {len(slower)} of {len(records)} cases: " + "; ".join(slower))
    check += ("\nCheck: auto with a cutoff was never slower than dense auto without one by more "
              f"than {NOISE:.0%} in {len(records)} cases" if not slower_than_dense else
              "\nCheck: auto with a cutoff was SLOWER than dense auto without one by more than "
              f"{NOISE:.0%} in {len(slower_than_dense)} of {len(records)} cases: "
              + "; ".join(slower_than_dense))
    return shape, body, check, records


def _least_absolute(columns, target, rounds=100):
    """Least absolute deviations ``min Σ |X a - y|`` by iteratively reweighted least squares."""
    X, y = torch.tensor(columns, dtype=torch.float64).T, torch.tensor(target, dtype=torch.float64)
    weights = torch.ones_like(y)
    for _ in range(rounds):
        w = weights.sqrt()[:, None]
        found = torch.linalg.lstsq(X * w, y * w[:, 0]).solution
        weights = 1 / (X @ found - y).abs().clamp_min(1e-4)
    return found.tolist()


def fit_cost(records):
    """``(constants, Markdown table, check line)``: ``tuning.WINDOWED_COST`` re-fitted to the
    ``thresholds`` records (``--json`` files) of the variants the cost model decides on (not
    :data:`dispatch.ONE_WAY_VARIANTS`): per variant, length and cutoff the slower pass's
    ``windowed ÷ sdpa``, against the keys the plan reads (``dispatch.windowed_keys``; one-way
    keys are those of the groups whose window drops no key, run as the fold); least absolute
    deviations for the terms the cells exercise, any term no cell reads kept as it is."""
    cells = {}
    for r in records:
        if r["variant"] not in dispatch.ONE_WAY_VARIANTS:
            key = (r["variant"], r["length"], r["cutoff"], r.get("heads", 8))
            cells[key] = max(cells.get(key, 0.0), r["windowed_over_sdpa"])
    if not cells:
        raise ValueError("no thresholds record of a bidirectional variant to fit (run "
                         "--tables thresholds --variants symmetric,... --json FILE first)")
    rows, terms = [], []
    for variant, L, c, H in cells:
        q = torch.empty(1, H, L, 1)
        call = dispatch.call_of(q, q, q, layer_of(H, variant, c))
        terms.append((*dispatch.windowed_keys(call.windows, variant, L), 1000 / L))
    old = list(tuning.WINDOWED_COST)
    free = [i for i in range(4) if any(t[i] for t in terms)]
    fixed = [i for i in range(4) if i not in free]
    target = [m - sum(old[i] * t[i] for i in fixed) for m, t in zip(cells.values(), terms)]
    new = list(old)
    for i, value in zip(free, _least_absolute([[t[i] for t in terms] for i in free], target)):
        new[i] = round(value, 2)
    limit, picked, missed = tuning.WINDOWED_MAX_COST, [], 0
    for (variant, L, c, _), measured, t in zip(cells, cells.values(), terms):
        before, after = (sum(a * x for a, x in zip(k, t)) for k in (old, new))
        rows.append([variant, L, f"{c:g}", *(f"{x:.2f}" for x in t[:3]), f"{measured:.2f}",
                     f"{before:.2f}", f"{after:.2f}"])
        if after <= limit:
            picked.append(measured)
        elif measured < limit:
            missed += 1
    body = table(["variant", "L", "T", "k₁ one-way", "k₂ two-way", "k₃ whole",
                  "measured windowed ÷ sdpa", f"predicted {tuple(old)}",
                  f"predicted {tuple(new)}"], rows)
    slowest = f", the slowest measured at {max(picked):.2f}x sdpa" if picked else ""
    settings = {name: getattr(tuning, name) for name in tuning.WINDOWED_COST_FITTED_WITH}
    check = (f"Check: with {tuple(new)} and WINDOWED_MAX_COST={limit:g}, auto would send "
             f"{len(picked)} of {len(cells)} cells to windowed{slowest}; {missed} cell(s) "
             f"measured below {limit:g} would stay on sdpa; fitted with the chunk settings "
             f"WINDOWED_COST_FITTED_WITH = {settings}")
    return tuple(new), body, check


def _keys(parser, text: str, flag: str):
    """``text``'s comma-separated positive numbers of keys, or ``flag``'s one-line error."""
    found = [int(x) for x in text.split(",") if x.strip()]
    if not found or any(n < 1 for n in found):
        parser.error(f"{flag}: each must be a positive number of keys, got {text!r}")
    return found


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: short lengths, small heads, one round, two cutoffs "
                             "(a flag given beside it wins)")
    parser.add_argument("--tables", default="targets,cutoffs",
                        help=f"comma-separated, of {', '.join(TABLES)} (default targets,cutoffs)")
    parser.add_argument("--lengths", default=None,
                        help="comma-separated sequence lengths (default 1024,2048,4096,8192; "
                             "thresholds: 256,512,768,1024,2048)")
    parser.add_argument("--cutoff", type=float, default=8.0,
                        help="the window cutoff T of the targets table, nats")
    parser.add_argument("--cutoffs", default=None,
                        help="comma-separated cutoffs T of the other tables (default 2,4,6,8,12,16)")
    parser.add_argument("--variants", default=None,
                        help="comma-separated variants of the other tables (default: cutoffs "
                             "causal,symmetric; thresholds every variant)")
    parser.add_argument("--sinks", type=int, default=4,
                        help="the attention sinks S of the sinks table")
    parser.add_argument("--passes", default="forward,fwd+bwd",
                        help="comma-separated passes of the thresholds table")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved timing rounds (default 3; --quick: 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--batch", type=int, default=1, help="sequences per call")
    parser.add_argument("--head-dim", type=int, default=None,
                        help="head size D (default 64; --quick: 16)")
    parser.add_argument("--windows", default=None,
                        help="comma-separated windows W of the chunks table (default "
                             "16,64,256,1024,2048; --quick: 16,64)")
    parser.add_argument("--chunks", default=None,
                        help="comma-separated chunk sizes of the chunks table (default "
                             "32,64,128,256,512; --quick: 32,64)")
    parser.add_argument("--json", default=None, help="write the thresholds' records to this file")
    parser.add_argument("--fit", default=None, metavar="FILES",
                        help="comma-separated --json files of thresholds runs: re-fit "
                             "tuning.WINDOWED_COST to them and print it (no timing)")
    return parser


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    fill_unset(args, dict(rounds=1, windows="16,64", chunks="32,64") if args.quick
               else dict(rounds=3, windows="16,64,256,1024,2048", chunks="32,64,128,256,512"))
    torch.set_num_threads(args.threads)
    tables = comma_choices(parser, args.tables, TABLES, "table")
    passes = comma_choices(parser, args.passes, PASSES, "pass")
    cutoffs = ([float(x) for x in args.cutoffs.split(",") if x.strip()] if args.cutoffs
               else [2.0, 8.0] if args.quick else list(CUTOFFS))
    if any(not c > 0 for c in cutoffs) or args.cutoff <= 0:
        parser.error("--cutoff/--cutoffs: each cutoff must be a positive number of nats")
    head_dim, rounds = (16 if args.quick else 64), args.rounds
    if args.head_dim is not None:
        if args.head_dim < 1:
            parser.error(f"--head-dim must be a positive number of dims, got {args.head_dim}")
        head_dim = args.head_dim
    log = lambda line: print(line, file=sys.stderr)  # noqa: E731
    parts = [f"{command_line('benchmarks.windows', argv)}\nMachine: {machine()}"]

    lengths = comma_numbers(parser, args.lengths, "--lengths", 2) if args.lengths else None
    if args.json and "thresholds" not in tables:
        parser.error("--json writes the thresholds' records: add thresholds to --tables")

    def lengths_or(default):
        if lengths:
            return lengths
        return [64, 256] if args.quick else default

    def variants_or(default):
        return comma_choices(parser, args.variants, VARIANTS, "variant") if args.variants \
            else default

    if args.fit:
        records = []
        for name in args.fit.split(","):
            try:
                with open(name) as f:
                    records += json.load(f)
            except (OSError, ValueError) as error:
                parser.error(f"--fit: cannot read {name}: {error}")
        try:
            constants, body, check = fit_cost(records)
        except ValueError as error:
            parser.error(f"--fit: {error}")
        text = "\n\n".join(parts + [f"WINDOWED_COST re-fitted: {constants}",
                                     f"{body}\n\n{check}"])
        print(text)
        return text
    if "targets" in tables:
        shape, body = targets(lengths_or([1024, 2048, 4096, 8192]), args.cutoff, rounds,
                              args.batch, head_dim=head_dim, log=log)
        parts.append(f"Targets: {shape}\n\n{body}")
    if "cutoffs" in tables:
        shape, body = cutoffs_table(lengths_or([1024, 2048, 4096, 8192]),
                                    variants_or(["causal", "symmetric"]), cutoffs, rounds,
                                    args.batch, head_dim=head_dim, log=log)
        parts.append(f"Per cutoff: {shape}\n\n{body}")
    if "thresholds" in tables:
        shape, body, check, records = thresholds(
            lengths_or([256, 512, 768, 1024, 2048]), variants_or(list(VARIANTS)), cutoffs,
            passes, rounds, args.batch, head_dim=head_dim, log=log)
        parts.append(f"Thresholds: {shape}\n\n{body}\n\n{check}")
        if args.json:
            with open(args.json, "w") as out:
                json.dump(records, out, indent=1)
    if "sinks" in tables:
        shape, body = sinks_table(lengths_or([4096, 8192]), args.cutoff, args.sinks, rounds,
                                  args.batch, head_dim=head_dim, log=log)
        parts.append(f"Attention sinks: {shape}\n\n{body}")
    if "chunks" in tables:
        shape, body = chunks_table(
            lengths_or([8192]), variants_or(["causal", "symmetric"]),
            _keys(parser, args.windows, "--windows"), _keys(parser, args.chunks, "--chunks"),
            rounds,
            args.batch, head_dim=head_dim, log=log)
        parts.append(f"Chunk sizes: {shape}\n\n{body}")
    text = "\n\n".join(parts)
    print(text)
    return text


if __name__ == "__main__":
    main()
