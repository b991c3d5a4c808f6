"""Training packed with document masks: perplexity per document and in the packed evaluation,
over seeds, against packing without them and against ``complete_doc``.

    python -m experiments.document_masks [--out DIR] [--seeds 1,2,3] [--max-update 1000]
                                         [--L 256] [--jobs 1] [--threads 1] [--smoke]

The quickstart's language model (its ``tiny`` size and training command,
:func:`fairseq_alibi.cli.quickstart.train_command`) on its embedded corpus written with an
empty line after every document (``fairseq-alibi corpus --document-breaks``: the boundary that
``--sample-break-mode complete_doc`` and ``--alibi-document-mask doc`` split on), trained at
``L`` three ways per seed:

* ``packed``: ``--sample-break-mode none`` (fairseq's default: rows run across documents);
* ``packed + mask``: the same rows with ``--alibi-document-mask doc`` (no attention crosses a
  document boundary);
* ``complete_doc``: ``--sample-break-mode complete_doc`` (a row never crosses a document;
  rows are padded, so fewer real tokens per update).

The same seed gives the same initialisation. Each checkpoint is scored by ``fairseq-eval-lm`` on
the test split in non-overlapping blocks of ``L`` twice, on the same tokens: **per document**
(the load-time override ``{'alibi_document_mask': 'doc'}``: every token sees only the earlier
tokens of its own document, each document scored as if on its own) and **packed** (``none``:
the stock evaluation, whose context runs across documents). Per setting: the median over seeds
and its spread (max - min); against ``packed``, the difference of the medians and whether it
is within the seeds' spread.

Outputs in ``--out``: ``document_masks.md``, ``run.json``, ``logs/``, ``eval/``.
``--smoke``: the quickstart's smoke model, one seed, a few updates (used by the tests).
"""

import argparse
import sys
import time
from pathlib import Path
from typing import Dict, List

from benchmarks.tables import machine, table, today
from experiments.lm_runs import (comma_list, command_line, publish, score_runs, seed_summary,
                                 start_run, train_settings, write_json)
from fairseq_alibi.cli.corpus import SPLITS, build_corpus
from fairseq_alibi.cli.quickstart import SIZES, SMOKE, SMOKE_L, prepare_text_data

#: setting -> its extra fairseq-train flags
SETTINGS = {
    "packed": [],
    "packed + mask": ["--alibi-document-mask", "doc"],
    "complete_doc": ["--sample-break-mode", "complete_doc"],
}
#: evaluation -> the load-time override of the document mask
EVALUATIONS = {"per document": "doc", "packed": "none"}
BASE = "packed"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.document_masks",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/document_masks")
    parser.add_argument("--seeds", type=comma_list(int), default=[1, 2, 3])
    parser.add_argument("--max-update", type=int, default=1000)
    parser.add_argument("--L", type=int, default=None, help="training length (default 256)")
    parser.add_argument("--jobs", type=int, default=1, help="fairseq runs at once")
    parser.add_argument("--threads", type=int, default=1, help="threads per fairseq run")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        args.seeds, args.max_update = args.seeds[:1], min(args.max_update, 20)
    args.L = args.L or (SMOKE_L if args.smoke else 256)
    if args.L < 2 or args.max_update < 1:
        parser.error("--L must be at least 2 and --max-update at least 1")
    return args


def corpus_with_document_breaks(out: Path, vocab: int, env: dict, seed: int, smoke: bool):
    """The embedded corpus with an empty line after every document, binarized (once)."""
    folder = out / "data" / "bin"
    if (folder / "test.bin").is_file():
        return folder
    raw = out / "data" / "raw"
    build_corpus(raw, test_fraction=0.01 if smoke else 0.05, document_breaks=True)
    return prepare_text_data({s: raw / f"{s}.txt" for s in SPLITS}, out / "data", vocab, env,
                             seed)


