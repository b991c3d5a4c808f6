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
    bias = bias.expand(num_heads, -1, -1)
    if masked is not None:
        bias = bias.masked_fill(masked, mask_value(dtype))
    return bias.to(dtype)


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

    def forward(self, query_len: int, key_len: int, dtype: torch.dtype = torch.float32):
        learnable = isinstance(self.future_slope_ratio, torch.nn.Parameter)
        version = self.future_slope_ratio._version if learnable else None
        key = (query_len, key_len, dtype, self.slopes.device, self.slope_scale, version)
        if key == self._memo_key and not (learnable and torch.is_grad_enabled()):
            return self._memo
        slopes = self.slopes * self.slope_scale
        future = None
        if self.future_slope_ratio is not None:
            future = slopes * self.future_slope_ratio.float()
        bias = alibi_bias(slopes, query_len, key_len, self.variant, future, dtype)
        self._memo_key, self._memo = key, bias
        return bias
