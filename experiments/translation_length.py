"""Train short, translate long: every position configuration of ``alibi_transformer``, several
seeds, one command.

    python -m experiments.translation_length [--corpus restoration|gettext]
        [--configs sinusoidal,alibi,...] [--seeds 1,2,3] [--out DIR] [--jobs J]
        [--device cpu|cuda] [--N 16] [--max-update 2000] [--layers 2] [--dim 64]
        [--data DIR] [--data-only] [--from-logs] [--smoke]

Each configuration (:data:`experiments.translation_runs.CONFIGS`) is trained at the same size,
recipe and number of updates on sources of at most N tokens, with every seed, through
``fairseq-train``; every test input is translated by ``fairseq-generate`` (the number of
hypotheses is checked against the number of inputs) and scored per source-length bucket, (N/2,
N], (N, 2N], (2N, 4N], (4N, 8N]: BLEU and chrF (sacrebleu), output ÷ reference length, where
outputs start and end (:func:`experiments.seq2seq_runs.output_starts`), as the mean and the
min–max over seeds.

Corpora (``--corpus``): ``restoration``, punctuation and case restoration made from WikiText-2
(:mod:`experiments.punctuation_restoration`; ``--embedded``: from Python's documentation), and
``gettext``, French→English from the machine's gettext catalogs
(``python -m fairseq_alibi.preprocess.gettext``). Each is built once into ``--data`` (default
``OUT/data``), as it is and with a start marker before every source, with ``data.json`` (the
length ratio and the mean training source length of each, which ``ratio`` and ``length_scale``
use): ``--data-only`` stops there, so that the grid can run elsewhere from a copy of the
repository with that folder carried along (``--data DIR``).

Runs go ``--jobs J`` at a time, each a subprocess with ``--threads`` threads (default: the
cores ÷ J); ``--device cuda`` drops ``--cpu`` (fp32 still, as on the CPU, so that the figures
compare). A run whose checkpoint and command are already in ``OUT/runs`` is not trained again
(an interrupted grid picks up where it stopped). ``--from-logs`` scores the ``fairseq-generate``
logs in ``OUT/runs`` again without training. ``--smoke``: toy sizes on the embedded corpus, one
seed, the configurations this checkout has; under two minutes (with ``--select``, which trains
every configuration of the selection and its confirmation, tens of minutes).

Writes ``OUT/results.{md,csv,json,png}`` (per configuration and bucket, and the wall and CPU
time of every run and in total) and prints the tables.
"""

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

from benchmarks.tables import comma_choices
from experiments.lm_runs import DEFAULT_WIKITEXT
from experiments.model_flags import accepted_flags, lacking_flags
from experiments.seq2seq_runs import (
    evaluate,
    generate_command,
    length_buckets,
    markdown_tables,
    plot,
    read_generate_log,
    summarize,
    train_command,
    write_csv,
)
from experiments.translation_runs import (
    CONFIGS,
    EOS_GUARD,
    GETTEXT_VOCAB,
    RESTORATION_VOCAB,
    build,
    data_bin,
    generate_once,
    in_parallel,
    kept_table,
    load_data,
    run_dir,
    test_sources,
    train_once,
    variant,
)
from fairseq_alibi.cli.fairseq_runs import machine, parse_seeds, thread_env

#: ``--smoke``: the smallest sizes that run every step (the tests run it)
SMOKE = dict(N=8, per_bucket=3, max_update=3, layers=1, dim=16, vocab=200, max_tokens=256)


def model_options():
    """The options this checkout's ``alibi_transformer`` accepts."""
    from fairseq_alibi.models.alibi_transformer import AlibiTransformerModel

    return accepted_flags(AlibiTransformerModel)


def missing_options(config, known):
    """The options ``config`` needs that ``known`` lacks (its own and its checkpoint's)."""
    wanted = [a for a in config.model if a.startswith("--") and a != "--arch"]
    wanted += ["--" + key.replace("_", "-") for key in config.decode_overrides]
    if config.checkpoint_of:
        wanted += missing_options(CONFIGS[config.checkpoint_of], set())
    return lacking_flags(wanted, known)


