"""``flash``: the ``flash_attn`` package's ``alibi_slopes`` (CUDA, fp16/bf16).

flash_attn adds ``-m·|i + S - T - j|``, causal or not: the ``causal`` and ``symmetric``
variants only. Its ``alibi_slopes`` are a plain input with no gradient, so it cannot train
learned slope scales (it still serves their inference).
"""

import importlib.util
from typing import Optional

import torch

from fairseq_alibi.modules.attention.capabilities import Capabilities

#: the variants flash_attn's ``alibi_slopes`` implements (``-m·|i - j|``, causal or not)
FLASH_VARIANTS = ("causal", "symmetric")
FLASH_DTYPES = (torch.float16, torch.bfloat16)


def installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def _missing() -> Optional[str]:
    return None if installed() else "the flash_attn package is not installed"


#: what :func:`attention` serves: ``alibi_slopes`` of causal and symmetric on CUDA in fp16/bf16,
#: dropout and KV caches (key padding only with as many queries as keys: the variable-length
#: kernel here); no extra mask, no global tokens, no gradient for the slopes
CAPABILITIES = Capabilities(
    kinds=("distance",), variants=FLASH_VARIANTS, devices=("cuda",), dtypes=FLASH_DTYPES,
    padded_kv_cache=False, attn_mask=False, global_tokens=False, scale_grad=False,
    missing=_missing)


def attention(q, k, v, alibi, key_padding_mask, attn_mask, dropout_p, scale):
    """The ``flash`` backend (for the calls of :data:`CAPABILITIES`)."""
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
