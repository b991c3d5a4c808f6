"""Encoders measured: masked-LM length extrapolation, GLUE with collapse counts, long inputs,
and ``<s>``'s attention reach, for every ``alibi_roberta`` configuration at one size and budget.

    python -m experiments.encoder_study [--out DIR] [--configs all|a,b,...]
                                        [--steps prepare,pretrain,mlm,glue,long,reach,report]
                                        [--threads 1] [--smoke]

Every configuration is pretrained with the same size, data, tokens and budget (``fairseq-train
--task masked_lm --sample-break-mode none``: blocks of exactly L tokens cut from one token
stream, so learned positions and ALiBi see the same tokens; ``complete`` would drop every
paragraph longer than L for the learned-position model only). Then, per configuration:

* ``mlm``: masked-LM perplexity on text it did not train on (WikiText-2's test split) at L,
  2L, 4L and 8L tokens per block, the mean over several masking seeds (each block size masks
  different tokens), with the tokens and masked tokens scored;
* ``glue``: ``fairseq-alibi glue`` on CoLA, SST-2 (a fixed training subset) and STS-B, 5
  fine-tuning seeds, inputs cut to L for every model alike: median, spread and collapsed runs;
* ``long``: the ALiBi configurations fine-tuned and evaluated on whole inputs
  (``--max-length none``), against the learned-position baseline cut to its L positions, per
  dev-length bucket (≤ L, L–2L, 2L–4L, > 4L);
* ``reach``: ``<s>``'s attention reach per layer and head (the attention-weighted mean
  distance ``Σ_j p(0→j)·j`` of the first token's query) on SST-2 dev inputs, before and after
  fine-tuning (the pretrained model and SST-2 seed 1's);
* ``report``: ``encoder_study.md``, ``mlm.csv``, ``glue.csv``, ``long.csv``, ``reach.csv``,
  ``encoder_study.png`` and the CPU time of every piece.

The pretraining text is WikiText-2's validation split and the quickstart's corpus (Python's
documentation), a sentencepiece BPE model trained on it tokenizes everything (GLUE included);
the held-out text is WikiText-2's test split. Each piece writes its result file when it ends
and is skipped when that file exists, so the same command resumes a grid cut short.
Configurations whose options this checkout's ``alibi_roberta`` lacks are listed and skipped
(say which options), and run once the options exist. ``--smoke`` runs every step at toy size
(under 2 minutes).
"""

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from benchmarks.tables import machine, table, today
from experiments.lm_runs import DEFAULT_WIKITEXT, start_run, wikitext_files, write_json
from experiments.model_flags import accepted_flags, lacking_flags
from fairseq_alibi.cli.common import console_script, cpu_seconds
from fairseq_alibi.paths import user_dir

REPO = Path(__file__).resolve().parents[1]
DEFAULT_GLUE = REPO.parent / "shared" / "data" / "glue"
GLUE_TASKS = ("CoLA", "SST-2", "STS-B")
#: --smoke: the baseline and the default variant, a classification and a regression task
SMOKE_CONFIGS = ("learned", "offset")
#: the tasks the long-input comparison uses (CoLA's sentences are short)
LONG_TASKS = ("SST-2", "STS-B")
STEPS = ("prepare", "pretrain", "mlm", "glue", "long", "reach", "report")


@dataclass(frozen=True)
class Config:
    """One row of the study: how it is pretrained and fine-tuned."""

    label: str
    pretrain: Sequence[str] = ()  # flags of fairseq-train --task masked_lm (after the sizes)
    finetune: Sequence[str] = ()  # extra flags of its fine-tuning runs
    checkpoint_of: Optional[str] = None  # fine-tunes that configuration's pretrained model
    glue: bool = True
    long: bool = False
    note: str = ""
    length_scale: bool = False  # masked-LM scored with --alibi-length-scale L (no retraining)

    @property
    def sinusoidal(self):
        return SINUSOIDAL_FLAG in list(self.pretrain)

    @property
    def learned_positions(self):
        return "none" in list(self.pretrain) and not self.sinusoidal


#: the study's own flag of fairseq-train (:func:`fairseq_train_sinusoidal`): stock RoBERTa with
#: sinusoidal positions, which its architecture hard-codes as learned (no flag for it)
SINUSOIDAL_FLAG = "--sinusoidal-positions"
WHY_NO_SINUSOIDAL_GLUE = (
    "masked-LM only: stock RoBERTa's architecture sets `encoder_learned_pos = True` with no "
    "flag for it, so the study pretrains it through fairseq-train's own `cli_main` with one "
    f"added flag ({SINUSOIDAL_FLAG}); `fairseq-alibi glue` fine-tunes with the flags stock "
    "fairseq-train knows, which cannot rebuild it")

