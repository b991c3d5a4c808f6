"""Training with a slope-window cutoff: perplexity against dense over seeds, and the
training step's speed at a long length.

    python -m experiments.window_training [--out DIR] [--cutoffs 8] [--seeds 1,2,3]
                                          [--max-update 300] [--L 64]
                                          [--speed-length 4096] [--rounds 3] [--threads 1]
                                          [--jobs 1]
                                          [--skip-quality] [--skip-speed] [--smoke]

**Quality.** The quickstart's language model (its embedded corpus, its ``tiny`` model and its
training command, :func:`fairseq_alibi.cli.quickstart.train_command`, at ``L`` = 64) is trained
once per seed dense and once per seed and cutoff with ``--alibi-window-cutoff T`` (the same
seed gives the same initialisation and batch order, so seed ``s`` dense and seed ``s`` with
``T`` differ only by the cutoff). Each checkpoint is scored with ``fairseq-eval-lm`` on the
``valid`` and ``test`` splits in non-overlapping blocks of ``L`` (a model trained with a cutoff
keeps it: its checkpoint says so), through :func:`fairseq_alibi.cli.sweep.run_sweep`, which
checks that every run scores every token of the split. Per setting: the median perplexity over
seeds and its spread ``max - min``; against dense, the difference of the medians and the
per-seed paired differences. The difference is *within the seed noise* when

    |median_T - median_dense| <= max(spread_dense, spread_T)

(the seeds' own spread bounds what a change of seed alone moves the median by).

**Speed.** fairseq's own ``Trainer`` (:mod:`benchmarks.trainer`, as ``fairseq-train`` builds
it) of an ``alibi_transformer_lm`` with 8 heads of dimension 64 (embed 512, FFN 2048, 2
layers, the quickstart's 2,000-piece vocabulary, tied embeddings, dropout 0.1), one random
sequence of ``--speed-length`` tokens per update, on the CPU in float32: one ``train_step``
(forward, backward, Adam update) dense and with ``--alibi-window-cutoff T`` in interleaved
rounds (:class:`benchmarks.timing.Rounds`: the speed-up is the median of the same round's
ratios). ``auto`` picks the fold for the dense model and the ``windowed`` backend for the
cutoff from ``tuning.WINDOWED_MIN_LENGTH`` keys on. Where the step goes, by Amdahl: the same
rounds time the attention alone (``dispatch.attend("auto", ...)`` of a layer's bias, dense and
with the cutoff, forward and backward of ``(1, 8, L, 64)`` queries, keys and values) times the
number of layers: its share of the step, and the step's speed-up if the attention cost
nothing by that share, ``step_dense / (step_dense - layers * attention_dense)`` (Amdahl; a lower
estimate where the measured speed-up exceeds it: the attention timed alone may not pay for
what it costs the rest of the step, such as memory traffic).

Outputs in ``--out``: ``window_training.md``, ``run.json``, ``logs/`` (every fairseq-train
log), ``eval/``. ``--smoke``: the quickstart's smoke model, 2 seeds, a few updates, the speed
at a short length with a small model (every step in seconds; used by the tests).
"""

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from benchmarks.tables import machine, table, today
from experiments.lm_runs import (comma_list, command_line, data_folder, publish, score_runs,
                                 seed_summary, start_run, train_settings)
from fairseq_alibi.cli.quickstart import SIZES, SMOKE, SMOKE_L

#: the recommended cutoff (docs/benchmarks.md "Choosing T")
CUTOFFS = (8,)
SEEDS = (1, 2, 3)
#: updates per training run: six runs of the tiny model (about 0.2 CPU-seconds an update) and
#: the speed rounds fit ~15 minutes of one shared core
MAX_UPDATE = 300
SPLITS = ("valid", "test")
#: the speed model: 8 heads of dimension 64
SPEED_DIMS = dict(layers=2, dim=512, heads=8, ffn=2048, vocab=2000)
SMOKE_SPEED_DIMS = dict(layers=1, dim=32, heads=4, ffn=64, vocab=100)
SMOKE_SEEDS, SMOKE_MAX_UPDATE, SMOKE_SPEED_LENGTH = (1, 2), 6, 64
#: ``--smoke``: a cutoff whose window (8 keys for the smoke model's steepest head) is shorter
#: than the smoke's L = 16, so that the cutoff changes the model; the test split only
SMOKE_CUTOFFS, SMOKE_SPLITS = (2,), ("test",)
#: the goal for the step at L = 4096
SPEED_GOAL = 1.5


