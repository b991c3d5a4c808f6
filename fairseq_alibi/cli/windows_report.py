"""What ``fairseq-alibi windows`` (:mod:`fairseq_alibi.cli.windows_check`) concludes from what it
measured, and how it says it: the stopping rule's decision on a cutoff at one length
(:func:`judge`), a row per head and ``T`` (:class:`HeadRow`) and per ``T`` with the candidates
``(T, S)`` scored at it (:class:`CutoffRow`, :class:`Candidate`), the attention kept by a window,
the verdict line (:func:`verdict`), and the report: the tables on stdout, ``windows.md``, the
two CSVs and ``windows.png``. It reads no model and no data: the tool hands it numbers.
"""

import csv
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from fairseq_alibi.cli.windows_inputs import Pairs
from fairseq_alibi.config_access import flag_of_key

#: the stopping rule: |Δ| ± Z σ against the tolerance; σ from blocks of BLOCK tokens (or fewer
#: tokens, so that there are at least MIN_BLOCKS blocks)
Z = 2.0
BLOCK = 256
MIN_BLOCKS = 16
#: the --alibi-attention a cutoff is measured and recommended with where the saved one cannot
#: drop keys (``fold``): the verdict is on perplexity, which no backend changes
WINDOWED_ATTENTION = "auto"

@dataclass
class Judged:
    """A cutoff at one length: its perplexity change on the tokens scored and the stopping
    rule's decision (``within``, ``beyond`` or ``undecided``)."""
    tokens: int
    ppl: float
    dense_ppl: float
    change: float  # percent of dense
    margin: float  # Z σ, percent
    status: str


