"""What every converter shares (stock and fork checkpoints, Hugging Face): reading a fairseq
checkpoint, its model configuration of any era, one error type, atomic writes.

``convert``, ``forks`` and ``hf`` import this module; it imports none of them (no import circle).
"""

import argparse
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import torch


class ConversionError(ValueError):
    """The checkpoint cannot be converted; the message says why and what to do."""


def model_cfg_get(model_cfg, key, default=None):
    """``model_cfg[key]`` of a dict, OmegaConf or argparse configuration (``default`` if absent)."""
    if isinstance(model_cfg, argparse.Namespace):
        return getattr(model_cfg, key, default)
    return model_cfg.get(key, default) if hasattr(model_cfg, "get") else default


def model_cfg_set(model_cfg, key, value):
    """``model_cfg[key] = value`` for a dict, OmegaConf or argparse configuration."""
    from omegaconf import OmegaConf, open_dict

    if isinstance(model_cfg, argparse.Namespace):
        setattr(model_cfg, key, value)
    elif OmegaConf.is_config(model_cfg):
        with open_dict(model_cfg):  # configs converted from argparse checkpoints are "struct"
            model_cfg[key] = value
    else:
        model_cfg[key] = value


def architecture_of(model_cfg) -> Optional[str]:
    """The architecture a checkpoint's model config names (``_name``, or ``arch`` for argparse)."""
    return model_cfg_get(model_cfg, "_name") or model_cfg_get(model_cfg, "arch")


def placeholder_dictionary(size: int):
    """A fairseq Dictionary of ``size`` symbols (only its size matters to build the model)."""
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    while len(dictionary) < size:
        dictionary.add_symbol(f"<placeholder_{len(dictionary)}>")
    if len(dictionary) != size:
        raise ConversionError(f"the embedding has {size} rows, fewer than fairseq's specials")
    return dictionary


def model_config(state) -> object:
    """The model configuration of a loaded checkpoint, or a clear error if it has none."""
    if not isinstance(state, dict) or "model" not in state:
        raise ConversionError("not a fairseq checkpoint (no 'model' weights in it)")
    cfg = state.get("cfg")
    if cfg is None or cfg.get("model") is None:
        raise ConversionError(
            "this checkpoint has no model configuration ('cfg' or 'args'), so the architecture "
            "cannot be known; it was not written by fairseq-train"
        )
    return cfg["model"]


def plain_cfg(cfg):
    from omegaconf import OmegaConf

    if OmegaConf.is_config(cfg):
        return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    return cfg


def read_checkpoint(path) -> dict:
    """Load a fairseq checkpoint to the CPU, or a one-line :class:`ConversionError` saying why not."""
    from fairseq import checkpoint_utils

    import fairseq_alibi  # noqa: F401  (models; torch >= 2.6 loading of fairseq checkpoints)

    source = Path(path)
    if not source.is_file():
        raise ConversionError(f"no checkpoint at {source}")
    repair = f"`python -m fairseq_alibi.checkpoints repair {source.parent}`"
    if source.stat().st_size == 0:
        raise ConversionError(
            f"cannot read {source}: the file is empty (0 bytes; an interrupted save?). Use an "
            f"intact copy, or restore the save directory's last good checkpoint with {repair}"
        )
    try:
        return checkpoint_utils.load_checkpoint_to_cpu(str(source))
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same advice
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if isinstance(e, EOFError) or "zip archive" in reason or "central directory" in reason:
            raise ConversionError(
                f"cannot read {source} as a fairseq checkpoint: the file is truncated or "
                f"damaged ({reason}). Use an intact copy, or restore the save directory's last "
                f"good checkpoint with {repair}"
            ) from e
        raise ConversionError(
            f"cannot read {source} as a fairseq checkpoint: {reason}") from e


def write_atomically(state, target: Path):
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        torch.save(state, str(tmp))
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextmanager
def atomic_folder(target):
    """Yield a temporary folder beside ``target``; rename it to ``target`` when the block ends
    without an error, delete it otherwise (nothing half-written is ever left at ``target``)."""
    target = Path(target)
    if target.exists() and any(target.iterdir()):
        raise ConversionError(f"{target} exists and is not empty: choose another --out")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
        if target.exists():
            target.rmdir()
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
