"""Document masks as sequences: each document of a packed row attended as its own sequence.

With ``--alibi-document-mask`` no query reads a key of another document, and the ALiBi bias
depends on ``i - j`` only, so the attention of a row is, document by document, the attention of
that document alone (:func:`~fairseq_alibi.alibi.document_mask`). That is how a whole sequence
is computed here, for any backend (``fold``, ``windowed``, ``sdpa``, ...): the :func:`plan`
cuts each row at its document boundaries and gathers documents of about the same length into
one batch, padded at the end to a length of the batch (a *bucket*); each bucket is one call of
the backend, with no document mask; the outputs are scattered back. Keys of other documents
are never read: a row of documents of lengths ``l_d`` costs ``Σ l_d²`` instead of ``L²``.

Attention sinks (``--alibi-window-sinks``) are each document's first positions
(:func:`~fairseq_alibi.alibi.document_alibi_bias`): a bucket's document starts at its position
0, so the backend's sinks, a sequence's first keys, are the document's.

Padding: a bucket's slots past a document's end are key padding for the variants that look
ahead (causal ones never read them: they lie after every real query), and the row's own key
padding comes along with its positions. Autograd runs through the gathers and the backend's
backward.
"""

from typing import Callable, List, NamedTuple, Optional

import torch
from torch import Tensor

from fairseq_alibi.modules.attention import tuning


class Bucket(NamedTuple):
    """Documents of one padded ``length``: row ``rows[d]``, positions ``positions[d]``
    ``(n, length)`` of that row (a slot past the document's end repeats its first position),
    ``slots`` ``(n, length)`` True on the document's own positions."""

    length: int
    rows: Tensor
    positions: Tensor
    slots: Tensor


