"""The fix as the last line of a failed fairseq command, where fairseq buries or drops it.

Some failures reach the user through stock fairseq code that the plugin does not patch:

* fairseq's trainer re-raises *any* failure of ``load_state_dict`` (``--restore-file``,
  ``--finetune-from-model``) as ``Cannot load model parameters from checkpoint ...; please ensure
  that the architectures match``, so the plugin's own error naming the fix ends up in the middle
  of the traceback;
* a checkpoint file that is empty or cut short (a killed save, a full disk) fails inside
  ``torch.load`` with a bare ``EOFError`` or a zip error, without the file's name;
* a file that is no checkpoint (a text file, a safetensors file, a dict saved with
  ``torch.save``) fails with a bare ``KeyError`` or torch's safe-loader error, whose advice
  (loading unsafely) must not be followed; the hint says what the file is
  (:func:`not_a_checkpoint`);
* ``--tokens-per-sample 0`` given to ``fairseq-eval-lm`` (where the model, built from the
  checkpoint, never sees it) divides by zero while fairseq splits the data into blocks;
* a checkpoint of another size restored into the model being built (fine-tuning a
  custom-size encoder with the architecture's default sizes): torch's ``size mismatch for ...``
  sits a hundred lines above fairseq's ``please ensure that the architectures match``; the
  hint names the size flags the checkpoint was trained with.

Importing the package chains a ``sys.excepthook`` (:func:`install`) that lets Python print the traceback as
usual, then adds one line, prefixed ``fairseq_alibi:``, saying what went wrong and what to do.
An uncaught :class:`OneLineError` (the plugin's refusal of bad input, whose message already is
the fix, e.g. ``from_pretrained`` given a stock checkpoint) is printed as its one line instead.
It only reads the exception and its traceback; nothing else changes. ``fairseq-hydra-train``
never reaches the hook (hydra prints the error itself and exits), so the shipped configs' hydra
callback (:mod:`fairseq_alibi.hydra_support`) prints the traceback and then the same line, last,
when a single run fails (in a sweep, ``-m``, the line comes just before hydra's report).
"""

import os
import re
import sys
from typing import Iterator, Optional

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_PREFIX = "fairseq_alibi: "


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling, outermost first."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _frames(exc: BaseException):
    tb = exc.__traceback__
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def raised_by_plugin(exc: BaseException) -> bool:
    frames = list(_frames(exc))
    return bool(frames) and frames[-1].f_code.co_filename.startswith(_PACKAGE_DIR + os.sep)


#: how a torch file starts: a zip archive (torch >= 1.6) or a pickle (older torch)
_TORCH_MAGIC = (b"PK\x03\x04", b"\x80")
#: how the line on a file that is no fairseq checkpoint starts (as on a damaged one)
_CANNOT = "cannot read {} as a fairseq checkpoint:"
#: what to give instead of a file that is no fairseq checkpoint
_GIVE = "give the .pt file that fairseq-train wrote (e.g. <save-dir>/checkpoint_best.pt)"


def _is_safetensors(head: bytes, size: int) -> bool:
    """A safetensors file: an 8-byte little-endian header length, then the JSON header."""
    length = int.from_bytes(head[:8], "little") if len(head) >= 8 else 0
    return 0 < length <= size - 8 and head[8:9] == b"{"


def _is_text(head: bytes) -> bool:
    import codecs

    try:  # incremental: a multi-byte character cut at the end of ``head`` is fine
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return False
    return b"\0" not in head


