"""Every ALiBi option, declared once: its name, help, default, choices, validation and where it
applies. The table of every flag this gives is docs/options.md (``python -m
fairseq_alibi.options_page`` writes it; a test fails when it is stale).

A model family does not declare ALiBi options of its own; it lists which declarations it has
and under which prefix, and they reach fairseq through fairseq's own dataclass-to-argparse
machinery (``gen_parser_from_dataclass``, or the model's config dataclass), and reach the layers
as one object (:func:`read`), never as ``getattr`` reads with local defaults:

* :class:`StackOptions`, a layer stack's, under ``alibi_`` (``alibi_transformer_lm``'s causal
  decoder: :data:`LM`; ``alibi_roberta``'s encoder: :data:`ENCODER`), ``encoder_alibi_`` and
  ``decoder_alibi_`` (``alibi_transformer``'s sides: :data:`TRANSLATION_ENCODER`,
  :data:`TRANSLATION_DECODER`);
* :class:`CrossOptions`, ``alibi_transformer``'s cross-attention and SHAPE, unprefixed.

Adding a field to :class:`StackOptions` adds the option to every family and side it applies to
(``docs/architecture.md``, "Where to add things"). A field's ``metadata``:

* ``help``;
* ``check``: a function of the value returning what is wrong with it (or ``None``), said after
  the flag's name (choices are checked from the field's type);
* ``needs`` (:class:`Needs`): the other option it does something with, e.g. the variants that
  have an ALiBi bias. A :class:`Side` declares a :class:`StackOptions` field only if one of its
  variants meets the field's ``needs`` on ``variant`` (and the side has the property named by
  ``side``); a value set while the other option does not meet it is a one-line error;
* ``side``: a :class:`Side` property the side must have (``global_tokens``:
  ``fixed_first_tokens``);
* ``off``: the values that leave the option off (default: the field's default);
* ``model_wide``: declared once per model under ``alibi_`` and shared by its stacks (the
  attention backend, the run-time slope scale);
* ``trained_only``: what the weights learned with, which a load-time override must not change
  (:func:`trained_over`: refused at another value than the checkpoint's), where not every
  change shows in the tensors (offset and symmetric share Press's slopes; global tokens
  leave no trace): the model would compute what it never learned, without a word.

What involves a context (the head count, the model's stock options) is a short rule in the
declaration's ``check``, stated once.
"""

import dataclasses
import difflib
import functools
import logging
import math
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, Optional, Tuple

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from fairseq_alibi.alibi import (DOCUMENT_MASKS, ENCODER_VARIANTS, SCALE_MODES, VARIANTS,
                                 check_variant, check_window_cutoff)
from fairseq_alibi.config_access import cfg_get, cfg_set, flag_of_key
from fairseq_alibi.cross_alibi import CROSS_ALIBI_MODES
from fairseq_alibi.error_hints import OneLineError
from fairseq_alibi.modules.attention.dispatch import ATTENTION_BACKENDS, check_options

logger = logging.getLogger(__name__)

#: the variants with an ALiBi bias (every one but ``none``)
BIASED = VARIANTS
#: the variants whose queries see keys on both sides
BIDIRECTIONAL = tuple(v for v in VARIANTS if v != "causal")
#: the ``--cross-alibi`` modes with a position bias
CROSS_BIASED = tuple(m for m in CROSS_ALIBI_MODES if m != "none")


class OptionError(OneLineError):
    """A value or combination of the package's options that cannot work: the message names the
    flag and the fix, and an uncaught one is printed as that line alone (no traceback)."""


#: a command-line flag in a message: ``--alibi-window-cutoff`` (not ``x--y``, not ``++model``)
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")


def renamed_flags(message: str, rename: Callable[[str], Optional[str]]) -> str:
    """``message`` with each command-line flag ``--a-b`` written as ``rename("a_b")`` where
    that gives a name: the refusals are phrased for the command line, and hydra's configs
    and the hub take keys (:func:`keyword_names`, ``hydra_support.hydra_names``)."""
    def one(match):
        name = rename(match.group(1).replace("-", "_"))
        return match.group(0) if name is None else name
    return _FLAG.sub(one, message)


def keyword_names(message: str) -> str:
    """``message`` with the flags of the package's options written as the keyword arguments
    that set them (``--alibi-window-sinks`` → ``alibi_window_sinks``): the hub's form."""
    return renamed_flags(message, lambda name: name if is_our_key(name) else None)


def one_line_errors(check):
    """``check`` (a validation of options) raising its refusals as :class:`OptionError`: each is
    a ``ValueError`` whose message names the flag, whoever raised it (the math's own checks,
    such as ``one_sided``'s even head count, included)."""
    @functools.wraps(check)
    def checked(*args, **kwargs):
        try:
            return check(*args, **kwargs)
        except OptionError:
            raise
        except ValueError as refused:  # a backend's one-line refusal too: an option's here
            raise OptionError(str(refused)) from None
    return checked