#: every configuration of the study; the order is the order of the tables
CONFIGS: Dict[str, Config] = {
    "learned": Config("learned positions (stock RoBERTa)", ["--alibi-variant", "none"]),
    "sinusoidal": Config("sinusoidal positions (stock RoBERTa, encoder_learned_pos false)",
                         ["--alibi-variant", "none", SINUSOIDAL_FLAG], glue=False,
                         note=WHY_NO_SINUSOIDAL_GLUE),
    "offset": Config("offset", ["--alibi-variant", "offset"], long=True),
    "zero_clap": Config("zero-CLAP (offset, CLAP head, zero <mask>)",
                        ["--alibi-variant", "offset", "--mlm-head", "clap",
                         "--zero-mask-embedding"], long=True),
    "symmetric": Config("symmetric", ["--alibi-variant", "symmetric"]),
    "one_sided": Config("one_sided", ["--alibi-variant", "one_sided"]),
    "asymmetric": Config("asymmetric (learned future slopes)",
                         ["--alibi-variant", "asymmetric", "--alibi-learnable-future-slopes"]),
    "learned_scales": Config("offset, learned per-head slope scales",
                             ["--alibi-variant", "offset", "--alibi-learned-scales", "per_head"],
                             glue=False, note="masked-LM only: a pretraining option, measured "
                             "for length (the GLUE grid is the baseline, the plain variants, "
                             "zero-CLAP and the bias and pooler options)"),
    "steep_slopes": Config("offset, slopes × 4 (fixed)",
                           ["--alibi-variant", "offset", "--alibi-scale-init", "4"], glue=False,
                           note="masked-LM only: whether steeper slopes (less context from far "
                           "away) keep the perplexity from rising beyond L"),
    # the bias and pooler options; a checkout without them skips these rows (and says so)
    "global_token": Config("offset, global first token", ["--alibi-variant", "offset",
                                                          "--alibi-global-tokens", "1"],
                           long=True),
    "partial_heads": Config("offset, ALiBi on half the heads",
                            ["--alibi-variant", "offset", "--alibi-heads", "2"], long=True),
    "mean_pooler": Config("offset, mean pooler", finetune=["--classification-pooler", "mean"],
                          checkpoint_of="offset", long=True),
    "zero_clap_mean": Config("zero-CLAP, mean pooler", finetune=["--classification-pooler",
                                                                 "mean"],
                             checkpoint_of="zero_clap", long=True),
    "offset_length_scale": Config(
        "offset, slopes × log N / log L beyond L (`--alibi-length-scale L`)",
        checkpoint_of="offset", length_scale=True, glue=False,
        note="masked-LM only: an evaluation option of the offset model (no retraining); at L "
        "and below it computes what offset computes, GLUE inputs cut to L included"),
    "zero_clap_length_scale": Config(
        "zero-CLAP, slopes × log N / log L beyond L (`--alibi-length-scale L`)",
        checkpoint_of="zero_clap", length_scale=True, glue=False,
        note="masked-LM only: an evaluation option of the zero-CLAP model (no retraining)"),
    "combination": Config("offset + global token + half the heads + mean pooler (planned)",
                          ["--alibi-variant", "offset", "--alibi-global-tokens", "1",
                           "--alibi-heads", "2"], finetune=["--classification-pooler", "mean"],
                          long=True),
}
#: configurations that cannot run at all here, and why
SKIPPED: Dict[str, str] = {}
BASELINE = "learned"


# ------------------------------------------------------------------------------ the settings


@dataclass
class Settings:
    """Size, data and budget, the same for every configuration."""

    layers: int = 4
    dim: int = 128
    heads: int = 4
    ffn: int = 512
    vocab: int = 8000
    L: int = 32
    batch: int = 32  # sequences per pretraining update
    updates: int = 3000
    lr: float = 1e-3
    warmup: int = 300
    heldout_lines: Optional[int] = None  # of WikiText-2's test split (None: all)
    mlm_seeds: Sequence[int] = (1, 2, 3)
    lengths: Sequence[int] = (1, 2, 4, 8)  # × L
    sst2_train: int = 8000  # SST-2 training subset (random, fixed)
    glue_rows: Optional[int] = None  # every task's train and dev cut to this (smoke only)
    glue_tasks: Sequence[str] = GLUE_TASKS
    glue_seeds: Sequence[int] = (1, 2, 3, 4, 5)
    glue_lr: float = 3e-4
    glue_epochs: int = 3
    reach_inputs: int = 256


SMOKE = Settings(layers=1, dim=32, heads=4, ffn=64, vocab=400, L=16, batch=8, updates=6,
                 lr=1e-3, warmup=2, heldout_lines=40, mlm_seeds=(1,), lengths=(1, 2),
                 sst2_train=48, glue_rows=48, glue_tasks=("SST-2", "STS-B"), glue_seeds=(1,),
                 glue_epochs=1, reach_inputs=16)


def model_flags(s: Settings) -> List[str]:
    return ["--arch", "alibi_roberta_base", "--encoder-layers", str(s.layers),
            "--encoder-embed-dim", str(s.dim), "--encoder-ffn-embed-dim", str(s.ffn),
            "--encoder-attention-heads", str(s.heads)]


def known_options() -> set:
    """The options this checkout's ``alibi_roberta`` and the sentence_prediction task and
    criterion accept."""
    from fairseq.criterions.sentence_prediction import SentencePredictionConfig
    from fairseq.tasks.sentence_prediction import SentencePredictionConfig as TaskConfig

    from fairseq_alibi.models.alibi_roberta import AlibiRobertaModel

    known = accepted_flags(AlibiRobertaModel)
    known.add(SINUSOIDAL_FLAG)  # the study's own (fairseq_train_sinusoidal)
    for config in (TaskConfig, SentencePredictionConfig):
        known |= {"--" + name.replace("_", "-") for name in config.__dataclass_fields__}
    return known


def missing_options(name: str, known: set) -> List[str]:
    """The options configuration ``name`` needs that this checkout lacks."""
    config = CONFIGS[name]
    wanted = [a for a in list(config.pretrain) + list(config.finetune) if a.startswith("--")]
    if config.length_scale:
        wanted.append("--alibi-length-scale")
    if config.checkpoint_of:
        wanted += missing_options(config.checkpoint_of, set())
    return lacking_flags(wanted, known)


def pretrained_name(name: str) -> str:
    return CONFIGS[name].checkpoint_of or name


# --------------------------------------------------------------------------------- the data


