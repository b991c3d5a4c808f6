"""Slope windows (issue 38): windowed ALiBi attention against dense ALiBi and the dense limit.

    python -m benchmarks.windows [--quick] [--lengths 1024,2048,4096,8192] [--cutoff 8]
                                 [--rounds 3] [--threads 1] [--batch 1]

Given ``(B, H, L, D)`` float32 queries, keys and values (the attention alone), causal, with
Press's slopes of ``H`` heads, each length timed in interleaved paired rounds
(:class:`benchmarks.timing.Rounds`: a ratio is the median of the same round's ratios, so load
from other processes hits both sides alike):

* ``no bias``: ``scaled_dot_product_attention(is_causal=True)``, the dense limit;
* ``dense auto``: today's ALiBi, ``dispatch.attend("auto", ...)`` with a layer's view of an
  ``AlibiBias`` (on the CPU from ``dispatch.FOLD_MIN_LENGTH`` keys on: the fold);
* ``windowed``: :func:`fairseq_alibi.modules.attention.windowed.attention` with the windows of
  ``--cutoff T`` (``W_h = ceil(T / m_h)``; 8 heads, ``T = 8``: 16, 32, …, 2048 keys).

Forward (no autograd) and forward+backward (the gradients of q, k, v). The speed-ups are
``dense auto ÷ windowed`` and ``no bias ÷ windowed``.
"""

import argparse
import math
import sys

import torch
import torch.nn.functional as F

from benchmarks.tables import machine, table
from benchmarks.timing import Rounds, backward_call, forward_call
from fairseq_alibi.alibi import get_slopes, variant_windows
from fairseq_alibi.modules.attention import dispatch, windowed
from fairseq_alibi.modules.bias import AlibiBias

CASES = ("no bias", "dense auto", "windowed")


def methods(heads: int, head_dim: int, cutoff: float):
    """name -> function of ``(q, k, v)``, and the windows of the heads."""
    scale = 1 / math.sqrt(head_dim)
    layer = AlibiBias(heads, variant="causal").layer(0)
    slopes = get_slopes(heads)
    windows = variant_windows(slopes, cutoff, "causal")
    found = {
        "no bias": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                  scale=scale),
        "dense auto": lambda q, k, v: dispatch.attend("auto", q, k, v, layer, scale=scale),
        "windowed": lambda q, k, v: windowed.attention(q, k, v, slopes, None, "causal", windows,
                                                       scale=scale),
    }
    return found, windows[0]


def run(lengths, cutoff=8.0, rounds=3, batch=1, heads=8, head_dim=64, log=print):
    """``(shape line, Markdown table)``: per length and pass, the seconds of each case and the
    windowed path's speed-ups."""
    torch.manual_seed(0)
    found, windows = methods(heads, head_dim, cutoff)
    rows = []
    for L in lengths:
        q, k, v = (torch.randn(batch, heads, L, head_dim) for _ in range(3))
        grad = torch.randn(batch, heads, L, head_dim)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        passes = {
            "forward": Rounds({n: forward_call(f, q, k, v) for n, f in found.items()}, rounds),
            "fwd+bwd": Rounds({n: backward_call(f, leaves, grad) for n, f in found.items()},
                              rounds),
        }
        for name, timed in passes.items():
            row = [L, name] + [f"{timed.median(case):.3f}" for case in CASES] + [
                f"{timed.ratio('dense auto', 'windowed'):.2f}",
                f"{timed.ratio('no bias', 'windowed'):.2f}",
            ]
            rows.append(row)
            log(f"[windows] L={L} {name}: " + ", ".join(
                f"{case} {timed.median(case):.3f}s" for case in CASES))
    shape = (f"B={batch}, H={heads}, D={head_dim}, float32, causal, cutoff T={cutoff:g} "
             f"(windows {', '.join(str(w) for w in windows)}), {rounds} interleaved round(s), "
             "median")
    body = table(["L", "pass", "no bias s", "dense auto s", "windowed s",
                  "× faster than dense auto", "× faster than no bias"], rows)
    return shape, body


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: short lengths, small heads, one round")
    parser.add_argument("--lengths", default=None,
                        help="comma-separated sequence lengths (default 1024,2048,4096,8192)")
    parser.add_argument("--cutoff", type=float, default=8.0, help="the window cutoff T, nats")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--batch", type=int, default=1, help="sequences per call")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.lengths:
        lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    else:
        lengths = [64, 256] if args.quick else [1024, 2048, 4096, 8192]
    head_dim, rounds = (16, 1) if args.quick else (64, args.rounds)
    shape, body = run(lengths, args.cutoff, rounds, args.batch, head_dim=head_dim,
                      log=lambda line: print(line, file=sys.stderr))
    command = "python -m benchmarks.windows " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"Command: `{command.strip()}`  \nMachine: {machine()}  \n{shape}\n\n{body}")
    return body


if __name__ == "__main__":
    main()
