"""``fairseq-alibi glue``: fine-tune a pretrained encoder on the GLUE tasks of a data folder,
several seeds each, and say which runs collapsed.

    fairseq-alibi glue --checkpoint PRETRAINED.pt --data GLUE-BIN --out OUT
                       [--tasks CoLA,SST-2,STS-B] [--seeds 1,2,3,4,5] [--max-length N|none]
                       [--lr X] [--batch-size N] [--epochs N] [--warmup-ratio R]
                       [--from-mnli [CHECKPOINT]] [--threads N] [--cpu] [-- FAIRSEQ-TRAIN FLAGS]

``GLUE-BIN`` holds ``<TASK>-bin`` folders as ``python -m fairseq_alibi.preprocess.glue`` writes
them. Every run is stock ``fairseq-train --task sentence_prediction`` with fairseq's GLUE recipe
(``examples/roberta/README.glue.md``, ``config/glue/*.yaml``): Adam (bias-corrected, betas 0.9 /
0.98, eps 1e-6, weight decay 0.1), the task's learning rate and batch size, linear warm-up over
the first 6 % of the updates then linear (polynomial) decay to 0, 10 epochs, dropout 0.1, one
``--save-dir`` per task and seed, the best epoch kept by the task's dev metric. The model's
flags (architecture, sizes, ALiBi variant, head, ...) are read from the checkpoint; anything
after ``--`` is added to every ``fairseq-train`` command (and wins).

The dev set is then scored here from each run's best checkpoint: accuracy, Matthews
correlation (CoLA), F1 (MRPC, QQP), Pearson/Spearman (STS-B), all × 100. A run is flagged
**collapsed** when its dev predictions are all one class, its MCC is 0 (CoLA), or its
regression output is constant; the table counts them per task. ``OUT/glue.{md,csv,json}``
hold the median and spread (min–max) over seeds and every run's values. A finished run (its
``result.json``) is never redone: run the same command again to finish a grid cut short.

Long inputs: every input is cut to ``--max-length`` tokens (default: the checkpoint's
pretraining length), for every model alike, before fairseq sees it: the longer segment of a
pair loses tokens from its end first, and each segment keeps its ``</s>``. (Stock
``--shorten-method truncate`` cuts the end of the concatenated pair, i.e. the second
sentence.) ``--max-length none`` keeps every input whole: ALiBi models only, learned positions
stop at their count.

Runs are sequential on a CPU; with several visible GPUs, one run per GPU at a time.
"""

import argparse
import csv
import json
import math
import os
import queue
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from fairseq_alibi.cli import fairseq_runs
from fairseq_alibi.cli.fairseq_runs import (
    console_script,
    cpu_seconds,
    declared_options,
    machine,
    parse_seeds,
    thread_env,
)
from fairseq_alibi.config_access import architecture_of, plain_cfg
from fairseq_alibi.error_hints import OneLineError
from fairseq_alibi.paths import user_dir


class GlueError(OneLineError):
    """Bad input to the tool; the message says what to do."""


@dataclass(frozen=True)
class Recipe:
    """fairseq's fine-tuning hyperparameters of one GLUE task (README.glue.md)."""

    num_classes: int
    lr: float
    batch_size: int
    metrics: Sequence[str]  # reported, the first is the task's main metric
    best: str  # --best-checkpoint-metric: the dev metric that picks the epoch kept
    pair: bool

    @property
    def regression(self):
        return self.num_classes == 1


RECIPES = {
    "CoLA": Recipe(2, 1e-5, 16, ("mcc", "accuracy"), "mcc", False),
    "SST-2": Recipe(2, 1e-5, 32, ("accuracy",), "accuracy", False),
    "MRPC": Recipe(2, 1e-5, 16, ("f1", "accuracy"), "accuracy", True),
    # a constant output's Pearson correlation is undefined (NaN), which would pin fairseq's
    # best checkpoint to the first epoch: the recipe's MSE picks the epoch instead
    "STS-B": Recipe(1, 2e-5, 16, ("pearson", "spearman"), "loss", True),
    "QQP": Recipe(2, 1e-5, 32, ("f1", "accuracy"), "accuracy", True),
    "MNLI": Recipe(3, 1e-5, 32, ("accuracy",), "accuracy", True),
    "QNLI": Recipe(2, 1e-5, 32, ("accuracy",), "accuracy", True),
    "RTE": Recipe(2, 2e-5, 16, ("accuracy",), "accuracy", True),
}
#: the tasks RoBERTa fine-tunes from its MNLI model (Liu et al. 2019, appendix)
FROM_MNLI = ("RTE", "MRPC", "STS-B")
METRIC_NAMES = {"mcc": "MCC", "accuracy": "accuracy", "f1": "F1", "pearson": "Pearson",
                "spearman": "Spearman"}
