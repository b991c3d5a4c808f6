"""Train short, test long as a recipe: time-to-perplexity at the target length, and slopes.

    python -m experiments.train_short_recipe [--out DIR] [--target 256] [--fraction 0.25]
                                            [--max-update 400] [--data DIR] [--smoke]

Both runs are ``config/lm/train_short.yaml`` through ``fairseq-hydra-train``, with the same
tokens per update, optimizer and number of updates; they differ only in the training length:
``fraction × target`` (the recipe) and ``target`` (the baseline). They run side by side, one
thread each, so a load from other processes hits both alike. Every saved checkpoint (one per
100 updates) is evaluated at the *target* length with ``fairseq-eval-lm`` (non-overlapping
blocks), and put against fairseq's own training clock (``wall``, since training began) at
that update: the perplexity a training budget buys.

Then the extrapolation sweep (:mod:`fairseq_alibi.sweep`) evaluates both final models from the
short length to 4× the target, each as trained and with slope interpolation: slopes scaled by
``L_train / N`` at evaluation length ``N > L_train`` (a load-time override,
``--model-overrides "{'alibi_slope_scale': L_train/N}"``), so its effect is measured.

Outputs in ``--out``: ``train_short.md`` (tables), ``time_to_perplexity.png``,
``time_to_perplexity.csv``, ``extrapolation/extrapolation.{csv,md,png}``, ``run.json``,
``logs/``. ``--smoke`` runs every step at toy size on a corpus given with ``--data``.
"""

import argparse
import csv
import os
import re
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
    wall_at_updates,
)
from fairseq_alibi.cli.fairseq_runs import console_script
from fairseq_alibi.cli.sweep import SweepModel, run_sweep, slope_interpolation

CONFIG_DIR = REPO / "config" / "lm"
CONFIG_NAME = "train_short"
SMOKE_OVERRIDES = ["model.decoder_layers=1", "model.decoder_embed_dim=32",
                   "model.decoder_input_dim=32", "model.decoder_output_dim=32",
                   "model.decoder_ffn_embed_dim=64", "dataset.max_tokens=256",
                   "lr_scheduler.warmup_updates=2"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="train-short-recipe")
    parser.add_argument("--target", type=int, default=None,
                        help="the length the model is for (default 256; 32 with --smoke)")
    parser.add_argument("--fraction", type=float, default=0.25,
                        help="training length of the recipe, as a fraction of --target")
    parser.add_argument("--max-update", type=int, default=None, help="default 400 (4 with --smoke)")
    parser.add_argument("--save-every", type=int, default=None,
                        help="updates between checkpoints (default 100; 2 with --smoke)")
    parser.add_argument("--data", default=None, help="a binarized corpus instead of the embedded one")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2, help="fairseq processes at once")
    parser.add_argument("--modes", default="nonoverlapping",
                        help="evaluation modes of the extrapolation sweep (nonoverlapping,sliding)")
    parser.add_argument("--smoke", action="store_true", help="toy sizes, every step")
    args = parser.parse_args(argv)
    args.target = args.target or (32 if args.smoke else 256)
    args.max_update = args.max_update or (4 if args.smoke else 400)
    args.save_every = args.save_every or (2 if args.smoke else 100)
    args.short = int(round(args.target * args.fraction))
    if not 2 <= args.short < args.target:
        parser.error(f"--fraction {args.fraction} of --target {args.target} gives a training "
                     f"length of {args.short}; it must lie between 2 and the target")
    return args