def positive(value):
    """The ``check`` of an option that must be a positive number."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        return f"must be a positive finite number, got {value!r}"
    return None


def _scale_init(value):
    if positive(value):
        return ("must be a positive finite number (it multiplies every ALiBi slope; 1.0 = "
                f"Press et al.'s slopes), got {value!r}")
    return None


def _length_reference(value):
    if not (isinstance(value, int) and (value == 0 or value >= 2)):
        return f"must be 0 (off) or the training length in tokens (>= 2), got {value!r}"
    return None


def _off_or_positive(value):
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        return f"must be 0 (off) or positive, got {value!r}"
    return None


def _window_cutoff(value):
    """:func:`~fairseq_alibi.alibi.check_window_cutoff`'s rule, said after the side's flag."""
    try:
        check_window_cutoff(value)
    except ValueError as error:
        return str(error).split(" ", 1)[1]  # the math names the LM's flag; the side names its own
    return None


def at_least(low):
    """The ``check`` of a whole number of at least ``low``."""
    def check(value):
        if value is not None and not value >= low:
            return f"must be >= {low}, got {value!r}"
        return None
    return check


def _source_length_reference(value):
    if not (value == 0 or value > 1):
        return ("N must be 0 (off) or a reference source length above 1 (e.g. the mean "
                f"training source length), got {value}")
    return None


def _distance_or_off(value):
    if not value >= 0 and value != -1:
        return f"must be -1 (off) or a distance >= 0 in source tokens, got {value}"
    return None


@dataclass(frozen=True)
class Needs:
    """An option does something only when the option ``other`` (a field of the same
    declaration) is one of ``values`` (``None``: is on, not off); ``why`` ends the error that
    a value set without it gets: ``--X needs --other V, not W: <why>``."""

    other: str
    why: str
    values: Optional[Tuple[str, ...]] = None


@dataclass(frozen=True)
class Side:
    """What one family's stack may be: the flag prefix, its variants and the default one (a
    causal LM's is no option), and whether its first positions hold the same tokens in every
    row (right padding and a first token such as ``<s>``: what global tokens need; fairseq pads
    LM prompts and translation sources on the left)."""

    prefix: str
    variants: Tuple[str, ...]
    default: str
    fixed_first_tokens: bool = False

    @property
    def flag(self) -> str:
        return flag_of_key(self.prefix.rstrip("_"))

    def variants_for(self, f: dataclasses.Field) -> Tuple[str, ...]:
        """This side's variants in which the :class:`StackOptions` field ``f`` does something."""
        needs = f.metadata.get("needs")
        if needs is None or needs.other != "variant":
            return self.variants
        return tuple(v for v in self.variants if v in needs.values)

    def has(self, name: str) -> bool:
        """Whether this side declares the field ``name`` of :class:`StackOptions`: a variant is
        a choice where there is one; any other field where one of the side's variants uses it
        and the side has the property its ``side`` names."""
        if name == "variant":
            return len(self.variants) > 1
        f = field_of(StackOptions, name)
        needed = f.metadata.get("side")
        return bool(self.variants_for(f)) and (needed is None or getattr(self, needed))


#: the sides of the model families
LM = Side("alibi_", ("causal",), "causal")
ENCODER = Side("alibi_", ENCODER_VARIANTS, "offset", fixed_first_tokens=True)
TRANSLATION_ENCODER = Side("encoder_alibi_", ENCODER_VARIANTS, "offset")
TRANSLATION_DECODER = Side("decoder_alibi_", ("causal", "none"), "causal")

#: the prefix of the model-wide fields
MODEL_WIDE_PREFIX = "alibi_"

#: the families and the sides each declares (docs/options.md's columns)
FAMILIES = (("alibi_transformer_lm", LM), ("alibi_roberta", ENCODER),
            ("alibi_transformer encoder", TRANSLATION_ENCODER),
            ("alibi_transformer decoder", TRANSLATION_DECODER))

_SHAPES_THE_BIAS = Needs("variant", "it shapes the ALiBi bias", BIASED)
#: one_sided splits its heads by direction (its own refusal, StackOptions.check_values)
_PARTIAL_HEADS = Needs("variant", "it shapes the ALiBi bias",
                       tuple(v for v in BIASED if v != "one_sided"))
#: a cutoff windows a side's own self-attention bias: a side whose only position signal is the
#: cross-attention's (a stock decoder under --cross-alibi) has nothing it could window
_WINDOWS_THE_BIAS = Needs("variant", "it shapes the ALiBi bias of this side's self-attention "
                          "(a --cross-alibi bias has no window)", BIASED)
#: documents are masked in a side's own ALiBi self-attention (stock attention reads no mask)
_MASKS_THE_SELF_ATTENTION = Needs("variant", "it masks this side's ALiBi self-attention",
                                  BIASED)


