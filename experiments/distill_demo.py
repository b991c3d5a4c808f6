"""Convert a stock language model to ALiBi, then recover it: distillation vs plain fine-tuning.

    python -m experiments.distill_demo [--out DIR] [--L 64] [--teacher-updates 400]
                                      [--updates 100] [--recovery-lr LR] [--alpha 0.5]
                                      [--temperature 2]
                                      [--data DIR] [--smoke]

1. A stock ``transformer_lm`` (sinusoidal positions) is trained briefly at length ``L`` on the
   offline corpus (Python's own documentation, :mod:`fairseq_alibi.corpus`): the teacher.
2. ``python -m fairseq_alibi.convert`` turns it into an ``alibi_transformer_lm`` checkpoint.
3. From the converted checkpoint, two runs of the same ``N`` updates, same settings, differ
   only in the criterion: ``cross_entropy`` (plain fine-tuning) and ``lm_distillation``
   (the frozen teacher's soft targets, ``α`` and ``T``). An ALiBi model trained from scratch
   for ``N`` updates is the reference for "conversion helped at all".
4. Every model is evaluated with ``fairseq-eval-lm`` at ``L`` and ``4L`` (non-overlapping
   blocks; the sinusoidal teacher with its positions raised at load time), through
   :mod:`fairseq_alibi.sweep`, which checks that every run scores every test token.

Outputs in ``--out``: ``distill.md`` (the table), ``extrapolation.{csv,md,png}``,
``run.json`` (settings, timings), ``logs/``. ``--smoke`` runs every step at toy size on any
binarized corpus given with ``--data`` (the tests do), and its numbers mean nothing.
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from benchmarks.tables import machine, table, today
from experiments.lm_runs import (
    DEMO_SIZE,
    SMOKE_SIZE,
    data_folder,
    publish,
    run_all,
    start_run,
    train,
)
from fairseq_alibi.cli.sweep import SweepModel, position_overrides, run_sweep

ROWS = {
    "teacher": "teacher: stock transformer_lm (sinusoidal)",
    "converted": "converted to ALiBi, no training",
    "cross_entropy": "converted + {N} updates of cross-entropy",
    "distilled": "converted + {N} updates of distillation",
    "scratch": "ALiBi from scratch, {N} updates",
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="distill-demo")
    parser.add_argument("--L", type=int, default=None, help="training length (default 64)")
    parser.add_argument("--teacher-updates", type=int, default=None, help="default 400")
    parser.add_argument("--updates", type=int, default=None,
                        help="N, the updates of each recovery run (default 100)")
    parser.add_argument("--recovery-lr", type=float, default=None,
                        help="peak learning rate of the recovery runs (default: the teacher's, "
                        "3e-3)")
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--temperature", type=float, default=2.0)
    parser.add_argument("--data", default=None, help="a binarized corpus instead of the embedded one")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2, help="fairseq processes at once")
    parser.add_argument("--threads", type=int, default=1, help="threads per process")
    parser.add_argument("--smoke", action="store_true", help="toy sizes, every step")
    args = parser.parse_args(argv)
    args.L = args.L or (16 if args.smoke else 64)
    args.teacher_updates = args.teacher_updates or (6 if args.smoke else 400)
    args.updates = args.updates or (4 if args.smoke else 100)
    return args


# long: the experiment's steps in order (data, training, evaluation, report), read top to bottom
def main(argv=None):
    args = parse_args(argv)
    started = time.time()
    out, env, log = start_run(args.out, "distill-demo", args.threads)
    size = dict(SMOKE_SIZE if args.smoke else DEMO_SIZE)
    L, N = args.L, args.updates
    timings = {}

    data = data_folder(out, args.data, size["vocab"], env, args.seed, log)
    timings["data_s"] = round(time.time() - started, 1)

    log(f"training the teacher (stock transformer_lm, sinusoidal) at L={L}, "
        f"{args.teacher_updates} updates ...")
    teacher = train("teacher", "transformer_lm", data, out, size, L, args.teacher_updates,
                    args.seed, env)
    timings["teacher_s"] = teacher["seconds"]

    log("converting it with python -m fairseq_alibi.convert ...")
    converted = out / "checkpoints" / "converted" / "alibi.pt"
    convert_cmd = [sys.executable, "-m", "fairseq_alibi.convert",
                   "--input", str(teacher["checkpoint"]), "--output", str(converted)]
    proc = subprocess.run(convert_cmd, capture_output=True, text=True, env=env)
    (out / "logs" / "convert.log").write_text(" ".join(convert_cmd) + "\n" + proc.stdout
                                              + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError("conversion failed:\n" + proc.stdout + proc.stderr)

    recover = ["--finetune-from-model", str(converted)]
    if args.recovery_lr:
        recover += ["--lr", str(args.recovery_lr)]
    distill = ["--criterion", "lm_distillation", "--teacher-path", str(teacher["checkpoint"]),
               "--distill-alpha", str(args.alpha), "--distill-temperature", str(args.temperature)]
    log(f"{N} updates each: cross-entropy fine-tuning, distillation (alpha={args.alpha}, "
        f"T={args.temperature}), and ALiBi from scratch ({args.jobs} at once) ...")
    runs = run_all({
        "cross_entropy": lambda: train("cross_entropy", "alibi_transformer_lm", data, out, size,
                                       L, N, args.seed, env, recover),
        "distilled": lambda: train("distilled", "alibi_transformer_lm", data, out, size, L, N,
                                   args.seed, env, recover + distill),
        "scratch": lambda: train("scratch", "alibi_transformer_lm", data, out, size, L, N,
                                 args.seed, env),
    }, args.jobs)
    timings.update({f"{name}_s": run["seconds"] for name, run in runs.items()})

    log(f"evaluating every model at L={L} and 4L={4 * L} with fairseq-eval-lm ...")
    names = {key: ROWS[key].format(N=N) for key in ROWS}
    models = {
        names["teacher"]: SweepModel(str(teacher["checkpoint"]), overrides=position_overrides),
        names["converted"]: SweepModel(str(converted)),
        names["cross_entropy"]: SweepModel(str(runs["cross_entropy"]["checkpoint"])),
        names["distilled"]: SweepModel(str(runs["distilled"]["checkpoint"])),
        names["scratch"]: SweepModel(str(runs["scratch"]["checkpoint"])),
    }
    t = time.time()
    result = run_sweep(models, str(data), [L, 4 * L], out, modes=["nonoverlapping"],
                       extra_eval_args=["--cpu"], train_length=L, jobs=args.jobs,
                       threads=args.threads, progress=False,
                       title=f"Converted to ALiBi, then recovered for {N} updates")
    result.check()
    timings["eval_s"] = round(time.time() - t, 1)
    timings["total_s"] = round(time.time() - started, 1)

    rows = []
    for key, name in names.items():
        at_l = result.perplexity(name, "nonoverlapping", L)
        at_4l = result.perplexity(name, "nonoverlapping", 4 * L)
        updates = {"teacher": args.teacher_updates, "converted": 0}.get(key, N)
        rows.append([name, updates, f"{at_l:.2f}", f"{at_4l:.2f}"])
    tokens = result.points[0].tokens
    vocabulary = (f"the {len((data / 'dict.txt').read_text().splitlines()):,} entries of "
                  f"--data's dict.txt" if args.data else f"{size['vocab']} sentencepiece pieces")
    command = "python -m experiments.distill_demo " + " ".join(
        argv if argv is not None else sys.argv[1:])
    report = "\n".join([
        f"### Convert to ALiBi, then distil vs fine-tune ({N} updates)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}; shared with other jobs, so timings are indicative  ",
        f"Date: {today()}",
        "",
        table(["model", "updates", f"ppl at L={L}", f"ppl at 4L={4 * L}"], rows),
        "",
        f"{size['layers']} layers, {size['dim']} dims, {size['heads']} heads, "
        f"{size['max_tokens']} tokens per update, {vocabulary}; "
        f"recovery peak lr {args.recovery_lr or size['lr']:g}; distillation alpha={args.alpha}, "
        f"T={args.temperature}. Perplexity per token on the "
        f"{tokens:,} test tokens, non-overlapping blocks of L and 4L. Wall time: teacher "
        f"{timings['teacher_s']:.0f} s, each recovery run ~"
        f"{max(timings['cross_entropy_s'], timings['distilled_s']):.0f} s, "
        f"{timings['total_s']:.0f} s in all.",
        "",
    ])
    return publish(out, "distill.md", report, {
        "command": command, "settings": dict(size, L=L, N=N, teacher_updates=args.teacher_updates,
                                             alpha=args.alpha, temperature=args.temperature,
                                             recovery_lr=args.recovery_lr or size["lr"],
                                             seed=args.seed, jobs=args.jobs,
                                             threads=args.threads),
        "data": str(data), "timings": timings, "machine": machine(),
        "perplexity": {r[0]: {"L": float(r[2]), "4L": float(r[3])} for r in rows},
    }, log, timings["total_s"])


if __name__ == "__main__":
    sys.exit(main())
