"""Learned ALiBi slope scales (``--alibi-learned-scales``, ``--alibi-scale-init``): the state.

The formula (``bias_{l,h} = s[l, h]·bias_h``) and the modes are :mod:`fairseq_alibi.alibi`'s;
here the parameter ``s`` (a member of the stack's :class:`~fairseq_alibi.modules.bias.AlibiBias`,
saved as ``<stack>.alibi.scales``), which row a layer reads, and how checkpoints load. The
user's side: docs/learned_scales.md.
"""

from typing import Optional

import torch


def make_scales(mode: str, init: float, num_layers: int, num_heads: int):
    """The parameter ``s`` of shape ``(layers or 1, heads or 1)`` for ``mode``, initialised to
    ``init``; ``None`` for ``none`` (then ``init`` is a fixed multiplier, see
    :func:`fixed_scale`)."""
    if mode == "none":
        return None
    rows = num_layers if mode in ("per_layer", "per_layer_head") else 1
    cols = num_heads if mode in ("per_head", "per_layer_head") else 1
    return torch.nn.Parameter(torch.full((rows, cols), float(init)))


def fixed_scale(init: float) -> Optional[float]:
    """The multiplier of a model that learns no scale: ``None`` at 1.0 (nothing multiplied, so
    the model computes exactly what it did before scales existed)."""
    return None if init == 1.0 else float(init)


def scale_row(scales: torch.Tensor, layer: Optional[int]) -> int:
    """The row of ``scales`` that layer ``layer`` uses."""
    rows = scales.size(0)
    if rows == 1:
        return 0
    if layer is None or not 0 <= layer < rows:
        raise ValueError(
            f"per-layer ALiBi scales ({rows} layers) need the index of the layer asking for "
            f"its slopes, got {layer!r}"
        )
    return layer


def load_scales(module, state_dict, prefix, local_metadata, strict, missing_keys,
                unexpected_keys, error_msgs):
    """A load hook of the bias module: checkpoints and the scales the model was built with.

    A checkpoint without scales (written before they existed, or with ``none``) loads into a
    model that learns them with the module's initial value (1.0 by default): it then computes
    what the checkpoint did. Scales saved by a model of another scale mode are refused before,
    by the bias module's check of the saved stack
    (:func:`~fairseq_alibi.modules.checkpoint_match.check_stack`).
    """
    key = f"{prefix}scales"
    if module.scales is not None and state_dict.get(key) is None:
        state_dict[key] = module.scales.detach().clone()
