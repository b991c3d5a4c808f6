"""Document masks: what attending each document as its own sequence costs or saves, side by side.

    python -m benchmarks.documents [--quick] [--tables attention,training,granules]
        [--lengths 4096,8192] [--doc-lengths 256,2048] [--cutoff 8]
        [--train-lengths 512,4096] [--corpus uniform|wikitext2|DIR] [--rounds 3] [--threads 1]
        [--device cpu|cuda] [--precision fp32|fp16|bf16] [--json FILE]

Packed rows of documents: the tokens of a row are random words, an ``</s>`` opens each document
(as in a language model's shifted source). Document lengths are drawn (seeded) uniformly from
``--doc-lengths`` (``uniform``), from the articles of WikiText-2's test split (``wikitext2``:
the lengths in words plus one ``</s>`` a line, read from ``../shared/data/wikitext-2``) or from
the documents of a binarized folder's ``train`` split (``DIR``: text with an empty line between
documents, as ``fairseq-alibi corpus --document-breaks`` writes it), and a
row is filled with them, the last one cut at the row's end (so a row starts and ends inside a
document, as packing makes it). Every table times its cases in interleaved paired rounds
(:class:`benchmarks.timing.Rounds`: a ratio is the median of the same round's ratios).

* ``attention`` (causal, ``B = 1``, 8 heads, ``D = 64``, float32): ``dispatch.attend("auto",
  ...)`` of the row without a document mask (every key of the row, today's cost), with one
  (``--alibi-document-mask eos``: the dispatch splits the row into its documents, each its own
  sequence), and the same two with slope windows (``--cutoff``); forward and forward+backward;
  the speed-ups ``no mask ÷ documents``.
* ``training`` (fairseq's own ``Trainer.train_step`` of an ``alibi_transformer_lm``: 2 layers,
  embed 512, 8 heads, FFN 2048, a 2,000-word vocabulary, dropout 0.1): the same batch of
  ``4096 / L`` packed rows of ``L`` tokens with and without the document mask (the tokens/s
  ratio), and ``complete_doc``'s batch of the same documents, each its own row padded to ``L``
  (a document longer than ``L`` cut into rows of ``L``; fairseq cuts at line ends, so real
  ``complete_doc`` pads more: an upper bound of its useful share), timed in the same rounds:
  useful (non-padding) tokens per second of each, and ``documents ÷ complete_doc``.
  ``--device cuda --precision bf16`` (or ``fp16``) times the same steps on a GPU, where
  ``auto`` masks the documents in compiled ``flex``'s block plan from 1,024 keys (the first
  rounds compile it: ``--rounds`` 5 or more).
* ``granules``: the documents case of ``attention`` (no windows) with each value of
  ``tuning.GRANULE_BITS`` (how finely a document's length is rounded up to its bucket's),
  forward and forward+backward, each ÷ the package's value, in the same rounds.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from benchmarks.packing import (EOS, WIKITEXT, corpus_argument, describe, document_lengths,
                                padded_documents, packed_rows, training_sample)
from benchmarks.tables import comma_choices, command_line, fill_unset, machine, table
from benchmarks.timing import Rounds, backward_call, forward_call
from fairseq_alibi.modules.attention import dispatch
from fairseq_alibi.modules.bias import AlibiBias

TABLES = ("attention", "training", "granules")
#: what a flag not given is, in a full run and with ``--quick`` (a flag given wins over both)
PRESETS = {"full": dict(lengths="4096,8192", doc_lengths="256,2048", train_lengths="512,4096",
                        rounds=3),
           "quick": dict(lengths="512", doc_lengths="32,128", train_lengths="128", rounds=1)}
TRAIN_DIMS = ["--decoder-layers", "2", "--decoder-embed-dim", "512",
              "--decoder-ffn-embed-dim", "2048", "--decoder-attention-heads", "8",
              "--share-decoder-input-output-embed"]
TRAIN_TOKENS = 4096  # tokens per training batch, whatever L
#: --precision -> fairseq-train's flag (CUDA only)
PRECISIONS = {"fp32": [], "fp16": ["--fp16"], "bf16": ["--bf16"]}
QUICK_DIMS = ["--decoder-layers", "1", "--decoder-embed-dim", "64",
              "--decoder-input-dim", "64", "--decoder-output-dim", "64",
              "--decoder-ffn-embed-dim", "128", "--decoder-attention-heads", "4"]


def attention_cases(tokens, cutoff: float, heads=8, head_dim=64, split_now=False):
    """``{case: f(q, k, v)}``: ``auto`` with and without the document mask and windows
    (``split_now``: the documents' layout, which the call keeps, cut now under the tuning's
    settings, its buckets' lengths as the case's ``layout_lengths``)."""
    B, L = tokens.shape
    scale = head_dim ** -0.5
    found = {}
    for label, t in (("", 0.0), (f", T={cutoff:g}", cutoff)):
        for name, mode in (("no mask", "none"), ("documents", "eos")):
            bias = AlibiBias(heads, variant="causal", window_cutoff=t, document_mask=mode)
            bias.read_tokens(tokens, EOS)
            call = bias.layer(0).for_call(None, B, L, L, False)

            def case(q, k, v, call=call):
                return dispatch.attend("auto", q, k, v, call, scale=scale)
            documents = getattr(call, "documents", None)
            if split_now and documents is not None:
                case.layout_lengths = sorted(b.length for b in documents.layout().buckets)
            found[name + label] = case
    return found


def attention_table(lengths, doc_lengths, cutoff, corpus, rounds, log=print):
    """``(shape line, Markdown table, rows as dicts)``."""
    rows, records = [], []
    for L in lengths:
        tokens, pieces = packed_rows(1, L, document_lengths(corpus, *doc_lengths, seed=L))
        found = attention_cases(tokens, cutoff)
        # as a model hands them over: views of fairseq's (L, B, H, D) projections
        q, k, v = (torch.randn(L, 1, 8, 64).permute(1, 2, 0, 3) for _ in range(3))
        grad = torch.randn(1, 8, L, 64)
        leaves = [t.detach().clone(memory_format=torch.preserve_format).requires_grad_()
                  for t in (q, k, v)]
        for passes, make in (("forward", lambda f: forward_call(f, q, k, v)),
                             ("fwd+bwd", lambda f: backward_call(f, leaves, grad))):
            timed = Rounds({n: make(f) for n, f in found.items()}, rounds)
            speedups = [timed.ratio("no mask", "documents"),
                        timed.ratio(f"no mask, T={cutoff:g}", f"documents, T={cutoff:g}")]
            rows.append([L, len(pieces), passes] + [f"{timed.median(n):.3f}" for n in found]
                        + [f"{s:.2f}" for s in speedups])
            records.append({"L": L, "documents": pieces, "pass": passes,
                            "seconds": {n: timed.median(n) for n in found},
                            "speedup": speedups[0], "speedup_windowed": speedups[1]})
            log(f"[documents] attention L={L} {passes}: × {speedups[0]:.2f} "
                f"(T={cutoff:g}: × {speedups[1]:.2f})")
    shape = (f"B=1, H=8, D=64, float32, causal, documents: {describe(corpus, doc_lengths)}; "
             f"{rounds} interleaved round(s), median")
    headers = (["L", "documents in the row", "pass"] + [f"{n} s" for n in found]
               + ["no mask ÷ documents", f"the same, T={cutoff:g}"])
    return shape, table(headers, rows), records


#: the values of ``tuning.GRANULE_BITS`` the ``granules`` table compares (the package's first)
GRANULES = (3, 1, 2, 4, 5)


def granule_table(lengths, doc_lengths, corpus, rounds, log=print):
    """``(shape line, Markdown table, rows as dicts)``: the documents case of
    :func:`attention_cases` (no windows) with each of :data:`GRANULES` as
    ``tuning.GRANULE_BITS`` (a bucket's length rounded to ``2^(floor(log2 l) - bits)``: more
    bits, less padding, more buckets), forward and forward+backward, each ÷ the package's."""
    from fairseq_alibi.modules.attention import tuning

    kept, rows, records = tuning.GRANULE_BITS, [], []
    try:
        for L in lengths:
            tokens, pieces = packed_rows(1, L, document_lengths(corpus, *doc_lengths, seed=L))
            q, k, v = (torch.randn(L, 1, 8, 64).permute(1, 2, 0, 3) for _ in range(3))
            grad = torch.randn(1, 8, L, 64)
            leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            cases, buckets = {}, {}
            for bits in GRANULES:  # each call cuts its row once, under its own setting
                tuning.GRANULE_BITS = bits
                cases[bits] = attention_cases(tokens, 0.0, split_now=True)["documents"]
                buckets[bits] = cases[bits].layout_lengths
            for passes, make in (("forward", lambda f: forward_call(f, q, k, v)),
                                 ("fwd+bwd", lambda f: backward_call(f, leaves, grad))):
                timed = Rounds({bits: make(cases[bits]) for bits in GRANULES}, rounds)
                ratios = [timed.ratio(bits, GRANULES[0]) for bits in GRANULES]
                rows.append([L, len(pieces), passes, f"{timed.median(GRANULES[0]):.3f}"]
                            + [f"{r:.2f}" for r in ratios[1:]])
                records.append({"L": L, "documents": pieces, "pass": passes,
                                "ratios": dict(zip(GRANULES, ratios)), "buckets": buckets})
                log(f"[documents] granules L={L} {passes}: "
                    + ", ".join(f"{b}: {r:.2f}" for b, r in zip(GRANULES, ratios)))
    finally:
        tuning.GRANULE_BITS = kept
    shape = (f"B=1, H=8, D=64, float32, causal, documents: {describe(corpus, doc_lengths)}; "
             f"{rounds} interleaved round(s), median of paired ratios")
    headers = (["L", "documents in the row", "pass", f"GRANULE_BITS = {GRANULES[0]} s"]
               + [f"{b} ÷ {GRANULES[0]}" for b in GRANULES[1:]])
    return shape, table(headers, rows), records


