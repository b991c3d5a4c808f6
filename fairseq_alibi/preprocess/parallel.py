"""A parallel corpus given as local text files to fairseq binaries for ``--task translation``.

The input is fairseq's own layout, one sentence a line, already tokenized (words or subwords
separated by spaces)::

    PREFIX.SRC  PREFIX.TGT      for each of --trainpref, --validpref, --testpref

The files are checked first, so that the mistakes ``fairseq-preprocess`` lets through become a
one-line error naming the file, the line and the fix: a missing side, two sides whose line
counts differ (a misaligned corpus would train on shifted pairs without a word), an empty line
(a zero-length sentence, or an alignment slip), a file that is not UTF-8. The binarization is
then stock ``fairseq-preprocess`` (separate dictionaries, or one with ``--joined-dictionary``),
written to a temporary folder that becomes ``--destdir`` only when everything succeeded.

``--restoration-from FILE`` instead *makes* a parallel corpus from monolingual tokenized text
(:func:`restoration_pair`): the source is the sentence lower-cased with its punctuation removed,
the target the sentence itself: punctuation-and-case restoration, a real sequence-to-sequence
task whose output length tracks the input length (see docs/translation.md).
"""

import argparse
import functools
import logging
import random
import re
from pathlib import Path

from fairseq_alibi.preprocess.pipeline_io import (
    DataError, add_output_arguments, atomic_directory, not_utf8, refuse_existing, run_cli,
    save_json,
)

logger = logging.getLogger("fairseq_alibi.preprocess.parallel")

SPLITS = ("train", "valid", "test")

#: a token made only of punctuation (WikiText's ``@-@``, ``@,@`` and ``@.@`` included)
PUNCTUATION = re.compile(r"^(@[-,.]@|[^\w\s]+)$")


def count_lines(path: Path) -> int:
    """Lines of a UTF-8 text file; an empty (whitespace-only) line is a :class:`DataError`."""
    n = 0
    try:
        with open(path, encoding="utf-8", newline="\n") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    raise DataError(
                        f"{path}:{n} is empty: every line is one sentence of a pair; remove "
                        f"the pair from both sides (an empty line often means the two sides "
                        f"are out of step from there on)"
                    )
    except UnicodeDecodeError as e:
        raise not_utf8(path, newline="\n") from e
    return n


