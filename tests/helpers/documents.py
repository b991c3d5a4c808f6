"""What the tests of document masks share (tests/attention/test_document_masks.py,
tests/attention/test_document_sinks.py): packed rows of documents and their sizes."""

import torch

EOS = 2
CUTOFF = 1.0  # slopes 1/4 … 1/256 of 4 heads: windows of 4, 16, 64, 256 keys a side
LENGTHS = [[5, 17, 2, 24], [48]]  # a row of four documents, a row of one


def packed_tokens(lengths_per_row, seed=0):
    """Rows of documents of the given lengths, each document opened by ``</s>`` (as a shifted
    LM source is), the first document of a row without one (the tail of an earlier one)."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for lengths in lengths_per_row:
        row = []
        for n, length in enumerate(lengths):
            words = torch.randint(4, 30, (length,), generator=generator)
            if n:
                words[0] = EOS
            row.append(words)
        rows.append(torch.cat(row))
    return torch.stack(rows)