@dataclass
class StackOptions(FairseqDataclass):
    """The ALiBi options of one layer stack (one shared bias, its layers' attention)."""

    variant: str = field(default="causal", metadata={
        "help": "ALiBi bias of the self-attention: offset (future keys -m(j-i-0.5)), "
                "symmetric -m|i-j|, one_sided (half the heads look back, half ahead), "
                "asymmetric (forward slope = ratio x backward), causal -m(i-j); none = stock "
                "position embeddings, no bias", "trained_only": True})
    future_slope_ratio: float = field(default=1.0, metadata={
        "help": "asymmetric only: forward slope = R x backward slope, per head",
        "check": at_least(0), "initial_of": "learnable_future_slopes",
        "needs": Needs("variant", "it sets the forward slopes", ("asymmetric",))})
    learnable_future_slopes: bool = field(default=False, metadata={
        "help": "asymmetric only: learn the forward/backward slope ratio of every head",
        "needs": Needs("variant", "it learns the forward slopes", ("asymmetric",))})
    learned_scales: ChoiceEnum(SCALE_MODES) = field(default="none", metadata={
        "help": "learn a multiplier of the ALiBi slopes (data2vec 2.0's learned alibi scale): "
                "none (fixed slopes), shared (one), per_head, per_layer, per_layer_head; saved "
                "with the model (docs/learned_scales.md)", "needs": _SHAPES_THE_BIAS,
        "trained_only": True})
    scale_init: float = field(default=1.0, metadata={
        "help": "initial value of the learned slope scales (with none: a fixed multiplier); "
                "must be positive, 1.0 = Press et al.'s slopes", "check": _scale_init,
        "initial_of": "learned_scales",
        "needs": _SHAPES_THE_BIAS})
    heads: Optional[int] = field(default=None, metadata={
        "help": "partial-head ALiBi: only the first K attention heads carry the bias, with "
                "Press's slopes of K heads; the others have none (default: every head)",
        "check": at_least(1), "needs": _PARTIAL_HEADS})
    global_tokens: int = field(default=0, metadata={
        "help": "the first N positions (<s>, read by the classification head) are exempt from "
                "the bias as queries and as keys, and from one_sided's direction masks; 0 = "
                "none", "check": at_least(0), "needs": _SHAPES_THE_BIAS,
        "side": "fixed_first_tokens", "trained_only": True})
    length_scale: int = field(default=0, metadata={
        "help": "evaluation beyond the training length N: a sequence of n > N real tokens "
                "uses every slope x log n / log N (each sequence its own n; a per-sequence "
                "bias, run by sdpa or naive); a load-time override, e.g. --model-overrides "
                "\"{'alibi_length_scale': 512}\"; 0 = off", "check": _length_reference,
        "needs": Needs("variant", "it scales a bidirectional bias", BIDIRECTIONAL)})
    window_cutoff: float = field(default=0.0, metadata={
        "help": "slope windows: head h drops the keys beyond W_h = ceil(T / m_h) (its effective "
                "slope m_h), whose bias is below -T nats; heads without a bias keep every key, "
                "global tokens stay visible; the windowed backend skips those keys on the CPU; "
                "a load-time override, e.g. --model-overrides \"{'alibi_window_cutoff': 8}\"; "
                "0 = off", "check": _window_cutoff, "needs": _WINDOWS_THE_BIAS})
    window_sinks: int = field(default=0, metadata={
        "help": "attention sinks under slope windows: the first S positions stay visible to "
                "every query of every windowed head, with their true ALiBi bias (the dense "
                "model restricted to the window and the first S keys); a KV cache keeps them "
                "and the last max W_h keys; a load-time override, e.g. --model-overrides "
                "\"{'alibi_window_sinks': 4}\"; 0 = none", "check": at_least(0),
        "needs": Needs("window_cutoff", "sinks are the keys kept beyond the slope windows")})
    document_mask: ChoiceEnum(DOCUMENT_MASKS) = field(default="none", metadata={
        "help": "packed batches: no attention crosses a document boundary, each document is "
                "attended as its own sequence; eos: every </s> opens a document, doc: an </s> "
                "right after an </s> (the empty line --sample-break-mode complete_doc splits "
                "on); a load-time override, e.g. --model-overrides "
                "\"{'alibi_document_mask': 'doc'}\"; none = off",
        "needs": _MASKS_THE_SELF_ATTENTION})
    attention: ChoiceEnum(ATTENTION_BACKENDS) = field(default="auto", metadata={
        "help": "attention implementation; saved with the model, can be overridden at load "
                "time with --model-overrides \"{'alibi_attention': 'naive'}\"",
        "model_wide": True})
    slope_scale: float = field(default=1.0, metadata={
        "help": "multiply every ALiBi slope by this at run time (slope interpolation: "
                "L_train / L_eval); saved with the model, and a load-time override replaces "
                "the saved value (it does not multiply it)",
        "model_wide": True, "check": positive})

    def check_values(self, side: Side, num_heads: int):
        """Clear errors for what the math cannot compute (named as typed): each value alone,
        the variant (``one_sided``'s even head count) and the partial heads."""
        for f in option_fields(StackOptions):
            if not f.metadata.get("model_wide") and side.has(f.name):
                _check_field(f, getattr(self, f.name), side.prefix)
        if self.variant not in side.variants:
            raise ValueError(f"unknown {side.flag}-variant {self.variant!r}; choose one of: "
                             f"{', '.join(side.variants)}")
        if self.variant != "none":
            check_variant(self.variant, num_heads)  # one_sided's even head count
        p = side.flag
        if self.heads is not None and self.heads > num_heads:
            raise ValueError(f"{p}-heads must be between 1 and the {num_heads} attention heads, "
                             f"got {self.heads}")
        if self.variant == "one_sided" and self.heads not in (None, num_heads):
            raise ValueError(f"{p}-variant one_sided splits its heads by direction: it takes no "
                             f"{p}-heads; drop it, or use symmetric or offset")

    def check(self, side: Side, num_heads: int):
        """Clear errors for values and combinations that cannot work (named as typed)."""
        self.check_values(side, num_heads)
        _check_needs(self, side.prefix, side)
        self.check_documents(side.flag)

    def check_documents(self, flag: str = "--alibi"):
        """A document mask attends each document as its own sequence: the options that read
        the row as one sequence (its first positions as global tokens, its real length) refuse
        it (attention sinks are each document's first positions: fairseq_alibi/alibi.py)."""
        if str(self.document_mask) == "none":
            return
        for name, value, why in (
                ("global-tokens", self.global_tokens, "they are the first positions of a row"),
                ("length-scale", self.length_scale, "it reads the real length of a row")):
            if value:
                key = f"{flag[2:].replace('-', '_')}_document_mask"
                raise ValueError(f"{flag}-document-mask {self.document_mask} cannot be combined "
                                 f"with {flag}-{name} {value}: {why}, not of each document; "
                                 f"drop one of them (a model saved with the mask: "
                                 f"--model-overrides \"{{'{key}': 'none'}}\" drops it at load)")

    def check_model_wide(self):
        for f in option_fields(StackOptions):
            if f.metadata.get("model_wide"):
                _check_field(f, getattr(self, f.name), MODEL_WIDE_PREFIX)

    @property
    def uses_alibi(self) -> bool:
        return self.variant != "none"


