"""Packed rows of documents, what the document-mask benchmarks time: document lengths drawn
from WikiText-2's test articles, from a binarized corpus's documents or uniformly, rows filled
with them (an ``</s>`` opening each document, a row starting and ending inside one, as packing
makes it), ``complete_doc``'s padded rows of the same documents, and a language-modelling
sample of rows."""

import random
import re
from pathlib import Path

import torch

#: where document lengths come from (``--corpus``), besides a binarized folder
#: (:func:`binarized_lengths`)
CORPORA = ("uniform", "wikitext2")
EOS = 2  # fairseq's </s>
WIKITEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2"
HEADING = re.compile(r"^ = [^=].* = $")  # an article's title line (sections have "= =")


def wikitext_lengths(folder: Path = WIKITEXT) -> list:
    """The articles' lengths in fairseq tokens (words, and one ``</s>`` per line) of
    WikiText-2's test split."""
    lengths, current = [], 0
    with open(folder / "wiki.test.tokens", encoding="utf-8") as f:
        for line in f:
            if HEADING.match(line.rstrip("\n")) and current:
                lengths.append(current)
                current = 0
            current += len(line.split()) + 1
    return lengths + [current]


def binarized_lengths(folder, split: str = "train") -> list:
    """The documents' lengths in a binarized folder's ``split`` (fairseq-preprocess's output of
    text with an empty line between documents, what ``--sample-break-mode complete_doc`` and
    ``--alibi-document-mask doc`` split on): the tokens of each run of lines, the empty line's
    ``</s>`` opening the next document (as the mask reads it)."""
    from fairseq.data import data_utils

    found = data_utils.load_indexed_dataset(str(Path(folder) / split), None)
    if found is None:
        raise SystemExit(f"--corpus {folder}: no binarized {split} split there")
    lengths, current = [], 0
    for size in found.sizes.tolist():
        if size == 1 and current:  # an empty line: only its </s>
            lengths.append(current)
            current = 0
        current += size
    return lengths + ([current] if current else [])


def corpus_argument(value: str) -> str:
    """``--corpus``: one of :data:`CORPORA` or a binarized folder with a ``train`` split."""
    if value in CORPORA or (Path(value) / "train.idx").is_file():
        return value
    raise ValueError(value)


corpus_argument.__name__ = "--corpus (uniform, wikitext2 or a binarized folder)"


def document_lengths(corpus: str, low: int, high: int, seed: int):
    """An endless, seeded stream of document lengths."""
    rng = random.Random(seed)
    pool = (None if corpus == "uniform" else wikitext_lengths() if corpus == "wikitext2"
            else binarized_lengths(corpus))
    while True:
        yield rng.choice(pool) if pool else rng.randint(low, high)


def packed_rows(rows: int, length: int, lengths, vocab: int = 2000, seed: int = 0):
    """``(tokens (rows, length), documents)``: random words, an ``</s>`` opening each document
    after the first of a row; ``documents``: the lengths of the pieces of every row."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, vocab, (rows, length), generator=generator)
    pieces = []
    for r in range(rows):
        at = -rng_offset(lengths)  # the row starts inside a document
        while at < length:
            n = next(lengths)
            if at > 0:
                tokens[r, at] = EOS
            pieces.append(min(at + n, length) - max(at, 0))
            at += n
    return tokens, [p for p in pieces if p > 0]


def rng_offset(lengths) -> int:
    """How far into its first document a row starts: half of one drawn length."""
    return next(lengths) // 2


def describe(corpus, doc_lengths) -> str:
    if corpus not in CORPORA:
        lengths = sorted(binarized_lengths(corpus))
        return (f"the lengths of {corpus}'s {len(lengths):,} training documents (median "
                f"{lengths[len(lengths) // 2]:,} tokens, mean {sum(lengths) / len(lengths):,.0f})")
    return ("WikiText-2 test articles' lengths" if corpus == "wikitext2"
            else f"uniform {doc_lengths[0]}–{doc_lengths[1]} tokens")


def padded_documents(pieces, length: int, vocab: int = 2000, seed: int = 1):
    """``complete_doc``'s rows for the same documents: each piece its own row (one longer than
    ``length`` cut into rows of ``length``), right-padded with fairseq's pad (1)."""
    rows = []
    for n in pieces:
        rows += [length] * (n // length) + ([n % length] if n % length else [])
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, vocab, (len(rows), length + 1), generator=generator)
    for r, n in enumerate(rows):
        tokens[r, n:] = 1
    return tokens, rows


def training_sample(tokens, real=None):
    """A language-modelling sample of the rows ``tokens`` ``(B, L + 1)`` (``real``: each row's
    real length, the rest padding)."""
    B, L = tokens.shape[0], tokens.shape[1] - 1
    real = real or [L] * B
    target = tokens[:, 1:].clone()
    for r, n in enumerate(real):
        target[r, n:] = 1
    return {"id": torch.arange(B), "nsentences": B, "ntokens": sum(real),
            "net_input": {"src_tokens": tokens[:, :-1].contiguous(),
                          "src_lengths": torch.tensor(real)},
            "target": target}
