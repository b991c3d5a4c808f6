"""Compatibility of fairseq checkpoints with torch >= 2.6, imported once by the package.

torch >= 2.6 unpickles checkpoints with ``weights_only=True``, which refuses anything but
tensors and plain containers. fairseq's argparse-era checkpoints (RoBERTa, the paper's
WikiText-103 models) hold an ``argparse.Namespace`` and numpy scalars, and fail with
``Unsupported global: argparse.Namespace``. Rather than turning the safe loader off, the few
harmless classes found in fairseq checkpoints are added to its allow-list.
"""

import argparse

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


#: classes that fairseq checkpoints hold besides tensors and containers
SAFE_CHECKPOINT_GLOBALS = [argparse.Namespace] + _numpy_globals()


def allow_fairseq_checkpoints():
    """Let ``torch.load(weights_only=True)`` read fairseq checkpoints; idempotent."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:  # torch < 2.4 loads everything anyway
        add(SAFE_CHECKPOINT_GLOBALS)


allow_fairseq_checkpoints()
