"""GLUE tasks to the binaries of fairseq's ``sentence_prediction`` task, offline.

Does what fairseq's ``examples/roberta/preprocess_GLUE_tasks.sh`` does, from the standard GLUE
folder layout (``<glue-dir>/<TASK>/{train,dev,test}.tsv``; MNLI's ``dev_matched``,
``dev_mismatched``, ``test_matched``, ``test_mismatched``), without downloading anything:

* the header line is skipped (CoLA's train and dev files have none);
* the input columns are encoded (GPT-2 BPE with fairseq's ``dict.txt`` by default, or the
  sentencepiece model and dictionary of the pretraining data) into ``input0/`` and, for
  sentence pairs, ``input1/``;
* labels go to ``label/``: a dictionary built from the training labels for classification,
  and for STS-B the score divided by 5 as text (``label/{train,valid}.label``);
* dev becomes ``valid`` (MNLI: ``valid`` matched, ``valid1`` mismatched), test ``test``
  (MNLI: ``test``, ``test1``); test files are optional.

Each task is written to ``<destdir>/<TASK>-bin`` as one unit. A row with the wrong number of
columns, or a label the task does not have, is an error naming the task, the file and the line,
except in QQP's train and dev files, where fairseq's script drops such rows (they are counted).
"""

import argparse
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

from fairseq_alibi.preprocess.encoders import (
    EOS_WORD,
    WordEncoder,
    add_encoder_arguments,
    dictionary_from_counts,
    encoder_from_args,
)
from fairseq_alibi.preprocess.pipeline_io import (
    DataError,
    IndexedWriter,
    add_output_arguments,
    atomic_directory,
    read_batches,
    refuse_existing,
    run_cli,
    save_json,
)
from fairseq_alibi.preprocess.process_pool import ordered_map, worker_state

logger = logging.getLogger("fairseq_alibi.preprocess.glue")

BINARY = ("0", "1")
NLI2 = ("entailment", "not_entailment")


@dataclass(frozen=True)
class GlueTask:
    """Where a task keeps its fields: 1-based columns, as in preprocess_GLUE_tasks.sh."""

    name: str
    columns: Dict[str, int]  # GLUE file stem -> number of tab-separated columns
    inputs: Tuple[int, ...]
    test_inputs: Tuple[int, ...]
    label: int
    labels: Optional[Tuple[str, ...]]  # None: a regression score in [0, 5]
    dev_label: Optional[int] = None  # MNLI's dev files keep the gold label elsewhere
    headerless: Tuple[str, ...] = ()
    drop_malformed: Tuple[str, ...] = ()  # files whose bad rows fairseq filters out

    @property
    def regression(self):
        return self.labels is None

    def fairseq_split(self, stem):
        """GLUE file stem -> fairseq split name (``dev_mismatched`` -> ``valid1``)."""
        kind = "test" if stem.startswith("test") else "valid" if stem.startswith("dev") else "train"
        siblings = [s for s in self.columns if s.startswith(stem.split("_")[0])]
        index = siblings.index(stem)
        return kind + (str(index) if index else "")


TASKS = {t.name: t for t in [
    GlueTask("CoLA", {"train": 4, "dev": 4, "test": 2}, (4,), (2,), 2, BINARY,
             headerless=("train", "dev")),
    GlueTask("SST-2", {"train": 2, "dev": 2, "test": 2}, (1,), (2,), 2, BINARY),
    GlueTask("MRPC", {"train": 5, "dev": 5, "test": 5}, (4, 5), (4, 5), 1, BINARY),
    GlueTask("STS-B", {"train": 10, "dev": 10, "test": 9}, (8, 9), (8, 9), 10, None),
    GlueTask("QQP", {"train": 6, "dev": 6, "test": 3}, (4, 5), (2, 3), 6, BINARY,
             drop_malformed=("train", "dev")),
    GlueTask("MNLI", {"train": 12, "dev_matched": 16, "dev_mismatched": 16,
                      "test_matched": 10, "test_mismatched": 10},
             (9, 10), (9, 10), 12, ("contradiction", "entailment", "neutral"), dev_label=16),
    GlueTask("QNLI", {"train": 4, "dev": 4, "test": 3}, (2, 3), (2, 3), 4, NLI2),
    GlueTask("RTE", {"train": 4, "dev": 4, "test": 3}, (2, 3), (2, 3), 4, NLI2),
]}


