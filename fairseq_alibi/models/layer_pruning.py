"""Per-layer learned slope scales follow fairseq's layer pruning (``--*-layers-to-keep``).

With ``--decoder-layers-to-keep 0,2`` (or ``--encoder-layers-to-keep``, LayerDrop's pruning at
load time) fairseq builds only the kept layers and, as the checkpoint loads,
``fairseq.checkpoint_utils.prune_state_dict`` renumbers their weights (``layers.2.`` becomes
``layers.1.``). Per-layer scales (``per_layer``, ``per_layer_head``: one row per layer) live in
the stack's shared ``alibi`` module, outside ``layers.N.``, so fairseq passes them on whole; here
the rows of the kept layers are taken, in fairseq's order, so that the pruned model computes
exactly what those layers computed. Scales of one row (``shared``, ``per_head``) belong to every
layer and stay as they are.
"""

from collections import OrderedDict
from typing import Dict, List, Optional

from omegaconf import DictConfig

from fairseq_alibi.error_hints import CheckpointMismatchError


def kept_layers(model_cfg, side: str) -> Optional[List[int]]:
    """The layers of ``side`` ("encoder" or "decoder") that ``prune_state_dict`` keeps, in the
    order it renumbers them (sorted); ``None`` when it prunes nothing there (its conditions)."""
    if not model_cfg:
        return None
    if isinstance(model_cfg, DictConfig):
        arch = getattr(model_cfg, "_name", None)
    else:
        arch = getattr(model_cfg, "arch", None)
    if arch is None or arch == "ptt_transformer":
        return None
    keep = getattr(model_cfg, f"{side}_layers_to_keep", None)
    if not keep:
        return None
    return sorted(int(layer) for layer in str(keep).split(","))


def prune_scales(state_dict, model_cfg, scales_keys: Dict[str, str]):
    """``state_dict`` with the per-layer scales cut to the kept layers' rows.

    ``scales_keys``: side -> state-dict key of that side's scales. Returns ``state_dict`` itself
    when nothing is pruned, else a copy (the caller's dict is left as it was).
    """
    pruned = None
    for side, key in scales_keys.items():
        kept = kept_layers(model_cfg, side)
        saved = state_dict.get(key)
        if kept is None or saved is None or saved.dim() != 2 or saved.size(0) == 1:
            continue
        rows = saved.size(0)
        outside = [layer for layer in kept if not 0 <= layer < rows]
        if outside:
            flag = f"--{side}-layers-to-keep {getattr(model_cfg, f'{side}_layers_to_keep')}"
            fix = f"keep layers among 0 to {rows - 1}"
            if rows == len(kept):  # a run trained with the flag, resumed with it: pruned twice
                fix = (f"it holds {rows} layers, as many as the flag keeps: a checkpoint of a "
                       f"run trained with it (fairseq would prune it again); resume it without "
                       f"the flag, with --{side}-layers {rows}")
            raise CheckpointMismatchError(
                f"{flag} names layer {outside[0]}, but this checkpoint's per-layer ALiBi slope "
                f"scales ({key}) are those of {rows} layers: {fix}")
        if pruned is None:
            pruned = OrderedDict(state_dict)
            metadata = getattr(state_dict, "_metadata", None)
            if metadata is not None:
                pruned._metadata = metadata
        pruned[key] = saved[kept].clone()
    return state_dict if pruned is None else pruned


class ScalesFollowPrunedLayers:
    """Mixin for a fairseq model (before the stock class in the bases): its ``load_state_dict``
    cuts the per-layer scales to the kept layers before fairseq prunes the layers."""

    #: side ("encoder" / "decoder") -> the state-dict key of that side's learned scales
    alibi_scales_keys: Dict[str, str] = {}

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        state_dict = prune_scales(state_dict, model_cfg if model_cfg is not None else args,
                                  self.alibi_scales_keys)
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg,
                                       args=args)
