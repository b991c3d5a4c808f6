"""Safe loading of fairseq checkpoints under torch >= 2.6, set up once when the package is imported.

torch >= 2.6 unpickles checkpoints with ``weights_only=True``, which refuses anything but
tensors and plain containers. fairseq's argparse-era checkpoints (RoBERTa, the paper's
WikiText-103 models) hold an ``argparse.Namespace`` and numpy scalars, and fail with
``Unsupported global: argparse.Namespace``. Rather than turning the safe loader off, the few
harmless classes found in fairseq checkpoints are added to its allow-list
(:func:`allow_fairseq_checkpoints`, called by :func:`fairseq_alibi.registration.register`).
"""

import argparse
from typing import Optional

import numpy as np
import torch


def _numpy_globals():
    found = [np.dtype]
    try:  # numpy scalars are pickled through this reconstructor (numpy 1.x location)
        from numpy.core.multiarray import scalar

        found.append(scalar)
    except ImportError:  # pragma: no cover - numpy 2 moved it
        from numpy._core.multiarray import scalar

        found.append(scalar)
    # numpy >= 1.25 pickles dtypes through their classes (np.dtypes.Float64DType, ...)
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        found += [getattr(dtypes, n) for n in dir(dtypes) if n.endswith("DType")]
    return found


def _distributed_resume_globals():
    """What fairseq's trainer pickles when rank 0 sends a loaded checkpoint to the other ranks.

    ``trainer.load_checkpoint`` reads the file on rank 0 only, turns its ``cfg`` into an
    OmegaConf ``DictConfig``, and ``distributed_utils.broadcast_object`` sends it with
    ``torch.save``; the other ranks ``torch.load`` it (``weights_only=True`` since torch 2.6),
    so without these every distributed run fails to resume (``Unsupported global:
    omegaconf.dictconfig.DictConfig``). Only data classes: config containers, their node and
    metadata types, and fairseq's placeholder for the tensors sent separately.
    """
    import collections
    import typing

    from omegaconf import DictConfig, ListConfig
    from omegaconf.base import ContainerMetadata, Metadata
    from omegaconf.nodes import AnyNode

    found = [DictConfig, ListConfig, AnyNode, Metadata, ContainerMetadata, typing.Any,
             collections.defaultdict, dict, list, int]
    try:
        from fairseq.distributed.utils import _TensorPlaceholder

        found.append(_TensorPlaceholder)
    except ImportError:  # pragma: no cover - other fairseq versions
        pass
    return found


#: classes that fairseq checkpoints hold besides tensors and containers
SAFE_CHECKPOINT_GLOBALS = [argparse.Namespace] + _numpy_globals() + _distributed_resume_globals()


def allow_fairseq_checkpoints():
    """Let ``torch.load(weights_only=True)`` read fairseq checkpoints; idempotent."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:  # torch < 2.4 loads everything anyway
        add(SAFE_CHECKPOINT_GLOBALS)


def read_mapped(path) -> Optional[dict]:
    """The checkpoint at ``path`` read for what it says (its config, position, ...): with the
    safe loader, memory-mapped where the file is a zip archive (the tensors are not read); None
    where it cannot be read or is no dict, so that the caller's own error stands."""
    import zipfile

    try:
        state = torch.load(path, map_location="cpu", mmap=zipfile.is_zipfile(path))
    except Exception:  # noqa: BLE001 - a reader of what a file says never replaces the error
        return None
    return state if isinstance(state, dict) else None