def read_rows(task, stem, path):
    """``(line number, fields)`` of a GLUE file, header skipped, every row checked."""
    expected = task.columns[stem]
    dropped = []
    for _, first, lines in read_batches(path, desc=f"{task.name} {path.name}", newline="\n"):
        for lineno, line in enumerate(lines, start=first):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != expected:
                if stem in task.drop_malformed:
                    dropped.append(lineno)
                    continue
                raise DataError(
                    f"{task.name} {path.name} line {lineno}: expected {expected} tab-separated "
                    f"columns, found {len(fields)}: {line.strip()[:100]!r}"
                )
            if lineno == 1 and stem not in task.headerless:
                continue
            yield lineno, fields
    if dropped:
        logger.warning(
            f"{task.name} {path.name}: dropped {len(dropped)} rows without {expected} columns "
            f"(as fairseq's preprocess_GLUE_tasks.sh), lines {dropped[:10]}"
            + (" ..." if len(dropped) > 10 else "")
        )


def check_label(task, path, lineno, value):
    value = value.strip()
    if task.regression:
        try:
            score = float(value)
        except ValueError:
            score = None
        if score is None or not 0.0 <= score <= 5.0:
            raise DataError(f"{task.name} {path.name} line {lineno}: score {value!r} is not a "
                            "number from 0 to 5")
        return "%.6g" % (score / 5.0)  # what the script's `awk '{print $1 / 5.0}'` prints
    if value not in task.labels:
        raise DataError(f"{task.name} {path.name} line {lineno}: label {value!r} is not one of "
                        f"{', '.join(task.labels)}")
    return value


def _encode_texts(job):
    index, texts = job
    encoder = worker_state()["encoder"]
    return index, [encoder.encode(t) for t in texts]


def binarize_texts(outputs, encoder, workers=1):
    """``[(prefix, texts), ...]``: each list of texts into ``<prefix>.{bin,idx}``, one sample
    per text, all encoded by one pool of workers; returns the writers (their counts)."""
    unk = encoder.dictionary.unk()
    writers = [IndexedWriter(prefix, len(encoder.dictionary), unk) for prefix, _ in outputs]
    jobs = ((i, texts[k: k + 1000]) for i, (_, texts) in enumerate(outputs)
            for k in range(0, len(texts), 1000))
    for i, encoded in ordered_map(_encode_texts, jobs, workers, {"encoder": encoder}):
        for ids in encoded:
            writers[i].add(ids)
    for writer in writers:
        writer.finalize("the GLUE file has no row")
    return writers


def task_files(task, glue_dir) -> Dict[str, Path]:
    """``{stem: path}`` of the task's tsv files in ``glue_dir``."""
    folder = Path(glue_dir) / task.name
    return {stem: folder / f"{stem}.tsv" for stem in task.columns}


def missing_files(task, glue_dir) -> Optional[str]:
    """What of the task's train and dev files ``glue_dir`` lacks, in one line, or None."""
    files = task_files(task, glue_dir)
    missing = [f.name for stem, f in files.items()
               if not f.is_file() and not stem.startswith("test")]
    if not missing:
        return None
    return (f"{task.name}: {Path(glue_dir) / task.name} has no {', '.join(missing)} (the GLUE "
            f"layout is <glue-dir>/{task.name}/{{{','.join(task.columns)}}}.tsv)")


def task_inputs(task, glue_dir, encoder):
    """What binarizing ``task`` reads: its tsv files and the encoder's files."""
    return [*task_files(task, glue_dir).values(), *encoder.inputs]


