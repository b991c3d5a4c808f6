"""What the sequence-to-sequence "train short, translate long" experiments share.

``fairseq-train`` / ``fairseq-generate`` as subprocesses (the wall and CPU time of each), the
hypothesis-count check, scoring per source-length bucket (sacrebleu BLEU and chrF, output ÷
reference length, :func:`output_starts`), and the results: Markdown tables, CSV and a plot, with
the mean and the spread (min–max) over seeds when there are several.

Used by :mod:`experiments.punctuation_restoration` (one seed, two models) and
:mod:`experiments.translation_length` (every configuration, several seeds, two corpora).
"""

import csv
import logging
import random
import re
import statistics
import sys
import time
from pathlib import Path

from fairseq_alibi.cli import fairseq_runs
from fairseq_alibi.cli.fairseq_runs import console_script
from fairseq_alibi.paths import user_dir
from fairseq_alibi.preprocess.parallel import PUNCTUATION, prepare, restoration_pair


#: what a start marker puts before every source (a word of its own in the dictionary)
START = "@start@"


def length_buckets(N):
    """Source-length buckets (inclusive bounds): (N/2, N], (N, 2N], (2N, 4N], (4N, 8N]."""
    return [(N // 2 + 1, N), (N + 1, 2 * N), (2 * N + 1, 4 * N), (4 * N + 1, 8 * N)]


def bucket_names(N, bounds):
    return [f"{low}-{high} ({'N' if high == N else f'{high / N:g}N'})" for low, high in bounds]


def run_timed(cmd, env, log):
    """Run ``cmd`` with its output in ``log``; ``(output, wall_s, cpu_s)``, the CPU time being
    the command's own (user + system, its waited-for children included), so that runs made side
    by side are timed apart. Stops with the log's tail if the command fails."""
    cmd = [str(c) for c in cmd]
    started = time.time()
    started_run = fairseq_runs.run_to_log(cmd, env, log)
    code = started_run.returncode
    wall = time.time() - started
    output = Path(log).read_text()
    if code != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} ... failed (exit {code}), see {log}:\n"
                         f"{output[-3000:]}")
    return output, wall, started_run.cpu_s


def train_command(data_bin, save_dir, model_flags, *, layers, dim, lr, max_tokens, max_update,
                  seed, warmup=100, cpu=True, langs=("src", "tgt"), heads=4, ffn=None):
    """``fairseq-train`` of a small translation model: the recipe every run shares (Adam,
    inverse-sqrt schedule, label smoothing 0.1, no validation, one checkpoint at the end);
    ``heads`` attention heads on both sides, FFN ``ffn`` dims (default ``4 * dim``)."""
    ffn = ffn or 4 * dim
    return [console_script("fairseq-train"), data_bin, "--user-dir", user_dir(),
            "--task", "translation",
            "--source-lang", langs[0], "--target-lang", langs[1], *model_flags,
            "--encoder-layers", layers, "--decoder-layers", layers,
            "--encoder-embed-dim", dim, "--decoder-embed-dim", dim,
            "--encoder-ffn-embed-dim", ffn, "--decoder-ffn-embed-dim", ffn,
            "--encoder-attention-heads", heads, "--decoder-attention-heads", heads,
            "--share-all-embeddings",
            "--dropout", "0.1", "--optimizer", "adam", "--adam-betas", "(0.9,0.98)",
            "--lr", lr, "--lr-scheduler", "inverse_sqrt", "--warmup-updates", warmup,
            "--clip-norm", "1.0", "--criterion", "label_smoothed_cross_entropy",
            "--label-smoothing", "0.1", "--max-tokens", max_tokens, "--max-update", max_update,
            "--required-batch-size-multiple", "1", "--seed", seed,
            *(["--cpu"] if cpu else []), "--num-workers", "0", "--save-dir", save_dir,
            "--no-epoch-checkpoints", "--disable-validation",
            "--save-interval-updates", max_update, "--log-format", "simple",
            "--log-interval", "100", "--no-progress-bar"]