def train_all(args, data, out: Path, env: dict, log) -> Dict[tuple, dict]:
    size = dict(SMOKE if args.smoke else SIZES["tiny"])
    return train_settings(SETTINGS, args.seeds, data, out, size, args.L, args.max_update, env,
                          args.jobs, log)


def evaluate_all(runs, data, L: int, out: Path, threads: int, jobs: int) -> List[dict]:
    """One row per ``(setting, seed, evaluation)``: perplexity and token count on the test
    split in non-overlapping blocks of ``L``."""
    return [dict(row, evaluation=evaluation) for evaluation, mode in EVALUATIONS.items()
            for row in score_runs(runs, data, L, out / "eval" / mode, "test",
                                  f"Document masks, {evaluation}", threads, jobs,
                                  {"alibi_document_mask": mode})]


def summarise(rows: List[dict], evaluation: str, setting: str) -> dict:
    def by_seed(name):
        return {r["seed"]: r["perplexity"] for r in rows
                if r["evaluation"] == evaluation and r["setting"] == name}

    return {"evaluation": evaluation, "setting": setting,
            **seed_summary(by_seed(setting), by_seed(BASE))}


def report(rows: List[dict], args, runs, seconds: float) -> (str, List[dict]):
    summaries = [summarise(rows, e, s) for e in EVALUATIONS for s in SETTINGS]
    body = []
    for s in summaries:
        base = s["setting"] == BASE
        body.append([s["evaluation"], s["setting"], f"{s['median']:.2f}", f"{s['spread']:.2f}",
                     ", ".join(f"{v:.2f}" for v in s["seeds"].values()),
                     "—" if base else f"{s['difference']:+.2f} ({s['relative']:+.2%})",
                     "—" if base else ", ".join(f"{d:+.2f}" for d in s["paired"].values()),
                     "—" if base else ("yes" if s["within_noise"] else "no")
                     + f" (spread {s['noise']:.2f})"])
    tokens = sorted({r["tokens"] for r in rows})
    size = SMOKE if args.smoke else SIZES["tiny"]
    text = "\n".join([
        "# Document masks: training packed with and without them, and complete_doc", "",
        f"`{command_line('experiments.document_masks')}` — {today()}, {machine()}, "
        f"{seconds / 60:.0f} min.", "",
        f"The quickstart LM ({size['layers']} layers, dim {size['dim']}, {size['heads']} "
        f"heads, vocabulary {size['vocab']}) trained at L = {args.L} for {args.max_update} "
        f"updates of {size['max_tokens']} tokens, seeds {', '.join(map(str, args.seeds))}, on "
        "the embedded corpus with an empty line after every document. Perplexity on the test "
        f"split in non-overlapping blocks of L (fairseq-eval-lm; every run scored the same "
        f"{', '.join(f'{t:,}' for t in tokens)} tokens); *per document*: each token sees only "
        "its own document's earlier tokens (the override `{'alibi_document_mask': 'doc'}`); "
        "*packed*: the stock evaluation, context across documents.", "",
        table(["evaluation", "trained", "median ppl", "spread", "per seed", "median − packed",
               "paired (seed by seed)", "within the seeds' spread"], body), "",
        "Training time per run (s): " + ", ".join(
            f"{name} seed {seed} {run['seconds']:.0f}" for (name, seed), run in runs.items()),
    ])
    return text, summaries


def main(argv=None):
    args = parse_args(argv)
    started = time.time()
    out, env, log = start_run(args.out, "documents", args.threads)
    size = SMOKE if args.smoke else SIZES["tiny"]
    data = corpus_with_document_breaks(out, size["vocab"], env, args.seeds[0], args.smoke)
    runs = train_all(args, data, out, env, log)
    rows = evaluate_all(runs, data, args.L, out, args.threads, args.jobs)
    text, summaries = report(rows, args, runs, time.time() - started)
    write_json(out / "rows.json", {"rows": rows})
    return publish(out, "document_masks.md", text,
                   {"args": vars(args), "rows": rows, "summaries": summaries},
                   log, time.time() - started)


if __name__ == "__main__":
    sys.exit(main())
