"""Learned ALiBi slope scales against fixed slopes: the causal LM and the masked-LM encoder.

    python -m experiments.learned_scales [--out DIR] [--L 64] [--max-update 400]
                                         [--encoder-max-update 250] [--data DIR] [--smoke]

The quickstart's setting (its embedded corpus, its ``tiny`` model, its training command:
:func:`fairseq_alibi.cli.quickstart.train_command`), with the same seed and budget for every
run, which differ only in ``--alibi-learned-scales``. ``--data`` replaces the corpus: a folder
written by ``fairseq-preprocess``, or WikiText-2 as it comes (``../shared/data/wikitext-2``:
``wiki.valid.tokens`` is the training text and ``wiki.test.tokens`` the held-out text, as in
:mod:`experiments.wikitext2_extrapolation`; sentencepiece-encoded and binarized once in
``--out``). The encoders are validated on the ``valid`` split, or on ``test`` where the corpus
has no ``valid`` (WikiText-2 here).

* causal LM (``alibi_transformer_lm``): ``none`` (fixed Press slopes), ``per_head``,
  ``per_layer_head``, trained at ``L`` and evaluated at ``L, 2L, 4L, 8L`` in both modes of
  :mod:`fairseq_alibi.cli.sweep` (non-overlapping blocks and a sliding window);
* masked-LM encoder (``alibi_roberta``, ``offset`` and ``one_sided``): the same three scale
  modes, validation masked-LM perplexity with ``fairseq-validate`` at ``L`` and ``4L``.

Then the learned scales' final values, per layer and head, are read from the checkpoints and
plotted. Outputs in ``--out``: ``learned_scales.md`` (tables), ``learned_scales.png``,
``scales.json``, ``extrapolation/``, ``logs/``. ``--smoke`` runs every step at toy size, with
fewer evaluations (the LMs and the encoders at ``L`` only, non-overlapping blocks).
"""

import argparse
import json
import re
import sys
import time
from pathlib import Path

from benchmarks.tables import machine, table, today
from experiments.lm_runs import (
    WIKITEXT_FILES,
    data_folder,
    publish,
    run_all,
    start_run,
    train,
    wikitext_files,
    write_json,
)
from fairseq_alibi.cli import fairseq_runs
from fairseq_alibi.cli.fairseq_runs import console_script
from fairseq_alibi.cli.quickstart import SIZES, SMOKE
from fairseq_alibi.cli.sweep import SweepModel, run_sweep
from fairseq_alibi.paths import user_dir

#: the runs compared: label -> --alibi-learned-scales
SCALE_RUNS = {"fixed": "none", "per_head": "per_head", "per_layer_head": "per_layer_head"}
ENCODER_VARIANTS = ("offset", "one_sided")
SMOKE_SIZE = dict(SMOKE, heads=4)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="learned-scales")
    parser.add_argument("--L", type=int, default=None, help="training length (default 64)")
    parser.add_argument("--max-update", type=int, default=None,
                        help="updates of each LM run (default 400; 6 with --smoke)")
    parser.add_argument("--encoder-max-update", type=int, default=None,
                        help="updates of each encoder run (default 250; 6 with --smoke)")
    parser.add_argument("--data", default=None,
                        help="a binarized corpus, or a WikiText-2 folder, instead of the "
                        "embedded one")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2, help="fairseq processes at once")
    parser.add_argument("--smoke", action="store_true", help="toy sizes, every step")
    args = parser.parse_args(argv)
    args.L = args.L or (16 if args.smoke else 64)
    args.max_update = args.max_update or (6 if args.smoke else 400)
    args.encoder_max_update = args.encoder_max_update or (6 if args.smoke else 250)
    return args


def experiment_data(out: Path, data, vocab: int, env: dict, seed: int, log) -> Path:
    """The binarized corpus: :func:`experiments.lm_runs.data_folder`'s, or, for a WikiText-2
    folder (no ``dict.txt``, its two token files), that text encoded and binarized once in
    ``out/data-wikitext2``."""
    source = Path(data).resolve() if data else None
    if source is None or (source / "dict.txt").is_file() or not any(
            (source / name).is_file() for name in WIKITEXT_FILES.values()):
        return data_folder(out, data, vocab, env, seed, log)
    from fairseq_alibi.cli.quickstart import prepare_text_data

    files = wikitext_files(source)
    work = out / "data-wikitext2"
    folder, marker = work / "bin", work / "source.json"
    wanted = {"source": str(source), "vocab": vocab, "seed": seed}
    if (folder / "test.bin").is_file() and marker.is_file() and json.loads(
            marker.read_text()) == wanted:
        log(f"reusing the binarized WikiText-2 in {folder}")
        return folder
    log(f"sentencepiece ({vocab} pieces) on {files['train'].name}, then fairseq-preprocess ...")
    folder = prepare_text_data(files, work, vocab, env, seed)
    marker.write_text(json.dumps(wanted))
    return folder


def held_out_split(data: Path) -> str:
    """The split the encoders are validated on: ``valid``, else ``test``."""
    return "valid" if (Path(data) / "valid.idx").is_file() else "test"