# ---------------------------------------------------------------------------------- the runs


def train_run(name, seed, out, data, data_meta, args, env):
    """Train ``name`` with ``seed`` (unless this very command already did); its record."""
    config = CONFIGS[name]
    figures = data_meta["figures"][variant(config)]  # the marker is a source token too
    model = [a.format(**figures) for a in config.model]
    where = run_dir(out, name, seed)
    cmd = train_command(
        data_bin(data, config), where / "checkpoints", model, layers=args.layers, dim=args.dim,
        lr=args.lr, max_tokens=args.max_tokens, max_update=args.max_update, seed=seed,
        cpu=args.device == "cpu", langs=data_meta["langs"])
    return train_once(f"{name} seed {seed}", where, cmd, env, args.max_update)


def generate_run(name, seed, out, data, args, env, langs, expected):
    config = CONFIGS[name]
    trained = run_dir(out, config.checkpoint_of or name, seed)
    checkpoint = json.loads((trained / "train.json").read_text())["checkpoint"]
    cmd = generate_command(data_bin(data, config), checkpoint, cpu=args.device == "cpu",
                           model_overrides=config.decode_overrides or None, langs=langs)
    return generate_once(f"{name} seed {seed}", run_dir(out, name, seed) / "generate.log", cmd,
                         env, expected)


def score_runs(out, data, meta, names, seeds):
    """``({config: {seed: rows}}, {config: {seed: timing}})`` from the logs in ``out/runs``."""
    sources = test_sources(data, meta)
    bounds = length_buckets(meta["N"])
    runs, timing = {}, {}
    for name in names:
        for seed in seeds:
            where = run_dir(out, name, seed)
            log = where / "generate.log"
            if not log.is_file():
                continue
            hyps, refs, model_sources = read_generate_log(f"{name} seed {seed}",
                                                          log.read_text(), log, len(sources))
            runs.setdefault(name, {})[seed] = evaluate(hyps, refs, model_sources, sources,
                                                       meta["N"], bounds)
            trained = run_dir(out, CONFIGS[name].checkpoint_of or name, seed) / "train.json"
            times = {}
            for step, record in (("train", trained), ("generate", where / "generate.json")):
                if record.is_file():
                    saved = json.loads(record.read_text())
                    times.update({f"{step}_wall_s": saved["wall_s"],
                                  f"{step}_cpu_s": saved["cpu_s"]})
            if CONFIGS[name].checkpoint_of in names:  # that run counts the training once
                times = {k: v for k, v in times.items() if not k.startswith("train")}
            timing.setdefault(name, {})[seed] = times
    return runs, timing


