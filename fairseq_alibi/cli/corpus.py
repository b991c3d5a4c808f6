"""An English corpus that ships with every Python installation, for experiments with no download.

The text is the interpreter's own documentation:

* the help topics of ``pydoc_data.topics`` (the language reference sections that ``help()``
  shows: ``help('for')``, ``help('SEQUENCES')``, ...), one document per topic;
* the docstrings of the standard library's Python sources (module, class and function
  docstrings, read with :mod:`ast`, so no module is imported), one document per source file.
  Test suites, ``site-packages`` and ``idlelib`` are left out.

Its size depends on the interpreter (docs/quickstart.md has the figures measured for one), so
:func:`build_corpus` writes them, with a SHA-256 of the text, to ``corpus.json``.

Each paragraph (lines separated by a blank line) becomes one line of text, whitespace collapsed.
By default documents follow one another with no separator (the files the quickstart's figures
were measured on); with ``--document-breaks`` (``build_corpus(document_breaks=True)``) an empty
line follows every document, so ``--sample-break-mode complete_doc`` and
``--alibi-document-mask doc`` split at documents. ``corpus.json`` records which.
The split is by document and deterministic: documents are ordered by the SHA-256 of their name
(``topic:for``, ``stdlib:json/__init__.py``) and dealt out in that order to test and valid until
each holds ``test_fraction``/``valid_fraction`` of the words; the rest is train. The same
interpreter therefore gives the same three files, byte for byte, on every machine.
"""

import ast
import hashlib
import importlib
import json
import os
import platform
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

SPLITS = ("train", "valid", "test")

#: standard-library folders that are not documentation prose (tests hold test data, not docs)
SKIPPED_STDLIB_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__", "lib2to3"}
)

#: a corpus smaller than this is not the full embedded text (a stripped or embedded Python)
MIN_WORDS = 100_000


class EmbeddedTextNotFound(RuntimeError):
    """The interpreter lacks the documentation text the corpus is built from."""


@dataclass(frozen=True)
class Document:
    name: str  # stable identifier, decides the split
    text: str  # one paragraph per line, no blank lines

    @property
    def words(self) -> int:
        return len(self.text.split())


def _paragraphs(text: str) -> List[str]:
    """Blank-line separated paragraphs, each joined into one line with single spaces."""
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]


def topic_documents(module: str = "pydoc_data.topics") -> List[Document]:
    """One document per help topic of ``pydoc_data.topics``, ordered by topic name."""
    try:
        topics = importlib.import_module(module).topics
    except (ImportError, AttributeError) as e:
        raise EmbeddedTextNotFound(
            f"cannot read Python's help topics ({module}: {e}). This Python was installed "
            "without its documentation data (some minimal or embedded builds strip it): use a "
            "full CPython (python.org, pyenv, conda, or Debian/Ubuntu's libpython3.X-stdlib), "
            "or run the experiment on your own binarized corpus with --data DIR"
        ) from e
    docs = []
    for name in sorted(topics):
        text = "\n".join(_paragraphs(topics[name]))
        if text:
            docs.append(Document(f"topic:{name}", text))
    return docs


def _docstrings(source: str) -> List[str]:
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                found.append(doc)
    return found


def stdlib_documents(stdlib_dir: Optional[str] = None) -> List[Document]:
    """One document per standard-library source file with docstrings, ordered by path."""
    root = Path(stdlib_dir or sysconfig.get_paths()["stdlib"])
    docs = []
    for folder, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_STDLIB_DIRS)
        for file in sorted(files):
            if not file.endswith(".py"):
                continue
            path = Path(folder) / file
            try:
                source = path.read_text(encoding="utf-8")
                strings = _docstrings(source)
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue  # a few files are templates or in another encoding: not prose anyway
            text = "\n".join(p for s in strings for p in _paragraphs(s))
            if text:
                docs.append(Document(f"stdlib:{path.relative_to(root).as_posix()}", text))
    if not docs:
        raise EmbeddedTextNotFound(
            f"no standard-library Python sources with docstrings under {root}. This Python "
            "ships compiled modules only (a stripped or embedded build): use a full CPython "
            "(python.org, pyenv, conda, or Debian/Ubuntu's libpython3.X-stdlib), or run the "
            "experiment on your own binarized corpus with --data DIR"
        )
    return docs


def collect_documents(
    stdlib_dir: Optional[str] = None, topics_module: str = "pydoc_data.topics"
) -> List[Document]:
    """All documents of the embedded corpus: help topics, then standard-library docstrings."""
    docs = topic_documents(topics_module) + stdlib_documents(stdlib_dir)
    words = sum(d.words for d in docs)
    if words < MIN_WORDS:
        raise EmbeddedTextNotFound(
            f"the embedded documentation holds only {words:,} words (at least {MIN_WORDS:,} "
            "expected): this Python's standard library looks stripped. Use a full CPython, or "
            "run the experiment on your own binarized corpus with --data DIR"
        )
    return docs