def prepare(out: Path, args, s: Settings, env, log) -> dict:
    """The pretraining corpus (binarized, with its sentencepiece model) and the GLUE tasks
    tokenized with it; built once (``data/ready.json``)."""
    ready = out / "data" / "ready.json"
    if ready.is_file():
        return json.loads(ready.read_text())
    from fairseq_alibi.cli.corpus import build_corpus
    from fairseq_alibi.cli.quickstart import prepare_text_data
    from fairseq_alibi.preprocess import glue as preprocess_glue
    from fairseq_alibi.preprocess.encoders import SentencePieceEncoder

    raw = out / "data" / "raw"
    wiki = wikitext_files(args.wikitext)
    log("building the pretraining text: WikiText-2 valid + Python's documentation ...")
    docs = build_corpus(raw / "pydocs")
    heldout_lines = wiki["test"].read_text(encoding="utf-8").splitlines(keepends=True)
    pretrain_lines = wiki["train"].read_text(encoding="utf-8").splitlines(keepends=True)
    for split in ("train", "valid", "test"):
        pretrain_lines += (raw / "pydocs" / f"{split}.txt").read_text(
            encoding="utf-8").splitlines(keepends=True)
    if s.heldout_lines:  # smoke: a corner of each
        heldout_lines = heldout_lines[: s.heldout_lines]
        pretrain_lines = pretrain_lines[: 20 * s.heldout_lines]
    (raw / "pretrain.txt").write_text("".join(pretrain_lines), encoding="utf-8")
    (raw / "heldout.txt").write_text("".join(heldout_lines), encoding="utf-8")
    log(f"sentencepiece ({s.vocab} pieces) and fairseq-preprocess ...")
    text = out / "data" / "text"
    binarized = prepare_text_data({"train": raw / "pretrain.txt", "test": raw / "heldout.txt"},
                                  text, s.vocab, env, args.seed)

    log("GLUE CoLA, SST-2 (training subset), STS-B with the same sentencepiece model ...")
    tsv = out / "data" / "glue-tsv"
    rng = random.Random(args.seed)
    subsets = {}
    for task in s.glue_tasks:
        source, target = Path(args.glue) / task, tsv / task
        target.mkdir(parents=True, exist_ok=True)
        for split in ("train", "dev"):
            lines = (source / f"{split}.tsv").read_text(encoding="utf-8").splitlines(True)
            header, rows = (lines[:1], lines[1:]) if task != "CoLA" else ([], lines)
            if task == "SST-2" and split == "train" and s.sst2_train < len(rows):
                keep = sorted(rng.sample(range(len(rows)), s.sst2_train))
                rows = [rows[i] for i in keep]
            if s.glue_rows:
                rows = rows[: s.glue_rows]
            subsets[f"{task} {split}"] = len(rows)
            (target / f"{split}.tsv").write_text("".join(header + rows), encoding="utf-8")
    encoder = SentencePieceEncoder(str(text / "spm.model"), str(text / "dict.txt"))
    preprocess_glue.prepare(tsv, out / "data" / "glue-bin", list(s.glue_tasks), encoder,
                            overwrite=True)
    data = {"text": str(binarized), "glue": str(out / "data" / "glue-bin"),
            "rows": subsets, "pretrain_lines": len(pretrain_lines),
            "heldout_lines": len(heldout_lines), "pydocs": docs["splits"]}
    write_json(ready, data)
    return data


# ------------------------------------------------------------------------------ pretraining


def fairseq_train_sinusoidal():
    """``fairseq-train`` (fairseq's own ``cli_main``) with one more flag,
    ``--sinusoidal-positions``, which sets ``encoder_learned_pos = False`` before stock RoBERTa's architecture reads it (as
    the hydra override ``+model.encoder_learned_pos=false`` would): RoBERTa with sinusoidal
    positions. Run as ``python -c "from experiments.encoder_study import
    fairseq_train_sinusoidal as f; f()" ARGS``."""
    from fairseq_cli.train import cli_main

    cli_main(modify_parser=add_sinusoidal_flag)


def add_sinusoidal_flag(parser):
    """fairseq's ``modify_parser`` hook: ``--sinusoidal-positions`` sets
    ``encoder_learned_pos = False``."""
    if SINUSOIDAL_FLAG not in parser._option_string_actions:  # fairseq calls the hook twice
        parser.add_argument(SINUSOIDAL_FLAG, dest="encoder_learned_pos", action="store_false",
                            default=True, help="sinusoidal instead of learned positions")


def run_streamed(cmd: List[str], log_file: Path, env: dict, what: str) -> str:
    """Run ``cmd`` with its output written to ``log_file`` as it comes (a long run can be
    watched); its output, or an error with the log's tail."""
    with open(log_file, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                              cwd=REPO).returncode
    output = log_file.read_text()
    if code != 0:
        raise RuntimeError(f"{what} failed (exit {code}); full output in {log_file}:\n"
                           + output[-3000:])
    return output