def _loaded_kind(path) -> Optional[str]:
    """What a torch file that fairseq cannot read holds, loaded safely; None when it is a
    fairseq checkpoint or does not load (damaged: the callers say so)."""
    import pickle
    import zipfile

    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True,
                           mmap=zipfile.is_zipfile(path))
    except pickle.UnpicklingError as e:
        if "weights only load failed" not in str(e).lower():
            return None
        # never torch's advice to load it unsafely: a checkpoint must not be able to run code
        refused = re.search(r"Unsupported (global|operand)[^\n]*", str(e))
        return (f"{_CANNOT.format(path)} torch's safe loader refuses what it holds ("
                f"{refused.group(0).strip() if refused else 'more than tensors and settings'}), "
                f"and a checkpoint must not be able to run code when loaded; {_GIVE}")
    except Exception:  # noqa: BLE001 - truncated or corrupt: the callers' own message
        return None
    if isinstance(state, dict) and "model" in state and (
            "optimizer_history" in state or "best_loss" in state):
        return None
    held = f"a {type(state).__name__}"
    if isinstance(state, dict):
        held = ", ".join(repr(k) for k in list(state)[:4]) + (", ..." if len(state) > 4 else "")
    return (f"{_CANNOT.format(path)} it is a torch file without fairseq's keys ('model', "
            f"'optimizer_history'; it holds {held or 'an empty dict'}); {_GIVE}")


