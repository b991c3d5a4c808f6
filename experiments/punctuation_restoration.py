"""Train short, translate long: punctuation-and-case restoration, ALiBi vs sinusoidal.

    python -m experiments.punctuation_restoration [--wikitext DIR | --embedded] [--out DIR]
        [--N 16] [--max-update 2000] [--per-bucket 40] [--seed 1] [--start-marker]
        [--models ALiBi,Sinusoidal] [--from-logs]

A real sequence-to-sequence task made from real English text, whose output length tracks the
input length: the source is a stretch of text lower-cased with its punctuation removed, the
target the same stretch as written (:func:`fairseq_alibi.preprocess.parallel.restoration_pair`).
Stretches are cut from a running text at word boundaries (a stretch of n words keeps the
punctuation that follows its last word); training stretches have N/4 to N source words,
test stretches fall in four buckets of source length, (N/2, N], (N, 2N], (2N, 4N], (4N, 8N].

Text: WikiText-2 (``--wikitext``, default ``../shared/data/wikitext-2``): ``wiki.valid.tokens``
is the training text, ``wiki.test.tokens`` the test text (the train split is not at hand).
``--embedded`` uses the corpus built from Python's own documentation instead
(:mod:`fairseq_alibi.cli.corpus`; no download, for the test suite).

Both models are the same size (2+2 layers, 64 dims, 4 heads, shared embeddings of a joined
1,000-word dictionary, the rest ``<unk>``), trained with the same recipe, seed and number of
updates through ``fairseq-train``: ``alibi_transformer`` (offset encoder, causal decoder) and
stock ``transformer`` (sinusoidal). Every test stretch is translated by ``fairseq-generate``
(beam 4, ``--required-batch-size-multiple 1``; the script checks that the number of hypotheses
equals the number of inputs) and scored per bucket with sacrebleu's BLEU and chrF on the
tokens as they are (``tokenize='none'``), against references with the same ``<unk>``.

Each bucket also reports where the outputs start
(:func:`experiments.seq2seq_runs.output_starts`): how many begin with the source's first two
words, for the others how far into the source their first three words are found, and how many
end with the source's last two words. ``--from-logs`` computes all of this again from the
``fairseq-generate`` logs of an earlier run in ``--out``, without training.

Writes ``OUT/results.{md,csv,json}`` and ``OUT/results.png``; prints the table.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

from benchmarks.tables import comma_choices
from experiments.lm_runs import DEFAULT_WIKITEXT
from experiments.seq2seq_runs import (
    START,
    build_data,
    evaluate,
    final_checkpoint,
    generate_command,
    length_buckets,
    markdown_tables,
    plot,
    read_generate_log,
    read_texts,
    run_timed,
    summarize,
    train_command,
    write_csv,
)

MODELS = {
    "ALiBi": ["--arch", "alibi_transformer", "--encoder-alibi-variant", "offset",
              "--decoder-alibi-variant", "causal"],
    "Sinusoidal": ["--arch", "transformer"],
}


buckets = length_buckets


def train(name, out, args, env):
    save = out / "checkpoints" / name.lower()
    cmd = train_command(out / "bin", save, MODELS[name], layers=args.layers, dim=args.dim,
                        lr=args.lr, max_tokens=args.max_tokens, max_update=args.max_update,
                        seed=args.seed)
    _, seconds, _ = run_timed(cmd, env, out / f"train_{name.lower()}.log")
    return final_checkpoint(save, args.max_update, name), seconds


def generate(name, checkpoint, out, env, expected):
    log = out / f"generate_{name.lower()}.log"
    output, seconds, _ = run_timed(generate_command(out / "bin", checkpoint), env, log)
    return (*read_generate_log(name, output, log, expected), seconds)


def write_results(out, results, N, meta):
    """``results.{md,json,csv,png}`` of ``{model: rows}`` (one seed)."""
    bounds = buckets(N)
    summary = summarize({name: [rows] for name, rows in results.items()})
    table = markdown_tables(summary, N, bounds)
    (out / "results.md").write_text(table + "\n" + json.dumps(meta, indent=2) + "\n")
    (out / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    write_csv(out / "results.csv", {name: {meta.get("seed", 1): rows}
                                    for name, rows in results.items()}, summary)
    plot(out / "results.png", summary, N,
         "Punctuation and case restoration, trained on <= N words", bounds)
    return table


def test_sources(out, start_marker):
    return [line.replace(START + " ", "", 1) if start_marker else line
            for line in (out / "text" / "test.src").read_text().splitlines()]


def rescore(out, args, argv):
    """``--from-logs``: score the ``generate_<model>.log`` files of an earlier run in ``out``
    again (no training), keeping that run's recorded settings."""
    previous = out / "results.json"
    meta = json.loads(previous.read_text())["meta"] if previous.is_file() else {}
    start_marker = meta.get("start_marker", args.start_marker)
    N = meta.get("N", args.N)
    sources = test_sources(out, start_marker)
    results = {}
    for name in args.models:
        log = out / f"generate_{name.lower()}.log"
        if log.is_file():
            hyps, refs, model_sources = read_generate_log(name, log.read_text(), log, len(sources))
            results[name] = evaluate(hyps, refs, model_sources, sources, N, buckets(N))
    if not results:
        print(f"no generate_<model>.log of {', '.join(args.models)} in {out}: run the "
              "experiment first", file=sys.stderr)
        return 2
    meta["rescored"] = "python -m experiments.punctuation_restoration " + " ".join(
        argv if argv is not None else sys.argv[1:])
    print(write_results(out, results, N, meta))
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wikitext", default=str(DEFAULT_WIKITEXT))
    parser.add_argument("--embedded", action="store_true",
                        help="the corpus of Python's own documentation instead of WikiText-2")
    parser.add_argument("--out", default="outputs/punctuation_restoration")
    parser.add_argument("--N", type=int, default=16, help="longest training source, in words")
    parser.add_argument("--max-update", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=1024, help="tokens per batch")
    parser.add_argument("--layers", type=int, default=2, help="encoder and decoder layers")
    parser.add_argument("--dim", type=int, default=64, help="model dims (FFN 4x, 4 heads)")
    parser.add_argument("--vocab", type=int, default=1000,
                        help="words of the joined dictionary (the rest is <unk>)")
    parser.add_argument("--lr", type=float, default=0.004)
    parser.add_argument("--per-bucket", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--start-marker", action="store_true",
                        help=f"put the word {START} before every source (see docs/translation.md)")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--from-logs", action="store_true",
                        help="score the fairseq-generate logs of an earlier run in --out again "
                             "(no training; its settings are read from its results.json)")
    args = parser.parse_args(argv)
    args.models = comma_choices(parser, args.models, MODELS, "model")

    out = Path(args.out).absolute()
    if args.from_logs:
        return rescore(out, args, argv)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    texts = read_texts(args.wikitext, args.embedded, out)
    if texts is None:
        return 2
    train_lines, test_lines, source = texts
    n_train, n_test = build_data(train_lines, test_lines, out, args.N, args.per_bucket,
                                 args.seed, split_punctuation=args.embedded,
                                 vocab=args.vocab, start_marker=args.start_marker)
    print(f"[restoration] {n_train} training pairs (<= {args.N} source words), "
          f"{n_test} test pairs, in {time.time() - started:.0f} s")

    cores = os.cpu_count() or 1
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", str(cores)),
               PYTHONUNBUFFERED="1")
    sources = test_sources(out, args.start_marker)
    results, timing = {}, {}
    for name in args.models:
        checkpoint, train_s = train(name, out, args, env)
        hyps, refs, model_sources, gen_s = generate(name, checkpoint, out, env, len(sources))
        results[name] = evaluate(hyps, refs, model_sources, sources, args.N, buckets(args.N))
        timing[name] = {"train_s": round(train_s, 1), "generate_s": round(gen_s, 1)}
        print(f"[restoration] {name}: trained in {train_s:.0f} s, translated all {len(hyps)} "
              f"test inputs in {gen_s:.0f} s")
    meta = {"text": source, "N": args.N, "max_update": args.max_update, "seed": args.seed,
            "max_tokens": args.max_tokens, "layers": args.layers, "dim": args.dim,
            "vocab": args.vocab, "start_marker": args.start_marker,
            "train_pairs": n_train, "test_pairs": n_test, "timing": timing,
            "total_s": round(time.time() - started, 1),
            "command": "python -m experiments.punctuation_restoration "
                       + " ".join(argv if argv is not None else sys.argv[1:])}
    table = write_results(out, results, args.N, meta)
    print(table)
    print(f"[restoration] {time.time() - started:.0f} s in all; {out}/results.{{md,csv,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
