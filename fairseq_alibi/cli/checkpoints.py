"""Check a fairseq save directory and restore ``checkpoint_last.pt`` after an interrupted save.

fairseq writes the *first* file of a save atomically (``<name>.tmp``, then a rename), but gives
the other names of the same save (``checkpoint_last.pt`` after ``checkpoint_1_5000.pt`` or
``checkpoint3.pt``, and ``checkpoint_best.pt``) by copying that file in place. A job killed, or a
disk that fills up, during such a copy leaves a truncated ``checkpoint_last.pt``; the previous
one is gone, and restarting fails in ``torch.load`` (``PytorchStreamReader failed reading zip
archive``). The newest state is still intact in the file the copy was made from. ::

    fairseq-alibi checkpoints check  SAVE_DIR   # exit 1 if checkpoint_last is unusable
    fairseq-alibi checkpoints repair SAVE_DIR   # restore it from the newest intact file

A save dir with no checkpoint yet (or none at all) is fine for both: exit 0 and a one-line note,
so that a job script can run ``repair`` before every ``fairseq-train``.
    fairseq-alibi checkpoints set-world-size SAVE_DIR N  # resume with N workers

The last one exists because fairseq saves the position in the epoch in batches of one worker,
so a checkpoint saved mid-epoch resumes at the wrong batch with a different number of workers
(see :func:`set_world_size`).

``repair`` never deletes: the damaged file is kept beside it as ``checkpoint_last.pt.corrupt``
(``.corrupt.1``, ... if that exists), and the restored file is written as ``.tmp`` and renamed.
A file counts as intact when every record of its zip archive matches its CRC-32 (``torch.load``
alone does not check them: a flipped byte in a tensor loads silently) and ``torch.load`` reads
it, as fairseq does. This works for any fairseq checkpoint, not only ALiBi ones.
"""

import argparse
import os
import re
import shutil
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import torch

import fairseq_alibi  # noqa: F401  (fairseq checkpoints under torch.load(weights_only): registration.py)
from fairseq_alibi.error_hints import not_a_checkpoint
from fairseq_alibi.train_guards import (last_checkpoint_name, restore_file_argument,
                                         saved_workers, suffix_flag)


#: what a checkpoint that torch cannot read is, as fairseq's commands say it (error_hints.py)
DAMAGED = "truncated or corrupt"


class CheckpointError(Exception):
    """Nothing intact to restore from; the message names the folder and what to do."""


@dataclass
class CheckpointFile:
    path: Path
    error: Optional[str] = None  # None: intact
    epoch: Optional[int] = None
    num_updates: Optional[int] = None
    val_loss: Optional[float] = None  # the validation loss it was saved after (fairseq's)
    best: Optional[float] = None  # the best validation loss of the run so far

    @property
    def intact(self) -> bool:
        return self.error is None

    def describe(self) -> str:
        if self.error == "missing":
            return f"{self.path.name}: missing"
        if not self.intact:
            return f"{self.path.name}: DAMAGED ({self.error})"
        return f"{self.path.name}: intact (epoch {self.epoch} @ {self.num_updates} updates)"

    @property
    def numbered(self) -> bool:
        """A file of one save (``checkpoint3.pt``, ``checkpoint_3_60.pt``), not one of its
        copies (``checkpoint_last``, ``checkpoint_best``, ``checkpoint.best_loss_…``)."""
        return not self.path.name.startswith(("checkpoint_best", "checkpoint_last",
                                              "checkpoint."))


