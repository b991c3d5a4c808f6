"""Training packed with document masks: perplexity per document and in the packed evaluation,
over seeds, against packing without them and against ``complete_doc``.

    python -m experiments.document_masks [--family lm|mlm] [--out DIR] [--data DIR]
                                         [--seeds 1,2,3] [--max-update N] [--L 256] [--jobs 1]
                                         [--threads 1] [--smoke]

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

``--family mlm``: the same for a masked LM. ``alibi_roberta`` (``--alibi-variant offset``, the
encoder study's pretraining command, :func:`experiments.encoder_study.masked_lm_command`) at
the quickstart's ``tiny`` size and tokens per update, ``--task masked_lm`` on the same corpus,
three ways per seed:

* ``complete``: ``--sample-break-mode complete`` (fairseq's packing for masked LMs: whole lines
  packed into blocks of up to ``L - 1`` tokens across documents, ``<s>`` prepended). An empty
  line is a sample of one token, ``</s>``, so a block that crosses a document reads ``... </s>
  </s> ...``: the boundary ``doc`` finds;
* ``complete + mask``: the same blocks with ``--alibi-document-mask doc``;
* ``complete + mask + masked_lm_documents``: the same with ``--criterion masked_lm_documents``,
  which keeps every ``</s>`` the masking chose in the input (and out of the targets), so the
  mask sees every boundary;
* ``complete_doc``: ``--sample-break-mode complete_doc`` (a block never crosses a document).

Each checkpoint is scored in this process by
:func:`experiments.encoder_study.mlm_perplexity` (what ``fairseq-validate --valid-subset test
--sample-break-mode complete --tokens-per-sample L --seed 1`` computes) on the test split cut
into ``complete`` blocks of ``L``, masked with one seed (:data:`MASK_SEED`): every
model predicts the same masked tokens, per document (override ``doc``) and packed (``none``),
and per document with every ``</s>`` kept (as ``masked_lm_documents`` trains: the masked
tokens less the ``</s>``).
A line longer than a block makes a block of its own, kept whole (ALiBi lifts the task's length
limit), in training as in scoring; the report counts the blocks, tokens and masked tokens
scored, and how many of the blocks' document boundaries the masking hides (``doc`` reads the
masked input: a ``</s>`` replaced by ``<mask>`` hides its boundary). ``--reuse`` keeps the
finished runs of the same commands in ``--out`` (a setting added later trains alone).

Outputs in ``--out`` (default ``outputs/document_masks``, ``--family mlm``:
``outputs/document_masks_mlm``): ``document_masks.md`` (``document_masks_mlm.md``), ``run.json``,
``logs/``, ``eval/`` (the LM's). ``--data``: a binarized corpus of one's own, one empty line
between documents, instead of the embedded one. ``--smoke``: the quickstart's smoke size, one
seed, a few updates (used by the tests).
"""

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence

from benchmarks.tables import machine, table, today
from experiments.encoder_study import CONFIGS, held_out_blocks, masked_lm_command, mlm_perplexity
from experiments.encoder_study_configs import Settings
from experiments.lm_runs import (comma_list, command_line, data_folder, publish, score_runs,
                                 seed_summary, start_run, train_settings, write_json)
from fairseq_alibi.cli.corpus import SPLITS, build_corpus
from fairseq_alibi.cli.quickstart import SIZES, SMOKE, SMOKE_L, prepare_text_data

#: setting -> its extra fairseq-train flags (the causal LM's)
SETTINGS = {
    "packed": [],
    "packed + mask": ["--alibi-document-mask", "doc"],
    "complete_doc": ["--sample-break-mode", "complete_doc"],
}
#: the masked LM's: its command packs with ``--sample-break-mode complete``
MLM_SETTINGS = {
    "complete": [],
    "complete + mask": ["--alibi-document-mask", "doc"],
    # every </s> the masking chose kept in the input (and out of the targets)
    "complete + mask + masked_lm_documents": ["--alibi-document-mask", "doc",
                                              "--criterion", "masked_lm_documents"],
    "complete_doc": ["--sample-break-mode", "complete_doc"],
}
#: evaluation -> the load-time override of the document mask
EVALUATIONS = {"per document": "doc", "packed": "none"}
#: the masked LM's: evaluation -> (the document mask, whether every </s> the masking chose is kept
#: in the input and left out of the targets, as ``--criterion masked_lm_documents`` does)
MLM_EVALUATIONS = {"per document": ("doc", False), "packed": ("none", False),
                   "per document, </s> kept": ("doc", True)}
BASE = "packed"
#: the masking seed of every masked-LM score: every model predicts the same masked tokens
MASK_SEED = 1
#: the masked LM's encoder: the encoder study's default variant
MLM_VARIANT = "offset"


