"""The Pile (or any corpus in its format) to fairseq binaries, one document per sample.

Input: ``.jsonl`` or ``.jsonl.zst`` shards of ``{"text": ..., "meta": {"pile_set_name": ...}}``,
read as a stream (a 14 GB shard is never held in memory) and encoded on ``--workers``
processes. Output, in ``--destdir``:

* ``dict.txt`` and, for ``--train-sentencepiece``, ``spm.model``/``spm.vocab``;
* ``train.{bin,idx}``, ``train1``, ``train2``, ... one per ``--train`` shard (fairseq's
  language_modeling and masked_lm tasks load ``train``, ``train1``, ... as one split);
  ``valid`` and ``test`` from all their files;
* ``stats.json``: documents kept, filtered, empty, dropped or truncated, per split, with the
  length histogram that is also printed.

Each document is one line of the binarized text: its BPE tokens (newlines included, so its blank
lines too: never an empty line inside it; the whitespace at its start and end is stripped, as
fairseq's ``multiprocessing_bpe_encoder`` strips each line) and ``</s>``. ``--subsets`` keeps
only documents whose ``meta.pile_set_name`` is listed.

Documents. By default documents follow one another (one ``</s>`` each, so
``--alibi-document-mask eos`` already splits at documents). With ``--document-breaks`` an empty
line (a lone ``</s>``) follows every document, in every shard, so
``--sample-break-mode complete_doc`` and ``--alibi-document-mask doc`` split at documents. It is
opt-in: it adds a token per document to the stream the configs were written for, and the
masked-LM configs' ``--sample-break-mode complete`` would pack the empty lines into its samples.

Long documents. masked_lm with ``sample_break_mode complete`` makes a sample of ``<s>`` plus
whole documents, so a document fits in ``--tokens-per-sample L`` when its tokens and ``</s>``
are at most ``L - 1``. ``--long-docs`` decides what happens to longer ones: ``drop`` (the
default: what the ALiBi/CLAP RoBERTa study did, about 1/7 of the Pile's documents at L=2048),
``truncate`` (keep the first ``L - 2`` tokens and ``</s>``: exactly ``L`` with ``<s>``), or
``keep``. The causal LM packs documents into a stream, so it needs no ``--tokens-per-sample``.
"""

import argparse
import json
import logging
import re
from collections import Counter
from pathlib import Path

import numpy as np

from fairseq_alibi.preprocess.encoders import (
    NEWLINE,
    SentencePieceEncoder,
    add_encoder_arguments,
    encoder_from_args,
    train_sentencepiece,
)
from fairseq_alibi.preprocess.pipeline_io import (
    DataError,
    IndexedWriter,
    add_output_arguments,
    atomic_directory,
    read_batches,
    refuse_existing,
    run_cli,
    save_json,
)
from fairseq_alibi.preprocess.process_pool import ordered_map, worker_state

logger = logging.getLogger("fairseq_alibi.preprocess.pile")

#: the 22 ``pile_set_name`` values of the Pile (Gao et al. 2020), to catch typos in --subsets
PILE_SETS = (
    "ArXiv", "BookCorpus2", "Books3", "DM Mathematics", "Enron Emails", "EuroParl",
    "FreeLaw", "Github", "Gutenberg (PG-19)", "HackerNews", "NIH ExPorter", "OpenSubtitles",
    "OpenWebText2", "PhilPapers", "Pile-CC", "PubMed Abstracts", "PubMed Central",
    "StackExchange", "USPTO Backgrounds", "Ubuntu IRC", "Wikipedia (en)", "YoutubeSubtitles",
)

LONG_DOC_POLICIES = ("drop", "truncate", "keep")

#: histogram bins: documents of 1-64 tokens, 65-128, ... (powers of two), plus L - 1
_POWER_EDGES = [2**k for k in range(6, 41)]


def parse_document(path, lineno, line, subsets=None):
    """The text of one JSON line, or None when ``subsets`` filters it out (or it is blank)."""
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        reason = re.sub(r"( starting)? at$", "", e.msg)  # json's own messages end in "at"
        raise DataError(f"{path}:{lineno}: not valid JSON ({reason} at column {e.colno})") from e
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise DataError(
            f'{path}:{lineno}: expected an object with a string "text" field, got '
            f"{line.strip()[:80]!r}"
        )
    if subsets is not None:
        meta = record.get("meta")
        name = meta.get("pile_set_name") if isinstance(meta, dict) else None
        if not isinstance(name, str):
            raise DataError(
                f'{path}:{lineno}: no "meta": {{"pile_set_name": ...}} to filter --subsets on'
            )
        if name not in subsets:
            return None
    return record["text"]


