"""Train short, test long: ALiBi against a sinusoidal baseline, end to end, offline.

``fairseq-alibi quickstart`` (or ``examples/quickstart.sh``):

1. builds an English corpus from Python's own documentation (:mod:`fairseq_alibi.cli.corpus`),
   trains a sentencepiece BPE model on its train split and binarizes it with
   ``fairseq-preprocess`` (or, with ``--data DIR``, uses any binarized corpus instead);
2. trains an ``alibi_transformer_lm`` and a stock ``transformer_lm`` (sinusoidal positions) of
   the same size at a short training length ``L`` with ``fairseq-train``;
3. evaluates both with ``fairseq-eval-lm`` at ``L, 2L, 4L, 8L``, non-overlapping and with a
   sliding window (:mod:`fairseq_alibi.cli.sweep`), checking that every run scores every token;
4. prints the table and writes ``extrapolation.md``, ``extrapolation.csv`` and
   ``extrapolation.png`` (perplexity against evaluation length) to the output folder.

With ``--window-cutoff T [T ...]`` the ALiBi model is also evaluated with each slope-window
cutoff ``T`` (the load-time override ``--model-overrides "{'alibi_window_cutoff': T}"``): rows
``ALiBi T=8`` beside the dense ``ALiBi`` row, on the same tokens, and a table of their
fairseq-eval-lm tokens/s against the dense row's.

Everything runs through fairseq's own command lines, as subprocesses. The result is
deterministic for a fixed ``--seed`` on a given machine and thread count.
"""

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

from fairseq_alibi.cli.corpus import SPLITS, build_corpus
from fairseq_alibi.cli.sweep import (
    MODES,
    MODE_TITLES,
    SweepModel,
    SweepError,
    position_overrides,
    run_sweep,
)
from fairseq_alibi.cli.fairseq_runs import (
    console_script,
    cpu_seconds,
    machine,
    run_logged,
    thread_env,
)
from fairseq_alibi.paths import user_dir
from fairseq_alibi.preprocess.pipeline_io import progress_bar
from fairseq_alibi.preprocess.encoders import sentencepiece_dictionary, train_sentencepiece

#: model and training settings; ``tiny`` (the default) is sized for a few minutes on 2 CPU cores
SIZES = {
    "tiny": dict(layers=2, dim=128, heads=8, ffn=512, max_tokens=2048, lr=3e-3, warmup=100,
                 max_update=1000, vocab=2000),
    "small": dict(layers=4, dim=256, heads=8, ffn=1024, max_tokens=8192, lr=1e-3, warmup=500,
                  max_update=4000, vocab=4000),
}
#: ``--smoke``: the smallest setting that runs every step (for tests and a first try)
SMOKE = dict(layers=1, dim=32, heads=4, ffn=64, max_tokens=512, lr=1e-2, warmup=5,
             max_update=40, vocab=512)
SMOKE_L = 16
SMOKE_TEST_FRACTION = 0.01

#: the two rows of the table: name -> fairseq architecture
MODELS = {"ALiBi": "alibi_transformer_lm", "Sinusoidal": "transformer_lm"}
#: the row whose checkpoint the ``--window-cutoff`` rows evaluate, and their speed baseline
DENSE_ROW = "ALiBi"
#: fairseq-eval-lm's last line: tokens, seconds and tokens/s of the scoring (loading excluded)
_EVAL_SPEED = re.compile(r"Evaluated ([\d,]+) tokens in ([\d.]+)s \(([\d.]+) tokens/s\)")