@one_line_errors
def check_stacks(stacks):
    """Validate a model's stacks, ``{side: (options, attention heads)}``, and its model-wide
    options (once); warn when no stack uses ALiBi and a model-wide option was set anyway."""
    for side, (stack, heads) in stacks.items():
        stack.check(side, heads)
    first = next(iter(stacks.values()))[0]
    first.check_model_wide()
    for stack, _ in stacks.values():
        if stack.uses_alibi:
            check_options(str(stack.attention), stack.variant, bool(stack.window_cutoff),
                          stack.window_sinks, stack.global_tokens)
    if not any(stack.uses_alibi for stack, _ in stacks.values()) and any(
            _is_on(f, getattr(first, f.name)) for f in option_fields(StackOptions)
            if f.metadata.get("model_wide")):
        logger.warning("no ALiBi bias (every --*alibi-variant is none): --alibi-attention and "
                       "--alibi-slope-scale are ignored (stock attention and positions are used)")


#: ``--cross-alibi-eos-guard-layer``: whose pointer the EOS guard reads (``min``: the one
#: furthest behind)
EOS_GUARD_LAYERS = ("last", "first", "min")

_CROSS_BIAS_HEADS = "it chooses the heads of the --cross-alibi bias"


@dataclass
class CrossOptions(FairseqDataclass):
    """The encoder-decoder options: a position signal for the cross-attention
    (:mod:`fairseq_alibi.cross_alibi`) and SHAPE for a stock side. Off by default."""

    cross_alibi: ChoiceEnum(CROSS_ALIBI_MODES) = field(default="none", metadata={
        "help": "cross-attention position bias on --cross-alibi-heads heads: none (stock), "
                "pointer -m|j - p_t| around a learned monotonic source pointer "
                "p_t = p_{t-1} + softplus(w.x_t + b), ratio -m|j - r.t| (r: --cross-alibi-ratio)"})
    cross_alibi_heads: Optional[int] = field(default=None, metadata={
        "help": "how many decoder heads get the --cross-alibi bias (slopes of K heads); the "
                "others are content only (default: half the heads, at least 1)",
        "check": at_least(1), "needs": Needs("cross_alibi", _CROSS_BIAS_HEADS, CROSS_BIASED)})
    cross_alibi_slope_scale: float = field(default=1.0, metadata={
        "help": "the --cross-alibi heads' slopes are X times Press's slopes of K heads "
                "(16 with 2 biased heads: slopes 1 and 1/16)", "check": positive,
        "needs": Needs("cross_alibi", "it scales the slopes of the --cross-alibi bias",
                       CROSS_BIASED)})
    cross_alibi_inference_slope_scale: float = field(default=0.0, metadata={
        "help": "outside training (validation, scoring, generation) the --cross-alibi heads' "
                "slopes are X times Press's slopes instead of --cross-alibi-slope-scale times: "
                "sharper slopes keep the biased heads on the pointer over sources longer than "
                "training's; 0 = the training scale; a decoding option (--model-overrides)",
        "check": _off_or_positive,
        "needs": Needs("cross_alibi", "it scales the slopes of the --cross-alibi bias outside "
                       "training", CROSS_BIASED)})
    cross_alibi_inference_longer_than: Optional[int] = field(default=None, metadata={
        "help": "--cross-alibi-inference-slope-scale only for sources longer than L tokens "
                "(EOS included, as fairseq counts source positions): the others keep the "
                "training slopes, attended as in training; default: the longest source the "
                "model was trained on (recorded in training; every source for a checkpoint "
                "that recorded none); 0 = every source; a decoding option (--model-overrides)",
        "check": at_least(0), "off": (None, 0),
        "needs": Needs("cross_alibi_inference_slope_scale",
                       "it chooses the sources that get that scale")})
    cross_alibi_ratio: Optional[float] = field(default=None, metadata={
        "help": "--cross-alibi ratio: source tokens per target token of the training corpus "
                "(required with ratio)", "check": positive,
        "needs": Needs("cross_alibi", "it anchors the ratio bias", ("ratio",))})
    cross_attention_length_scale: float = field(default=0.0, metadata={
        "help": "multiply the cross-attention content logits by log S / log N (S: the row's "
                "real source length; N > 1, e.g. the mean training source length); 0 = off",
        "check": _source_length_reference})
    cross_alibi_eos_guard: float = field(default=-1.0, metadata={
        "help": "decoding only, with --cross-alibi pointer: EOS is forbidden while the "
                "guarded pointer (--cross-alibi-eos-guard-layer) is more than D source tokens "
                "before the last source token; -1 = off", "check": _distance_or_off,
        "needs": Needs("cross_alibi", "it reads the source pointer", ("pointer",))})
    cross_alibi_eos_guard_layer: ChoiceEnum(EOS_GUARD_LAYERS) = field(default="last", metadata={
        "help": "the pointer the EOS guard reads: last, first, or min (the pointer furthest "
                "behind over the layers); a decoding option (--model-overrides)",
        "needs": Needs("cross_alibi_eos_guard", "it chooses the pointer that the EOS guard "
                       "reads")})
    position_shift: int = field(default=0, metadata={
        "help": "SHAPE on a side with --*-alibi-variant none: offset each training sentence's "
                "sinusoidal positions by a random integer in [0, K] (0 at inference); 0 = off",
        "check": at_least(0)})

    @property
    def uses_cross_position(self) -> bool:
        return self.cross_alibi != "none" or self.cross_attention_length_scale > 0

    def check(self, decoder_heads: int, stock_sides: Iterable[str], model_cfg):
        """Clear errors for the cross-attention options and SHAPE; ``stock_sides``: the sides
        with stock positions, ``model_cfg`` the stock options they interact with."""
        check_declared(self)
        heads = self.cross_alibi_heads
        if heads is not None and heads > decoder_heads:
            raise ValueError(f"--cross-alibi-heads must be between 1 and the {decoder_heads} "
                             f"decoder attention heads, got {heads}")
        if self.cross_alibi == "ratio" and self.cross_alibi_ratio is None:
            raise ValueError("--cross-alibi ratio needs --cross-alibi-ratio R, the source tokens "
                             "per target token of the training corpus (total source tokens / "
                             "total target tokens)")
        if self.uses_cross_position and _get(model_cfg, "no_cross_attention", False):
            raise ValueError("--cross-alibi / --cross-attention-length-scale act on the "
                             "cross-attention, which --no-cross-attention removes: drop one of "
                             "them")
        if self.position_shift:
            stock = list(stock_sides)
            if not stock:
                raise ValueError("--position-shift offsets stock sinusoidal positions; both sides "
                                 "use ALiBi (relative positions already): drop it, or pass "
                                 "--encoder-alibi-variant none / --decoder-alibi-variant none")
            replaced = [f"--{side}-learned-pos" for side in stock
                        if _get(model_cfg, f"{side}_learned_pos", False)]
            if _get(model_cfg, "no_token_positional_embeddings", False):
                replaced.append("--no-token-positional-embeddings")
            if replaced:
                raise ValueError(f"--position-shift offsets sinusoidal positions, which "
                                 f"{replaced[0]} replaces (a learned table has a fixed size): "
                                 "drop one of them")


