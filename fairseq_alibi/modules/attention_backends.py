"""The attention implementations behind ``--alibi-attention``, and how ``auto`` picks one.

Each backend computes ``softmax(q·kᵀ·scale + ALiBi + masks) v`` for ``(B, H, T, D)`` queries
and ``(B, H, S, D)`` keys/values (queries aligned to the end of the keys, as in a KV cache):

=========  ===================================================================================
``sdpa``   PyTorch's fused kernel, in the faster of two forms (:func:`folds`). Folded: on the
           CPU (float32/64, no attention dropout, no KV cache) the bias becomes 4 extra
           query/key columns and the kernel runs with its causal mask, no bias tensor at all
           (:mod:`~fairseq_alibi.modules.folded_attention`). Masked:
           ``scaled_dot_product_attention`` with the ``(H, T, S)`` bias as a float mask.
``flex``   ``torch.nn.attention.flex_attention``: the bias is a ``score_mod``, the hidden keys
           a block ``mask_mod`` (skipped blocks), padding a ``score_mod`` term; compiled for
           full sequences, eager for decoding steps. Every variant. PyTorch has no CPU
           backward for it: inference only on the CPU.
``flash``  the ``flash_attn`` package's ``alibi_slopes`` (CUDA, fp16/bf16): ``causal`` and
           ``symmetric`` only, the two biases it implements.
``naive``  the explicit reference: scores, softmax in float32, weights. Also what every
           backend uses when the caller asks for the attention weights.
=========  ===================================================================================

``auto`` takes the first backend of :data:`AUTO_PREFERENCE` for the device that can serve the
request (:func:`unsupported_reason`); the order is the measured one of ``docs/benchmarks.md``.
A backend chosen by name that cannot serve a request is an error that says why and what to use.
"""

import functools
import importlib.util
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq_alibi.alibi import (
    AlibiPositionalBias,
    alibi_mask_mod,
    alibi_score_mod,
    mask_value,
)
from fairseq_alibi.modules import folded_attention


#: the variants flash_attn's ``alibi_slopes`` implements (``-m·|i - j|``, causal or not)
FLASH_VARIANTS = ("causal", "symmetric")
FLASH_DTYPES = (torch.float16, torch.bfloat16)

#: ``auto``'s order, fastest first, per device type (measured: docs/benchmarks.md). On the CPU
#: ``sdpa`` was faster than compiled flex in every case measured but one_sided inference (up to
#: 10 % slower there), trains, and compiles nothing; on CUDA flash_attn is taken where it is
#: installed and applies (not measured here: no GPU).
AUTO_PREFERENCE = {"cpu": ("sdpa", "naive"), "cuda": ("flash", "sdpa", "naive")}
_OTHER_DEVICES = ("sdpa", "naive")


@dataclass(frozen=True)
class Request:
    """What a backend must do, independent of the tensors' values."""

    device_type: str
    dtype: torch.dtype
    variant: str
    query_len: int
    key_len: int
    needs_grad: bool = False
    need_weights: bool = False  # the caller wants the probabilities (or the raw scores)
    has_attn_mask: bool = False
    has_padding: bool = False
    dropout_p: float = 0.0


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def flex_available() -> bool:
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def unsupported_reason(backend: str, request: Request) -> Optional[str]:
    """``None`` if ``backend`` can serve ``request``, else why not (a sentence)."""
    if request.need_weights and backend != "naive":
        return "the caller asked for the attention weights, which only naive computes"
    if backend in ("naive", "sdpa"):
        return None
    if backend == "flex":
        if not flex_available():
            return f"this torch ({torch.__version__}) has no flex_attention"
        if request.needs_grad and request.device_type == "cpu":
            return (
                f"flex_attention has no CPU backward in torch {torch.__version__}: train with "
                "sdpa or auto, and pick flex at load time for inference if it suits you"
            )
        if request.dropout_p > 0:
            return "flex_attention has no attention dropout"
        return None
    if backend == "flash":
        if request.device_type != "cuda":
            return "flash_attn runs on CUDA only"
        if not flash_attn_installed():
            return "the flash_attn package is not installed"
        if request.variant not in FLASH_VARIANTS:
            return (
                f"flash_attn's alibi_slopes implement {' and '.join(FLASH_VARIANTS)} only, "
                f"not {request.variant}"
            )
        if request.dtype not in FLASH_DTYPES:
            return f"flash_attn needs fp16 or bf16 inputs, got {request.dtype}"
        if request.has_attn_mask:
            return "flash_attn takes no extra attn_mask"
        if request.has_padding and request.query_len != request.key_len:
            return "flash_attn with key padding needs as many queries as keys here"
        return None
    raise ValueError(f"unknown attention backend {backend!r}")


def select_backend(requested: str, request: Request) -> str:
    """The backend to run: ``requested`` itself, or ``auto``'s choice for ``request``."""
    if requested == "auto":
        order = AUTO_PREFERENCE.get(request.device_type, _OTHER_DEVICES)
        return next(b for b in order if unsupported_reason(b, request) is None)
    reason = unsupported_reason(requested, request)
    if reason is not None and request.need_weights:
        return "naive"  # probabilities requested: every backend computes them explicitly
    if reason is not None:
        raise ValueError(
            f"--alibi-attention {requested} cannot serve this call: {reason}. Use "
            "--alibi-attention auto (or another backend), e.g. at load time with "
            "--model-overrides \"{'alibi_attention': 'auto'}\""
        )
    return requested