def prepare_task(task, glue_dir, destdir, encoder, workers=1, overwrite=False):
    """Binarize one task into ``destdir`` (its ``<TASK>-bin`` folder); returns row counts."""
    files = task_files(task, glue_dir)
    missing = missing_files(task, glue_dir)
    if missing:
        raise DataError(missing)
    inputs = {}  # fairseq split -> list of columns, each a list of texts
    labels = {}
    for stem, path in files.items():
        if not path.is_file():
            logger.warning(f"{task.name}: no {path.name}, no test split")
            continue
        split = task.fairseq_split(stem)
        test = stem.startswith("test")
        columns = task.test_inputs if test else task.inputs
        label_column = task.dev_label if stem.startswith("dev") and task.dev_label else task.label
        inputs[split] = [[] for _ in columns]
        if not test:
            labels[split] = []
        for lineno, fields in read_rows(task, stem, path):
            for texts, column in zip(inputs[split], columns):
                texts.append(fields[column - 1])
            if not test:
                labels[split].append(check_label(task, path, lineno, fields[label_column - 1]))
        if not inputs[split][0]:
            raise DataError(f"{task.name} {path.name} has no rows")

    with atomic_directory(destdir, overwrite, task_inputs(task, glue_dir, encoder)) as out:
        for k in range(len(task.inputs)):
            (out / f"input{k}").mkdir()
            encoder.dictionary.save(str(out / f"input{k}" / "dict.txt"))
        outputs = [(split, out / f"input{k}" / split, columns[k])
                   for split, columns in inputs.items() for k in range(len(columns))]
        writers = binarize_texts([(prefix, texts) for _, prefix, texts in outputs], encoder,
                                 workers)
        tokens, unk = Counter(), Counter()  # per split, every input column together
        for (split, _, _), writer in zip(outputs, writers):
            tokens[split] += writer.tokens
            unk[split] += writer.unk
        (out / "label").mkdir()
        if task.regression:
            for split, values in labels.items():
                (out / "label" / f"{split}.label").write_text("".join(v + "\n" for v in values))
        else:
            counts = Counter(labels["train"])
            counts[EOS_WORD] += len(labels["train"])
            label_encoder = WordEncoder(dictionary_from_counts(counts))
            label_encoder.dictionary.save(str(out / "label" / "dict.txt"))
            binarize_texts([(out / "label" / split, values) for split, values in labels.items()],
                           label_encoder)
        rows = {split: len(columns[0]) for split, columns in inputs.items()}
        save_json(out / "stats.json", {"task": task.name, "rows": rows,
                                        "tokens": dict(tokens), "unk": dict(unk),
                                        "source": {s: str(p) for s, p in files.items()}})
    return rows


def prepare(glue_dir, destdir, tasks, encoder, workers=1, overwrite=False,
            skip_existing=False):
    """Binarize ``tasks`` (names, or ``["ALL"]``) into ``<destdir>/<TASK>-bin``; returns the
    row counts of each task built (``skip_existing`` leaves an existing one as it is)."""
    names = [name for given in tasks for name in str(given).split(",") if name]  # CoLA,SST-2
    names = list(TASKS) if names == ["ALL"] else names
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        raise DataError(f"unknown GLUE task {unknown}; choose from {', '.join(TASKS)} or ALL")
    # every task's outputs and inputs checked before any is written: no half-done folder
    names = [name for name in names if not refuse_existing(
        Path(destdir) / f"{name}-bin", overwrite, task_inputs(TASKS[name], glue_dir, encoder),
        skip_existing)]
    missing = [found for found in (missing_files(TASKS[n], glue_dir) for n in names) if found]
    if missing:
        present = [n for n in names if missing_files(TASKS[n], glue_dir) is None]
        raise DataError("; ".join(missing) + (
            "; give --tasks the tasks you have: --tasks " + " ".join(present)
            + " (examples/glue/prepare.sh: those names after OUT)" if present else ""))
    return {name: prepare_task(TASKS[name], glue_dir, Path(destdir) / f"{name}-bin", encoder,
                               workers, overwrite)
            for name in names}


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_alibi.preprocess.glue", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--glue-dir", required=True, help="folder with one folder per task")
    parser.add_argument("--tasks", nargs="+", default=["ALL"],
                        help=f"some of {' '.join(TASKS)} (spaces or commas), or ALL (the "
                        "default)")
    parser.add_argument("--destdir", required=True, help="writes <destdir>/<TASK>-bin")
    parser.add_argument("--workers", type=int, default=1)
    add_output_arguments(parser, "an existing <TASK>-bin")
    add_encoder_arguments(parser)
    args = parser.parse_args(argv)
    encoder = encoder_from_args(args)
    built = prepare(args.glue_dir, args.destdir, args.tasks, encoder, args.workers,
                    args.overwrite, args.skip_existing)
    for task, rows in built.items():
        print(f"{task}: " + ", ".join(f"{split} {n}" for split, n in rows.items()))
    if built:
        print(f"wrote {args.destdir}")


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
