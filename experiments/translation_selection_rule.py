"""The selection's rule and grid (``translation_length --select``,
:mod:`experiments.translation_selection`): the sizes, scales, decodings and goals tried, the
names of trained settings and decodings, and the rule that judges and ranks candidates
(:data:`RULE`, written before any run)."""

import itertools
import statistics
from dataclasses import dataclass
from typing import Dict, Tuple

from experiments.translation_runs import ALIBI, POINTER, SINUSOIDAL

#: the rule, written before any run (the report prints it as it stands)
RULE = (
    "For a candidate `c` (slope scale, `K`, guard layer, margin), a size `s` and a seed: "
    "`kept_b` = BLEU of bucket `b` ÷ BLEU of (N/2, N], and "
    "`score = min(kept_(2N,4N] / 0.60, kept_(4N,8N] / 0.40)` (1 = both goals just met). "
    "`c` is *admissible* at `s` when, on every seed, the output ÷ reference length is within "
    "0.9–1.1 in every bucket, and its in-range BLEU (mean over seeds) is at least the `alibi` "
    "baseline's minus 1. The chosen `c` maximises the minimum of `score` over both sizes and "
    "every seed among the candidates admissible at both sizes (none admissible: the fewest "
    "failed conditions first); ties go to the higher in-range BLEU. `K` is a rule across "
    "sizes: `2` (2 heads at either size) or `half` (half the heads: 2 of 4, 4 of 8), the same "
    "checkpoint at the small size. :func:`rank_scales` orders the scales by the best minimum "
    "`score` over seeds any of their decoding settings reaches on the small size, admissible "
    "ones first."
)


@dataclass(frozen=True)
class Size:
    layers: int
    dim: int
    ffn: int
    heads: int
    max_update: int


#: the two model sizes: the documented small one and one with 8 decoder heads (its updates
#: sized to the CPU budget: a run of 1,000 costs about 1.4 times a small run of 2,000, measured
#: in docs/translation.md)
SIZES = {"small": Size(layers=2, dim=64, ffn=256, heads=4, max_update=2000),
         "large": Size(layers=2, dim=256, ffn=512, heads=8, max_update=1000)}


#: the slope scales tried at the small size (``K = 2``: Press's 1/16 and 1/256 times X)
SCALES = (4, 8, 16, 32)


#: how many of them go on to the large size
TOP_SCALES = 2


#: ``K`` rules tried at the large size: 2 heads, or half the heads
LARGE_HEADS = ("2", "half")


#: the EOS guard's margins D and the pointer it reads, decoded on validation
MARGINS = (1, 2, 3, 4)


GUARD_LAYERS = ("last", "first", "min")


#: the slope scales the chosen checkpoints are decoded with in step 5 (its trained scale is
#: step 4's choice itself)
DECODE_SCALES = (24, 32, 48, 64)


#: the label of step 4's choice in the test tables when step 5 moved it
STEP4_LABEL = "chosen at the trained scale"


#: restoration's test: the inference slope scale gettext's validation chose, when restoration's
#: own chose another
GETTEXT_LABEL = "at gettext's inference scale"


#: step 7: the confirmation split's name, and its test buckets' size in the selection's
CONFIRM = "confirmation"


CONFIRM_FACTOR = 4


#: the goals (BLEU kept at (2N, 4N] and (4N, 8N]; the length window; in-range BLEU vs alibi)
GOALS = {"kept_4N": 0.60, "kept_8N": 0.40, "length": (0.9, 1.1), "in_range": 1.0,
         "restoration_kept_4N": 0.80}


BASELINES = {"alibi": ALIBI, "sinusoidal": SINUSOIDAL}


#: ``--smoke``: every step at toy sizes, a thinned grid (the tests run it)
SMOKE = dict(sizes={"small": Size(1, 16, 32, 4, 3), "large": Size(1, 16, 32, 8, 3)},
             scales=(4, 16), top=1, margins=(2,), layers=("min",), decode_scales=(32,))


def heads_of(rule, size):
    return size.heads // 2 if rule == "half" else int(rule)


def pointer_name(scale, k):
    return f"pointer_x{scale:g}_k{k}"


def trained_flags(name):
    """The model options of a trained setting's name (a baseline or ``pointer_x<X>_k<K>``)."""
    if name in BASELINES:
        return list(BASELINES[name])
    scale, k = name[len("pointer_x"):].split("_k")
    return list(ALIBI + POINTER) + ["--cross-alibi-slope-scale", scale,
                                          "--cross-alibi-heads", k]


