"""The process supervision of a GPU run (``python -m benchmarks.gpu``): each part in a process
of its own, in a session (process group) of its own, given its share of ``--budget`` and stopped
past it (a sticky CUDA fault or a hang in one part cannot cost the others their figures)."""

import math
import os
import shlex
import signal
import subprocess
import sys
import time

from benchmarks import subprocesses, tables
from benchmarks.gpu_report import Part, describe_machine, log, read_json, state_path, write_json

#: the least time, in seconds, worth starting each part with (full sizes on an H100, --quick
#: on a CPU): estimates of start-up, compilation and the smallest useful measurement. A part
#: gets the time left less the later parts' minimums
NEEDS = {"tests": (90, 15), "decode": (60, 60), "memory": (90, 25), "flex": (60, 15),
         "masks": (60, 15),
         "attention": (180, 30), "train": (180, 30), "end_to_end": (300, 120)}
#: seconds between a part's own deadline and its process being stopped from outside
GRACE = 10
#: the processes a part started in sessions of their own (pytest and its workers): their
#: groups are stopped with the part
CHILD_GROUPS = []


def stop_group(proc):
    """SIGTERM to the process group of ``proc`` (a ``Popen`` started in a session of its own),
    SIGKILL to what is left of it 5 s later."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + 5
        while time.time() < deadline:
            proc.poll()  # (reaped, the leader no longer holds the group)
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def wait_until(proc, seconds, every=None, progress=None):
    """Wait for ``proc`` at most ``seconds`` (calling ``progress()`` every ``every`` seconds);
    past that, stop its process group. True if it had to be stopped."""
    end = time.time() + seconds
    while True:
        step = end - time.time()
        if every:
            step = min(step, every)
        try:
            proc.wait(timeout=max(0.1, step))
            return False
        except subprocess.TimeoutExpired:
            if time.time() >= end:
                stop_group(proc)
                proc.wait()
                return True
            if progress:
                progress()


def exit_on_sigterm(signum, frame):
    """Stopped from outside: stop the processes this one started in sessions of their own
    (the part a run is waiting for goes down through ``run_child``'s handler), then exit."""
    for proc in CHILD_GROUPS:
        stop_group(proc)
    raise SystemExit(128 + signum)


def run_child(argv, args, name, limit):
    """``name`` in a process of its own: its deadline ``GRACE`` seconds before ``limit``, then
    stopped. ``(exit status, seconds, whether it was stopped)``."""
    start = time.time()
    cmd = [sys.executable, "-m", "benchmarks.gpu", *argv, "--run-part", name,  # (from REPO:)
           "--out", os.path.abspath(args.out), "--data", os.path.abspath(args.data)]
    if limit is not None:
        cmd += ["--deadline", repr(start + limit - GRACE)]
    proc = subprocess.Popen(cmd, cwd=subprocesses.REPO, start_new_session=True)
    try:
        stopped = wait_until(proc, math.inf if limit is None else limit)
    except BaseException:  # this run interrupted: take the part down with it
        stop_group(proc)
        raise
    return proc.returncode, time.time() - start, stopped


def part_limit(name, later, left, quick):
    """Seconds for part ``name`` when ``left`` seconds of the budget remain and the parts
    ``later`` follow: what is left less the later parts' minimums, at least its own minimum;
    0 (skip it) when even that does not fit."""
    need = NEEDS[name][quick]
    if left < need:
        return 0
    return min(left, max(need, left - sum(NEEDS[p][quick] for p in later)))


def supervise(argv, args, start):
    """Every part of ``args.only`` in turn, each in its own process within its share of the
    budget (counted from ``start``); the run's and each part's status in the report. 1 if a
    part failed."""
    end = None if args.budget is None else start + args.budget
    run = {"command": "python -m benchmarks.gpu " + " ".join(shlex.quote(a) for a in argv),
           "machine": describe_machine(args.device), "date": tables.today(),
           "budget_s": args.budget, "parts": list(args.only)}
    previous = read_json(state_path(args.out, "run")) if args.append else None
    if previous:
        run["parts"] = [p for p in previous["parts"] if p not in args.only] + list(args.only)
    else:
        for name in os.listdir(os.path.join(args.out, "parts")):
            os.remove(os.path.join(args.out, "parts", name))
        for name in ("log.txt", "tests.log", "tests.jsonl", "fairseq.log"):
            if os.path.exists(os.path.join(args.out, name)):
                os.remove(os.path.join(args.out, name))
    write_json(state_path(args.out, "run"), run)
    log(f"[gpu] {run['machine']}")
    for name in args.only:
        Part(args.out, name, fresh=True).update(status="waiting")
    failed = []
    for i, name in enumerate(args.only):
        part = Part(args.out, name)
        left = math.inf if end is None else end - time.time()
        limit = part_limit(name, args.only[i + 1:], left, args.quick)
        if limit == 0:
            part.update(status="skipped")
            part.note(f"skipped: needs about {NEEDS[name][args.quick]} s, "
                      f"{max(0.0, left):.0f} s of the budget left")
            continue
        limit = None if limit == math.inf else limit
        part.update(status="running", limit_s=limit and round(limit))
        log(f"[gpu] {name}: started" + (f", limit {limit:.0f} s" if limit else ""))
        try:
            returncode, seconds, stopped = run_child(argv, args, name, limit)
        except BaseException:  # (this run stopped from outside: the part is stopped too)
            Part(args.out, name).update(status="stopped with the run")
            raise
        part = Part(args.out, name)  # (the part's process wrote its figures there)
        status = ("done" if returncode == 0 else
                  f"stopped at its limit ({limit:.0f} s)" if stopped else
                  f"failed (exit status {returncode})")
        if returncode != 0:
            failed.append(name)
        part.update(status=status, seconds=round(seconds))
        log(f"[gpu] {name}: {status}, {seconds:.0f} s")
    log(f"[gpu] {time.time() - start:.0f} s in all; {os.path.join(args.out, 'gpu.md')}")
    return 1 if failed else 0
