"""Peak memory of training with learned ALiBi slope scales against fixed slopes; with
``--scoring``, the time of scoring with them.

    python -m benchmarks.learned_scales [--length 512] [--layers 4] [--batch 2]
    python -m benchmarks.learned_scales --scoring [--lengths 2048,4096] [--rounds 5]

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
import tempfile

import torch

from benchmarks.tables import comma_numbers, command_line, machine, table, today
from benchmarks.timing import Rounds, forward_call, peak_bytes
from benchmarks.trainer import build_trainer, random_batch, write_dictionary
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


#: the scored model: 4 x 256, 8 heads, as the training benchmarks' LM
SCORED_DIMS = ["--decoder-layers", "4", "--decoder-embed-dim", "256", "--decoder-input-dim",
               "256", "--decoder-output-dim", "256", "--decoder-ffn-embed-dim", "1024",
               "--decoder-attention-heads", "8"]
#: (label, the model's flags): the attention of a whole sequence, then slope windows
SCORED = [("auto", []),
          ("windowed, cutoff 8", ["--alibi-attention", "windowed", "--alibi-window-cutoff", "8"])]


#: the slopes scored: fixed, then learned scales of one row (shared by the layers) and of a
#: row per layer (each layer its own bias)
SCORED_SLOPES = ("none", "per_head", "per_layer_head")


def scoring_cases(length, folder):
    """``{(attention, scales): call}``: one forward pass (``eval``, no autograd) of a
    1 x ``length`` batch by the same weights with each of :data:`SCORED_SLOPES` (learned scales
    of 1.0: every case computes the same function)."""
    cases = {}
    for label, flags in SCORED:
        models = {}
        for scales in SCORED_SLOPES:
            trainer, task = build_trainer(folder, "alibi_transformer_lm", length, SCORED_DIMS,
                                          [*flags, "--alibi-learned-scales", scales])
            models[scales] = trainer.model.eval()
            models[scales].load_state_dict(models["none"].state_dict())
        tokens = random_batch(task, 1, length, seed=0)["net_input"]["src_tokens"]
        for scales, model in models.items():
            cases[(label, scales)] = forward_call(model, tokens)
    return cases


def scoring(lengths, rounds):
    """Rows of the scoring table: ms per forward pass, and each ÷ fixed (paired rounds)."""
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        write_dictionary(folder, 2000)
        for length in lengths:
            timed = Rounds(scoring_cases(length, folder), rounds)
            for label, _ in SCORED:
                fixed = (label, "none")
                rows.append([str(length), label] + [
                    f"{timed.median((label, s)) * 1e3:.0f}" for s in SCORED_SLOPES] + [
                    f"{timed.ratio((label, s), fixed):.2f}x" for s in SCORED_SLOPES[1:]])
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--variants", default="causal,offset")
    parser.add_argument("--scoring", action="store_true",
                        help="time scoring (forward passes of a whole model) instead")
    parser.add_argument("--lengths", default="2048,4096", help="--scoring's lengths")
    parser.add_argument("--rounds", type=int, default=5, help="--scoring's rounds")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.scoring:
        rows = scoring(comma_numbers(parser, args.lengths, "--lengths"), args.rounds)
        print(command_line("benchmarks.learned_scales", argv))
        print(f"Machine: {machine()}  ")
        print(f"Date: {today()}")
        print()
        print("One forward pass of a 4 x 256 alibi_transformer_lm (8 heads, 2,000 words), "
              f"1 sequence, eval, median of {args.rounds} paired rounds, 1 thread")
        print()
        print(table(["length", "attention", "fixed ms", "per_head ms", "per_layer_head ms",
                     "per_head ÷ fixed", "per_layer_head ÷ fixed"], rows))
        return 0
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