#: model options of the checkpoint that are training choices, not what the weights are: the
#: fine-tuning recipe sets its own (dropout), or they would change the loaded model; a document
#: mask packs pretraining text and would cut a GLUE example apart at its ``</s> </s>``
NOT_CARRIED = {
    "dropout", "attention_dropout", "activation_dropout", "pooler_dropout", "encoder_layerdrop",
    "encoder_layers_to_keep", "quant_noise_pq", "quant_noise_pq_block_size", "quant_noise_scalar",
    "spectral_norm_classification_head", "load_checkpoint_heads", "min_params_to_wrap",
    "mha_reg_scale_factor", "ffn_reg_scale_factor", "mha_heads_to_keep", "ffn_blocks_to_remove",
    "max_positions", "clap_initial_beta", "classification_pooler", "alibi_document_mask",
}
DEFAULT_SEEDS = (1, 2, 3, 4, 5)
SCORE_BATCH = 64


# ---------------------------------------------------------------------------- the checkpoint


@dataclass
class Pretrained:
    """What fine-tuning needs to know of the pretrained checkpoint."""

    path: str
    arch: str
    flags: List[str]  # the model flags that rebuild it (after --arch)
    learned_positions: Optional[int]  # None: ALiBi, no length limit
    pretraining_length: Optional[int]


def model_options() -> Dict[str, List[argparse.Action]]:
    """``dest -> actions`` of every option ``alibi_roberta`` accepts in this checkout."""
    from fairseq_alibi.models.alibi_roberta import AlibiRobertaModel

    return declared_options(AlibiRobertaModel)


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b)
    return a == b


def flags_of(model: dict, arch: str) -> List[str]:
    """The command-line flags that rebuild ``model`` (a checkpoint's model options) as ``arch``:
    every option whose value differs from the architecture's default, training choices
    (:data:`NOT_CARRIED`) left out."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    defaults = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](defaults)
    flags = []
    for dest, actions in model_options().items():
        actions = [a for a in actions if a.option_strings]
        if dest in NOT_CARRIED or dest not in model or not actions:
            continue
        value, default = model[dest], getattr(defaults, dest, actions[0].default)
        if value is None or isinstance(value, (list, tuple, dict)) or _same(value, default):
            continue
        switches = [a for a in actions if isinstance(a, argparse._StoreConstAction)]
        if switches:  # the switch that stores the value: --x, or its opposite --no-x
            switch = next((a for a in switches if a.const == value), None)
            if switch is None:
                raise GlueError(f"the checkpoint's model has {dest}={value}, which no "
                                f"fairseq-train flag of {arch} sets; fine-tune it with "
                                "fairseq-hydra-train and the override "
                                f"++model.{dest}={str(value).lower()}")
            flags.append(switch.option_strings[0])
        else:
            flags += [actions[0].option_strings[0], str(value)]
    return flags


def read_pretrained(path) -> Pretrained:
    """The checkpoint's model, or a one-line error: missing, unreadable, not an encoder."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    from fairseq_alibi import options
    from fairseq_alibi.cli.checkpoint_io import ConversionError, read_model_checkpoint

    source = Path(path)
    if not source.is_file():
        raise GlueError(f"no checkpoint at {source}: give --checkpoint the pretrained encoder's "
                        ".pt file (fairseq-train --task masked_lm writes "
                        "<save-dir>/checkpoint_best.pt)")
    try:  # refused: a fork's checkpoint not converted yet, an encoder already fine-tuned
        state = read_model_checkpoint(source, "not a masked-LM encoder, which glue fine-tunes")
    except ConversionError as e:
        raise GlueError(str(e)) from None
    cfg = state.get("cfg") or {}
    model, task = plain_cfg(cfg.get("model")), plain_cfg(cfg.get("task"))
    arch = architecture_of(model)
    kind = ARCH_MODEL_REGISTRY.get(arch).__name__ if arch in ARCH_MODEL_REGISTRY else None
    if kind not in ("AlibiRobertaModel", "RobertaModel"):
        raise GlueError(
            f"{source} is a checkpoint of {arch or 'an unknown model'}"
            f"{f' ({kind})' if kind else ''}: fairseq-alibi glue fine-tunes masked-LM encoders "
            "(alibi_roberta, or stock roberta), pretrained with fairseq-train --task masked_lm")
    if kind == "RobertaModel":  # stock RoBERTa weights are an alibi_roberta `none` model
        arch = "alibi_roberta"
        model = dict(model, alibi_variant="none")
    flags = flags_of(model, arch)
    learned = model.get("alibi_variant", options.default_of("variant", options.ENCODER)) == "none"
    positions = model.get("max_positions") or task.get("tokens_per_sample")
    length = task.get("tokens_per_sample") or task.get("max_positions") or positions
    return Pretrained(str(source.resolve()), arch, flags,
                      int(positions) if learned and positions else None,
                      int(length) if length else None)


# ---------------------------------------------------------------------------------- the data