def pretrain(name: str, data: dict, out: Path, s: Settings, args, env, log) -> dict:
    """``fairseq-train --task masked_lm`` of one configuration (resumed if cut short)."""
    folder = out / "pretrain" / name
    done = folder / "result.json"
    if done.is_file():
        return json.loads(done.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    train = [console_script("fairseq-train")]
    if CONFIGS[name].sinusoidal:
        train = [sys.executable, "-c", "from experiments.encoder_study import "
                 "fairseq_train_sinusoidal as f; f()"]
    cmd = [*train, data["text"], "--user-dir", user_dir(),
           "--task", "masked_lm", "--criterion", "masked_lm", *model_flags(s),
           *CONFIGS[name].pretrain,
           "--tokens-per-sample", str(s.L), "--sample-break-mode", "none",
           "--batch-size", str(s.batch), "--required-batch-size-multiple", "1",
           "--max-update", str(s.updates), "--total-num-update", str(s.updates),
           "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-06",
           "--weight-decay", "0.01", "--clip-norm", "1.0", "--lr", str(s.lr),
           "--lr-scheduler", "polynomial_decay", "--warmup-updates", str(s.warmup),
           "--dropout", "0.1", "--attention-dropout", "0.1", "--seed", str(args.seed),
           "--save-dir", str(folder / "checkpoints"), "--no-epoch-checkpoints",
           "--save-interval-updates", str(max(1, s.updates // 8)), "--keep-interval-updates", "1",
           "--disable-validation", "--num-workers", "0", "--log-format", "simple",
           "--log-interval", str(max(1, s.updates // 20)), "--no-progress-bar", "--cpu"]
    log(f"pretraining {name} ({s.updates} updates of {s.batch} × {s.L} tokens) ...")
    started, cpu = time.time(), cpu_seconds()
    output = run_streamed(cmd, folder / f"train-{int(started)}.log", env, f"pretraining {name}")
    losses = [float(x.split()[1]) for x in output.split("| ") if x.startswith("loss ")]
    result = {"checkpoint": str(folder / "checkpoints" / "checkpoint_last.pt"),
              "seconds": round(time.time() - started, 1),
              "cpu_seconds": round(cpu_seconds() - cpu, 1), "final_train_loss": losses[-1]
              if losses else None, "command": " ".join(cmd)}
    write_json(done, result)
    log(f"pretrained {name} in {result['seconds']:.0f} s, train loss {result['final_train_loss']}")
    return result


# --------------------------------------------------------------------- masked-LM perplexity


def held_out_blocks(checkpoint: str, data: str, length: int, seed: int,
                    sinusoidal: bool = False, model_overrides: Optional[dict] = None):
    """``(model, cfg, task, batches)``: the pretrained model in eval mode and the held-out split
    (``test``) in blocks of ``length`` tokens, masked with ``seed``, every block in order — what
    ``fairseq-validate --valid-subset test --tokens-per-sample length --seed seed`` iterates."""
    from fairseq import checkpoint_utils, utils

    import fairseq_alibi  # noqa: F401

    overrides = {"data": data, "tokens_per_sample": length, "seed": seed,
                 "sample_break_mode": "none"}
    if sinusoidal:  # its positions are a formula: any count (learned ones stop at theirs)
        overrides["max_positions"] = length
    overrides.update(model_overrides or {})
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [checkpoint], arg_overrides=overrides)
    model = models[0].eval()
    task.load_dataset("test", combine=False, epoch=1)
    batches = task.get_batch_iterator(
        dataset=task.dataset("test"), max_tokens=max(4096, length),
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=False, required_batch_size_multiple=1, seed=seed,
    ).next_epoch_itr(shuffle=False)
    return model, cfg, task, batches


def mlm_perplexity(checkpoint: str, data: str, length: int, seed: int,
                   sinusoidal: bool = False, model_overrides: Optional[dict] = None) -> dict:
    """Masked-LM perplexity of :func:`held_out_blocks`, in this process, two ways:

    * ``perplexity``: every masked target, what ``fairseq-validate --valid-subset test
      --tokens-per-sample length --seed seed`` computes;
    * ``text_perplexity``: the masked text tokens only. ``masked_lm`` masks the block's first
      token ``<s>`` at the same rate as the text and a model predicts it almost surely; it is 1
      of ``length`` tokens, so it lowers ``perplexity`` more at short blocks than at long ones
      and makes longer blocks look worse than they are.
    """
    import torch
    import torch.nn.functional as F

    model, _, task, batches = held_out_blocks(checkpoint, data, length, seed, sinusoidal,
                                              model_overrides)
    pad, bos = task.source_dictionary.pad(), task.source_dictionary.bos()
    loss = masked = text_loss = text_masked = tokens = blocks = 0.0
    with torch.no_grad():
        for sample in batches:
            tokens += float(sample["ntokens"])
            blocks += float(sample["nsentences"])
            targets = sample["target"]
            chosen = targets.ne(pad)
            if not chosen.any():
                continue
            # the masked_lm criterion's loss: the output layer on the masked positions only
            logits = model(**sample["net_input"], masked_tokens=chosen)[0]
            gold = targets[chosen]
            per_token = F.cross_entropy(logits.float(), gold, reduction="none").double()
            text = gold.ne(bos)
            loss += float(per_token.sum())
            masked += float(gold.numel())
            text_loss += float(per_token[text].sum())
            text_masked += float(text.sum())
    if not text_masked:
        raise ValueError(f"no masked text token in the held-out split of {data} at "
                         f"{length} tokens a block: give more held-out text (--heldout-lines)")
    return {"perplexity": math.exp(loss / masked), "loss_nats": loss / masked,
            "masked_tokens": int(masked), "text_perplexity": math.exp(text_loss / text_masked),
            "text_masked_tokens": int(text_masked), "tokens": int(tokens), "blocks": int(blocks)}


def mlm(name: str, checkpoint: str, data: dict, out: Path, s: Settings, args, log) -> dict:
    """Perplexity at every length and masking seed (one file each, so a cut run resumes)."""
    folder = out / "mlm" / name
    folder.mkdir(parents=True, exist_ok=True)
    found = {}
    for factor in s.lengths:
        n = factor * s.L
        if CONFIGS[name].learned_positions and n > s.L:
            continue  # learned positions stop at L: there is no model to score beyond
        for seed in s.mlm_seeds:
            path = folder / f"N{n}_seed{seed}.json"
            result = load_json(path)
            if not result or "text_perplexity" not in result:  # none, or scored before <s> was
                started = time.process_time()
                result = mlm_perplexity(
                    checkpoint, data["text"], n, seed, sinusoidal=CONFIGS[name].sinusoidal,
                    model_overrides={"alibi_length_scale": s.L} if CONFIGS[name].length_scale
                    else None)
                result["cpu_seconds"] = round(time.process_time() - started, 1)
                write_json(path, result)
            found[(n, seed)] = result
        ppl = statistics.mean(found[(n, s_)]["text_perplexity"] for s_ in s.mlm_seeds)
        log(f"{name}: masked-LM perplexity of the text at N={n}: {ppl:.2f} "
            f"({found[(n, s.mlm_seeds[0])]['text_masked_tokens']} masked tokens per seed)")
    return found


# ----------------------------------------------------------------------------------- GLUE


def glue_run(name: str, checkpoint: str, data: dict, out: Path, s: Settings, args, env, log,
             long: bool = False) -> dict:
    """``fairseq-alibi glue`` for one configuration (resumable by itself)."""
    folder = out / ("long" if long else "glue") / name
    tasks = [t for t in (LONG_TASKS if long else GLUE_TASKS) if t in s.glue_tasks]
    cmd = [sys.executable, "-m", "fairseq_alibi", "glue", "--checkpoint", checkpoint,
           "--data", data["glue"], "--out", str(folder), "--tasks", ",".join(tasks),
           "--seeds", ",".join(map(str, s.glue_seeds)), "--lr", str(s.glue_lr),
           "--epochs", str(s.glue_epochs), "--threads", str(args.threads), "--cpu"]
    if long:
        cmd += ["--max-length", "none"]
    if CONFIGS[name].finetune:
        cmd += ["--", *CONFIGS[name].finetune]
    folder.mkdir(parents=True, exist_ok=True)
    log(f"GLUE{' (whole inputs)' if long else ''} for {name}: {', '.join(tasks)} × "
        f"{len(s.glue_seeds)} seeds ...")
    started, cpu = time.time(), cpu_seconds()
    run_streamed(cmd, folder / f"glue-{int(started)}.log", env, f"fairseq-alibi glue for {name}")
    record = json.loads((folder / "glue.json").read_text())
    record["study_cpu_seconds"] = round(cpu_seconds() - cpu, 1)
    record["finished_seconds"] = round(time.time() - started, 1)
    # each invocation's cost, summed over invocations (a resumed grid pays only what is left)
    costs = folder / "cost.json"
    spent = json.loads(costs.read_text()) if costs.is_file() else []
    spent.append({"cpu_seconds": record["study_cpu_seconds"],
                  "wall_seconds": record["finished_seconds"]})
    write_json(costs, spent)
    return record


# ------------------------------------------------------------------- attention reach of <s>


def attention_reach(checkpoint: str, data_folder: str, inputs: int, threads: int) -> dict:
    """Per layer and head, the attention-weighted mean distance ``Σ_j p(0→j)·j`` of the first
    token's (``<s>``'s) query, averaged over the first ``inputs`` dev inputs of
    ``data_folder`` (a sentence_prediction folder, its inputs as fine-tuning saw them)."""
    import torch
    from fairseq import checkpoint_utils
    from fairseq.data import data_utils

    import fairseq_alibi  # noqa: F401

    torch.set_num_threads(threads)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint])
    model = models[0].eval()
    dictionary = task.source_dictionary
    dev = data_utils.load_indexed_dataset(str(Path(data_folder) / "input0" / "valid"), None)
    n = min(inputs, len(dev))
    rows = [torch.cat([torch.tensor([dictionary.bos()]), dev[i].long()]) for i in range(n)]
    captured = []
    layers = model.encoder.sentence_encoder.layers
    originals = []
    for layer in layers:
        attention = layer.self_attn
        originals.append((attention.forward, getattr(attention, "skip_embed_dim_check", None)))
        if originals[-1][1] is not None:  # stock attention: off PyTorch's fused path, which
            attention.skip_embed_dim_check = True  # returns head-averaged weights only

        def forward(*a, _forward=attention.forward, **kw):
            kw.update(need_weights=True, need_head_weights=True)
            result, weights = _forward(*a, **kw)
            captured.append(weights.float())  # (heads, batch, queries, keys)
            return result, weights

        attention.forward = forward
    total = None
    try:
        with torch.no_grad():
            for start in range(0, n, 32):
                batch = rows[start:start + 32]
                tokens = data_utils.collate_tokens(batch, dictionary.pad())
                captured.clear()
                model(tokens, features_only=True)
                distance = torch.arange(tokens.size(1), dtype=torch.float32)
                # the <s> query's expected key distance, per layer, head and input, summed
                reach = torch.stack([(w[:, :, 0, :] * distance).sum(-1).sum(-1) for w in captured])
                total = reach if total is None else total + reach
    finally:
        for layer, (original, skip) in zip(layers, originals):
            layer.self_attn.forward = original
            if skip is not None:
                layer.self_attn.skip_embed_dim_check = skip
    lengths = [len(r) for r in rows]
    return {"reach": (total / n).tolist(), "inputs": n,
            "mean_input_length": statistics.mean(lengths)}


def reach(name: str, pretrained: str, out: Path, data: dict, s: Settings, args, log) -> dict:
    path = out / "reach" / f"{name}.json"
    if path.is_file():
        return json.loads(path.read_text())
    glue_folder = out / "glue" / name
    record = json.loads((glue_folder / "glue.json").read_text())
    run = next((r for r in record["runs"] if r["task"] == "SST-2" and r["seed"] == 1), None)
    if run is None or not Path(run["checkpoint"]).is_file():
        raise RuntimeError(f"no SST-2 seed 1 checkpoint of {name} to measure")
    folder = record["data"]["SST-2"]["folder"]  # the inputs fine-tuning saw (cut to L)
    started = time.process_time()
    found = {"before": attention_reach(pretrained, folder, s.reach_inputs, args.threads),
             "after": attention_reach(run["checkpoint"], folder, s.reach_inputs, args.threads)}
    found["cpu_seconds"] = round(time.process_time() - started, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, found)
    before = statistics.mean(v for row in found["before"]["reach"] for v in row)
    after = statistics.mean(v for row in found["after"]["reach"] for v in row)
    log(f"{name}: <s> attention reach (mean over layers and heads) {before:.2f} -> {after:.2f}")
    return found


# ---------------------------------------------------------------------------- long inputs


def bucket_of(length: int, L: int) -> str:
    for factor, name in ((1, f"≤ L ({L})"), (2, f"L–2L ({L + 1}–{2 * L})"),
                         (4, f"2L–4L ({2 * L + 1}–{4 * L})")):
        if length <= factor * L:
            return name
    return f"> 4L (> {4 * L})"


def bucket_scores(record: dict, task: str, lengths, L: int) -> Dict[str, dict]:
    """Per dev-length bucket: the task's main metric of every seed, from the saved dev
    predictions (accuracy; Pearson for STS-B)."""
    import numpy as np

    from fairseq_alibi.cli.glue import RECIPES, pearson

    buckets = [bucket_of(int(n), L) for n in lengths]
    found = {}
    for run in sorted((r for r in record["runs"] if r["task"] == task), key=lambda r: r["seed"]):
        folder = Path(run["checkpoint"]).parent.parent
        pred = np.load(folder / "dev_predictions.npy")
        gold = np.load(folder / "dev_labels.npy")
        for bucket in dict.fromkeys(buckets):
            chosen = np.array([b == bucket for b in buckets])
            if RECIPES[task].regression:
                value = 100 * pearson(pred[chosen].astype(float), gold[chosen].astype(float))
                value = 0.0 if math.isnan(value) else value
            else:
                value = 100 * float((pred[chosen] == gold[chosen]).mean())
            entry = found.setdefault(bucket, {"n": int(chosen.sum()), "values": []})
            entry["values"].append(value)
    return found


# ---------------------------------------------------------------------------------- report


def fmt(x, digits=1):
    return "–" if x is None else f"{x:.{digits}f}"


def load_json(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def collect(out: Path, names: List[str], s: Settings) -> dict:
    """Every finished piece's results, read back from their files."""
    found = {"pretrain": {}, "mlm": {}, "glue": {}, "long": {}, "reach": {}}
    for name in names:
        pretrained = load_json(out / "pretrain" / name / "result.json")
        if pretrained:
            found["pretrain"][name] = pretrained
        for factor in s.lengths:
            n = factor * s.L
            runs = [load_json(out / "mlm" / name / f"N{n}_seed{seed}.json")
                    for seed in s.mlm_seeds]
            if all(runs):
                found["mlm"][(name, n)] = runs
        for kind in ("glue", "long"):
            record = load_json(out / kind / name / "glue.json")
            if record:
                found[kind][name] = record
        record = load_json(out / "reach" / f"{name}.json")
        if record:
            found["reach"][name] = record
    return found


def cpu_time(out: Path) -> Dict[str, float]:
    """CPU seconds per kind of piece, from the pieces' own records."""
    spent = {"pretrain": 0.0, "mlm": 0.0, "glue": 0.0, "long": 0.0, "reach": 0.0}
    for path in (out / "pretrain").glob("*/result.json"):
        spent["pretrain"] += json.loads(path.read_text()).get("cpu_seconds") or 0
    for path in (out / "mlm").glob("*/*.json"):
        spent["mlm"] += json.loads(path.read_text()).get("cpu_seconds") or 0
    for kind in ("glue", "long"):
        for path in (out / kind).glob("*/cost.json"):
            spent[kind] += sum(c["cpu_seconds"] for c in json.loads(path.read_text()))
    for path in (out / "reach").glob("*.json"):
        spent["reach"] += json.loads(path.read_text()).get("cpu_seconds") or 0
    return spent


def plot(out: Path, found: dict, names: List[str], s: Settings):
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    markers = "osD^v<>ph*X"
    lengths = [f * s.L for f in s.lengths]
    ax = axes[0]
    for k, name in enumerate(names):
        xs = [n for n in lengths if (name, n) in found["mlm"]]
        if xs:
            ys = [statistics.mean(r["text_perplexity"] for r in found["mlm"][(name, n)])
                  for n in xs]
            ax.plot(xs, ys, marker=markers[k % len(markers)], label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_xlabel("tokens per block (L = %d)" % s.L)
    ax.set_ylabel("masked-LM perplexity, held-out text (<s> not scored)")
    ax.set_title("Length extrapolation (lower is better)", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)

    ax = axes[1]
    glue_names = [n for n in names if n in found["glue"]]
    width = 0.8 / max(1, len(glue_names))
    for k, name in enumerate(glue_names):
        summary = found["glue"][name]["summary"]
        labelled = False
        for t, task in enumerate(GLUE_TASKS):
            if task not in summary:
                continue
            metric = next(iter(summary[task]["metrics"].values()))
            values = metric["values"]
            x = t + (k - (len(glue_names) - 1) / 2) * width
            ax.bar(x, metric["median"], width, color=f"C{k}",
                   label=None if labelled else name)
            labelled = True
            ax.plot([x] * len(values), values, "k.", ms=3)
    ax.set_xticks(range(len(GLUE_TASKS)),
                  ["CoLA (MCC)", "SST-2 (accuracy)", "STS-B (Pearson)"])
    ax.set_ylabel("dev score × 100: median (bars) and seeds (dots)")
    ax.set_title("GLUE dev, inputs cut to L", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=6)

    ax = axes[2]
    for k, name in enumerate(n for n in names if n in found["reach"]):
        for when, style in (("before", "--"), ("after", "-")):
            rows = found["reach"][name][when]["reach"]
            per_layer = [statistics.mean(row) for row in rows]
            ax.plot(range(len(per_layer)), per_layer, style, color=f"C{k}",
                    marker=markers[k % len(markers)], label=f"{name} ({when})")
    ax.set_xlabel("layer")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("<s>'s attention reach Σ p·j (tokens), mean over heads")
    ax.set_title("<s>'s reach, before (dashed) / after (solid) SST-2 fine-tuning", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=5, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "encoder_study.png", dpi=110)
    plt.close(fig)


def write_csv(path: Path, header: List[str], rows: List[list]):
    import csv

    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def report(out: Path, names: List[str], skipped: Dict[str, str], s: Settings, args,
           command: str, log) -> str:
    from fairseq_alibi.cli.glue import METRIC_NAMES, input_lengths

    found = collect(out, names, s)
    data = load_json(out / "data" / "ready.json") or {}
    lengths = [f * s.L for f in s.lengths]
    lines = [f"## Encoder study (L = {s.L})", "",
             f"Command: `{command}`  ", f"Machine: {machine()}  ", f"Date: {today()}", "",
             f"Model: alibi_roberta, {s.layers} layers × {s.dim} dims, {s.heads} heads, FFN "
             f"{s.ffn}, sentencepiece vocabulary {s.vocab}; pretraining: {s.updates} updates "
             f"of {s.batch} blocks × {s.L} tokens (`--sample-break-mode none`: the same tokens "
             f"for every configuration), Adam lr {s.lr}, {s.warmup} warm-up updates, "
             "polynomial decay, dropout 0.1, seed 1.", ""]
    if data:
        lines += [f"Data: pretraining text {data['pretrain_lines']:,} lines (WikiText-2 valid "
                  f"+ Python's documentation), held-out text {data['heldout_lines']:,} lines of "
                  "WikiText-2 test; GLUE rows: "
                  + ", ".join(f"{k} {v:,}" for k, v in data["rows"].items()) + ".", ""]

    # masked-LM perplexity: of the text (the goal's measure) and as fairseq-validate counts
    tables, csv_rows = {"text_perplexity": [], "perplexity": []}, []
    for name in names:
        if not any((name, n) in found["mlm"] for n in lengths):
            continue
        for key, rows in tables.items():
            cells, base = [], None
            for n in lengths:
                runs = found["mlm"].get((name, n))
                if not runs:
                    cells.append("n/a (L positions)" if CONFIGS[name].learned_positions
                                 else "–")
                    continue
                mean = statistics.mean(r[key] for r in runs)
                base = mean if n == s.L else base
                change = ("" if n == s.L or base is None
                          else f" ({100 * (mean / base - 1):+.1f} %)")
                cells.append(f"{mean:.2f}{change}")
            rows.append([name] + cells)
        for n in lengths:
            for seed, r in zip(s.mlm_seeds, found["mlm"].get((name, n)) or []):
                csv_rows.append([name, n, seed, f"{r['text_perplexity']:.4f}",
                                 r["text_masked_tokens"], f"{r['perplexity']:.4f}",
                                 r["masked_tokens"], r["tokens"], r["blocks"]])
    if tables["perplexity"]:
        counts = []
        for n in lengths:
            scored = next((found["mlm"][(k, n)][0] for k in names if (k, n) in found["mlm"]),
                          None)
            if scored:
                counts.append(f"N={n}: {scored['tokens']:,} tokens, "
                              f"{scored['text_masked_tokens']:,} masked text tokens "
                              f"(+{scored['masked_tokens'] - scored['text_masked_tokens']:,} "
                              "masked `<s>`)")
        header = ["configuration"] + [f"N={n}" + (" (L)" if n == s.L else "") for n in lengths]
        lines += ["### Masked-LM perplexity on held-out text", "",
                  f"Mean over masking seeds {', '.join(map(str, s.mlm_seeds))} (in brackets: "
                  "change from L) of the masked text tokens. Scored per seed: "
                  + "; ".join(counts) + ".", "",
                  table(header, tables["text_perplexity"]), "",
                  "As `fairseq-validate` counts it, every masked target: `masked_lm` also masks "
                  "the block's first token `<s>` (1 token in N), which every model predicts "
                  "almost surely, so this figure falls with 1/N and makes longer blocks look "
                  "worse than the text is modelled:", "",
                  table(header, tables["perplexity"]), ""]
    write_csv(out / "mlm.csv", ["config", "N", "seed", "text_perplexity", "text_masked_tokens",
                                "perplexity", "masked_tokens", "tokens", "blocks"], csv_rows)

    # GLUE
    rows, csv_rows = [], []
    for name in names:
        record = found["glue"].get(name)
        if not record:
            continue
        cells = []
        for task in GLUE_TASKS:
            entry = record["summary"].get(task)
            if not entry:
                cells.append("–")
                continue
            metric, values = next(iter(entry["metrics"].items()))
            cells.append(f"{values['median']:.1f} [{values['min']:.1f}–{values['max']:.1f}] "
                         f"{entry['collapsed']}/{entry['runs']}")
            for seed, v in zip(entry["seeds"], values["values"]):
                run = next(r for r in record["runs"] if r["task"] == task and r["seed"] == seed)
                csv_rows.append([name, task, seed, METRIC_NAMES[metric], f"{v:.3f}",
                                 run["collapsed"], run["collapse"] or ""])
        rows.append([name] + cells)
    if rows:
        majority = next(iter(found["glue"].values()))["summary"]
        lines += ["### GLUE dev (inputs cut to L for every model)", "",
                  "Median [min–max] over fine-tuning seeds and collapsed runs / runs; CoLA: "
                  "MCC, SST-2: accuracy, STS-B: Pearson, all × 100. Majority-class rate: "
                  + ", ".join(f"{t} {majority[t]['majority_rate']:.1f} %" for t in GLUE_TASKS
                              if t in majority and "majority_rate" in majority[t]) + ". "
                  f"Protocol: `fairseq-alibi glue`, Adam (0.9, 0.98, eps 1e-6, bias-corrected), "
                  f"lr {s.glue_lr}, {s.glue_epochs} epochs, 6 % linear warm-up then linear "
                  "decay, batch 32 (SST-2) / 16, weight decay 0.1, dropout 0.1, the best epoch "
                  "by the dev metric (MCC for CoLA, accuracy for SST-2, MSE for STS-B).", "",
                  table(["configuration", "CoLA MCC", "SST-2 accuracy", "STS-B Pearson"], rows),
                  ""]
    write_csv(out / "glue.csv", ["config", "task", "seed", "metric", "value", "collapsed",
                                 "collapse"], csv_rows)

    # long inputs
    rows, csv_rows = [], []
    glue_bin = Path(data.get("glue", out / "data" / "glue-bin"))
    buckets = list(dict.fromkeys(bucket_of(n, s.L) for n in (s.L, 2 * s.L, 4 * s.L, 5 * s.L)))
    counts = {}
    for task in LONG_TASKS:
        if not (glue_bin / f"{task}-bin").is_dir():
            continue
        dev_lengths = input_lengths(glue_bin / f"{task}-bin", "valid")
        counts[task] = {b: sum(bucket_of(int(n), s.L) == b for n in dev_lengths)
                        for b in buckets}
        entries = []
        for name in names:
            if name in found["glue"] and (name == BASELINE or CONFIGS[name].long):
                entries.append((name, "cut to L", found["glue"][name]))
            if name in found["long"]:
                entries.append((name, "whole", found["long"][name]))
        for name, how, record in entries:
            if not any(r["task"] == task for r in record["runs"]):
                continue
            scored = bucket_scores(record, task, dev_lengths, s.L)
            cells = []
            for bucket in buckets:
                entry = scored.get(bucket)
                cells.append(f"{statistics.median(entry['values']):.1f}" if entry else "–")
                for v in entry["values"] if entry else []:
                    csv_rows.append([task, name, how, bucket, entry["n"], f"{v:.3f}"])
            rows.append([task, name, how] + cells)
    if rows:
        lines += ["### Inputs longer than pretraining", "",
                  "Dev sets split by input length (tokens as the model sees them, `<s>` and "
                  "separators included; "
                  + "; ".join(f"{t}: " + ", ".join(f"{c[b]} in {b}" for b in buckets)
                              for t, c in counts.items())
                  + "); median over seeds of accuracy (SST-2) / Pearson (STS-B) × 100 in each "
                  f"bucket. 'cut to L': inputs cut to {s.L} tokens (the longer segment first) "
                  "in training and evaluation; 'whole': fine-tuned and evaluated on the "
                  "untruncated inputs (ALiBi only).", "",
                  table(["task", "configuration", "inputs"] + buckets, rows), ""]
    write_csv(out / "long.csv", ["task", "config", "inputs", "bucket", "n", "value"], csv_rows)

    # reach
    rows, csv_rows = [], []
    for name in names:
        record = found["reach"].get(name)
        if not record:
            continue
        cells = []
        for when in ("before", "after"):
            per_layer = [statistics.mean(row) for row in record[when]["reach"]]
            spread = [f"{min(row):.1f}–{max(row):.1f}" for row in record[when]["reach"]]
            cells.append(" / ".join(f"{m:.1f} ({r})" for m, r in zip(per_layer, spread)))
            for layer, row in enumerate(record[when]["reach"]):
                for head, v in enumerate(row):
                    csv_rows.append([name, when, layer, head, f"{v:.3f}"])
        rows.append([name] + cells)
    if rows:
        n_inputs = next(iter(found["reach"].values()))["before"]
        lines += ["### `<s>`'s attention reach", "",
                  f"Attention-weighted mean distance Σ_j p(0→j)·j of the first token's query, "
                  f"on {n_inputs['inputs']} SST-2 dev inputs (mean "
                  f"{n_inputs['mean_input_length']:.1f}"
                  " tokens, cut to L), per layer: mean over heads (min–max over heads); before "
                  "= the pretrained model, after = SST-2 seed 1 fine-tuned. reach.csv has every "
                  "head.", "",
                  table(["configuration", "before: layer 0 / 1 / ...", "after"], rows), ""]
    write_csv(out / "reach.csv", ["config", "when", "layer", "head", "reach"], csv_rows)

    spent = cpu_time(out)
    partial = {n: CONFIGS[n].note for n in names if CONFIGS[n].note}
    lines += ["### Not run", ""] + [f"- `{n}`: {why}" for n, why in skipped.items()]
    lines += [f"- `{n}`: {why}" for n, why in partial.items()] + [""]
    lines += ["### CPU time", "",
              ", ".join(f"{k} {v / 3600:.2f} h" for k, v in spent.items())
              + f"; total {sum(spent.values()) / 3600:.2f} CPU-hours (the pieces' own records).",
              ""]
    plot(out, found, names, s)
    text = "\n".join(lines)
    (out / "encoder_study.md").write_text(text)
    log(f"report: {out / 'encoder_study.md'}, encoder_study.png, mlm/glue/long/reach.csv")
    return text


# -------------------------------------------------------------------------------------- main


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/encoder_study")
    parser.add_argument("--configs", default="all",
                        help=f"comma-separated, of {','.join(CONFIGS)} (default: every one this "
                        "checkout can build)")
    parser.add_argument("--steps", default=",".join(STEPS),
                        help=f"comma-separated, of {','.join(STEPS)} (default: all, in order)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per process")
    parser.add_argument("--wikitext", default=str(DEFAULT_WIKITEXT))
    parser.add_argument("--glue", default=str(DEFAULT_GLUE),
                        help="GLUE in its download layout (CoLA/, SST-2/, STS-B/ with tsv files)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="toy sizes, every step")
    for key, value in Settings().__dict__.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            parser.add_argument(f"--{key.replace('_', '-')}", type=type(value), default=None,
                                help=f"(default {value}; smoke {getattr(SMOKE, key)})")
    args = parser.parse_args(argv)
    settings = Settings(**SMOKE.__dict__) if args.smoke else Settings()
    for key in Settings().__dict__:
        if getattr(args, key, None) is not None:
            setattr(settings, key, getattr(args, key))
    from benchmarks.tables import comma_choices

    args.steps = comma_choices(parser, args.steps, STEPS, "step")
    everything = list(SMOKE_CONFIGS if args.smoke else CONFIGS)
    names = everything if args.configs == "all" else comma_choices(
        parser, args.configs, CONFIGS, "configuration")
    for name in list(names):
        source = CONFIGS[name].checkpoint_of
        if source and source not in names:
            names.insert(names.index(name), source)
    if BASELINE not in names:
        names.insert(0, BASELINE)
    args.names = list(dict.fromkeys(names))
    return args, settings


def main(argv=None):
    args, s = parse_args(argv)
    command = "python -m experiments.encoder_study " + " ".join(
        argv if argv is not None else sys.argv[1:])
    out, env, log = start_run(args.out, "encoder-study", threads=args.threads)
    import torch

    torch.set_num_threads(args.threads)
    known = known_options()
    skipped = dict(SKIPPED)
    names = []
    for name in args.names:
        missing = missing_options(name, known)
        if missing:
            skipped[name] = (f"this checkout's alibi_roberta lacks {', '.join(missing)}; it runs "
                             "once the option exists (same command)")
            log(f"skipping {name}: needs {', '.join(missing)}")
        else:
            names.append(name)
    write_json(out / "settings.json", {"settings": s.__dict__, "configs": names,
                                       "skipped": skipped, "command": command})
    data = prepare(out, args, s, env, log) if "prepare" in args.steps or any(
        step in args.steps for step in STEPS[1:-1]) else load_json(out / "data" / "ready.json")
    failures = []

    def attempt(what, fn):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - one failed piece must not lose the others
            failures.append(f"{what}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
            log(f"FAILED {what}: {e}")
            return None

    # one configuration after the other, each through every step, so that a grid cut short
    # holds whole rows (the baseline and the default variant first)
    pretrained = {}
    for name in names:
        source = pretrained_name(name)
        if source not in pretrained:
            if "pretrain" in args.steps:
                pretrained[source] = attempt(f"pretrain {source}", lambda: pretrain(
                    source, data, out, s, args, env, log))
            else:
                pretrained[source] = load_json(out / "pretrain" / source / "result.json")
        checkpoint = (pretrained.get(source) or {}).get("checkpoint")
        if not checkpoint:
            continue
        config = CONFIGS[name]
        if "mlm" in args.steps and (not config.checkpoint_of or config.length_scale):
            attempt(f"mlm {name}", lambda: mlm(name, checkpoint, data, out, s, args, log))
        if "glue" in args.steps and config.glue:
            attempt(f"glue {name}", lambda: glue_run(name, checkpoint, data, out, s, args, env,
                                                     log))
        if "long" in args.steps and config.long:
            attempt(f"long {name}", lambda: glue_run(name, checkpoint, data, out, s, args, env,
                                                     log, long=True))
        if "reach" in args.steps and config.glue:
            attempt(f"reach {name}", lambda: reach(name, checkpoint, out, data, s, args, log))
        if "report" in args.steps:  # the tables so far, after every configuration
            attempt("report", lambda: report(out, names, skipped, s, args, command, log))
    if "report" in args.steps:
        text = report(out, names, skipped, s, args, command, log)
        print(text)
    if failures:
        log("pieces that failed (run the same command again to retry them): "
            + "; ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