#: a flag earlier runs' commands had: it only chose which file holds the last update
#: (:func:`final_checkpoint`), so a run recorded with it is the same run
DROPPED_FLAGS = ("--no-last-checkpoints",)


def same_command(recorded, cmd):
    """Whether a recorded command is ``cmd`` (flags of :data:`DROPPED_FLAGS` aside)."""
    return [c for c in recorded if c not in DROPPED_FLAGS] == list(cmd)


def final_checkpoint(save_dir, max_update, name):
    """The checkpoint saved at the last update: ``checkpoint_<epoch>_<max_update>.pt``, or
    ``checkpoint_last.pt`` when the last update ends an epoch (fairseq then writes no
    update-numbered checkpoint; training stopped at ``max_update``, so the last is that one)."""
    save_dir = Path(save_dir)
    found = sorted(save_dir.glob(f"checkpoint_*_{max_update}.pt"),
                   key=lambda p: p.stat().st_mtime)
    if found:
        return found[-1]
    if (save_dir / "checkpoint_last.pt").is_file():
        return save_dir / "checkpoint_last.pt"
    raise SystemExit(f"{name}: no checkpoint of update {max_update} in {save_dir}")


def generate_command(data_bin, checkpoint, *, cpu=True, model_overrides=None, beam=4,
                     langs=("src", "tgt"), subset="test"):
    """``fairseq-generate`` of every input of ``subset`` (``--required-batch-size-multiple 1``:
    with fairseq's default of 8 the last batch can be dropped, see docs/translation.md)."""
    overrides = ["--model-overrides", repr(model_overrides)] if model_overrides else []
    return [console_script("fairseq-generate"), data_bin, "--user-dir", user_dir(),
            "--path", checkpoint,
            "--source-lang", langs[0], "--target-lang", langs[1],
            "--gen-subset", subset, "--beam", beam, "--batch-size", "32",
            "--required-batch-size-multiple", "1", "--max-len-a", "1.5", "--max-len-b", "10",
            *(["--cpu"] if cpu else []), "--num-workers", "0", *overrides]


def read_generate_log(name, output, log, expected):
    """``(hyps, refs, model_sources)`` by test line from ``fairseq-generate``'s output; the
    model's sources (``S-``) are the inputs as the model saw them (``<unk>`` included). Stops
    unless there is one hypothesis for each of the ``expected`` test inputs."""
    hyps, refs, model_sources = {}, {}, {}
    for line in output.splitlines():
        tag, _, rest = line.partition("\t")
        if tag.startswith("H-"):
            hyps[int(tag[2:])] = rest.split("\t", 1)[1]
        elif tag.startswith("T-"):
            refs[int(tag[2:])] = rest.replace("<<unk>>", "<unk>")
        elif tag.startswith("S-"):
            model_sources[int(tag[2:])] = rest.replace("<<unk>>", "<unk>")
    if len(hyps) != expected:
        raise SystemExit(f"{name}: {len(hyps)} hypotheses for {expected} test inputs "
                         f"(see {log})")
    # fairseq prints the count with thousands separators ("Translated 1,329 sentences")
    if f"Translated {expected:,} sentences" not in output \
            and f"Translated {expected} sentences" not in output:
        raise SystemExit(f"{name}: {log} ends before fairseq-generate's summary (a run still "
                         "going, or one stopped): wait for it, or remove the log to decode again")
    return hyps, refs, model_sources


def bucket_ids(sources, low, high):
    return [i for i, s in enumerate(sources) if low <= len(s.split()) <= high]


def score(hyps, refs, sources, N, bounds=None):
    """Per bucket of source length: BLEU and chrF (sacrebleu, tokens as they are) and the
    output ÷ reference length in tokens."""
    import sacrebleu

    rows = []
    for low, high in bounds or length_buckets(N):
        ids = bucket_ids(sources, low, high)
        h = [hyps[i] for i in ids]
        r = [refs[i] for i in ids]
        rows.append({"bucket": f"{low}-{high}", "sentences": len(ids)})
        if not ids:  # nothing to score (a corpus short of long inputs)
            rows[-1].update(bleu=None, chrf=None, length_ratio=None)
            continue
        rows[-1].update(
            bleu=sacrebleu.corpus_bleu(h, [r], tokenize="none").score,
            chrf=sacrebleu.corpus_chrf(h, [r]).score,
            length_ratio=sum(len(x.split()) for x in h) / max(1, sum(len(x.split()) for x in r)),
        )
    return rows