class SplitStats:
    """Counts and the length histogram of one output split."""

    def __init__(self, limit=None):
        self.limit = limit  # most tokens (with </s>) a document may have, or None
        edges = set(_POWER_EDGES) | ({limit} if limit else set())
        self.edges = np.array(sorted(edges), dtype=np.int64)
        self.histogram = np.zeros(len(self.edges) + 1, dtype=np.int64)
        self.counts = Counter()
        self.max_length = 0

    def add(self, lengths, counts):
        if len(lengths):
            bins = np.searchsorted(self.edges, lengths, side="left")
            self.histogram += np.bincount(bins, minlength=len(self.histogram))
            self.max_length = max(self.max_length, int(lengths.max()))
        self.counts.update(counts)

    def rows(self):
        """``(low, high, documents)`` for the non-empty bins, lengths inclusive."""
        lows = np.concatenate([[1], self.edges + 1])
        highs = np.concatenate([self.edges, [np.iinfo(np.int64).max]])
        return [(int(lo), int(hi), int(n))
                for lo, hi, n in zip(lows, highs, self.histogram) if n]

    def report(self, name, policy):
        total = int(self.histogram.sum())
        lines = [f"{name}: {total} documents, {self.counts['tokens']} tokens kept, "
                 f"longest {self.max_length} tokens (with </s>)"]
        lines.append(f"  {'tokens (with </s>)':>22} {'documents':>12} {'share':>7} {'cumul.':>7}")
        cumulative = 0
        for lo, hi, n in self.rows():
            cumulative += n
            span = f"{lo}-{hi}" if hi < 2**62 else f">={lo}"
            lines.append(f"  {span:>22} {n:>12} {100 * n / total:6.2f}% "
                         f"{100 * cumulative / total:6.2f}%")
        if self.limit:
            longer = self.counts["longer"]
            lines.append(
                f"  over {self.limit} tokens (so over L = {self.limit + 1} with <s>): {longer} "
                f"documents ({100 * longer / max(total, 1):.2f}%), {policy}: "
                f"{self.counts['dropped']} dropped, {self.counts['truncated']} truncated"
            )
        for what in ("filtered", "empty"):
            if self.counts[what]:
                lines.append(f"  skipped {self.counts[what]} {what} documents")
        return "\n".join(lines)

    def to_json(self):
        return {"documents": int(self.histogram.sum()), "max_length": self.max_length,
                "counts": dict(self.counts),
                "histogram": [{"min": lo, "max": hi, "documents": n} for lo, hi, n in self.rows()]}


def _encode_documents(batch):
    path, first, lines = batch
    state = worker_state()
    encoder, limit, policy = state["encoder"], state["limit"], state["policy"]
    eos = encoder.dictionary.eos()
    documents, lengths, counts = [], [], Counter()
    for lineno, line in enumerate(lines, start=first):
        text = parse_document(path, lineno, line, state["subsets"])
        if text is None:
            counts["filtered"] += bool(line.strip())
            continue
        if not text.strip():
            counts["empty"] += 1
            continue
        ids = encoder.encode(text)
        lengths.append(len(ids))
        if limit and len(ids) > limit:
            counts["longer"] += 1
            if policy == "drop":
                counts["dropped"] += 1
                continue
            if policy == "truncate":
                ids = np.append(ids[: limit - 1], eos)
                counts["truncated"] += 1
        counts["tokens"] += len(ids)
        documents.append(ids)
    return documents, np.array(lengths, dtype=np.int64), counts


def binarize_documents(paths, encoder, prefix, stats, workers=1, subsets=None, policy="drop",
                       document_breaks=False):
    """Encode the documents of ``paths`` into ``<prefix>.{bin,idx}``, counting into ``stats``;
    with ``document_breaks`` an empty line (a lone ``</s>``) after each."""
    writer = IndexedWriter(prefix, len(encoder.dictionary), unk=encoder.dictionary.unk())
    empty_line = np.array([encoder.dictionary.eos()], dtype=np.int64)
    state = {"encoder": encoder, "limit": stats.limit, "policy": policy, "subsets": subsets}

    def batches():
        for path in paths:
            yield from read_batches(path, batch_lines=256, desc=Path(path).name)

    seen = Counter()
    for documents, lengths, counts in ordered_map(_encode_documents, batches(), workers, state):
        for ids in documents:
            writer.add(ids)
            if document_breaks:
                writer.add(empty_line)
        if document_breaks:  # the break's </s> is a token of the split too, as WikiText's
            counts["tokens"] += len(documents)
        stats.add(lengths, counts)
        seen.update(counts)
    stats.counts["unk"] += writer.unk  # a tokenization and dictionary that match have none
    writer.finalize(
        f"no document left in {', '.join(map(str, paths))}: {seen['filtered']} not in "
        f"--subsets, {seen['empty']} empty, {seen['dropped']} longer than "
        "--tokens-per-sample allows"
    )


def sample_lines(paths, documents, subsets=None):
    """The lines of the first ``documents`` documents of ``paths`` (sentencepiece training)."""
    seen = 0
    for path in paths:
        for _, first, lines in read_batches(path, desc=f"sample {Path(path).name}"):
            for lineno, line in enumerate(lines, start=first):
                text = parse_document(path, lineno, line, subsets)
                if text is None or not text.strip():
                    continue
                yield from (s for s in text.replace(NEWLINE, " ").split("\n") if s.strip())
                seen += 1
                if seen == documents:
                    return


