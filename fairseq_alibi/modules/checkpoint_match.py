"""What a checkpoint was trained with against the model being built: one comparison, one error.

fairseq builds a model from options and then loads a state dict into it; a state dict written
by a model built otherwise (another variant, head count, ``--alibi-heads``, learned scales, ...)
either fails deep inside ``load_state_dict`` or, worse, loads and computes something else.
Every family (``models/checks.py``: :func:`~fairseq_alibi.models.checks.check_saved_stacks`,
``alibi_roberta``'s saved record, the cross-attention pointer) and the bias module's own load
hook compare what was saved with what is built here and refuse with :func:`mismatch`, the one
error, which names the flag that builds the model the checkpoint needs::

    this checkpoint was trained with <saved>; the model being built has <built>: build it with <fix>

An ALiBi stack's tensors (``<stack>.alibi.slopes``, ``.future_slope_ratio``, ``.scales``) say
part of its options (:class:`StackRecord`): the head count, which heads carry a bias, whether the
slopes are ``one_sided``'s, whether the variant is ``asymmetric``, the learned scales' shape.
What they cannot tell apart (``causal``/``symmetric``/``offset`` share Press's slopes; slopes
set by hand) loads as saved.
"""

import contextlib
import contextvars
import re
from dataclasses import dataclass
from typing import Iterable, List, Optional, Tuple

import torch

from fairseq_alibi.alibi import variant_slopes
from fairseq_alibi.config_access import flag_of_key
from fairseq_alibi.error_hints import CheckpointMismatchError


#: the load-time override keys of the checkpoint being loaded, and what they are called
#: (``--model-overrides``; the hub's keyword arguments): :func:`loading_with_overrides`
_OVERRIDDEN: contextvars.ContextVar = contextvars.ContextVar("overridden", default=((), ""))


@contextlib.contextmanager
def loading_with_overrides(keys: Iterable[str], where: str):
    """Within this context a model is built for a checkpoint loaded with the load-time
    overrides ``keys`` (named ``where``): a :func:`mismatch` that one of them causes says to
    drop it, where the flags that build the model are no option of the loading tool."""
    token = _OVERRIDDEN.set((tuple(keys), where))
    try:
        yield
    finally:
        _OVERRIDDEN.reset(token)


def mismatch(saved: str, built: str, fix: str) -> CheckpointMismatchError:
    """The one error of every family: what the checkpoint was trained with (``saved``), what
    the model being built has (``built``), and the flags that build the right one (``fix``);
    or, where a load-time override builds the other model, the override to drop.
    A :class:`~fairseq_alibi.error_hints.CheckpointMismatchError` (a ``ValueError``): an
    uncaught one is its line alone, where fairseq's tools load the checkpoint themselves;
    under fairseq-train's ``--restore-file``, which buries it, ``error_hints`` repeats it
    last."""
    keys, where = _OVERRIDDEN.get()
    given = [k for k in keys if re.search(
        re.escape(flag_of_key(k)) + r"(?![\w-])", f"{saved} {built}")]
    if given:
        return CheckpointMismatchError(
            f"this checkpoint was trained with {saved}; {', '.join(given)} in {where} builds "
            f"{built}: drop {'it' if len(given) == 1 else 'them'} from {where} (the "
            f"checkpoint's weights hold what it was trained with)")
    return CheckpointMismatchError(
        f"this checkpoint was trained with {saved}; the model being built has {built}: "
        f"build it with {fix}")


@dataclass(frozen=True)
class StackRecord:
    """What an ALiBi stack's tensors say about the options it was built with."""

    heads: int  # the attention heads (the slopes' length)
    biased_heads: Optional[int]  # --alibi-heads K: the first K heads carry a bias; None: all
    slopes: str  # "one_sided" (each half its own set), "press" (Press's, of the biased heads),
    # "other" (set by hand, or computed elsewhere): what the variant shows of itself
    asymmetric: bool  # a future_slope_ratio: the asymmetric variant
    scales: Optional[Tuple[int, ...]]  # the learned scales' shape (layers or 1, heads or 1)
    # asymmetric's future-slope ratio per head: saved, or built fixed (a built learnable one,
    # None, starts from its option's value and loads the ratios it learned)
    ratios: Optional[Tuple[float, ...]] = None

    @classmethod
    def of(cls, slopes: torch.Tensor, ratio: Optional[torch.Tensor],
           scales: Optional[torch.Tensor], ratio_learned: bool = False):
        slopes = slopes.detach().float().cpu()
        heads = slopes.numel()
        biased = int(slopes.ne(0).sum())
        kind = "other"
        if heads % 2 == 0 and biased == heads and torch.equal(
                slopes, variant_slopes(heads, "one_sided")):
            kind = "one_sided"
        elif biased and torch.equal(slopes, variant_slopes(heads, "causal", biased)):
            kind = "press"
        ratios = (None if ratio is None or ratio_learned
                  else tuple(ratio.detach().float().cpu().tolist()))
        return cls(heads, biased if biased < heads else None, kind, ratio is not None,
                   None if scales is None else tuple(scales.shape), ratios)

    @classmethod
    def saved(cls, state_dict, prefix: str) -> Optional["StackRecord"]:
        """The record of the stack saved under ``prefix`` (``decoder.alibi.``), ``None`` if
        the checkpoint holds no slopes there."""
        slopes = state_dict.get(f"{prefix}slopes")
        if slopes is None:
            return None
        return cls.of(slopes, state_dict.get(f"{prefix}future_slope_ratio"),
                      state_dict.get(f"{prefix}scales"))

    @classmethod
    def built(cls, alibi) -> "StackRecord":
        """The record of a built :class:`~fairseq_alibi.modules.bias.AlibiBias`."""
        ratio = alibi.future_slope_ratio
        return cls.of(alibi.slopes, ratio, alibi.scales,
                      ratio_learned=isinstance(ratio, torch.nn.Parameter))