def _words(text):
    """Lower-cased words of a sentence, punctuation and the start marker dropped."""
    return [t.lower() for t in text.split() if not PUNCTUATION.match(t) and t != START]


def output_starts(hyps, model_sources, sources, N, bounds=None):
    """Where each output starts (and whether it ends) in its source, per bucket.

    An output *starts at the start* when its first two words (lower-cased, punctuation dropped)
    are the source's first two; otherwise its start is looked up as the first place in the
    source where the output's first three words occur, as a fraction of the source's length
    (0 = its first word). It *ends at the end* when its last two words are the source's last
    two. Sources as the model saw them (``<unk>`` included, marker dropped). Meaningful where
    the output copies the source's words (restoration); for a translation the counts say how
    often the output begins and ends with the source's words, which is rarely.
    """
    rows = []
    for low, high in bounds or length_buckets(N):
        ids = bucket_ids(sources, low, high)
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


def evaluate(hyps, refs, model_sources, sources, N, bounds=None):
    """Per bucket: BLEU, chrF, length ratio (:func:`score`) and where outputs start
    (:func:`output_starts`)."""
    return [dict(quality, **starts) for quality, starts in
            zip(score(hyps, refs, sources, N, bounds),
                output_starts(hyps, model_sources, sources, N, bounds))]


#: the per-bucket figures summarised over seeds, with how each is shown in a table
METRICS = {"bleu": "{:.1f}", "chrf": "{:.1f}", "length_ratio": "{:.2f}"}
COUNTS = ("starts_at_start", "ends_at_end")


def summarize(runs):
    """``{name: [rows of seed 1, rows of seed 2, ...]}`` -> ``{name: rows}`` where each figure
    of :data:`METRICS` has its ``mean``, ``min``, ``max``, ``std`` (0 for one seed) and the
    per-seed values, and each count of :data:`COUNTS` its per-seed values."""
    summary = {}
    for name, seeds in runs.items():
        rows = []
        for per_seed in zip(*seeds):
            row = {"bucket": per_seed[0]["bucket"], "sentences": per_seed[0]["sentences"],
                   "seeds": len(per_seed)}
            for key in METRICS:
                values = [r[key] for r in per_seed if r[key] is not None]
                if not values:  # an empty bucket
                    row[key] = None
                    continue
                row[key] = {"mean": statistics.fmean(values), "min": min(values),
                            "max": max(values),
                            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                            "per_seed": values}
            for key in COUNTS:
                row[key] = [r.get(key) for r in per_seed]
            row["starts_further_in"] = [r.get("starts_further_in") for r in per_seed]
            row["median_start"] = [r.get("median_start") for r in per_seed]
            rows.append(row)
        summary[name] = rows
    return summary


def _spread(cell, fmt):
    if cell is None:
        return "–"
    text = fmt.format(cell["mean"])
    if len(cell["per_seed"]) > 1:
        text += f" ({fmt.format(cell['min'])}–{fmt.format(cell['max'])})"
    return text


def _counts(row, key):
    counts = row[key]
    if any(c is None for c in counts):
        return "–"
    text = ", ".join(str(c) for c in counts) + f" of {row['sentences']}"
    if key == "starts_at_start" and len(counts) == 1 and row["median_start"][0] is not None:
        text += (f" ({100 * row['median_start'][0]:.0f} % in, "
                 f"{row['starts_further_in'][0]} found)")
    return text