# ---------------------------------------------------------------------------------------------
# declarations -> fairseq (dataclass fields, argparse), configurations -> option objects


def field_of(cls, name) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def option_fields(cls):
    """The option fields of a declaration (FairseqDataclass's ``_name`` is none)."""
    return [f for f in dataclasses.fields(cls) if not f.name.startswith("_")]


def flag_of(f: dataclasses.Field, prefix: str = "") -> str:
    """The flag of the field ``f`` as a side with ``prefix`` declares it."""
    if f.metadata.get("model_wide"):
        prefix = MODEL_WIDE_PREFIX
    return flag_of_key(prefix + f.name)


def _is_on(f: dataclasses.Field, value) -> bool:
    """Whether ``value`` turns the option on (is none of its ``off`` values)."""
    return value not in f.metadata.get("off", (f.default,))


def either(values) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    values = [str(v) for v in values]
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


def _check_field(f: dataclasses.Field, value, prefix: str = "", choices=None):
    """A one-line error naming the flag (``prefix`` + the field's name) if ``value`` is not one
    of the field's choices (or of ``choices``, a side's variants) or fails its ``check``."""
    flag = flag_of(f, prefix)
    choices = choices or _choices(f)
    if choices is not None and str(value) not in choices:
        raise ValueError(f"unknown {flag} {str(value)!r}; choose one of: {', '.join(choices)}")
    check = f.metadata.get("check")
    unset = value is None and f.default is None  # an optional option left out
    reason = check(value) if check is not None and not unset else None
    if reason is not None:
        raise ValueError(f"{flag} {reason}")


def _check_needs(options, prefix: str = "", side: Optional[Side] = None):
    """A one-line error for the first option that is on while the option it ``needs`` is not
    what it needs (:class:`Needs`), named as ``side`` (or ``prefix``) declares them."""
    cls = type(options)
    for f in option_fields(cls):
        needs = f.metadata.get("needs")
        if needs is None or (side is not None and not side.has(f.name)) \
                or not _is_on(f, getattr(options, f.name)):
            continue
        other, value = field_of(cls, needs.other), getattr(options, needs.other)
        flag, other_flag = flag_of(f, prefix), flag_of(other, prefix)
        if needs.values is None:
            if not _is_on(other, value):
                raise ValueError(f"{flag} needs {other_flag}: {needs.why}")
        elif value not in needs.values:
            allowed = side.variants_for(f) if side is not None and needs.other == "variant" \
                else needs.values
            raise ValueError(f"{flag} needs {other_flag} {either(allowed)}, not {value}: "
                             f"{needs.why}")


@one_line_errors
def check_declared(options, prefix: str = ""):
    """What a declaration's fields say (choices, ``check``, ``needs``), one line for the first
    option that fails, named as ``prefix`` declares them (a family's own options:
    ``RobertaOptions``; :class:`CrossOptions`)."""
    for f in option_fields(type(options)):
        _check_field(f, getattr(options, f.name), prefix)
    _check_needs(options, prefix)