def bucket_length(length: Tensor, most: int) -> Tensor:
    """Each document's bucket length: ``length`` rounded up to its granule, at most ``most``:
    a multiple of ``2^(floor(log2 l) - GRANULE_BITS)`` (at most 1/8 more) or of ``MIN_GRANULE``
    (:mod:`.tuning`)."""
    top = torch.floor(torch.log2(length.float())).long()  # 2^top <= length
    granule = torch.clamp(2 ** (top - tuning.GRANULE_BITS), min=tuning.MIN_GRANULE)
    return torch.clamp(-(-length // granule) * granule, max=most)


def plan(ids: Tensor) -> List[Bucket]:
    """The buckets of the documents of ``ids`` ``(B, L)`` (:func:`~fairseq_alibi.alibi.
    document_ids`: a new document where the id changes), shortest first."""
    B, L = ids.shape
    opens = torch.ones(B, L, dtype=torch.bool, device=ids.device)
    opens[:, 1:] = ids[:, 1:] != ids[:, :-1]
    rows, starts = opens.nonzero(as_tuple=True)
    ends = torch.cat([starts[1:], starts.new_tensor([L])])
    last = torch.ones_like(rows, dtype=torch.bool)  # a row's last document ends at L
    last[:-1] = rows[1:] != rows[:-1]
    ends = torch.where(last, torch.full_like(ends, L), ends)
    lengths = ends - starts
    padded = bucket_length(lengths, L)
    buckets = []
    for length in torch.unique(padded).tolist():
        chosen = (padded == length).nonzero(as_tuple=True)[0]
        offsets = torch.arange(length, device=ids.device)
        slots = offsets[None, :] < lengths[chosen, None]
        positions = torch.where(slots, starts[chosen, None] + offsets[None, :],
                                starts[chosen, None])
        buckets.append(Bucket(length, rows[chosen], positions, slots))
    return buckets


class Layout(NamedTuple):
    """How a call's rows are cut into their documents (:func:`layout`): ``buckets``
    (:func:`plan`); ``index``, every bucket's slots in order as rows ``position·B + row`` of
    fairseq's ``(L, B)`` layout; ``sizes``, each bucket's share of ``index``; ``where``, each
    position's row of the buckets' concatenated output (its one slot on a document's own
    positions: a slot past a document's end repeats a position of it)."""

    buckets: List[Bucket]
    index: Tensor
    sizes: List[int]
    where: Tensor


def layout(ids: Tensor) -> Layout:
    """The :class:`Layout` of documents ``ids`` ``(B, L)``: the same for every layer of a
    forward pass (``modules/bias.py``'s ``Documents.layout`` keeps it for them)."""
    B, L = ids.shape
    buckets = plan(ids)
    index = torch.cat([(b.positions * B + b.rows[:, None]).reshape(-1) for b in buckets])
    slots = torch.cat([b.slots.reshape(-1) for b in buckets])
    where = torch.empty(L * B, dtype=torch.long, device=ids.device)
    where[index[slots]] = slots.nonzero(as_tuple=True)[0]
    return Layout(buckets, index, [b.positions.numel() for b in buckets], where)


def attention(run: Callable, q: Tensor, k: Tensor, v: Tensor, alibi, cut: Layout,
              key_padding_mask: Optional[Tensor]) -> Tensor:
    """``(B, H, L, D)``: the attention of whole sequences ``q, k, v`` ``(B, H, L, D)``, each
    document as its own sequence: ``run(q, k, v, alibi, key_padding_mask)`` per bucket of
    ``cut`` (their :func:`layout`; ``alibi``: the call's bias without documents). Gathered
    once per tensor as rows ``(position, row)`` of fairseq's ``(L, B, H, D)`` layout (a view
    of the projections in a model), whole ``H·D`` rows at a time, cut into the buckets as
    views (so the backward is one scatter per tensor); the output is laid out so too."""
    B, H, L, D = q.shape
    looks_ahead = alibi.variant != "causal"
    pad = None if key_padding_mask is None else key_padding_mask.to(torch.bool)
    index, where = cut.index.to(q.device), cut.where.to(q.device)
    parts = zip(*(torch.split(_rows(x).index_select(0, index), cut.sizes) for x in (q, k, v)))
    alibi = SharedDense(alibi, max(b.length for b in cut.buckets), q.element_size())
    outs = []
    for bucket, part in zip(cut.buckets, parts):
        n, length = bucket.positions.shape
        q_b, k_b, v_b = (x.view(n, length, H, D).transpose(1, 2) for x in part)
        hidden = None
        if pad is not None:
            hidden = pad[bucket.rows[:, None], bucket.positions] | ~bucket.slots
        elif looks_ahead and not bool(bucket.slots.all()):
            hidden = ~bucket.slots
        outs.append(run(q_b, k_b, v_b, alibi, hidden).transpose(1, 2).reshape(n * length, H, D))
    out = torch.cat(outs) if len(outs) > 1 else outs[0]
    return out.index_select(0, where).view(L, B, H, D).permute(1, 2, 0, 3)


def _rows(x: Tensor) -> Tensor:
    """``(B, H, L, D)`` -> ``(L·B, H, D)``: a view where ``x`` is one of fairseq's ``(L, B, H,
    D)`` layout, else one copy."""
    by_position = x.permute(2, 0, 1, 3)
    if not by_position.is_contiguous():
        by_position = by_position.contiguous()
    return by_position.view(-1, x.size(1), x.size(3))


class SharedDense:
    """The bias of a call's buckets: ``base`` (read through), whose dense ``(H, t, t)`` bias of
    every bucket is the top-left corner of one ``(H, M, M)`` tensor of the longest bucket
    ``M``, memoised by the stack for every layer of the pass (positions ``0 … t-1``: the
    window's bias depends on ``i - j`` only, no global tokens with documents, and attention
    sinks are the first positions of each), instead of one built per bucket and layer; a
    corner only while that
    tensor fits ``tuning.DENSE_MASK_BUDGET`` (``itemsize`` bytes an element), else the bucket's
    own. Built only if a bucket's backend reads a dense bias (``sdpa``: short documents)."""

    def __init__(self, base, longest: int, itemsize: int):
        self.base, self.longest = base, longest
        self.shared = base.num_heads * longest * longest * itemsize <= tuning.DENSE_MASK_BUDGET

    def __getattr__(self, name):
        return getattr(self.base, name)

    def dense(self, query_len: int, key_len: int, dtype=torch.float32) -> Tensor:
        if not self.shared or query_len != key_len:
            return self.base.dense(query_len, key_len, dtype)
        M = self.longest
        return self.base.dense(M, M, dtype)[:, :query_len, :key_len]
