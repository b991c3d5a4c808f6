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

Each bucket also reports where the outputs start (:func:`output_starts`): how many begin with
the source's first two words, for the others how far into the source their first three words
are found, and how many end with the source's last two words. ``--from-logs`` computes all of
this again from the ``fairseq-generate`` logs of an earlier run in ``--out``, without training.

Writes ``OUT/results.{md,csv,json}`` and ``OUT/results.png``; prints the table.
"""

import argparse
import csv
import json
import logging
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_WIKITEXT = REPO.parent / "shared" / "data" / "wikitext-2"
BIN = Path(sys.executable).parent

from benchmarks.common import comma_choices  # noqa: E402
from fairseq_alibi.paths import user_dir  # noqa: E402
from fairseq_alibi.preprocess.parallel import PUNCTUATION, prepare, restoration_pair  # noqa: E402

MODELS = {
    "ALiBi": ["--arch", "alibi_transformer", "--encoder-alibi-variant", "offset",
              "--decoder-alibi-variant", "causal"],
    "Sinusoidal": ["--arch", "transformer"],
}


def model_size(layers, dim):
    return ["--encoder-layers", str(layers), "--decoder-layers", str(layers),
            "--encoder-embed-dim", str(dim), "--decoder-embed-dim", str(dim),
            "--encoder-ffn-embed-dim", str(4 * dim), "--decoder-ffn-embed-dim", str(4 * dim),
            "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
            "--share-all-embeddings"]


def tokens_of(lines, split_punctuation):
    """One running token stream; WikiText headings and blank lines dropped."""
    stream = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith("= "):
            continue
        stream += re.findall(r"\w+|[^\w\s]", line) if split_punctuation else line.split()
    return stream


def stretches(stream, lengths):
    """Consecutive stretches of ``stream`` with ``n`` words each, ``n`` from ``lengths``; each
    starts at a word and keeps the punctuation after its last word."""
    words = [i for i, t in enumerate(stream) if not PUNCTUATION.match(t)]
    k, out = 0, []
    for n in lengths:
        if k + n >= len(words):
            break
        out.append(" ".join(stream[words[k]: words[k + n]]))
        k += n
    return out


#: what ``--start-marker`` puts before every source (a word of its own in the dictionary)
START = "@start@"


def write_pairs(texts, prefix, start_marker=False):
    pairs = [restoration_pair(t) for t in texts]
    marker = START + " " if start_marker else ""
    Path(f"{prefix}.src").write_text("".join(marker + p[0] + "\n" for p in pairs))
    Path(f"{prefix}.tgt").write_text("".join(p[1] + "\n" for p in pairs))
    return len(pairs)


def buckets(N):
    return [(N // 2 + 1, N), (N + 1, 2 * N), (2 * N + 1, 4 * N), (4 * N + 1, 8 * N)]


def build_data(train_lines, test_lines, out, N, per_bucket, seed, split_punctuation, vocab,
               start_marker=False):
    rng = random.Random(seed)
    text = out / "text"
    text.mkdir(parents=True, exist_ok=True)
    train_stream = tokens_of(train_lines, split_punctuation)
    train = stretches(train_stream, iter(lambda: rng.randint(max(1, N // 4), N), None))
    rng.shuffle(train)
    n_valid = max(50, len(train) // 50)
    write_pairs(train[n_valid:], text / "train", start_marker)
    write_pairs(train[:n_valid], text / "valid", start_marker)
    # test: the buckets interleaved along the test text, per_bucket stretches each
    lengths = []
    for _ in range(per_bucket):
        lengths += [rng.randint(low, high) for low, high in buckets(N)]
    test = stretches(tokens_of(test_lines, split_punctuation), lengths)
    if len(test) < len(lengths):
        raise SystemExit(f"the test text holds only {len(test)} of the {len(lengths)} stretches "
                         "asked for: lower --per-bucket or --N")
    write_pairs(test, text / "test", start_marker)
    prepare(out / "bin", "src", "tgt", text / "train", text / "valid", text / "test",
            joined_dictionary=True, nwords=vocab, workers=1, overwrite=True)
    return len(train) - n_valid, len(test)


def run(cmd, env, log):
    started = time.time()
    proc = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True)
    Path(log).write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd[:3]))} ... failed, see {log}:\n"
                         f"{(proc.stdout + proc.stderr)[-3000:]}")
    return proc.stdout + proc.stderr, time.time() - started


def train(name, out, args, env):
    save = out / "checkpoints" / name.lower()
    cmd = [BIN / "fairseq-train", out / "bin", "--user-dir", user_dir(), "--task", "translation",
           "--source-lang", "src", "--target-lang", "tgt", *MODELS[name],
           *model_size(args.layers, args.dim),
           "--dropout", "0.1", "--optimizer", "adam", "--adam-betas", "(0.9,0.98)",
           "--lr", str(args.lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100",
           "--clip-norm", "1.0", "--criterion", "label_smoothed_cross_entropy",
           "--label-smoothing", "0.1", "--max-tokens", str(args.max_tokens), "--max-update",
           str(args.max_update), "--required-batch-size-multiple", "1", "--seed", str(args.seed),
           "--cpu", "--num-workers", "0", "--save-dir", save, "--no-epoch-checkpoints",
           "--no-last-checkpoints", "--disable-validation", "--save-interval-updates",
           str(args.max_update), "--log-format", "simple", "--log-interval", "100",
           "--no-progress-bar"]
    _, seconds = run(cmd, env, out / f"train_{name.lower()}.log")
    # saved at the last update: checkpoint_<epoch>_<max_update>.pt
    found = sorted(save.glob(f"checkpoint_*_{args.max_update}.pt"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"{name}: no checkpoint of update {args.max_update} in {save}")
    return found[-1], seconds


def generate(name, checkpoint, out, env, expected):
    cmd = [BIN / "fairseq-generate", out / "bin", "--user-dir", user_dir(), "--path", checkpoint,
           "--gen-subset", "test", "--beam", "4", "--batch-size", "32",
           "--required-batch-size-multiple", "1", "--max-len-a", "1.5", "--max-len-b", "10",
           "--cpu", "--num-workers", "0"]
    output, seconds = run(cmd, env, out / f"generate_{name.lower()}.log")
    return (*read_generate_log(name, output, out, expected), seconds)


def read_generate_log(name, output, out, expected):
    """``(hyps, refs, model_sources)`` by test line from ``fairseq-generate``'s output; the
    model's sources (``S-``) are the inputs as the model saw them (``<unk>`` included)."""
    hyps, refs, model_sources = {}, {}, {}
    for line in output.splitlines():
        tag, _, rest = line.partition("\t")
        if tag.startswith("H-"):
            hyps[int(tag[2:])] = rest.split("\t", 1)[1]
        elif tag.startswith("T-"):
            refs[int(tag[2:])] = rest.replace("<<unk>>", "<unk>")
        elif tag.startswith("S-"):
            model_sources[int(tag[2:])] = rest.replace("<<unk>>", "<unk>")
    if len(hyps) != expected or f"Translated {expected} sentences" not in output:
        raise SystemExit(f"{name}: {len(hyps)} hypotheses for {expected} test inputs "
                         f"(see {out}/generate_{name.lower()}.log)")
    return hyps, refs, model_sources