def _choices(f: dataclasses.Field) -> Optional[Tuple[str, ...]]:
    kind = f.type
    if isinstance(kind, type) and hasattr(kind, "__members__"):
        return tuple(kind.__members__)
    return None


def _fields(cls, side: Optional[Side]):
    """``[(name, field, type, default)]`` of the fields of ``cls`` that ``side`` declares, named
    and typed as it declares them (``None``: every field, unprefixed: :class:`CrossOptions`)."""
    found = []
    for f in option_fields(cls):
        if side is None:
            found.append((f.name, f, f.type, f.default))
            continue
        if not side.has(f.name):
            continue
        if f.metadata.get("model_wide"):
            found.append((MODEL_WIDE_PREFIX + f.name, f, f.type, f.default))
        elif f.name == "variant":
            found.append((side.prefix + f.name, f, ChoiceEnum(list(side.variants)),
                          side.default))
        else:
            found.append((side.prefix + f.name, f, f.type, f.default))
    return found


def dataclass_fields(cls, *sides: Optional[Side]):
    """The fields of ``cls`` as ``sides`` name them, for ``dataclasses.make_dataclass`` (a
    model config dataclass: the LM's); model-wide fields once."""
    seen, found = set(), []
    for side in sides:
        for name, f, kind, default in _fields(cls, side):
            if name in seen:
                continue
            seen.add(name)
            found.append((name, kind, field(default=default, metadata=dict(f.metadata))))
    return found


def declared(cls, *sides: Optional[Side]) -> type:
    """A dataclass holding ``cls``'s fields as ``sides`` name them (see :func:`dataclass_fields`)."""
    return dataclasses.make_dataclass(
        f"{cls.__name__}Declared", dataclass_fields(cls, *sides), bases=(FairseqDataclass,))


def add_args(parser, cls, *sides: Optional[Side]):
    """Declare ``cls``'s options on an argparse model's parser, as ``sides`` name them, with no
    argparse defaults: as every fairseq architecture function, :func:`fill_defaults` fills what
    was not given (so an architecture may set its own defaults, and saved options stay as the
    user gave them)."""
    from fairseq.dataclass.utils import gen_parser_from_dataclass

    gen_parser_from_dataclass(parser, declared(cls, *sides)(), delete_default=True)


def _get(cfg, key, default=None):
    """``cfg.key`` of an argparse Namespace, an OmegaConf node or a dict; ``default`` when it is
    absent or ``None``."""
    value = cfg_get(cfg, key, None)
    return default if value is None else value


def _typed(kind, value):
    if value is None:
        return None
    if kind is bool:
        return bool(value)
    if kind is float:
        return float(value)
    if kind is int:
        return int(value)
    return str(value)  # a choice (an enum member or a string)


def _base_type(kind):
    if getattr(kind, "__origin__", None) is not None:  # Optional[X]
        return next(a for a in kind.__args__ if a is not type(None))
    if isinstance(kind, type) and hasattr(kind, "__members__"):
        return str
    return kind


def fill_defaults(cfg, cls, *sides: Optional[Side]):
    """Set every option of ``cls`` (as ``sides`` name them) that ``cfg`` lacks (or holds as
    ``None``) to its declared default, and the others to their declared type (an int given for a
    float option, say); ``cfg`` is an argparse Namespace or an open OmegaConf node."""
    for name, f, kind, default in (t for side in sides for t in _fields(cls, side)):
        cfg_set(cfg, name, _typed(_base_type(kind), _get(cfg, name, default)))


def read(cls, cfg, side: Optional[Side] = None):
    """The option object of ``cls`` for ``side`` from a model configuration (a Namespace, an
    OmegaConf node or a dict), missing values at their declared defaults."""
    values: Dict[str, object] = {}
    for name, f, kind, default in _fields(cls, side):
        values[f.name] = _typed(_base_type(kind), _get(cfg, name, default))
    if side is not None and not side.has("variant"):
        values["variant"] = side.default
    return cls(**values)


def default_of(name: str, side: Optional[Side] = None, cls=StackOptions):
    """The default of the option ``name`` (a field of ``cls``) as ``side`` declares it (a
    stack's ``variant``: the side's default variant): what a configuration that lacks it
    means."""
    if name == "variant" and side is not None:
        return side.default
    return field_of(cls, name).default


def model_wide_defaults() -> Dict[str, object]:
    """``{config key: default}`` of the model-wide options (``alibi_attention``, ...)."""
    return {MODEL_WIDE_PREFIX + f.name: f.default for f in option_fields(StackOptions)
            if f.metadata.get("model_wide")}


# ---------------------------------------------------------------------------------------------
# the option names of each model family: load-time overrides naming none are refused

#: model name -> its declarations, ``((declaration, sides), ...)`` (``sides``: the
#: :class:`Side`\ s that name a :class:`StackOptions`' fields; ``(None,)``: unprefixed, as
#: :class:`CrossOptions`); each model module declares its own (:func:`declare_family`)
_FAMILY_DECLARATIONS: Dict[str, Tuple[Tuple[type, Tuple[Optional[Side], ...]], ...]] = {}


def declare_family(model_name: str, *declarations: Tuple[type, Tuple[Optional[Side], ...]]):
    """Record which declarations the model ``model_name`` has, and as which sides: what
    :func:`check_override_keys` accepts for it."""
    _FAMILY_DECLARATIONS[model_name] = tuple(declarations)


