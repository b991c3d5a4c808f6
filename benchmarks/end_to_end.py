"""What a user meets end to end: fairseq's training step and eval-lm's scoring with a real
vocabulary, dense against slope windows, document masks and both, with the attention's share.

    python -m benchmarks.end_to_end [--quick] [--vocab 20000] [--train-length 4096]
        [--eval-length 8192] [--cutoff 8] [--sinks S] [--corpus wikitext2|uniform]
        [--rounds 3] [--threads 1] [--json FILE]

One ``alibi_transformer_lm`` (2 layers, embed 512, 8 heads, FFN 2048, tied embeddings,
dropout 0.1, ``--vocab`` words: the output layer and its softmax cost what a real vocabulary
costs) in four settings, built from the same seed: ``dense``; ``windows``
(``--alibi-window-cutoff T``); ``documents`` (``--alibi-document-mask eos``); ``documents +
windows``; with ``--sinks S`` two more, the windowed two with ``--alibi-window-sinks S``,
and the sinks' cost: each with sinks ÷ the same without, paired round by round. Rows are packed
documents (:func:`benchmarks.packing.packed_rows`: WikiText-2's article lengths by default, an
``</s>`` opening each document), one row a batch.

* ``training``: fairseq's own ``Trainer.train_step`` (forward, backward, Adam) on one row of
  ``--train-length`` tokens;
* ``scoring``: what ``fairseq-eval-lm`` computes for one block of ``--eval-length`` tokens:
  the model's forward in eval mode without autograd, the log-softmax over the vocabulary and
  the target's log-probabilities (``SequenceScorer``), data loading left out as eval-lm's own
  tokens/s leaves it out.

Each setting's tokens/s and its ratio to ``dense``, timed in interleaved paired rounds
(:class:`benchmarks.timing.Rounds`), beside the attention's share of the dense step: the same
step with every attention call replaced by one that returns its values (``attention
stubbed``, timed in the same rounds): ``share = 1 - stubbed / dense``, so no attention backend
can make the step more than ``1 / (1 - share)`` times faster (Amdahl).
"""

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch

from benchmarks.packing import (WIKITEXT, corpus_argument, describe, document_lengths,
                                packed_rows, training_sample)
from benchmarks.tables import command_line, fill_unset, machine, table
from benchmarks.timing import Rounds
from benchmarks.trainer import build_trainer, write_dictionary

DIMS = ["--decoder-layers", "2", "--decoder-embed-dim", "512", "--decoder-ffn-embed-dim",
        "2048", "--decoder-attention-heads", "8", "--share-decoder-input-output-embed"]
QUICK_DIMS = ["--decoder-layers", "1", "--decoder-embed-dim", "64",
              "--decoder-input-dim", "64", "--decoder-output-dim", "64",
              "--decoder-ffn-embed-dim", "128", "--decoder-attention-heads", "4",
              "--share-decoder-input-output-embed"]
STUBBED = "attention stubbed"
#: what a flag not given is, in a full run and with ``--quick`` (a flag given wins over both)
PRESETS = {
    "full": dict(vocab=20000, train_length=4096, eval_length=8192, rounds=3, corpus="wikitext2",
                 doc_lengths="256,2048"),
    "quick": dict(vocab=500, train_length=128, eval_length=256, rounds=1, corpus="uniform",
                  doc_lengths="16,64"),
}


def settings(cutoff: float, sinks: int = 0) -> dict:
    """``{name: extra fairseq-train flags}`` of the four settings, and with ``sinks`` the
    windowed two with that many attention sinks."""
    windows = ["--alibi-window-cutoff", f"{cutoff:g}"]
    documents = ["--alibi-document-mask", "eos"]
    found = {"dense": [], "windows": windows, "documents": documents,
             "documents + windows": documents + windows}
    for with_sinks, without in sinks_pairs(sinks):
        found[with_sinks] = found[without] + ["--alibi-window-sinks", str(sinks)]
    return found


def sinks_pairs(sinks: int) -> list:
    """``[(setting with sinks, the same without)]`` (none without sinks)."""
    return ([(f"windows + {sinks} sinks", "windows"),
             (f"documents + windows + {sinks} sinks", "documents + windows")] if sinks else [])


@contextlib.contextmanager
def attention_stubbed():
    """Every ALiBi self-attention call returns its values: the step without the attention."""
    from fairseq_alibi.modules import alibi_multihead_attention as mha

    real = mha.attend
    mha.attend = lambda backend, q, k, v, *rest: v
    try:
        yield
    finally:
        mha.attend = real


def stubbed(fn):
    def call():
        with attention_stubbed():
            return fn()
    return call


def scoring_call(model, sample):
    """What fairseq-eval-lm's ``SequenceScorer`` computes for one batch."""
    def call():
        with torch.no_grad():
            out = model(**sample["net_input"])
            lprobs = model.get_normalized_probs(out, log_probs=True)
            return lprobs.gather(-1, sample["target"].unsqueeze(-1))
    return call


def share_words(part: str, share: float) -> str:
    """What the attention's measured share of ``part``'s dense step says, and its Amdahl bound;
    a share outside (0, 1) is timing noise (the stubbed step timed no faster), not a share."""
    if not 0 < share < 1:
        return (f"{part}: the attention's share of the dense step is not measurable above the "
                f"noise at this size")
    return (f"{part}: the attention is {share:.0%} of the dense step (at most "
            f"{1 / (1 - share):.2f}× from any attention)")