def score(hyps, refs, sources, N):
    import sacrebleu

    rows = []
    for low, high in buckets(N):
        ids = [i for i, s in enumerate(sources) if low <= len(s.split()) <= high]
        h = [hyps[i] for i in ids]
        r = [refs[i] for i in ids]
        rows.append({
            "bucket": f"{low}-{high}",
            "sentences": len(ids),
            "bleu": sacrebleu.corpus_bleu(h, [r], tokenize="none").score,
            "chrf": sacrebleu.corpus_chrf(h, [r]).score,
            "length_ratio": sum(len(x.split()) for x in h) / max(1, sum(len(x.split()) for x in r)),
        })
    return rows


def _words(text):
    """Lower-cased words of a sentence, punctuation and the start marker dropped."""
    return [t.lower() for t in text.split() if not PUNCTUATION.match(t) and t != START]


def output_starts(hyps, model_sources, sources, N):
    """Where each output starts (and whether it ends) in its source, per bucket.

    An output *starts at the start* when its first two words (lower-cased, punctuation dropped)
    are the source's first two; otherwise its start is looked up as the first place in the
    source where the output's first three words occur, as a fraction of the source's length
    (0 = its first word). It *ends at the end* when its last two words are the source's last
    two. Sources as the model saw them (``<unk>`` included, marker dropped).
    """
    import statistics

    rows = []
    for low, high in buckets(N):
        ids = [i for i, s in enumerate(sources) if low <= len(s.split()) <= high]
        at_start, further_in, at_end = 0, [], 0
        for i in ids:
            source, output = _words(model_sources[i]), _words(hyps[i])
            at_end += output[-2:] == source[-2:]
            if output[:2] == source[:2]:
                at_start += 1
                continue
            found = next((k for k in range(len(source)) if source[k:k + 3] == output[:3]), None)
            if found is not None:
                further_in.append(found / len(source))
        rows.append({
            "bucket": f"{low}-{high}",
            "sentences": len(ids),
            "starts_at_start": at_start,
            "starts_further_in": len(further_in),
            "median_start": statistics.median(further_in) if further_in else None,
            "ends_at_end": at_end,
        })
    return rows


