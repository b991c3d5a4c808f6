"""WikiText-103 (or WikiText-2) to fairseq binaries.

Word level (the default) is what the ALiBi paper and fairseq's language-model example run::

    fairseq-preprocess --only-source --trainpref wiki.train.tokens --validpref wiki.valid.tokens \\
        --testpref wiki.test.tokens --destdir data-bin/wikitext-103

and the output is byte-identical to it (``dict.txt``, ``{train,valid,test}.{bin,idx}``): the
dictionary is every word of the training split (plus fairseq's specials, padded to a multiple
of 8), every line is a sample ending in ``</s>``. With ``--gpt2-bpe DIR`` (and ``--raw`` for the
``wiki.*.raw`` files) the text is GPT-2 BPE encoded and binarized with fairseq's GPT-2
``dict.txt``, as fairseq's RoBERTa pretraining tutorial does; that feeds the masked-LM configs.

Documents. By default the files are binarized as they are, so the output stays byte-identical
to the command above (and to the token stream every published WikiText-103 result counts):
WikiText's own blank lines, before and after every heading (an article's and a section's), are
empty lines, so ``--sample-break-mode complete_doc`` and ``--alibi-document-mask doc`` split at
every heading (each heading line, and each section's paragraphs, is a document of its own).
With ``--document-breaks`` one empty line separates two articles (an article opens at its
`` = Title = `` heading, one ``=`` a side, with a blank line before and after it;
`` = = Section = = `` lines are inside it) and there is none inside one (every blank line of
the files is dropped), so ``complete_doc`` and ``doc`` split at articles. The dictionary is the
same either way; the token stream is not (fewer ``</s>``), so perplexities of the two are not
comparable.

``--download`` fetches WikiText-103 when the files are not in ``--text-dir`` yet.
"""

import argparse
import logging
import re
import shutil
import tempfile
import urllib.request
import zipfile
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator, Optional

from fairseq_alibi.preprocess.encoders import (
    EOS_WORD,
    WordEncoder,
    add_encoder_arguments,
    dictionary_from_counts,
    encoder_from_args,
)
from fairseq_alibi.preprocess.pipeline_io import (
    DataError,
    IndexedWriter,
    add_output_arguments,
    atomic_directory,
    progress_bar,
    read_batches,
    refuse_existing,
    run_cli,
    save_json,
)
from fairseq_alibi.preprocess.process_pool import ordered_map, worker_state

logger = logging.getLogger("fairseq_alibi.preprocess.wikitext")

SPLITS = ("train", "valid", "test")

#: where WikiText-103 can be downloaded, tried in order (the second is fairseq's original link)
URLS = {
    "tokens": [
        "https://wikitext.smerity.com/wikitext-103-v1.zip",
        "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip",
    ],
    "raw": [
        "https://wikitext.smerity.com/wikitext-103-raw-v1.zip",
        "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-raw-v1.zip",
    ],
}


def text_files(text_dir, raw=False):
    """``{split: path}`` of ``wiki.{train,valid,test}.{tokens|raw}`` in ``text_dir``."""
    ext = "raw" if raw else "tokens"
    return {split: Path(text_dir) / f"wiki.{split}.{ext}" for split in SPLITS}


def download(text_dir, raw=False, urls=None):
    """Fetch a WikiText zip (the first of ``urls`` that answers) and extract its three splits."""
    text_dir = Path(text_dir)
    wanted = {p.name: p for p in text_files(text_dir, raw).values()}
    urls = urls or URLS["raw" if raw else "tokens"]
    made = not text_dir.exists()  # removed again if nothing comes of it
    text_dir.mkdir(parents=True, exist_ok=True)
    try:
        _fetch(text_dir, wanted, urls)
    except BaseException:
        if made and not any(text_dir.iterdir()):
            text_dir.rmdir()
        raise
    logger.info(f"extracted {', '.join(sorted(wanted))} into {text_dir}")


