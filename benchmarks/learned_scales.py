"""Peak memory of training with learned ALiBi slope scales against fixed slopes.

    python -m benchmarks.learned_scales [--length 512] [--layers 4] [--batch 2]

One forward and backward through a stack of ``--layers`` ALiBi self-attention layers
(:class:`~fairseq_alibi.modules.AlibiMultiheadAttention`, 8 heads of 32 dims) sharing one
:class:`~fairseq_alibi.modules.bias.AlibiBias`, as a model's layers do: fixed
slopes, and ``per_layer_head`` learned scales (the case that could bring back one ``(H, L, L)``
bias per layer), with ``auto`` and with each backend forced. Peak = tensor bytes alive at once
above the start (:func:`benchmarks.timing.peak_bytes`: exact, not disturbed by other
processes), the bias that the step builds included.
"""

import argparse
import sys

import torch

from benchmarks.tables import command_line, machine, table, today
from benchmarks.timing import peak_bytes
from fairseq_alibi.modules.bias import AlibiBias
from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention

HEADS, HEAD_DIM = 8, 32


def stack(variant, learned, backend, layers):
    alibi = AlibiBias(HEADS, num_layers=layers, variant=variant, learned_scales=learned)
    torch.manual_seed(0)
    return alibi, [AlibiMultiheadAttention(HEADS * HEAD_DIM, HEADS, alibi.layer(i),
                                           attention=backend) for i in range(layers)]


def train_step(layers, x):
    def step():
        h = x
        for layer in layers:
            h = h + layer(h, h, h, need_weights=False)[0]
        h.square().mean().backward()
    return step


CASES = [  # (label, learned scales, backend)
    ("fixed slopes, auto", "none", "auto"),
    ("fixed slopes, sdpa", "none", "sdpa"),
    ("fixed slopes, fold", "none", "fold"),
    ("per_layer_head, auto", "per_layer_head", "auto"),
    ("per_layer_head, fold", "per_layer_head", "fold"),
    ("per_layer_head, sdpa", "per_layer_head", "sdpa"),
    ("per_layer_head, naive", "per_layer_head", "naive"),
]


def measure(variant, length, layers, batch):
    rows = {}
    for label, learned, backend in CASES:
        alibi, attn = stack(variant, learned, backend, layers)
        x = torch.randn(length, batch, HEADS * HEAD_DIM, requires_grad=True)
        step = train_step(attn, x)
        step()  # warm-up: lazily built state is not counted
        for layer in attn:
            layer.zero_grad(set_to_none=True)
        x.grad = None
        if alibi.scales is not None:
            alibi.scales.grad = None
        alibi.cache.clear()  # the step builds its bias (shared by the layers): count it
        rows[label] = peak_bytes(step)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--variants", default="causal,offset")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    bias_bytes = HEADS * args.length**2 * 4
    rows = []
    for variant in args.variants.split(","):
        found = measure(variant, args.length, args.layers, args.batch)
        base = found["fixed slopes, auto"]
        for label, peak in found.items():
            rows.append([variant, label, f"{peak / 2**20:.1f}", f"{peak / base:.2f}x"])
    print(command_line("benchmarks.learned_scales", argv))
    print(f"Machine: {machine()}  ")
    print(f"Date: {today()}")
    print()
    print(f"Peak memory of one forward + backward, {args.layers} layers, batch {args.batch}, "
          f"length {args.length}, {HEADS} heads x {HEAD_DIM}; one (H, L, L) float32 bias is "
          f"{bias_bytes / 2**20:.1f} MiB")
    print()
    print(table(["variant", "slopes, backend", "peak MiB", "vs fixed auto"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
