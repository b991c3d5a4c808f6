"""``flex``: ``torch.nn.attention.flex_attention`` with the ALiBi bias as a ``score_mod``.

The bias is a ``score_mod``, the keys a variant hides a block ``mask_mod`` (whole blocks are
skipped), padding and an extra ``attn_mask`` ``score_mod`` terms. Which blocks are skipped,
read whole, or read with the ``mask_mod`` is the call's block plan (:func:`.blocks.plan`,
from the windows, sinks and documents as numbers; :func:`as_block_mask`): no mask is
evaluated on every (query, key) pair to find them. Kernels are compiled for full sequences
on GPUs, eager for decoding steps and on the CPU. Every variant. PyTorch has no CPU backward
for it: inference only on the CPU.

Slope windows (``--alibi-window-cutoff``): the block mask is per head
(:func:`window_mask_mod`: head ``h`` keeps the keys with ``i - j <= back_h`` and
``j - i <= ahead_h``, the call's ``windows()``), so the compiled kernel skips every block
beyond a head's window; the ``score_mod`` keeps the bias of the keys inside. Attention sinks
(``--alibi-window-sinks S``): the mask keeps the keys ``j < S`` too, where the variant's own
mask does (:func:`window_mask_mod`); not against a KV cache that dropped the keys after its
sinks (``Capabilities.sink_cache``). ``auto`` never
picks ``flex`` for a windowed call (not measured: ``dispatch.auto_backend``); named, it serves
one (the eager CPU path computes the same function, every score, for inference).

Document masks (``--alibi-document-mask``): one more ``mask_mod`` term, the keys of the
query's own document (:func:`document_mask_mod`), so whole blocks of other documents are
skipped too; the block mask is then per row, built once per forward pass (the layers share
their documents). With attention sinks, those of
each document: its first positions (the documents' offsets, :func:`window_mask_mod`).
"""

import functools
import importlib.util
import warnings
from typing import Optional

import torch

from fairseq_alibi.alibi import check_variant, mask_value
from fairseq_alibi.modules.attention import blocks
from fairseq_alibi.modules.attention.capabilities import Capabilities


def available() -> bool:
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def compilable() -> bool:
    """Whether ``torch.compile`` can build the fused kernel here (it needs triton on GPUs)."""
    return importlib.util.find_spec("triton") is not None


def _missing() -> Optional[str]:
    return None if available() else f"this torch ({torch.__version__}) has no flex_attention"


#: what :func:`attention` serves: the slopes of every variant, with slope windows or without,
#: any device and dtype, KV caches, padding and an extra mask; no attention dropout, no global
#: tokens, and (PyTorch has none) no backward on the CPU
CAPABILITIES = Capabilities(
    kinds=("distance",), dropout=False, global_tokens=False, no_backward_on=("cpu",),
    windows=True, sinks=True, documents=True, missing=_missing)


def alibi_score_mod(variant, slopes, future_slopes=None, query_offset=0, key_padding_mask=None):
    """A ``flex_attention`` ``score_mod`` adding the ALiBi bias of ``variant`` to each logit.

    ``score + bias_h(i, j)`` with ``i = query_offset + q_idx`` (queries aligned to the end of
    the keys, as in :func:`~fairseq_alibi.alibi.alibi_bias`) and the values of its table for
    the visible keys; keys a variant hides are the business of :func:`alibi_mask_mod`. Padded
    keys (``key_padding_mask[b, j]`` True) get :func:`~fairseq_alibi.alibi.mask_value` of
    float32, so an all-padding row stays finite.
    """
    check_variant(variant, slopes.shape[0])
    if variant == "asymmetric" and future_slopes is None:
        raise ValueError("the asymmetric ALiBi variant needs future_slopes")
    masked = mask_value(torch.float32)

    def score_mod(score, b, h, q_idx, kv_idx):
        rel = (q_idx + query_offset - kv_idx).to(torch.float32)  # i - j
        m = slopes[h]
        if variant == "causal":
            biased = score - m * rel
        elif variant in ("symmetric", "one_sided"):
            biased = score - m * rel.abs()
        elif variant == "offset":
            biased = torch.where(rel >= 0, score - m * rel, score + m * (rel + 0.5))
        else:  # asymmetric
            biased = torch.where(rel >= 0, score - m * rel, score + future_slopes[h] * rel)
        if key_padding_mask is not None:
            biased = torch.where(key_padding_mask[b, kv_idx], masked, biased)
        return biased

    return score_mod


