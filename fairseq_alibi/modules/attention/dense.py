"""``sdpa`` and ``naive``: the bias as a dense additive mask.

``sdpa`` is PyTorch's fused ``scaled_dot_product_attention`` reading the ``(H, T, S)`` float
bias (plus fairseq's masks) as its ``attn_mask``; it serves every call. ``naive`` is the
explicit reference — scores, softmax in float32, weights — and what the attention module runs
whenever the caller asks for the weights or the raw scores (fairseq's ``need_weights`` and
``before_softmax``), whichever backend is configured.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq_alibi.alibi import mask_value


def unsupported(call) -> Optional[str]:
    return None  # any device, dtype, variant, mask, cache or dropout


def dense_mask(alibi, bsz, tgt_len, src_len, dtype, key_padding_mask, attn_mask) -> Tensor:
    """``(1 or B, H, tgt, src)`` additive mask: the shared bias plus any fairseq masks."""
    mask = alibi(tgt_len, src_len, dtype).unsqueeze(0)
    if attn_mask is not None:  # fairseq's (tgt, src) mask: bool (True = masked) or float
        if attn_mask.dtype == torch.bool:
            mask = mask.masked_fill(attn_mask, mask_value(dtype))
        else:
            mask = mask + attn_mask.to(dtype).clamp(min=mask_value(dtype))
    if key_padding_mask is not None:
        # a (B, H, tgt, src) tensor only for batches that hold padding, as fairseq does too
        mask = mask.masked_fill(
            key_padding_mask.view(bsz, 1, 1, src_len).to(torch.bool), mask_value(dtype)
        )
    return mask


def sdpa(q, k, v, alibi, key_padding_mask, attn_mask, dropout_p, scale):
    """The ``sdpa`` backend: the fused kernel with the dense float bias."""
    B, H, T, D = q.shape
    mask = dense_mask(alibi, B, T, k.size(2), q.dtype, key_padding_mask, attn_mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                          scale=scale)


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