def _name_hash(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8")).hexdigest()


def split_documents(
    docs: Sequence[Document], valid_fraction: float = 0.05, test_fraction: float = 0.05
) -> Dict[str, List[Document]]:
    """Deal documents, in the order of their name's SHA-256, to test, valid, then train.

    Test and valid each receive documents until they hold at least their fraction of all
    words; every other document is train. Within a split, documents keep that hash order.
    """
    if not (0 < valid_fraction < 0.5 and 0 < test_fraction < 0.5):
        raise ValueError("valid_fraction and test_fraction must each lie in (0, 0.5)")
    total = sum(d.words for d in docs)
    splits = {s: [] for s in SPLITS}
    held = {"test": 0, "valid": 0}
    targets = {"test": test_fraction * total, "valid": valid_fraction * total}
    for doc in sorted(docs, key=lambda d: _name_hash(d.name)):
        split = next((s for s in ("test", "valid") if held[s] < targets[s]), "train")
        if split != "train":
            held[split] += doc.words
        splits[split].append(doc)
    return splits


def split_text(docs: Sequence[Document], document_breaks: bool = False) -> str:
    """The text of a split: each document's lines, and with ``document_breaks`` an empty line
    after each document (without, documents follow one another)."""
    end = "\n\n" if document_breaks else "\n"
    return "".join(d.text + end for d in docs)


def build_corpus(
    out_dir,
    valid_fraction: float = 0.05,
    test_fraction: float = 0.05,
    stdlib_dir: Optional[str] = None,
    topics_module: str = "pydoc_data.topics",
    document_breaks: bool = False,
) -> dict:
    """Write ``train.txt``, ``valid.txt``, ``test.txt`` and ``corpus.json`` to ``out_dir``.

    ``document_breaks``: an empty line after every document (:func:`split_text`). Returns the
    manifest (also in ``corpus.json``), :func:`write_corpus`'s.
    """
    splits = split_documents(
        collect_documents(stdlib_dir, topics_module), valid_fraction, test_fraction
    )
    return write_corpus(out_dir, splits, document_breaks)


def write_corpus(out_dir, splits: Dict[str, List[Document]],
                 document_breaks: bool = False) -> dict:
    """Write the splits of :func:`split_documents` as ``{train,valid,test}.txt`` and
    ``corpus.json`` to ``out_dir``; returns the manifest.

    The manifest holds per split the documents, lines (empty ones included), words and bytes,
    ``document_breaks``, and ``sha256``, a hash of the three files' contents (equal on every run
    with the same interpreter and options). Files are written under temporary names and renamed
    when complete.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    manifest = {
        "source": "pydoc_data.topics and standard-library docstrings",
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "document_breaks": bool(document_breaks),
        "splits": {},
    }
    for split in SPLITS:
        data = split_text(splits[split], document_breaks).encode("utf-8")
        digest.update(split.encode() + b"\0" + data + b"\0")
        tmp = out / f".{split}.txt.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, out / f"{split}.txt")
        manifest["splits"][split] = {
            "documents": len(splits[split]),
            "lines": data.count(b"\n"),
            "words": sum(d.words for d in splits[split]),
            "bytes": len(data),
        }
    manifest["sha256"] = digest.hexdigest()
    (out / "corpus.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv=None):
    import argparse

    parser = argparse.ArgumentParser(
        prog="fairseq-alibi corpus",
        description="Write the embedded English corpus (Python's own documentation) as "
        "train/valid/test.txt.",
    )
    parser.add_argument("out_dir")
    parser.add_argument("--valid-fraction", type=float, default=0.05,
                        help="the share of the words in valid, in (0, 0.5) (default 0.05)")
    parser.add_argument("--test-fraction", type=float, default=0.05,
                        help="the share of the words in test, in (0, 0.5) (default 0.05)")
    parser.add_argument(
        "--document-breaks", action="store_true",
        help="an empty line after every document (help topic, standard-library file), so "
        "--sample-break-mode complete_doc and --alibi-document-mask doc split at documents "
        "(default: documents follow one another, the files the quickstart was measured on)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the files of a folder that is not empty")
    args = parser.parse_args(argv)
    for flag, value in (("--valid-fraction", args.valid_fraction),
                        ("--test-fraction", args.test_fraction)):
        if not 0 < value < 0.5:
            parser.error(f"{flag} {value:g}: a share of the words in (0, 0.5), e.g. 0.05")
    out = Path(args.out_dir)
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        # as the other pipelines: two corpora (with and without breaks) are never confused
        parser.error(f"{out} already exists and is not empty; pass --overwrite to replace it")
    manifest = build_corpus(args.out_dir, args.valid_fraction, args.test_fraction,
                            document_breaks=args.document_breaks)
    print(json.dumps(manifest, indent=2))


if __name__ == "__main__":
    main()
