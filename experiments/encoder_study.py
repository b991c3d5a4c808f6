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

The configurations and sizes are in :mod:`experiments.encoder_study_configs`, the report in
:mod:`experiments.encoder_study_report`; this module runs the pieces.
"""

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

from experiments.encoder_study_configs import (
    BASELINE,
    CONFIGS,
    DEFAULT_GLUE,
    GLUE_TASKS,
    LONG_TASKS,
    REPO,
    SINUSOIDAL_FLAG,
    SKIPPED,
    SMOKE,
    SMOKE_CONFIGS,
    STEPS,
    Settings,
    model_flags,
)
from experiments.encoder_study_report import load_json, report
from experiments.lm_runs import DEFAULT_WIKITEXT, start_run, wikitext_files, write_json
from experiments.model_flags import accepted_flags, lacking_flags
from fairseq_alibi.cli import fairseq_runs
from fairseq_alibi.cli.fairseq_runs import console_script, cpu_seconds
from fairseq_alibi.paths import user_dir


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
    code = fairseq_runs.run_to_log(cmd, env, log_file, cwd=REPO).returncode
    output = log_file.read_text()
    if code != 0:
        raise RuntimeError(f"{what} failed (exit {code}); full output in {log_file}:\n"
                           + output[-3000:])
    return output


def masked_lm_command(data: str, save_dir, s: Settings, seed: int, flags: Sequence[str] = (),
                      break_mode: str = "none", program: Optional[List[str]] = None) -> List[str]:
    """The study's ``fairseq-train --task masked_lm`` command line: the size and budget of ``s``
    (``s.max_tokens`` tokens an update where set, else ``s.batch`` blocks), ``flags`` after
    the sizes, blocks of ``s.L`` tokens cut by ``--sample-break-mode break_mode``
    (``program``: what runs it, default ``fairseq-train``)."""
    batch = (["--max-tokens", str(s.max_tokens)] if s.max_tokens
             else ["--batch-size", str(s.batch)])
    return [*(program or [console_script("fairseq-train")]), str(data), "--user-dir", user_dir(),
            "--task", "masked_lm", "--criterion", "masked_lm", *model_flags(s), *flags,
            "--tokens-per-sample", str(s.L), "--sample-break-mode", break_mode,
            *batch, "--required-batch-size-multiple", "1",
            "--max-update", str(s.updates), "--total-num-update", str(s.updates),
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-06",
            "--weight-decay", "0.01", "--clip-norm", "1.0", "--lr", str(s.lr),
            "--lr-scheduler", "polynomial_decay", "--warmup-updates", str(s.warmup),
            "--dropout", "0.1", "--attention-dropout", "0.1", "--seed", str(seed),
            "--save-dir", str(save_dir), "--no-epoch-checkpoints",
            "--save-interval-updates", str(max(1, s.updates // 8)),
            "--keep-interval-updates", "1", "--disable-validation", "--num-workers", "0",
            "--log-format", "simple", "--log-interval", str(max(1, s.updates // 20)),
            "--no-progress-bar", "--cpu"]


def pretrain(name: str, data: dict, out: Path, s: Settings, args, env, log) -> dict:
    """``fairseq-train --task masked_lm`` of one configuration (resumed if cut short)."""
    folder = out / "pretrain" / name
    done = folder / "result.json"
    if done.is_file():
        return json.loads(done.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    train = None
    if CONFIGS[name].sinusoidal:
        train = [sys.executable, "-c", "from experiments.encoder_study import "
                 "fairseq_train_sinusoidal as f; f()"]
    cmd = masked_lm_command(data["text"], folder / "checkpoints", s, args.seed,
                            CONFIGS[name].pretrain, program=train)
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
    ``fairseq-validate --valid-subset test --tokens-per-sample length --seed seed`` iterates.
    ``model_overrides``: load-time overrides of the model's or the task's options
    (``sample_break_mode`` included)."""
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
                   sinusoidal: bool = False, model_overrides: Optional[dict] = None,
                   keep_boundaries: bool = False) -> dict:
    """Masked-LM perplexity of :func:`held_out_blocks`, in this process, two ways:

    * ``perplexity``: every masked target, what ``fairseq-validate --valid-subset test
      --tokens-per-sample length --seed seed`` computes;
    * ``text_perplexity``: the masked text tokens only. ``masked_lm`` masks the block's first
      token ``<s>`` at the same rate as the text and a model predicts it almost surely; it is 1
      of ``length`` tokens, so it lowers ``perplexity`` more at short blocks than at long ones
      and makes longer blocks look worse than they are.

    ``keep_boundaries``: each block as ``--criterion masked_lm_documents`` sees it, every
    ``</s>`` the masking chose kept in the input and not predicted.
    """
    import torch
    import torch.nn.functional as F

    from fairseq_alibi.criterions.masked_lm_documents import boundaries_kept

    model, _, task, batches = held_out_blocks(checkpoint, data, length, seed, sinusoidal,
                                              model_overrides)
    pad, bos, eos = (task.source_dictionary.pad(), task.source_dictionary.bos(),
                     task.source_dictionary.eos())
    loss = masked = text_loss = text_masked = tokens = blocks = 0.0
    with torch.no_grad():
        for sample in batches:
            tokens += float(sample["ntokens"])
            blocks += float(sample["nsentences"])
            if keep_boundaries:
                sample = boundaries_kept(sample, eos, pad)
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
