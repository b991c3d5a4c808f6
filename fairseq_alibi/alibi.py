"""The ALiBi math, in one place (Press, Smith & Lewis, "Train Short, Test Long", ICLR 2022).

ALiBi adds no position embeddings. Instead every attention logit gets a bias that is linear in
the distance between query ``i`` and key ``j``, with one fixed slope ``m_h`` per head ``h``::

    softmax(q_i · k_j / sqrt(d) + bias_h(i, j))

Variants (the value of ``bias_h(i, j)``; "masked" means the key is invisible to the query):

==============  ==========================================  ===========================================
variant         past keys (j <= i)                          future keys (j > i)
==============  ==========================================  ===========================================
``causal``      ``-m·(i-j)``                                masked (decoder / causal LM)
``symmetric``   ``-m·(i-j)``                                ``-m·(j-i)``
``one_sided``   heads ``h < H/2``: ``-m·(i-j)``             heads ``h < H/2``: masked
                heads ``h >= H/2``: masked (``j < i``)      heads ``h >= H/2``: ``-m·(j-i)``
``offset``      ``-m·(i-j)``                                ``-m·(j-i-0.5)``
``asymmetric``  ``-m·(i-j)``                                ``-m_f·(j-i)``, ``m_f = ratio·m`` per head
==============  ==========================================  ===========================================

The bias is *relative*: it is computed from ``i - j`` directly, never with the "row trick"
``m·j`` of the original code (softmax is shift-invariant per row, but ``m·j`` grows with the
absolute position and loses all precision in fp16/bf16 at long lengths).

Queries are aligned to the *end* of the keys, so the same call is right for a KV cache: with
``q`` new queries and ``k`` keys in total, query ``t`` sits at position ``i = k - q + t``.

Masked entries hold a large *finite* negative (half the most negative value of the dtype) rather
than ``-inf``: a row whose keys are all masked (an all-padding row) then gives a finite uniform
softmax instead of NaN, while a masked key next to any visible one still gets weight exactly 0.
"""

import math
from typing import Optional

import torch

#: the variants of :func:`alibi_bias`; ``none`` (learned positions, no bias) is a model option
VARIANTS = ("causal", "symmetric", "one_sided", "offset", "asymmetric")

#: attention implementations (``--alibi-attention``); ``auto`` picks the fastest correct one
BACKENDS = ("auto", "sdpa", "flex", "flash", "naive")

#: the variants an encoder may use (``none`` = stock learned position embeddings, no ALiBi)
ENCODER_VARIANTS = ("symmetric", "one_sided", "offset", "asymmetric", "none")


def _geometric_slopes(n: int):
    # Press et al.: for n a power of two, start = ratio = 2^(-8/n), slopes start·ratio^i
    start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
    return [start * start**i for i in range(n)]


def _slopes_list(n: int):
    if math.log2(n).is_integer():
        return _geometric_slopes(n)
    # not a power of two: the closest lower power of two, then every other slope of twice that
    closest = 2 ** math.floor(math.log2(n))
    return _geometric_slopes(closest) + _slopes_list(2 * closest)[0::2][: n - closest]


def get_slopes(num_heads: int) -> torch.Tensor:
    """Press et al.'s geometric head slopes, float32, shape ``(num_heads,)``.

    For ``H`` a power of two the slopes are ``2^(-8/H), 2^(-16/H), ..., 2^(-8)``
    (8 heads: 1/2, 1/4, ..., 1/256). Otherwise they are the slopes of the closest lower power
    of two ``P`` followed by every other slope of ``2P`` heads, up to ``H`` in all — exactly the
    reference code of the paper.
    """
    if not isinstance(num_heads, int) or isinstance(num_heads, bool) or num_heads < 1:
        raise ValueError(f"ALiBi needs a positive whole number of attention heads, got {num_heads!r}")
    return torch.tensor(_slopes_list(num_heads), dtype=torch.float64).float()


def check_variant(variant: str, num_heads: Optional[int] = None, allowed=VARIANTS) -> str:
    """Validate a variant name (and, for ``one_sided``, the head count); return it."""
    if variant not in allowed:
        raise ValueError(
            f"unknown ALiBi variant {variant!r}; choose one of: {', '.join(allowed)}"
        )
    if variant == "one_sided" and num_heads is not None and num_heads % 2 != 0:
        raise ValueError(
            f"one_sided ALiBi needs an even number of attention heads (half look back, half "
            f"ahead), got {num_heads}; use an even head count or another variant "
            f"(symmetric, offset)"
        )
    return variant