def find_tasks(data: Path, names: Optional[List[str]]) -> Dict[str, Path]:
    """``task -> <data>/<TASK>-bin``: the named tasks (an error naming any missing folder), or
    every known task found."""
    if not data.is_dir():
        raise GlueError(f"--data {data}: no such folder; give the folder holding <TASK>-bin "
                        "folders (python -m fairseq_alibi.preprocess.glue --destdir DIR)")
    if names is None:
        found = {t: data / f"{t}-bin" for t in RECIPES if (data / f"{t}-bin").is_dir()}
        if not found:
            raise GlueError(f"--data {data} holds no GLUE task folder ({', '.join(RECIPES)} "
                            "as <TASK>-bin); python -m fairseq_alibi.preprocess.glue writes them")
        return found
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        raise GlueError(f"unknown GLUE task(s) {', '.join(unknown)}; choose from "
                        f"{', '.join(RECIPES)}")
    missing = [n for n in names if not (data / f"{n}-bin").is_dir()]
    if missing:
        raise GlueError(f"--data {data} has no {', '.join(m + '-bin' for m in missing)} folder; "
                        "write it with python -m fairseq_alibi.preprocess.glue --glue-dir "
                        f"GLUE --tasks {' '.join(missing)} --destdir {data}")
    return {n: data / f"{n}-bin" for n in names}


def _check_task_folder(name: str, folder: Path):
    needed = [folder / "input0" / "dict.txt", folder / "input0" / "train.idx",
              folder / "input0" / "valid.idx"]
    needed.append(folder / "label" / ("train.label" if RECIPES[name].regression else "dict.txt"))
    missing = [str(p.relative_to(folder)) for p in needed if not p.is_file()]
    if missing:
        raise GlueError(f"{folder} lacks {', '.join(missing)}: not a binarized {name} folder "
                        "(python -m fairseq_alibi.preprocess.glue writes them)")
    if RECIPES[name].pair != (folder / "input1").is_dir():
        raise GlueError(f"{folder}: {name} has {'two' if RECIPES[name].pair else 'one'} "
                        f"input(s) but the folder {'lacks' if RECIPES[name].pair else 'has'} "
                        "input1/")


def _splits(folder: Path) -> List[str]:
    return sorted(p.stem for p in (folder / "input0").glob("*.idx"))


def _read(prefix: Path):
    from fairseq.data import data_utils

    return data_utils.load_indexed_dataset(str(prefix), None)


def _sizes(prefix: Path) -> np.ndarray:
    """Tokens per sample of a binarized split, copied out of the memory map (which is closed
    when its dataset goes)."""
    dataset = _read(prefix)
    return np.array(dataset.sizes, dtype=np.int64, copy=True)


def input_lengths(folder: Path, split: str) -> np.ndarray:
    """Tokens the model sees per input: ``<s>`` + first segment (with ``</s>``), and for a pair
    the separator + second segment, as fairseq's sentence_prediction assembles them."""
    lengths = _sizes(folder / "input0" / split) + 1
    if (folder / "input1" / f"{split}.idx").is_file():
        lengths = lengths + _sizes(folder / "input1" / split) + 1
    return lengths


def cut_pair(a: int, b: Optional[int], budget: int):
    """Segment lengths that fit ``budget`` tokens: the longer segment loses a token first."""
    if b is None:
        return min(a, budget - 1), None
    room = budget - 2  # <s> and the separator
    while a + b > room:
        if a >= b:
            a -= 1
        else:
            b -= 1
    return a, b


def truncated_copy(name: str, folder: Path, out: Path, budget: int) -> Dict[str, int]:
    """``folder`` with every input cut to ``budget`` tokens (see :func:`cut_pair`; each segment
    keeps its final ``</s>``) written to ``out``; returns the inputs cut per split."""
    from fairseq_alibi.files import atomic_directory  # its own folder: replaced whole
    from fairseq_alibi.preprocess.pipeline_io import IndexedWriter

    pair = RECIPES[name].pair
    if budget < (6 if pair else 3):
        raise GlueError(f"--max-length {budget} leaves no room for {name}'s inputs: give at "
                        f"least {6 if pair else 3} tokens")
    from fairseq.data import Dictionary

    vocab = len(Dictionary.load(str(folder / "input0" / "dict.txt")))
    cut = {}
    with atomic_directory(out, overwrite=True) as tmp:
        inputs = ["input0", "input1"] if pair else ["input0"]
        for sub in inputs:
            (tmp / sub).mkdir()
            shutil.copy(folder / sub / "dict.txt", tmp / sub / "dict.txt")
        shutil.copytree(folder / "label", tmp / "label")
        for split in _splits(folder):
            first = _read(folder / "input0" / split)
            second = _read(folder / "input1" / split) if pair else None
            writers = [IndexedWriter(tmp / sub / split, vocab) for sub in inputs]
            n = 0
            for i in range(len(first)):
                segments = [first[i]] + ([second[i]] if pair else [])
                kept = cut_pair(len(segments[0]), len(segments[1]) if pair else None, budget)
                n += any(k is not None and k < len(s) for k, s in zip(kept, segments))
                for writer, segment, keep in zip(writers, segments, kept):
                    ids = segment.numpy()
                    writer.add(ids if keep == len(ids) else np.append(ids[: keep - 1], ids[-1]))
            for writer in writers:
                writer.finalize(f"{split} of {folder} is empty")
            cut[split] = n
        (tmp / "truncation.json").write_text(json.dumps(
            {"source": str(folder), "max_length": budget, "inputs_cut": cut}, indent=2) + "\n")
    return cut