def measure(args, log=print):
    """``(shape line, Markdown table, record)``."""
    dims = QUICK_DIMS if args.quick else DIMS
    data = write_dictionary(str(Path(args.work) / f"dict-{args.vocab}"), args.vocab - 4)
    lengths = document_lengths(args.corpus, *args.doc_lengths, seed=args.train_length)
    rows = {}
    for part, L in (("training", args.train_length), ("scoring", args.eval_length)):
        tokens, pieces = packed_rows(1, L + 1, lengths, vocab=args.vocab, seed=L)
        rows[part] = (training_sample(tokens), len(pieces))
    trainers = {name: build_trainer(data, "alibi_transformer_lm", args.eval_length, dims,
                                    extra=extra)[0]
                for name, extra in settings(args.cutoff, args.sinks).items()}
    record = {}
    for part, (sample, documents) in rows.items():
        if part == "training":
            cases = {name: (lambda t=t: t.train_step([sample])) for name, t in trainers.items()}
        else:
            for t in trainers.values():
                t.model.eval()
            cases = {name: scoring_call(t.model, sample) for name, t in trainers.items()}
        cases[STUBBED] = stubbed(cases["dense"])
        timed = Rounds(cases, args.rounds)
        tokens = sample["ntokens"]
        share = 1 - timed.ratio(STUBBED, "dense")
        record[part] = {"tokens": tokens, "documents": documents, "attention_share": share,
                        "tokens_per_second": {n: tokens / timed.median(n) for n in cases},
                        "speedup": {n: timed.ratio("dense", n) for n in cases},
                        "sinks_cost": {n: timed.ratio(n, without) for n, without
                                       in sinks_pairs(args.sinks)}}
        log(f"[end_to_end] {share_words(part, share)}; " + ", ".join(
            f"{n} × {timed.ratio('dense', n):.2f}" for n in cases if n != "dense"))
    names = list(settings(args.cutoff, args.sinks)) + [STUBBED]
    body = table(
        ["setting", f"training tokens/s (L = {args.train_length:,})", "÷ dense",
         f"scoring tokens/s (L = {args.eval_length:,})", "÷ dense"],
        [[n] + [x for part in ("training", "scoring") for x in (
            f"{record[part]['tokens_per_second'][n]:,.0f}",
            f"{record[part]['speedup'][n]:.2f}")] for n in names])
    shares = "; ".join(share_words(part, record[part]["attention_share"]) for part in record)
    if args.sinks:
        shares += "; time with sinks ÷ without: " + "; ".join(
            f"{part} {n} {record[part]['sinks_cost'][n]:.3f}×" for part in record
            for n in record[part]["sinks_cost"])
    shape = (f"alibi_transformer_lm {' '.join(dims)}, vocabulary {args.vocab:,}, float32, "
             f"T = {args.cutoff:g}, one packed row a batch, documents: "
             f"{describe(args.corpus, args.doc_lengths)} ({rows['training'][1]} / "
             f"{rows['scoring'][1]} in the rows); {args.rounds} interleaved round(s), median. "
             f"{shares}.")
    return shape, body, record


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.end_to_end",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int)
    parser.add_argument("--train-length", type=int)
    parser.add_argument("--eval-length", type=int)
    parser.add_argument("--cutoff", type=float, default=8.0)
    parser.add_argument("--sinks", type=int, default=0, help="also time the windowed settings "
                        "with this many attention sinks (--alibi-window-sinks; 0: not)")
    parser.add_argument("--corpus", type=corpus_argument)
    parser.add_argument("--doc-lengths", help="LOW,HIGH of --corpus uniform's document lengths")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", default="outputs/benchmarks/end_to_end")
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true", help="a small model, short rows, "
                        "one round, the uniform corpus (a smoke run; a flag given beside it wins)")
    args = parser.parse_args(argv)
    fill_unset(args, PRESETS["quick" if args.quick else "full"])
    try:
        args.doc_lengths = tuple(int(x) for x in args.doc_lengths.split(","))
        if len(args.doc_lengths) != 2 or not 0 < args.doc_lengths[0] <= args.doc_lengths[1]:
            raise ValueError
    except ValueError:
        parser.error("--doc-lengths: LOW,HIGH with 0 < LOW <= HIGH")
    for flag in ("vocab", "train_length", "eval_length", "rounds", "threads"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.sinks < 0:
        parser.error("--sinks must be 0 (no sinks timed) or a positive number of positions")
    if not args.cutoff > 0:
        parser.error("--cutoff must be a positive number of nats (e.g. --cutoff 8)")
    if args.corpus == "wikitext2" and not (WIKITEXT / "wiki.test.tokens").exists():
        parser.error(f"--corpus wikitext2 needs {WIKITEXT / 'wiki.test.tokens'}; "
                     "or give --corpus uniform")
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    shape, body, record = measure(args)
    print("\n".join([command_line("benchmarks.end_to_end", argv), f"Machine: {machine()}", "",
                     "## End to end", "", shape, "", body]))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), **record}, indent=2,
                                              default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