def prepare_text_data(texts: Dict[str, Path], work_dir, vocab_size: int, env: dict,
                      seed: int = 1) -> Path:
    """Sentencepiece-encode text files (``{"train": path, "test": path, ...}``), binarize them.

    Returns the binarized folder (``work_dir/bin``). The sentencepiece model is trained on the
    train text only. Valid is optional (training runs without validation).
    """
    work = Path(work_dir)
    tok = work / "tokenized"
    tok.mkdir(parents=True, exist_ok=True)
    import sentencepiece as spm

    model = train_sentencepiece(  # deterministic: one thread, no sampling
        Path(texts["train"]), work / "spm", vocab_size, model_type="bpe", newline_piece=False,
        character_coverage=1.0, byte_fallback=True, input_sentence_size=0,
        shuffle_input_sentence=False, num_threads=1,
    )
    sp = spm.SentencePieceProcessor(model_file=model)
    present = [s for s in SPLITS if s in texts]
    for split in present:
        with open(texts[split], encoding="utf-8") as src, \
                open(tok / f"{split}.txt", "w", encoding="utf-8") as dst:
            for line in src:
                dst.write(" ".join(sp.encode(line.rstrip("\n"), out_type=str)) + "\n")
    # every piece, so no test piece becomes <unk> (no madeupword padding: the size is the model's)
    sentencepiece_dictionary(sp, pad_to_multiple=1).save(str(work / "dict.txt"))
    bin_dir = work / "bin"
    if bin_dir.exists():
        shutil.rmtree(bin_dir)  # ours: never mix splits of two runs
    cmd = [console_script("fairseq-preprocess"), "--only-source", "--srcdict",
           str(work / "dict.txt"), "--destdir", str(bin_dir), "--workers", "1"]
    for split in present:
        cmd += [f"--{'train' if split == 'train' else split}pref", str(tok / f"{split}.txt")]
    run_logged(cmd, work / "preprocess.log", env, "fairseq-preprocess")
    return bin_dir


def prepare_embedded_data(work_dir, vocab_size: int, env: dict, seed: int = 1,
                          test_fraction: float = 0.05) -> (Path, dict):
    """The embedded corpus, raw (``work_dir/raw``) and binarized; returns (bin, manifest)."""
    raw = Path(work_dir) / "raw"
    manifest = build_corpus(raw, test_fraction=test_fraction)
    texts = {split: raw / f"{split}.txt" for split in SPLITS}
    return prepare_text_data(texts, work_dir, vocab_size, env, seed), manifest


# ---------------------------------------------------------------------------------------------
# training


