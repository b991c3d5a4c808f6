"""Stop fairseq's batch-prefetch threads and release a distributed worker's process group
cleanly when the interpreter exits (:func:`install`)."""

import atexit


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


def release_process_group() -> None:
    """Destroy this worker's process group, if it has one. Left to the interpreter's exit,
    gloo's worker threads can outlive Python and abort the process the same way (status -6)
    after the run's last line; destroyed while Python runs, they end normally. Called at exit
    and by a refusal before training, which every worker reaches after the same collective
    call, so no worker is left waiting on another."""
    import sys

    dist = sys.modules.get("torch.distributed")  # never import torch at exit for this
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _at_exit():
    _stop_background_batch_threads()
    release_process_group()


def install():
    """Run the stop and the release at exit (idempotent: ``atexit.unregister`` first)."""
    atexit.unregister(_at_exit)
    atexit.register(_at_exit)