def task_data(name: str, folder: Path, out: Path, max_length: Optional[int]) -> dict:
    """The folder fairseq trains on (``folder``, or a truncated copy in ``out/data``) and the
    length figures of its inputs."""
    _check_task_folder(name, folder)
    lengths = {split: input_lengths(folder, split) for split in _splits(folder)}
    longest = int(max(x.max() for x in lengths.values()))
    over = {split: int((x > max_length).sum()) for split, x in lengths.items()} \
        if max_length else {split: 0 for split in lengths}
    info = {"source": str(folder), "longest_input": longest,
            "inputs": {split: int(len(x)) for split, x in lengths.items()},
            "mean_length": {split: round(float(x.mean()), 1) for split, x in lengths.items()},
            "inputs_cut": over, "max_length": max_length}
    if not max_length or not any(over.values()):
        info["folder"], info["longest_seen"] = str(folder), longest
        return info
    copy = out / "data" / f"{name}-max{max_length}"
    record = copy / "truncation.json"
    if not (record.is_file() and json.loads(record.read_text()).get("source") == str(folder)):
        truncated_copy(name, folder, copy, max_length)
    info["folder"], info["longest_seen"] = str(copy), min(longest, max_length)
    return info


# ---------------------------------------------------------------------------------- scoring


def matthews(pred: np.ndarray, gold: np.ndarray) -> float:
    """Matthews correlation (Gorodkin's multi-class form; the usual one for two classes); 0
    when it is undefined (one class predicted or present), as scikit-learn returns."""
    classes = np.union1d(pred, gold)
    index = {c: i for i, c in enumerate(classes)}
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)
    for p, g in zip(pred, gold):
        confusion[index[g], index[p]] += 1
    t, p = confusion.sum(1), confusion.sum(0)
    c, s = np.trace(confusion), confusion.sum()
    denominator = math.sqrt((s * s - (p * p).sum()) * (s * s - (t * t).sum()))
    return 0.0 if denominator == 0 else float((c * s - (t * p).sum()) / denominator)


