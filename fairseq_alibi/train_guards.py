"""What ``fairseq-train`` would restore wrongly without a word, refused before training:

* a ``--restore-file`` (``checkpoint.restore_file``) that names no file, or a first launch's
  ``--continue-once`` file: stock fairseq logs "No existing checkpoint found" and trains from a
  random initialisation to the end, exit status 0, so a misspelt pre-trained model gives a
  collapsed fine-tuning that looks like a result (the default, ``checkpoint_last.pt`` in the
  save dir, is a resume that may rightly find nothing);
* a checkpoint saved mid-epoch by another number of workers: fairseq counts the position in
  the epoch in batches of one worker, so the run would train on other batches than the one it
  continues (repeating or skipping data); ``fairseq-alibi checkpoints set-world-size`` rewrites
  the position, ``--reset-dataloader`` starts the epoch over;
* workers started with different ALiBi options (the CPU recipe starts each rank by hand):
  their gradients are averaged into one model that none of them describes;
* the training of a checkpoint continued (its optimizer state kept) with another value of an
  option the weights learned with (the variant, global tokens, learned scales:
  ``trained_only``): the run would go on training its model as another one;
* an ``--alibi-attention`` backend that cannot train the model on the device it trains on
  (``flash`` or ``flex`` on a CPU, ``fold`` or ``windowed`` on CUDA): each layer refuses it
  when put in training mode, but that is after the training data loaded; here it is before;
* ``--keep-best-checkpoints`` with a ``--checkpoint-suffix`` holding ``_``: fairseq reads each
  kept file's score after the last ``_`` of its name, so its second save fails, an epoch or
  interval of training after the start.
"""

import functools
import os
from typing import Optional, Tuple

#: fairseq's default ``--restore-file``: the save dir's ``checkpoint_last{suffix}.pt``
DEFAULT_RESTORE_FILE = "checkpoint_last.pt"


def suffix_flag(suffix: str) -> str:
    """`` --checkpoint-suffix=S`` as a command line takes it (``=``: a suffix may start with
    ``-``, as fairseq's ``-shard0``), ``""`` without one."""
    return f" --checkpoint-suffix={suffix}" if suffix else ""


def last_checkpoint_name(suffix: str = "") -> str:
    """The file a run with ``--checkpoint-suffix suffix`` resumes from, in its save dir."""
    return f"checkpoint_last{suffix}.pt"


def read_as(restore: str, suffix: str) -> str:
    """The file fairseq reads for ``--restore-file restore`` (it adds the suffix before
    ``.pt``)."""
    return restore.replace(".pt", f"{suffix}.pt") if suffix else restore


def restore_file_argument(path, suffix: str) -> str:
    """What to give ``--restore-file`` for the file ``path`` of a run with ``suffix`` (fairseq
    adds the suffix before ``.pt`` itself)."""
    path = str(path)
    ending = f"{suffix}.pt"
    return path[:-len(ending)] + ".pt" if suffix and path.endswith(ending) else path


def _is_file(path: str) -> bool:
    """As fairseq's trainer asks (its ``PathManager``: a path of another file system too)."""
    from fairseq.file_io import PathManager

    return PathManager.isfile(path)


def restore_file_refusal(restore: Optional[str], suffix: str = "",
                         named: str = "--restore-file ") -> Optional[str]:
    """Why ``restore`` cannot be restored from (``named``: how the user gave it), or None.
    fairseq reads ``restore`` with ``--checkpoint-suffix`` before its ``.pt``."""
    if restore is None or os.path.basename(restore) == DEFAULT_RESTORE_FILE:
        return None  # a resume, by name or by path, which a first launch rightly misses
    path = read_as(restore, suffix)
    if _is_file(path):
        return None
    read = f" (read as {path}, with{suffix_flag(suffix)})" if path != restore else ""
    return _no_such_file(f"{named}{restore}", read)