def decodings(name, grid):
    """``{decoding: --model-overrides}`` of a trained setting: none for a baseline; for a
    pointer, no guard and each margin at each guard layer."""
    if name in BASELINES:
        return {"plain": {}}
    settings = {"noguard": {}}
    for layer, margin in itertools.product(grid["layers"], grid["margins"]):
        settings[f"{layer}_{margin}"] = {"cross_alibi_eos_guard": float(margin),
                                         "cross_alibi_eos_guard_layer": layer}
    return settings


def sharpened(decoding, scale, longer_than=0):
    """The name of ``decoding`` with the slopes of slope scale ``scale`` outside training for
    sources of more than ``longer_than`` tokens (0: every source) (step 5)."""
    return f"{decoding}_decode_x{scale:g}" + (f"_over{longer_than}" if longer_than else "")


def overrides_of(name, decoding, grid):
    """The ``--model-overrides`` of ``decoding`` (a name of :func:`decodings`, or one of
    :func:`sharpened`) of the trained setting ``name``."""
    guard, _, sharp = decoding.partition("_decode_x")
    overrides = dict(decodings(name, grid)[guard])
    if sharp:
        scale, _, longer_than = sharp.partition("_over")
        overrides["cross_alibi_inference_slope_scale"] = float(scale)
        # 0, every source, said: unset, a checkpoint's recorded training length would apply
        overrides["cross_alibi_inference_longer_than"] = int(longer_than or 0)
    return overrides


def kept(rows, bucket):
    """BLEU of ``bucket`` ÷ BLEU in range (bucket 0) of one run's rows (0 when in-range BLEU is
    0 or a bucket is empty)."""
    low, high = rows[0]["bleu"], rows[bucket]["bleu"]
    return high / low if low and high is not None else 0.0


def seed_score(rows):
    return min(kept(rows, 2) / GOALS["kept_4N"], kept(rows, 3) / GOALS["kept_8N"])


def length_ok(rows):
    low, high = GOALS["length"]
    return all(r["length_ratio"] is not None and low <= r["length_ratio"] <= high for r in rows)


def in_range(per_seed):
    return statistics.fmean(rows[0]["bleu"] for rows in per_seed)


def judge(per_seed, baseline_in_range):
    """One candidate at one size: ``{score, failed, in_range}`` from its rows of every seed
    (``score``: min over seeds; ``failed``: the conditions of the rule it misses)."""
    failed = [f"length seed {k}" for k, rows in per_seed.items() if not length_ok(rows)]
    bleu = in_range(per_seed.values())
    if baseline_in_range is not None and bleu < baseline_in_range - GOALS["in_range"]:
        failed.append("in-range BLEU")
    return {"score": min(seed_score(rows) for rows in per_seed.values()), "failed": failed,
            "in_range": bleu}


@dataclass(frozen=True)
class Ranked:
    """One candidate judged by the rule, as :func:`choose` and :func:`choose_decode_scale`
    rank them (best first)."""

    #: what the ranking sorts by: ``(-failed conditions, score, in-range BLEU)``
    key: Tuple[float, float, float]
    #: ``(scale, K rule, decoding[, decode scale, longer than])``
    candidate: tuple
    #: ``{size: (trained name, decoding)}``: the runs it stands for
    runs: Dict[str, Tuple[str, str]]
    #: ``{size: judge(...)}``
    verdicts: dict

    @property
    def scale(self):
        """The slope scale it was trained with."""
        return self.candidate[0]


def candidates(scores, sizes, scales, decode_grid):
    """Every joint candidate ``(scale, K rule, decoding)`` whose runs exist at every size of
    ``sizes`` (``{name: Size}``): ``{candidate: {size: (trained name, decoding)}}``; a rule that
    names the same runs as an earlier one at every size is left out."""
    found, seen = {}, set()
    for scale, rule in itertools.product(scales, LARGE_HEADS):
        for decoding in decodings(pointer_name(scale, 2), decode_grid):
            at = {s: (pointer_name(scale, heads_of(rule, size)), decoding)
                  for s, size in sizes.items()}
            runs = tuple(sorted(at.items()))
            if runs not in seen and all(at[s] in scores.get(s, {}) for s in sizes):
                found[(scale, rule, decoding)] = at
                seen.add(runs)
    return found