def family_option_names(model_name: str) -> Tuple[str, ...]:
    """The config keys of the model's ALiBi/family options, as its declarations name them (none
    for a model that declared no family: a stock one)."""
    names = []
    for cls, sides in _FAMILY_DECLARATIONS.get(model_name, ()):
        names += [name for name, _, _ in dataclass_fields(cls, *sides) if name not in names]
    return tuple(names)


def _our_prefixes() -> Tuple[str, ...]:
    """How a key of one of the package's options starts: every side's prefix, the model-wide
    one, and each unprefixed name that other names extend (``cross_alibi`` of
    ``cross_alibi_heads``)."""
    prefixes = {MODEL_WIDE_PREFIX}
    for declarations in _FAMILY_DECLARATIONS.values():
        for cls, sides in declarations:
            if sides == (None,):
                names = [f.name for f in option_fields(cls)]
                prefixes.update(n for n in names if any(m.startswith(n + "_") for m in names))
            else:
                prefixes.update(side.prefix for side in sides)
    return tuple(sorted(p for p in prefixes if not any(p != q and p.startswith(q)
                                                       for q in prefixes)))


def is_our_key(key: str) -> bool:
    """Whether ``key`` names, or starts like, an option the package declares for some family."""
    return key.startswith(_our_prefixes()) or any(
        key in family_option_names(model) for model in _FAMILY_DECLARATIONS)


def check_override_keys(keys: Iterable[str], model_name: str, where: str = "--model-overrides"):
    """A one-line error for the first key of ``keys`` that is one of the package's
    (:func:`is_our_key`) but no option of the model ``model_name``: misspelt (with the closest
    name, by :mod:`difflib`) or another family's. fairseq drops such a key of a load-time
    override (or sets it where nothing reads it), and the run would report figures as if the
    option were on. Other keys are not looked at; a stock model (one that declared no family)
    refuses any key of the package's, which it would ignore; a checkpoint that names no model
    is not checked."""
    if model_name not in _FAMILY_DECLARATIONS:
        ours = [key for key in keys if isinstance(key, str) and is_our_key(key)]
        if ours and model_name is not None:
            raise ValueError(f"ALiBi option {ours[0]!r} in {where} does nothing to {model_name}, "
                             "a model without ALiBi (fairseq would ignore it): drop it, or load "
                             "a model of the alibi_* architectures")
        return
    valid = family_option_names(model_name)
    for key in keys:
        if not isinstance(key, str) or key in valid or not is_our_key(key):
            continue
        owners = [m for m in _FAMILY_DECLARATIONS if key in family_option_names(m)]
        if owners:
            what = (f"ALiBi option {key!r} in {where} is {either(owners)}'s, not one of "
                    f"{model_name}'s")
        else:
            what = f"unknown ALiBi option {key!r} in {where}"
        close = difflib.get_close_matches(key, valid, n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]!r}?)" if close and not owners else ""
        raise ValueError(f"{what}{hint}; valid for {model_name}: {', '.join(valid)}")


#: the OmegaConf node that merges an override of an option of each type into the model's
#: config, and what it takes: its own rules (it refuses ``2.5`` and ``True`` for an integer,
#: deep in a traceback; an argparse-era config would have taken ``int(2.5)``, silently)
_OVERRIDE_NODES = {int: ("IntegerNode", "an integer"), float: ("FloatNode", "a number"),
                   bool: ("BooleanNode", "true or false")}


def _override_typed(kind, value):
    """``value`` as OmegaConf merges it into an option of type ``kind`` (a choice: its string,
    checked against the choices next), or ``ValueError``."""
    if value is None or kind not in _OVERRIDE_NODES:
        return _typed(kind, value)
    from omegaconf import nodes

    return getattr(nodes, _OVERRIDE_NODES[kind][0])(value)._value()


def _value_refusal(f: dataclasses.Field, kind, side: Optional[Side], value,
                   where: str) -> Optional[str]:
    """What is wrong with ``value`` for the option ``f`` as ``side`` declares it (type
    ``kind``): not of its type, not one of its choices, refused by its ``check``; or ``None``."""
    prefix = "" if side is None else side.prefix
    base = _base_type(kind)
    try:
        value = _override_typed(base, value)
    except (TypeError, ValueError):  # OmegaConf's ValidationError is a ValueError
        return f"{flag_of(f, prefix)} in {where} takes {_OVERRIDE_NODES[base][1]}, got {value!r}"
    try:
        _check_field(f, value, prefix, side.variants if side and f.name == "variant" else None)
    except ValueError as refused:
        return f"{refused} (in {where})"
    return None


def check_override_values(given: Dict[str, object], model_name: Optional[str] = None,
                          where: str = "--model-overrides"):
    """An :class:`OptionError` for the first of the package's options in ``given`` (a load-time
    override's ``{key: value}``) whose value the model ``model_name`` cannot take (``None``,
    before the checkpoint is read: no family that declares the key can): one of its choices,
    its type, its ``check``. fairseq would merge it into the model's config first, where a bad
    choice or type fails deep inside omegaconf; what needs the other options (``needs``, the
    head count) is the model's own check when it is built."""
    families = list(_FAMILY_DECLARATIONS) if model_name is None else [model_name]
    for key, value in given.items():
        refusals = [_value_refusal(f, kind, side, value, where)
                    for family in families
                    for cls, sides in _FAMILY_DECLARATIONS.get(family, ())
                    for side in sides
                    for name, f, kind, _ in _fields(cls, side) if name == key]
        if refusals and all(refusals):
            raise OptionError(refusals[0])