def _no_such_file(given: str, read: str = "") -> str:
    return (f"{given}: no such file{read} (from {os.getcwd()}); fairseq would train from a "
            "random initialisation. Give the path of the checkpoint to start from")


def kept_best_refusal(cfg, suffix: str) -> Optional[str]:
    """Why ``--keep-best-checkpoints`` cannot work with the run's ``suffix`` (the user's
    ``--checkpoint-suffix`` and what fairseq adds: ``-model_part-N`` of model parallelism),
    or None."""
    kept = getattr(cfg, "keep_best_checkpoints", 0) or 0
    if kept <= 0 or "_" not in suffix or getattr(cfg, "no_save", False):
        return None
    given = getattr(cfg, "checkpoint_suffix", "") or ""
    fix = (f"give a suffix without '_' (e.g.{suffix_flag(given.replace('_', '-'))}) or "
           "drop --keep-best-checkpoints" if "_" in given else
           "fairseq's model-parallel suffix holds one: drop --keep-best-checkpoints")
    return (f"--keep-best-checkpoints {kept} with the checkpoint suffix {suffix}: fairseq reads "
            "each kept checkpoint's score after the last '_' of its file name, so its second "
            f"save would fail; {fix}")


def _continued_once(cfg, suffix: str) -> Optional[str]:
    """``--continue-once``'s file where fairseq reads it: a first launch (no last checkpoint)
    without a ``--restore-file`` of its own; None otherwise."""
    once = getattr(cfg, "continue_once", None)
    if once is None or cfg.restore_file != DEFAULT_RESTORE_FILE:
        return None
    return None if _is_file(os.path.join(cfg.save_dir, last_checkpoint_name(suffix))) else once


def continue_once_refusal(cfg, suffix: str) -> Optional[str]:
    """Why the ``--continue-once`` file a first launch starts from cannot be read, or None."""
    once = _continued_once(cfg, suffix)
    if once is None or _is_file(once):
        return None
    return _no_such_file(f"--continue-once {once}")


def _restored_path(cfg, suffix: str) -> str:
    """The file fairseq's ``load_checkpoint`` reads (its own rule)."""
    if cfg.restore_file == DEFAULT_RESTORE_FILE:
        once = _continued_once(cfg, suffix)
        return once if once is not None else os.path.join(cfg.save_dir,
                                                          last_checkpoint_name(suffix))
    return read_as(cfg.restore_file, suffix)


def saved_workers(state) -> Tuple[int, int]:
    """``(data-parallel workers, model-parallel size)`` a checkpoint's ``state`` was saved by
    (its config; an argparse-era checkpoint's ``args``)."""
    if state.get("cfg") is not None:
        workers = state["cfg"]["distributed_training"]["distributed_world_size"]
        parallel = state["cfg"]["common"].get("model_parallel_size", 1)
    else:
        workers = state["args"].distributed_world_size
        parallel = getattr(state["args"], "model_parallel_size", 1)
    return int(workers), int(parallel or 1)


def _restored(cfg, suffix: str) -> Tuple[str, Optional[dict]]:
    """``(path, state)``: the file fairseq's ``load_checkpoint`` reads, read once for the
    guards, memory-mapped (``None``: no local file the safe loader reads, which fairseq's own
    load reports)."""
    from fairseq_alibi.safe_loading import read_mapped

    path = _restored_path(cfg, suffix)
    return path, (read_mapped(path) if os.path.isfile(path) else None)


def _saved_position(state: Optional[dict]):
    """``(workers, batches into the epoch, epoch)`` a checkpoint's ``state`` was saved at, or
    None where it cannot say (unread; model-parallel)."""
    try:
        position = state["extra_state"]["train_iterator"]
        workers, parallel = saved_workers(state)
    except Exception:  # noqa: BLE001 - a guard never replaces fairseq's own error
        return None
    if parallel != 1:
        return None
    return workers, int(position.get("iterations_in_epoch", 0) or 0), position.get("epoch")


