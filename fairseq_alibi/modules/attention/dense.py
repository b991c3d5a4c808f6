"""``sdpa`` and ``naive``: the bias as a dense additive mask.

``sdpa`` is PyTorch's fused ``scaled_dot_product_attention`` reading the ``(H, T, S)`` float
bias (plus fairseq's masks) as its ``attn_mask``; it serves every call. ``naive`` is the
explicit reference — scores, softmax in float32, weights — and what the attention module runs
whenever the caller asks for the weights or the raw scores (fairseq's ``need_weights`` and
``before_softmax``), whichever backend is configured.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq_alibi.alibi import document_mask, mask_value, masked_with
from fairseq_alibi.modules.attention.capabilities import Capabilities


#: both serve every call: either kind of bias, any device, dtype, variant, mask, cache or dropout,
#: with slope windows and their attention sinks too (the bias's dense tensor holds them:
#: ``alibi.windowed_alibi_bias``, a KV cache's kept positions included) and document masks
#: (masked in the dense mask: ``alibi.document_mask``)
CAPABILITIES = Capabilities(kinds=("distance", "rows"), windows=True, sinks=True,
                            sink_cache=True, documents=True)


def dense_mask(alibi, bsz, tgt_len, src_len, dtype, key_padding_mask, attn_mask) -> Tensor:
    """``(1 or B, H, tgt, src)`` additive mask: the bias plus any fairseq masks.

    ``alibi.dense(tgt_len, src_len, dtype)`` is the ``(H, tgt, src)`` bias shared by the batch
    (kind ``distance``), or a 4-D one of its own per row (kind ``rows``: the cross-attention's
    position bias); with documents that cross (``alibi.documents``), the keys of other
    documents masked (:func:`~fairseq_alibi.alibi.document_mask`, ``(B, H, tgt, src)``)
    unless the bias holds that mask (``dense_masks_documents``)."""
    mask = alibi.dense(tgt_len, src_len, dtype)
    if mask.dim() == 3:
        mask = mask.unsqueeze(0)
    documents = getattr(alibi, "documents", None)
    if documents is not None and documents.crossing and not alibi.dense_masks_documents:
        mask = masked_with(mask, document_mask(documents.ids, tgt_len), dtype)
    if attn_mask is not None:  # fairseq's (tgt, src) mask: bool (True = masked) or float
        if attn_mask.dtype == torch.bool:
            mask = masked_with(mask, attn_mask, dtype)
        else:
            mask = mask + attn_mask.to(dtype).clamp(min=mask_value(dtype))
    if key_padding_mask is not None:
        # a (B, H, tgt, src) tensor only for batches that hold padding, as fairseq does too
        mask = masked_with(mask, key_padding_mask.view(bsz, 1, 1, src_len).to(torch.bool),
                           dtype)
    return mask


def padding_column(q, k, key_padding_mask, scale):
    """``(q', k')``: one more column, ``1`` on every query and ``c`` on a padding key (``0`` on
    the others), so that ``scale·q'·k' = scale·q·k + scale·c`` hides the padding keys.

    A key padding mask merged into the bias makes the mask per sequence, ``(B, H, T, S)``,
    rebuilt by every layer and kept by each for its backward; this way the bias stays one
    ``(H, T, S)`` tensor shared by the batch and the layers, as for unpadded batches. ``c`` is
    :func:`mask_value` (divided by ``scale`` if that is above 1): finite, so the row of a query
    that sees only padding keys stays finite (an output nothing reads).
    """
    B, H, T, D = q.shape
    fill = mask_value(q.dtype) / max(scale, 1.0)
    q_col = q.new_ones(B, H, T, 1)
    k_col = torch.zeros(B, 1, k.size(2), 1, dtype=k.dtype, device=k.device)
    k_col.masked_fill_(key_padding_mask.view(B, 1, -1, 1).to(torch.bool), fill)
    return torch.cat([q, q_col], dim=-1), torch.cat([k, k_col.expand(-1, H, -1, -1)], dim=-1)


def sdpa(q, k, v, alibi, key_padding_mask, attn_mask, dropout_p, scale):
    """The ``sdpa`` backend: the fused kernel with the dense float bias (key padding as one
    more query/key column on the CPU, where it was measured: :func:`padding_column`; not for a
    decoding step, whose mask is one row per sequence anyway)."""
    B, H, T, D = q.shape
    if key_padding_mask is not None and T > 1 and q.device.type == "cpu":
        q, k = padding_column(q, k, key_padding_mask, scale)
        mask = dense_mask(alibi, B, T, k.size(2), q.dtype, None, attn_mask)
        # the fused CPU kernel wants one head size for q, k and v (else it runs unfused)
        out = F.scaled_dot_product_attention(q, k, F.pad(v, (0, 1)), attn_mask=mask,
                                             dropout_p=dropout_p, scale=scale)
        return out[..., :D]
    mask = dense_mask(alibi, B, T, k.size(2), q.dtype, key_padding_mask, attn_mask)
    if q.device.type == "cuda":
        mask = aligned(mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                          scale=scale)


def sinks_apart(q, sinks, k, v, alibi, key_padding_mask, scale):
    """What :func:`sdpa` gives for the keys ``cat([sink_k, k])`` and values ``cat([sink_v,
    v])`` (``sinks``: ``(sink_k, sink_v)``), without joining them: the scores of both parts
    side by side, one softmax (float32 for half inputs), each part's values weighted by its
    share. For a decoding step against a KV cache that keeps its attention sinks apart from
    its rolling window, where joining them copied the whole cache at every step and layer
    (docs/decoding.md)."""
    sink_k, sink_v = sinks
    B, H, T, _ = q.shape
    S = sink_k.size(2)
    mask = dense_mask(alibi, B, T, S + k.size(2), q.dtype, key_padding_mask, None)
    # half inputs: scores, mask and softmax in float32 (a half score plus the mask value could
    # round to -inf, and a row of them to NaN)
    work = q.dtype if q.dtype in (torch.float32, torch.float64) else torch.float32
    scores = torch.cat([torch.matmul(q, sink_k.transpose(-1, -2)),
                        torch.matmul(q, k.transpose(-1, -2))], dim=-1).to(work)
    probs = torch.softmax(scores * scale + mask.to(work), dim=-1).to(q.dtype)
    return torch.matmul(probs[..., S:], v) + torch.matmul(probs[..., :S], sink_v)


def sinks_last(q, k, v, alibi, key_padding_mask, scale, held):
    """:func:`sdpa` for a call against a KV cache that holds its window with its ``held``
    attention sinks after it in one buffer (``k``, ``v``: a view of it; ``alibi`` and the
    padding in that order): one fused call, no copy of the window."""
    return sdpa(q, k, v, alibi, key_padding_mask, None, 0.0, scale)


#: the start of a bias that CUDA's fused attention kernels read, in bytes
CUDA_BIAS_ALIGNMENT = 16


def aligned(mask: Tensor) -> Tensor:
    """``mask``, copied if its data does not start on a :data:`CUDA_BIAS_ALIGNMENT` boundary.

    A decoding step's bias row is a view into one cached table at any offset
    (``BiasCache.last_query_row``); CUDA's memory-efficient kernel read such a view with
    "CUDA error: misaligned address" in float32 (a fault that poisons the process) and refused
    it in float16 ("p.attn_bias_ptr is not correctly aligned"): fairseq-generate crashed on the
    first step (H100, torch 2.11; docs/benchmarks.md, "GPU"). The copy is one ``(H, 1, S)`` row.
    """
    if (mask.storage_offset() * mask.element_size()) % CUDA_BIAS_ALIGNMENT:
        return mask.clone()
    return mask


def scores(q, k, alibi, key_padding_mask, attn_mask, scale) -> Tensor:
    """``(B, H, T, S)`` logits ``q·kᵀ·scale`` + bias + masks, before the softmax."""
    B, H, T, D = q.shape
    mask = dense_mask(alibi, B, T, k.size(2), q.dtype, key_padding_mask, attn_mask)
    return torch.matmul(q * scale, k.transpose(-1, -2)) + mask


def naive_with_weights(q, k, v, alibi, key_padding_mask, attn_mask, dropout_p, scale):
    """``(out, probs)``: the explicit computation, with float32 ``(B, H, T, S)`` probabilities."""
    probs = torch.softmax(scores(q, k, alibi, key_padding_mask, attn_mask, scale).float(), -1)
    dropped = probs.type_as(q)
    if dropout_p > 0:
        dropped = F.dropout(dropped, p=dropout_p, training=True)
    return torch.matmul(dropped, v), probs


def naive(q, k, v, alibi, key_padding_mask, attn_mask, dropout_p, scale):
    """The ``naive`` backend: :func:`naive_with_weights` without the weights."""
    return naive_with_weights(q, k, v, alibi, key_padding_mask, attn_mask, dropout_p, scale)[0]
