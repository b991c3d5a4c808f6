"""The block plan of a call: which key blocks each query block of each head reads, and which
of those need an element mask, computed from the numbers that say which keys a call keeps
(windows, sinks, documents), never by evaluating a mask on every (query, key) pair.

Key ``j`` is visible to query ``i`` (``i = S - T + q``: queries aligned to the end of the
keys) of head ``h`` iff

* its reach keeps it, ``-ahead_h <= i - j <= back_h`` (the slope windows,
  :func:`~fairseq_alibi.alibi.variant_windows`, or the variant's own direction,
  :func:`direction`; ``None``: unbounded), or it is one of the ``sinks`` first keys (of the
  sequence, or with ``offsets`` of its document) and the variant's direction keeps it;
* and, with ``documents`` ``(B, S)`` (:func:`~fairseq_alibi.alibi.document_ids`),
  ``documents[b, i] == documents[b, j]``.

For a block of queries ``i0 … i1`` and keys ``j0 … j1``, ``i - j`` spans ``i0 - j1 … i1 - j0``:
the pair is read iff that span meets ``[-ahead, back]``, and whole (no element mask) iff the
span lies inside it and neither block runs past its sequence's end. That is exact, the blocks
an element-wise mask would give. Documents are numbered in order along a row, so two blocks
share a document iff their id ranges meet, and are one document iff all four ends have one
id; with documents the plan may read a pair whose window and documents each allow some
element but no element both (its element mask hides it): never is a visible key skipped.

The work is ``H·(T/block)·(S/block)``, where an element-wise mask (``flex``'s
``create_block_mask``) evaluates and holds ``B·H·T·S`` booleans: 8 GiB for 8 heads at 32k.
"""

from typing import NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

#: ``flex_attention``'s block size (its kernels' default), query and key blocks alike
BLOCK = 128

#: an unbounded reach (``None``) as one no sequence attains
UNBOUNDED = 2**62

Reach = Tuple[Sequence[Optional[int]], Sequence[Optional[int]]]


class BlockPlan(NamedTuple):
    """``read`` and ``whole``, ``(B or 1, H, ceil(T / block), ceil(S / block))`` bool: the key
    blocks each query block of each head reads, and of those the ones every element of which
    is visible (``whole`` implies ``read``)."""

    read: Tensor
    whole: Tensor
    block: int


def direction(variant: str, num_heads: int) -> Optional[Reach]:
    """The reach of ``variant``'s own mask, ``(back, ahead)`` per head: ``causal`` every head
    ``(None, 0)``; ``one_sided`` heads ``h < H/2`` ``(None, 0)``, the others ``(0, None)``; the
    variants that see every key: ``None``."""
    if variant == "causal":
        return [None] * num_heads, [0] * num_heads
    if variant == "one_sided":
        half = num_heads // 2
        return ([None] * half + [0] * (num_heads - half),
                [0] * half + [None] * (num_heads - half))
    return None


def bounds(reach: Reach, device=None) -> Tuple[Tensor, Tensor]:
    """``reach``'s ``back`` and ``ahead`` as ``(H,)`` int64 tensors (``None``:
    :data:`UNBOUNDED`)."""
    return tuple(torch.tensor([UNBOUNDED if r is None else int(r) for r in side],
                              dtype=torch.int64, device=device) for side in reach)


def _bounds(reach: Reach, device) -> Tuple[Tensor, Tensor]:
    return tuple(side.view(-1, 1, 1) for side in bounds(reach, device))


def _direction_bounds(variant: str, num_heads: int, device) -> Tuple[Tensor, Tensor]:
    """:func:`_bounds` of ``variant``'s :func:`direction` (every key: unbounded both ways)."""
    return _bounds(direction(variant, num_heads) or ([None] * num_heads,) * 2, device)


def _ends(length: int, block: int, first: int, device) -> Tuple[Tensor, Tensor, Tensor]:
    """Each block's first and last position (``+ first``) and whether it is a whole block."""
    starts = torch.arange(0, length, block, device=device)
    lasts = torch.clamp(starts + block - 1, max=length - 1)
    return starts + first, lasts + first, lasts - starts + 1 == block


