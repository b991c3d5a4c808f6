"""What the language-model workflow demonstrations share: data, fairseq-train runs, their logs.

Every step is a fairseq command line run as a subprocess (``fairseq-train``,
``fairseq-eval-lm`` through :mod:`fairseq_alibi.sweep`), as a user would run it.
"""

import argparse
import sys
import json
import os
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from fairseq_alibi.cli import fairseq_runs
from fairseq_alibi.cli.fairseq_runs import thread_env
from fairseq_alibi.cli.quickstart import SIZES, SMOKE, prepare_embedded_data, train_command

#: the model of the demonstrations: small enough for a few minutes on 2 shared CPU cores
DEMO_SIZE = dict(layers=2, dim=64, heads=4, ffn=256, max_tokens=2048, lr=3e-3, warmup=50,
                 vocab=2000)
#: ``--smoke``: the quickstart's smallest setting that runs every step (used by the tests)
SMOKE_SIZE = SMOKE


def start_run(out_dir, tag: str, threads: int = 1):
    """``(out, env, log)`` of a demonstration: its output folder (created), the environment of
    its fairseq subprocesses, and ``log(msg)``, which prints ``[tag] msg`` at once."""
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    return out, thread_env(threads), lambda msg: print(f"[{tag}] {msg}", flush=True)


def command_line(module: str, argv=None) -> str:
    """The command that ran ``python -m module`` with ``argv`` (``sys.argv[1:]`` if ``None``),
    as reports print it."""
    return " ".join([f"python -m {module}"] + (argv if argv is not None else sys.argv[1:]))


def publish(out: Path, name: str, report: str, record: dict, log, seconds: float) -> int:
    """Write the Markdown ``report`` as ``out/name`` and ``record`` as ``out/run.json``, print
    the report and where everything is; returns the exit status (0)."""
    (out / name).write_text(report)
    write_json(out / "run.json", record)
    print()
    print(report)
    log(f"done in {seconds:.0f} s; outputs in {out}")
    return 0


def comma_list(kind):
    """argparse type: ``a,b`` as numbers of ``kind``, sorted, once each."""
    def parse(text: str) -> list:
        try:
            return sorted({kind(part) for part in text.split(",") if part.strip()})
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}")
    return parse


def data_folder(out: Path, data: Optional[str], vocab: int, env: dict, seed: int,
                log=print) -> Path:
    """``data`` (a binarized folder) if given, else the embedded corpus, built once in ``out``."""
    if data:
        folder = Path(data).resolve()
        if not (folder / "dict.txt").is_file():
            raise SystemExit(f"--data {folder}: no dict.txt there; give a folder written by "
                             "fairseq-preprocess (train, valid and test splits)")
        return folder
    folder = out / "data" / "bin"
    manifest = out / "data" / "raw" / "corpus.json"
    if (folder / "test.bin").is_file() and manifest.is_file():
        log(f"reusing the binarized corpus in {folder}")
        return folder
    log("building the corpus from Python's own documentation and binarizing it ...")
    folder, _ = prepare_embedded_data(out / "data", vocab, env, seed)
    return folder


def finished_run(log: Path, cmd: Sequence[str], checkpoint: Path) -> Optional[dict]:
    """:func:`train`'s record of a run that finished before with the same command line (its log
    starts with it and holds fairseq-train's ``done training in N seconds``), or ``None``."""
    if not (log.is_file() and checkpoint.is_file()):
        return None
    text = log.read_text()
    done = re.search(r"done training in ([0-9.]+) seconds", text)
    if done is None or text.splitlines()[0] != "$ " + " ".join(cmd):
        return None
    return {"checkpoint": checkpoint, "log": log, "seconds": float(done.group(1)),
            "command": " ".join(cmd)}