def timing_table(timing):
    lines = ["| run | seed | train wall s | train CPU s | generate wall s | generate CPU s |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, seeds in timing.items():
        for seed, t in seeds.items():
            lines.append(f"| {name} | {seed} | " + " | ".join(
                str(t.get(k, "–")) for k in ("train_wall_s", "train_cpu_s", "generate_wall_s",
                                              "generate_cpu_s")) + " |")
    return "\n".join(lines) + "\n"


def write_results(out, runs, timing, meta):
    N = meta["data"]["N"]
    summary = summarize({name: list(seeds.values()) for name, seeds in runs.items()})
    runs_cpu = sum(v for seeds in timing.values() for t in seeds.values()
                   for k, v in t.items() if k.endswith("cpu_s"))
    meta["runs_cpu_s"] = round(runs_cpu, 1)
    table = markdown_tables(summary, N) + "\n" + kept_table(runs, N)
    what = "\n".join(f"- `{name}`: {CONFIGS[name].what}" for name in runs)
    report = (f"{table}\n{what}\n\nWall and CPU time of each run (CPU: the run's own process, "
              f"user + system):\n\n{timing_table(timing)}\n"
              f"Runs: {meta['runs_cpu_s']} CPU-s in all"
              + (f"; the whole command: {meta['total_wall_s']} s wall, {meta['total_cpu_s']} "
                 "CPU-s" if "total_wall_s" in meta else "") + ".\n")
    (out / "results.md").write_text(report + "\n```json\n" + json.dumps(meta, indent=2)
                                    + "\n```\n")
    (out / "results.json").write_text(json.dumps(
        {"meta": meta, "runs": runs, "summary": summary, "timing": timing}, indent=2))
    write_csv(out / "results.csv", runs, summary)
    corpus = ("punctuation and case restoration" if meta["data"]["corpus"] == "restoration"
              else "French to English (gettext)")
    plot(out / "results.png", summary, N, f"{corpus}, trained on <= N={N} tokens")
    return report


# ---------------------------------------------------------------------------------- the command


def chosen_configs(parser, args):
    """``--configs`` as names; for a grid to train, each one this checkout's model can build
    (``all`` with ``--smoke``: those it can), else ``parser``'s error naming what is missing."""
    if args.data_only or args.from_logs:
        return comma_choices(parser, ",".join(CONFIGS) if args.configs == "all"
                             else args.configs, CONFIGS, "configuration")
    known = model_options()
    missing = {name: missing_options(config, known) for name, config in CONFIGS.items()}
    available = [name for name in CONFIGS if not missing[name]]
    if args.configs == "all":
        args.configs = ",".join(available if args.smoke else CONFIGS)
    names = comma_choices(parser, args.configs, CONFIGS, "configuration")
    lacking = [f"{name} ({', '.join(missing[name])})" for name in names if missing[name]]
    if lacking:
        parser.error(f"this checkout's alibi_transformer lacks the options of "
                     f"{'; '.join(lacking)}: pass --configs {','.join(available)}")
    return names


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", choices=("restoration", "gettext"), default=None,
                        help="default restoration; with --select (not --smoke), gettext")
    parser.add_argument("--select", action="store_true",
                        help="the selection procedure of experiments/translation_selection.py: "
                             "settings chosen on the validation buckets at two sizes, the test "
                             "buckets read once (default --out outputs/translation_select)")
    parser.add_argument("--restoration-data", default=None,
                        help="--select: the restoration corpus (default OUT/data/restoration)")
    parser.add_argument("--docs", default=None,
                        help="--select: copy the tables, CSVs and plots into this folder "
                             "(translation_selection*)")
    parser.add_argument("--configs", default="all",
                        help=f"comma-separated, from {','.join(CONFIGS)} (default: all)")
    parser.add_argument("--seeds", default="1,2,3", help="training seeds, comma-separated")
    parser.add_argument("--out", default=None,
                        help="default outputs/translation_length/<corpus>")
    parser.add_argument("--data", default=None,
                        help="the data folder (default OUT/data); built there unless it has "
                             "data.json")
    parser.add_argument("--data-only", action="store_true",
                        help="build the data and stop (then run the grid with --data DIR)")
    parser.add_argument("--from-logs", action="store_true",
                        help="score the fairseq-generate logs in OUT/runs again, no training")
    parser.add_argument("--smoke", action="store_true",
                        help="toy sizes on the embedded corpus, one seed (under two minutes; "
                        "with --select, which trains the whole selection, tens of minutes)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (subprocesses)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads per run (default: the cores / --jobs)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    sizes = parser.add_argument_group("data and model sizes (every configuration alike)")
    sizes.add_argument("--N", type=int, default=16, help="longest training source, in tokens")
    sizes.add_argument("--per-bucket", type=int, default=40, help="test inputs per bucket")
    sizes.add_argument("--vocab", type=int, default=None,
                       help="words of the joined dictionary, the rest <unk> (default: "
                            f"{RESTORATION_VOCAB} for restoration, {GETTEXT_VOCAB} for gettext)")
    sizes.add_argument("--data-seed", type=int, default=1, help="the seed of the data split")
    sizes.add_argument("--wikitext", default=str(DEFAULT_WIKITEXT))
    sizes.add_argument("--embedded", action="store_true",
                       help="restoration from Python's documentation instead of WikiText-2")
    sizes.add_argument("--max-update", type=int, default=2000)
    sizes.add_argument("--max-tokens", type=int, default=1024, help="tokens per batch")
    sizes.add_argument("--layers", type=int, default=2, help="encoder and decoder layers")
    sizes.add_argument("--dim", type=int, default=64, help="model dims (FFN 4x, 4 heads)")
    sizes.add_argument("--lr", type=float, default=0.004)
    args = parser.parse_args(argv)
    args.corpus = args.corpus or ("gettext" if args.select and not args.smoke else
                                  "restoration")
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
        args.embedded = True
        args.seeds = args.seeds if "--seeds" in (argv or sys.argv) else "1"
    args.seeds = parse_seeds(parser, args.seeds)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.select:
        given = [flag for flag in ("--configs", "--layers", "--dim", "--max-update",
                                   "--data-only") if flag in (argv or sys.argv)]
        if given:
            parser.error(f"--select trains the grid of experiments/translation_selection.py "
                         f"(its sizes, settings and decodings): drop {', '.join(given)}")
    else:
        args.configs = chosen_configs(parser, args)
    return args


def main(argv=None):
    args = parse(argv)
    command = "python -m experiments.translation_length " + " ".join(
        argv if argv is not None else sys.argv[1:])
    if args.select:
        from experiments import translation_selection

        return translation_selection.run(args, command)
    out = Path(args.out or f"outputs/translation_length/{args.corpus}").absolute()
    data = Path(args.data).absolute() if args.data else out / "data"
    started = time.time()
    if args.from_logs:
        previous = json.loads((out / "results.json").read_text())["meta"] \
            if (out / "results.json").is_file() else {}
        data_meta = previous.get("data") or load_data(data)
        runs, timing = score_runs(out, data, data_meta, args.configs, args.seeds)
        if not runs:
            print(f"no runs/<config>/seed<s>/generate.log in {out}: run the experiment first",
                  file=sys.stderr)
            return 2
        meta = dict(previous, data=data_meta, rescored=command)
        print(write_results(out, runs, timing, meta))
        return 0

    out.mkdir(parents=True, exist_ok=True)
    if (data / "data.json").is_file():
        data_meta = load_data(data)
        print(f"[translation_length] data from {data}", flush=True)
    else:
        data_meta = build(data, args)
        print(f"[translation_length] {data_meta['train_pairs']} training pairs "
              f"(<= {data_meta['N']} source tokens), {data_meta['test_pairs']} test pairs, in "
              f"{data_meta['built_in_s']:.0f} s: {data}", flush=True)
    if args.data_only:
        return 0

    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    env = thread_env(threads)
    expected = len(test_sources(data, data_meta))

    def train_and_translate(trained, seed):
        """Train one checkpoint, then translate the test set with every configuration that
        decodes it (a grid cut short keeps whole runs)."""
        train_run(trained, seed, out, data, data_meta, args, env)
        for name in args.configs:
            if (CONFIGS[name].checkpoint_of or name) == trained:
                generate_run(name, seed, out, data, args, env, data_meta["langs"], expected)

    # seed by seed, so that a grid cut short has every configuration of its first seeds
    trained = list(dict.fromkeys((CONFIGS[n].checkpoint_of or n, s)
                                 for s in args.seeds for n in args.configs))
    in_parallel(args.jobs, [lambda n=n, s=s: train_and_translate(n, s) for n, s in trained])
    runs, timing = score_runs(out, data, data_meta, args.configs, args.seeds)
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    meta = {"data": data_meta, "configs": args.configs, "seeds": args.seeds,
            "max_update": args.max_update, "max_tokens": args.max_tokens, "layers": args.layers,
            "dim": args.dim, "lr": args.lr, "device": args.device, "jobs": args.jobs,
            "threads_per_run": threads, "figures": data_meta["figures"], "eos_guard": EOS_GUARD,
            "machine": machine(), "command": command,
            "total_wall_s": round(time.time() - started, 1),
            "total_cpu_s": round(own.ru_utime + own.ru_stime + children.ru_utime
                                 + children.ru_stime, 1)}
    print(write_results(out, runs, timing, meta))
    print(f"[translation_length] {meta['total_wall_s']:.0f} s in all; "
          f"{out}/results.{{md,csv,json,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