def inspect_checkpoint(path) -> CheckpointFile:
    """Whether ``path`` is an intact checkpoint, and the epoch/update count it was saved at."""
    path = Path(path)
    found = CheckpointFile(path)
    if not path.is_file():
        found.error = "missing"
        return found
    if path.stat().st_size == 0:
        found.error = "empty file, 0 bytes"
        return found
    try:
        if zipfile.is_zipfile(path):  # torch >= 1.6 format; older files are plain pickles
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
            if bad is not None:
                found.error = f"{DAMAGED}: record {bad} does not match its CRC-32"
                return found
        state = torch.load(path, map_location="cpu", mmap=zipfile.is_zipfile(path))
    except Exception as e:  # truncated archive, unreadable pickle, ...
        first_sentence = " ".join(str(e).split()).split(". ")[0][:200]
        # a file that is no checkpoint says what it is; any other failure is damage, however
        # torch words it (it depends on where the file was cut)
        found.error = (not_a_checkpoint(path)
                       or f"{DAMAGED}: {first_sentence or type(e).__name__}")
        return found
    if not isinstance(state, dict) or "model" not in state:
        found.error = not_a_checkpoint(path) or "not a fairseq checkpoint (no 'model' entry)"
        return found
    history = state.get("optimizer_history") or [{}]
    found.num_updates = int(history[-1].get("num_updates", 0))
    extra = state.get("extra_state") or {}
    position = extra.get("train_iterator") or {}
    found.epoch = position.get("epoch")
    if found.epoch and found.epoch > 1 and not position.get("iterations_in_epoch"):
        found.epoch -= 1  # saved at the end of an epoch: fairseq records the next one to run
    found.val_loss, found.best = extra.get("val_loss"), extra.get("best")
    return found


#: the names fairseq gives a run's checkpoints (``checkpoint_utils.save_checkpoint``), before
#: the ``--checkpoint-suffix``: epoch, update, best, last, and ``--keep-best-checkpoints``'
#: ``checkpoint.best_<metric>_<value>``
_NAMES = r"checkpoint(\d+|_\d+_\d+|_best|_last|\.best_\w+?_-?\d+(?:\.\d*)?)"


def saved_checkpoints(save_dir, suffix: str = "") -> List[Path]:
    """The checkpoints fairseq wrote in ``save_dir`` with ``--checkpoint-suffix suffix`` (not
    those of another suffix, nor ``.tmp`` files)."""
    pattern = re.compile(_NAMES + re.escape(suffix) + r"\.pt")
    return sorted(p for p in Path(save_dir).iterdir() if pattern.fullmatch(p.name))


def other_suffixes(save_dir: Path, suffix: str) -> List[str]:
    """The ``--checkpoint-suffix`` values of the checkpoints in ``save_dir`` other than
    ``suffix``'s (a forgotten suffix reads as a folder without checkpoints)."""
    pattern = re.compile(_NAMES + r"([^\d.].*)\.pt")  # not a digit: those are the names
    found = {m.group(2) for p in save_dir.iterdir() for m in [pattern.fullmatch(p.name)] if m}
    return sorted(found - {suffix})


def _no_checkpoint_note(save_dir: Path, suffix: str) -> str:
    others = other_suffixes(save_dir, suffix) if save_dir.is_dir() else []
    flag = suffix_flag(suffix)
    note = f"no checkpoint{' of' + flag if flag else ''} in {save_dir} yet"
    if others:
        note += (f" (it holds checkpoints of {', '.join(suffix_flag(o)[1:] for o in others)}: "
                 "give the run's suffix)")
    return note


def _no_checkpoint_yet(save_dir: Path, suffix: str) -> bool:
    """A run that has not saved yet: no folder (fairseq-train makes it) or no checkpoint in it."""
    if save_dir.exists() and not save_dir.is_dir():
        raise CheckpointError(f"{save_dir} is not a folder; give the --save-dir of the run")
    return not save_dir.exists() or not saved_checkpoints(save_dir, suffix)


def inspect_all(save_dir, suffix: str = "") -> Dict[str, CheckpointFile]:
    """Every ``checkpoint*{suffix}.pt`` of ``save_dir`` inspected once, by file name (each
    inspection loads the file: a repair reads them once, whatever it restores)."""
    return {p.name: inspect_checkpoint(p) for p in saved_checkpoints(save_dir, suffix)}


def _inspected(found: Dict[str, CheckpointFile], path: Path) -> CheckpointFile:
    return found.get(path.name) or inspect_checkpoint(path)  # absent: "missing"