def f1_score(pred: np.ndarray, gold: np.ndarray, positive: int) -> float:
    tp = float(((pred == positive) & (gold == positive)).sum())
    predicted, actual = float((pred == positive).sum()), float((gold == positive).sum())
    return 0.0 if tp == 0 else 2 * tp / (predicted + actual)


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties sharing their average rank (as Spearman's correlation needs)."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    sorted_x = x[order]
    start = 0
    for end in range(1, len(x) + 1):
        if end == len(x) or sorted_x[end] != sorted_x[start]:
            ranks[order[start:end]] = (start + end + 1) / 2
            start = end
    return ranks


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation; NaN when either side is constant."""
    a, b = a - a.mean(), b - b.mean()
    denominator = math.sqrt(float((a * a).sum()) * float((b * b).sum()))
    return float("nan") if denominator == 0 else float((a * b).sum() / denominator)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    return pearson(_ranks(a), _ranks(b))


def score(name: str, pred: np.ndarray, gold: np.ndarray, labels: Optional[List[str]] = None
          ) -> dict:
    """The task's metrics (× 100) and the collapse verdict of one run's dev predictions.

    ``labels``: the class names by index (classification); F1 counts class ``"1"`` positive.
    """
    recipe = RECIPES[name]
    found = {"dev_examples": int(len(gold))}
    if recipe.regression:
        pred, gold = pred.astype(np.float64), gold.astype(np.float64)
        r, rho = pearson(pred, gold), spearman(pred, gold)
        constant = float(pred.std()) <= 1e-3 * max(float(gold.std()), 1e-12)
        # an undefined correlation (constant output) counts as none
        found.update(pearson=100 * (0.0 if math.isnan(r) else r),
                     spearman=100 * (0.0 if math.isnan(rho) else rho),
                     prediction_std=float(pred.std()), label_std=float(gold.std()))
        reason = (f"constant output (std {pred.std():.2g} against the labels' "
                  f"{gold.std():.2g})") if constant else None
    else:
        labels = labels or [str(i) for i in range(recipe.num_classes)]
        found["accuracy"] = 100 * float((pred == gold).mean())
        counts = np.bincount(gold, minlength=len(labels))
        found["majority_rate"] = 100 * float(counts.max() / len(gold))
        found["predicted_classes"] = {labels[c]: int((pred == c).sum()) for c in np.unique(pred)}
        if "mcc" in recipe.metrics:
            found["mcc"] = 100 * matthews(pred, gold)
        if "f1" in recipe.metrics:
            found["f1"] = 100 * f1_score(pred, gold, labels.index("1") if "1" in labels else 1)
        reason = None
        if len(np.unique(pred)) == 1:
            reason = f"all {len(pred)} dev predictions are class {labels[int(pred[0])]!r}"
        elif "mcc" in found and found["mcc"] == 0:
            reason = "MCC 0 (predictions independent of the labels)"
    found["collapsed"], found["collapse"] = reason is not None, reason
    return found


def predict(checkpoint: Path, data: str, device: str, threads: int):
    """Dev-set predictions of a fine-tuned checkpoint, in dev order: ``(pred, gold, labels)``."""
    import warnings

    import torch
    from fairseq import checkpoint_utils, utils

    import fairseq_alibi  # noqa: F401  (registers the models)

    warnings.filterwarnings("ignore", message=".*pin_memory.*")  # fairseq's loader, on a CPU
    torch.set_num_threads(threads)
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides={"data": data})
    model = models[0].to(device).eval()
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    batches = task.get_batch_iterator(
        dataset=dataset, max_sentences=SCORE_BATCH,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=False, required_batch_size_multiple=1, seed=1,
    ).next_epoch_itr(shuffle=False)
    preds, golds, ids = [], [], []
    with torch.no_grad():
        for sample in batches:
            sample = utils.move_to_cuda(sample) if device == "cuda" else sample
            logits, _ = model(**sample["net_input"], features_only=True,
                              classification_head_name="sentence_classification_head")
            target = sample["target"].view(-1)
            if task.cfg.regression_target:
                preds.append(logits.view(-1).float().cpu())
            else:
                preds.append(logits.argmax(-1).cpu())
            golds.append(target.cpu())
            ids.append(sample["id"].cpu())
    order = torch.cat(ids).argsort()
    labels = None
    if not task.cfg.regression_target:
        d = task.label_dictionary
        labels = [d[i + d.nspecial] for i in range(len(d) - d.nspecial)]
    return torch.cat(preds)[order].numpy(), torch.cat(golds)[order].numpy(), labels


# --------------------------------------------------------------------------- fine-tuning runs


def train_updates(n_train: int, batch_size: int, epochs: int) -> int:
    return math.ceil(n_train / batch_size) * epochs


def finetune_command(name: str, data: dict, pretrained: Pretrained, restore: str, seed: int,
                     save_dir: Path, args) -> List[str]:
    """Stock ``fairseq-train`` with fairseq's GLUE recipe for one task and seed."""
    recipe = RECIPES[name]
    lr = args.lr if args.lr is not None else recipe.lr
    batch = args.batch_size if args.batch_size is not None else recipe.batch_size
    total = train_updates(data["inputs"]["train"], batch, args.epochs)
    warmup = max(1, round(args.warmup_ratio * total))
    # learned positions: exactly the checkpoint's count; ALiBi: any limit (nothing is longer)
    positions = pretrained.learned_positions or max(data["longest_seen"], 1)
    cmd = [
        console_script("fairseq-train"), data["folder"], "--user-dir", user_dir(),
        "--restore-file", restore, "--reset-optimizer", "--reset-dataloader", "--reset-meters",
        "--task", "sentence_prediction", "--criterion", "sentence_prediction",
        "--num-classes", str(recipe.num_classes), "--init-token", "0", "--separator-token", "2",
        "--max-positions", str(positions), "--arch", pretrained.arch, *pretrained.flags,
        "--batch-size", str(batch), "--max-tokens", str(max(4400, data["longest_seen"])),
        "--required-batch-size-multiple", "1",
        "--dropout", "0.1", "--attention-dropout", "0.1", "--weight-decay", "0.1",
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-06",
        "--clip-norm", "0.0", "--lr-scheduler", "polynomial_decay", "--lr", repr(lr),
        "--total-num-update", str(total), "--warmup-updates", str(warmup),
        "--max-epoch", str(args.epochs), "--seed", str(seed), "--save-dir", str(save_dir),
        "--no-epoch-checkpoints", "--no-last-checkpoints", "--no-save-optimizer-state",
        "--best-checkpoint-metric", recipe.best,
        "--num-workers", "0", "--log-format", "simple", "--log-interval", "50",
        "--no-progress-bar",
    ]
    if recipe.regression:
        cmd.append("--regression-target")
    if recipe.best != "loss":
        cmd.append("--maximize-best-checkpoint-metric")
    if recipe.best == "mcc":
        cmd.append("--report-mcc")
    if args.device == "cpu":
        cmd.append("--cpu")
    return cmd + list(args.fairseq_args)


def run_dir(out: Path, name: str, seed: int) -> Path:
    return out / "runs" / name / f"seed{seed}"


def run_one(name: str, seed: int, data: dict, pretrained: Pretrained, restore: str, out: Path,
            args, gpu: Optional[int], log) -> dict:
    """Fine-tune and score one task and seed, unless its result is there already."""
    folder = run_dir(out, name, seed)
    result_file = folder / "result.json"
    if result_file.is_file():
        return json.loads(result_file.read_text())
    save_dir = folder / "checkpoints"
    if save_dir.exists():  # a run cut short: start it again (its restore file is the encoder)
        shutil.rmtree(save_dir)
    folder.mkdir(parents=True, exist_ok=True)
    cmd = finetune_command(name, data, pretrained, restore, seed, save_dir, args)
    env = thread_env(args.threads)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    log(f"{name} seed {seed}: fine-tuning{'' if gpu is None else f' on GPU {gpu}'} ...")
    started, cpu_before = time.time(), cpu_seconds()
    code = fairseq_runs.run_to_log(cmd, env, folder / "train.log").returncode  # can be watched
    output = (folder / "train.log").read_text()
    best = save_dir / "checkpoint_best.pt"
    if code != 0 or not best.is_file():
        hint = [line for line in output.splitlines() if line.startswith("fairseq_alibi: ")]
        raise RuntimeError(f"fine-tuning {name} seed {seed} failed (exit {code}); "
                           f"log: {folder / 'train.log'}\n"
                           + (hint[-1] if hint else output[-2500:]))
    seconds = time.time() - started
    pred, gold, labels = predict(best, data["folder"], "cuda" if gpu is not None else "cpu",
                                 args.threads)
    result = {"task": name, "seed": seed, **score(name, pred, gold, labels),
              "train_seconds": round(seconds, 1),
              "cpu_seconds": round(cpu_seconds() - cpu_before, 1) if gpu is None else None,
              "checkpoint": str(best), "restored_from": restore, "command": " ".join(cmd)}
    np.save(folder / "dev_predictions.npy", pred)  # in dev order, with the gold labels
    np.save(folder / "dev_labels.npy", gold)
    tmp = result_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, result_file)
    if args.delete_checkpoints and not (name == "MNLI" and args.from_mnli):
        shutil.rmtree(save_dir)
    flag = f"  COLLAPSED: {result['collapse']}" if result["collapsed"] else ""
    main_metric = RECIPES[name].metrics[0]
    log(f"{name} seed {seed}: dev {METRIC_NAMES[main_metric]} {result[main_metric]:.1f} "
        f"({seconds:.0f} s){flag}")
    return result


