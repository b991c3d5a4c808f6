"""The pipelines' worker processes: :func:`ordered_map` is ``map`` on processes that keep the
output in input order and only a few batches in flight, so reading never runs ahead of encoding.

Each worker has its own pipe (no lock is shared), so an error, SIGTERM or Ctrl-C stops them all
at once (a kill) without leaving the parent or a worker waiting; a worker's exception is raised
in the parent with its traceback, a worker that dies is a :class:`DataError`.
"""

import multiprocessing
import queue
import signal
import threading
import traceback

from fairseq_alibi.preprocess.pipeline_io import DataError


_WORKER_STATE = {}


def _set_state(state):
    _WORKER_STATE.clear()
    _WORKER_STATE.update(state)


def _init_worker(state):
    # The parent stops its workers with SIGKILL, which no handler, at-fork hook or lock can
    # delay; a SIGTERM or Ctrl-C sent to the whole process group is the parent's to handle (it
    # then stops the workers), so here it would only print a traceback per worker.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _set_state(state)


def worker_state():
    """What :func:`ordered_map` gave its workers as ``state`` (encoder, dictionary, options)."""
    return _WORKER_STATE


class _RemoteTraceback(Exception):
    def __str__(self):
        return "\n\n" + self.args[0]


def _worker_main(conn, fn, state):
    """A worker: items arrive on ``conn`` in order, results leave on it in the same order.

    A thread keeps reading items while ``fn`` runs, so the parent's send of the next item
    never waits on this worker's send of a result (both can exceed a socket's buffer).
    """
    _init_worker(state)
    inbox = queue.SimpleQueue()

    def receive():
        while True:
            try:
                item = conn.recv()
            except (EOFError, OSError):
                item = None
            inbox.put(item)
            if item is None:
                return

    threading.Thread(target=receive, daemon=True).start()
    while (item := inbox.get()) is not None:
        try:
            result = (True, fn(item))
        except Exception as e:
            result = (False, e, traceback.format_exc())
        try:
            conn.send(result)
        except (BrokenPipeError, ConnectionResetError):
            return  # the parent is gone
        except Exception as e:  # pickling failed, so nothing was sent
            what = "result" if result[0] else f"error {result[1]!r}"
            conn.send((False, RuntimeError(f"a worker could not send its {what}: {e!r}"),
                       "" if result[0] else result[2]))


class _Workers:
    """``n`` processes, each with its own pipe: no lock is shared, so stopping them (a kill)
    can never leave the parent or a worker waiting on one, as ``Pool.terminate`` could."""

    def __init__(self, n, fn, state):
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        self.procs, self.conns = [], []
        try:
            for _ in range(n):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_worker_main, args=(child, fn, state), daemon=True)
                self.procs.append(proc)
                self.conns.append(parent)
                proc.start()
                child.close()
        except BaseException:
            self.kill()
            raise

    def _died(self, i):
        self.procs[i].join(timeout=1)
        code = self.procs[i].exitcode
        how = ("closed its pipe" if code is None else f"was killed by signal {-code}"
               if code < 0 else f"exited (code {code})")
        return DataError(f"a worker process {how} while encoding (out of memory? try fewer "
                         "--workers)")

    def send(self, i, item):
        try:
            self.conns[i].send(item)
        except (BrokenPipeError, ConnectionResetError):
            raise self._died(i) from None

    def receive(self, i):
        try:
            ok, *payload = self.conns[i].recv()
        except (EOFError, ConnectionResetError):
            raise self._died(i) from None
        if ok:
            return payload[0]
        error, remote = payload
        if remote:
            raise error from _RemoteTraceback(remote)
        raise error

    def close(self):
        """Normal end: each worker finishes its loop and exits."""
        for conn in self.conns:
            conn.send(None)
        for proc, conn in zip(self.procs, self.conns):
            proc.join()
            conn.close()

    def kill(self):
        """Interrupted (an error, SIGTERM, Ctrl-C, the consumer gone): stop at once."""
        for proc in self.procs:
            if proc.pid is not None and proc.exitcode is None:
                proc.kill()
        for proc, conn in zip(self.procs, self.conns):
            if proc.pid is not None:
                proc.join()
            conn.close()


def ordered_map(fn, items, workers: int = 1, state=None):
    """``map(fn, items)`` on ``workers`` processes, results in input order.

    Item ``i`` goes to worker ``i % workers``; at most two items per worker are in flight, so
    ``items`` (a generator reading a file) is consumed only as fast as the workers keep up.
    ``fn`` runs in the workers and reads ``state`` with :func:`worker_state`. A worker's
    exception is raised here (with its traceback as the cause); a worker that dies is a
    :class:`DataError`; any interruption kills the workers before it propagates.
    """
    state = state or {}
    if workers <= 1:
        _set_state(state)
        for item in items:
            yield fn(item)
        return
    pool = _Workers(workers, fn, state)
    try:
        sent = received = 0
        for item in items:
            pool.send(sent % workers, item)
            sent += 1
            if sent - received >= 2 * workers:
                yield pool.receive(received % workers)
                received += 1
        while received < sent:
            yield pool.receive(received % workers)
            received += 1
    except BaseException:
        pool.kill()
        raise
    else:
        pool.close()
