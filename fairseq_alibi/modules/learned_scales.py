"""Learned ALiBi slope scales (``--alibi-learned-scales``, ``--alibi-scale-init``): the state.

The formula (``bias_{l,h} = s[l, h]·bias_h``) and the modes are :mod:`fairseq_alibi.alibi`'s;
here the parameter ``s``, each layer's view of it, how checkpoints without it load, and the
options' errors. The user's side: docs/learned_scales.md.
"""

import math
from typing import Optional

import torch

from fairseq_alibi.alibi import SCALE_MODES, AlibiPositionalBias


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


class LearnedScalesAlibi(AlibiPositionalBias):
    """:class:`~fairseq_alibi.alibi.AlibiPositionalBias` with the scales ``s`` of ``num_layers``
    layers: a parameter ``scales`` of shape ``(layers or 1, heads or 1)`` (:data:`SCALE_MODES`),
    saved with the model and initialised to ``scale_init``. Layer ``l`` asks for its slopes
    and bias through :meth:`at_layer`. With ``none``, ``scale_init`` is a fixed multiplier (no
    parameter) and, at 1.0, nothing is multiplied: the model computes exactly what it did
    before scales existed.
    """

    def __init__(self, num_heads: int, variant: str = "causal", future_slope_ratio: float = 1.0,
                 learnable_future_slopes: bool = False, slope_scale: float = 1.0,
                 num_layers: int = 1, learned_scales: str = "none", scale_init: float = 1.0):
        super().__init__(num_heads, variant, future_slope_ratio, learnable_future_slopes,
                         slope_scale)
        check_scale_options(learned_scales, scale_init)
        self.learned_scales, self.scale_init = learned_scales, float(scale_init)
        if learned_scales == "none":
            self.register_parameter("scales", None)
        else:
            rows = num_layers if learned_scales in ("per_layer", "per_layer_head") else 1
            cols = num_heads if learned_scales in ("per_head", "per_layer_head") else 1
            self.scales = torch.nn.Parameter(torch.full((rows, cols), self.scale_init))
        self._layer_views = {}
        self._register_load_state_dict_pre_hook(_load_scales, with_module=True)

    def layer_scale(self, layer: Optional[int] = None):
        if self.scales is not None:
            return self.scales[self.scale_row(layer)].float()
        return self.scale_init if self.scale_init != 1.0 else None

    def scale_row(self, layer: Optional[int]) -> int:
        """The row of ``scales`` that layer ``layer`` uses."""
        rows = self.scales.size(0)
        if rows == 1:
            return 0
        if layer is None or not 0 <= layer < rows:
            raise ValueError(
                f"per-layer ALiBi scales ({rows} layers) need the index of the layer asking "
                f"for its slopes, got {layer!r}"
            )
        return layer

    def at_layer(self, layer: int):
        """This module itself when no scale is learned (every layer shares its bias, as before
        scales existed), else a :class:`LayerAlibi` view whose slopes and bias carry that
        layer's scales (and their gradient)."""
        if self.scales is None:
            return self
        view = self._layer_views.get(layer)
        if view is None:
            view = self._layer_views[layer] = LayerAlibi(self, layer)
        return view


class LayerAlibi:
    """Layer ``layer``'s view of a shared :class:`LearnedScalesAlibi`.

    It answers what the attention backends ask (``variant``, ``num_heads``,
    :meth:`head_slopes`, calling it for the dense bias) with that layer's scaled slopes, so the
    backends need no layer index of their own. Not a module: the scales stay in the shared one.
    """

    def __init__(self, alibi: LearnedScalesAlibi, layer: int):
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