def alibi_mask_mod(variant, num_heads, query_offset=0):
    """A ``flex_attention`` ``mask_mod`` (True = visible) for the keys ``variant`` hides, or
    ``None`` for the variants that see every key (symmetric, offset, asymmetric).

    ``causal``: ``j <= i``; ``one_sided``: heads ``h < H/2`` see ``j <= i``, the others
    ``j >= i``; with ``i = query_offset + q_idx`` as in :func:`alibi_score_mod`.
    """
    check_variant(variant, num_heads)
    if variant == "causal":
        def mask_mod(b, h, q_idx, kv_idx):
            return q_idx + query_offset >= kv_idx
        return mask_mod
    if variant == "one_sided":
        half = num_heads // 2

        def mask_mod(b, h, q_idx, kv_idx):
            i = q_idx + query_offset
            return torch.where(h < half, i >= kv_idx, i <= kv_idx)
        return mask_mod
    return None


def window_mask_mod(windows, query_offset=0, device=None, sinks=0, variant=None,
                    offsets=None):
    """A ``flex_attention`` ``mask_mod`` (True = visible) for slope windows: head ``h`` keeps
    key ``j`` of query ``i = query_offset + q_idx`` iff ``i - j <= back_h`` and
    ``j - i <= ahead_h``, or ``j`` is one of the ``sinks`` first keys that ``variant``'s own
    mask (:func:`alibi_mask_mod`) keeps: of the sequence, or with ``offsets`` ``(B, S)``
    (each key's place in its document, :func:`~fairseq_alibi.alibi.document_offsets`) of the
    key's document (``offsets[b, j] < sinks``).

    ``windows`` ``(back, ahead)`` per head (:func:`~fairseq_alibi.alibi.variant_windows`,
    ``None`` = unbounded), held as two ``(H,)`` int64 tensors indexed by ``h``. They carry the
    variant's own hidden keys (``causal``: ``ahead = 0``; ``one_sided``: ``back`` or ``ahead``
    0 by the head's direction), so this mask replaces :func:`alibi_mask_mod`.
    """
    back, ahead = blocks.bounds(windows, device)

    def mask_mod(b, h, q_idx, kv_idx):
        rel = q_idx + query_offset - kv_idx  # i - j
        return (rel <= back[h]) & (-rel <= ahead[h])

    if not sinks:
        return mask_mod
    direction = alibi_mask_mod(variant, len(windows[0]), query_offset)

    def with_sinks(b, h, q_idx, kv_idx):
        sink = (kv_idx if offsets is None else offsets[b, kv_idx]) < sinks
        if direction is not None:
            sink = sink & direction(b, h, q_idx, kv_idx)
        return mask_mod(b, h, q_idx, kv_idx) | sink

    return with_sinks


def document_mask_mod(documents, inner=None, query_offset=0):
    """A ``flex_attention`` ``mask_mod`` (True = visible) keeping the keys of the query's own
    document, ``documents[b, i] == documents[b, j]`` (``documents`` ``(B, S)``, the keys' ids:
    :func:`~fairseq_alibi.alibi.document_ids`), and of those what ``inner`` keeps (the
    variant's or the windows' mask, ``None``: every key)."""

    def mask_mod(b, h, q_idx, kv_idx):
        same = documents[b, q_idx + query_offset] == documents[b, kv_idx]
        return same if inner is None else same & inner(b, h, q_idx, kv_idx)

    return mask_mod


@functools.lru_cache(maxsize=None)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def as_block_mask(plan: blocks.BlockPlan, mask_mod, query_len: int, key_len: int):
    """``plan`` (:func:`.blocks.plan`) as ``flex_attention``'s ``BlockMask``: its ``whole``
    blocks run without ``mask_mod``, the others it reads with it (the element mask of the
    same keys), the rest are skipped."""
    from torch.nn.attention.flex_attention import BlockMask

    def ordered(chosen):  # per query block: how many key blocks, and which (first)
        chosen = chosen.to(torch.int32)
        return (chosen.sum(dim=-1, dtype=torch.int32),
                torch.argsort(chosen, dim=-1, descending=True, stable=True).to(torch.int32))

    partial, whole = ordered(plan.read & ~plan.whole), ordered(plan.whole)
    return BlockMask.from_kv_blocks(*partial, *whole, BLOCK_SIZE=plan.block, mask_mod=mask_mod,
                                    seq_lengths=(query_len, key_len))


@functools.lru_cache(maxsize=64)
def _block_mask(variant, num_heads, query_len, key_len, device):
    mask_mod = alibi_mask_mod(variant, num_heads, key_len - query_len)
    if mask_mod is None:
        return None
    heads = num_heads if variant == "one_sided" else 1  # causal: one head's mask for all
    plan = blocks.plan(blocks.direction(variant, heads), query_len, key_len, device=device)
    return as_block_mask(plan, mask_mod, query_len, key_len)