def judge(diffs, dense_nll: float, tolerance: float) -> Judged:
    """The stopping rule on ``diffs``, the per-token changes of the negative log-likelihood
    (nats) so far (``dense_nll``: dense's sum over the same tokens)."""
    import torch

    count = diffs.numel()
    mean = float(diffs.mean())
    block = max(1, min(BLOCK, count // MIN_BLOCKS))
    means = diffs[:count // block * block].view(-1, block).mean(1)
    sigma = float(means.std() / math.sqrt(means.numel())) if means.numel() > 1 else math.inf
    change = 100 * math.expm1(mean)
    margin = Z * 100 * math.exp(mean) * sigma
    status = ("within" if abs(change) + margin <= tolerance else
              "beyond" if abs(change) - margin > tolerance else "undecided")
    dense = dense_nll / count
    return Judged(count, math.exp(dense + float(torch.sum(diffs)) / count), math.exp(dense),
                  change, margin, status)


@dataclass
class Candidate:
    """A cutoff evaluated with ``sinks`` first positions kept (0: none): each length's
    :class:`Judged`, longest first, up to the first that is not within (the others are not
    scored); the keys a decoding cache keeps (its sinks included; ``None``: every key, or a
    model that does not decode, an encoder: ``decodes`` False)."""
    cutoff: float
    sinks: int
    judged: Dict[int, Judged]
    cache: Optional[int]
    decodes: bool = True
    sides: Tuple[str, ...] = ("alibi",)  # the window options' prefixes (window_sides)
    #: the sinks the checkpoint was saved with: a load-time cutoff alone would keep them
    saved_sinks: int = 0
    #: the --alibi-attention it runs with where the saved one cannot drop keys ("": as saved)
    attention: str = ""

    @property
    def cache_keys(self) -> str:
        return _window(self.cache) if self.decodes else "no decoding"

    @property
    def status(self) -> str:
        return next((j.status for j in self.judged.values() if j.status != "within"), "within")

    @property
    def worst(self) -> Judged:
        return max(self.judged.values(), key=lambda j: abs(j.change))

    @property
    def name(self) -> str:
        return f"T={self.cutoff:g}" + (f" with {self.sinks} sink{'s' * (self.sinks > 1)}"
                                       if self.sinks else "")

    @property
    def flags(self) -> str:
        """The options that run it: ``--alibi-window-cutoff T [--alibi-window-sinks S]`` (a
        translation model's: each side's, ``--encoder-alibi-window-cutoff T ...``)."""
        flags = " ".join(f"{flag_of_key(side + '_window_cutoff')} {self.cutoff:g}"
                         for side in self.sides)
        named = self.sinks or self.saved_sinks != self.sinks
        return (flags + (f" {sinks_flag(self.sides, self.sinks)}" if named else "")
                + (f" --alibi-attention {self.attention}" if self.attention else ""))


def sinks_flag(sides: Sequence[str], sinks) -> str:
    """``--alibi-window-sinks S`` (each of ``sides``' flags, :func:`window_sides`)."""
    return " ".join(f"{flag_of_key(side + '_window_sinks')} {sinks}" for side in sides)


def sides_of(rows) -> Tuple[str, ...]:
    """The window options' prefixes of the candidates of ``rows`` (:class:`CutoffRow` s)."""
    return next((c.sides for row in rows for c in row.evaluated), ("alibi",))


@dataclass
class HeadRow:
    """One layer, head and ``T``: the window and the mass beyond it."""
    layer: int
    head: int
    slope: float
    cutoff: float
    window: Optional[int]
    queries: int
    mean: float
    p99: float
    max: float
    share: Dict[int, float]  # S -> share of the mass beyond on the first S positions
    on_sinks: Dict[int, float]  # S -> mean mass beyond on the first S positions
    sink: bool
    #: a sink head's: the fewest first positions of --sinks that leave less than --sink-mass of
    #: its mean mass beyond the window on the first max(--sinks) (0: not a sink head)
    needs: int = 0

    @property
    def name(self) -> str:
        return f"layer {self.layer} head {self.head}"


@dataclass
class CutoffRow:
    """One ``T``: its windows, the heads' mass beyond, and the candidates ``(T, S)`` evaluated at
    it, in the order scored (none: a smaller ``T`` passed)."""
    cutoff: float
    windows: List[Optional[int]]
    heads: List[HeadRow]
    evaluated: List[Candidate] = field(default_factory=list)
    #: the sequence length whose attention kept stands for a length scored (``kept_length``
    #: of the tool's reader: a translation model's pairs are longer than ``--lengths`` 1)
    at: Callable[[int], int] = lambda n: n

    @property
    def sink_heads(self) -> List[HeadRow]:
        return [row for row in self.heads if row.sink]

    @property
    def needs(self) -> int:
        """The first positions its sink heads need kept (0: none)."""
        return sinks_needed(self.heads)

    def drops(self, c: Candidate) -> bool:
        """Whether ``c``'s windows drop a key of the sequences scored, at some length: by
        its windows (``W_h`` against the length, a translation's mean one), or as any score
        changed (a translation's longer pairs). Windows as long as the sequences change every
        score by exactly 0, and being within then says nothing."""
        return (any(self.kept_with(self.at(n), c.sinks) < 1 for n in c.judged)
                or any(j.change != 0 or j.margin != 0 for j in c.judged.values()))

    def passes(self, c: Candidate) -> bool:
        """``c`` (one of :attr:`evaluated`) is within at every length, keeps the first
        positions the sink heads need, and drops keys (it was tested)."""
        return c.status == "within" and c.sinks >= self.needs and self.drops(c)

    @property
    def widest(self) -> Optional[int]:
        """The largest window ``W_h`` of a head (``None``: no head has one)."""
        known = [side for w in self.windows for side in (w if isinstance(w, tuple) else (w,))
                 if side is not None]
        return max(known, default=None)

    def kept_with(self, length: int, sinks: int) -> float:
        """The share of the score entries kept at ``length`` with ``sinks`` first positions
        kept, over the heads."""
        return sum(kept_share_two_way(*w, length, sinks) if isinstance(w, tuple) else
                   kept_share(w, length, sinks) for w in self.windows) / len(self.windows)


def sinks_needed(heads) -> int:
    """The most first positions any sink head of ``heads`` (:class:`HeadRow` s) needs kept."""
    return max((h.needs for h in heads if h.sink), default=0)


def kept_share(window: Optional[int], length: int, sinks: int = 0) -> float:
    """The share of a causal sequence's score entries ``(i, j)``, ``j <= i < length``, that a
    head with window ``window`` keeps (``i - j <= window``, or ``j < sinks``)."""
    return _kept_share(window, 0, length, sinks, sees_ahead=False)


def kept_share_two_way(back: Optional[int], ahead: Optional[int], length: int,
                       sinks: int = 0) -> float:
    """:func:`kept_share` of an encoder head with windows ``back``, ``ahead`` (``None``:
    unbounded; ``0``: the side its variant hides)."""
    return _kept_share(back, ahead, length, sinks, sees_behind=back != 0, sees_ahead=ahead != 0)


def _kept_share(back, ahead, length: int, sinks: int, sees_behind=True, sees_ahead=True):
    """The share of the entries ``(i, j)`` a head computes (``j`` on a side it sees) that its
    windows keep: ``-ahead <= i - j <= back`` (``None``: unbounded), or ``j < sinks`` behind."""
    import torch

    i = torch.arange(length, dtype=torch.float64)
    before, after = i, length - 1 - i  # the keys on each side of query i
    seen = 1 + (before if sees_behind else 0) + (after if sees_ahead else 0)
    kept_before = before if back is None else before.clamp(max=back)
    kept_after = after if ahead is None else after.clamp(max=ahead)
    beyond = ((before - kept_before).clamp(max=sinks)
              if sees_behind and back is not None else 0)
    return float((1 + kept_before + kept_after + beyond).sum() / seen.sum())


def recommended(rows: List[CutoffRow]) -> Optional[Candidate]:
    """The first ``(T, S)`` evaluated that passes (within the tolerance at every length,
    keeping what its sink heads need), or ``None``."""
    return next((c for row in rows for c in row.evaluated if row.passes(c)), None)


def verdict(rows: List[CutoffRow], tolerance: float, sinks: Sequence[int]) -> str:
    """The last line: :func:`recommended`'s flags, or what failed."""
    chosen = recommended(rows)
    if chosen is not None:
        return f"recommended: {chosen.flags}"
    idle = next(((row, c) for row in rows for c in row.evaluated if not row.drops(c)), None)
    note = "" if idle is None else f"; {_drops_nothing(*idle)}"
    tested = [(row, c) for row in rows for c in row.evaluated if row.drops(c)]
    if not tested:
        return f"not recommended: {_drops_nothing(*idle)}"
    within = [(row, c) for row, c in tested if c.status == "within"]
    if within:  # within, but short of the sinks its sink heads need
        row, c = within[0]
        return (f"not recommended: at {c.name} perplexity changes {_change(c.worst)} (within "
                f"{tolerance:g} %), but {sink_reason(row, max(sinks))}{note}")
    evaluated = [c for _, c in tested]
    best = min(evaluated, key=lambda c: abs(c.worst.change) + c.worst.margin)
    kept = sorted({c.sinks for c in evaluated} - {0})
    with_sinks = sinks_flag(sides_of(rows), " or ".join(map(str, kept)))
    reason = (f"not recommended: no cutoff of "
              f"{', '.join(f'{t:g}' for t in sorted({c.cutoff for c in evaluated}))} keeps "
              f"perplexity within {tolerance:g} % of dense at every length"
              + (f", without sinks or with {with_sinks}" if kept else "")
              + f" (closest: {best.name}, {_change(best.worst)})")
    undecided = [c.name for c in evaluated if c.status == "undecided"]
    sunk = [row for row in rows if row.sink_heads and row.evaluated]
    if sunk:
        return f"{reason}; at T={sunk[0].cutoff:g} {sink_reason(sunk[0], max(sinks))}{note}"
    if undecided:
        return (f"{reason}; {', '.join(undecided)} undecided on the tokens scored: give more "
                f"--tokens (or a longer --gen-subset), or try larger --cutoffs{note}")
    return f"{reason}; try larger --cutoffs{note}"


def _drops_nothing(row: CutoffRow, c: Candidate) -> str:
    """Why ``c``, whose windows drop no key of the sequences scored, is no verdict."""
    longest = row.at(max(c.judged))
    return (f"{c.name} changes no score of the sequences scored (windows of up to "
            f"{_window(row.widest)} keys, sequences of {longest:,} tokens"
            + (" on average" if longest != max(c.judged) else "")
            + "): its windows drop no key there, and the check cannot tell whether it is safe: "
            "give --lengths longer than its windows")


def _change(judged: Judged) -> str:
    """``+0.123 ± 0.045 % on 4,096 tokens``."""
    return f"{judged.change:+.3f} ± {judged.margin:.3f} % on {judged.tokens:,} tokens"


def _first(positions: int) -> str:
    """``the first position``, ``the first 4 positions``."""
    return "the first position" if positions == 1 else f"the first {positions} positions"


def sink_reason(row: CutoffRow, sinks: int) -> str:
    """Which heads are sinks at ``row``'s ``T``, the first positions they need kept, and what
    perplexity did with them kept (the most first positions evaluated at ``T``)."""
    worst = max(row.sink_heads, key=lambda h: h.on_sinks[sinks])
    mass = f"{worst.on_sinks[sinks]:.2f}"
    who = (f"{worst.name} puts {mass} of its attention (mean) beyond its window on "
           f"{_first(sinks)} (an attention sink)" if len(row.sink_heads) == 1 else
           f"{len(row.sink_heads)} heads put their attention beyond their windows on "
           f"{_first(sinks)} (attention sinks; most: {worst.name}, {mass} mean)")
    sides = sides_of([row])
    reason = f"{who}: windows need {_first(row.needs)} kept ({sinks_flag(sides, row.needs)})"
    kept = [c for c in row.evaluated if c.sinks >= row.needs]
    if not kept:
        return f"{reason}, not scored with them"
    return (f"{reason}, and with {sinks_flag(sides, kept[-1].sinks)} perplexity changes "
            f"{_change(kept[-1].worst)} ({kept[-1].status})")


# ---------------------------------------------------------------------------------------------
# the report


def _mass(x: float) -> str:
    return "0" if x == 0 else f"{x:.2g}"


def _window(w) -> str:
    """A causal head's ``W_h`` (``None``: every key), an encoder head's ``back/ahead``."""
    if isinstance(w, tuple):
        return "/".join(_window(side) for side in w)
    return "all" if w is None else str(w)


def table(headers: Sequence[str], rows: Sequence[Sequence]) -> List[str]:
    """A Markdown table, its columns padded to line up in a terminal."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    padded = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    return [padded[0], "|" + "|".join("-" * (w + 2) for w in widths) + "|", *padded[1:]]


def cutoff_table(rows: List[CutoffRow], lengths: List[int], at=lambda n: n) -> List[str]:
    """A row per ``(T, S)`` evaluated (and per ``T`` not); ``at(n)``: the sequence length whose
    attention kept is given for length ``n`` (``Stream.kept_length``)."""
    longest = at(max(lengths))
    headers = (["T", "S", "W_h"] + [f"ppl change % L={n} (± {Z:g}σ, tokens)" for n in lengths]
               + ["verdict", f"attention kept L={longest}", "decoding cache keys",
                  "most mass beyond (mean)", "sink heads (S needed)"])
    body = []
    for row in rows:
        known = [side for w in row.windows for side in (w if isinstance(w, tuple) else (w,))
                 if side is not None]
        span = (f"{min(known)}–{max(known)}" if known else "all") + (
            " (some all)" if known and len(known) < len(row.windows) else "")
        top = max(row.heads, key=lambda h: h.mean)
        shared = [f"{_mass(top.mean)} ({top.name})",
                  ", ".join(f"{h.name} ({h.needs})" for h in row.sink_heads) or "none"]
        for c in row.evaluated or [None]:
            changes = ["not scored" if c is None or n not in c.judged else
                       f"{c.judged[n].change:+.3f} ± {c.judged[n].margin:.3f} "
                       f"({c.judged[n].tokens:,})" for n in lengths]
            status = "not evaluated" if c is None else _status(row, c)
            body.append([f"{row.cutoff:g}", "" if c is None else c.sinks, span, *changes,
                         status, f"{row.kept_with(longest, 0 if c is None else c.sinks):.0%}",
                         "" if c is None else c.cache_keys, *shared])
    return table(headers, body)


def _status(row: CutoffRow, c: Candidate) -> str:
    """The rule's decision on ``c``; ``within, sinks short`` where its sink heads need more,
    ``no score changed`` where its windows changed none of the sequences scored."""
    if not row.drops(c):
        return "no score changed"
    return "within, sinks short" if c.status == "within" and not row.passes(c) else c.status


def sinks_lines(rows: List[CutoffRow]) -> List[str]:
    """Per ``T`` scored with sinks: each ``S`` next to none."""
    return [f"T={row.cutoff:g}: " + "; ".join(
        f"{f'with {sinks_flag(c.sides, c.sinks)}' if c.sinks else 'without sinks'} "
        f"{_status(row, c)} ({_change(c.worst)})" for c in row.evaluated)
        for row in rows if any(c.sinks for c in row.evaluated)]


def heads_table(heads: List[HeadRow], cutoffs: Sequence[float], sinks: Sequence[int],
                most: Optional[int] = None) -> List[str]:
    """A row per head: its slope and, per ``T``, ``W_h · mean · p99 · max`` of the mass beyond,
    and the share on the first ``S`` positions at the smallest ``T``; the ``most`` heads with
    the most mass beyond (all if ``None``)."""
    by_head: Dict[tuple, Dict[float, HeadRow]] = {}
    for row in heads:
        by_head.setdefault((row.layer, row.head), {})[row.cutoff] = row
    order = sorted(by_head, key=lambda k: -max(r.mean for r in by_head[k].values()))
    shown = sorted(order[:most] if most else order)
    first = min(cutoffs)
    headers = (["layer", "head", "slope"] + [f"T={t:g}: W · mean · p99 · max" for t in cutoffs]
               + [f"on first {s} at T={first:g}" for s in sinks if s])
    body = [[layer, head, f"{by_head[(layer, head)][first].slope:.4g}"]
            + [f"{_window(r.window)} · " + (" · ".join(_mass(x) for x in (r.mean, r.p99, r.max))
                                            if r.queries else "no key beyond")
               for r in (by_head[(layer, head)][t] for t in cutoffs)]
            + [f"{by_head[(layer, head)][first].share[s]:.0%}" for s in sinks if s]
            for layer, head in shown]
    return table(headers, body)


def sink_lines(rows: List[CutoffRow], sinks: Sequence[int]) -> List[str]:
    judged = max(sinks)
    return [f"sink head: {h.name} at T={h.cutoff:g} (W={_window(h.window)}): "
            f"{h.on_sinks[judged]:.2f} of its attention (mean) beyond the window on "
            f"{_first(judged)}, {h.share[judged]:.0%} of what it puts beyond; it needs "
            f"{sinks_flag(sides_of([row]), h.needs)}" for row in rows for h in row.sink_heads]


def summary_lines(args, lengths, tokens: int, sample, rows, heads, mass: Tuple[int, int],
                  saved: Tuple[float, int, str] = (0.0, 0, ""), most=None) -> List[str]:
    """The report's lines: what was read (``sample``, the tool's ``Sample``; ``mass``: the
    attention mass's sequences and their length; ``saved``: the cutoff, sinks and a backend
    that cannot drop keys the checkpoint was saved with), dense's perplexity, the cutoffs'
    table, the heads' table (the ``most`` heads with the most mass beyond; all if ``None``)."""
    scored = sample.scored
    pairs = isinstance(sample.reader, Pairs)
    unit = "source tokens" if pairs else "tokens"
    as_saved = Candidate(saved[0], saved[1], {}, None, sides=sides_of(rows))
    saved_line = ([f"CKPT saved with {as_saved.flags}: dense here is the model with its cutoff "
                   "off", ""] if saved[0] else [])
    if saved[2]:
        saved_line += [f"CKPT saved with --alibi-attention {saved[2]}, which cannot drop keys: "
                       f"each cutoff is measured, and recommended, with --alibi-attention "
                       f"{WINDOWED_ATTENTION} "
                       "(the same perplexity, computed by a backend that can)", ""]
    masses, mass_length = mass
    nll = {n: sum(float(x.sum()) for x in sample.dense_nll[n]) for n in lengths}
    dense = ", ".join(f"L={n} {math.exp(nll[n] / scored[n]):.3f} ({scored[n]:,} tokens)"
                      for n in lengths if scored[n])
    with_sinks = sinks_lines(rows)
    return [f"{args.checkpoint} on {args.data} ({args.gen_subset}, {sample.reader.total:,} "
            f"{unit}): at most {tokens:,} {unit} per cutoff, in whole sequences (at least "
            "one), at "
            + ", ".join(f"L={n} ({len(sample.starts[n])} × {n})" for n in lengths)
            + f", start offsets seed {args.seed}; attention mass on {masses} × "
            f"{mass_length} tokens; layers and heads count from 0"
            + (" (the encoder's self-attention layers, then the decoder's; L: the source tokens "
               "of consecutive sentence pairs end to end, L=1: each pair as it is; the verdict "
               "is on the target's perplexity: check BLEU at the recommended T before "
               "relying on it, with --bleu N or fairseq-generate, docs/benchmarks.md)"
               if pairs else ""), "", *saved_line,
            f"dense perplexity on the tokens scored: {dense or 'none scored'}", "",
            f"per cutoff T, in increasing order until one passes, without sinks (S = 0) and, "
            f"where that fails, with each S > 0 of --sinks kept: the perplexity change against "
            f"dense at each length, ± {Z:g}σ, on the tokens scored until the rule decided "
            f"(within: |change| + {Z:g}σ <= {args.tolerance:g} %; beyond: |change| - {Z:g}σ > "
            f"{args.tolerance:g} %; undecided: neither, on all the tokens allowed; within, sinks "
            "short: fewer sinks than its sink heads need); attention kept: the share of score "
            "entries within the windows or on the first S positions (computed from W_h, not "
            "timed); decoding cache keys: max W_h + S", "",
            *cutoff_table(rows, lengths, sample.reader.kept_length), "",
            *(with_sinks + [""] if with_sinks else []),
            "mass beyond the window per head (dense attention, queries with keys beyond it)"
            + ("" if most is None else f", the {most} heads with the most"), "",
            *heads_table(heads, args.cutoffs, args.sinks, most), "",
            *sink_lines(rows, args.sinks)]


def _write(path: Path, write) -> None:
    """``write(partial)`` writes the file, then it becomes ``path`` (never half-written)."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        write(partial)
        os.replace(partial, path)
    finally:
        if partial.exists():
            partial.unlink()


def write_table(path: Path, header: list, rows, delimiter: str = ",") -> None:
    """A CSV file (``delimiter`` ``\t``: a TSV one), never half-written."""
    def write(partial):
        with open(partial, "w", newline="") as f:
            csv.writer(f, delimiter=delimiter).writerows([header, *rows])
    _write(path, write)


def write_csvs(out: Path, rows: List[CutoffRow], heads: List[HeadRow], lengths, sinks,
               at=lambda n: n):
    """``windows_heads.csv`` (a row per layer, head and ``T``), ``windows_cutoffs.csv`` (a row
    per ``(T, S)`` evaluated, and per ``T`` not evaluated)."""
    write_table(out / "windows_heads.csv",
         ["layer", "head", "slope", "cutoff", "window", "queries", "mass_beyond_mean",
          "mass_beyond_p99", "mass_beyond_max",
          *(f"{k}_first_{s}" for s in sinks for k in ("share_on", "mean_on")), "sink_head",
          "sinks_needed"],
         ([h.layer, h.head, h.slope, h.cutoff, _window(h.window), h.queries, h.mean, h.p99,
           h.max, *(v for s in sinks for v in (h.share[s], h.on_sinks[s])), h.sink, h.needs]
          for h in heads))

    def cells(row: CutoffRow, c: Optional[Candidate]):
        per_length = []
        for n in lengths:
            j = None if c is None else c.judged.get(n)
            per_length += ([""] * 6 if j is None else
                           [j.tokens, j.ppl, j.dense_ppl, j.change, j.margin, j.status])
            per_length.append(row.kept_with(at(n), 0 if c is None else c.sinks))
        return [row.cutoff, "" if c is None else c.sinks,
                "not evaluated" if c is None else _status(row, c), *per_length,
                "" if c is None else c.worst.change, "" if c is None else c.cache_keys,
                ";".join(h.name for h in row.sink_heads), row.needs]
    write_table(out / "windows_cutoffs.csv",
         ["cutoff", "sinks", "status",
          *(f"{k}_L{n}" for n in lengths for k in ("tokens", "ppl", "dense_ppl", "change_pct",
                                                   "margin_pct", "status", "attention_kept")),
          "worst_change_pct", "decoding_cache_keys", "sink_heads", "sinks_needed"],
         (cells(row, c) for row in rows for c in row.evaluated or [None]))


def plot(out: Path, heads: List[HeadRow], cutoffs: Sequence[float]) -> Optional[str]:
    """``windows.png``: the mean (line) and max (crosses) mass beyond the window, by head and
    ``T``, log scale; or why it was not drawn."""
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # the root logger may be DEBUG
    try:  # a Figure of its own, not pyplot's: no GUI backend, no global state
        from matplotlib.figure import Figure
    except ImportError:
        return "no windows.png: matplotlib is not installed (pip install matplotlib)"

    names = sorted({(h.layer, h.head) for h in heads})
    floor = 1e-12  # a mass of 0 on the log scale; a head with no key beyond: no point

    def points(at, value):
        return [max(value(at[k]), floor) if at[k].queries else math.nan for k in names]

    fig = Figure(figsize=(max(6.0, 0.3 * len(names) + 2), 4.5))
    ax = fig.subplots()
    for t in cutoffs:
        at = {(h.layer, h.head): h for h in heads if h.cutoff == t}
        line, = ax.plot(range(len(names)), points(at, lambda h: h.mean), marker="o",
                        label=f"T={t:g}")
        ax.plot(range(len(names)), points(at, lambda h: h.max), "x", color=line.get_color())
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)), [f"L{layer}H{head}" for layer, head in names],
                  rotation=90, fontsize=7)
    ax.set_xlabel("layer, head")
    ax.set_ylabel("attention mass beyond the window")
    ax.set_title("dense attention beyond each head's window: mean (o), max (x)", fontsize=10)
    ax.legend(fontsize=8)
    fig.subplots_adjust(left=0.12, right=0.97, top=0.92, bottom=0.2)  # not tight_layout: slow
    _write(out / "windows.png", lambda partial: fig.savefig(partial, format="png"))
    return None


def write_report(out: Path, command: str, lines: List[str], line: str,
                 png_note: Optional[str]):
    text = ["# Slope windows: the check before turning them on", "", f"Command: `{command}`", "",
            f"**{line}**", "", *lines, "",
            (f"_{png_note}_" if png_note else "![mass beyond the window](windows.png)"), "",
            "Mass beyond the window of head h at query i: the dense model's attention "
            "probabilities summed over the keys j < i - W_h, W_h = ceil(T / m_h) (an encoder "
            "head's W_h is back/ahead: the keys j < i - back and j > i + ahead, 0 the side its "
            "variant hides, and its perplexity is that of masked tokens); a sink head "
            "puts a mean of at least --sink-mass of its attention beyond the window on the "
            "first max(--sinks) positions, and needs the fewest first positions S of --sinks "
            "that leave less than that on the others kept (--alibi-window-sinks S). "
            "`windows_heads.csv` and `windows_cutoffs.csv` hold every figure.", ""]
    _write(out / "windows.md", lambda partial: partial.write_text("\n".join(text)))
