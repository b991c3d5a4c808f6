"""The fix as the last line of a failed fairseq command, where fairseq buries or drops it.

Some failures reach the user through stock fairseq code that the plugin does not patch:

* fairseq's trainer re-raises *any* failure of ``load_state_dict`` (``--restore-file``,
  ``--finetune-from-model``) as ``Cannot load model parameters from checkpoint ...; please ensure
  that the architectures match``, so the plugin's own error naming the fix ends up in the middle
  of the traceback;
* a checkpoint file that is empty or cut short (a killed save, a full disk) fails inside
  ``torch.load`` with a bare ``EOFError`` or a zip error, without the file's name;
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
callback (:mod:`fairseq_alibi.hydra_support`) prints the same line when the job fails, just
before hydra's report.
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


def _unreadable_checkpoint(exc: BaseException) -> Optional[str]:
    """The hint for an exception raised while torch read a checkpoint in fairseq's loader."""
    path, in_torch_load = None, False
    for frame in _frames(exc):
        code = frame.f_code
        if code.co_name == "load_checkpoint_to_cpu" and code.co_filename.endswith(
                os.path.join("fairseq", "checkpoint_utils.py")):
            path = frame.f_locals.get("path")
        elif path is not None and os.sep + "torch" + os.sep in code.co_filename:
            in_torch_load = True
    if path is None or not in_torch_load:
        return None
    path = str(path)
    try:
        size = os.path.getsize(path)
    except OSError:
        size = None
    what = "is empty (0 bytes)" if size == 0 else "cannot be read: it is truncated or corrupt"
    save_dir = os.path.dirname(os.path.abspath(path))
    return (f"checkpoint {path} {what}, as an interrupted save leaves it; "
            f"`fairseq-alibi checkpoints repair {save_dir}` restores checkpoint_last.pt "
            f"from the newest intact checkpoint (`... check {save_dir}` lists them)")


def _zero_block_size(exc: BaseException) -> Optional[str]:
    if not isinstance(exc, ZeroDivisionError):
        return None
    for frame in _frames(exc):
        if frame.f_code.co_name == "__init__" and frame.f_code.co_filename.endswith(
                os.path.join("fairseq", "data", "token_block_dataset.py")):
            if frame.f_locals.get("block_size") == 0:
                return ("--tokens-per-sample must be at least 1 (the tokens of one block), got 0; "
                        "ALiBi models evaluate at any length, e.g. --tokens-per-sample 512")
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


def _size_mismatch(exc: BaseException) -> Optional[str]:
    """The hint for a checkpoint of another size restored by fairseq's trainer: the first
    mismatching weight, and the size options of the checkpoint that differ from the model's."""
    found = _SIZE_MISMATCH.search(str(exc)) if isinstance(exc, RuntimeError) else None
    if found is None:
        return None
    name, saved_shape, built_shape = found.groups()
    flags = []
    for frame in _frames(exc):
        code = frame.f_code
        if code.co_name == "load_checkpoint" and code.co_filename.endswith(
                os.path.join("fairseq", "trainer.py")):
            state, trainer = frame.f_locals.get("state"), frame.f_locals.get("self")
            try:
                saved = _options(state["cfg"]["model"])
                built = _options(trainer.cfg.model)
            except Exception:  # noqa: BLE001
                break
            for key, value in saved.items():
                if _SIZE_OPTIONS.search(key) and isinstance(value, int) and \
                        not isinstance(value, bool) and built.get(key) != value:
                    flags.append(f"--{key.replace('_', '-')} {value}")
            break
    what = (f"the checkpoint's model has other sizes than the one being built ({name}: "
            f"[{saved_shape}] in the checkpoint, [{built_shape}] built)")
    if flags:
        return f"{what}: build it with the sizes it was trained with, add {' '.join(flags)}"
    return (f"{what}: give the size flags it was trained with (--encoder-layers, "
            "--encoder-embed-dim, --encoder-ffn-embed-dim, --encoder-attention-heads, ...)")


class OneLineError(ValueError):
    """Bad input whose message is the whole story (what is wrong and the fix): an uncaught one
    is printed as that one line, without the traceback, by this module's hook and by IPython."""

    def _render_traceback_(self):  # IPython / Jupyter's hook for an exception's own display
        return [one_line(self)]


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
        hint = _unreadable_checkpoint(found) or _zero_block_size(found) or _size_mismatch(found)
        if hint:
            return hint
    return None


def report(exc: BaseException):
    """Print the hint for ``exc`` (if any) as one line on stderr."""
    try:
        hint = hint_for(exc) if exc is not None else None
    except Exception:  # noqa: BLE001 - a hint must never hide the original error
        hint = None
    if hint:
        print(_PREFIX + " ".join(hint.split()), file=sys.stderr, flush=True)


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