def _fetch(text_dir: Path, wanted: dict, urls) -> None:
    """:func:`download`'s work: the first of ``urls`` that answers, extracted into
    ``text_dir`` (each of ``wanted`` whole or not at all)."""
    failures = []
    with tempfile.TemporaryDirectory(prefix=".download-", dir=text_dir) as tmp:
        archive = Path(tmp) / "wikitext.zip"
        source = None
        for url in urls:
            try:
                with urllib.request.urlopen(url, timeout=60) as response, open(archive, "wb") as f:
                    size = response.headers.get("Content-Length")
                    bar = progress_bar(total=int(size) if size else None, desc="download")
                    while chunk := response.read(1 << 20):
                        f.write(chunk)
                        bar.update(len(chunk))
                    bar.close()
                source = url
                break
            except OSError as e:  # URLError, HTTPError, timeouts are all OSError
                failures.append(f"{url}: {e}")
        else:
            raise DataError(
                "could not download WikiText:\n  " + "\n  ".join(failures)
                + f"\nDownload and unzip it yourself, then pass --text-dir (prepare.sh: "
                f"WIKITEXT=) a folder with the files {', '.join(sorted(wanted))}"
            )
        try:
            with zipfile.ZipFile(archive) as z:
                members = {Path(m).name: m for m in z.namelist() if Path(m).name in wanted}
                missing = sorted(set(wanted) - set(members))
                if missing:
                    raise DataError(f"{source} holds no {', '.join(missing)}")
                for name, member in members.items():  # all extracted before any is moved
                    with z.open(member) as src, open(Path(tmp) / name, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
        except zipfile.BadZipFile as e:
            raise DataError(f"{source} is not a zip archive ({e})") from e
        moved = []
        try:  # the three splits appear together or not at all
            for name, path in wanted.items():
                (Path(tmp) / name).rename(path)
                moved.append(path)
        except BaseException:
            for path in moved:
                path.unlink(missing_ok=True)
            raise


#: an article's heading line: `` = Title = `` (one ``=`` a side; `` = = Section = = `` is not)
_ARTICLE_HEADING = re.compile(r"= (?!=).*(?<!=) =")


def _blank(line: Optional[str]) -> bool:
    """Whether ``line`` is blank; the start and the end of a file (None) count as blank."""
    return line is None or not line.strip()


def article_lines(lines: Iterable[str]) -> Iterator[str]:
    """WikiText's lines with one empty line between two articles and none inside one.

    Blank lines are dropped; an empty line (``"\\n"``) is written before every article heading
    but the first: a line `` = Title = `` (one ``=`` a side) with a blank line (or the start of
    the file) before it and one (or the end) after it. The surrounding blank lines tell a
    heading from a paragraph line that happens to look like one (WikiText-2's test split has
    two formulas `` = 1 <unk> and <unk> C = ``). Every other line is written as it is.
    """
    it = iter(lines)
    previous, current, started = None, next(it, None), False
    while current is not None:
        following = next(it, None)
        if not _blank(current):
            if (started and _blank(previous) and _blank(following)
                    and _ARTICLE_HEADING.fullmatch(current.strip())):
                yield "\n"
            started = True
            yield current
        previous, current = current, following


def _line_batches(path, document_breaks=False, batch_lines=1000):
    """:func:`read_batches` of ``path``, as :func:`article_lines` with ``document_breaks``."""
    batches = read_batches(path, batch_lines, desc=f"binarize {Path(path).name}")
    if not document_breaks:
        yield from batches
        return
    batch, first = [], 1
    for line in article_lines(line for _, _, lines in batches for line in lines):
        batch.append(line)
        if len(batch) == batch_lines:
            yield str(path), first, batch
            batch, first = [], first + batch_lines
    if batch:
        yield str(path), first, batch


def _count_words(batch):
    from fairseq.tokenizer import tokenize_line

    _, _, lines = batch
    counts = Counter()
    for line in lines:
        counts.update(tokenize_line(line))
    counts[worker_state()["eos"]] += len(lines)
    return counts


def build_word_dictionary(train_path, workers=1):
    """fairseq-preprocess's dictionary of the training split (see dictionary_from_counts)."""
    counts = Counter()
    for part in ordered_map(
        _count_words, read_batches(train_path, desc=f"dictionary {Path(train_path).name}"),
        workers, {"eos": EOS_WORD},
    ):
        counts.update(part)
    return dictionary_from_counts(counts)


def _encode_lines(batch):
    _, _, lines = batch
    encoder = worker_state()["encoder"]
    return [encoder.encode(line) for line in lines]


def binarize_lines(path, encoder, prefix, workers=1, document_breaks=False):
    """One sample per line of ``path`` into ``<prefix>.{bin,idx}``; returns counts.

    With ``document_breaks`` the lines are :func:`article_lines` of the file. ``empty_lines``
    counts the samples that are a lone ``</s>`` (where ``complete_doc`` splits).
    """
    dictionary = encoder.dictionary
    writer = IndexedWriter(prefix, len(dictionary), unk=dictionary.unk())
    empty = 0
    for encoded in ordered_map(
        _encode_lines, _line_batches(path, document_breaks), workers, {"encoder": encoder},
    ):
        for ids in encoded:
            writer.add(ids)
            empty += len(ids) == 1
    writer.finalize(f"{path} is empty")
    logger.info(
        f"{Path(path).name}: {writer.items} lines ({empty} empty), {writer.tokens} tokens, "
        f"{100 * writer.unk / max(writer.tokens, 1):.2f}% {dictionary.unk_word} (WikiText's "
        "own, and words the dictionary lacks)"
    )
    return {"lines": writer.items, "tokens": writer.tokens, "unk": writer.unk,
            "empty_lines": empty}


def prepare(text_dir, destdir, encoder=None, raw=False, fetch=False, urls=None, workers=1,
            overwrite=False, document_breaks=False, skip_existing=False):
    """Binarize WikiText's three splits into ``destdir``; returns per-split counts (None when
    ``skip_existing`` left an existing ``destdir`` as it was, before any download).

    ``encoder`` None is word level with a dictionary built from the training split; otherwise
    a :mod:`fairseq_alibi.preprocess.encoders` encoder with its own dictionary.
    ``document_breaks``: one empty line between articles and none inside (module docstring).
    """
    files = text_files(text_dir, raw)
    inputs = [*files.values(), *(encoder.inputs if encoder is not None else ())]
    if refuse_existing(destdir, overwrite, inputs, skip_existing):
        return None
    missing = [p.name for p in files.values() if not p.is_file()]
    present = [p.name for p in files.values() if p.is_file()]
    if missing and fetch and present:  # the download brings all three: it would replace these
        raise DataError(
            f"{text_dir} has {', '.join(present)} but no {', '.join(missing)}: --download "
            "fetches all three splits of WikiText-103 and would replace yours; give a folder "
            "with all three, or an empty one to download into")
    if missing and fetch:
        download(text_dir, raw, urls)
    elif missing:
        raise DataError(
            f"{text_dir} has no {', '.join(missing)}: pass --download to fetch WikiText-103, or "
            f"--text-dir a folder with wiki.{{train,valid,test}}.{'raw' if raw else 'tokens'}"
        )
    with atomic_directory(destdir, overwrite, inputs) as out:
        if encoder is None:
            encoder = WordEncoder(build_word_dictionary(files["train"], workers))
        encoder.dictionary.save(str(out / "dict.txt"))
        stats = {split: binarize_lines(path, encoder, out / split, workers, document_breaks)
                 for split, path in files.items()}
        save_json(out / "stats.json", {"source": {s: str(p) for s, p in files.items()},
                                        "document_breaks": bool(document_breaks),
                                        "splits": stats})
    return stats


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_alibi.preprocess.wikitext", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--text-dir", required=True,
                        help="folder with wiki.{train,valid,test}.tokens (or .raw with --raw)")
    parser.add_argument("--destdir", required=True, help="output folder (fairseq's data-bin)")
    parser.add_argument("--raw", action="store_true",
                        help="use the untokenized wiki.*.raw files (wikitext-103-raw-v1)")
    parser.add_argument("--download", action="store_true",
                        help="download WikiText-103 into --text-dir when its files are missing")
    parser.add_argument("--url", action="append",
                        help="download from this URL (a mirror, or file://) instead; repeatable")
    parser.add_argument(
        "--document-breaks", action="store_true",
        help="one empty line between articles and none inside (the files' blank lines, around "
        "every heading, dropped), so --sample-break-mode complete_doc and --alibi-document-mask "
        "doc split at articles; without it the files are binarized as they are (byte-identical "
        "to fairseq-preprocess, the published token stream) and those split at every heading")
    parser.add_argument("--workers", type=int, default=1)
    add_output_arguments(parser)
    add_encoder_arguments(parser)
    args = parser.parse_args(argv)
    encoder = encoder_from_args(args, required=False)
    stats = prepare(args.text_dir, args.destdir, encoder, args.raw, args.download, args.url,
                    args.workers, args.overwrite, args.document_breaks, args.skip_existing)
    if stats is None:
        return
    for split, s in stats.items():
        print(f"{split}: {s['lines']} lines ({s['empty_lines']} empty), {s['tokens']} tokens, "
              f"{s['unk']} <unk>")
    print(f"wrote {args.destdir}")


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
