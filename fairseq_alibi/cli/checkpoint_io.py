"""What every converter shares (stock and fork checkpoints, Hugging Face): reading a fairseq
checkpoint, its model configuration of any era, one error type, atomic writes; and the one
"this checkpoint holds no language model" refusal of the tools that read one.

``convert_checkpoints``, ``forks`` and ``hf_export_import`` import this module; it imports none
of them (no import circle).
"""

import os
import warnings
from pathlib import Path
from typing import Optional, Tuple

import torch

from fairseq_alibi.error_hints import folder_given, not_a_checkpoint
from fairseq_alibi.files import atomic_directory


class ConversionError(ValueError):
    """The checkpoint cannot be converted; the message says why and what to do."""


def placeholder_dictionary(size: int):
    """A fairseq Dictionary of ``size`` symbols (only its size matters to build the model)."""
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    while len(dictionary) < size:
        dictionary.add_symbol(f"<placeholder_{len(dictionary)}>")
    if len(dictionary) != size:
        raise ConversionError(f"the embedding has {size} rows, fewer than fairseq's specials")
    return dictionary


class PlaceholderTask:
    """What ``build_model`` reads of a task: the dictionaries (only their sizes matter)."""

    def __init__(self, source, target=None):
        self.source_dictionary = source
        self.target_dictionary = target if target is not None else source

    def max_positions(self):
        return None


def build_model(model_cfg, task):
    """The model a (converted) configuration describes, for ``task`` (a
    :class:`PlaceholderTask`); the configuration is left as it was."""
    import copy

    from fairseq import models

    import fairseq_alibi  # noqa: F401  (registers the models)

    return models.build_model(copy.deepcopy(model_cfg), task)


def model_config(state) -> object:
    """The model configuration of a loaded checkpoint, or a clear error if it has none."""
    if not isinstance(state, dict) or "model" not in state:
        raise ConversionError("not a fairseq checkpoint (no 'model' weights in it)")
    cfg = state.get("cfg")
    if cfg is None or cfg.get("model") is None:
        raise ConversionError(
            "this checkpoint has no model configuration ('cfg' or 'args'), so the architecture "
            "cannot be known; it was not written by fairseq-train"
        )
    return cfg["model"]


def read_checkpoint(path) -> dict:
    """Load a fairseq checkpoint to the CPU, or a one-line :class:`ConversionError` saying why not."""
    from fairseq import checkpoint_utils

    import fairseq_alibi  # noqa: F401  (models; torch >= 2.6 loading of fairseq checkpoints)

    source = Path(path)
    if source.is_dir():
        raise ConversionError(folder_given(source))
    if not source.is_file():
        raise ConversionError(f"no checkpoint at {source}")
    repair = f"`fairseq-alibi checkpoints repair {source.parent}`"
    if source.stat().st_size == 0:
        raise ConversionError(
            f"cannot read {source}: the file is empty (0 bytes; an interrupted save?). Use an "
            f"intact copy, or restore the save directory's last good checkpoint with {repair}"
        )
    with warnings.catch_warnings():  # torch's note on a pickle's protocol: the error says why
        warnings.filterwarnings("ignore", message="Detected pickle protocol")
        return _load_or_explain(source, checkpoint_utils.load_checkpoint_to_cpu, repair)


def _load_or_explain(source: Path, load, repair: str) -> dict:
    try:
        return load(str(source))
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same advice
        what = not_a_checkpoint(source)
        if what:
            raise ConversionError(what) from e
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "weights only load failed" in reason.lower():  # never torch's advice to load unsafely
            reason = "torch's safe loader refuses what it holds"
        if isinstance(e, EOFError) or "zip archive" in reason or "central directory" in reason:
            raise ConversionError(
                f"cannot read {source} as a fairseq checkpoint: the file is truncated or "
                f"damaged ({reason}). Use an intact copy, or restore the save directory's last "
                f"good checkpoint with {repair}"
            ) from e
        raise ConversionError(
            f"cannot read {source} as a fairseq checkpoint: {reason}") from e


def write_atomically(state, target: Path, flag: str = ""):
    """Write ``state`` to ``target`` (``.tmp``, then a rename), or a one-line
    :class:`ConversionError` naming ``flag`` (the option that gave ``target``) when the location
    cannot be written."""
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, str(tmp))
        os.replace(tmp, target)
    except (OSError, RuntimeError) as e:  # torch.save says RuntimeError for an unopenable file
        reason = " ".join(str(e).split()) or type(e).__name__
        reason = reason.split("strerror: ")[-1]  # torch.save's: "[enforce fail at ...] ..."
        where = f"{flag} {target}".strip()
        raise ConversionError(f"{where}: cannot write there ({reason}); give a writable "
                              "location") from None
    finally:
        if tmp.exists():
            tmp.unlink()