def run_grid(jobs: List[tuple], devices: List[Optional[int]], runner) -> List[dict]:
    """``runner(job, device)`` for every job: in turn on one device, else one per device."""
    if len(devices) == 1:
        return [runner(job, devices[0]) for job in jobs]
    free: "queue.Queue" = queue.Queue()
    for device in devices:
        free.put(device)

    def on_a_free_device(job):
        device = free.get()
        try:
            return runner(job, device)
        finally:
            free.put(device)

    with ThreadPoolExecutor(max_workers=len(devices)) as pool:
        return list(pool.map(on_a_free_device, jobs))


# ---------------------------------------------------------------------------------- reports


def summarize(results: List[dict], tasks: List[str]) -> Dict[str, dict]:
    """Per task: the median, min and max over seeds of each metric, and the collapse count."""
    summary = {}
    for name in tasks:
        runs = sorted((r for r in results if r["task"] == name), key=lambda r: r["seed"])
        if not runs:
            continue
        entry = {"runs": len(runs), "collapsed": sum(r["collapsed"] for r in runs),
                 "seeds": [r["seed"] for r in runs], "metrics": {}}
        for metric in RECIPES[name].metrics:
            values = [r[metric] for r in runs]
            entry["metrics"][metric] = {"median": statistics.median(values), "min": min(values),
                                        "max": max(values), "values": values}
        if "majority_rate" in runs[0]:
            entry["majority_rate"] = runs[0]["majority_rate"]
        summary[name] = entry
    return summary


def markdown(summary: Dict[str, dict], results: List[dict], header: List[str]) -> str:
    lines = header + ["", "| task | metric | median | min–max | collapsed | per seed |",
                      "|---|---|---:|---:|---:|---|"]
    for name, entry in summary.items():
        for k, (metric, values) in enumerate(entry["metrics"].items()):
            per_seed = " ".join(f"{v:.1f}" for v in values["values"])
            collapsed = f"{entry['collapsed']} of {entry['runs']}" if k == 0 else ""
            lines.append(f"| {name if k == 0 else ''} | {METRIC_NAMES[metric]} | "
                         f"{values['median']:.1f} | {values['min']:.1f}–{values['max']:.1f} | "
                         f"{collapsed} | {per_seed} |")
    collapsed = [r for r in results if r["collapsed"]]
    lines += ["", "Collapsed runs: " + ("none." if not collapsed else "")]
    lines += [f"- {r['task']} seed {r['seed']}: {r['collapse']}" for r in collapsed]
    majority = {n: e["majority_rate"] for n, e in summary.items() if "majority_rate" in e}
    if majority:
        lines += ["", "Dev majority-class rate (what a collapsed classifier scores): "
                  + ", ".join(f"{n} {v:.1f} %" for n, v in majority.items()) + "."]
    return "\n".join(lines) + "\n"