def train_command(arch: str, data, save_dir, size: dict, L: int, max_update: int, seed: int,
                  cpu: bool) -> List[str]:
    """The ``fairseq-train`` command line of one model (both models differ only in ``arch``)."""
    cmd = [
        console_script("fairseq-train"), str(data), "--user-dir", user_dir(),
        "--task", "language_modeling", "--arch", arch,
        # input/output dims too: transformer_lm's config defaults them to 512, not embed-dim
        "--decoder-layers", str(size["layers"]), "--decoder-embed-dim", str(size["dim"]),
        "--decoder-input-dim", str(size["dim"]), "--decoder-output-dim", str(size["dim"]),
        "--decoder-ffn-embed-dim", str(size["ffn"]),
        "--decoder-attention-heads", str(size["heads"]),
        "--share-decoder-input-output-embed", "--dropout", "0.1",
        "--tokens-per-sample", str(L), "--sample-break-mode", "none",
        "--max-tokens", str(size["max_tokens"]), "--max-update", str(max_update),
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--weight-decay", "0.01",
        "--clip-norm", "1.0", "--lr", str(size["lr"]), "--lr-scheduler", "inverse_sqrt",
        "--warmup-updates", str(size["warmup"]), "--warmup-init-lr", "1e-07",
        "--seed", str(seed), "--save-dir", str(save_dir),
        "--no-epoch-checkpoints", "--save-interval", "1000000", "--disable-validation",
        "--num-workers", "0", "--log-format", "simple",
        "--log-interval", str(max(1, max_update // 40)),
    ]
    return cmd + (["--cpu"] if cpu else [])


_UPDATES = re.compile(r"num_updates[= ](\d+)")
_LOSS = re.compile(r"\bloss[= ]([\d.]+)")


def train_models(models: Dict[str, str], data, out: Path, size: dict, L: int, max_update: int,
                 seed: int, cpu: bool, env: dict, jobs: int, progress: bool) -> Dict[str, Path]:
    """Train each ``name -> arch`` with ``fairseq-train`` (``jobs`` at once); checkpoints."""
    from concurrent.futures import ThreadPoolExecutor

    (out / "logs").mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()

    def train(position_and_name):
        position, name = position_and_name
        save_dir = out / "checkpoints" / name.lower()
        if save_dir.exists():
            shutil.rmtree(save_dir)  # fairseq-train would otherwise resume a previous run
        cmd = train_command(models[name], data, save_dir, size, L, max_update, seed, cpu)
        log = out / "logs" / f"train_{name.lower()}.log"
        with lock:
            bar = progress_bar(max_update, f"training {name:<10}", unit="update", enabled=progress,
                               position=position)
        with open(log, "w") as f:
            f.write("$ " + " ".join(cmd) + "\n")
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, env=env)
            done = 0
            for line in proc.stdout:
                f.write(line)
                updates = _UPDATES.findall(line)
                if updates and int(updates[-1]) > done:
                    loss = _LOSS.findall(line)
                    with lock:
                        bar.update(int(updates[-1]) - done)
                        if loss:
                            bar.set_postfix_str(f"loss {float(loss[-1]):.3f}")
                    done = int(updates[-1])
            proc.wait()
        with lock:
            bar.close()
        checkpoint = save_dir / "checkpoint_last.pt"
        if proc.returncode != 0 or not checkpoint.is_file():
            raise RuntimeError(f"fairseq-train failed for {name} (exit {proc.returncode}); "
                               f"full output in {log}:\n" + log.read_text()[-3000:])
        return name, checkpoint

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return dict(pool.map(train, enumerate(models)))


# ---------------------------------------------------------------------------------------------
# the report


def relative_change(result, model: str, mode: str, length: int, base: int) -> Optional[float]:
    a, b = result.perplexity(model, mode, length), result.perplexity(model, mode, base)
    return None if a is None or b is None else a / b - 1.0


def verdict(result, L: int) -> List[str]:
    """The paper's two claims, checked on the non-overlapping evaluation (if it was run)."""
    lines = []
    mode = "nonoverlapping" if "nonoverlapping" in result.modes else result.modes[0]
    alibi = relative_change(result, "ALiBi", mode, 4 * L, L)
    sinus = relative_change(result, "Sinusoidal", mode, 2 * L, L)
    if alibi is not None:
        ok = alibi <= 0.02
        lines.append(f"ALiBi: perplexity at 4L={4 * L} is {abs(alibi):.1%} "
                     f"{'lower' if alibi < 0 else 'higher'} than at L={L} "
                     f"({'extrapolates, as in the paper' if ok else 'does NOT extrapolate here'})")
    if sinus is not None:
        ok = sinus > 0.05
        lines.append(f"Sinusoidal: perplexity at 2L={2 * L} is {abs(sinus):.1%} "
                     f"{'lower' if sinus < 0 else 'higher'} than at L={L} "
                     f"({'degrades beyond L, as in the paper' if ok else 'does NOT degrade here'})")
    return lines


# ---------------------------------------------------------------------------------------------
# slope-window rows (--window-cutoff)


def window_row(cutoff: float) -> str:
    """The table row of the ALiBi model evaluated with window cutoff ``T``: ``ALiBi T=8``."""
    return f"{DENSE_ROW} T={cutoff:g}"


def window_models(checkpoint, cutoffs) -> Dict[str, SweepModel]:
    """``{row: SweepModel}``: the ALiBi checkpoint with the load-time override
    ``{'alibi_window_cutoff': T}`` at every length, one row per ``T``."""
    return {window_row(t): SweepModel(str(checkpoint),
                                      overrides=lambda length, t=t: {"alibi_window_cutoff": t})
            for t in cutoffs}


def eval_tokens_per_second(log) -> Optional[float]:
    """fairseq-eval-lm's own tokens/s (model loading excluded) in a run's log, or None."""
    found = _EVAL_SPEED.findall(Path(log).read_text())
    return float(found[-1][2]) if found else None


def window_speed_table(result, cutoffs) -> str:
    """Markdown: per mode and length, the dense ALiBi row's fairseq-eval-lm tokens/s and each
    cutoff row's, with its ratio ``tokens/s(T) / tokens/s(dense)``."""
    lines = []
    for mode in result.modes:
        heads = [f"{n} (L)" if n == result.train_length else str(n) for n in result.lengths]
        title = f"{MODE_TITLES.get(mode, mode)}: fairseq-eval-lm tokens/s (× the dense ALiBi row)"
        lines += [f"### {title}", "",
                  "| model | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
        dense = {n: eval_tokens_per_second(result._point(DENSE_ROW, mode, n).log)
                 for n in result.lengths}
        for row in [DENSE_ROW] + [window_row(t) for t in cutoffs]:
            cells = []
            for n in result.lengths:
                speed = eval_tokens_per_second(result._point(row, mode, n).log)
                ratio = (f" ({speed / dense[n]:.2f}×)" if row != DENSE_ROW and speed
                         and dense[n] else "")
                cells.append("–" if speed is None else f"{speed:,.0f}{ratio}")
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _window_cutoff(text: str) -> float:
    """argparse type of ``--window-cutoff``: a finite number of nats > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a finite number of nats > 0 (e.g. --window-cutoff 8; the dense "
            "rows are always evaluated)")
    return value


# ---------------------------------------------------------------------------------------------
# command line


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="fairseq-alibi quickstart",
        description="Train short, test long: an ALiBi and a sinusoidal transformer LM trained "
        "at length L and evaluated at L, 2L, 4L, 8L, on a corpus built from Python's own "
        "documentation (no download) or on any binarized corpus (--data).",
    )
    parser.add_argument("--out", default="outputs/quickstart", help="output folder")
    parser.add_argument("--L", type=int, default=None,
                        help="training length in tokens (default 64; 16 with --smoke)")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny",
                        help="tiny: 2 layers, dim 128, 1000 updates (minutes on 2 CPU cores: "
                        "docs/quickstart.md has the measured time); small: 4 layers, dim 256, 4000 updates of 8192 tokens (a GPU "
                        "or patience)")
    parser.add_argument("--max-update", type=int, default=None,
                        help="training updates per model (default: the size's)")
    parser.add_argument("--data", default=None,
                        help="a binarized fairseq corpus (train and test splits) to use instead "
                        "of the embedded one")
    parser.add_argument("--seed", type=int, default=1,
                        help="training seed (same seed, machine and threads: same numbers)")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest setting: a 1-layer model, a few updates, a short "
                        "test split (checks the whole pipeline in about a minute)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="fairseq processes at once (default: 2 if there are 2+ cores)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads per process (default: $OMP_NUM_THREADS, else cores/jobs)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="evaluation modes, comma-separated (default: both)")
    parser.add_argument("--window-cutoff", type=_window_cutoff, nargs="+", default=[],
                        metavar="T",
                        help="also evaluate the ALiBi model with each slope-window cutoff T "
                        "(nats; the load-time override --model-overrides "
                        "\"{'alibi_window_cutoff': T}\"), side by side with the dense rows, "
                        "with their tokens/s against dense")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    args.window_cutoff = sorted(set(args.window_cutoff))
    if args.L is None:
        args.L = SMOKE_L if args.smoke else 64
    if args.L < 2:
        parser.error("--L must be at least 2")
    return args


def _log(msg):
    print(f"[quickstart] {msg}", flush=True)


def _data(args, out: Path, size: dict, env, timings: dict, run: dict) -> Path:
    """The binarized folder to train on: ``--data``, or the embedded corpus built into
    ``out/data`` (its manifest into ``run``, its time into ``timings``)."""
    if args.data:
        data = Path(args.data).resolve()
        if not (data / "dict.txt").is_file():
            raise SystemExit(f"--data {data}: no dict.txt there; give a folder written by "
                             "fairseq-preprocess (with train and test splits)")
        _log(f"data: {data}")
        return data
    _log("building the corpus from Python's own documentation and binarizing it ...")
    t = time.time()
    data, manifest = prepare_embedded_data(
        out / "data", size["vocab"], env, args.seed,
        test_fraction=SMOKE_TEST_FRACTION if args.smoke else 0.05,
    )
    timings["data_s"] = round(time.time() - t, 1)
    timings["data_cpu_s"] = round(cpu_seconds(), 1)
    run["corpus"] = manifest
    words = {s: manifest["splits"][s]["words"] for s in SPLITS}
    _log(f"corpus: {sum(words.values()):,} words ({words['train']:,} train, "
         f"{words['valid']:,} valid, {words['test']:,} test), sha256 "
         f"{manifest['sha256'][:12]}, {size['vocab']} sentencepiece pieces -> {data}")
    return data


def _report(args, out: Path, result, run: dict, timings: dict) -> int:
    """Print the tables and the verdict, write ``run.json`` and the report's summary; the exit
    status (1 where a run of the sweep failed)."""
    summary = verdict(result, run["settings"]["L"])
    counts = sorted({p.tokens for p in result.points})
    speeds = window_speed_table(result, args.window_cutoff) if args.window_cutoff else ""
    print()
    print(result.markdown())
    if speeds:
        print(speeds)
    for line in summary:
        print(line)
    print(f"Every run scored the same {', '.join(f'{c:,}' for c in counts)} test tokens."
          if len(counts) == 1 else f"Tokens evaluated differ between runs: {counts}")
    run.update(summary=summary, machine_at_end=machine())
    (out / "run.json").write_text(json.dumps(run, indent=2) + "\n")
    with open(result.files["markdown"], "a") as f:
        f.write("\n" + (speeds + "\n" if speeds else "") + "\n".join(summary) + "\n")
    print()
    _log(f"done in {timings['total_s']:.0f} s ({timings['cpu_s']:.0f} CPU-seconds). "
         f"Outputs in {out}:")
    for kind, path in result.files.items():
        _log(f"  {kind:<8} {path}")
    _log(f"  logs     {out / 'logs'}, settings and timings in {out / 'run.json'}")
    try:
        result.check()
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv=None):
    """The main job: the corpus, both models trained, evaluated at L … 8L, the report."""
    args = parse_args(argv)
    if not args.data:  # before any work: the corpus is encoded with it
        try:
            import sentencepiece  # noqa: F401
        except ImportError:
            raise SystemExit("fairseq-alibi quickstart: error: the quickstart's corpus needs "
                             "the sentencepiece package: pip install 'fairseq-alibi[examples]' "
                             "(or give --data a binarized folder)") from None
    started, machine_at_start = time.time(), machine()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    size = dict(SMOKE if args.smoke else SIZES[args.size])
    max_update = args.max_update or size["max_update"]
    L = args.L
    lengths = [L, 2 * L, 4 * L, 8 * L]
    cores = os.cpu_count() or 1
    jobs = args.jobs or (2 if cores >= 2 else 1)
    threads = args.threads or int(os.environ.get("OMP_NUM_THREADS", 0)) or max(1, cores // jobs)
    env = thread_env(threads)
    import torch

    cpu = not torch.cuda.is_available()
    progress = not args.no_progress
    timings, run = {}, {"command": " ".join(["fairseq-alibi quickstart"]
                                            + (argv if argv is not None else sys.argv[1:]))}
    data = _data(args, out, size, env, timings, run)

    _log(f"training {' and '.join(MODELS)} at L={L}: {size['layers']} layers, dim "
         f"{size['dim']}, {size['heads']} heads, {max_update} updates of {size['max_tokens']} "
         f"tokens ({jobs} at once, {threads} thread(s) each, {'CPU' if cpu else 'GPU'})")
    t = time.time()
    checkpoints = train_models(MODELS, data, out, size, L, max_update, args.seed, cpu, env,
                               jobs, progress)
    timings["train_s"] = round(time.time() - t, 1)
    timings["train_cpu_s"] = round(cpu_seconds() - timings.get("data_cpu_s", 0.0), 1)

    _log(f"evaluating at {', '.join(map(str, lengths))} tokens with fairseq-eval-lm ...")
    t = time.time()
    sweep_models = {
        "ALiBi": SweepModel(str(checkpoints["ALiBi"])),
        "Sinusoidal": SweepModel(str(checkpoints["Sinusoidal"]), overrides=position_overrides),
    }
    sweep_models.update(window_models(checkpoints[DENSE_ROW], args.window_cutoff))
    result = run_sweep(
        sweep_models, str(data), lengths, out, modes=args.modes.split(","),
        extra_eval_args=["--cpu"] if cpu else [], train_length=L, jobs=jobs, threads=threads,
        progress=progress,
        title=f"Trained at L={L}, evaluated at L..8L" + (" (smoke setting)" if args.smoke else ""),
    )
    timings["eval_s"] = round(time.time() - t, 1)
    timings["total_s"] = round(time.time() - started, 1)
    timings["cpu_s"] = round(cpu_seconds(), 1)  # all processes: what an idle machine needs
    timings["eval_cpu_s"] = round(timings["cpu_s"] - timings["train_cpu_s"]
                                  - timings.get("data_cpu_s", 0.0), 1)
    run.update(
        settings=dict(size, L=L, lengths=lengths, size="smoke" if args.smoke else args.size,
                      max_update=max_update, seed=args.seed, jobs=jobs, threads=threads,
                      device="cpu" if cpu else "cuda", window_cutoffs=args.window_cutoff),
        data=str(data), checkpoints={k: str(v) for k, v in checkpoints.items()},
        timings=timings, machine_at_start=machine_at_start,
    )
    return _report(args, out, result, run, timings)


if __name__ == "__main__":
    sys.exit(main())
