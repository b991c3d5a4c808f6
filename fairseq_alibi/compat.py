"""Compatibility fixes for stock fairseq on Python 3.11 / torch >= 2.6, imported once by the package.

torch >= 2.6 unpickles checkpoints with ``weights_only=True``, which refuses anything but
tensors and plain containers. fairseq's argparse-era checkpoints (RoBERTa, the paper's
WikiText-103 models) hold an ``argparse.Namespace`` and numpy scalars, and fail with
``Unsupported global: argparse.Namespace``. Rather than turning the safe loader off, the few
harmless classes found in fairseq checkpoints are added to its allow-list.
"""

import argparse
import atexit

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


allow_fairseq_checkpoints()


def _stop_background_batch_threads():
    """Stop fairseq's ``BackgroundConsumer`` threads before the interpreter finalizes.

    fairseq prefetches batches in a daemon thread (``--data-buffer-size``, default 10). When
    training ends, that thread is usually blocked filling its queue; Python 3.11 then kills it
    during finalization while it is inside torch's C++ code, and the whole process aborts with
    ``terminate called without an active exception`` (exit status 134) *after* a successful
    run. Asking the thread to stop after its current batch and draining its queue lets it end
    normally. (Without this package: pass ``--data-buffer-size 0``.)
    """
    import queue
    import threading
    import time

    try:
        from fairseq.data.iterators import BackgroundConsumer
    except ImportError:  # pragma: no cover
        return
    for thread in threading.enumerate():
        if not isinstance(thread, BackgroundConsumer) or not thread.is_alive():
            continue
        thread._max_len = 0  # stop after the batch in progress
        deadline = time.monotonic() + 10
        while thread.is_alive() and time.monotonic() < deadline:
            try:
                thread._queue.get(timeout=0.05)
            except queue.Empty:
                pass
            thread.join(timeout=0.01)


atexit.register(_stop_background_batch_threads)
