"""Windowed attention today against the same function at an earlier git revision, side by side.

    python -m benchmarks.windowed_revision --against REV [--lengths 4096,8192]
        [--variants causal,symmetric] [--documents 3000,2500,2692] [--cutoff 8] [--sinks 0]
        [--rounds 3] [--threads 1] [--batch 1] [--quick]

The revision's ``fairseq_alibi`` is read from git (``git archive REV``) into a temporary folder
under another package name (its imports renamed; it registers nothing with fairseq), and its
``windowed.attention`` is timed against today's on the same inputs in interleaved paired rounds
(:class:`benchmarks.timing.Rounds`): ``(B, H, L, D)`` float32 queries (``--batch``), keys and
values, Press's slopes of ``H = 8`` heads (``asymmetric``: halved for the future), the windows
of ``--cutoff``, ``--sinks`` attention sinks (given to both revisions only when not 0).
``--documents``: also a causal row of documents of those lengths with ``--alibi-document-mask
eos`` and the windows, through each revision's own ``dispatch.attend("auto", ...)`` (the
documents split into sequences, then windowed). Each row: the seconds of both, ``then ÷ now``
(above 1: today is faster) and the largest difference of their outputs.
"""

import argparse
import importlib
import importlib.util
import io
import math
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import torch

from benchmarks.tables import comma_choices, command_line, fill_unset, machine, table
from benchmarks.timing import Rounds, backward_call, forward_call
from fairseq_alibi.alibi import VARIANTS, variant_slopes, variant_windows
from fairseq_alibi.modules.attention import windowed

PASSES = ("forward", "fwd+bwd")
EOS = 2  # fairseq's </s>