def newest_intact(found: Dict[str, CheckpointFile], exclude=()) -> Optional[CheckpointFile]:
    """The intact checkpoint of ``found`` (:func:`inspect_all`) with the most updates (among
    equals a numbered one, which the copies ``checkpoint_best``/``checkpoint_last`` were made
    from, then the latest written)."""
    intact = [c for name, c in found.items() if name not in exclude and c.intact]
    if not intact:
        return None
    return max(intact, key=lambda c: (c.num_updates, c.numbered, c.path.stat().st_mtime))


def newer_than_last(found: Dict[str, CheckpointFile], last: CheckpointFile,
                    suffix: str = "") -> str:
    """A note when an intact checkpoint has more updates than an intact ``checkpoint_last``,
    which fairseq-train resumes from; ``""`` otherwise."""
    newest = newest_intact(found, exclude={last.path.name})
    if not last.intact or newest is None or newest.num_updates <= last.num_updates:
        return ""
    return (f"note: {newest.path.name} ({newest.num_updates} updates) is newer than "
            f"{last.path.name} ({last.num_updates}), which fairseq-train resumes from (a run "
            f"with --no-last-checkpoints does not update it; after a rollback that is "
            f"right): to go on from the newest, resume with --restore-file "
            f"{restore_file_argument(newest.path, suffix)}")


def _free_name(path: Path, ending: str) -> Path:
    target, n = path.with_name(path.name + ending), 0
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}{ending}.{n}")
    return target


def _replace_keeping(target: Path, new_tmp: Path, ending: str) -> Optional[Path]:
    """Atomically put ``new_tmp`` at ``target``; the old ``target`` stays as ``target+ending``."""
    kept = None
    if target.exists():
        kept = _free_name(target, ending)
        try:
            os.link(target, kept)  # no moment without a file at ``target``
        except OSError:  # a file system without hard links
            shutil.copyfile(target, kept)
    os.replace(new_tmp, target)
    return kept


def _fsynced(path: Path) -> Path:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
    return path


def repair(save_dir, suffix: str = "") -> str:
    """Make ``checkpoint_last{suffix}.pt`` intact again; return what was done, in one line.

    Does nothing if it is intact. Otherwise the damaged file (if any) is renamed to
    ``*.corrupt`` and the intact checkpoint with the most updates is copied in its place
    (through a ``.tmp`` file and a rename, so an interrupted repair leaves nothing half written).
    """
    save_dir = Path(save_dir)
    if _no_checkpoint_yet(save_dir, suffix):  # a job script runs this before the first save
        return f"nothing to repair: {_no_checkpoint_note(save_dir, suffix)}"
    last, found = save_dir / last_checkpoint_name(suffix), inspect_all(save_dir, suffix)
    state = _inspected(found, last)
    if state.intact:
        newer = newer_than_last(found, state, suffix)
        return (f"nothing to do: {state.describe()}" + _repair_best(save_dir, suffix, found)
                + (f"; {newer}" if newer else ""))
    source = newest_intact(found, exclude={last.name})
    if source is None:
        raise CheckpointError(
            f"no intact checkpoint in {save_dir} to restore {last.name} from "
            f"({state.error}); training from it would start from scratch"
        )
    unsaved = ("; a run with --no-last-checkpoints does not update it: resume such a run with "
               f"--restore-file {restore_file_argument(source.path, suffix)} instead"
               if state.error == "missing" else "")
    return (f"restored {last.name} from {source.path.name} "
            f"(epoch {source.epoch} @ {source.num_updates} updates)"
            f"{_restore(last, source.path, suffix)}{_repair_best(save_dir, suffix, found)}"
            f"{unsaved}")