def write_results(out, results, N, meta):
    header = [f"{low}-{high} ({'N' if high == N else f'{high // N}N'})"
              for low, high in buckets(N)]
    lines = [f"| BLEU (chrF) by source words | " + " | ".join(header) + " |",
             "|---|" + "---:|" * len(header)]
    for name, rows in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{r['bleu']:.1f} ({r['chrf']:.1f})"
                                                for r in rows) + " |")
    lines += ["", "| output/reference length | " + " | ".join(header) + " |",
              "|---|" + "---:|" * len(header)]
    for name, rows in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{r['length_ratio']:.2f}" for r in rows) + " |")
    lines += ["", "| output starts with the source's first two words (else: median start, "
              "where found) | " + " | ".join(header) + " |", "|---|" + "---:|" * len(header)]
    for name, rows in results.items():
        if all("starts_at_start" in r for r in rows):
            lines.append(f"| {name} | " + " | ".join(
                f"{r['starts_at_start']} of {r['sentences']}"
                + (f" ({100 * r['median_start']:.0f} % in, {r['starts_further_in']} found)"
                   if r["median_start"] is not None else "") for r in rows) + " |")
    lines += ["", "| output ends with the source's last two words | " + " | ".join(header) + " |",
              "|---|" + "---:|" * len(header)]
    for name, rows in results.items():
        if all("ends_at_end" in r for r in rows):
            lines.append(f"| {name} | " + " | ".join(f"{r['ends_at_end']} of {r['sentences']}"
                                                    for r in rows) + " |")
    table = "\n".join(lines)
    (out / "results.md").write_text(table + "\n\n" + json.dumps(meta, indent=2) + "\n")
    (out / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "bucket", "sentences", "bleu", "chrf", "length_ratio",
                    "starts_at_start", "starts_further_in", "median_start", "ends_at_end"])
        for name, rows in results.items():
            for r in rows:
                w.writerow([name, r["bucket"], r["sentences"], f"{r['bleu']:.2f}",
                            f"{r['chrf']:.2f}", f"{r['length_ratio']:.3f}",
                            r.get("starts_at_start", ""), r.get("starts_further_in", ""),
                            "" if r.get("median_start") is None else f"{r['median_start']:.3f}",
                            r.get("ends_at_end", "")])
    try:
        logging.getLogger("matplotlib").setLevel(logging.WARNING)  # the root logger may be DEBUG
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        for name, rows in results.items():
            ax.plot(range(len(rows)), [r["bleu"] for r in rows], marker="o", label=name)
        ax.axvspan(-0.3, 0.3, color="grey", alpha=0.15, label=f"training lengths (<= N={N})")
        ax.set_xticks(range(len(header)), header)
        ax.set_xlabel("source length (words)")
        ax.set_ylabel("BLEU")
        ax.set_title("Punctuation and case restoration, trained on <= N words")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "results.png", dpi=120)
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
    return table


def evaluate(hyps, refs, model_sources, sources, N):
    """Per bucket: BLEU, chrF, length ratio (:func:`score`) and where outputs start
    (:func:`output_starts`)."""
    return [dict(quality, **starts) for quality, starts in
            zip(score(hyps, refs, sources, N), output_starts(hyps, model_sources, sources, N))]


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
            hyps, refs, model_sources = read_generate_log(name, log.read_text(), out, len(sources))
            results[name] = evaluate(hyps, refs, model_sources, sources, N)
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
    if args.embedded:
        from fairseq_alibi.cli.corpus import build_corpus

        corpus = build_corpus(out / "embedded")
        del corpus
        train_lines = (out / "embedded" / "train.txt").read_text().splitlines()
        test_lines = (out / "embedded" / "test.txt").read_text().splitlines()
        source = "Python documentation (fairseq_alibi.cli.corpus)"
    else:
        wikitext = Path(args.wikitext)
        files = [wikitext / "wiki.valid.tokens", wikitext / "wiki.test.tokens"]
        if not all(f.is_file() for f in files):
            print(f"WikiText-2 not found in {wikitext}; pass --wikitext DIR or --embedded",
                  file=sys.stderr)
            return 2
        train_lines = files[0].read_text(encoding="utf-8").splitlines()
        test_lines = files[1].read_text(encoding="utf-8").splitlines()
        source = "WikiText-2 (train: wiki.valid.tokens, test: wiki.test.tokens)"
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
        results[name] = evaluate(hyps, refs, model_sources, sources, args.N)
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
