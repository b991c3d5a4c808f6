"""``flash``: the ``flash_attn`` package's ``alibi_slopes`` (CUDA, fp16/bf16).

flash_attn adds ``-m·|i + S - T - j|``, causal or not: the ``causal`` and ``symmetric``
variants only. Its ``alibi_slopes`` are a plain input with no gradient, so it cannot train
learned slope scales (it still serves their inference).
"""

import importlib.util
from typing import Optional

import torch

#: the variants flash_attn's ``alibi_slopes`` implements (``-m·|i - j|``, causal or not)
FLASH_VARIANTS = ("causal", "symmetric")
FLASH_DTYPES = (torch.float16, torch.bfloat16)


def installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def unsupported(call) -> Optional[str]:
    """``None`` if :func:`attention` can serve ``call`` (a ``dispatch.Call``), else why not."""
    if call.kind != "distance":
        return ("flash_attn's alibi_slopes take no bias of its own per batch row "
                "(cross-attention, --alibi-length-scale)")
    if call.global_tokens:
        return ("global tokens (--alibi-global-tokens) are not part of this kernel's bias: use "
                "sdpa or naive (auto does)")
    if call.device != "cuda":
        return "flash_attn runs on CUDA only"
    if not installed():
        return "the flash_attn package is not installed"
    if call.variant not in FLASH_VARIANTS:
        return (
            f"flash_attn's alibi_slopes implement {' and '.join(FLASH_VARIANTS)} only, "
            f"not {call.variant}"
        )
    if call.dtype not in FLASH_DTYPES:
        return f"flash_attn needs fp16 or bf16 inputs, got {call.dtype}"
    if call.attn_mask:
        return "flash_attn takes no extra attn_mask"
    if call.scale_grad:
        return ("flash_attn's alibi_slopes take no gradient, so learned slope scales "
                "(--alibi-learned-scales) cannot train with it: use auto, sdpa or flex")
    if call.padded and call.query_len != call.key_len:
        return "flash_attn with key padding needs as many queries as keys here"
    return None


def attention(q, k, v, alibi, key_padding_mask, attn_mask, dropout_p, scale):
    """The ``flash`` backend (``attn_mask`` is refused by :func:`unsupported`)."""
    from flash_attn import flash_attn_func

    B, H, T, D = q.shape
    slopes, _ = alibi.head_slopes()
    slopes = slopes.to(q.device, torch.float32)
    causal = alibi.variant == "causal"
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # flash_attn wants (B, T, H, D)
    if key_padding_mask is None or not key_padding_mask.any():
        out = flash_attn_func(
            q, k, v, dropout_p, softmax_scale=scale, causal=causal, alibi_slopes=slopes
        )
        return out.transpose(1, 2)
    # padding: drop the padded positions, run the variable-length kernel, put them back (the
    # distances between the kept tokens are unchanged when padding sits at one end, as fairseq
    # pads)
    from flash_attn import flash_attn_varlen_func
    from flash_attn.bert_padding import pad_input, unpad_input

    keep = ~key_padding_mask.to(torch.bool)
    q_unpad, indices, cu_seqlens, max_len = unpad_input(q, keep)[:4]
    k_unpad = unpad_input(k, keep)[0]
    v_unpad = unpad_input(v, keep)[0]
    out = flash_attn_varlen_func(
        q_unpad, k_unpad, v_unpad, cu_seqlens, cu_seqlens, max_len, max_len, dropout_p,
        softmax_scale=scale, causal=causal, alibi_slopes=slopes,
    )
    return pad_input(out, indices, B, T).transpose(1, 2)