def _restore(target: Path, source: Path, suffix: str) -> str:
    """Copy ``source`` over the damaged ``target`` (kept as ``.corrupt``); what was kept."""
    tmp = target.with_name(target.name + ".tmp")
    try:
        shutil.copyfile(source, tmp)
        _fsynced(tmp)
    except OSError as exc:  # a full disk, most often: the run that damaged the file met it too
        tmp.unlink(missing_ok=True)
        raise CheckpointError(
            f"could not write {tmp.name} in {target.parent} ({exc.strerror or exc}): restoring "
            f"{target.name} copies {source.name} ({source.stat().st_size / 2**20:,.1f} MiB); "
            f"free that much there and run repair again, or resume from it with --restore-file "
            f"{restore_file_argument(source, suffix)}") from None
    kept = _replace_keeping(target, tmp, ".corrupt")
    return f"; the damaged file is kept as {kept.name}" if kept else ""


def _repair_best(save_dir: Path, suffix: str, found: Dict[str, CheckpointFile]) -> str:
    """``checkpoint_best`` damaged by the same interrupted copy: restored from the intact
    checkpoint saved after the run's best validation loss (each checkpoint records both), or
    said to wait for fairseq's next better validation; ``""`` when it is intact or absent.
    ``found``: the folder's checkpoints as inspected before a repair of ``checkpoint_last``
    (which copies an intact one of them, so that what they record is unchanged)."""
    best = _inspected(found, save_dir / f"checkpoint_best{suffix}.pt")
    if best.intact or best.error == "missing":
        return ""
    intact = [c for name, c in found.items() if name != best.path.name and c.intact]
    recorded = max(intact, key=lambda c: c.num_updates).best if intact else None
    source = next((c for c in sorted(intact, key=lambda c: -c.num_updates)
                   if recorded is not None and c.val_loss == recorded), None)
    if source is None:
        return (f"; {best.path.name} is {best.error} and no intact checkpoint holds its "
                "validation loss: fairseq writes it again at the next better validation")
    return (f"; restored {best.path.name} from {source.path.name} (validation loss "
            f"{source.val_loss:.4g}){_restore(best.path, source.path, suffix)}")