def refuse_unconverted_fork(state, path):
    """A :class:`ConversionError` when ``state`` (read from ``path``) is an unconverted
    checkpoint of EIFY's or Press's ALiBi fork, which this plugin's tools would misread: "convert
    it first". The same detection as the stock models' guard
    (:mod:`fairseq_alibi.models.stock_guards`), which ``fairseq-validate`` and the hub stop at."""
    from fairseq_alibi.config_access import architecture_of, cfg_get
    from fairseq_alibi.models import checks

    model_cfg = cfg_get(state.get("cfg"), "model") if isinstance(state, dict) else None
    if model_cfg is None:
        return
    arch = architecture_of(model_cfg)
    if arch in checks.FORK_ARCHITECTURES or any(cfg_get(model_cfg, k)
                                                for k in checks.FORK_MODEL_OPTIONS):
        raise ConversionError(f"{path}: {checks.unconverted_fork_error(model_cfg, arch)}")
    task_cfg = cfg_get(state.get("cfg"), "task")
    found = [k for k in checks.FORK_TASK_OPTIONS if cfg_get(task_cfg, k) is not None]
    if found:
        raise ConversionError(
            f"{path}: this checkpoint was written by EIFY's ALiBi fork ({found[0]} in its task "
            "config, which stock fairseq's tasks do not have): convert it first with "
            "`fairseq-alibi convert --input CHECKPOINT --output CONVERTED.pt` "
            "(docs/migrating.md), then give the converted file")
    try:
        checks.refuse_unconverted_press_checkpoint(state, path)
    except ValueError as e:
        raise ConversionError(str(e)) from None


def read_model_checkpoint(path, why_masked_lm: str) -> dict:
    """:func:`read_checkpoint`, then the refusals every tool that reads a model shares: an
    unconverted fork checkpoint (:func:`refuse_unconverted_fork`), and an encoder trained with
    another task than ``masked_lm`` (a fine-tuned classifier), whose refusal says
    ``why_masked_lm`` (what the tool reads of a pretrained encoder)."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.models.roberta import RobertaModel

    from fairseq_alibi.config_access import architecture_of, cfg_get

    state = read_checkpoint(path)
    refuse_unconverted_fork(state, path)
    arch = architecture_of(model_config(state))
    model_class = ARCH_MODEL_REGISTRY.get(arch) or MODEL_REGISTRY.get(arch) or object
    trained = cfg_get(cfg_get(state.get("cfg"), "task"), "_name")
    if issubclass(model_class, RobertaModel) and trained != "masked_lm":
        # the fine-tuning run's config records where it started (--restore-file, or
        # --finetune-from-model)
        saved = cfg_get(state.get("cfg"), "checkpoint")
        started = cfg_get(saved, "finetune_from_model") or cfg_get(saved, "restore_file")
        named = (f" ({started}, which it was fine-tuned from)"
                 if started and started != "checkpoint_last.pt" else "")
        raise ConversionError(
            f"{path} holds an encoder trained with the {trained} task: {why_masked_lm}; give "
            f"its masked_lm (pre-training) checkpoint{named}")
    return state


def atomic_folder(target):
    """:func:`fairseq_alibi.files.atomic_directory` for an ``--out`` folder: a file there, or a
    non-empty folder, is a :class:`ConversionError`."""
    if Path(target).exists() and not Path(target).is_dir():
        raise ConversionError(f"--out {target} is a file: give a folder to write (new or empty)")
    return atomic_directory(target, not_empty=lambda path: ConversionError(
        f"{path} exists and is not empty: choose another --out"))


def not_a_language_model(path, needs: str, forks: bool = False) -> Optional[str]:
    """Why checkpoint ``path`` is no language model's (a model that is not a language model: an encoder,
    a translation model; a file that is no checkpoint), or ``None``; ``needs``: what the
    calling tool reads (:func:`language_model_refusal`). ``forks``: also the "convert it first"
    of an unconverted ALiBi fork's checkpoint (Press's loads as a stock ``transformer_lm``,
    which fairseq-eval-lm would score without the fork's bias). The file is read once."""
    return read_language_model(path, needs, forks)[1]


def read_language_model(path, needs: str, forks: bool = False) -> Tuple[Optional[dict],
                                                                         Optional[str]]:
    """``(state, None)`` for a language model's checkpoint ``path``, else ``(state or None,
    why not)``: :func:`not_a_language_model` for a caller that reads the state too."""
    try:
        state = read_checkpoint(path)
        if forks:
            refuse_unconverted_fork(state, path)
    except ConversionError as exc:
        return None, str(exc) if str(exc).startswith(str(path)) else f"{path}: {exc}"
    return state, language_model_refusal(path, state, needs)


def language_model_refusal(path, state, needs: str) -> Optional[str]:
    """Why the checkpoint ``state`` (read from ``path``) holds no language model, ending with
    ``needs`` (what the calling tool reads, and where to give it), or ``None``."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY, FairseqLanguageModel

    from fairseq_alibi.config_access import architecture_of

    try:
        arch = architecture_of(model_config(state))
    except ConversionError as exc:
        return f"{path}: {exc}"
    model_class = ARCH_MODEL_REGISTRY.get(arch) or MODEL_REGISTRY.get(arch)
    if model_class is None or issubclass(model_class, FairseqLanguageModel):
        return None
    return (f"{path} holds a model of architecture {arch} ({model_class.__name__}), not a "
            f"language model: {needs}")
