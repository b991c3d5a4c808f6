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

The bias is computed from ``i - j``, never with the "row trick" ``m·j`` (which loses all
precision in fp16/bf16 at long lengths). Queries are aligned to the *end* of the keys (a KV
cache: with ``q`` new queries and ``k`` keys, query ``t`` sits at ``i = k - q + t``). Masked
entries hold a *finite* negative (:func:`mask_value`): an all-padding row gives a finite uniform
softmax instead of NaN, a masked key next to a visible one still gets weight exactly 0.

Learned slope scales (data2vec 2.0's ``learned_alibi_scale``): layer ``l`` may multiply the
bias of head ``h`` by a trained ``s[l, h]``, i.e. use the slopes ``s[l, h]·m_h``
(``s[l, h]·m_f,h`` for the look-ahead keys of ``asymmetric``)::

    bias_{l,h}(i, j) = s[l, h] · bias_h(i, j)        (masked keys stay masked)

``s`` has one entry (``shared``), one per head (``per_head``), per layer (``per_layer``) or per
layer and head (``per_layer_head``), initialised to ``scale_init``; with ``none`` (the default)
no scale exists and nothing is multiplied. See :data:`SCALE_MODES`.
"""

import math
from typing import Optional

import torch

#: the variants of :func:`alibi_bias`; ``none`` (learned positions, no bias) is a model option
VARIANTS = ("causal", "symmetric", "one_sided", "offset", "asymmetric")

#: the variants an encoder may use (``none`` = stock learned position embeddings, no ALiBi)
ENCODER_VARIANTS = ("symmetric", "one_sided", "offset", "asymmetric", "none")


def _slopes_list(n: int):
    if math.log2(n).is_integer():  # start = ratio = 2^(-8/n), slopes start·ratio^i
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]
    # not a power of two: the closest lower power of two, then every other slope of twice that
    closest = 2 ** math.floor(math.log2(n))
    return _slopes_list(closest) + _slopes_list(2 * closest)[0::2][: n - closest]


#: which slope scales are learned (``--alibi-learned-scales``): the shape of ``s`` is
#: (layers if per layer else 1, heads if per head else 1)
SCALE_MODES = ("none", "shared", "per_head", "per_layer", "per_layer_head")


def check_scale_options(learned_scales: str, scale_init: float, flag: str = "--alibi") -> None:
    """Clear errors for an unknown scale mode or a non-positive initial scale.

    ``flag`` is the option prefix the user typed (``--encoder-alibi`` on a translation model).
    """
    if learned_scales not in SCALE_MODES:
        raise ValueError(
            f"unknown {flag}-learned-scales {learned_scales!r}; choose one of: "
            f"{', '.join(SCALE_MODES)}"
        )
    if not (isinstance(scale_init, (int, float)) and math.isfinite(scale_init)
            and scale_init > 0):
        raise ValueError(
            f"{flag}-scale-init must be a positive number (it multiplies every ALiBi slope; "
            f"1.0 = Press et al.'s slopes), got {scale_init!r}"
        )


def get_slopes(num_heads: int) -> torch.Tensor:
    """Press et al.'s geometric head slopes, float32, shape ``(num_heads,)``.

    For ``H`` a power of two: ``2^(-8/H), 2^(-16/H), ..., 2^(-8)`` (8 heads: 1/2 ... 1/256);
    otherwise those of the closest lower power of two ``P``, then every other slope of ``2P``
    heads, up to ``H`` — exactly the reference code of the paper.
    """
    if not isinstance(num_heads, int) or isinstance(num_heads, bool) or num_heads < 1:
        raise ValueError(f"ALiBi needs a positive whole number of attention heads, got {num_heads!r}")
    return torch.tensor(_slopes_list(num_heads), dtype=torch.float64).float()


def check_variant(variant: str, num_heads: Optional[int] = None, allowed=VARIANTS) -> str:
    """Validate a variant name (and, for ``one_sided``, the head count); return it."""
    if variant not in allowed:
        raise ValueError(f"unknown ALiBi variant {variant!r}; choose one of: {', '.join(allowed)}")
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
        return torch.cat([get_slopes(num_heads // 2)] * 2)
    return get_slopes(num_heads)


def mask_value(dtype: torch.dtype) -> float:
    """The finite stand-in for ``-inf`` in ``dtype`` (room is left for the logits added to it)."""
    return torch.finfo(dtype).min / 2


def alibi_bias(slopes, query_len, key_len, variant="causal", future_slopes=None,
               dtype=torch.float32) -> torch.Tensor:
    """The ALiBi bias, shape ``(H, query_len, key_len)``, to add to the attention logits.

    ``bias[h, t, j]`` for query position ``i = key_len - query_len + t`` and key ``j`` follows
    the module's table. ``slopes`` is ``(H,)`` (see :func:`variant_slopes`); ``future_slopes``
    (``(H,)``) is required by ``asymmetric`` only. Computed in float32 on ``slopes.device``,
    returned in ``dtype``; masked keys hold :func:`mask_value` of ``dtype``.
    """
    num_heads, device = slopes.shape[0], slopes.device
    check_variant(variant, num_heads)
    if query_len > key_len:
        raise ValueError(f"query_len ({query_len}) cannot exceed key_len ({key_len})")
    if variant == "asymmetric" and future_slopes is None:
        raise ValueError("the asymmetric ALiBi variant needs future_slopes")
    m = slopes.float()[:, None, None]
    # distance i - j, exact in float32 up to 2^24 positions
    pos_q = torch.arange(key_len - query_len, key_len, device=device, dtype=torch.float32)
    rel = pos_q[:, None] - torch.arange(key_len, device=device, dtype=torch.float32)[None, :]
    past, future = rel.clamp(min=0), (-rel).clamp(min=0)
    masked = None
    if variant == "causal":
        bias, masked = -m * past, (rel < 0).expand(num_heads, -1, -1)
    elif variant == "symmetric":
        bias = -m * rel.abs()
    elif variant == "offset":
        bias = -m * (past + (future - 0.5).clamp(min=0))
    elif variant == "asymmetric":
        bias = -m * past - future_slopes.float()[:, None, None] * future
    else:  # one_sided: heads h >= H/2 look ahead
        bias = -m * rel.abs()
        looks_ahead = torch.arange(num_heads, device=device) >= num_heads // 2
        masked = torch.where(looks_ahead[:, None, None], rel > 0, rel < 0)
    bias = bias.expand(num_heads, -1, -1).to(dtype)
    if masked is not None:  # filled after the cast: the mask value is the target dtype's
        bias = bias.masked_fill(masked, mask_value(dtype))
    return bias


class AlibiPositionalBias(torch.nn.Module):
    """One ALiBi bias per model, shared by all its attention layers.

    Holds the slopes (a float32 buffer: a checkpoint says it is an ALiBi one). Backends ask it
    for the slopes of this call (:meth:`head_slopes`) or for the bias (calling it:
    :func:`alibi_bias`, memoised so that the layers of a forward pass share one tensor, never
    sized by a maximum length). ``slope_scale`` multiplies every slope at run time (slope
    interpolation); it is not saved, so it can be set at load time.

    ``learned_scales`` (:data:`SCALE_MODES`) adds the trained scales ``s`` (a parameter
    ``scales`` of shape ``(layers or 1, heads or 1)``, saved with the model, initialised to
    ``scale_init``); layer ``l`` then asks for its own slopes and bias through
    :meth:`at_layer`. With ``none``, ``scale_init`` is a fixed multiplier (no parameter) and,
    at 1.0, nothing is multiplied at all: the model computes exactly what it did before scales
    existed. ``slope_scale`` multiplies on top of either.
    """

    def __init__(self, num_heads: int, variant: str = "causal", future_slope_ratio: float = 1.0,
                 learnable_future_slopes: bool = False, slope_scale: float = 1.0,
                 num_layers: int = 1, learned_scales: str = "none", scale_init: float = 1.0):
        super().__init__()
        self.variant = check_variant(variant, num_heads)
        if not slope_scale > 0:
            raise ValueError(f"the ALiBi slope scale must be positive, got {slope_scale}")
        check_scale_options(learned_scales, scale_init)
        self.num_heads = num_heads
        self.register_buffer("slopes", variant_slopes(num_heads, variant))
        self.slope_scale = float(slope_scale)
        self.learned_scales = learned_scales
        self.scale_init = float(scale_init)
        if learned_scales == "none":
            self.register_parameter("scales", None)
        else:
            rows = num_layers if learned_scales in ("per_layer", "per_layer_head") else 1
            cols = num_heads if learned_scales in ("per_head", "per_layer_head") else 1
            self.scales = torch.nn.Parameter(torch.full((rows, cols), self.scale_init))
        self._layer_views = {}
        self._register_load_state_dict_pre_hook(_load_scales, with_module=True)
        # asymmetric only: forward slope = ratio x backward slope, per head (optionally learned)
        ratio = torch.full((num_heads,), float(future_slope_ratio)) \
            if variant == "asymmetric" else None
        if ratio is not None and learnable_future_slopes:
            self.future_slope_ratio = torch.nn.Parameter(ratio)
        else:
            self.register_buffer("future_slope_ratio", ratio)
        # the last bias, _last_query_row's table: a dict, as nn.Module.__setattr__ is slow
        self._cache = {}

    def _apply(self, fn, *args, **kwargs):
        # model.half() / .bfloat16() must not round the slopes: the bias is built in float32
        exact = self.slopes.float()
        out = super()._apply(fn, *args, **kwargs)
        self.slopes = exact.to(self.slopes.device)
        self._cache.clear()
        return out

    def at_layer(self, layer: int):
        """What layer ``layer``'s attention uses: this module itself when no scale is learned
        (every layer shares its bias, as before scales existed), else a :class:`LayerAlibi`
        view whose slopes and bias carry that layer's scales (and their gradient)."""
        if self.scales is None:
            return self
        view = self._layer_views.get(layer)
        if view is None:
            view = self._layer_views[layer] = LayerAlibi(self, layer)
        return view

    def _scale_row(self, layer: Optional[int]) -> int:
        rows = self.scales.size(0)
        if rows == 1:
            return 0
        if layer is None or not 0 <= layer < rows:
            raise ValueError(
                f"per-layer ALiBi scales ({rows} layers) need the index of the layer asking "
                f"for its slopes, got {layer!r}"
            )
        return layer

    def head_slopes(self, layer: Optional[int] = None):
        """``(slopes, future_slopes)``, float32 ``(H,)``, ``slope_scale`` applied; ``future``
        (``ratio·m``, with a learnable ratio's gradient) is ``None`` but for ``asymmetric``.
        With learned scales, those of layer ``layer`` multiply both (with their gradient)."""
        slopes = self.slopes.float() * self.slope_scale
        if self.scales is not None:
            slopes = slopes * self.scales[self._scale_row(layer)].float()
        elif self.scale_init != 1.0:  # a fixed, not learned, multiplier
            slopes = slopes * self.scale_init
        future = None
        if self.future_slope_ratio is not None:
            future = slopes * self.future_slope_ratio.float()
        return slopes, future

    def forward(self, query_len: int, key_len: int, dtype: torch.dtype = torch.float32,
                layer: Optional[int] = None):
        if self.scales is not None:
            return self._scaled_bias(query_len, key_len, dtype, layer)
        learnable = isinstance(self.future_slope_ratio, torch.nn.Parameter)
        version = self.future_slope_ratio._version if learnable else None
        key = (query_len, key_len, dtype, self.slopes.device, self.slope_scale, version)
        cache = self._cache
        if key == cache.get("key") and not (learnable and torch.is_grad_enabled()):
            return cache["bias"]
        if query_len == 1 and self.variant != "one_sided":
            bias = self._last_query_row(key_len, dtype)
        else:
            slopes, future = self.head_slopes()
            bias = alibi_bias(slopes, query_len, key_len, self.variant, future, dtype)
        cache["key"], cache["bias"] = key, bias
        return bias

    def _scaled_bias(self, query_len, key_len, dtype, layer):
        """The bias of layer ``layer`` with learned scales. Built per call while autograd
        records (a cached tensor would hold a graph that a backward frees); otherwise the last
        one is memoised, so the layers that share a row (``shared``, ``per_head``) share it and
        per-layer scales never keep one bias per layer alive."""
        row = self._scale_row(layer)
        if torch.is_grad_enabled() and (self.scales.requires_grad or isinstance(
                self.future_slope_ratio, torch.nn.Parameter)):
            slopes, future = self.head_slopes(layer)
            return alibi_bias(slopes, query_len, key_len, self.variant, future, dtype)
        ratio = self.future_slope_ratio
        key = (row, query_len, key_len, dtype, self.slopes.device, self.slope_scale,
               self.scales._version, None if ratio is None else ratio._version)
        cache = self._cache
        if cache.get("scaled_key") != key:
            cache["scaled_bias"] = None  # freed before the next one is built
            slopes, future = self.head_slopes(layer)
            cache["scaled_bias"] = alibi_bias(slopes, query_len, key_len, self.variant, future,
                                              dtype)
            cache["scaled_key"] = key
        return cache["scaled_bias"]

    def _last_query_row(self, key_len, dtype):
        """``(H, 1, k)``: a decoding step's row ``-m·(k-1-j)``, a view of a cached table.

        The query sits at the last position, every key behind it: the look-back bias for every
        variant but ``one_sided``. It is the last ``k`` columns of ``-m·(N-1-j)``, ``N >= k``, so
        one ``(H, N)`` table (grown by doubling) serves every step.
        """
        rows, scale = self._cache.get("rows"), self._cache.get("rows_scale")
        stale = rows is None or (rows.dtype, scale) != (dtype, self.slope_scale)
        if stale or rows.size(1) < key_len:
            size = 1 << max(10, (key_len - 1).bit_length())
            distances = torch.arange(size - 1, -1, -1, dtype=torch.float32,
                                     device=self.slopes.device)
            # float32, then cast: exactly the values of alibi_bias (a fixed scale_init included)
            rows = ((-self.head_slopes()[0])[:, None] * distances).to(dtype)
            self._cache["rows"], self._cache["rows_scale"] = rows, self.slope_scale
        return rows[:, None, rows.size(1) - key_len:]


class LayerAlibi:
    """Layer ``layer``'s view of a shared :class:`AlibiPositionalBias` with learned scales.

    It answers what the attention backends ask (``variant``, ``num_heads``,
    :meth:`head_slopes`, calling it for the dense bias) with that layer's scaled slopes, so the
    backends need no layer index of their own. Not a module: the scales stay in the shared one.
    """

    def __init__(self, alibi: AlibiPositionalBias, layer: int):
        self.alibi, self.layer = alibi, layer
        self.variant, self.num_heads = alibi.variant, alibi.num_heads

    @property
    def scales(self):
        return self.alibi.scales

    def head_slopes(self):
        return self.alibi.head_slopes(self.layer)

    def __call__(self, query_len: int, key_len: int, dtype: torch.dtype = torch.float32):
        return self.alibi(query_len, key_len, dtype, layer=self.layer)


def _load_scales(module, state_dict, prefix, local_metadata, strict, missing_keys,
                 unexpected_keys, error_msgs):
    """Checkpoints and the scales the model was built with.

    A checkpoint without scales (written before they existed, or with ``none``) loads into a
    model that learns them with the module's initial value (1.0 by default): it then computes
    what the checkpoint did. Scales saved by a model of another scale mode are a clear error.
    """
    key = f"{prefix}scales"
    saved = state_dict.get(key)
    if module.scales is None:
        if saved is not None:
            raise ValueError(
                f"this checkpoint has learned ALiBi slope scales ({key}, shape "
                f"{tuple(saved.shape)}), the model being built has none: build it with the "
                "--alibi-learned-scales it was trained with (saved in its options)"
            )
        return
    if saved is None:
        state_dict[key] = module.scales.detach().clone()
        return
    if saved.shape != module.scales.shape:
        raise ValueError(
            f"this checkpoint's learned ALiBi slope scales {key} have shape "
            f"{tuple(saved.shape)}, the model being built expects "
            f"{tuple(module.scales.shape)} (--alibi-learned-scales {module.learned_scales}): "
            "build it with the --alibi-learned-scales and layer count it was trained with"
        )