def world_size_refusal(cfg, trainer, suffix: str, restored=None) -> Optional[str]:
    """Why the checkpoint this run resumes from would put it at another batch of the epoch
    (saved mid-epoch by another number of workers), or None (``restored``: :func:`_restored`,
    read here if not given)."""
    workers = getattr(trainer, "data_parallel_world_size", None)
    if workers is None or getattr(cfg, "reset_dataloader", False):
        return None
    path, state = restored or _restored(cfg, suffix)
    saved = _saved_position(state)
    if saved is None or not saved[1] or saved[0] == workers:
        return None
    last = last_checkpoint_name(suffix)
    if os.path.abspath(path) == os.path.abspath(os.path.join(cfg.save_dir, last)):
        fix = (f"run `fairseq-alibi checkpoints set-world-size {cfg.save_dir} {workers}"
               f"{suffix_flag(suffix)}` first, which rewrites the position "
               "(docs/reliability.md), or pass --reset-dataloader to start the epoch over")
    else:
        given = ("--continue-once" if cfg.restore_file == DEFAULT_RESTORE_FILE
                 else "--restore-file")
        fix = ("pass --reset-dataloader to start the epoch over, or copy it as "
               f"{cfg.save_dir}/{last}, run `fairseq-alibi checkpoints set-world-size "
               f"{cfg.save_dir} {workers}{suffix_flag(suffix)}` and resume without {given}")
    return (f"{path} was saved {saved[1]} batches into epoch {saved[2]} by {saved[0]} "
            f"worker(s), and this run has {workers}: fairseq counts that position in batches of "
            f"one worker, so the run would train on other batches than the one it continues; "
            f"{fix}")


def package_options(trainer) -> dict:
    """The package's options of the trainer's model, ``{key: value}`` (what the guards compare
    with the checkpoint's and between the workers)."""
    from fairseq_alibi.config_access import plain_cfg
    from fairseq_alibi.options import is_our_key

    return {k: v for k, v in plain_cfg(trainer.cfg.model).items() if is_our_key(k)}


def resumed_options_refusal(cfg, trainer, suffix: str, restored=None) -> Optional[str]:
    """Why the run would continue the training of a checkpoint (its optimizer state kept: a
    resume, ``--restore-file`` or ``--continue-once`` without ``--reset-optimizer``) whose
    model learned with another value of an option the weights learned with (declared
    ``trained_only``), or None: a new phase (``--reset-optimizer``, fairseq's
    ``--finetune-from-model``) may change them (``restored``: as :func:`world_size_refusal`)."""
    if getattr(cfg, "reset_optimizer", False):
        return None
    path, state = restored or _restored(cfg, suffix)
    if state is None:
        return None
    from fairseq_alibi import options
    from fairseq_alibi.config_access import cfg_get
    from fairseq_alibi.models.override_keys import model_name_of_config, saved_model_config

    saved = saved_model_config(state)
    name = model_name_of_config(trainer.cfg.model)
    if saved is None or model_name_of_config(saved) != name:  # fairseq's own error, if any
        return None
    change = options.trained_change(package_options(trainer),
                                    lambda key: cfg_get(saved, key, None), name)
    if change is None:
        return None
    flag, _, was, wanted = change
    said = (f"{path} was trained with {flag} {was}, and this run has {flag} {wanted}: it would "
            f"go on training that model as another one; give {flag} {was}")
    if _weights_refused(trainer, state, flag):
        return (f"{said} (the checkpoint's weights do not fit {flag} {wanted}, so a new phase, "
                "--reset-optimizer or --finetune-from-model, cannot start from them either)")
    return (f"{said}, or start a new phase with --reset-optimizer (or --finetune-from-model, "
            "in another --save-dir), where the checkpoint's weights fit the new options")