def encoder_command(data, save_dir, size, L, max_update, seed, variant, learned):
    """``fairseq-train`` of the masked-LM encoder, the quickstart's optimizer and sizes."""
    return [
        console_script("fairseq-train"), str(data), "--user-dir", user_dir(),
        "--task", "masked_lm", "--criterion", "masked_lm", "--arch", "alibi_roberta_base",
        "--alibi-variant", variant, "--alibi-learned-scales", learned,
        "--encoder-layers", str(size["layers"]), "--encoder-embed-dim", str(size["dim"]),
        "--encoder-ffn-embed-dim", str(size["ffn"]),
        "--encoder-attention-heads", str(size["heads"]), "--dropout", "0.1",
        "--tokens-per-sample", str(L), "--sample-break-mode", "none",
        "--max-tokens", str(size["max_tokens"]), "--max-update", str(max_update),
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--weight-decay", "0.01",
        "--clip-norm", "1.0", "--lr", str(size["lr"]), "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", str(size["warmup"]), "--warmup-init-lr", "1e-07",
        "--seed", str(seed), "--save-dir", str(save_dir), "--no-epoch-checkpoints",
        "--save-interval", "1000000", "--disable-validation", "--num-workers", "0",
        "--log-format", "simple", "--log-interval", str(max(1, max_update // 10)), "--cpu",
    ]


def train_encoder(name, data, out, size, L, max_update, seed, env, variant, learned):
    save_dir = out / "checkpoints" / name
    if save_dir.exists():  # fairseq-train would resume a previous run
        for f in save_dir.iterdir():
            f.unlink()
    cmd = encoder_command(data, save_dir, size, L, max_update, seed, variant, learned)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    log = out / "logs" / f"train_{name}.log"
    started = time.time()
    proc = fairseq_runs.run(cmd, env)
    log.write_text("$ " + " ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    checkpoint = save_dir / "checkpoint_last.pt"
    if proc.returncode != 0 or not checkpoint.is_file():
        raise RuntimeError(f"fairseq-train failed for {name}; full output in {log}:\n"
                           + (proc.stdout + proc.stderr)[-3000:])
    return {"checkpoint": checkpoint, "seconds": round(time.time() - started, 1),
            "command": " ".join(cmd)}


_VALID = re.compile(r"valid on '\w+' subset \| loss ([\d.]+) \| .*?ppl ([\d.]+)")


def validate_encoder(name, checkpoint, data, out, length, seed, env, subset="valid") -> float:
    """Masked-LM perplexity on ``subset`` at ``length`` tokens per sample (the same masks for
    every model: fairseq-validate's masking is seeded)."""
    cmd = [console_script("fairseq-validate"), str(data), "--user-dir", user_dir(),
           "--path", str(checkpoint), "--task", "masked_lm", "--valid-subset", subset,
           "--tokens-per-sample", str(length), "--sample-break-mode", "none",
           "--max-tokens", str(max(4096, 2 * length)), "--seed", str(seed), "--cpu",
           "--num-workers", "0"]
    proc = fairseq_runs.run(cmd, env)
    text = proc.stdout + proc.stderr
    (out / "logs" / f"validate_{name}_{length}.log").write_text("$ " + " ".join(cmd) + "\n" + text)
    found = _VALID.search(text)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"fairseq-validate failed for {name} at {length}:\n{text[-3000:]}")
    return float(found.group(2))


def final_scales(checkpoint) -> dict:
    """``{"scales": [[...]], "slopes": [...]}`` of the learned slope scales in a checkpoint."""
    import torch
    from fairseq.checkpoint_utils import load_checkpoint_to_cpu

    state = load_checkpoint_to_cpu(str(checkpoint))["model"]
    key = next(k for k in state if k.endswith("alibi.scales"))
    slopes = state[key[: -len("scales")] + "slopes"]
    return {"key": key, "scales": state[key].float().tolist(),
            "slopes": slopes.to(torch.float64).tolist()}


def plot_scales(scales: dict, path: Path):
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(scales))
    rows_of_plots = -(-len(scales) // cols)
    fig, axes = plt.subplots(rows_of_plots, cols, figsize=(3.6 * cols, 3.0 * rows_of_plots),
                             squeeze=False, sharey=True)
    for ax, (name, found) in zip(axes.flat, scales.items()):
        rows = found["scales"]
        heads = len(found["slopes"])
        for layer, row in enumerate(rows):
            values = row if len(row) == heads else row * heads
            label = f"layer {layer}" if len(rows) > 1 else "all layers"
            ax.plot(range(heads), values, marker="o", label=label)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_title(name, fontsize=8)
        ax.set_xlabel("head (steepest slope first)")
        ax.set_xticks(range(heads))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    for row in axes:
        row[0].set_ylabel("learned scale s (slope = s·m)")
    fig.suptitle("Learned ALiBi slope scales after training (1.0 = Press slopes)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# long: the experiment's steps in order (data, training, evaluation, report), read top to bottom
def main(argv=None):
    import os

    args = parse_args(argv)
    started = time.time()
    out, env, log = start_run(args.out, "learned-scales")
    size = dict(SMOKE_SIZE if args.smoke else SIZES["tiny"])
    data = experiment_data(out, args.data, size["vocab"], env, args.seed, log)
    held_out = held_out_split(data)
    L = args.L

    log(f"training {len(SCALE_RUNS)} LMs and {len(SCALE_RUNS) * len(ENCODER_VARIANTS)} "
        f"encoders at L={L} ({size['layers']} layers, dim {size['dim']}, {size['heads']} heads, "
        f"{args.max_update} / {args.encoder_max_update} updates, {args.jobs} at once) ...")
    jobs = {}
    for label, learned in SCALE_RUNS.items():
        jobs[f"lm_{label}"] = (lambda learned=learned, label=label: train(
            f"lm_{label}", "alibi_transformer_lm", data, out, size, L, args.max_update,
            args.seed, env, extra=["--alibi-learned-scales", learned]))
        for variant in ENCODER_VARIANTS:
            name = f"encoder_{variant}_{label}"
            jobs[name] = (lambda name=name, variant=variant, learned=learned: train_encoder(
                name, data, out, size, L, args.encoder_max_update, args.seed, env, variant,
                learned))
    runs = run_all(jobs, args.jobs)

    log("evaluating the LMs at L..8L (fairseq-eval-lm, both modes) ...")
    lengths = [L] if args.smoke else [L, 2 * L, 4 * L, 8 * L]
    modes = ["nonoverlapping"] if args.smoke else ["nonoverlapping", "sliding"]
    sweep = run_sweep({label: SweepModel(str(runs[f"lm_{label}"]["checkpoint"]))
                       for label in SCALE_RUNS}, str(data), lengths, out / "extrapolation",
                      modes=modes, extra_eval_args=["--cpu"], train_length=L, jobs=args.jobs,
                      threads=1,
                      progress=False, title=f"Causal LM, fixed vs learned slope scales (L={L})")
    sweep.check()

    encoder_lengths = [L] if args.smoke else [L, 4 * L]
    log(f"validating the encoders at {encoder_lengths} tokens (fairseq-validate) ...")
    validations = run_all({
        (variant, label, n): (lambda variant=variant, label=label, n=n: validate_encoder(
            f"encoder_{variant}_{label}", runs[f"encoder_{variant}_{label}"]["checkpoint"],
            data, out, n, args.seed, env, held_out))
        for variant in ENCODER_VARIANTS for label in SCALE_RUNS for n in encoder_lengths
    }, args.jobs)

    scales = {}
    for label in SCALE_RUNS:
        if SCALE_RUNS[label] == "none":
            continue
        scales[f"LM {label}"] = final_scales(runs[f"lm_{label}"]["checkpoint"])
        for variant in ENCODER_VARIANTS:
            scales[f"encoder {variant} {label}"] = final_scales(
                runs[f"encoder_{variant}_{label}"]["checkpoint"])
    plot_scales(scales, out / "learned_scales.png")
    write_json(out / "scales.json", scales)
    total = time.time() - started

    lm_rows = []
    for mode in sweep.modes:
        for label in SCALE_RUNS:
            lm_rows.append([label, mode] + [f"{sweep.perplexity(label, mode, n):.2f}"
                                            for n in lengths])
    enc_rows = [[variant, label] + [f"{validations[(variant, label, n)]:.2f}"
                                    for n in encoder_lengths]
                for variant in ENCODER_VARIANTS for label in SCALE_RUNS]
    scale_rows = []
    for name, found in scales.items():
        flat = [v for row in found["scales"] for v in row]
        scale_rows.append([name, f"{min(flat):.3f}", f"{max(flat):.3f}",
                           " / ".join(" ".join(f"{v:.2f}" for v in row)
                                      for row in found["scales"])])
    command = "python -m experiments.learned_scales " + " ".join(
        argv if argv is not None else sys.argv[1:])
    report = "\n".join([
        f"### Learned slope scales vs fixed slopes (L={L})",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine()}; {os.cpu_count()} cores shared with other jobs  ",
        f"Date: {today()}; total wall time {total:.0f} s",
        "",
        f"Causal LM ({size['layers']} layers, dim {size['dim']}, {size['heads']} heads, "
        f"{args.max_update} updates of {size['max_tokens']} tokens, seed {args.seed}): test "
        "perplexity",
        "",
        table(["scales", "mode"] + [f"N={n}" for n in lengths], lm_rows),
        "",
        f"Masked-LM encoder (same sizes, {args.encoder_max_update} updates): masked-LM "
        f"perplexity on the `{held_out}` split",
        "",
        table(["variant", "scales"] + [f"N={n}" for n in encoder_lengths], enc_rows),
        "",
        "Learned scales at the end (rows: layers, separated by /)",
        "",
        table(["run", "min", "max", "scales"], scale_rows),
        "",
    ])
    return publish(out, "learned_scales.md", report, {
        "command": command, "L": L, "total_s": round(total, 1), "machine": machine(),
        "runs": {k: {"seconds": v["seconds"], "command": v["command"]} for k, v in runs.items()},
    }, log, total)


if __name__ == "__main__":
    sys.exit(main())