@dataclass(frozen=True)
class Family:
    """What differs between the causal and the masked LM's runs."""

    settings: Dict[str, Sequence[str]]
    evaluations: Dict[str, object]  # name -> how each run is scored
    base: str  # the setting the others are set against
    max_update: int
    smoke_L: int
    out: str
    report: str  # its Markdown file


FAMILIES = {
    "lm": Family(SETTINGS, EVALUATIONS, BASE, 1000, SMOKE_L, "outputs/document_masks",
                 "document_masks.md"),
    # smoke: L = 64, a few whole lines a block (complete keeps lines whole)
    "mlm": Family(MLM_SETTINGS, MLM_EVALUATIONS, "complete", 300, 64,
                  "outputs/document_masks_mlm",
                  "document_masks_mlm.md"),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m experiments.document_masks",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), default="lm",
                        help="lm: the causal LM (packed: --sample-break-mode none); mlm: a masked "
                        "LM (alibi_roberta, packed: --sample-break-mode complete)")
    parser.add_argument("--out", default=None, help="(default outputs/document_masks, "
                        "mlm: outputs/document_masks_mlm)")
    parser.add_argument("--data", default=None,
                        help="a binarized corpus (train and test) with one empty line between "
                        "documents, instead of the embedded one")
    parser.add_argument("--seeds", type=comma_list(int), default=[1, 2, 3])
    parser.add_argument("--max-update", type=int, default=None,
                        help="(default 1000, mlm: 300)")
    parser.add_argument("--L", type=int, default=None, help="training length (default 256)")
    parser.add_argument("--jobs", type=int, default=1, help="fairseq runs at once")
    parser.add_argument("--threads", type=int, default=1, help="threads per fairseq run")
    parser.add_argument("--reuse", action="store_true",
                        help="keep a finished run of the same command in --out instead of "
                        "training it again (e.g. after adding a setting)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    family = FAMILIES[args.family]
    args.out = args.out or family.out
    if args.max_update is None:
        args.max_update = family.max_update
    if args.smoke:
        args.seeds, args.max_update = args.seeds[:1], min(args.max_update, 20)
    args.L = args.L or (family.smoke_L if args.smoke else 256)
    if args.L < 2 or args.max_update < 1:
        parser.error("--L must be at least 2 and --max-update at least 1")
    return args


def corpus_with_document_breaks(out: Path, vocab: int, env: dict, seed: int, smoke: bool,
                                data=None):
    """The embedded corpus with an empty line after every document, binarized (once), or
    ``data`` (a binarized folder) if given."""
    if data:
        return data_folder(out, data, vocab, env, seed)
    folder = out / "data" / "bin"
    if (folder / "test.bin").is_file():
        return folder
    raw = out / "data" / "raw"
    build_corpus(raw, test_fraction=0.01 if smoke else 0.05, document_breaks=True)
    return prepare_text_data({s: raw / f"{s}.txt" for s in SPLITS}, out / "data", vocab, env,
                             seed)


def mlm_settings(args) -> Settings:
    """The masked LM's size and budget: the quickstart's (``tiny``, ``--smoke``: its smoke
    size) layers, width, heads, vocabulary, tokens per update and learning rate, warm-up a
    tenth of the updates."""
    size = SMOKE if args.smoke else SIZES["tiny"]
    return Settings(layers=size["layers"], dim=size["dim"], heads=size["heads"],
                    ffn=size["ffn"], vocab=size["vocab"], max_tokens=size["max_tokens"],
                    lr=size["lr"], L=args.L, updates=args.max_update,
                    warmup=max(1, args.max_update // 10))


def train_all(args, data, out: Path, env: dict, log) -> Dict[tuple, dict]:
    size = dict(SMOKE if args.smoke else SIZES["tiny"])
    family = FAMILIES[args.family]
    command = None
    if args.family == "mlm":
        def command(save_dir, seed):
            return masked_lm_command(data, save_dir, mlm_settings(args), seed,
                                     CONFIGS[MLM_VARIANT].pretrain, break_mode="complete")
    return train_settings(family.settings, args.seeds, data, out, size, args.L, args.max_update,
                          env, args.jobs, log, command, reuse=args.reuse)


def evaluate_all(runs, data, L: int, out: Path, threads: int, jobs: int,
                 family: str = "lm") -> List[dict]:
    """One row per ``(setting, seed, evaluation)``: perplexity and token count on the test
    split in non-overlapping blocks of ``L`` (the masked LM: in ``complete`` blocks of ``L``,
    :func:`score_masked_lm`)."""
    evaluations = FAMILIES[family].evaluations
    if family == "mlm":
        return [dict(row, evaluation=evaluation)
                for evaluation, (mode, kept) in evaluations.items()
                for row in score_masked_lm(runs, data, L, mode, threads, kept)]
    return [dict(row, evaluation=evaluation) for evaluation, mode in evaluations.items()
            for row in score_runs(runs, data, L, out / "eval" / mode, "test",
                                  f"Document masks, {evaluation}", threads, jobs,
                                  {"alibi_document_mask": mode})]


def scoring_overrides(mode: str) -> dict:
    """The load-time overrides of a masked-LM score: ``complete`` blocks, document mask
    ``mode``."""
    return {"sample_break_mode": "complete", "alibi_document_mask": mode}


def score_masked_lm(runs: Dict[tuple, dict], data: Path, L: int, mode: str,
                    threads: int, kept: bool = False) -> List[dict]:
    """Masked-LM perplexity of every run on the test split in ``complete`` blocks of ``L`` with
    the document mask ``mode``, masked with :data:`MASK_SEED` (``kept``: every ``</s>`` the
    masking chose kept in the input and not predicted, as ``--criterion masked_lm_documents``
    trains):
    ``{"setting", "seed",
    "perplexity", "tokens", "masked_tokens", ...}`` per run; raises unless every run predicted
    the same masked tokens."""
    import torch

    torch.set_num_threads(threads)
    rows = []
    for (name, seed), run in runs.items():
        found = mlm_perplexity(str(run["checkpoint"]), str(data), L, MASK_SEED,
                               model_overrides=scoring_overrides(mode), keep_boundaries=kept)
        rows.append({"setting": name, "seed": seed, **found})
    scored = {(r["tokens"], r["masked_tokens"], r["blocks"]) for r in rows}
    if len(scored) != 1:
        raise RuntimeError(f"the runs scored different tokens {sorted(scored)}: each must "
                           "predict the same masked tokens")
    return rows


def boundaries(checkpoint, data: Path, L: int) -> dict:
    """The document boundaries of the test split's ``complete`` blocks of ``L`` as ``doc``
    finds them (``</s>`` right after ``</s>``): blocks, blocks holding one, boundaries in the
    text, and those of them still in the model's input after masking with :data:`MASK_SEED`;
    and the blocks longer than ``L`` (a line longer than a block is a block of its own, kept
    whole: ALiBi lifts the task's length limit)."""
    from fairseq_alibi.alibi import document_starts

    _, _, task, batches = held_out_blocks(str(checkpoint), str(data), L, MASK_SEED,
                                          model_overrides=scoring_overrides("none"))
    pad, eos = task.source_dictionary.pad(), task.source_dictionary.eos()
    found = dict(blocks=0, blocks_with_boundary=0, boundaries=0, boundaries_in_input=0,
                 longer_blocks=0)
    for sample in batches:
        masked = sample["net_input"]["src_tokens"]
        text = masked.where(sample["target"].eq(pad), sample["target"])
        starts = document_starts(text.eq(eos), "doc")
        found["blocks"] += int(masked.size(0))
        found["longer_blocks"] += int(masked.ne(pad).sum(dim=1).gt(L).sum())
        found["blocks_with_boundary"] += int(starts.any(dim=1).sum())
        found["boundaries"] += int(starts.sum())
        found["boundaries_in_input"] += int((starts & document_starts(masked.eq(eos), "doc")).sum())
    return found


def summarise(rows: List[dict], evaluation: str, setting: str, base: str = BASE) -> dict:
    def by_seed(name):
        return {r["seed"]: r["perplexity"] for r in rows
                if r["evaluation"] == evaluation and r["setting"] == name}

    return {"evaluation": evaluation, "setting": setting,
            **seed_summary(by_seed(setting), by_seed(base))}


def corpus(args) -> str:
    return f"`{args.data}`" if args.data else "the embedded corpus"


def lm_setup(args, rows: List[dict], size: dict) -> str:
    tokens = sorted({r["tokens"] for r in rows})
    return (
        f"The quickstart LM ({size['layers']} layers, dim {size['dim']}, {size['heads']} "
        f"heads, vocabulary {size['vocab']}) trained at L = {args.L} for {args.max_update} "
        f"updates of {size['max_tokens']} tokens, seeds {', '.join(map(str, args.seeds))}, on "
        f"{corpus(args)} with an empty line after every document. Perplexity on the test "
        f"split in non-overlapping blocks of L (fairseq-eval-lm; every run scored the same "
        f"{', '.join(f'{t:,}' for t in tokens)} tokens); *per document*: each token sees only "
        "its own document's earlier tokens (the override `{'alibi_document_mask': 'doc'}`); "
        "*packed*: the stock evaluation, context across documents.")


def mlm_setup(args, rows: List[dict], found: dict) -> str:
    s = mlm_settings(args)
    scored = rows[0]
    return (
        f"`alibi_roberta` (`--alibi-variant {MLM_VARIANT}`; {s.layers} layers, dim {s.dim}, "
        f"{s.heads} heads, vocabulary {s.vocab}) trained with `--task masked_lm` at L = {args.L} "
        f"for {args.max_update} updates of {s.max_tokens} tokens (lr {s.lr:g}, polynomial "
        f"decay, {s.warmup} warm-up updates), seeds {', '.join(map(str, args.seeds))}, on "
        f"{corpus(args)} with an empty line after every document: `complete` "
        "(`--sample-break-mode complete`: whole lines packed across documents), `complete + "
        "mask` (the same blocks with `--alibi-document-mask doc`), `complete + mask + "
        "masked_lm_documents` (the same with `--criterion masked_lm_documents`: every `</s>` "
        "the masking chose kept in the input, not predicted) and `complete_doc`. "
        "Masked-LM perplexity of every masked target of the test split in `complete` blocks of "
        f"L whatever the training (what fairseq-validate computes), masking seed {MASK_SEED} "
        "for every run: every run "
        f"predicted the same {scored['masked_tokens']:,} masked tokens of "
        f"{scored['tokens']:,} tokens in {found['blocks']:,} blocks (of which "
        f"{found['longer_blocks']} longer than L: a line longer than a block is a block of its "
        "own, kept whole); "
        f"{found['blocks_with_boundary']:,} blocks hold a document boundary, "
        f"{found['boundaries_in_input']:,} of their {found['boundaries']:,} boundaries still in "
        "the masked input (a masked `</s>` hides one). *per document*: each token sees only its "
        "own document's tokens (the override `{'alibi_document_mask': 'doc'}`); *packed*: the "
        "stock evaluation, context across documents; *per document, </s> kept*: per document "
        "with every `</s>` the masking chose kept and not predicted (the criterion "
        "`masked_lm_documents`'s input: every boundary seen).")


def report(rows: List[dict], args, runs, seconds: float, found: dict = None) -> (str, List[dict]):
    """The Markdown report and the summaries (``found``: the masked LM's
    :func:`boundaries`)."""
    family = FAMILIES[args.family]
    summaries = [summarise(rows, e, s, family.base) for e in family.evaluations
                 for s in family.settings]
    body = []
    for s in summaries:
        base = s["setting"] == family.base
        body.append([s["evaluation"], s["setting"], f"{s['median']:.2f}", f"{s['spread']:.2f}",
                     ", ".join(f"{v:.2f}" for v in s["seeds"].values()),
                     "—" if base else f"{s['difference']:+.2f} ({s['relative']:+.2%})",
                     "—" if base else ", ".join(f"{d:+.2f}" for d in s["paired"].values()),
                     "—" if base else ("yes" if s["within_noise"] else "no")
                     + f" (spread {s['noise']:.2f})"])
    size = SMOKE if args.smoke else SIZES["tiny"]
    title = ("# Document masks: training packed with and without them, and complete_doc"
             if args.family == "lm" else "# Document masks, masked LM: `complete` packing "
             "with and without them, and complete_doc")
    text = "\n".join([
        title, "",
        f"`{command_line('experiments.document_masks')}` — {today()}, {machine()}, "
        f"{seconds / 60:.0f} min.", "",
        lm_setup(args, rows, size) if args.family == "lm" else mlm_setup(args, rows, found), "",
        table(["evaluation", "trained", "median ppl", "spread", "per seed",
               f"median − {family.base}", "paired (seed by seed)", "within the seeds' spread"],
              body), "",
        "Training time per run (s): " + ", ".join(
            f"{name} seed {seed} {run['seconds']:.0f}" for (name, seed), run in runs.items()),
    ])
    return text, summaries


def main(argv=None):
    args = parse_args(argv)
    started = time.time()
    out, env, log = start_run(args.out, "documents", args.threads)
    size = SMOKE if args.smoke else SIZES["tiny"]
    data = corpus_with_document_breaks(out, size["vocab"], env, args.seeds[0], args.smoke,
                                       args.data)
    runs = train_all(args, data, out, env, log)
    log("scoring ...")
    rows = evaluate_all(runs, data, args.L, out, args.threads, args.jobs, args.family)
    found = None
    if args.family == "mlm":
        found = boundaries(next(iter(runs.values()))["checkpoint"], data, args.L)
    text, summaries = report(rows, args, runs, time.time() - started, found)
    write_json(out / "rows.json", {"rows": rows})
    return publish(out, FAMILIES[args.family].report, text,
                   {"args": vars(args), "rows": rows, "summaries": summaries,
                    "boundaries": found}, log, time.time() - started)

if __name__ == "__main__":
    sys.exit(main())