def hydra_train(name: str, length: int, data: Path, out: Path, args, env: dict) -> dict:
    """``fairseq-hydra-train`` of the recipe config at ``length``; checkpoints by update."""
    run_dir = out / "runs" / name
    save_dir = run_dir / "checkpoints"
    if save_dir.exists():  # a previous run would be resumed
        for f in save_dir.iterdir():
            f.unlink()
    cmd = [console_script("fairseq-hydra-train"), "--config-dir", str(CONFIG_DIR),
           "--config-name", CONFIG_NAME, f"task.data={data}",
           f"task.tokens_per_sample={length}", f"optimization.max_update={args.max_update}",
           f"checkpoint.save_interval_updates={args.save_every}",
           f"checkpoint.save_dir={save_dir}", f"common.seed={args.seed}",
           f"common.log_interval={max(1, args.save_every // 4)}",
           "dataset.disable_validation=true", f"hydra.run.dir={run_dir}"]
    if args.smoke:
        cmd += SMOKE_OVERRIDES
    (out / "logs").mkdir(parents=True, exist_ok=True)
    log = out / "logs" / f"train_{name}.log"
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(out))
    log.write_text("$ " + " ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"fairseq-hydra-train failed for {name}; full output in {log}:\n"
                           + (proc.stdout + proc.stderr)[-3000:])
    checkpoints = {}
    for path in save_dir.glob("checkpoint_*_*.pt"):
        match = re.fullmatch(r"checkpoint_\d+_(\d+)\.pt", path.name)
        if match:
            checkpoints[int(match.group(1))] = path
    checkpoints.setdefault(args.max_update, save_dir / "checkpoint_last.pt")
    return {"checkpoints": dict(sorted(checkpoints.items())), "log": log,
            "wall": wall_at_updates(log), "command": " ".join(cmd)}


def seconds_per_update(wall: dict) -> float:
    """The training rate between the first and the last logged update (startup left out)."""
    first, last = min(wall), max(wall)
    return (wall[last] - wall[first]) / (last - first) if last > first else 0.0


