"""Stop fairseq's batch-prefetch threads cleanly when the interpreter exits (:func:`install`);
end a distributed worker that refuses to start without the interpreter's exit
(:func:`exit_refusing_worker`)."""

import atexit
import logging
import os
import sys


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


def install():
    """Run the stop at exit (idempotent: ``atexit.unregister`` first)."""
    atexit.unregister(_stop_background_batch_threads)
    atexit.register(_stop_background_batch_threads)


def exit_refusing_worker(error: BaseException, trainer) -> None:
    """In a distributed worker that ``fairseq-train`` runs itself (hand-started ranks,
    ``torchrun``: ``--distributed-no-spawn`` with a ``torch.distributed`` process group up),
    report ``error`` as an uncaught exception is reported (the whole ``sys.excepthook`` chain:
    torch's ``[rankN]:`` prefix, the package's one line), flush the output and end the process
    with status 1 at once; anywhere else return, and the caller raises ``error``: fairseq's own
    spawned workers (their parent reports the exception), ``fairseq-hydra-train`` (hydra's
    job callbacks and sweeps go on), Python callers (they may catch it).

    Left to the interpreter's exit, the gloo threads of the process groups that fairseq and
    torch keep referenced (fairseq's ``get_global_group``) can outlive Python and abort the
    worker after that line (``terminate called without an active exception``, status -6);
    ``destroy_process_group`` does not stop them while a reference is held. For a refusal
    before training only: nothing is written yet, so no exit handler has work to do."""
    from fairseq_alibi.config_access import cfg_get

    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    distributed = cfg_get(getattr(trainer, "cfg", None), "distributed_training")
    command = sys.argv[0] if sys.argv else ""
    if not cfg_get(distributed, "distributed_no_spawn", False) or not (
            os.path.basename(command) == "fairseq-train"
            or command.endswith(os.path.join("fairseq_cli", "train.py"))):
        return
    sys.excepthook(type(error), error, error.__traceback__)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(1)