def judged(scores, baselines, at):
    """``{size: judge(...)}`` of one candidate, and its key for :func:`choose` (admissible,
    score, in-range BLEU)."""
    verdicts = {s: judge(scores[s][at[s]], baselines.get(s)) for s in at}
    failed = sum(len(v["failed"]) for v in verdicts.values())
    score = min(v["score"] for v in verdicts.values())
    bleu = statistics.fmean(v["in_range"] for v in verdicts.values())
    return verdicts, (-failed, score, bleu)


def rank_scales(scores, baselines, scales, decode_grid):
    """The scales in order of the best candidate each has at the small size alone."""
    best = {}
    for scale in scales:
        keys = [judged(scores, baselines, {"small": (pointer_name(scale, 2), d)})[1]
                for d in decodings(pointer_name(scale, 2), decode_grid)
                if (pointer_name(scale, 2), d) in scores.get("small", {})]
        if keys:
            best[scale] = max(keys)
    return sorted(best, key=lambda scale: best[scale], reverse=True)


def choose_decode_scale(scores, baselines, chosen, decode_scales, longer_than=0):
    """Step 5: step 4's ``chosen`` (a :class:`Ranked`) and the same checkpoints decoded with
    each slope scale of ``decode_scales`` for sources of more than ``longer_than`` tokens (those
    decoded on validation with every seed), best first by the rule: the first is the final
    choice. Candidates are ``(scale, K rule, decoding, decode scale, longer than)``."""
    scale, rule, decoding = chosen.candidate
    table = [Ranked(chosen.key, (scale, rule, decoding, scale, 0), chosen.runs, chosen.verdicts)]
    for x in decode_scales:
        if x == scale:
            continue
        tried = {s: (trained, sharpened(d, x, longer_than))
                 for s, (trained, d) in chosen.runs.items()}
        if all(tried[s] in scores.get(s, {}) for s in tried):
            verdicts, key = judged(scores, baselines, tried)
            table.append(Ranked(key, (scale, rule, decoding, x, longer_than), tried, verdicts))
    table.sort(key=lambda row: row.key, reverse=True)
    return table


def choose(scores, baselines, scales, decode_grid, sizes):
    """Every candidate over ``sizes`` as a :class:`Ranked`, best first: the first is the
    choice."""
    table = []
    for candidate, at in candidates(scores, sizes, scales, decode_grid).items():
        verdicts, key = judged(scores, baselines, at)
        table.append(Ranked(key, candidate, at, verdicts))
    table.sort(key=lambda row: row.key, reverse=True)
    return table


def describe(candidate):
    """``(scale, K rule, decoding[, decode scale, longer than])`` in words."""
    scale, rule, decoding, *decode = candidate
    guard = "no EOS guard" if decoding == "noguard" else \
        f"EOS guard {decoding.split('_')[1]} on the {decoding.split('_')[0]} pointer"
    heads = "K = 2" if rule == "2" else "K = half the heads"
    text = f"slope scale {scale:g}, {heads}, {guard}"
    if decode and decode[0] != scale:
        text += f", decoded at slope scale {decode[0]:g}" + (
            f" beyond {decode[1]} source tokens" if decode[1] else "")
    return text


def flags_of(candidate):
    """The training flags of a candidate (the EOS guard and the inference slope scale act
    outside training only, and are saved with the model)."""
    scale, rule, decoding, *decode = candidate
    flags = f"--cross-alibi pointer --cross-alibi-slope-scale {scale:g}"
    if decode and decode[0] != scale:
        flags += f" --cross-alibi-inference-slope-scale {decode[0]:g}"
        if decode[1]:
            flags += f" --cross-alibi-inference-longer-than {decode[1]}"
    if rule == "2":
        flags += " --cross-alibi-heads 2"
    if decoding != "noguard":
        layer, margin = decoding.split("_")
        flags += f" --cross-alibi-eos-guard {margin}"
        if layer != "last":
            flags += f" --cross-alibi-eos-guard-layer {layer}"
    return flags


def decode_flags_of(candidate):
    """What decoding a checkpoint trained without the inference slope scale adds
    (``fairseq-generate``), or ``""``."""
    scale, _, _, *decode = candidate
    if not decode or decode[0] == scale:
        return ""
    gate = f", 'cross_alibi_inference_longer_than': {decode[1]}" if decode[1] else ""
    return f"--model-overrides \"{{'cross_alibi_inference_slope_scale': {decode[0]:g}{gate}}}\""