def training_table(lengths, doc_lengths, corpus, rounds, work: Path, log=print,
                   dims=TRAIN_DIMS, batch_tokens=TRAIN_TOKENS, device="cpu", precision="fp32"):
    """``(shape line, Markdown table, rows as dicts)`` of the training step (``dims``: the
    model's fairseq-train flags; ``batch_tokens``: per batch; on ``device`` in ``precision``,
    a :data:`PRECISIONS` name)."""
    from benchmarks.trainer import build_trainer, write_dictionary

    def stepping(trainer, sample):
        def step():
            trainer.train_step([sample])
            if device == "cuda":
                torch.cuda.synchronize()
        return step

    data = write_dictionary(str(work / "documents-dict"), 2000 - 4)
    rows, records = [], []
    for L in lengths:
        batch = max(1, batch_tokens // L)
        tokens, pieces = packed_rows(batch, L + 1, document_lengths(corpus, *doc_lengths,
                                                                     seed=L))
        padded, real = padded_documents(pieces, L)
        samples = {"none": training_sample(tokens), "documents": training_sample(tokens),
                   "complete_doc": training_sample(padded, real)}
        trainers = {name: build_trainer(data, "alibi_transformer_lm", L, dims,
                                        extra=extra + PRECISIONS[precision], device=device)
                    for name, extra in (("none", []),
                                        ("documents", ["--alibi-document-mask", "eos"]),
                                        ("complete_doc", []))}
        timed = Rounds({name: stepping(trainers[name][0], samples[name]) for name in trainers},
                       rounds)
        useful = {name: samples[name]["ntokens"] / timed.median(name) for name in trainers}
        ratio = timed.ratio("none", "documents")
        # useful tokens per second: the documents' batch is all real tokens
        versus = statistics_ratio(timed, samples)
        rows.append([L, batch, len(padded)] + [f"{useful[n]:.0f}" for n in trainers]
                    + [f"{ratio:.2f}", f"{versus:.2f}"])
        records.append({"L": L, "rows": batch, "complete_doc_rows": len(padded),
                        "useful_tokens_per_second": useful, "speedup": ratio,
                        "versus_complete_doc": versus})
        log(f"[documents] training L={L}: × {ratio:.2f} the unmasked step, "
            f"× {versus:.2f} complete_doc's useful tokens/s")
    shape = (f"fairseq Trainer.train_step, alibi_transformer_lm {' '.join(dims)}, "
             f"vocabulary 2,000, {batch_tokens} tokens a batch, {device}, "
             f"{'float32' if precision == 'fp32' else precision}, documents: "
             f"{describe(corpus, doc_lengths)}; {rounds} interleaved round(s), median")
    headers = ["L", "rows", "complete_doc rows", "none tokens/s", "documents tokens/s",
               "complete_doc useful tokens/s", "documents ÷ none (speed)",
               "documents ÷ complete_doc (useful tokens/s)"]
    return shape, table(headers, rows), records


def statistics_ratio(timed, samples) -> float:
    """Median over rounds of (documents' useful tokens/s) ÷ (complete_doc's)."""
    import statistics

    docs, full = samples["documents"]["ntokens"], samples["complete_doc"]["ntokens"]
    return statistics.median((docs / a) / (full / b) for a, b in
                             zip(timed.times["documents"], timed.times["complete_doc"]))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.documents",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", default="attention,training",
                        help=f"some of {','.join(TABLES)} (default attention,training)")
    parser.add_argument("--lengths", help="default 4096,8192; --quick: 512")
    parser.add_argument("--doc-lengths", help="default 256,2048; --quick: 32,128")
    parser.add_argument("--train-lengths", help="default 512,4096; --quick: 128")
    parser.add_argument("--corpus", type=corpus_argument, default="uniform")
    parser.add_argument("--cutoff", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, help="default 3; --quick: 1")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the training table's steps run")
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32",
                        help="the training table's (fp16, bf16: --device cuda only)")
    parser.add_argument("--work", default="outputs/benchmarks/documents")
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true",
                        help="small lengths, one round (a smoke run; a flag given beside it "
                        "wins)")
    args = parser.parse_args(argv)
    fill_unset(args, PRESETS["quick" if args.quick else "full"])
    args.tables = comma_choices(parser, args.tables, TABLES, "--tables")
    try:
        args.lengths = [int(x) for x in args.lengths.split(",")]
        args.train_lengths = [int(x) for x in args.train_lengths.split(",")]
        args.doc_lengths = tuple(int(x) for x in args.doc_lengths.split(","))
        if len(args.doc_lengths) != 2 or not 0 < args.doc_lengths[0] <= args.doc_lengths[1]:
            raise ValueError
    except ValueError:
        parser.error("--lengths, --train-lengths: comma-separated whole numbers; "
                     "--doc-lengths: LOW,HIGH with 0 < LOW <= HIGH")
    if args.precision != "fp32" and args.device != "cuda":
        parser.error(f"--precision {args.precision} needs --device cuda (fairseq trains in "
                     "float32 on the CPU)")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    if args.corpus == "wikitext2" and not (WIKITEXT / "wiki.test.tokens").exists():
        parser.error(f"--corpus wikitext2 needs {WIKITEXT / 'wiki.test.tokens'}")
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    report = [command_line("benchmarks.documents", argv), f"Machine: {machine()}", ""]
    record = {"args": vars(args)}
    if "attention" in args.tables:
        shape, body, record["attention"] = attention_table(
            args.lengths, args.doc_lengths, args.cutoff, args.corpus, args.rounds)
        report += ["## Attention with document masks", "", shape, "", body, ""]
    if "granules" in args.tables:
        shape, body, record["granules"] = granule_table(
            args.lengths, args.doc_lengths, args.corpus, args.rounds)
        report += ["## Bucket lengths of the document split (tuning.GRANULE_BITS)", "", shape,
                   "", body, ""]
    if "training" in args.tables:
        small = dict(dims=QUICK_DIMS, batch_tokens=512) if args.quick else {}
        shape, body, record["training"] = training_table(
            args.train_lengths, args.doc_lengths, args.corpus, args.rounds, Path(args.work),
            device=args.device, precision=args.precision, **small)
        report += ["## Training with document masks", "", shape, "", body, ""]
    print("\n".join(report))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