def learned_over(given: Dict[str, object], saved: Callable[[str], object], model_name: str,
                 where: str = "--model-overrides"):
    """An :class:`OptionError` for a load-time override in ``given`` of an option that is only
    the initial value of what the model saved as ``saved`` learned (declared ``initial_of``:
    ``future_slope_ratio`` under ``learnable_future_slopes``, ``scale_init`` under learned
    scales): the learned values load over it, so the override would change nothing, silently.
    (``saved`` reads the config fairseq has already merged the overrides into: the learned
    switch is as saved, the initial value is not, so any value of it is refused.)"""
    for cls, sides in _FAMILY_DECLARATIONS.get(model_name, ()):
        for side in sides:
            declared = {f.name: (name, f) for name, f, _, _ in _fields(cls, side)}
            for name, f in declared.values():
                learner = f.metadata.get("initial_of")
                if name not in given or learner not in declared or \
                        declared[learner][0] in given:  # both given: the model's own checks
                    continue
                learned_name, learned_field = declared[learner]
                learned = saved(learned_name)  # None: saved before the option existed
                if learned is None or not _is_on(learned_field, learned):
                    continue
                raise OptionError(
                    f"{name}={given[name]!r} in {where} changes nothing: the checkpoint learned "
                    f"it ({learned_name}={learned!r}), and {name} is only the value that "
                    f"learning started from: the learned values load over it. Drop it "
                    f"(alibi_slope_scale scales every slope at load time)")


def trained_only_names(model_name: str) -> set:
    """The names of the model's options declared ``trained_only``, and of those that are the
    initial value of a learned one (``initial_of``), trained as they are where it is off."""
    return {name for cls, sides in _FAMILY_DECLARATIONS.get(model_name, ()) for side in sides
            for name, f, _, _ in _fields(cls, side)
            if f.metadata.get("trained_only") or f.metadata.get("initial_of")}


def _trained_as_is(f, declared, saved: Callable[[str], object]) -> bool:
    """Whether the option of field ``f`` is what the weights were trained with: declared
    ``trained_only``, or the initial value of a learned option saved off (``scale_init``
    without learned scales: a fixed multiplier of the slopes)."""
    if f.metadata.get("trained_only"):
        return True
    learner = f.metadata.get("initial_of")
    if learner not in declared:
        return False
    name, learned_field, default = declared[learner]
    learned = saved(name)
    return not _is_on(learned_field, default if learned is None else learned)


def trained_change(given: Dict[str, object], saved: Callable[[str], object],
                   model_name: str) -> Optional[Tuple[str, str, object, object]]:
    """``(flag, name, saved value, given value)`` of the first option the weights were
    trained with (:func:`_trained_as_is`) that ``given`` sets to another value than the
    checkpoint's (``saved``; ``None``: saved before the option existed, i.e. its default), or
    None."""
    for cls, sides in _FAMILY_DECLARATIONS.get(model_name, ()):
        for side in sides:
            fields = list(_fields(cls, side))
            declared = {f.name: (name, f, default) for name, f, _, default in fields}
            for name, f, kind, default in fields:
                if name not in given or not _trained_as_is(f, declared, saved):
                    continue
                value = saved(name)
                was = default if value is None else value
                wanted = _override_typed(_base_type(kind), given[name])
                if str(wanted) != str(was):
                    return flag_of(f, side.prefix if side else ""), name, was, wanted
    return None


def trained_over(given: Dict[str, object], saved: Callable[[str], object], model_name: str,
                 where: str = "--model-overrides"):
    """An :class:`OptionError` for a load-time override in ``given`` of a trained option to
    another value than the checkpoint's (:func:`trained_change`; ``saved``: its config before
    the overrides)."""
    change = trained_change(given, saved, model_name)
    if change is not None:
        flag, name, was, wanted = change
        raise OptionError(
            f"this checkpoint was trained with {flag} {was}; {name} in {where} builds {flag} "
            f"{wanted}: drop it from {where} (the weights learned what it was trained with"
            + ("; alibi_slope_scale scales every slope at load time)"
               if name.endswith("scale_init") else ")"))


def needs_undone(given: Dict[str, object], saved: Callable[[str], object],
                 model_name: str) -> Dict[str, Tuple[object, str]]:
    """``{name: (default, the option it needs)}`` for each option of the model
    ``model_name`` that is on as saved (``saved(name)``) while a load-time override in
    ``given`` takes away what it ``needs``
    (turns that option off, or to a value it does not work with), and that ``given`` does not
    name itself: ``{'cross_alibi_eos_guard': -1}`` on a model saved with a guard layer. Left
    as saved, such an option makes the model refuse to build; reset, it is off as the
    override asks."""
    undone = {}
    for cls, sides in _FAMILY_DECLARATIONS.get(model_name, ()):
        for side in sides:
            declared = {f.name: (name, f, kind) for name, f, kind, _ in _fields(cls, side)}
            for name, f, _ in declared.values():
                needs = f.metadata.get("needs")
                value = saved(name)  # None: a checkpoint from before the option
                if needs is None or name in given or needs.other not in declared \
                        or value is None or not _is_on(f, value):
                    continue
                other, other_field, other_kind = declared[needs.other]
                if other not in given:
                    continue
                wanted = _override_typed(_base_type(other_kind), given[other])
                met = _is_on(other_field, wanted) if needs.values is None \
                    else str(wanted) in needs.values
                if not met:
                    undone[name] = (f.default, other)
    return undone