def write_reports(out: Path, record: dict, results: List[dict], summary: Dict[str, dict],
                  header: List[str]):
    (out / "glue.md").write_text(markdown(summary, results, header))
    fields = ["task", "seed", "accuracy", "mcc", "f1", "pearson", "spearman", "majority_rate",
              "collapsed", "collapse", "dev_examples", "train_seconds", "checkpoint"]
    with open(out / "glue.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for r in sorted(results, key=lambda r: (r["task"], r["seed"])):
            writer.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v)
                             for k, v in r.items()})
    (out / "glue.json").write_text(json.dumps(
        dict(record, summary=summary, runs=results), indent=2) + "\n")


# ------------------------------------------------------------------------------------- main


def parse_args(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(
        prog="fairseq-alibi glue", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2])
    parser.add_argument("--checkpoint", required=True, help="the pretrained encoder (.pt)")
    parser.add_argument("--data", required=True,
                        help="folder of <TASK>-bin folders "
                        "(python -m fairseq_alibi.preprocess.glue)")
    parser.add_argument("--out", required=True, help="where runs, checkpoints and tables go")
    parser.add_argument("--tasks", default=None,
                        help=f"comma-separated, of {','.join(RECIPES)} "
                        "(default: every one in --data)")
    parser.add_argument("--seeds", default=",".join(map(str, DEFAULT_SEEDS)),
                        help="fine-tuning seeds, comma-separated (default 1,2,3,4,5)")
    parser.add_argument("--max-length", default=None,
                        help="cut every input to this many tokens (default: the checkpoint's "
                        "pretraining length); 'none' keeps them whole (ALiBi models)")
    parser.add_argument("--lr", type=float, default=None,
                        help="peak learning rate of every task (default: the task's recipe)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="sentences per batch of every task (default: the task's recipe)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--warmup-ratio", type=float, default=0.06,
                        help="linear warm-up over this fraction of the updates (default 0.06)")
    parser.add_argument("--from-mnli", nargs="?", const="auto", default=None, metavar="CHECKPOINT",
                        help=f"start {', '.join(FROM_MNLI)} from an MNLI-fine-tuned checkpoint: "
                        "this one, or (no value) the best of this grid's MNLI runs")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per run (default 1)")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even with GPUs")
    parser.add_argument("--delete-checkpoints", action="store_true",
                        help="delete each run's checkpoint once its dev set is scored")
    args = parser.parse_args(argv)
    args.fairseq_args = extra
    args.seeds = parse_seeds(parser, args.seeds)
    if args.epochs < 1 or args.threads < 1 or not 0 <= args.warmup_ratio < 1:
        parser.error("--epochs and --threads must be at least 1, --warmup-ratio in [0, 1)")
    if args.lr is not None and not 0 < args.lr < math.inf:
        parser.error(f"--lr must be a positive number, got {args.lr}")
    if args.batch_size is not None and args.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.max_length is not None and args.max_length != "none":
        if not args.max_length.isdigit() or int(args.max_length) < 3:
            parser.error(f"--max-length takes a number of tokens (at least 3) or 'none', got "
                         f"{args.max_length!r}")
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    return args


def devices_for(args) -> List[Optional[int]]:
    """``[None]`` (the CPU), or the visible GPUs' indices."""
    if args.cpu:
        return [None]
    import torch

    count = torch.cuda.device_count()
    return list(range(count)) if count else [None]


def _max_length(args, pretrained) -> Optional[int]:
    """The tokens an input keeps (``None``: whole), from ``--max-length`` and the checkpoint."""
    if args.max_length == "none":
        if pretrained.learned_positions:
            raise GlueError(
                f"--max-length none: this checkpoint has learned positions "
                f"({pretrained.learned_positions}), which stop there; give --max-length "
                f"{pretrained.learned_positions} or less (ALiBi models can keep inputs whole)")
        return None
    max_length = int(args.max_length or pretrained.pretraining_length or 512)
    if pretrained.learned_positions and max_length > pretrained.learned_positions:
        raise GlueError(
            f"--max-length {max_length}: this checkpoint learned "
            f"{pretrained.learned_positions} positions; give at most that")
    return max_length