def scale_mode(shape: Tuple[int, ...]) -> str:
    """The ``--alibi-learned-scales`` mode that saves scales of ``shape``."""
    rows, cols = shape
    return {(True, True): "per_layer_head", (True, False): "per_layer",
            (False, True): "per_head", (False, False): "shared"}[(rows > 1, cols > 1)]


def stack_differences(saved: StackRecord, built: StackRecord, variant: str, prefix: str,
                      flag: str, heads_flag: Optional[str]) -> List[Tuple[str, str, str]]:
    """``(saved, built, fix)`` phrases of every option in which the stack saved under ``prefix``
    (``decoder.alibi.``) differs from the built one (of variant ``variant``); ``flag`` the
    stack's flag prefix (``--alibi``, ``--encoder-alibi``), ``heads_flag`` its attention heads'
    flag (``None``: not known)."""
    found = []
    slopes = f"({prefix}slopes)"
    if saved.heads != built.heads:
        fix = f"{heads_flag} {saved.heads}" if heads_flag else \
            f"the {saved.heads} attention heads it was trained with"
        found.append((f"{saved.heads} attention heads {slopes}",
                      f"{built.heads} attention heads", fix))
    if saved.biased_heads != built.biased_heads:
        def heads(k):
            return f"{flag}-heads {k}" if k else f"a bias on every head (no {flag}-heads)"
        found.append((f"{heads(saved.biased_heads)} {slopes}", heads(built.biased_heads),
                      f"{flag}-heads {saved.biased_heads}" if saved.biased_heads
                      else f"no {flag}-heads"))
    one_sided = variant == "one_sided"
    trained_with = f"the {flag}-variant it was trained with (saved in its options)"
    if (saved.slopes == "one_sided" and not one_sided) or (one_sided and saved.slopes == "press"):
        found.append((f"{flag}-variant one_sided {slopes}" if not one_sided
                      else f"another {flag}-variant than one_sided (Press's slopes: {prefix}slopes)",
                      f"{flag}-variant {variant}",
                      f"{flag}-variant one_sided" if not one_sided else trained_with))
    elif saved.asymmetric != built.asymmetric:
        found.append((f"{flag}-variant asymmetric ({prefix}future_slope_ratio)" if saved.asymmetric
                      else f"another {flag}-variant than asymmetric (no {prefix}future_slope_ratio)",
                      f"{flag}-variant {variant}",
                      f"{flag}-variant asymmetric" if saved.asymmetric else trained_with))
    elif (saved.asymmetric and built.ratios is not None and saved.ratios is not None
          and saved.ratios != built.ratios):
        found.append(_ratio_difference(saved.ratios, built.ratios, prefix, flag))
    if saved.scales is not None and saved.scales != built.scales:
        def scales(shape):
            return f"{flag}-learned-scales {scale_mode(shape)} (scales {'x'.join(map(str, shape))}"

        mode = scale_mode(saved.scales)
        fix = f"{flag}-learned-scales {mode}"
        if built.scales is not None and scale_mode(built.scales) == mode and \
                saved.scales[0] != built.scales[0]:  # the same mode over another layer count
            fix += f" and {saved.scales[0]} layers"
        found.append((f"{scales(saved.scales)}: {prefix}scales)",
                      f"{flag}-learned-scales none" if built.scales is None
                      else f"{scales(built.scales)})", fix))
    return found


def _ratio_difference(saved, built, prefix: str, flag: str) -> Tuple[str, str, str]:
    """The phrases of a fixed future-slope ratio (``asymmetric``) other than the saved one,
    which would load over the option and compute the saved ratio under the option's name:
    the saved ratio's option, or, for ratios that differ by head (learned), the option that
    learns them (they load as saved)."""
    def ratio(values):
        return f"{flag}-future-slope-ratio {values[0]:g}" if len(set(values)) == 1 \
            else f"future slope ratios {', '.join(f'{v:.4g}' for v in values)}"

    fix = ratio(saved) if len(set(saved)) == 1 else f"{flag}-learnable-future-slopes"
    return f"{ratio(saved)} ({prefix}future_slope_ratio)", ratio(built), fix


def check_stack(state_dict, prefix: str, alibi, flag: str = "--alibi",
                heads_flag: Optional[str] = None):
    """:func:`mismatch` if the stack saved under ``prefix`` (``decoder.alibi.``) differs from the
    built ``alibi`` in anything its tensors show; a checkpoint without slopes there passes (the
    families say what a stack without slopes is: :mod:`fairseq_alibi.models.checks`)."""
    saved = StackRecord.saved(state_dict, prefix)
    if saved is None:
        return
    found = stack_differences(saved, StackRecord.built(alibi), alibi.variant, prefix, flag,
                              heads_flag)
    if found:
        raise mismatch(", ".join(s for s, _, _ in found), ", ".join(b for _, b, _ in found),
                       " ".join(f for _, _, f in found))