# --------------------------------------------------------------------------------------------
# the bias as a dense additive mask (naive, and sdpa where it cannot fold)


def dense_mask(
    alibi: AlibiPositionalBias,
    bsz: int,
    tgt_len: int,
    src_len: int,
    dtype: torch.dtype,
    key_padding_mask: Optional[Tensor],
    attn_mask: Optional[Tensor],
) -> Tensor:
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


def naive_attention(q, k, v, mask, scale, dropout: Callable[[Tensor], Tensor]):
    """The explicit computation; returns ``(out, probs)`` with float32 ``(B, H, T, S)`` probs."""
    scores = torch.matmul(q * scale, k.transpose(-1, -2)) + mask
    probs = torch.softmax(scores.float(), dim=-1)
    out = torch.matmul(dropout(probs.type_as(q)), v)
    return out, probs


#: the most memory sdpa spends on a dense float mask (one per batch, shared by the layers; one
#: per layer call when there is padding): beyond it every variant is folded
DENSE_MASK_BUDGET = 64 * 2**20

#: from this length on, causal and one_sided are faster folded than with the dense mask (the
#: CPU kernel only skips masked blocks of long sequences); measured: docs/benchmarks.md
FOLD_MIN_LENGTH = 640


def folds(q, key_len, variant, key_padding_mask, attn_mask, dropout_p) -> bool:
    """Whether :func:`sdpa_attention` folds the bias into the kernel for this call.

    Where both can serve, the faster one measured on the CPU: folded for ``causal`` and
    ``one_sided`` from :data:`FOLD_MIN_LENGTH` keys on, the dense mask otherwise (the
    bidirectional variants, folded as two causal passes, are slower than with the mask at every
    length measured) — unless the mask would take more than :data:`DENSE_MASK_BUDGET`.
    """
    B, H, T, _ = q.shape
    if folded_attention.unsupported_reason(
        q.device.type, q.dtype, T, key_len, dropout_p, attn_mask is not None
    ):
        return False
    rows = B if key_padding_mask is not None else 1  # padding makes the mask (B, H, T, S)
    if rows * H * T * key_len * q.element_size() > DENSE_MASK_BUDGET:
        return True
    return variant not in folded_attention.MERGED_VARIANTS and key_len >= FOLD_MIN_LENGTH


def sdpa_attention(q, k, v, alibi, key_padding_mask, attn_mask, dropout_p, scale):
    """Folded into the fused CPU kernel (:func:`folds`), else SDPA with the dense mask."""
    B, H, T, D = q.shape
    S = k.size(2)
    if folds(q, S, alibi.variant, key_padding_mask, attn_mask, dropout_p):
        slopes, future = alibi.head_slopes()
        return folded_attention.folded_attention(
            q, k, v, slopes, future, alibi.variant, scale, key_padding_mask
        )
    mask = dense_mask(alibi, B, T, S, q.dtype, key_padding_mask, attn_mask)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale
    )


# --------------------------------------------------------------------------------------------
# flex_attention


@functools.lru_cache(maxsize=None)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


@functools.lru_cache(maxsize=64)
def _block_mask(variant, num_heads, query_len, key_len, device):
    from torch.nn.attention.flex_attention import create_block_mask

    mask_mod = alibi_mask_mod(variant, num_heads, key_len - query_len)
    if mask_mod is None:
        return None
    heads = num_heads if variant == "one_sided" else None
    return create_block_mask(mask_mod, None, heads, query_len, key_len, device=device)


def flex_attention(q, k, v, alibi, key_padding_mask, attn_mask, scale):
    """``flex_attention`` with the ALiBi ``score_mod`` and the variant's block mask."""
    from torch.nn.attention.flex_attention import flex_attention as eager_flex

    B, H, T, D = q.shape
    S = k.size(2)
    slopes, future = alibi.head_slopes()
    pad = None if key_padding_mask is None else key_padding_mask.to(torch.bool)
    score_mod = alibi_score_mod(alibi.variant, slopes.to(q.device), future, S - T, pad)
    if attn_mask is not None:
        extra = attn_mask.to(q.device)
        inner = score_mod

        def score_mod(score, b, h, q_idx, kv_idx):
            s = inner(score, b, h, q_idx, kv_idx)
            if extra.dtype == torch.bool:
                return torch.where(extra[q_idx, kv_idx], mask_value(torch.float32), s)
            return s + extra[q_idx, kv_idx].float().clamp(min=mask_value(torch.float32))

    block_mask = _block_mask(alibi.variant, H, T, S, q.device)
    # compiled for whole sequences (a few shapes); a decoding step grows the keys every call,
    # where recompiling would cost more than the unfused (1, S) scores
    if T == S:
        return _compiled_flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
    with warnings.catch_warnings():  # its "use torch.compile" advice is deliberately not taken
        warnings.filterwarnings("ignore", message=".*flex_attention.*", category=UserWarning)
        return eager_flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


# --------------------------------------------------------------------------------------------
# flash_attn


def flash_attention(q, k, v, alibi, key_padding_mask, dropout_p, scale):
    """``flash_attn`` with ``alibi_slopes`` (``-m·|i + S - T - j|``, causal or not)."""
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