def set_world_size(save_dir, world_size: int, suffix: str = "") -> str:
    """Prepare ``checkpoint_last{suffix}.pt`` for a run with ``world_size`` workers.

    fairseq saves the position in the epoch as ``iterations_in_epoch``, counted in batches *of
    one worker*: a checkpoint saved mid-epoch by ``W`` workers has used ``n·W`` batches of the
    epoch, and a run with ``W'`` workers that loads it unchanged skips ``n·W'`` (it repeats or
    drops data). This rewrites the count to ``n·W/W'`` (and the saved world size to ``W'``), so
    that the run continues at the same batch: with the same ``--max-tokens``/``--batch-size``
    per worker and data, ``W'`` workers then train exactly as ``W`` would have (use
    ``--update-freq`` to keep the global batch). The original stays beside it as
    ``checkpoint_last.pt.world<W>``.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise CheckpointError(f"the world size must be a positive whole number, got {world_size!r}")
    if _no_checkpoint_yet(Path(save_dir), suffix):
        return f"nothing to do: {_no_checkpoint_note(Path(save_dir), suffix)}"
    last = Path(save_dir) / last_checkpoint_name(suffix)
    found = inspect_checkpoint(last)
    if not found.intact:
        raise CheckpointError(f"{last} is {found.error}: run `fairseq-alibi checkpoints "
                              f"repair {save_dir}{suffix_flag(suffix)}` first")
    state = torch.load(last, map_location="cpu")
    old, model_parallel = saved_workers(state)
    if model_parallel != 1:
        raise CheckpointError(f"{last.name} is one part of a model-parallel run "
                              f"(--model-parallel-size {model_parallel}); this only moves "
                              "data-parallel checkpoints")
    position = (state.get("extra_state") or {}).get("train_iterator")
    if position is None:  # a converted or imported model: fairseq-train starts its epoch anew
        return (f"nothing to do: {last.name} holds no position in an epoch (not saved by "
                "fairseq-train's training loop): any number of workers starts it at the "
                "first batch")
    used = int(position.get("iterations_in_epoch", 0)) * old
    if old == world_size:
        return f"nothing to do: {last.name} was saved by {old} worker(s)"
    if used % world_size:
        raise CheckpointError(
            f"{last.name} was saved after {used} batches of epoch {position['epoch']}, which "
            f"{world_size} workers cannot split evenly; resume from a checkpoint saved at the end "
            f"of an epoch, or pass --reset-dataloader to fairseq-train (the epoch starts over)"
        )
    position["iterations_in_epoch"] = used // world_size
    if state.get("cfg") is not None:
        state["cfg"]["distributed_training"]["distributed_world_size"] = world_size
    else:  # argparse-era checkpoint
        state["args"].distributed_world_size = world_size
    tmp = last.with_name(last.name + ".tmp")
    torch.save(state, tmp)
    kept = _replace_keeping(last, _fsynced(tmp), f".world{old}")
    return (f"{last.name} now resumes with {world_size} worker(s) at batch {used} of epoch "
            f"{position['epoch']} (saved by {old}); the original is kept as {kept.name}")


def check(save_dir, suffix: str = ""):
    """``(ok, lines)``: ``ok`` when ``checkpoint_last{suffix}.pt`` is intact; a line per file."""
    save_dir = Path(save_dir)
    if _no_checkpoint_yet(save_dir, suffix):
        return True, [_no_checkpoint_note(save_dir, suffix)]
    found = inspect_all(save_dir, suffix)
    last = _inspected(found, save_dir / last_checkpoint_name(suffix))
    others = [c for name, c in found.items() if name != last.path.name]
    others.sort(key=lambda c: (c.intact, c.num_updates or 0), reverse=True)
    lines = [c.describe() for c in [last] + others]
    lines += [f"{p.name}: left by an interrupted save, safe to delete"
              for p in sorted(save_dir.glob("checkpoint*.pt.tmp"))]
    newest = newest_intact(found, exclude={last.path.name})
    if last.error == "missing" and newest is not None:
        lines.append(f"no {last.path.name}: fairseq-train would start from scratch (a run with "
                     f"--no-last-checkpoints writes none); resume with --restore-file "
                     f"{restore_file_argument(newest.path, suffix)}, or run `fairseq-alibi "
                     f"checkpoints repair {save_dir}{suffix_flag(suffix)}` to "
                     "copy it there")
    elif not last.intact:
        lines.append(f"checkpoint_last is unusable: run `fairseq-alibi checkpoints "
                     f"repair {save_dir}{suffix_flag(suffix)}` before restarting")
    else:
        lines += [line for line in [newer_than_last(found, last, suffix)] if line]
    best = next((c for c in others if c.path.name == f"checkpoint_best{suffix}.pt"), None)
    if best is not None and not best.intact:
        lines.append(f"checkpoint_best is unusable (resuming does not read it): `fairseq-alibi "
                     f"checkpoints repair {save_dir}{suffix_flag(suffix)}` restores it from "
                     "the checkpoint saved "
                     "after the best validation")
    return last.intact, lines


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="fairseq-alibi checkpoints",
        description="Check a fairseq --save-dir, or restore checkpoint_last.pt from the newest "
        "intact checkpoint after an interrupted save.",
    )
    parser.add_argument("command", choices=("check", "repair", "set-world-size"))
    parser.add_argument("save_dir", help="the --save-dir of the training run")
    parser.add_argument("world_size", nargs="?", type=int,
                        help="set-world-size only: the number of workers of the next run")
    parser.add_argument("--checkpoint-suffix", default="", help="as given to fairseq-train")
    args = parser.parse_args(argv)
    if (args.command == "set-world-size") != (args.world_size is not None):
        parser.error("give a world size with set-world-size, and only with it")
    try:
        if args.command == "repair":
            print(repair(args.save_dir, args.checkpoint_suffix))
            return 0
        if args.command == "set-world-size":
            print(set_world_size(args.save_dir, args.world_size, args.checkpoint_suffix))
            return 0
        ok, lines = check(args.save_dir, args.checkpoint_suffix)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
