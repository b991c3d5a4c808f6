"""Timing, peak memory and Markdown tables shared by the benchmarks.

Timing: every measured case runs once per *round*, the cases of a round one after the other,
and a ratio is the median over rounds of the paired ratio ``case / baseline`` of the same round.
Load from other processes shifts whole rounds, which the pairing cancels; the median drops
rounds that a burst hit unevenly.

Peak memory: the most bytes of tensor storage alive at once during one call, above what was
alive when it started, from the allocation and free events of ``torch.profiler``
(``profile_memory=True``) replayed in order. It counts every tensor the call creates through
PyTorch's allocator (activations kept for backward, gradients, temporaries, a materialised
bias), is exact and repeatable, and is not disturbed by other processes, by the allocator's
caching or by the Python heap, unlike the resident set size. It is measured in its own run,
never in a timed one.
"""

import datetime
import os
import shlex
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

import torch

from fairseq_alibi.cli.fairseq_runs import thread_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def machine() -> str:
    """One line: CPU model, cores, GPU, torch, threads, and the load when it started."""
    from fairseq_alibi.cli.fairseq_runs import machine as describe

    found = describe()
    load = found["load_average"]
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{found['cpu']}, {found['cores']} cores, {gpu}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s), load average "
        f"{'unknown' if load is None else f'{load:.1f}'} at start"
    )


def today() -> str:
    return datetime.date.today().isoformat()


def peak_bytes(fn: Callable[[], object]) -> int:
    """Peak tensor bytes allocated by ``fn()`` above the level at its start (see module)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def mib(n: Optional[float]) -> str:
    return "–" if n is None else f"{n / 2**20:.0f}"


class Rounds:
    """Interleaved timing of named cases; ``ratio(case, base)`` = median of paired ratios.
    Every other round runs the cases in reverse order, so no case always runs after the same
    one (what runs before a call warms or evicts its caches)."""

    def __init__(self, cases: Dict[str, Callable[[], object]], rounds: int, warmup: int = 1):
        self.times: Dict[str, List[float]] = {name: [] for name in cases}
        for _ in range(warmup):
            for fn in cases.values():
                fn()
        order = list(cases.items())
        for r in range(rounds):
            for name, fn in (order if r % 2 == 0 else order[::-1]):
                start = time.perf_counter()
                fn()
                self.times[name].append(time.perf_counter() - start)

    def median(self, name: str) -> float:
        return statistics.median(self.times[name])

    def ratio(self, name: str, base: str) -> float:
        return statistics.median(a / b for a, b in zip(self.times[name], self.times[base]))


def table(headers: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def section(title: str, command: str, body: str, notes: str = "",
            machine_line: Optional[str] = None, date: Optional[str] = None) -> str:
    """A Markdown section with the command, machine and date the figures come from (this
    machine and today unless given: a report rewritten later keeps its run's)."""
    parts = [
        f"### {title}",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine_line or machine()}  ",
        f"Date: {date or today()}",
        "",
        body,
    ]
    if notes:
        parts += ["", notes]
    return "\n".join(parts) + "\n"


def comma_choices(parser, text: str, choices, what: str) -> List[str]:
    """The names in ``text`` (``a,b``), each one of ``choices``; else ``parser``'s error naming
    the unknown ones and the choices."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in choices]
    if unknown:
        parser.error(f"unknown {what}(s) {', '.join(unknown)}; choose from {', '.join(choices)}")
    return names


def fairseq_cli(tool: str, *args, threads: int = 1) -> str:
    """Run a fairseq console script of this environment; returns stdout+stderr, raises on error."""
    binary = os.path.join(os.path.dirname(sys.executable), tool)
    proc = subprocess.run([binary] + [str(a) for a in args], capture_output=True, text=True,
                          env=thread_env(threads))
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} failed ({proc.returncode}):\n{out[-4000:]}")
    return out


def python_module(module: str, *args, log_to: Optional[str] = None, timeout: Optional[float] = None,
                  threads: int = 2) -> str:
    """``python -m MODULE ARGS`` from the repository (``fairseq_cli.train``, ...): its output
    (appended to ``log_to`` with the command); raises ``RuntimeError`` on failure or when it
    runs past ``timeout`` seconds."""
    cmd = [sys.executable, "-m", module] + [str(a) for a in args]
    env = thread_env(threads)
    timeout = timeout if timeout is not None and timeout < float("inf") else None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env,
                              timeout=None if timeout is None else max(1.0, timeout))
        out, failed = proc.stdout + proc.stderr, proc.returncode != 0 and proc.returncode
    except subprocess.TimeoutExpired as expired:
        out = "".join(x.decode() if isinstance(x, bytes) else x or ""
                      for x in (expired.stdout, expired.stderr))
        failed = f"stopped after {timeout:.0f} s"
    if log_to:
        with open(log_to, "a") as f:
            f.write(f"$ {' '.join(shlex.quote(c) for c in cmd[1:])}\n{out}\n")
    if failed:
        last = out.strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"{module} failed ({failed}): {last[0][:300]}")
    return out


def concurrently(jobs: Dict, timeout: Optional[float] = None, threads: int = 2) -> Dict:
    """``{key: output or RuntimeError}`` of ``{key: (module, args, log_to)}`` runs of
    :func:`python_module`, all at once (small models: their wall times are not figures)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(job):
        module, args, log_to = job
        try:
            return python_module(module, *args, log_to=log_to, timeout=timeout, threads=threads)
        except RuntimeError as error:
            return error

    with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        return dict(zip(jobs, pool.map(one, jobs.values())))


def forward_call(fn, *inputs):
    """``fn(*inputs)`` without autograd, as a case for :class:`Rounds` / :func:`peak_bytes`."""
    def call():
        with torch.no_grad():
            fn(*inputs)
    return call


def backward_call(fn, leaves, grad, parameters=()):
    """``fn(*leaves)`` then the gradients of ``leaves`` (and ``parameters``) for ``grad``."""
    wrt = list(leaves) + list(parameters)

    def call():
        torch.autograd.grad(fn(*leaves), wrt, grad)
    return call