def prepare(destdir, train, valid=(), test=(), encoder=None, train_sentencepiece_vocab=None,
            sentencepiece_sample=100_000, subsets=None, tokens_per_sample=None,
            long_docs="drop", workers=1, overwrite=False, document_breaks=False,
            skip_existing=False):
    """Binarize Pile-format shards into ``destdir``; returns ``{split: SplitStats}`` (None when
    ``skip_existing`` left an existing ``destdir`` as it was).

    ``document_breaks``: an empty line after every document (module docstring)."""
    inputs = [*train, *valid, *test, *(encoder.inputs if encoder is not None else ())]
    if refuse_existing(destdir, overwrite, inputs, skip_existing):
        return None
    for path in [*train, *valid, *test]:
        if not Path(path).exists() or Path(path).is_dir():  # a pipe is fine: it is streamed
            raise DataError(f"input shard not found: {path}")
    if train_sentencepiece_vocab and not all(Path(p).is_file() for p in train):
        raise DataError("--train-sentencepiece reads the training shards twice (sample, then "
                        "encode): give files, not pipes")
    if long_docs not in LONG_DOC_POLICIES:
        raise DataError(f"--long-docs must be one of {', '.join(LONG_DOC_POLICIES)}")
    if tokens_per_sample is not None and tokens_per_sample < 3:
        raise DataError("--tokens-per-sample must leave room for <s>, a token and </s> (>= 3)")
    if subsets is not None:
        subsets = frozenset(subsets)
        unknown = sorted(subsets - set(PILE_SETS))
        if unknown:
            logger.warning(f"not a Pile subset name: {unknown}; known: {', '.join(PILE_SETS)}")
    limit = tokens_per_sample - 1 if tokens_per_sample else None
    outputs = [(("train" + (str(i) if i else "")), [p]) for i, p in enumerate(train)]
    outputs += [(split, list(paths)) for split, paths in (("valid", valid), ("test", test))
                if paths]

    with atomic_directory(destdir, overwrite, inputs) as out:
        if train_sentencepiece_vocab:
            model = train_sentencepiece(
                sample_lines(train, sentencepiece_sample, subsets), out / "spm",
                train_sentencepiece_vocab,
            )
            encoder = SentencePieceEncoder(model)
        if encoder is None:
            raise DataError("choose a tokenization: --gpt2-bpe, --sentencepiece or "
                            "--train-sentencepiece")
        encoder.dictionary.save(str(out / "dict.txt"))
        stats = {}
        for name, paths in outputs:
            split = "train" if name.startswith("train") else name
            stats.setdefault(split, SplitStats(limit))
            binarize_documents(paths, encoder, out / name, stats[split], workers, subsets,
                               long_docs, document_breaks)
        save_json(out / "stats.json", {
            "inputs": {name: [str(p) for p in paths] for name, paths in outputs},
            "subsets": sorted(subsets) if subsets else None,
            "tokens_per_sample": tokens_per_sample, "long_docs": long_docs,
            "document_breaks": bool(document_breaks),
            "splits": {split: s.to_json() for split, s in stats.items()},
        })
    return stats


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_alibi.preprocess.pile", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--train", nargs="+", required=True, metavar="SHARD",
                        help=".jsonl or .jsonl.zst shards; each becomes train, train1, ...")
    parser.add_argument("--valid", nargs="*", default=[], metavar="FILE")
    parser.add_argument("--test", nargs="*", default=[], metavar="FILE")
    parser.add_argument("--destdir", required=True)
    parser.add_argument("--subsets", nargs="+", metavar="NAME",
                        help='keep only these meta.pile_set_name values, e.g. "Pile-CC" '
                        '"Wikipedia (en)"')
    parser.add_argument("--tokens-per-sample", type=int, metavar="L",
                        help="the masked LM's sample length: documents longer than L - 1 "
                        "tokens (with </s>) are handled by --long-docs")
    parser.add_argument("--long-docs", choices=LONG_DOC_POLICIES, default="drop",
                        help="what to do with documents that do not fit L (default: drop, "
                        "as the ALiBi/CLAP RoBERTa study)")
    parser.add_argument(
        "--document-breaks", action="store_true",
        help="an empty line (a lone </s>) after every document, so --sample-break-mode "
        "complete_doc and --alibi-document-mask doc split at documents (default: documents "
        "follow one another, the stream the configs were written for; --alibi-document-mask "
        "eos splits that at documents)")
    parser.add_argument("--sentencepiece-sample", type=int, default=100_000, metavar="DOCS",
                        help="train sentencepiece on the first DOCS documents of --train")
    parser.add_argument("--workers", type=int, default=1)
    add_output_arguments(parser)
    add_encoder_arguments(parser, sentencepiece_training=True)
    args = parser.parse_args(argv)
    encoder = encoder_from_args(args, required=not args.train_sentencepiece)
    stats = prepare(
        args.destdir, args.train, args.valid, args.test, encoder, args.train_sentencepiece,
        args.sentencepiece_sample, args.subsets, args.tokens_per_sample, args.long_docs,
        args.workers, args.overwrite, args.document_breaks, args.skip_existing,
    )
    if stats is None:
        return
    for split, s in stats.items():
        print(s.report(split, args.long_docs))
    print(f"wrote {args.destdir}")


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