def label(cutoff: Optional[float]) -> str:
    """A setting's name: ``off`` (dense) or ``T=8``."""
    return "off" if not cutoff else f"T={cutoff:g}"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/window_training")
    parser.add_argument("--cutoffs", type=comma_list(float), default=None,
                        help="cutoffs T in nats trained beside dense, comma-separated "
                        "(default 8)")
    parser.add_argument("--seeds", type=comma_list(int), default=None,
                        help="training seeds (default 1,2,3)")
    parser.add_argument("--max-update", type=int, default=None,
                        help=f"updates per training run (default {MAX_UPDATE})")
    parser.add_argument("--L", type=int, default=None, help="training length (default 64)")
    parser.add_argument("--speed-length", type=int, default=None,
                        help="tokens per sequence of the timed step (default 4096)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    parser.add_argument("--threads", type=int, default=1, help="threads of every process")
    parser.add_argument("--jobs", type=int, default=1,
                        help="fairseq-train / fairseq-eval-lm processes at once (default 1)")
    parser.add_argument("--skip-quality", action="store_true", help="only the speed")
    parser.add_argument("--skip-speed", action="store_true", help="only the quality")
    parser.add_argument("--smoke", action="store_true", help="toy settings, every step")
    args = parser.parse_args(argv)
    if args.cutoffs is None:
        args.cutoffs = sorted(SMOKE_CUTOFFS if args.smoke else CUTOFFS)
    if args.seeds is None:
        args.seeds = sorted(SMOKE_SEEDS if args.smoke else SEEDS)
    args.splits = SMOKE_SPLITS if args.smoke else SPLITS
    if not args.cutoffs or any(t <= 0 or not math.isfinite(t) for t in args.cutoffs):
        parser.error("--cutoffs must be finite numbers of nats > 0 (dense is always trained)")
    if len(args.seeds) < 2:
        parser.error("--seeds needs at least 2 seeds (the seed noise is their spread)")
    args.L = args.L or (SMOKE_L if args.smoke else 64)
    args.max_update = args.max_update or (SMOKE_MAX_UPDATE if args.smoke else MAX_UPDATE)
    args.speed_length = args.speed_length or (SMOKE_SPEED_LENGTH if args.smoke else 4096)
    if args.L < 2 or args.speed_length < 2 or min(args.max_update, args.rounds, args.jobs) < 1:
        parser.error("--L and --speed-length must be >= 2, --max-update, --rounds and --jobs "
                     ">= 1")
    return args


# ---------------------------------------------------------------------------------------------
# quality


def settings(cutoffs) -> Dict[str, list]:
    """``{setting: extra fairseq-train flags}``: dense (``off``) and ``T=8`` ..."""
    found = {label(None): []}
    found.update({label(t): ["--alibi-window-cutoff", f"{t:g}"] for t in cutoffs})
    return found


def train_all(args, data, out: Path, env: dict, log) -> Dict[tuple, dict]:
    """``{(setting, seed): fairseq-train run}``, ``args.jobs`` at once (one thread each)."""
    size = dict(SMOKE if args.smoke else SIZES["tiny"])
    return train_settings(settings(args.cutoffs), args.seeds, data, out, size, args.L,
                          args.max_update, env, args.jobs, log)


def evaluate_all(runs: Dict[tuple, dict], data, L: int, out: Path, threads: int,
                 splits=SPLITS, jobs: int = 1) -> List[dict]:
    """One row per ``(setting, seed, split)``: fairseq-eval-lm's perplexity and token count in
    non-overlapping blocks of ``L``."""
    return [dict(row, split=split) for split in splits
            for row in score_runs(runs, data, L, out / "eval" / split, split,
                                  f"Window training, {split} split", threads, jobs)]


def summarise(rows: List[dict], split: str, setting: str, dense: str) -> dict:
    """Median and spread over seeds of ``setting`` on ``split``; against ``dense``: the
    difference of medians, the paired per-seed differences, and whether it is within the seed
    noise (see the module)."""
    def by_seed(name):
        return {r["seed"]: r["perplexity"] for r in rows
                if r["split"] == split and r["setting"] == name}

    return {"setting": setting, "split": split,
            **seed_summary(by_seed(setting), by_seed(dense))}


def quality_report(rows: List[dict], cutoffs) -> (str, List[dict]):
    dense = label(None)
    names = list(settings(cutoffs))
    splits = sorted({r["split"] for r in rows}, key=lambda s: (s != "valid", s))
    summaries = [summarise(rows, split, name, dense) for split in splits for name in names]
    body = []
    for s in summaries:
        is_dense = s["setting"] == dense
        body.append([
            s["split"], s["setting"], f"{s['median']:.2f}", f"{s['spread']:.2f}",
            ", ".join(f"{v:.2f}" for v in s["seeds"].values()),
            "—" if is_dense else f"{s['difference']:+.2f} ({s['relative']:+.2%})",
            "—" if is_dense else ", ".join(f"{d:+.2f}" for d in s["paired"].values()),
            "—" if is_dense else ("yes" if s["within_noise"] else "NO")
            + f" (noise {s['noise']:.2f})",
        ])
    tokens = {split: sorted({r["tokens"] for r in rows if r["split"] == split})
              for split in splits}
    text = "\n".join([
        "Perplexity at L (fairseq-eval-lm, non-overlapping blocks of L; every run scored "
        + "; ".join(f"the {split} split's {', '.join(f'{c:,}' for c in counts)} tokens"
                    for split, counts in tokens.items()) + "):", "",
        table(["split", "trained with", "median ppl", "spread (max-min)", "per seed",
               "median − dense", "paired (seed by seed)", "within seed noise"], body)])
    return text, summaries


# ---------------------------------------------------------------------------------------------
# speed


def speed_trainers(length: int, cutoff: float, dims: dict, work: Path):
    """``{"dense": (trainer, task), "T=8": ...}``: fairseq's Trainer of both models."""
    from benchmarks.trainer import build_trainer, write_dictionary

    data = write_dictionary(str(work / "speed-dict"), dims["vocab"] - 4)  # + 4 specials
    flags = ["--decoder-layers", str(dims["layers"]), "--decoder-embed-dim", str(dims["dim"]),
             "--decoder-ffn-embed-dim", str(dims["ffn"]),
             "--decoder-attention-heads", str(dims["heads"]),
             "--share-decoder-input-output-embed"]
    return {label(None): build_trainer(data, "alibi_transformer_lm", length, flags),
            label(cutoff): build_trainer(data, "alibi_transformer_lm", length, flags,
                                         extra=["--alibi-window-cutoff", f"{cutoff:g}"])}


def attention_call(heads: int, head_dim: int, cutoff: float):
    """``f(q, k, v)``: a causal ALiBi layer's attention as the model's ``auto`` runs it (the
    fold dense, the ``windowed`` backend with a cutoff from ``tuning.WINDOWED_MIN_LENGTH``
    keys)."""
    from fairseq_alibi.modules.attention import dispatch
    from fairseq_alibi.modules.bias import AlibiBias

    layer = AlibiBias(heads, variant="causal", window_cutoff=cutoff).layer(0)
    return lambda q, k, v: dispatch.attend("auto", q, k, v, layer, scale=head_dim ** -0.5)


def measure_speed(length: int, cutoff: float, dims: dict, rounds: int, work: Path, log) -> dict:
    """Seconds per ``train_step`` of a dense and a windowed model, interleaved, and the
    attention alone (forward and backward, per layer) of each, in the same rounds."""
    import torch

    from benchmarks.timing import Rounds, backward_call
    from benchmarks.trainer import random_batch

    trainers = speed_trainers(length, cutoff, dims, work)
    samples = {name: random_batch(task, 1, length, seed=0) for name, (_, task) in trainers.items()}
    head_dim = dims["dim"] // dims["heads"]
    attention = {label(None): attention_call(dims["heads"], head_dim, 0.0),
                 label(cutoff): attention_call(dims["heads"], head_dim, cutoff)}
    leaves = [torch.randn(1, dims["heads"], length, head_dim, requires_grad=True)
              for _ in range(3)]
    grad = torch.randn(1, dims["heads"], length, head_dim)
    dense, windowed = label(None), label(cutoff)
    cases = {f"step {name}": (lambda name=name: trainers[name][0].train_step([samples[name]]))
             for name in trainers}
    for name in (dense, windowed):
        cases[f"attention {name}"] = backward_call(attention[name], leaves, grad)
    log(f"timing the training step at L={length}: {rounds} interleaved round(s) ...")
    timed = Rounds(cases, rounds, warmup=1)
    found = {"length": length, "cutoff": cutoff, "dims": dims, "rounds": rounds,
             "seconds": {name: timed.median(name) for name in cases},
             "speedup": timed.ratio(f"step {dense}", f"step {windowed}"),
             "attention_speedup": timed.ratio(f"attention {dense}", f"attention {windowed}")}
    for name in (dense, windowed):
        step, attn = found["seconds"][f"step {name}"], found["seconds"][f"attention {name}"]
        found[f"share {name}"] = dims["layers"] * attn / step
    # Amdahl: the dense step with its attention at no cost
    found["bound"] = 1.0 / max(1e-9, 1.0 - found[f"share {dense}"])
    return found


def speed_report(speed: dict) -> str:
    dense, windowed = label(None), label(speed["cutoff"])
    d = speed["dims"]
    rows = [[name, f"{speed['seconds'][f'step {name}']:.2f}",
             f"{speed['seconds'][f'attention {name}']:.3f}", f"{speed[f'share {name}']:.0%}"]
            for name in (dense, windowed)]
    met = speed["speedup"] >= SPEED_GOAL
    return "\n".join([
        f"One training step (fairseq's Trainer.train_step: forward, backward, Adam) at "
        f"L = {speed['length']}, batch of one sequence, {d['layers']} layers, embed {d['dim']}, "
        f"{d['heads']} heads of {d['dim'] // d['heads']}, FFN {d['ffn']}, vocabulary "
        f"{d['vocab']}, float32 on the CPU; median of {speed['rounds']} interleaved round(s) "
        "(absolute seconds are those of a shared machine: read the ratios):", "",
        table(["trained with", "s per step", "attention fwd+bwd s per layer",
               "attention share of the step"], rows), "",
        f"Step speed-up with {windowed}: **{speed['speedup']:.2f}×** (goal ≥ {SPEED_GOAL}×: "
        f"{'met' if met else 'NOT met'}); the attention alone {speed['attention_speedup']:.2f}× "
        f"faster. The dense attention timed alone is {speed[f'share {dense}']:.0%} of the dense "
        f"step: by that share, a step whose attention cost nothing would be "
        f"{speed['bound']:.2f}× faster (Amdahl: 1 / (1 − share)). "
        + ("The measured speed-up exceeds that: inside the step the dense attention costs more "
           "than alone (plausibly the memory traffic of its (H, L, L) intermediates; not "
           "measured), so the share is a lower estimate."
           if speed["speedup"] > speed["bound"] else ""),
    ])


# ---------------------------------------------------------------------------------------------


def main(argv=None):
    args = parse_args(argv)
    out, env, log = start_run(args.out, "window-training", args.threads)
    started = time.time()
    command = command_line("experiments.window_training", argv)
    machine_line = machine()
    record = {"command": command, "machine": machine_line, "L": args.L, "seeds": args.seeds,
              "cutoffs": args.cutoffs, "max_update": args.max_update}
    sections = []
    if not args.skip_quality:
        size = dict(SMOKE if args.smoke else SIZES["tiny"])
        data = data_folder(out, None, size["vocab"], env, 1, log)
        runs = train_all(args, data, out, env, log)
        rows = evaluate_all(runs, data, args.L, out, args.threads, args.splits, args.jobs)
        text, summaries = quality_report(rows, args.cutoffs)
        sections += ["## Quality: perplexity at L over seeds", "",
                     f"The quickstart LM ({size['layers']} layers, dim {size['dim']}, "
                     f"{size['heads']} heads, {args.max_update} updates of "
                     f"{size['max_tokens']} tokens at L = {args.L}), seeds "
                     f"{', '.join(map(str, args.seeds))}; a model trained with a cutoff is "
                     "evaluated with it.", "", text, ""]
        record.update(rows=rows, summaries=summaries,
                      training={f"{k[0]} seed {k[1]}": v for k, v in runs.items()})
    if not args.skip_speed:
        import torch

        torch.set_num_threads(args.threads)
        cutoff = 8.0 if 8.0 in args.cutoffs else args.cutoffs[-1]  # the recommended T
        speed = measure_speed(args.speed_length, cutoff,
                              SMOKE_SPEED_DIMS if args.smoke else SPEED_DIMS,
                              args.rounds, out, log)
        sections += ["## Speed: the training step", "", speed_report(speed), ""]
        record["speed"] = speed
    total = time.time() - started
    report = "\n".join([
        "# Training with a slope-window cutoff", "",
        f"Command: `{command}`  ", f"Machine: {machine_line}  ",
        f"Date: {today()}; total wall time {total:.0f} s", ""] + sections)
    record["total_s"] = round(total, 1)
    return publish(out, "window_training.md", report, record, log, total)


if __name__ == "__main__":
    sys.exit(main())