def variant_slopes(num_heads: int, variant: str) -> torch.Tensor:
    """The slopes a variant uses: ``one_sided`` gives each half the full range of ``H/2`` heads."""
    check_variant(variant, num_heads)
    if variant == "one_sided":
        half = get_slopes(num_heads // 2)
        return torch.cat([half, half])
    return get_slopes(num_heads)


def mask_value(dtype: torch.dtype) -> float:
    """The finite stand-in for ``-inf`` in ``dtype`` (room is left for the logits added to it)."""
    return torch.finfo(dtype).min / 2


def alibi_bias(
    slopes: torch.Tensor,
    query_len: int,
    key_len: int,
    variant: str = "causal",
    future_slopes: Optional[torch.Tensor] = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The ALiBi bias, shape ``(H, query_len, key_len)``, to add to the attention logits.

    ``bias[h, t, j]`` for query position ``i = key_len - query_len + t`` and key ``j`` follows
    the table in the module docstring. ``slopes`` is ``(H,)`` (see :func:`variant_slopes`);
    ``future_slopes`` (``(H,)``) is required by ``asymmetric`` only. The bias is computed in
    float32 on ``slopes.device`` and returned in ``dtype``; masked keys hold
    :func:`mask_value` of ``dtype``.
    """
    num_heads = slopes.shape[0]
    check_variant(variant, num_heads)
    if query_len > key_len:
        raise ValueError(f"query_len ({query_len}) cannot exceed key_len ({key_len})")
    device = slopes.device
    m = slopes.float()[:, None, None]
    # distance i - j, exact in float32 up to 2^24 positions
    pos_q = torch.arange(key_len - query_len, key_len, device=device, dtype=torch.float32)
    pos_k = torch.arange(key_len, device=device, dtype=torch.float32)
    rel = pos_q[:, None] - pos_k[None, :]
    past = rel.clamp(min=0)
    future = (-rel).clamp(min=0)

    masked = None
    if variant == "causal":
        bias = -m * past
        masked = (rel < 0).expand(num_heads, -1, -1)
    elif variant == "symmetric":
        bias = -m * rel.abs()
    elif variant == "offset":
        bias = -m * (past + (future - 0.5).clamp(min=0))
    elif variant == "asymmetric":
        if future_slopes is None:
            raise ValueError("the asymmetric ALiBi variant needs future_slopes")
        bias = -m * past - future_slopes.float()[:, None, None] * future
    elif variant == "one_sided":
        bias = -m * rel.abs()
        looks_ahead = torch.arange(num_heads, device=device) >= num_heads // 2
        masked = torch.where(looks_ahead[:, None, None], rel > 0, rel < 0)
    bias = bias.expand(num_heads, -1, -1).to(dtype)
    if masked is not None:  # filled after the cast: the mask value is the target dtype's
        bias = bias.masked_fill(masked, mask_value(dtype))
    return bias


#: extra query/key columns of :func:`alibi_fold` (one past the last is free for a padding column)
FOLD_COLUMNS = 4


def split_slopes(slopes: torch.Tensor, max_abs_position: int):
    """``m = m_hi + m_lo`` with ``m_hi·p`` exact in float32 for every ``|p| <= max_abs_position``.

    ``m_hi`` keeps the top ``24 - bits(max_abs_position)`` significant bits of ``m`` (at least
    one); ``m_lo = m - m_hi`` is exact too (the bits that remain). Only ``m_lo`` carries the
    gradient of ``m`` (straight through), which is the whole gradient: see :func:`alibi_fold`.
    """
    slopes = slopes.float()
    keep = max(1, 24 - int(max_abs_position).bit_length())
    mantissa, exponent = torch.frexp(slopes.detach().double())
    hi = torch.ldexp(torch.round(torch.ldexp(mantissa, torch.tensor(keep))), exponent - keep)
    hi = hi.float()
    return hi, slopes - hi


def alibi_fold(slopes: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor):
    """The look-back bias ``-m·(i - j)`` as a dot product of 4 extra query and key columns.

    Returns ``q_cols`` ``(H, Lq, 4)`` and ``k_cols`` ``(Lk, 4)``, float32, with
    ``q_cols[h, t] · k_cols[s] = -m_h·(i_t - j_s)`` for every query position ``i_t`` and key
    position ``j_s``. With ``c`` the centre of the positions and ``m = m_hi + m_lo``
    (:func:`split_slopes`)::

        q_cols[h, t] = [ m_hi,  -m_hi·(i_t - c),  m_lo,  -m_lo·(i_t - c) ]
        k_cols[s]    = [ j_s - c,        1,       j_s - c,        1      ]

    Appended *before* the scaled query and the key, these columns let an attention kernel
    with a plain causal mask compute ``q·k/√d - m·(i - j)`` with no bias tensor at all: the
    bias has rank 2 on the visible triangle. Summed in column order, the two ``m_hi`` products
    are exact and cancel exactly, so the logit is as accurate as with a stored bias even far
    from position 0 (a single ``m·j`` column, the "row trick", is not: it loses
    ``ulp(m·L)``). The look-ahead half of the bidirectional variants uses the same columns on
    time-reversed positions. The gradient of ``m`` flows through the ``m_lo`` columns and is
    exact: ``d/dm`` of the dot product is ``(j - c) - (i - c) = -(i - j)``.
    """
    query_positions = query_positions.float()
    key_positions = key_positions.float()
    span = torch.cat([query_positions, key_positions])
    if span.numel() == 0:
        centre = 0.0
    else:
        centre = float(torch.floor((span.min() + span.max()) / 2))
    q_rel = query_positions - centre
    k_rel = key_positions - centre
    hi, lo = split_slopes(slopes, int(span.sub(centre).abs().max()) if span.numel() else 0)
    hi, lo = hi[:, None], lo[:, None]
    q_cols = torch.stack(
        [hi.expand(-1, q_rel.numel()), -hi * q_rel, lo.expand(-1, q_rel.numel()), -lo * q_rel],
        dim=-1,
    )
    ones = torch.ones_like(k_rel)
    k_cols = torch.stack([k_rel, ones, k_rel, ones], dim=-1)
    return q_cols, k_cols


def alibi_score_mod(
    variant: str,
    slopes: torch.Tensor,
    future_slopes: Optional[torch.Tensor] = None,
    query_offset: int = 0,
    key_padding_mask: Optional[torch.Tensor] = None,
):
    """A ``flex_attention`` ``score_mod`` adding the ALiBi bias of ``variant`` to each logit.

    ``score + bias_h(i, j)`` with ``i = query_offset + q_idx`` (queries aligned to the end of
    the keys, as in :func:`alibi_bias`) and the values of the module's table for the visible
    keys; keys a variant hides are the business of :func:`alibi_mask_mod`. Padded keys
    (``key_padding_mask[b, j]`` True) get :func:`mask_value` of float32, so an all-padding row
    stays finite.
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


def alibi_mask_mod(variant: str, num_heads: int, query_offset: int = 0):
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


class AlibiPositionalBias(torch.nn.Module):
    """One ALiBi bias per model, shared by all its attention layers.

    Holds the slopes (a float32 buffer, saved with the model so that a checkpoint says it is an
    ALiBi one) and builds :func:`alibi_bias` for the lengths asked for. The last result is
    memoised, so the layers of one forward pass share a single ``(H, q, k)`` tensor, and
    nothing is ever sized by a maximum length: an incremental decoding step builds ``(H, 1, k)``.

    ``slope_scale`` multiplies every slope at run time (slope interpolation at inference); it is
    not saved, so it can be set at load time without touching the checkpoint. ``backend`` is
    the attention implementation the model's layers use (one of :data:`BACKENDS`).
    """

    def __init__(
        self,
        num_heads: int,
        variant: str = "causal",
        future_slope_ratio: float = 1.0,
        learnable_future_slopes: bool = False,
        backend: str = "auto",
        slope_scale: float = 1.0,
    ):
        super().__init__()
        self.variant = check_variant(variant, num_heads)
        if backend not in BACKENDS:
            raise ValueError(
                f"unknown ALiBi attention backend {backend!r}; choose one of: {', '.join(BACKENDS)}"
            )
        if not slope_scale > 0:
            raise ValueError(f"the ALiBi slope scale must be positive, got {slope_scale}")
        self.backend = backend
        self.num_heads = num_heads
        self.register_buffer("slopes", variant_slopes(num_heads, variant))
        self.slope_scale = float(slope_scale)
        # asymmetric only: forward slope = ratio x backward slope, per head (optionally learned)
        ratio = None
        if variant == "asymmetric":
            ratio = torch.full((num_heads,), float(future_slope_ratio))
        if ratio is not None and learnable_future_slopes:
            self.future_slope_ratio = torch.nn.Parameter(ratio)
        else:
            self.register_buffer("future_slope_ratio", ratio)
        self._memo_key = None
        self._memo = None

    def _apply(self, fn, *args, **kwargs):
        # model.half() / .bfloat16() must not round the slopes: the bias is built in float32
        exact = self.slopes.float()
        out = super()._apply(fn, *args, **kwargs)
        self.slopes = exact.to(self.slopes.device)
        self._memo_key = self._memo = None
        return out

    def extra_repr(self):
        return f"num_heads={self.num_heads}, variant={self.variant}, backend={self.backend}"

    def head_slopes(self):
        """``(slopes, future_slopes)``, float32 ``(H,)`` each, ``slope_scale`` applied.

        ``future_slopes`` (``ratio·m``) is ``None`` except for ``asymmetric``; it carries the
        gradient of a learnable ratio. Attention backends that never build the bias use these.
        """
        slopes = self.slopes.float() * self.slope_scale
        future = None
        if self.future_slope_ratio is not None:
            future = slopes * self.future_slope_ratio.float()
        return slopes, future

    def forward(self, query_len: int, key_len: int, dtype: torch.dtype = torch.float32):
        learnable = isinstance(self.future_slope_ratio, torch.nn.Parameter)
        version = self.future_slope_ratio._version if learnable else None
        key = (query_len, key_len, dtype, self.slopes.device, self.slope_scale, version)
        if key == self._memo_key and not (learnable and torch.is_grad_enabled()):
            return self._memo
        slopes, future = self.head_slopes()
        bias = alibi_bias(slopes, query_len, key_len, self.variant, future, dtype)
        self._memo_key, self._memo = key, bias
        return bias
