"""What the translation-length commands share: the grid's configurations (:data:`CONFIGS`), the
corpora they are trained on (restoration and gettext, plain and with a start marker, with
``data.json``), the layout of an output folder's runs, and training and decoding that reuse a
run made by the same command.

Used by :mod:`experiments.translation_length` (the grid), :mod:`experiments.translation_selection`
(``translation_length --select``) and :mod:`experiments.pointer_trace` (which reads a grid's
output folder).
"""

import json
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Tuple

from experiments.seq2seq_runs import (
    START,
    bucket_names,
    build_data,
    final_checkpoint,
    length_buckets,
    read_generate_log,
    read_texts,
    run_timed,
    same_command,
)
from fairseq_alibi.cli.fairseq_runs import thread_env
from fairseq_alibi.preprocess.parallel import prepare


# ------------------------------------------------------------------------ the configurations


SINUSOIDAL = ("--arch", "alibi_transformer", "--encoder-alibi-variant", "none",
              "--decoder-alibi-variant", "none")  # exactly stock transformer


ALIBI = ("--arch", "alibi_transformer", "--encoder-alibi-variant", "offset",
         "--decoder-alibi-variant", "causal")


POINTER = ("--cross-alibi", "pointer")


LENGTH_SCALE = ("--cross-attention-length-scale", "{mean_source}")


#: Press's slopes of the 2 biased heads (1/16, 1/256) times 16: 1 and 1/16
STEEP = ("--cross-alibi-slope-scale", "16")


#: the EOS guard's strength at decoding (``--model-overrides``), for the ``pointer`` checkpoint
EOS_GUARD = 2.0


@dataclass(frozen=True)
class Config:
    """One configuration of the grid. ``model``: options after the size, where ``{name}`` is a
    figure of the data (:func:`data_figures`); ``checkpoint_of``: decode that configuration's
    checkpoints instead of training (same seeds); ``decode_overrides``: ``--model-overrides``
    of ``fairseq-generate``."""

    what: str
    model: Tuple[str, ...] = ()
    start_marker: bool = False
    checkpoint_of: Optional[str] = None
    decode_overrides: dict = field(default_factory=dict)


CONFIGS = {
    "sinusoidal": Config("stock sinusoidal positions on both sides", SINUSOIDAL),
    "sinusoidal_shape": Config("sinusoidal, positions shifted at random in training (SHAPE)",
                               SINUSOIDAL + ("--position-shift", "{shape_shift}")),
    "alibi": Config("ALiBi self-attention (offset encoder, causal decoder), stock "
                    "cross-attention", ALIBI),
    "alibi_start": Config("alibi with a start marker before every source", ALIBI,
                          start_marker=True),
    "pointer": Config("alibi + cross-attention ALiBi around a pointer into the source",
                      ALIBI + POINTER),
    "ratio": Config("alibi + cross-attention ALiBi around i x (source/target length ratio)",
                    ALIBI + ("--cross-alibi", "ratio", "--cross-alibi-ratio", "{ratio}")),
    "length_scale": Config("alibi + cross-attention logits x log S / log (mean training "
                           "source length)", ALIBI + LENGTH_SCALE),
    "pointer_eos": Config("the pointer checkpoints decoded with the EOS guard (no training)",
                          checkpoint_of="pointer",
                          decode_overrides={"cross_alibi_eos_guard": EOS_GUARD}),
    "pointer_steep": Config("pointer with 16 times the slopes (1 and 1/16 on the 2 biased "
                            "heads)", ALIBI + POINTER + STEEP),
    "recommended": Config("the pointer_steep checkpoints decoded with the EOS guard",
                          checkpoint_of="pointer_steep",
                          decode_overrides={"cross_alibi_eos_guard": EOS_GUARD}),
    "pointer_all": Config("pointer (Press's slopes) + length scale + start marker, decoded "
                          "with the EOS guard", ALIBI + POINTER + LENGTH_SCALE,
                          start_marker=True,
                          decode_overrides={"cross_alibi_eos_guard": EOS_GUARD}),
}


# ---------------------------------------------------------------------------------- the data


def pair_lengths(prefix, langs):
    """Tokens per line of the source and the target side of ``prefix``."""
    return [[len(line.split()) for line in Path(f"{prefix}.{lang}").read_text().splitlines()]
            for lang in langs]


def data_figures(text_dir, N, langs):
    """What the data-dependent options use, from the training pairs as the model sees them:
    ``ratio`` (source tokens per target token), ``mean_source`` (mean source length, its EOS
    included: the encoder's length S) and ``shape_shift`` (8N: a shift that covers the longest
    test bucket)."""
    sources, targets = pair_lengths(text_dir / "train", langs)
    return {"ratio": round(sum(sources) / sum(targets), 4),
            "mean_source": round(sum(sources) / len(sources) + 1, 2),
            "shape_shift": 8 * N}