def load_revision(revision: str, folder: Path):
    """The ``windowed`` module of ``revision``, imported as ``fairseq_alibi_then``."""
    root = Path(__file__).resolve().parent.parent
    try:
        archive = subprocess.run(["git", "archive", revision, "fairseq_alibi"], cwd=root,
                                 check=True, capture_output=True).stdout
    except subprocess.CalledProcessError as error:
        raise SystemExit(f"--against {revision}: git cannot read that revision "
                         f"({error.stderr.decode().strip()})")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        # the safe "data" filter where this Python has it (3.11.4 on; git's own archive)
        tar.extractall(folder, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    package = folder / "fairseq_alibi_then"
    (folder / "fairseq_alibi").rename(package)
    for source in package.rglob("*.py"):
        text = re.sub(r"\bfairseq_alibi\b", "fairseq_alibi_then", source.read_text())
        source.write_text(text)
    (package / "__init__.py").write_text("")  # no registration with fairseq
    for name in [n for n in sys.modules if n.split(".")[0] == "fairseq_alibi_then"]:
        del sys.modules[name]  # an earlier call's revision
    spec = importlib.util.spec_from_file_location(
        "fairseq_alibi_then", package / "__init__.py", submodule_search_locations=[str(package)])
    sys.modules["fairseq_alibi_then"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules["fairseq_alibi_then"])
    return importlib.import_module("fairseq_alibi_then.modules.attention.windowed")


def cases(then, lengths, variants, cutoff, heads, documents=(), sinks=0):
    """``{(label, L): (f_then, f_now)}``: ``windowed.attention`` of each variant and length;
    with ``documents`` (lengths), also ``dispatch.attend("auto", ...)`` of a causal row of those
    documents (``--alibi-document-mask eos``, an ``</s>`` opening each) with the windows."""
    found = {}
    for variant in variants:
        slopes = variant_slopes(heads, variant)
        future = slopes / 2 if variant == "asymmetric" else None
        windows = variant_windows(slopes, cutoff, variant, future)
        given = dict(sinks=sinks) if sinks else {}
        for L in lengths:
            found[variant, L] = tuple(
                (lambda module: lambda *x: module.attention(*x, slopes, future, variant,
                                                            windows, **given))(module)
                for module in (then, windowed))
    if documents:
        L = sum(documents)
        tokens = torch.ones(1, L, dtype=torch.long)
        tokens[0, torch.tensor([0] + list(documents[:-1])).cumsum(0)] = EOS

        def attending(package):
            bias = importlib.import_module(f"{package}.modules.bias").AlibiBias(
                heads, variant="causal", window_cutoff=cutoff, document_mask="eos")
            attend = importlib.import_module(f"{package}.modules.attention.dispatch").attend

            def run(q, k, v):
                bias.read_tokens(tokens, EOS)
                return attend("auto", q, k, v, bias.layer(0).for_call(None, 1, L, L, False))
            return run

        found["causal + documents", L] = (attending(then.__name__.split(".")[0]),
                                          attending("fairseq_alibi"))
    return found


def compare(found, rounds=3, heads=8, head_dim=64, batch=1, log=print):
    """Rows ``[case, L, pass, then s, now s, then ÷ now, max |Δ|]`` of :func:`cases`
    (``batch`` sequences a call; a row of documents is one sequence)."""
    rows = []
    for (label, L), (then, now) in found.items():
        B = 1 if "documents" in label else batch
        q, k, v = (torch.randn(B, heads, L, head_dim) for _ in range(3))
        grad = torch.randn(B, heads, L, head_dim)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        with torch.no_grad():
            gap = (then(q, k, v) - now(q, k, v)).abs().max().item()
        makers = {"forward": lambda f: forward_call(f, q, k, v),
                  "fwd+bwd": lambda f: backward_call(f, leaves, grad)}
        for name in PASSES:
            timed = Rounds({n: makers[name](f) for n, f in (("then", then), ("now", now))},
                           rounds)
            rows.append([label, L, name, f"{timed.median('then'):.3f}",
                         f"{timed.median('now'):.3f}", f"{timed.ratio('then', 'now'):.2f}",
                         f"{gap:.1e}"])
            log(f"[windowed_revision] {label} L={L} {name}: then ÷ now {rows[-1][5]}")
    return rows


def parse_args(argv=None):
    """The flags, ``lengths``, ``documents`` and ``variants`` as lists; ``--quick`` fills only
    what is not given (a flag given wins over its preset)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.windowed_revision",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the git revision to compare with")
    parser.add_argument("--lengths", default=None,
                        help="comma-separated lengths (default 4096,8192; --quick: 256)")
    parser.add_argument("--variants", default="causal,symmetric",
                        help="comma-separated variants")
    parser.add_argument("--cutoff", type=float, default=8.0, help="the window cutoff T, nats")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved timing rounds (default 3; --quick: 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--documents", default="",
                        help="comma-separated document lengths: also a causal row of them with "
                             "--alibi-document-mask eos and the windows, through dispatch")
    parser.add_argument("--sinks", type=int, default=0,
                        help="attention sinks of the windowed calls (0: none, and not passed)")
    parser.add_argument("--batch", type=int, default=1,
                        help="sequences a call (a row of documents stays one)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: L = 256, D = 16, one "
                        "round (a flag given beside it wins)")
    args = parser.parse_args(argv)
    fill_unset(args, dict(lengths="256", rounds=1) if args.quick
               else dict(lengths="4096,8192", rounds=3))
    if not (args.cutoff > 0 and math.isfinite(args.cutoff)):
        parser.error("--cutoff must be a positive number of nats")
    try:
        lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    except ValueError:
        lengths = []
    if not lengths or min(lengths) < 1:
        parser.error(f"--lengths: comma-separated positive lengths, got {args.lengths!r}")
    try:
        documents = [int(x) for x in args.documents.split(",") if x.strip()]
    except ValueError:
        documents = [0]
    if documents and min(documents) < 1:
        parser.error(f"--documents: comma-separated positive lengths, got {args.documents!r}")
    if args.rounds < 1 or args.threads < 1 or args.batch < 1:
        parser.error("--rounds, --threads and --batch must be at least 1")
    if args.sinks < 0:
        parser.error(f"--sinks must be 0 or more positions, got {args.sinks}")
    args.variants = comma_choices(parser, args.variants, VARIANTS, "variant")
    args.lengths, args.documents = lengths, documents
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    heads, head_dim = 8, (16 if args.quick else 64)
    with tempfile.TemporaryDirectory() as folder:
        then = load_revision(args.against, Path(folder))
        rows = compare(cases(then, args.lengths, args.variants, args.cutoff, heads,
                             args.documents, args.sinks), args.rounds,
                       heads, head_dim, args.batch,
                       log=lambda line: print(line, file=sys.stderr))
    text = (f"{command_line('benchmarks.windowed_revision', argv)}\nMachine: {machine()}  \n"
            f"B={args.batch}, H={heads}, D={head_dim}, float32, cutoff T={args.cutoff:g}, "
            f"{args.sinks} sink(s), {args.rounds} interleaved round(s), median\n\n"
            + table(["case", "L", "pass", f"{args.against} s", "now s",
                     f"{args.against} ÷ now", "max |Δ|"], rows))
    print(text)
    return text


if __name__ == "__main__":
    main()