def markdown_tables(summary, N, bounds=None):
    """One table per figure: a row per model, a column per bucket; ``mean (min–max)`` over
    seeds, counts listed seed by seed."""
    header = bucket_names(N, bounds or length_buckets(N))
    seeds = max((row["seeds"] for rows in summary.values() for row in rows), default=1)
    over = f", mean (min–max) over {seeds} seeds" if seeds > 1 else ""
    titles = {"bleu": f"BLEU{over}", "chrf": f"chrF{over}",
              "length_ratio": f"output/reference length{over}",
              "starts_at_start": "output starts with the source's first two words"
                                 + (" (seed by seed)" if seeds > 1 else
                                    " (else: median start, where found)"),
              "ends_at_end": "output ends with the source's last two words"
                             + (" (seed by seed)" if seeds > 1 else "")}
    lines = []
    for key, title in titles.items():
        lines += [f"| {title} | " + " | ".join(header) + " |", "|---|" + "---:|" * len(header)]
        for name, rows in summary.items():
            cells = [_spread(r[key], METRICS[key]) if key in METRICS else _counts(r, key)
                     for r in rows]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _number(value, fmt):
    return "" if value is None else fmt.format(value)


def write_csv(path, runs, summary):
    """Per model, bucket and seed the figures, then per model and bucket their mean, min,
    max and std over seeds (``seed`` = ``all``)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "seed", "bucket", "sentences", "statistic", "bleu", "chrf",
                    "length_ratio", "starts_at_start", "starts_further_in", "median_start",
                    "ends_at_end"])
        for name, seeds in runs.items():
            for seed, rows in seeds.items():
                for r in rows:
                    w.writerow([name, seed, r["bucket"], r["sentences"], "value",
                                _number(r["bleu"], "{:.2f}"), _number(r["chrf"], "{:.2f}"),
                                _number(r["length_ratio"], "{:.3f}"),
                                r.get("starts_at_start", ""), r.get("starts_further_in", ""),
                                _number(r.get("median_start"), "{:.3f}"),
                                r.get("ends_at_end", "")])
        for name, rows in summary.items():
            for r in rows:
                for stat in ("mean", "min", "max", "std"):
                    w.writerow([name, "all", r["bucket"], r["sentences"], stat] + [
                        _number(r[key] and r[key][stat], fmt)
                        for key, fmt in (("bleu", "{:.2f}"), ("chrf", "{:.2f}"),
                                         ("length_ratio", "{:.3f}"))] + ["", "", "", ""])


def pyplot():
    """matplotlib's ``pyplot`` drawing to files (Agg), or ``None`` (said on stderr) where
    matplotlib is not installed."""
    try:
        logging.getLogger("matplotlib").setLevel(logging.WARNING)  # the root logger may be DEBUG
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return None
    return plt


def plot(path, summary, N, title, bounds=None):
    """BLEU by bucket, one line per model (the mean), the min–max over seeds as error bars."""
    plt = pyplot()
    if plt is None:
        return
    header = bucket_names(N, bounds or length_buckets(N))
    fig, ax = plt.subplots(figsize=(8.5, 4.0))
    colors = plt.get_cmap("tab20").colors  # more models than the default cycle's 10 colours
    for k, (name, rows) in enumerate(summary.items()):
        x = [i + 0.03 * (k - len(summary) / 2) for i in range(len(rows))]  # apart, not hidden
        cells = [r["bleu"] or {"mean": float("nan"), "min": float("nan"),
                               "max": float("nan")} for r in rows]  # nan: an empty bucket
        mean = [c["mean"] for c in cells]
        spread = [[c["mean"] - c["min"] for c in cells], [c["max"] - c["mean"] for c in cells]]
        ax.errorbar(x, mean, yerr=spread, marker="os^Dv"[k % 5], capsize=3, label=name,
                    color=colors[(2 * k) % 20 + (k // 10) % 2])
    ax.axvspan(-0.3, 0.3, color="grey", alpha=0.15, label=f"training lengths (<= N={N})")
    ax.set_xticks(range(len(header)), header)
    ax.set_xlabel("source length (tokens)")
    ax.set_ylabel("BLEU")
    ax.set_title(title)
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------ the restoration corpus


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


def write_pairs(texts, prefix, start_marker=False):
    pairs = [restoration_pair(t) for t in texts]
    marker = START + " " if start_marker else ""
    Path(f"{prefix}.src").write_text("".join(marker + p[0] + "\n" for p in pairs))
    Path(f"{prefix}.tgt").write_text("".join(p[1] + "\n" for p in pairs))
    return len(pairs)


def bucket_stretches(stream, N, per_bucket, rng, what):
    """``per_bucket`` stretches of each bucket of :func:`length_buckets`, interleaved along ``stream``
    (bucket by bucket, then again), their lengths drawn from ``rng``; a ``SystemExit`` naming
    ``what`` when the text is too short."""
    lengths = []
    for _ in range(per_bucket):
        lengths += [rng.randint(low, high) for low, high in length_buckets(N)]
    found = stretches(stream, lengths)
    if len(found) < len(lengths):
        raise SystemExit(f"the {what} holds only {len(found)} of the {len(lengths)} stretches "
                         "asked for: lower --per-bucket or --N")
    return found


def build_data(train_lines, test_lines, out, N, per_bucket, seed, split_punctuation, vocab,
               start_marker=False, valid_per_bucket=None):
    """``text/{train,valid,test}.{src,tgt}`` and their binaries in ``out``; ``(training pairs,
    test pairs)``. The test stretches (``per_bucket`` a bucket) come from the test text; the
    validation stretches (``valid_per_bucket`` a bucket, default ``per_bucket``: the same
    buckets as the test's) from the tail of the training text, which training never sees, and
    the training stretches (N/4 to N words) from the rest of it."""
    valid_per_bucket = per_bucket if valid_per_bucket is None else valid_per_bucket
    rng = random.Random(seed)
    text = out / "text"
    text.mkdir(parents=True, exist_ok=True)
    train_stream = tokens_of(train_lines, split_punctuation)
    # the validation text: as many words from the end as its stretches need, at a word
    needed = valid_per_bucket * sum(high for _, high in length_buckets(N)) + 1
    cut = len(train_stream)
    for _ in range(needed):
        cut -= 1
        while cut > 0 and PUNCTUATION.match(train_stream[cut]):
            cut -= 1
    if cut <= 0:
        raise SystemExit(f"the training text is too short for {valid_per_bucket} validation "
                         f"stretches a bucket at --N {N}: lower --per-bucket or --N")
    train = stretches(train_stream[:cut], iter(lambda: rng.randint(max(1, N // 4), N), None))
    rng.shuffle(train)
    write_pairs(train, text / "train", start_marker)
    valid_rng = random.Random(f"valid {seed}")  # the test lengths stay those of the seed
    write_pairs(bucket_stretches(train_stream[cut:], N, valid_per_bucket, valid_rng,
                                 "validation part of the training text"), text / "valid",
                start_marker)
    test = bucket_stretches(tokens_of(test_lines, split_punctuation), N, per_bucket, rng,
                            "test text")
    write_pairs(test, text / "test", start_marker)
    prepare(out / "bin", "src", "tgt", text / "train", text / "valid", text / "test",
            joined_dictionary=True, nwords=vocab, workers=1, overwrite=True)
    return len(train), len(test)


def read_texts(wikitext, embedded, out):
    """``(training lines, test lines, what they are)``: WikiText-2's valid and test splits, or
    (``embedded``) the corpus of Python's documentation built in ``out/embedded``; ``None``
    (after saying so) when WikiText-2 is not in ``wikitext``."""
    if embedded:
        from fairseq_alibi.cli.corpus import build_corpus

        build_corpus(out / "embedded")
        return ((out / "embedded" / "train.txt").read_text().splitlines(),
                (out / "embedded" / "test.txt").read_text().splitlines(),
                "Python documentation (fairseq_alibi.cli.corpus)")
    wikitext = Path(wikitext)
    files = [wikitext / "wiki.valid.tokens", wikitext / "wiki.test.tokens"]
    if not all(f.is_file() for f in files):
        print(f"WikiText-2 not found in {wikitext}; pass --wikitext DIR or --embedded",
              file=sys.stderr)
        return None
    return (files[0].read_text(encoding="utf-8").splitlines(),
            files[1].read_text(encoding="utf-8").splitlines(),
            "WikiText-2 (train: wiki.valid.tokens, test: wiki.test.tokens)")