def check_pair(prefix, source_lang: str, target_lang: str) -> int:
    """Check that ``prefix.source_lang`` and ``prefix.target_lang`` form a parallel corpus.

    Returns the number of sentence pairs; raises :class:`DataError` for a missing side, an
    empty file, an empty line or two sides of different lengths.
    """
    paths = [Path(f"{prefix}.{lang}") for lang in (source_lang, target_lang)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise DataError(
            f"{' and '.join(missing)} not found: a parallel corpus needs both sides, "
            f"{prefix}.{source_lang} and {prefix}.{target_lang}, one sentence a line"
        )
    counts = [count_lines(p) for p in paths]
    if counts[0] != counts[1]:
        raise DataError(
            f"{paths[0]} has {counts[0]} lines but {paths[1]} has {counts[1]}: the two sides of "
            f"a parallel corpus must be aligned line by line (line n of one translates line n "
            f"of the other)"
        )
    if counts[0] == 0:
        raise DataError(f"{paths[0]} and {paths[1]} are empty")
    return counts[0]


def prepare(destdir, source_lang, target_lang, trainpref, validpref=None, testpref=None,
            joined_dictionary=False, srcdict=None, tgtdict=None, workers=1, overwrite=False,
            nwords=None, skip_existing=False, sources=None):
    """Check then binarize with ``fairseq-preprocess``; returns ``{split: pairs}`` (None when
    ``skip_existing`` left an existing ``destdir`` as it was).

    ``testpref`` may be a list of prefixes: they become the splits ``test``, ``test1``, ...
    ``sources``: what ``pairs.json`` records as each split's files (default: the prefixes; a
    caller binarizing text from a temporary folder names where that text will be).
    """
    if source_lang == target_lang:
        raise DataError(f"--source-lang and --target-lang are both {source_lang!r}: give the "
                        "two file suffixes of the corpus (PREFIX.SRC, PREFIX.TGT)")
    tests = testpref if isinstance(testpref, (list, tuple)) else [testpref]
    tests = [p for p in tests if p]
    if any("," in str(p) for p in tests):
        raise DataError(f"a test prefix contains a comma ({', '.join(map(str, tests))}): "
                        "fairseq-preprocess splits --testpref on commas; rename the files")
    prefixes = {"train": trainpref, "valid": validpref}
    # several test prefixes become fairseq's splits test, test1, test2, ... (one --testpref A,B,C)
    prefixes.update({f"test{k or ''}": p for k, p in enumerate(tests)})
    prefixes = {split: p for split, p in prefixes.items() if p}
    inputs = [f"{p}.{lang}" for p in prefixes.values() for lang in (source_lang, target_lang)]
    inputs += [d for d in (srcdict, tgtdict) if d]
    if refuse_existing(destdir, overwrite, inputs, skip_existing):
        return None
    pairs = {split: check_pair(p, source_lang, target_lang) for split, p in prefixes.items()}
    for split, n in pairs.items():
        logger.info(f"{split}: {n} sentence pairs ({prefixes[split]}.{{{source_lang},{target_lang}}})")

    from fairseq import options
    from fairseq_cli import preprocess

    with atomic_directory(destdir, overwrite, inputs) as out:
        argv = ["--source-lang", source_lang, "--target-lang", target_lang,
                "--destdir", str(out), "--workers", str(workers)]
        for split in ("train", "valid"):
            if split in prefixes:
                argv += [f"--{split}pref", str(prefixes[split])]
        if tests:
            argv += ["--testpref", ",".join(map(str, tests))]
        if joined_dictionary:
            argv.append("--joined-dictionary")
        if srcdict:
            argv += ["--srcdict", str(srcdict)]
        if tgtdict:
            argv += ["--tgtdict", str(tgtdict)]
        if nwords:  # the most frequent words; the others become <unk>
            argv += ["--nwordssrc", str(nwords), "--nwordstgt", str(nwords)]
        preprocess.main(options.get_preprocessing_parser().parse_args(argv))
        sources = sources or {split: str(p) for split, p in prefixes.items()}
        save_json(out / "pairs.json", {"source_lang": source_lang, "target_lang": target_lang,
                                       "pairs": pairs, "files": sources})
    return pairs


# ---------------------------------------------------------------- a task made from one language


def restoration_pair(line: str):
    """``(source, target)`` of punctuation-and-case restoration for one tokenized sentence.

    The target is the sentence (its tokens joined by single spaces); the source is the same
    tokens lower-cased with every punctuation token dropped. ``None`` when nothing would be
    left of the source (a line of punctuation only, or an empty one).
    """
    tokens = line.split()
    words = [t.lower() for t in tokens if not PUNCTUATION.match(t)]
    if not words:
        return None
    return " ".join(words), " ".join(tokens)


def sentences_of(text_lines, min_words=1):
    """Sentences of WikiText-style tokenized text: headings and blank lines dropped, each
    paragraph split after its `` . `` tokens."""
    for line in text_lines:
        line = line.strip()
        if not line or line.startswith("="):
            continue
        current = []
        for token in line.split():
            current.append(token)
            if token in (".", "?", "!"):
                if len(current) >= min_words:
                    yield " ".join(current)
                current = []
        if len(current) >= min_words:
            yield " ".join(current)


def write_restoration_corpus(sentences, prefix, source_lang="src", target_lang="tgt"):
    """Write ``prefix.source_lang`` / ``prefix.target_lang`` restoration pairs; returns their
    count (sentences with no word are skipped, and counted in the log)."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    written = skipped = 0
    with open(f"{prefix}.{source_lang}", "w", encoding="utf-8") as src, \
            open(f"{prefix}.{target_lang}", "w", encoding="utf-8") as tgt:
        for sentence in sentences:
            pair = restoration_pair(sentence)
            if pair is None:
                skipped += 1
                continue
            src.write(pair[0] + "\n")
            tgt.write(pair[1] + "\n")
            written += 1
    if skipped:
        logger.info(f"{prefix}: {skipped} sentences without a word skipped")
    return written


def split_restoration_corpus(text_file, out_dir, valid_fraction=0.05, test_fraction=0.05,
                             seed=1, source_lang="src", target_lang="tgt"):
    """Restoration pairs of every sentence of ``text_file``, shuffled into train/valid/test
    text files ``out_dir/{split}.{lang}``; returns ``{split: prefix}``."""
    if not Path(text_file).is_file():
        raise DataError(f"--restoration-from {text_file}: no such file; give a tokenized text "
                        "file (e.g. WikiText's wiki.train.tokens)")
    try:
        with open(text_file, encoding="utf-8") as f:
            sentences = list(sentences_of(f))
    except UnicodeDecodeError as e:
        raise not_utf8(text_file) from e
    if len(sentences) < 3:
        raise DataError(f"{text_file} has {len(sentences)} sentences: too few to split")
    random.Random(seed).shuffle(sentences)
    n_valid = max(1, int(len(sentences) * valid_fraction))
    n_test = max(1, int(len(sentences) * test_fraction))
    parts = {"valid": sentences[:n_valid], "test": sentences[n_valid: n_valid + n_test],
             "train": sentences[n_valid + n_test:]}
    out_dir = Path(out_dir)
    prefixes = {}
    for split, part in parts.items():
        prefixes[split] = out_dir / split
        write_restoration_corpus(part, prefixes[split], source_lang, target_lang)
    return prefixes


def prepare_restoration(text_file, destdir, source_lang="src", target_lang="tgt",
                        overwrite=False, skip_existing=False, **options):
    """Punctuation-and-case restoration pairs of ``text_file`` (:func:`split_restoration_corpus`),
    kept in ``DESTDIR.text/`` and binarized into ``destdir`` (``options``: :func:`prepare`'s);
    returns ``{split: pairs}``, or None when ``skip_existing`` left ``destdir`` as it was.

    The two folders are one output: both are checked before anything is written, and the text
    is written to a temporary folder that becomes ``DESTDIR.text`` only once the binaries are
    in place, so a refused or failed run changes neither."""
    destdir = Path(destdir).absolute()
    text_dir = Path(f"{destdir}.text")
    if refuse_existing(destdir, overwrite, [text_file], skip_existing):
        return None
    # its text files only: {train,valid,test}.{src,tgt} (no mark of its own)
    own = functools.partial(re.fullmatch, r"(train|valid|test)\.[^/]+")
    refuse_existing(text_dir, overwrite, [text_file], own=own)
    with atomic_directory(text_dir, overwrite, [text_file], own=own) as partial:
        prefixes = split_restoration_corpus(text_file, partial, source_lang=source_lang,
                                            target_lang=target_lang)
        return prepare(destdir, source_lang, target_lang, prefixes["train"], prefixes["valid"],
                       prefixes["test"], overwrite=overwrite,
                       sources={split: str(text_dir / split) for split in prefixes}, **options)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_alibi.preprocess.parallel", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--source-lang", "-s", default=None,
                        help="source suffix of the files (PREFIX.SRC); src with --restoration-from")
    parser.add_argument("--target-lang", "-t", default=None,
                        help="target suffix of the files (PREFIX.TGT); tgt with --restoration-from")
    parser.add_argument("--trainpref", help="train files prefix (PREFIX.SRC, PREFIX.TGT)")
    parser.add_argument("--validpref", help="valid files prefix")
    parser.add_argument("--testpref", help="test files prefix")
    parser.add_argument("--restoration-from", metavar="TEXT",
                        help="make the corpus instead: punctuation-and-case restoration pairs of "
                        "every sentence of this tokenized monolingual text (e.g. WikiText's "
                        "wiki.train.tokens), split into train/valid/test; the pairs are kept "
                        "beside --destdir in DESTDIR.text/")
    parser.add_argument("--destdir", required=True, help="output folder (fairseq's data-bin)")
    parser.add_argument("--joined-dictionary", action="store_true",
                        help="one dictionary for both sides (needed by --share-all-embeddings)")
    parser.add_argument("--srcdict", help="reuse this source dictionary (e.g. a model's)")
    parser.add_argument("--tgtdict", help="reuse this target dictionary")
    parser.add_argument("--nwords", type=int, metavar="N",
                        help="keep the N most frequent words of each dictionary (the rest is "
                        "<unk>); default: every word of the training text")
    parser.add_argument("--workers", type=int, default=1)
    add_output_arguments(parser, "a non-empty --destdir (and DESTDIR.text/)")
    args = parser.parse_args(argv)
    options = dict(joined_dictionary=args.joined_dictionary, srcdict=args.srcdict,
                   tgtdict=args.tgtdict, workers=args.workers, nwords=args.nwords)
    if args.restoration_from:
        if args.trainpref or args.validpref or args.testpref:
            raise DataError("--restoration-from makes the train/valid/test files itself: drop "
                            "--trainpref/--validpref/--testpref")
        pairs = prepare_restoration(args.restoration_from, args.destdir,
                                    args.source_lang or "src", args.target_lang or "tgt",
                                    args.overwrite, args.skip_existing, **options)
    elif not (args.source_lang and args.target_lang and args.trainpref):
        raise DataError("give --source-lang, --target-lang and --trainpref (or --restoration-from)")
    else:
        pairs = prepare(args.destdir, args.source_lang, args.target_lang, args.trainpref,
                        args.validpref, args.testpref, overwrite=args.overwrite,
                        skip_existing=args.skip_existing, **options)
    if pairs is None:
        return
    for split, n in pairs.items():
        print(f"{split}: {n} sentence pairs")
    print(f"wrote {args.destdir}")


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
