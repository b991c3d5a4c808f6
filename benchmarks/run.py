"""All benchmarks in one command; every figure is a ratio measured side by side in this run.

    python -m benchmarks.run [--quick] [--only attention,decoding,train,eval,encoder,heads,translation,cross,cross-decoding]
                             [--rounds N]
                             [--threads N] [--markdown FILE]

``--quick`` runs every benchmark at toy sizes in about a minute (the test suite does, so the
scripts cannot rot); its figures mean nothing. ``--markdown`` writes the tables, each with its
command, machine and date, for docs/benchmarks.md.
"""

import argparse
import logging
import shlex
import sys
import tempfile


import torch

from benchmarks import tables

ALL = ("attention", "decoding", "train", "eval", "encoder", "heads", "translation", "cross",
       "cross-decoding")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="toy sizes, one round: a smoke run")
    parser.add_argument("--only", default=",".join(ALL),
                        help=f"comma-separated subset of {','.join(ALL)} (default: all)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="interleaved timing rounds per case; the median is reported")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's own choice)")
    parser.add_argument("--lengths", default=None,
                        help="comma-separated sequence lengths for the attention benchmark")
    parser.add_argument("--markdown", default=None, help="also write the tables to this file")
    parser.add_argument("--work-dir", default=None,
                        help="where the eval benchmark writes its data and checkpoints "
                        "(default: a temporary directory, removed afterwards)")
    args = parser.parse_args(argv)
    args.only = tables.comma_choices(parser, args.only, ALL, "benchmark")
    args.lengths = tables.comma_numbers(parser, args.lengths, "--lengths", 2) \
        if args.lengths else None
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.getLogger("filelock").setLevel(logging.WARNING)  # torch.compile's lock chatter
    command = "python -m benchmarks.run " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    sections = []

    def emit(title, body, notes=""):
        text = tables.section(title, command, body, notes)
        print(text, flush=True)
        sections.append(text)

    if "attention" in args.only:
        from benchmarks import attention

        shape, fwd, fb = attention.run(args.quick, args.rounds, args.lengths, log=log)
        emit("Attention forward (" + shape + ")", fwd)
        emit("Attention forward+backward and memory (" + shape + ")", fb)
        shape, modules = attention.run_modules(args.quick, args.rounds, log=log)
        emit("Attention modules, projections included (" + shape + ")", modules)

    if "decoding" in args.only:
        from benchmarks import decoding

        shape, body = decoding.run(args.quick, args.rounds, log=log)
        emit("Cached decoding, per step: ALiBi ÷ stock decoders (" + shape + ")",
             body, decoding.NOTES)
        shape, body = decoding.run_placement(args.quick, args.rounds, log=log)
        emit("Cached decoding, per step: identical decoders, copied or shared weights ("
             + shape + ")", body)

    with tempfile.TemporaryDirectory() as tmp:
        work = args.work_dir or tmp
        if "train" in args.only:
            from benchmarks import train

            shape, body, notes = train.run(work, args.quick, args.rounds, log=log)
            emit("Training throughput and peak memory (" + shape + ")", body, notes)
        if "eval" in args.only:
            from benchmarks import eval_lm

            shape, body, notes = eval_lm.run(work, args.quick, args.rounds, args.threads,
                                             log=log)
            emit("fairseq-eval-lm, sliding window (" + shape + ")", body, notes)
        if "encoder" in args.only:
            from benchmarks import encoder

            for shape, body, notes in encoder.run(work, args.quick, args.rounds, log=log):
                emit(shape, body, notes)
        if "heads" in args.only and "encoder" not in args.only:  # (`encoder` includes them)
            from benchmarks import encoder

            for shape, body, notes in encoder.run_heads(work, args.quick, args.rounds, log=log):
                emit(shape, body, notes)
        if "translation" in args.only:
            from benchmarks import translation

            for shape, body, notes in translation.run(work, args.quick, args.rounds, log=log):
                emit(shape, body, notes)

        if "cross" in args.only:  # the cross-attention options ÷ today's alibi_transformer
            from benchmarks import translation
            emit(*translation.run_cross(work, args.quick, args.rounds, log=log))
        if "cross" in args.only or "cross-decoding" in args.only:  # (their decoding alone)
            from benchmarks import decoding, translation
            shape, body = decoding.run_cross(args.quick, args.rounds, log=log)
            emit("Cached decoding, per step: cross-attention options ÷ alibi_transformer ("
                 + shape + ")", body)
            emit(*translation.run_cross_generation(work, args.quick, args.rounds, log=log))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(sections))
        log(f"tables written to {args.markdown}")


if __name__ == "__main__":
    main()