def add_start_marker(text_dir, marked_dir, langs):
    """A copy of the text of every split with :data:`START` before each source line (a corpus
    built without validation buckets has no ``valid``)."""
    marked_dir.mkdir(parents=True, exist_ok=True)
    source, target = langs
    for split in ("train", "valid", "test"):
        if split == "valid" and not (text_dir / f"{split}.{source}").is_file():
            continue
        lines = (text_dir / f"{split}.{source}").read_text(encoding="utf-8").splitlines()
        (marked_dir / f"{split}.{source}").write_text(
            "".join(f"{START} {line}\n" for line in lines), encoding="utf-8")
        shutil.copy(text_dir / f"{split}.{target}", marked_dir / f"{split}.{target}")


#: restoration's joined dictionary, as experiments/punctuation_restoration.py's default
RESTORATION_VOCAB = 1000


def build_restoration(data, args):
    """WikiText-2 (or Python's documentation) as punctuation and case restoration, with
    ``--vocab`` words (default :data:`RESTORATION_VOCAB`; the rest ``<unk>``)."""
    vocab = args.vocab or RESTORATION_VOCAB
    texts = read_texts(args.wikitext, args.embedded, data)
    if texts is None:
        raise SystemExit(2)
    train_lines, test_lines, source = texts
    n_train, n_test = build_data(
        train_lines, test_lines, data / "plain", args.N, args.per_bucket, args.data_seed,
        split_punctuation=args.embedded, vocab=vocab)
    return {"text": source, "train_pairs": n_train, "test_pairs": n_test,
            "langs": ["src", "tgt"], "plain_text": "plain/text", "vocab": vocab}


GETTEXT_LANG = "fr"


#: gettext's joined dictionary: the most frequent tokens, most of the text for a fraction of the
#: softmax of all of them (coverage and cost in docs/translation.md)
GETTEXT_VOCAB = 8000


def build_gettext(data, args):
    """French→English from the machine's gettext catalogs, by the corpus's own tool (its text
    lies beside its binaries), with ``--vocab`` tokens (default :data:`GETTEXT_VOCAB`)."""
    vocab = args.vocab or GETTEXT_VOCAB
    cmd = [sys.executable, "-m", "fairseq_alibi.preprocess.gettext", "--lang", GETTEXT_LANG,
           "--out", data / "plain" / "bin", "--N", args.N, "--per-bucket", args.per_bucket,
           "--seed", args.data_seed, "--nwords", vocab]
    # a confirmation split (experiments.translation_selection): no validation buckets, after
    # an earlier build's test and validation pairs
    for flag in ("valid_per_bucket", "skip_per_bucket", "min_per_bucket"):
        if getattr(args, flag, None) is not None:
            cmd += [f"--{flag.replace('_', '-')}", getattr(args, flag)]
    if args.smoke:  # a few inputs per bucket are enough to run every step
        cmd += ["--min-per-bucket", 1]
    run_timed(cmd, thread_env(1), data / "gettext.log")
    stats = json.loads((data / "plain" / "bin" / "stats.json").read_text())
    return {"text": f"gettext catalogs, {GETTEXT_LANG} -> en "
                    f"({len(stats['catalogs_used'])} catalogs)",
            "train_pairs": stats["splits"]["train"], "test_pairs": stats["splits"]["test"],
            "langs": [GETTEXT_LANG, "en"], "plain_text": "plain/bin", "vocab": vocab}