def _mnli_source(args, tasks) -> Optional[str]:
    """The checkpoint ``--from-mnli`` names (``None``: none, or this grid's best MNLI run)."""
    if args.from_mnli == "auto" and "MNLI" not in tasks:
        raise GlueError("--from-mnli without a checkpoint starts RTE, MRPC and STS-B from this "
                        "grid's MNLI runs: add MNLI to --tasks (its MNLI-bin in --data), or give "
                        "--from-mnli MNLI_CHECKPOINT")
    if args.from_mnli in (None, "auto"):
        return None
    source = str(Path(args.from_mnli).resolve())
    if not Path(source).is_file():
        raise GlueError(f"--from-mnli {args.from_mnli}: no such checkpoint")
    return source


def _keep_settings(out: Path, settings: dict) -> None:
    """Write ``out/settings.json``; refuse an ``out`` holding runs of other settings."""
    kept = out / "settings.json"
    if kept.is_file() and json.loads(kept.read_text()) != settings:
        before = json.loads(kept.read_text())
        changed = [k for k in settings if before.get(k) != settings[k]]
        raise GlueError(f"{out} holds runs made with other settings ({', '.join(changed)}); "
                        "give another --out, or the same settings to finish that grid")
    kept.write_text(json.dumps(settings, indent=2) + "\n")


def _report_header(command, pretrained, args, max_length) -> List[str]:
    return [
        f"GLUE dev, fine-tuned from `{pretrained.path}`", "",
        f"Command: `{command}`  ",
        f"Model: `--arch {pretrained.arch} {' '.join(pretrained.flags)}`  ",
        "Inputs: " + (f"cut to {max_length} tokens (longer segment first)" if max_length
                      else "whole") + "; "
        f"recipe: Adam (0.9, 0.98), lr {args.lr or 'per task'}, {args.epochs} "
        f"epoch{'s' if args.epochs != 1 else ''}, "
        f"{args.warmup_ratio:.0%} warm-up then linear decay, best epoch by the dev metric  ",
        f"Seeds: {', '.join(map(str, args.seeds))}; metrics × 100",
    ]


def main(argv=None):
    """Read the checkpoint and the tasks, fine-tune every task and seed, score, report."""
    args = parse_args(argv)
    command = "fairseq-alibi glue " + " ".join(argv if argv is not None else sys.argv[1:])
    out = Path(args.out).resolve()
    log = lambda msg: print(f"[glue] {msg}", flush=True)  # noqa: E731
    started, cpu_start = time.time(), cpu_seconds()
    pretrained = read_pretrained(args.checkpoint)
    tasks = find_tasks(Path(args.data).resolve(), args.tasks)
    max_length = _max_length(args, pretrained)
    mnli_source = _mnli_source(args, tasks)
    out.mkdir(parents=True, exist_ok=True)
    devices = devices_for(args)
    args.device = "cpu" if devices == [None] else "cuda"

    settings = {"checkpoint": pretrained.path, "arch": pretrained.arch,
                "model_flags": pretrained.flags, "max_length": max_length, "lr": args.lr,
                "batch_size": args.batch_size, "epochs": args.epochs,
                "warmup_ratio": args.warmup_ratio, "from_mnli": args.from_mnli,
                "fairseq_args": args.fairseq_args}
    _keep_settings(out, settings)
    log(f"{pretrained.path}: --arch {pretrained.arch} {' '.join(pretrained.flags)}")

    data = {}
    for name, folder in tasks.items():
        data[name] = task_data(name, folder, out, max_length)
        cut = data[name]["inputs_cut"]
        log(f"{name}: {data[name]['inputs']} inputs, longest {data[name]['longest_input']} "
            f"tokens; cut to {max_length}: {cut}" if max_length else
            f"{name}: {data[name]['inputs']} inputs, longest {data[name]['longest_input']} "
            "tokens, kept whole")

    order = sorted(tasks, key=lambda n: n != "MNLI")  # MNLI first: the others may start from it
    results = []

    def runner(job, device):
        name, seed = job
        restore = pretrained.path
        if args.from_mnli and name in FROM_MNLI:
            restore = mnli_source
        return run_one(name, seed, data[name], pretrained, restore, out, args, device, log)

    if args.from_mnli == "auto":
        mnli = run_grid([("MNLI", s) for s in args.seeds], devices, runner)
        results += mnli
        best = max(mnli, key=lambda r: r["accuracy"])
        mnli_source = best["checkpoint"]
        log(f"RTE, MRPC and STS-B start from MNLI seed {best['seed']} "
            f"(dev accuracy {best['accuracy']:.1f})")
        order.remove("MNLI")
    results += run_grid([(n, s) for n in order for s in args.seeds], devices, runner)

    summary = summarize(results, list(tasks))
    record = {"command": command, "settings": settings, "data": data, "machine": machine(),
              "wall_seconds": round(time.time() - started, 1),
              "cpu_seconds": round(cpu_seconds() - cpu_start, 1)}
    header = _report_header(command, pretrained, args, max_length)
    write_reports(out, record, results, summary, header)
    print(markdown(summary, results, header))
    log(f"tables in {out}/glue.md, glue.csv, glue.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