def train(name: str, arch: str, data: Path, out: Path, size: dict, L: int, max_update: int,
          seed: int, env: dict, extra: Sequence[str] = (), command=None,
          reuse: bool = False) -> dict:
    """One ``fairseq-train`` run (the quickstart's command plus ``extra``), from scratch
    (``command(save_dir, seed)``: another command line instead of the quickstart's, e.g. a
    masked LM's; ``arch``, ``size``, ``L`` and ``max_update`` are then its own); ``reuse``: a
    run of the same command that finished in ``out`` before is kept (:func:`finished_run`).

    Returns ``{"checkpoint", "log", "seconds", "command"}``; raises with the log's tail if
    fairseq-train fails. The log is ``out/logs/train_<name>.log``.
    """
    save_dir = out / "checkpoints" / name
    cmd = (command(save_dir, seed) if command is not None
           else train_command(arch, data, save_dir, size, L, max_update, seed, cpu=True))
    cmd += [str(a) for a in extra]
    (out / "logs").mkdir(parents=True, exist_ok=True)
    log = out / "logs" / f"train_{name}.log"
    kept = finished_run(log, cmd, save_dir / "checkpoint_last.pt") if reuse else None
    if kept is not None:
        return kept
    if save_dir.exists():  # fairseq-train would resume a previous run
        for f in save_dir.iterdir():
            f.unlink()
    started = time.time()
    proc = fairseq_runs.run(cmd, env)
    seconds = time.time() - started
    log.write_text("$ " + " ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    checkpoint = save_dir / "checkpoint_last.pt"
    if proc.returncode != 0 or not checkpoint.is_file():
        raise RuntimeError(f"fairseq-train failed for {name} (exit {proc.returncode}); full "
                           f"output in {log}:\n" + (proc.stdout + proc.stderr)[-3000:])
    return {"checkpoint": checkpoint, "log": log, "seconds": round(seconds, 1),
            "command": " ".join(cmd)}


def prepare_model(args, out: Path, env: dict, log, make_data=None) -> dict:
    """The causal ALiBi LM an experiment scores: ``args.checkpoint`` (with ``args.data``), or
    the quickstart's LM (``tiny``, ``--smoke``: its smoke size) trained here at ``args.L`` for
    ``args.max_update`` updates on ``args.data``, else ``make_data(vocab)``'s folder, else the
    embedded corpus. Returns ``{"checkpoint", "data", "trained", "trained_line"}``
    (``trained``: :func:`train`'s record, or ``None``; ``trained_line`` says what was trained)."""
    if args.checkpoint:
        if not Path(args.checkpoint).is_file():
            raise SystemExit(f"--checkpoint {args.checkpoint}: no such file")
        data = data_folder(out, args.data, 0, env, args.seed, log)
        return {"checkpoint": Path(args.checkpoint).resolve(), "data": data, "trained": None}
    size = dict(SMOKE if args.smoke else SIZES["tiny"])
    if make_data is not None and not args.data:
        data = make_data(size["vocab"])
    else:
        data = data_folder(out, args.data, size["vocab"], env, args.seed, log)
    log(f"training the quickstart LM at L={args.L}: {size['layers']} layers, dim {size['dim']}, "
        f"{size['heads']} heads, {args.max_update} updates ...")
    run = train("alibi", "alibi_transformer_lm", data, out, size, args.L, args.max_update,
                args.seed, env)
    log(f"trained in {run['seconds']:.0f} s")
    return {"checkpoint": run["checkpoint"], "data": data, "trained": run,
            "trained_line": f"{size['layers']} layers, dim {size['dim']}, {size['heads']} heads, "
                            f"{args.max_update} updates of {size['max_tokens']} tokens in "
                            f"{run['seconds']:.0f} s"}


def train_settings(settings: Dict[str, Sequence[str]], seeds, data: Path, out: Path,
                   size: dict, L: int, max_update: int, env: dict, jobs: int,
                   log, command=None, reuse: bool = False) -> Dict[tuple, dict]:
    """``{(setting, seed): fairseq-train run}`` of the quickstart LM (``command``: another
    model's command line, as :func:`train` takes it) once per seed and setting (``settings``:
    name -> its extra fairseq-train flags), ``jobs`` at once: the same seed gives the same
    initialisation and batch order, so two settings of a seed differ by their flags;
    ``reuse``: :func:`train`'s."""
    def job(name, seed, extra):
        def run():
            tag = name.replace("=", "").replace(" + ", "_").replace(" ", "_")
            found = train(f"{tag}_seed{seed}", "alibi_transformer_lm", data, out, size, L,
                          max_update, seed, env, extra, command, reuse)
            log(f"trained {name}, seed {seed} in {found['seconds']:.0f} s")
            return found
        return run

    log(f"training {len(seeds) * len(settings)} models, {max_update} updates each at L={L}, "
        f"{jobs} at once ...")
    return run_all({(name, seed): job(name, seed, extra) for seed in seeds
                    for name, extra in settings.items()}, jobs)


def score_runs(runs: Dict[tuple, dict], data: Path, L: int, out_dir: Path, split: str,
               title: str, threads: int, jobs: int, overrides=None) -> List[dict]:
    """fairseq-eval-lm of every run of :func:`train_settings` on ``split`` in non-overlapping
    blocks of ``L`` (``overrides``: a load-time ``--model-overrides`` dict for every run), each
    checked to score every token of the split: ``{"setting", "seed", "perplexity", "tokens"}``
    per run."""
    from fairseq_alibi.cli.sweep import SweepModel, run_sweep

    models = {f"{name} seed {seed}": SweepModel(
        str(run["checkpoint"]), overrides=None if overrides is None else lambda n: overrides)
        for (name, seed), run in runs.items()}
    keys = dict(zip(models, runs))
    result = run_sweep(models, str(data), [L], out_dir, modes=["nonoverlapping"],
                       extra_eval_args=["--cpu"], gen_subset=split, jobs=jobs, threads=threads,
                       progress=False, title=title)
    result.check()
    return [{"setting": keys[p.model][0], "seed": keys[p.model][1], "perplexity": p.perplexity,
             "tokens": p.tokens} for p in result.points]


def run_all(jobs: Dict[str, callable], parallel: int) -> Dict[str, object]:
    """Run named zero-argument callables, ``parallel`` at a time; their results by name."""
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures = {name: pool.submit(fn) for name, fn in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


_TRAIN_INNER = re.compile(r"train_inner.*?num_updates=(\d+).*?[ ,]wall=(\d+)")


def wall_at_updates(log: Path) -> Dict[int, float]:
    """fairseq's ``wall`` (seconds since training started, whole seconds) at each logged update.

    (``train_wall`` of the ``train_inner`` lines is per logging interval and rounded, so it
    cannot be summed; ``wall`` is cumulative.)
    """
    return {int(u): float(w) for u, w in _TRAIN_INNER.findall(Path(log).read_text())}


def seed_summary(mine: Dict[int, float], base: Dict[int, float]) -> dict:
    """A setting's perplexities by seed ``mine`` against a baseline's ``base``: the median and
    spread (max - min) over seeds, the difference of the medians (and relative), the paired
    per-seed differences, and whether the difference is within the seed noise, ``|median -
    base median| <= max(spread, base spread)`` (the seeds' own spread bounds what a change of
    seed alone moves the median by)."""
    median, spread = statistics.median(mine.values()), max(mine.values()) - min(mine.values())
    base_median = statistics.median(base.values())
    noise = max(spread, max(base.values()) - min(base.values()))
    return {"median": median, "spread": spread, "seeds": mine,
            "difference": median - base_median, "relative": median / base_median - 1.0,
            "paired": {s: mine[s] - base[s] for s in sorted(mine) if s in base},
            "noise": noise, "within_noise": abs(median - base_median) <= noise}


def write_json(path: Path, payload: dict):
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    os.replace(tmp, path)


# ------------------------------------------------------------------------------- WikiText-2


#: where WikiText-2 lies by default: ``../shared/data/wikitext-2`` next to the repository
DEFAULT_WIKITEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2"


#: split of the binarized corpus -> WikiText-2 file (only these two splits are at hand)
WIKITEXT_FILES = {"train": "wiki.valid.tokens", "test": "wiki.test.tokens"}


def wikitext_files(source) -> dict:
    """``{"train": path, "test": path}`` of a WikiText-2 folder; missing files raise ``SystemExit``
    naming them."""
    files = {split: Path(source) / name for split, name in WIKITEXT_FILES.items()}
    missing = [str(f) for f in files.values() if not f.is_file()]
    if missing:
        raise SystemExit(f"WikiText-2 not found ({', '.join(missing)}); pass its folder "
                         "(wiki.valid.tokens, wiki.test.tokens)")
    return files