@functools.lru_cache(maxsize=64)
def _window_block_mask(windows, query_len, key_len, device, sinks=0, variant=None):
    """The per-head block mask of ``windows`` (a tuple of two tuples, hashable: cached per
    windows, sinks and lengths, as :func:`_block_mask` per variant and lengths)."""
    mask_mod = window_mask_mod(windows, key_len - query_len, device, sinks, variant)
    plan = blocks.plan(windows, query_len, key_len, sinks=sinks, variant=variant or "causal",
                       device=device)
    return as_block_mask(plan, mask_mod, query_len, key_len)


#: the block masks of the last call's documents, per windows and shape: the layers of one
#: forward pass share their documents (one ``Documents.serial``), so the mask is built once
#: per pass and windows, not per layer; a new pass's documents drop the last one's
_DOCUMENT_MASKS = {}


def _document_block_mask(variant, documents, windows, sinks, num_heads, query_len, key_len,
                         device):
    """The per-row block mask of a call with document masks (:func:`document_block_mask`),
    kept for the other layers of the pass."""
    key = (documents.serial, windows, sinks, variant, num_heads, query_len, key_len,
           str(device))
    found = _DOCUMENT_MASKS.get(key)
    if found is None:
        if any(k[0] != documents.serial for k in _DOCUMENT_MASKS):
            _DOCUMENT_MASKS.clear()
        found = _DOCUMENT_MASKS[key] = document_block_mask(
            variant, documents, windows, sinks, num_heads, query_len, key_len, device)
    return found


def document_block_mask(variant, documents, windows, sinks, num_heads, query_len, key_len,
                        device):
    """The per-row block mask of a call with ``documents`` (``ids``, ``offsets``) and
    ``windows`` (``None``: the variant's own mask): the block plan of the documents, and
    :func:`document_mask_mod` of the windows' or the variant's mask for its partial blocks."""
    first = key_len - query_len
    ids = documents.ids.to(device)
    offsets = None if documents.offsets is None else documents.offsets.to(device)
    if windows is None:
        inner = alibi_mask_mod(variant, num_heads, first)
        reach = blocks.direction(variant, num_heads) or ([None] * num_heads,) * 2
    else:
        inner = window_mask_mod(windows, first, device, sinks, variant, offsets)
        reach = windows
    plan = blocks.plan(reach, query_len, key_len, sinks=sinks, variant=variant,
                       documents=ids, offsets=offsets, device=device)
    return as_block_mask(plan, document_mask_mod(ids, inner, first), query_len, key_len)


def attention(q, k, v, alibi, key_padding_mask, attn_mask, dropout_p, scale):
    """The ``flex`` backend: the ALiBi ``score_mod`` and the variant's block mask, or, with
    slope windows, the windows' per-head block mask."""
    from torch.nn.attention.flex_attention import flex_attention as eager_flex

    B, H, T, D = q.shape
    S = k.size(2)
    slopes, future = alibi.head_slopes()
    pad = None if key_padding_mask is None else key_padding_mask.to(torch.bool)
    if future is not None:
        future = future.to(q.device)
    score_mod = alibi_score_mod(alibi.variant, slopes.to(q.device), future, S - T, pad)
    if attn_mask is not None:
        extra = attn_mask.to(q.device)
        inner = score_mod

        def score_mod(score, b, h, q_idx, kv_idx):
            s = inner(score, b, h, q_idx, kv_idx)
            if extra.dtype == torch.bool:
                return torch.where(extra[q_idx, kv_idx], mask_value(torch.float32), s)
            return s + extra[q_idx, kv_idx].float().clamp(min=mask_value(torch.float32))

    windows = alibi.windows() if alibi.windowed else None
    sinks = getattr(alibi, "sinks", 0) if windows is not None else 0
    documents = getattr(alibi, "documents", None)
    if documents is not None and documents.crossing:  # per row: built once per pass
        key = None if windows is None else tuple(tuple(side) for side in windows)
        block_mask = _document_block_mask(alibi.variant, documents, key, sinks, H, T, S,
                                          q.device)
    elif windows is not None:
        block_mask = _window_block_mask(tuple(tuple(side) for side in windows), T, S, q.device,
                                        sinks, alibi.variant)
    else:
        block_mask = _block_mask(alibi.variant, H, T, S, q.device)
    # compiled for whole sequences (a few shapes); a decoding step grows the keys every call,
    # where recompiling would cost more than the unfused (1, S) scores. Never on the CPU:
    # torch 2.13's compiled CPU kernel returned wrong outputs for some lengths, intermittently
    # (40 or 1000 tokens, even without a score_mod), the eager one never did
    if T == S and q.device.type != "cpu":
        return _compiled_flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
    with warnings.catch_warnings():  # its "use torch.compile" advice is deliberately not taken
        warnings.filterwarnings("ignore", message=".*flex_attention.*", category=UserWarning)
        return eager_flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
