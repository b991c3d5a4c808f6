"""Every CUDA figure of docs/benchmarks.md ("GPU (H100)") in one command, within a time budget.

    python -m benchmarks.gpu --budget 420 --out DIR [--only tests,decode,memory,flex]
    python -m benchmarks.gpu --quick --device cpu --out DIR    # a CPU smoke run (the test suite)

The default parts, in this order:

* ``tests``: ``pytest tests/cuda`` whole (every backend × variant × dtype against
  float64, cached decoding included; flex with windows, sinks and documents), with
  pytest-xdist; each test's outcome is recorded as it finishes
  (``benchmarks/pytest_record.py``): the summary, the first failure's message;
* ``decode``: tiny ``alibi_transformer_lm`` and ``alibi_transformer`` (``--cross-alibi pointer
  --cross-alibi-eos-guard 2``) trained here for a few updates, then beam 5 through
  ``fairseq-interactive`` / ``fairseq-generate`` on the CPU (fp32) and on the device (fp32,
  ``--fp16``): device hypotheses identical to the CPU's, fp16 scores within tolerance
  (``benchmarks/gpu_decode.py``);
* ``memory``: fairseq Trainer steps of ``alibi_transformer_lm --alibi-attention auto`` and of
  stock ``transformer_lm``, ``--fp16``, L = 2048 and 8192: peak CUDA memory and tokens/s, each
  ALiBi ÷ stock, measured side by side;
* ``flex``: compiled flex with the ALiBi ``score_mod`` ÷ the same compiled kernel with no bias
  (same block mask), forward+backward, bf16, causal, L = 4096, D = 64 and 128.

By name only: ``masks`` (slope windows, document masks and both: the dense bias, the split into
documents and flex, bf16, L = 4096 and 16384 causal forward+backward by default: ``--lengths``,
``--variants``, ``--passes``), ``attention`` (every CUDA
backend's TFLOP/s against the no-bias kernels at
L = 1k…16k), ``train`` (Trainer steps of each backend at L = 512…8192), ``end_to_end``
(``fairseq-train`` fp32/fp16/bf16 of three models on WikiText-2, ``fairseq-eval-lm`` at 8×L,
``fairseq-generate``).

Each part runs in a process of its own (a sticky CUDA fault or a hang in one cannot cost the
others their figures). ``--budget SECONDS`` bounds the whole run: before each part the time left
is checked, a part whose minimum (``NEEDS`` in ``benchmarks/gpu_supervisor.py``) no longer fits
is skipped and the report says so, and a part gets the time left less the later parts' minimums,
after which it is stopped. Into ``--out`` go ``gpu.md`` (the tables, with command, machine and
date, and each part's status), ``results.json`` and ``log.txt``, rewritten after every figure,
``tests.log`` (pytest's output, as it goes) and ``fairseq.log`` (every fairseq command line run
and its output): a run cut at its limit keeps everything measured so far. ``--quick`` runs toy
sizes (on the CPU with ``--device cpu``, where the device side of each comparison runs on the
CPU): its figures mean nothing.
"""

import time

STARTED = time.time()  # --budget counts from here, before the slow imports below

import argparse
import os
import signal
import sys
import tempfile
import traceback

import torch

from benchmarks import subprocesses, gpu_decode, gpu_report, gpu_supervisor, tables
from benchmarks.gpu_masks import run_masks
from benchmarks.gpu_parts import (E2E_MODELS, run_attention, run_end_to_end, run_flex,
                                  run_tests, run_train)
from benchmarks.gpu_report import Part, log