def plot_time_to_perplexity(curves: dict, target: int, path: Path):
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.6, 4.2))
    for (label, points), marker in zip(curves.items(), "os^D"):
        xs = [p["seconds"] for p in points]
        ys = [p["perplexity"] for p in points]
        ax.plot(xs, ys, marker=marker, label=label)
        for p in points[-1:]:
            ax.annotate(f"{p['updates']} updates", (p["seconds"], p["perplexity"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("training time: fairseq's wall clock (s, shared CPU)")
    ax.set_ylabel(f"perplexity at {target} tokens")
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title(f"Time to perplexity at the target length {target}", fontsize=10)
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)


# long: the experiment's steps in order (data, training, evaluation, report), read top to bottom
def main(argv=None):
    args = parse_args(argv)
    started = time.time()
    out, env, log = start_run(args.out, "train-short")
    vocab = SMOKE_SIZE["vocab"] if args.smoke else DEMO_SIZE["vocab"]
    data = data_folder(out, args.data, vocab, env, args.seed, log)
    short, target = args.short, args.target
    names = {"short": f"trained at L={short} ({args.fraction:g}x)",
             "full": f"trained at L={target} (1x)"}
    lengths = {"short": short, "full": target}

    log(f"training at L={short} and at L={target}, {args.max_update} updates each, side by side "
        f"(config/lm/{CONFIG_NAME}.yaml) ...")
    runs = run_all({key: (lambda key=key: hydra_train(key, lengths[key], data, out, args, env))
                    for key in names}, args.jobs)

    log(f"evaluating every checkpoint at the target length {target} ...")
    to_eval = {f"{key}@{u}": SweepModel(str(path))
               for key, run in runs.items() for u, path in run["checkpoints"].items()}
    checkpoint_sweep = run_sweep(to_eval, str(data), [target], out / "checkpoints_at_target",
                                 modes=["nonoverlapping"], extra_eval_args=["--cpu"],
                                 jobs=args.jobs, threads=1, progress=False)
    checkpoint_sweep.check()
    curves = {}
    for key, run in runs.items():
        points = []
        for updates in run["checkpoints"]:
            seconds = run["wall"].get(updates)
            if seconds is None:  # the last logged update at or before this one
                logged = [u for u in run["wall"] if u <= updates]
                seconds = run["wall"][max(logged)] if logged else float("nan")
            points.append({"updates": updates, "seconds": seconds, "perplexity":
                           checkpoint_sweep.perplexity(f"{key}@{updates}", "nonoverlapping",
                                                       target)})
        curves[names[key]] = points
    plot_time_to_perplexity(curves, target, out / "time_to_perplexity.png")
    with open(out / "time_to_perplexity.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "updates", "wall_s", f"ppl_at_{target}"])
        for label, points in curves.items():
            for p in points:
                writer.writerow([label, p["updates"], p["seconds"], f"{p['perplexity']:.3f}"])

    log("extrapolation sweep with and without slope interpolation ...")
    sweep_models = {}
    for key in names:
        final = str(runs[key]["checkpoints"][args.max_update])
        L = lengths[key]
        sweep_models[names[key]] = SweepModel(final)
        sweep_models[names[key] + f", slopes x {L}/N"] = SweepModel(
            final, overrides=slope_interpolation(L))
    sweep_lengths = sorted({short, target, 2 * target, 4 * target})
    extrapolation = run_sweep(sweep_models, str(data), sweep_lengths, out / "extrapolation",
                              modes=args.modes.split(","), extra_eval_args=["--cpu"],
                              train_length=short, jobs=args.jobs, threads=1, progress=False,
                              title="Train short, test long, with and without slope interpolation")
    extrapolation.check()
    total = time.time() - started

    short_pts, full_pts = curves[names["short"]], curves[names["full"]]
    rows = []
    for s, f in zip(short_pts, full_pts):
        rows.append([s["updates"], f"{s['seconds']:.0f}", f"{s['perplexity']:.2f}",
                     f"{f['seconds']:.0f}", f"{f['perplexity']:.2f}"])
    per_update = [seconds_per_update(runs[key]["wall"]) for key in ("short", "full")]
    ratio = (f"{per_update[1] / per_update[0]:.2f}x" if per_update[0] > 0 else "n/a")
    goal = full_pts[-1]["perplexity"]
    reached = next((p for p in short_pts if p["perplexity"] <= goal), None)
    summary = [
        f"Seconds per update: {per_update[0]:.3f} at L={short}, {per_update[1]:.3f} at "
        f"L={target} (training at L={target} takes {ratio} as long per update; same tokens "
        f"per update).",
        (f"The L={target} run's final perplexity at {target} ({goal:.2f}, after "
         f"{full_pts[-1]['seconds']:.0f} s) is reached by the L={short} run after "
         f"{reached['seconds']:.0f} s ({reached['updates']} updates)." if reached else
         f"The L={short} run does not reach the L={target} run's final perplexity at {target} "
         f"({goal:.2f}) within {args.max_update} updates: its best is "
         f"{min(p['perplexity'] for p in short_pts):.2f}."),
    ]
    command = "python -m experiments.train_short_recipe " + " ".join(
        argv if argv is not None else sys.argv[1:])
    tokens = checkpoint_sweep.points[0].tokens
    report = "\n".join([
        f"### Train at L={short}, use at {target}: time to perplexity",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}; shared with other jobs, so timings are indicative  ",
        f"Date: {today()}",
        "",
        table(["updates", f"L={short}: train s", f"L={short}: ppl at {target}",
               f"L={target}: train s", f"L={target}: ppl at {target}"], rows),
        "",
        *summary,
        "",
        f"Perplexity per token on the {tokens:,} test tokens, non-overlapping blocks of {target}; "
        "training time is fairseq's wall clock since training began (the two runs side by "
        "side, one thread each). Figure: time_to_perplexity.png.",
        "",
        extrapolation.markdown(),
        f"Total wall time {total:.0f} s.",
        "",
    ])
    return publish(out, "train_short.md", report, {
        "command": command, "short": short, "target": target, "max_update": args.max_update,
        "data": str(data), "curves": curves, "summary": summary, "machine": machine(),
        "total_s": round(total, 1),
    }, log, total)


if __name__ == "__main__":
    sys.exit(main())
