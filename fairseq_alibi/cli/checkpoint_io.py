"""What every converter shares (stock and fork checkpoints, Hugging Face): reading a fairseq
checkpoint, its model configuration of any era, one error type, atomic writes.

``convert_checkpoints``, ``forks`` and ``hf_export_import`` import this module; it imports none
of them (no import circle).
"""

import os
from pathlib import Path

import torch

from fairseq_alibi.files import atomic_directory



class ConversionError(ValueError):
    """The checkpoint cannot be converted; the message says why and what to do."""


def placeholder_dictionary(size: int):
    """A fairseq Dictionary of ``size`` symbols (only its size matters to build the model)."""
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    while len(dictionary) < size:
        dictionary.add_symbol(f"<placeholder_{len(dictionary)}>")
    if len(dictionary) != size:
        raise ConversionError(f"the embedding has {size} rows, fewer than fairseq's specials")
    return dictionary


class PlaceholderTask:
    """What ``build_model`` reads of a task: the dictionaries (only their sizes matter)."""

    def __init__(self, source, target=None):
        self.source_dictionary = source
        self.target_dictionary = target if target is not None else source

    def max_positions(self):
        return None


def build_model(model_cfg, task):
    """The model a (converted) configuration describes, for ``task`` (a
    :class:`PlaceholderTask`); the configuration is left as it was."""
    import copy

    from fairseq import models

    import fairseq_alibi  # noqa: F401  (registers the models)

    return models.build_model(copy.deepcopy(model_cfg), task)


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


def read_checkpoint(path) -> dict:
    """Load a fairseq checkpoint to the CPU, or a one-line :class:`ConversionError` saying why not."""
    from fairseq import checkpoint_utils

    import fairseq_alibi  # noqa: F401  (models; torch >= 2.6 loading of fairseq checkpoints)

    source = Path(path)
    if not source.is_file():
        raise ConversionError(f"no checkpoint at {source}")
    repair = f"`fairseq-alibi checkpoints repair {source.parent}`"
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


def atomic_folder(target):
    """:func:`fairseq_alibi.files.atomic_directory` for an ``--out`` folder: a non-empty one is a
    :class:`ConversionError`."""
    return atomic_directory(target, not_empty=lambda path: ConversionError(
        f"{path} exists and is not empty: choose another --out"))