PARTS = ("tests", "decode", "memory", "flex", "masks", "attention", "train", "end_to_end")
DEFAULT_PARTS = ("tests", "decode", "memory", "flex")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(DEFAULT_PARTS),
                        help=f"comma-separated parts, run in the order given, of "
                        f"{','.join(PARTS)} (default: {','.join(DEFAULT_PARTS)})")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for the whole run: parts that no longer fit are skipped, "
                        "each part is stopped at its share (default: no limit)")
    parser.add_argument("--out", default="outputs/gpu", help="folder for gpu.md, results.json, logs")
    parser.add_argument("--data", default=os.path.join(os.path.dirname(subprocesses.REPO), "shared", "data"),
                        help="the shared data folder (wikitext-2/) for end_to_end")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: a smoke run (with --quick); the device side of each "
                        "comparison runs on the CPU")
    parser.add_argument("--quick", action="store_true", help="toy sizes: a smoke run")
    parser.add_argument("--lengths", default=None,
                        help="attention lengths (default 1k…16k; masks: 4096,16384)")
    parser.add_argument("--variants", default=None, help="attention variants (default "
                        "causal,symmetric,offset)")
    parser.add_argument("--head-dims", default=None, help="attention and flex head sizes "
                        "(default 64,128)")
    parser.add_argument("--tests", default="tests/cuda",
                        help="the test files or folders of the tests part (default tests/cuda)")
    parser.add_argument("--passes", default=None, help="masks passes, of fwd+bwd,forward "
                        "(default fwd+bwd on CUDA, forward on the CPU)")
    parser.add_argument("--train-lengths", default=None,
                        help="Trainer lengths (default: memory 2048,8192; train 512…8192)")
    parser.add_argument("--flex-length", type=int, default=None, help="flex length (4096)")
    parser.add_argument("--models", default=None, help=f"end_to_end models (default "
                        f"{','.join(E2E_MODELS)})")
    parser.add_argument("--updates", type=int, default=None, help="end_to_end updates (300)")
    parser.add_argument("--test-workers", type=int, default=None,
                        help="pytest-xdist workers for the tests (default: 8 on CUDA, at most "
                        "one per core; none on the CPU)")
    parser.add_argument("--append", action="store_true",
                        help="keep the parts already reported in --out (those run again are "
                        "replaced)")
    parser.add_argument("--run-part", default=None, help=argparse.SUPPRESS)  # a part's process
    parser.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    def ints(text, flag):
        return tuple(tables.comma_numbers(parser, text, flag, 2)) if text else None

    args.lengths, args.head_dims = ints(args.lengths, "--lengths"), ints(args.head_dims,
                                                                            "--head-dims")
    args.train_lengths = ints(args.train_lengths, "--train-lengths")
    args.variants = args.variants and tuple(args.variants.split(","))
    args.passes = args.passes and tables.comma_choices(parser, args.passes,
                                                       ("fwd+bwd", "forward"), "pass")
    args.models = args.models and tables.comma_choices(parser, args.models, E2E_MODELS, "model")
    args.only = tables.comma_choices(parser, args.only, PARTS, "part")
    if args.test_workers is None:  # compiling flex, most of the tests' time, is CPU-bound
        args.test_workers = min(8, os.cpu_count() or 1) if args.device == "cuda" else 1
    if args.budget is not None and args.budget <= 0:
        parser.error(f"--budget must be a positive number of seconds, got {args.budget:g}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here: run it on a GPU machine (or --device cpu --quick)")
    if "end_to_end" in args.only and not os.path.isdir(os.path.join(args.data, "wikitext-2")):
        parser.error(f"no wikitext-2/ in {args.data}: pass --data DIR (the shared data folder)")
    return args


def run_part(args):
    """One part, in this process (``--run-part``), until ``--deadline``."""
    part = Part(args.out, args.run_part, args.deadline)
    user_dir = os.path.join(subprocesses.REPO, "fairseq_alibi")
    name, fairseq_log = args.run_part, os.path.join(args.out, "fairseq.log")
    try:
        with tempfile.TemporaryDirectory() as work:
            if name == "tests":
                run_tests(part, args.out, args.quick, args.test_workers,
                          args.tests.split(","))
            elif name == "decode":
                gpu_decode.run(part, work, args.device, args.quick, user_dir, fairseq_log)
            elif name == "memory":
                run_train(part, work, args.quick, args.device,
                          args.train_lengths or (None if args.quick else (2048, 8192)),
                          backends=["auto"], rounds=5, warmup=2, key="memory",
                          title="Peak memory and tokens/s of Trainer steps")
            elif name == "flex":
                run_flex(part, args.quick, args.device, args.flex_length, args.head_dims)
            elif name == "masks":
                run_masks(part, args.quick, args.device, args.lengths, args.variants,
                          args.passes)
            elif name == "attention":
                results, shape, body = run_attention(args.quick, args.device, args.lengths,
                                                     args.variants, args.head_dims)
                part.record("attention", results)
                part.section(f"CUDA attention TFLOP/s against the no-bias kernels ({shape})",
                             body)
            elif name == "train":
                run_train(part, work, args.quick, args.device, args.train_lengths)
            elif name == "end_to_end":
                results, shape, train_table, eval_table = run_end_to_end(
                    args.data, work, args.quick, fairseq_log, user_dir, args.device,
                    args.updates, args.models)
                part.record("end_to_end", results)
                part.section(f"End to end through fairseq's CLIs ({shape})", train_table)
                part.section("End to end: eval-lm at 8×L and generate, each checkpoint",
                             eval_table)
    except Exception as error:  # said in the report; the other parts go on
        log(traceback.format_exc())
        part.note(f"failed: {type(error).__name__}: {str(error)[:500]}")
        return 1
    return 0


def main(argv=None, started=None):
    """The run (or, with ``--run-part``, one part); the budget counts from ``started``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    os.makedirs(os.path.join(args.out, "parts"), exist_ok=True)
    gpu_report.LOG = os.path.join(args.out, "log.txt")
    if args.run_part:
        return run_part(args)
    start = started or time.time()
    return gpu_supervisor.supervise(argv, args, start)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, gpu_supervisor.exit_on_sigterm)
    sys.exit(main(started=STARTED))