def not_a_checkpoint(path) -> Optional[str]:
    """One line: what file ``path`` is when it is no fairseq checkpoint, and what to give
    instead: a safetensors file, a text file, a torch file without fairseq's keys or that the
    safe loader refuses. None for a checkpoint, or a file that is damaged (truncated, empty) or
    unreadable. The one classifier of every tool that reads checkpoints, and of fairseq's own
    commands' hint (:func:`hint_for`)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    if _is_safetensors(head, size):
        return (f"{_CANNOT.format(path)} it is a safetensors file (a Hugging Face model's "
                "weights); import the model's folder with `fairseq-alibi import-hf FOLDER` and "
                "give the checkpoint it writes")
    if not head or head.startswith(_TORCH_MAGIC):
        return _loaded_kind(path) if head else None
    if _is_text(head):
        return f"{_CANNOT.format(path)} it is a text file, not a torch file; {_GIVE}"
    return None


def folder_given(folder) -> str:
    """What to say when a checkpoint's path is a folder: a file to give, from the ``.pt`` files
    in it (a save directory's ``checkpoint_last.pt`` first)."""
    folder = str(folder)
    found = sorted(name for name in os.listdir(folder)
                   if name.endswith(".pt") and os.path.isfile(os.path.join(folder, name)))
    if not found:
        return (f"{folder} is a folder, with no .pt file in it: give the checkpoint file that "
                "fairseq-train wrote (e.g. <save-dir>/checkpoint_last.pt)")
    first = next((n for n in ("checkpoint_last.pt", "checkpoint_best.pt") if n in found), found[0])
    listed = ", ".join(found[:6]) + (f", ... ({len(found)} in all)" if len(found) > 6 else "")
    return (f"{folder} is a folder: give a checkpoint file in it, e.g. "
            f"{os.path.join(folder, first)} (.pt files there: {listed})")


def _unreadable_checkpoint(exc: BaseException) -> Optional[str]:
    """The hint for an exception raised in fairseq's loader by a file that is no checkpoint
    (:func:`not_a_checkpoint`), or while torch read a damaged checkpoint."""
    path, in_torch_load = None, False
    for frame in _frames(exc):
        code = frame.f_code
        if code.co_name == "load_checkpoint_to_cpu" and code.co_filename.endswith(
                os.path.join("fairseq", "checkpoint_utils.py")):
            path = frame.f_locals.get("path")
        elif path is not None and os.sep + "torch" + os.sep in code.co_filename:
            in_torch_load = True
    if path is None:
        return None
    path = str(path)
    if os.path.isdir(path):  # a save folder given as the checkpoint: IsADirectoryError
        return folder_given(path)
    what = not_a_checkpoint(path)
    if what:
        return what
    if not in_torch_load:
        return None
    try:
        size = os.path.getsize(path)
    except OSError:
        size = None
    what = "is empty (0 bytes)" if size == 0 else "cannot be read: it is truncated or corrupt"
    save_dir = os.path.dirname(os.path.abspath(path))
    if os.path.basename(path) != "checkpoint_last.pt":  # the one file repair restores
        return (f"checkpoint {path} {what}; give an intact checkpoint (`fairseq-alibi "
                f"checkpoints check {save_dir}` lists those of its folder)")
    return (f"checkpoint {path} {what}, as an interrupted save leaves it; "
            f"`fairseq-alibi checkpoints repair {save_dir}` restores checkpoint_last.pt "
            f"from the newest intact checkpoint (`... check {save_dir}` lists them)")


def _zero_block_size(exc: BaseException) -> Optional[str]:
    """fairseq's blocks of ``--tokens-per-sample`` tokens (less fairseq-eval-lm's
    ``--context-window``) fail on a size below 1 with a bare ``ZeroDivisionError`` (0),
    ``negative dimensions are not allowed`` or, on a split of few tokens, ``IndexError``."""
    if not isinstance(exc, (ZeroDivisionError, ValueError, IndexError)) or (
            isinstance(exc, ValueError) and "negative dimensions" not in str(exc)):
        return None
    block, window = None, 0
    for frame in _frames(exc):
        code = frame.f_code
        if code.co_filename.endswith(os.path.join("fairseq_cli", "eval_lm.py")):
            eval_lm = getattr(frame.f_locals.get("cfg"), "eval_lm", None)
            window = getattr(eval_lm, "context_window", 0) or 0
        if code.co_name == "__init__" and code.co_filename.endswith(
                os.path.join("fairseq", "data", "token_block_dataset.py")):
            block = frame.f_locals.get("block_size")
    if not isinstance(block, int) or block > 0:
        return None
    if window > 0:  # fairseq-eval-lm scored blocks of tokens_per_sample - context_window
        return (f"--tokens-per-sample {block + window} must be larger than --context-window "
                f"{window}: fairseq-eval-lm scores tokens-per-sample minus context-window new "
                f"tokens a block, e.g. --tokens-per-sample {2 * window} --context-window "
                f"{window}")
    return (f"--tokens-per-sample must be at least 1 (the tokens of one block), got {block}; "
            "ALiBi models evaluate at any length, e.g. --tokens-per-sample 512")


def _sample_over_max_tokens(exc: BaseException) -> Optional[str]:
    """fairseq's batching asserts that no sample is longer than ``--max-tokens`` (a language
    model's block of ``--tokens-per-sample`` tokens, a sentence or pair of the other tasks)."""
    found = re.search(r"Sentences lengths should not exceed max_tokens=(\d+)", str(exc))
    if not isinstance(exc, AssertionError) or found is None:
        return None
    return (f"--max-tokens {found.group(1)} is smaller than a sample (a language model's: a "
            "block of --tokens-per-sample tokens; a translation's or a classifier's: its "
            "longest input): fairseq batches whole samples; raise --max-tokens")


def _option_of_another_task(exc: BaseException) -> Optional[str]:
    """A model option that is a task's (``model.tokens_per_sample: ${task.tokens_per_sample}``,
    a language model's) under a task that lacks it (``sentence_prediction``): omegaconf's
    ``InterpolationKeyError`` under a 30-frame traceback, before any model code runs."""
    found = re.match(r"Interpolation key 'task\.(\w+)' not found", str(exc))
    key = getattr(exc, "full_key", None)
    if type(exc).__name__ != "InterpolationKeyError" or found is None or \
            not str(key or "").startswith("model."):
        return None
    line = (f"the model's option {key} is the task's {found.group(1)}, which this --task does "
            "not declare: the architecture belongs with another task")
    if found.group(1) == "tokens_per_sample":
        line += ("; it is a language model (--task language_modeling); a classifier "
                 "(--task sentence_prediction) is fine-tuned from an encoder (--arch "
                 "alibi_roberta_base, or fairseq's roberta_*), a translation model is --arch "
                 "alibi_transformer")
    return line


def _no_task(exc: BaseException) -> Optional[str]:
    """A command whose parser has no default task (``fairseq-validate``) given no ``--task``:
    fairseq's parser looks the task up as ``None``, a bare ``KeyError: None``."""
    if not (isinstance(exc, KeyError) and exc.args == (None,)):
        return None
    if not any(f.f_code.co_name == "parse_args_and_arch" for f in _frames(exc)):
        return None
    return ("no --task given, and this command has no default: give the task the checkpoint "
            "was trained with, e.g. --task language_modeling (a translation model: --task "
            "translation; an encoder: --task masked_lm or sentence_prediction)")


def _padded_batch_in_eval_lm(exc: BaseException) -> Optional[str]:
    """``fairseq-eval-lm --pad-to-fixed-bsz``: the last batch is filled with dummy rows, whose
    ids its scoring loop reads as samples' (``IndexError``)."""
    if not isinstance(exc, IndexError):
        return None
    for frame in _frames(exc):
        cfg = frame.f_locals.get("cfg") if frame.f_code.co_name == "main" else None
        if cfg is not None and frame.f_code.co_filename.endswith(
                os.path.join("fairseq_cli", "eval_lm.py")):
            task = getattr(cfg, "task", None)  # a language_modeling task option
            if task is not None and getattr(task, "pad_to_fixed_bsz", False):
                return ("--pad-to-fixed-bsz fills the last batch with dummy rows, which "
                        "fairseq-eval-lm scores as samples: drop it (a perplexity does not "
                        "depend on the batch size)")
    return None


def _not_a_language_model(exc: BaseException) -> Optional[str]:
    """The language_modeling task (fairseq-eval-lm, fairseq-interactive) given a model that is
    not a language model (a translation model, an encoder) fails on an attribute only language
    models have: the line names the task, whichever tool ran it."""
    lacks = isinstance(exc, AttributeError) and "supported_targets" in str(exc)
    other = isinstance(exc, ValueError) and "Unsupported language modeling target" in str(exc)
    if not (lacks or other):  # (an encoder has the attribute, without the LM's targets)
        return None
    for frame in _frames(exc):
        if frame.f_code.co_name == "build_model" and "model" in frame.f_locals:
            model = type(frame.f_locals["model"]).__name__
            return (f"--path holds a model of class {model}, not a language model, which "
                    "--task language_modeling reads; a translation model is read with --task "
                    "translation (fairseq-generate, fairseq-interactive; scored by "
                    "fairseq-validate or fairseq-generate --score-reference)")
    return None


def translation_dictionaries(folder) -> list:
    """The per-side dictionaries (``dict.fr.txt``, ``dict.en.txt``) of a binarized folder that
    has no ``dict.txt``: a translation folder, where a language model's task reads ``dict.txt``
    (``[]`` for any other folder)."""
    folder = str(folder)
    if not os.path.isdir(folder) or os.path.isfile(os.path.join(folder, "dict.txt")):
        return []
    return sorted(name for name in os.listdir(folder)
                  if name.startswith("dict.") and name.endswith(".txt"))


def _translation_folder(exc: BaseException) -> Optional[str]:
    """A language model's task (``fairseq-eval-lm``, or ``fairseq-validate`` of an LM
    checkpoint, whose task it reads from the checkpoint) given a translation folder fails on
    the ``dict.txt`` it lacks: a bare ``FileNotFoundError``."""
    missing = getattr(exc, "filename", None) if isinstance(exc, FileNotFoundError) else None
    if not missing or os.path.basename(str(missing)) != "dict.txt":
        return None
    folder = os.path.dirname(str(missing)) or "."
    pairs = translation_dictionaries(folder)
    if not pairs:
        return None
    return (f"{folder} is a translation folder ({', '.join(pairs)}), and the checkpoint's "
            f"task reads a language model's {missing}: give a language model's data folder "
            "(fairseq-preprocess --only-source), or a translation checkpoint with --task "
            "translation")


def overrides_not_a_dict(given, where: str = "--model-overrides") -> str:
    """The line for load-time overrides ``given`` (as the user wrote them) that are no dict."""
    return (f"{where} takes a Python dict of option names, e.g. "
            f"\"{{'alibi_window_cutoff': 8}}\" (quoted for the shell), got {given}")


def _bad_model_overrides(exc: BaseException) -> Optional[str]:
    """fairseq's commands ``eval`` the text of ``--model-overrides``: one that is not a Python
    dict fails there with a bare ``SyntaxError`` or ``NameError``."""
    if not isinstance(exc, (SyntaxError, NameError)):
        return None
    for frame in _frames(exc):
        overrides = getattr(getattr(frame.f_locals.get("cfg"), "common_eval", None),
                            "model_overrides", None)
        if overrides is not None and os.sep + "fairseq_cli" + os.sep in frame.f_code.co_filename:
            return overrides_not_a_dict(overrides)
    return None


_SIZE_MISMATCH = re.compile(
    r"size mismatch for ([\w.]+): copying a param with shape torch\.Size\(\[([\d, ]*)\]\) "
    r"from checkpoint, the shape in current model is torch\.Size\(\[([\d, ]*)\]\)")
#: what the model options that size a network are called (layers, widths, heads)
_SIZE_OPTIONS = re.compile(r"(^|_)(layers|embed_dim|ffn_embed_dim|attention_heads|input_dim|"
                           r"output_dim)$")


def _options(model_cfg) -> dict:
    """A model configuration (argparse or OmegaConf) as a plain dict; {} if unreadable."""
    if model_cfg is None:
        return {}
    if hasattr(model_cfg, "__dict__") and not hasattr(model_cfg, "keys"):
        return dict(vars(model_cfg))
    try:
        return {k: model_cfg.get(k) for k in model_cfg.keys()}
    except Exception:  # noqa: BLE001 - a hint must never fail
        return {}


def _trainer_loading(exc: BaseException) -> Optional[dict]:
    """The locals of fairseq's ``Trainer.load_checkpoint`` on ``exc``'s traceback (a resume,
    ``--restore-file``, ``--finetune-from-model``), or None."""
    for frame in _frames(exc):
        code = frame.f_code
        if code.co_name == "load_checkpoint" and code.co_filename.endswith(
                os.path.join("fairseq", "trainer.py")):
            return frame.f_locals
    return None


def _architecture_mismatch(exc: BaseException) -> Optional[str]:
    """A checkpoint restored by fairseq's trainer into an architecture of another model (an
    ``alibi_roberta`` checkpoint given ``--arch roberta_base``, or the reverse): no size flag
    fixes that, the architecture does."""
    loading = _trainer_loading(exc)
    if loading is None or not isinstance(exc, RuntimeError):
        return None
    from fairseq.models import ARCH_MODEL_REGISTRY

    try:
        saved = _options(loading["state"]["cfg"]["model"])
        built = _options(loading["self"].cfg.model)
    except Exception:  # noqa: BLE001 - a hint must never fail
        return None
    saved_arch, built_arch = (o.get("_name") or o.get("arch") for o in (saved, built))
    models = [ARCH_MODEL_REGISTRY.get(str(a)) for a in (saved_arch, built_arch)]
    if None in models or models[0] is models[1] or not any(
            m.__module__.startswith("fairseq_alibi") for m in models):
        return None  # two stock models may share their weights' names: the size hint's
    return (f"the checkpoint is a --arch {saved_arch} model ({models[0].__name__}) and the "
            f"model being built is --arch {built_arch} ({models[1].__name__}): their weights "
            f"differ in kind, not in size; build it with --arch {saved_arch} (or another "
            f"architecture of {models[0].__name__}) and the options it was trained with")


def _size_mismatch(exc: BaseException) -> Optional[str]:
    """The hint for a checkpoint of another size restored by fairseq's trainer: the first
    mismatching weight, and the size options of the checkpoint that differ from the model's."""
    found = _SIZE_MISMATCH.search(str(exc)) if isinstance(exc, RuntimeError) else None
    if found is None:
        return None
    name, saved_shape, built_shape = found.groups()
    flags, loading = [], _trainer_loading(exc) or {}
    try:
        saved = _options(loading["state"]["cfg"]["model"])
        built = _options(loading["self"].cfg.model)
    except Exception:  # noqa: BLE001 - a hint must never fail
        saved = built = {}
    for key, value in saved.items():
        if _SIZE_OPTIONS.search(key) and isinstance(value, int) and \
                not isinstance(value, bool) and built.get(key) != value:
            flags.append(f"--{key.replace('_', '-')} {value}")
    what = (f"the checkpoint's model has other sizes than the one being built ({name}: "
            f"[{saved_shape}] in the checkpoint, [{built_shape}] built)")
    if flags:
        return f"{what}: build it with the sizes it was trained with, add {' '.join(flags)}"
    return (f"{what}: give the size flags it was trained with (--encoder-layers, "
            "--encoder-embed-dim, --encoder-ffn-embed-dim, --encoder-attention-heads, ...)")


def _optimizer_mismatch(exc: BaseException) -> Optional[str]:
    """A resume whose model has other parameters than the checkpoint's optimizer state (a learned
    ALiBi parameter added, e.g. ``--alibi-learned-scales`` on a run trained without): the model
    loads (a new parameter starts at its initial value), then torch's optimizer fails with a
    bare ``ValueError`` about its parameter group."""
    if not isinstance(exc, ValueError) or "doesn't match the size of optimizer's group" not in \
            str(exc):
        return None
    loading = _trainer_loading(exc) or {}
    try:
        count = sum(len(g["params"]) for g in loading["last_optim_state"]["param_groups"])
        built = [n for n, p in loading["self"].model.named_parameters() if p.requires_grad]
    except Exception:  # noqa: BLE001 - a hint must never fail
        return None
    alibi = [n for n in built if ".alibi." in n or n.startswith("alibi.")]
    learned = f" (its learned ALiBi parameters: {', '.join(alibi[:3])})" if alibi else ""
    return (f"the checkpoint's optimizer state holds {count} parameters and the model being "
            f"built has {len(built)}{learned}: resume with the options the run was trained "
            "with, or start a new phase from the checkpoint with --reset-optimizer (or "
            "--finetune-from-model CKPT into a new --save-dir)")


def _in_fairseq(exc: BaseException, name: str) -> bool:
    """Whether fairseq's module ``name`` (``trainer.py``) is on ``exc``'s traceback."""
    return any(frame.f_code.co_filename.endswith(os.path.join("fairseq", name))
               for frame in _frames(exc))


def _environment(exc: BaseException) -> Optional[str]:
    """Stock fairseq failing on what this machine lacks, with a misleading last line: half
    precision on the CPU, numpy 2 under fairseq's compiled extensions, two copies of this
    package (a ``--user-dir`` of another one than Python imports)."""
    text = str(exc)
    if isinstance(exc, AttributeError) and "xla_device" in text and _in_fairseq(exc, "trainer.py"):
        return ("--bf16 on the CPU: stock fairseq-train takes it for a TPU run; train in bf16 on "
                "the CPU with fairseq-hydra-train (common.bf16=true common.cpu=true), or drop "
                "--bf16 (docs/reliability.md)")
    if isinstance(exc, AssertionError) and "not compiled with CUDA" in text:
        return ("--fp16 (or --cuda) needs a GPU: this torch runs on the CPU only; on the CPU, "
                "train in float32 (drop --fp16; with fairseq-hydra-train, whose GLUE configs set "
                "fp16: true, add common.fp16=false common.cpu=true) or in bf16 with "
                "fairseq-hydra-train (common.fp16=false common.bf16=true common.cpu=true)")
    if isinstance(exc, ImportError) and "Please build Cython components" in text:
        try:
            import numpy
        except ImportError:  # noqa: BLE001 - a hint must never fail
            return None
        if int(numpy.__version__.split(".")[0]) >= 2:
            return (f"fairseq 0.12's compiled parts need numpy < 2, and numpy "
                    f"{numpy.__version__} is installed: pip install 'numpy<2'")
    found = re.search(r"--user-dir=(\S+) because the corresponding module name \((\w+)\) is "
                      r"not globally unique", text) if isinstance(exc, ImportError) else None
    if found is not None and found.group(2) == "fairseq_alibi":
        return (f"--user-dir {found.group(1)} is another copy of fairseq_alibi than the one "
                f"Python imports ({_PACKAGE_DIR}): give --user-dir {_PACKAGE_DIR} (what "
                "python -m fairseq_alibi --user-dir prints outside the other copy's folder), or "
                "install that copy (pip install -e its checkout)")
    return None


class OneLineError(ValueError):
    """Bad input whose message is the whole story (what is wrong and the fix): an uncaught one
    is printed as that one line, without the traceback, by this module's hook and by IPython."""

    def _render_traceback_(self):  # IPython / Jupyter's hook for an exception's own display
        return [one_line(self)]


class CheckpointMismatchError(OneLineError):
    """A checkpoint the model being built cannot load (other options, sizes, dictionary, kind):
    the message names what was saved and the flags that build the model it needs."""


def one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def hint_for(exc: BaseException) -> Optional[str]:
    """The one-line hint for an uncaught exception, or None when it says all there is."""
    if isinstance(exc, OneLineError):  # the refusal itself is the line
        return one_line(exc)
    chain = list(_chain(exc))
    for cause in chain[1:]:  # the plugin's own error, buried under another
        if isinstance(cause, ValueError) and raised_by_plugin(cause):
            return one_line(cause)
    for found in chain:
        hint = (_unreadable_checkpoint(found) or _zero_block_size(found)
                or _sample_over_max_tokens(found)
                or _architecture_mismatch(found) or _size_mismatch(found)
                or _not_a_language_model(found) or _option_of_another_task(found)
                or _no_task(found) or _padded_batch_in_eval_lm(found)
                or _bad_model_overrides(found) or _translation_folder(found)
                or _optimizer_mismatch(found) or _environment(found))
        if hint:
            return hint
    return None


def hint_line(exc: BaseException) -> Optional[str]:
    """The hint for ``exc`` as the line printed (``fairseq_alibi: ...``), or None."""
    try:
        hint = hint_for(exc) if exc is not None else None
    except Exception:  # noqa: BLE001 - a hint must never hide the original error
        hint = None
    return _PREFIX + " ".join(hint.split()) if hint else None


def report(exc: BaseException):
    """Print the hint for ``exc`` (if any) as one line on stderr."""
    line = hint_line(exc)
    if line:
        print(line, file=sys.stderr, flush=True)


def _excepthook(exc_type, exc, tb, _previous=sys.excepthook):
    if isinstance(exc, OneLineError):
        print(one_line(exc), file=sys.stderr, flush=True)
        return
    _previous(exc_type, exc, tb)
    report(exc)


def install():
    """Chain the hook to ``sys.excepthook``; idempotent."""
    if getattr(sys.excepthook, "__name__", None) != _excepthook.__name__ or \
            getattr(sys.excepthook, "__module__", None) != __name__:
        previous = sys.excepthook

        def hook(exc_type, exc, tb):
            _excepthook(exc_type, exc, tb, _previous=previous)

        hook.__name__, hook.__module__ = _excepthook.__name__, __name__
        sys.excepthook = hook