def _weights_refused(trainer, state, flag: str) -> bool:
    """Whether the model being trained refuses the checkpoint's weights for option ``flag`` by
    its own load-time checks (a new phase could not start from them either), run on a copy of
    their key table (a refusal for another reason is the load's own to say)."""
    from fairseq_alibi.error_hints import CheckpointMismatchError

    model = trainer.get_model() if hasattr(trainer, "get_model") else None
    weights = state.get("model")
    if model is None or not isinstance(weights, dict):
        return False
    try:
        model.upgrade_state_dict(dict(weights))
    except CheckpointMismatchError as e:
        return flag in str(e)
    except Exception:  # noqa: BLE001 - a guard never replaces fairseq's own error
        return False
    return False


def rank_options_refusal(trainer) -> Optional[str]:
    """Why the workers of this run cannot train one model: the first of the package's model
    options on which a worker differs from the first (every worker calls this, as each calls
    ``load_checkpoint``), or None."""
    if (getattr(trainer, "data_parallel_world_size", 1) or 1) <= 1:
        return None
    import torch.distributed as dist

    from fairseq_alibi.config_access import flag_of_key

    mine = {k: repr(v) for k, v in package_options(trainer).items()
            if k != "alibi_attention"}  # that picks a kernel, not a model
    every = [None] * trainer.data_parallel_world_size
    dist.all_gather_object(every, mine, group=trainer.data_parallel_process_group)
    for rank, theirs in enumerate(every):
        differ = sorted(k for k in set(theirs) | set(every[0])
                        if theirs.get(k) != every[0].get(k))
        if differ:
            key = differ[0]
            return (f"worker {rank} has {flag_of_key(key)} {theirs.get(key, 'unset')}, "
                    f"worker 0 {every[0].get(key, 'unset')}: the workers would train one model "
                    "that none of them describes; give every worker the same options")
    return None


def backend_refusal(trainer) -> None:
    """Raise the refusal of an ``--alibi-attention`` backend that cannot train a layer of the
    trainer's model on the device it trains on (:meth:`check_trainable` of each layer)."""
    device = getattr(getattr(trainer, "device", None), "type", None)
    model = trainer.get_model() if hasattr(trainer, "get_model") else None
    for module in () if model is None else model.modules():
        check = getattr(module, "check_trainable", None)
        if check is not None:
            check(device)


def refuse_training_start(cfg, trainer) -> None:
    """Raise a refusal of the module doc's list for this run, if any (the backend's first,
    then the workers' options, then those of the files it would restore)."""
    from fairseq_alibi.error_hints import OneLineError

    suffix = getattr(trainer, "checkpoint_suffix", "") or ""
    backend_refusal(trainer)
    refusal = (rank_options_refusal(trainer)
               or restore_file_refusal(getattr(cfg, "restore_file", None), suffix)
               or continue_once_refusal(cfg, suffix) or kept_best_refusal(cfg, suffix))
    if refusal is None:  # the file fairseq restores, read once for both
        restored = _restored(cfg, suffix)
        refusal = (resumed_options_refusal(cfg, trainer, suffix, restored)
                   or world_size_refusal(cfg, trainer, suffix, restored))
    if refusal is not None:
        raise OneLineError(refusal)


def guard_training_start():
    """Wrap ``fairseq.checkpoint_utils.load_checkpoint`` (what ``fairseq-train`` calls to
    resume or start from ``--restore-file``) to refuse what the module doc lists (idempotent)."""
    from fairseq import checkpoint_utils

    from fairseq_alibi.error_hints import OneLineError
    from fairseq_alibi.exit_cleanup import exit_refusing_worker

    stock = checkpoint_utils.load_checkpoint
    if getattr(stock, "_guards_training_start", False):
        return

    @functools.wraps(stock)
    def load_checkpoint(cfg, trainer, **kwargs):
        try:
            refuse_training_start(cfg, trainer)
        except OneLineError as error:
            exit_refusing_worker(error, trainer)  # a CLI worker ends here, cleanly
            raise
        return stock(cfg, trainer, **kwargs)

    load_checkpoint._guards_training_start = True
    checkpoint_utils.load_checkpoint = load_checkpoint
