"""Timing and peak memory, as every benchmark measures them.

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

import statistics
import time
from typing import Callable, Dict, List, Optional

import torch


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