def build(data, args):
    """Build the corpus into ``data``: ``plain/{text,bin}``, ``marked/{text,bin}`` (the start
    marker, the same pairs) and ``data.json``; in a temporary folder renamed at the end."""
    if data.exists() and any(data.iterdir()):
        raise SystemExit(f"{data} exists but holds no data.json (not data this script built): "
                         "give another --data or --out, or remove it")
    partial = data.with_name(data.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    started = time.time()
    described = (build_gettext if args.corpus == "gettext" else build_restoration)(partial, args)
    langs = described["langs"]
    add_start_marker(partial / described["plain_text"], partial / "marked" / "text", langs)
    text = partial / "marked" / "text"
    valid = text / "valid" if (text / f"valid.{langs[0]}").is_file() else None
    prepare(partial / "marked" / "bin", *langs, text / "train", valid, text / "test",
            joined_dictionary=True, nwords=described["vocab"] + 1, workers=1,
            overwrite=True)  # + 1: the marker takes a word of its own
    meta = dict(described, corpus=args.corpus, N=args.N, per_bucket=args.per_bucket,
                data_seed=args.data_seed, skip_per_bucket=getattr(args, "skip_per_bucket", None),
                figures={"plain": data_figures(partial / described["plain_text"], args.N, langs),
                         "marked": data_figures(text, args.N, langs)},
                built_in_s=round(time.time() - started, 1))
    (partial / "data.json").write_text(json.dumps(meta, indent=2) + "\n")
    if data.exists():
        data.rmdir()  # empty (checked above)
    partial.rename(data)
    return meta


def load_data(data):
    meta_file = data / "data.json"
    if not meta_file.is_file():
        raise SystemExit(f"{data} holds no data.json: build it with --data-only --data {data}")
    return json.loads(meta_file.read_text())


def test_sources(data, meta, split="test"):
    """The sources of ``split`` (``test``, or ``valid``: the validation buckets) as written (no
    marker): what the buckets are counted on."""
    sources = data / meta["plain_text"] / f"{split}.{meta['langs'][0]}"
    return sources.read_text(encoding="utf-8").splitlines()


# ---------------------------------------------------------------------------------- the runs


def run_dir(out, name, seed):
    return out / "runs" / name / f"seed{seed}"


def variant(config):
    return "marked" if config.start_marker else "plain"


def data_bin(data, config):
    return data / variant(config) / "bin"


def train_once(label, where, cmd, env, max_update):
    """Run the ``fairseq-train`` command ``cmd`` with its log and record in ``where``, unless
    this very command already did (its checkpoint still there); the record (command, wall and
    CPU time, checkpoint)."""
    cmd = [str(c) for c in cmd]
    where.mkdir(parents=True, exist_ok=True)
    record_file = where / "train.json"
    if record_file.is_file():
        record = json.loads(record_file.read_text())
        if same_command(record["command"], cmd) and Path(record["checkpoint"]).is_file():
            print(f"[translation_length] {label}: trained before, reused", flush=True)
            return record
    _, wall, cpu = run_timed(cmd, env, where / "train.log")
    record = {"command": cmd, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
              "checkpoint": str(final_checkpoint(where / "checkpoints", max_update, label))}
    record_file.write_text(json.dumps(record, indent=2) + "\n")
    print(f"[translation_length] {label}: trained in {wall:.0f} s ({cpu:.0f} CPU-s)", flush=True)
    return record


def generate_once(label, log, cmd, env, expected, reuse=False, subset="test"):
    """Run the ``fairseq-generate`` command ``cmd`` into ``log`` (its record beside it, with the
    suffix ``.json``) and check that every one of the ``expected`` inputs was translated; with
    ``reuse``, a log of this very command that passes the check is kept instead. The record."""
    cmd = [str(c) for c in cmd]
    record_file = log.with_suffix(".json")
    if reuse and record_file.is_file() and log.is_file():
        record = json.loads(record_file.read_text())
        if record.get("command") == cmd:
            read_generate_log(label, log.read_text(), log, expected)
            return record
    log.parent.mkdir(parents=True, exist_ok=True)
    output, wall, cpu = run_timed(cmd, env, log)
    read_generate_log(label, output, log, expected)  # every input translated
    record = {"command": cmd, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}
    record_file.write_text(json.dumps(record, indent=2) + "\n")
    print(f"[translation_length] {label}: translated all {expected} {subset} inputs in "
          f"{wall:.0f} s "
          f"({cpu:.0f} CPU-s)", flush=True)
    return record


def in_parallel(jobs, tasks):
    """Run the callables in ``tasks``, ``jobs`` at a time; their results in order."""
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return [f.result() for f in [pool.submit(task) for task in tasks]]


def kept_table(runs, N):
    """BLEU of each longer bucket ÷ the same run's BLEU in range (N/2, N], per seed, as the
    mean (min–max) over seeds: the figure of "train short, test long"."""
    header = bucket_names(N, length_buckets(N))
    lines = ["| BLEU kept (÷ the run's BLEU in " + header[0] + ") | " + " | ".join(header[1:])
             + " |", "|---|" + "---:|" * (len(header) - 1)]
    for name, seeds in runs.items():
        cells = []
        for b in range(1, len(header)):
            kept = [rows[b]["bleu"] / rows[0]["bleu"] for rows in seeds.values()
                    if rows[0]["bleu"] and rows[b]["bleu"] is not None]
            cells.append(f"{statistics.fmean(kept):.0%} ({min(kept):.0%}–{max(kept):.0%})"
                         if kept else "–")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