def _meets(low: Tensor, high: Tensor, back: Tensor, ahead: Tensor) -> Tensor:
    return (high >= -ahead) & (low <= back)


def _inside(low: Tensor, high: Tensor, back: Tensor, ahead: Tensor) -> Tensor:
    return (low >= -ahead) & (high <= back)


def plan(reach: Reach, query_len: int, key_len: int, block: int = BLOCK, sinks: int = 0,
         variant: str = "causal", documents: Optional[Tensor] = None,
         offsets: Optional[Tensor] = None, device=None) -> BlockPlan:
    """The :class:`BlockPlan` of a call whose heads keep the keys within ``reach``
    ``(back, ahead)`` per head (slope windows or :func:`direction`), the ``sinks`` first keys
    where ``variant``'s direction keeps them, and with ``documents`` ``(B, S)`` only the keys
    of each query's document (``offsets`` ``(B, S)``, each key's place in it: the sinks are
    then each document's first keys, :func:`~fairseq_alibi.alibi.document_offsets`)."""
    T, S = query_len, key_len
    if sinks and documents is not None and offsets is None:
        raise ValueError("blocks.plan: attention sinks with documents need the keys' offsets "
                         "in their documents (alibi.document_offsets)")
    i0, i1, whole_q = _ends(T, block, S - T, device)
    j0, j1, whole_k = _ends(S, block, 0, device)
    back, ahead = _bounds(reach, device)
    low, high = (i0[:, None] - j1[None, :]), (i1[:, None] - j0[None, :])  # i - j, (nQ, nK)
    read = _meets(low, high, back, ahead)  # (H, nQ, nK)
    whole = _inside(low, high, back, ahead) & whole_q[:, None] & whole_k[None, :]
    if sinks and documents is None:
        d_back, d_ahead = _direction_bounds(variant, len(reach[0]), device)
        has_sink = (j0 < sinks)[None, :]
        last_sink = torch.clamp(j1, max=sinks - 1)
        sink_low, sink_high = i0[:, None] - last_sink[None, :], high  # the sink keys' span
        read = read | (has_sink & _meets(sink_low, sink_high, d_back, d_ahead))
        # a block holding sinks is whole where the direction keeps its sinks and the window
        # the rest (the windows lie within the direction: a sink is visible iff it keeps it)
        rest = torch.clamp(j0, min=sinks)
        rest_whole = (j1 < sinks)[None, :] | _inside(low, i1[:, None] - rest[None, :], back,
                                                      ahead)
        sink_whole = _inside(sink_low, sink_high, d_back, d_ahead) & rest_whole
        whole = whole | (has_sink & sink_whole & whole_q[:, None] & whole_k[None, :])
    read, whole = read[None], whole[None]
    if documents is not None:
        ends = (i0, i1, j0, j1)
        read, whole = _within_documents(read, whole, documents.to(device), ends, block, sinks,
                                        offsets, variant, low, high)
    return BlockPlan(read, whole, block)


def _within_documents(read, whole, documents, ends, block, sinks, offsets, variant, low,
                      high):
    """``read`` and ``whole`` ``(1, H, nQ, nK)`` narrowed to the block pairs that share a
    document, ``(B, H, nQ, nK)`` (``ends``: the query and key blocks' first and last
    positions); with sinks, a key block holding a document's first keys is read where the
    direction keeps some of it."""
    B, S = documents.shape
    q_low, q_high, k_low, k_high = (documents[:, at] for at in ends)  # (B, nQ) and (B, nK)
    meet = ((q_low[:, :, None] <= k_high[:, None, :])
            & (k_low[:, None, :] <= q_high[:, :, None]))[:, None]  # (B, 1, nQ, nK)
    one = ((q_low == q_high)[:, :, None] & (k_low == k_high)[:, None, :]
           & (q_low[:, :, None] == k_low[:, None, :]))[:, None]
    if sinks:
        d_back, d_ahead = _direction_bounds(variant, read.size(1), documents.device)
        padded = torch.nn.functional.pad(offsets, (0, -S % block), value=sinks)
        has_sink = (padded.view(B, -1, block).min(dim=2).values < sinks)[:, None, None, :]
        read = read | (has_sink & _meets(low, high, d_back, d_ahead)[None])
    return read & meet, whole & one
