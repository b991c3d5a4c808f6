"""``flex``'s block masks: built from the block plan against ``create_block_mask``, side by side.

    python -m benchmarks.block_masks [--quick] [--lengths 4096,8192] [--cutoff 8]
        [--sinks 4] [--doc-lengths 256,2048] [--rounds 3] [--threads 1]

Two calls of 8 causal heads over ``L`` keys: slope windows (``--cutoff``, ``--sinks``) and a
packed row of documents (lengths drawn uniformly from ``--doc-lengths``, no windows). Each
block mask is built two ways, the way ``flex`` builds it (``blocks.plan`` then
``flex.as_block_mask``: from the windows and document ids as numbers) and PyTorch's
``create_block_mask`` of the same ``mask_mod`` (every (query, key) pair evaluated), in
interleaved paired rounds (:class:`benchmarks.timing.Rounds`), each one's peak tensor memory
measured in a run of its own (:func:`benchmarks.timing.peak_bytes`), and the two checked to
read the same blocks.
"""

import argparse
import sys
import warnings
from types import SimpleNamespace

import torch

from benchmarks.packing import EOS, document_lengths, packed_rows
from benchmarks.tables import command_line, fill_unset, machine, table
from benchmarks.timing import Rounds, mib, peak_bytes
from fairseq_alibi.alibi import document_ids, get_slopes, variant_windows
from fairseq_alibi.modules.attention import flex

#: what a flag not given is, in a full run and with ``--quick`` (a flag given wins over both)
PRESETS = {"full": dict(lengths="4096,8192", doc_lengths="256,2048", rounds=3),
           "quick": dict(lengths="512", doc_lengths="32,128", rounds=1)}
HEADS = 8


def cases(length: int, cutoff: float, sinks: int, doc_lengths, seed: int = 0):
    """``{name: (built by the plan, built by create_block_mask)}`` for one length."""
    from torch.nn.attention.flex_attention import create_block_mask

    windows = tuple(tuple(side) for side in variant_windows(get_slopes(HEADS), cutoff))
    window_mod = flex.window_mask_mod(windows, 0, None, sinks, "causal")
    tokens, _ = packed_rows(1, length, document_lengths("uniform", *doc_lengths, seed), seed=seed)
    ids = document_ids(tokens == EOS, "eos")
    documents = SimpleNamespace(ids=ids, offsets=None)
    document_mod = flex.document_mask_mod(ids, flex.alibi_mask_mod("causal", HEADS, 0))
    built = flex._window_block_mask.__wrapped__  # not the cached one
    return {
        "windows": (
            lambda: built(windows, length, length, "cpu", sinks, "causal"),
            lambda: create_block_mask(window_mod, None, HEADS, length, length, device="cpu")),
        "documents": (
            lambda: flex.document_block_mask("causal", documents, None, 0, HEADS, length,
                                             length, "cpu"),
            lambda: create_block_mask(document_mod, 1, HEADS, length, length, device="cpu")),
    }


def same_blocks(a, b) -> bool:
    """Whether two BlockMasks read the same blocks, and the same of them whole."""
    from torch.nn.attention.flex_attention import BlockMask

    def whole(m):
        return BlockMask.from_kv_blocks(m.full_kv_num_blocks, m.full_kv_indices,
                                        BLOCK_SIZE=m.BLOCK_SIZE).to_dense()

    return torch.equal(a.to_dense(), b.to_dense()) and torch.equal(whole(a), whole(b))


def run(lengths, cutoff, sinks, doc_lengths, rounds, log=print):
    rows, same = [], True
    for length in lengths:
        for name, (plan, element) in cases(length, cutoff, sinks, doc_lengths).items():
            timed = Rounds({"plan": plan, "element": element}, rounds)
            same = same and same_blocks(plan(), element())
            peaks = {case: peak_bytes(fn) for case, fn in (("plan", plan), ("element", element))}
            rows.append([name, length, f"{timed.median('element') * 1e3:.1f}",
                         f"{timed.median('plan') * 1e3:.1f}",
                         f"{timed.ratio('element', 'plan'):.1f}", mib(peaks["element"]),
                         mib(peaks["plan"])])
            log(f"{name} at {length}: done")
    body = table(["mask", "keys", "create_block_mask ms", "plan ms", "speed-up",
                  "create_block_mask peak MiB", "plan peak MiB"], rows)
    check = ("Check: both read the same blocks (whole and with the element mask) in every row"
             if same else "CHECK FAILED: the plan's blocks differ from create_block_mask's")
    return body, check, same


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.block_masks",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", help="default 4096,8192; --quick: 512")
    parser.add_argument("--cutoff", type=float, default=8.0)
    parser.add_argument("--sinks", type=int, default=4)
    parser.add_argument("--doc-lengths", help="default 256,2048; --quick: 32,128")
    parser.add_argument("--rounds", type=int, help="default 3; --quick: 1")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="one short length, one round (a "
                        "flag given beside it wins)")
    args = parser.parse_args(argv)
    fill_unset(args, PRESETS["quick" if args.quick else "full"])
    try:
        args.lengths = [int(x) for x in args.lengths.split(",")]
        args.doc_lengths = tuple(int(x) for x in args.doc_lengths.split(","))
        if len(args.doc_lengths) != 2 or not 0 < args.doc_lengths[0] <= args.doc_lengths[1]:
            raise ValueError
    except ValueError:
        parser.error("--lengths: comma-separated whole numbers; --doc-lengths: LOW,HIGH with "
                     "0 < LOW <= HIGH")
    if args.cutoff <= 0 or args.sinks < 0 or min(args.lengths) < 1:
        parser.error("--cutoff must be positive, --sinks at least 0, --lengths at least 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    if not flex.available():
        sys.exit(f"python -m benchmarks.block_masks: {flex._missing()}")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*flex_attention.*")
    body, check, same = run(args.lengths, args.cutoff, args.sinks, args.doc_lengths,
                            args.rounds, log=lambda line: print(line, file=sys.stderr))
    print("\n".join([command_line("benchmarks.block_masks", argv), f"Machine: {machine()}", "",
                     body, "", check]))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
