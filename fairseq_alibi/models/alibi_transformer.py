"""``alibi_transformer``: fairseq's encoder-decoder ``transformer`` with ALiBi, for translation.

Everything is stock ``transformer`` (``--task translation``, shared or separate dictionaries,
``--share-all-embeddings``, pre/post-norm, layerdrop, activation checkpointing, alignment
printing, beam search, the hub interface) except the two build hooks of
:class:`~fairseq.models.transformer.TransformerModel`:

* ``build_encoder``: with ``--encoder-alibi-variant`` one of ``symmetric``, ``one_sided``,
  ``offset`` (default), ``asymmetric``, the encoder of ``alibi_roberta``
  (:class:`~fairseq_alibi.models.alibi_roberta.AlibiTransformerEncoder`): no position
  embeddings, every self-attention adds the bidirectional bias of that variant. ``none`` keeps
  the stock encoder and its sinusoidal (or ``--encoder-learned-pos``) positions.
* ``build_decoder``: with ``--decoder-alibi-variant causal`` (default), the decoder of
  ``alibi_transformer_lm`` (:class:`~fairseq_alibi.models.alibi_transformer_lm.AlibiTransformerDecoder`)
  with its cross-attention kept: causal ALiBi self-attention, exact with a KV cache and beam
  reordering. ``none`` keeps the stock decoder.

Cross-attention (decoder queries, encoder keys) is stock by default: no position bias, as in
EIFY's fork and T5; the two sequences have no common position axis for ``i - j`` to measure.
The options of docs/translation.md, "Cross-attention position options", give it one (either
decoder variant): ``--cross-alibi {pointer,ratio}`` on ``--cross-alibi-heads`` heads (a bias
around a learned monotonic source pointer, or around ``--cross-alibi-ratio`` × the target
position), ``--cross-attention-length-scale N`` (content logits × ``log S / log N``) and, at
decoding, ``--cross-alibi-eos-guard D`` (:class:`CrossPositionDecoderMixin`). The decoder
layers build that attention in their ``build_encoder_attention`` hook
(:mod:`fairseq_alibi.modules.cross_position`); with the options off it is fairseq's own.
``--position-shift K`` (SHAPE) offsets the positions of a stock sinusoidal side by a random
``k ∈ [0, K]`` per sentence while training (:mod:`fairseq_alibi.modules.position_shift`).

An ALiBi side has no maximum length: its ``max_positions()`` is unbounded and the translation
task's ``--max-source-positions`` / ``--max-target-positions`` filter is lifted for that side,
so long sources are translated instead of skipped or refused.

The saved state is the stock ``transformer``'s (same parameter names) plus the slopes buffers
``encoder.alibi.slopes`` / ``decoder.alibi.slopes`` of the ALiBi sides (and
``encoder.alibi.future_slope_ratio`` with ``asymmetric``, ``encoder.alibi.scales`` /
``decoder.alibi.scales`` with ``--encoder-alibi-learned-scales`` /
``--decoder-alibi-learned-scales``: docs/learned_scales.md).
"""

import argparse
import copy
import logging

import torch
from fairseq.models import (
    ARCH_CONFIG_REGISTRY,
    ARCH_MODEL_INV_REGISTRY,
    register_model,
    register_model_architecture,
)
from fairseq.models.transformer import TransformerConfig, TransformerDecoderBase, TransformerModel
from fairseq.utils import safe_getattr

from fairseq_alibi.alibi import ENCODER_VARIANTS, SCALE_MODES, check_variant, variant_slopes
from fairseq_alibi.modules import CrossPositionDecoderLayer, wrap_layer
from fairseq_alibi.modules.attention import ATTENTION_BACKENDS, check_attention_backend
from fairseq_alibi.modules.cross_position import (
    CROSS_ALIBI_MODES,
    CrossPositionAttention,
    forbid_early_eos,
    uses_cross_position,
)
from fairseq_alibi.modules.position_shift import ShiftedPositions
from fairseq_alibi.modules.learned_scales import check_scale_options
from fairseq_alibi.hub import AlibiLanguageModelHubInterface, load_pretrained
from fairseq_alibi.models.alibi_roberta import AlibiTransformerEncoder
from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerDecoder
from fairseq_alibi.models.layer_pruning import ScalesFollowPrunedLayers
from fairseq_alibi.models.checks import (
    UNBOUNDED_POSITIONS,
    reject_other_dictionary,
    reject_position_embeddings,
)

logger = logging.getLogger(__name__)

#: the decoder's self-attention: causal ALiBi, or ``none`` (stock positions)
DECODER_VARIANTS = ("causal", "none")
#: ``--cross-alibi-eos-guard-layer``: whose pointer the EOS guard reads (``min``: the one
#: furthest behind)
EOS_GUARD_LAYERS = ("last", "first", "min")

MODEL_NAME = "alibi_transformer"


def _check_options(args):
    """Clear errors for option values and combinations that cannot work."""
    check_variant(args.encoder_alibi_variant, args.encoder_attention_heads,
                  allowed=ENCODER_VARIANTS)
    if args.decoder_alibi_variant not in DECODER_VARIANTS:
        raise ValueError(
            f"unknown --decoder-alibi-variant {args.decoder_alibi_variant!r}; choose one of: "
            f"{', '.join(DECODER_VARIANTS)}"
        )
    check_attention_backend(args.alibi_attention)
    for side in ("encoder", "decoder"):  # learned slope scales, per side
        learned, init = getattr(args, f"{side}_alibi_learned_scales"), \
            getattr(args, f"{side}_alibi_scale_init")
        check_scale_options(learned, init, flag=f"--{side}-alibi")
        if getattr(args, f"{side}_alibi_variant") == "none" and (learned != "none" or init != 1.0):
            raise ValueError(
                f"--{side}-alibi-learned-scales / --{side}-alibi-scale-init scale the ALiBi "
                f"slopes; --{side}-alibi-variant none has none: drop them or choose a variant"
            )
    if args.encoder_alibi_variant != "asymmetric" and (
        args.encoder_alibi_future_slope_ratio != 1.0
        or args.encoder_alibi_learnable_future_slopes
    ):
        raise ValueError(
            "--encoder-alibi-future-slope-ratio / --encoder-alibi-learnable-future-slopes set "
            "the forward slopes of --encoder-alibi-variant asymmetric; they do nothing with "
            f"{args.encoder_alibi_variant!r}"
        )
    if not args.encoder_alibi_future_slope_ratio >= 0:
        raise ValueError(
            "--encoder-alibi-future-slope-ratio must be >= 0 (forward slope = ratio × backward "
            f"slope), got {args.encoder_alibi_future_slope_ratio}"
        )
    if not args.alibi_slope_scale > 0:
        raise ValueError(f"--alibi-slope-scale must be positive, got {args.alibi_slope_scale}")
    for side, variant in (("encoder", args.encoder_alibi_variant),
                          ("decoder", args.decoder_alibi_variant)):
        if variant != "none" and safe_getattr(args, f"{side}_learned_pos", False):
            raise ValueError(
                f"--{side}-learned-pos asks for learned position embeddings, which ALiBi "
                f"replaces: drop it, or pass --{side}-alibi-variant none for stock positions"
            )
    if args.decoder_alibi_variant == "causal" and safe_getattr(args, "cross_self_attention"):
        raise ValueError(
            "--cross-self-attention puts encoder states into the decoder's self-attention, "
            "where a causal ALiBi bias has no position for them: drop it, or use "
            "--decoder-alibi-variant none"
        )
    _check_cross_options(args)
    if args.encoder_alibi_variant == "none" and args.decoder_alibi_variant == "none" and (
        args.alibi_attention != "auto" or args.alibi_slope_scale != 1.0
    ):
        logger.warning(
            "--encoder-alibi-variant none --decoder-alibi-variant none: no ALiBi bias, so "
            "--alibi-attention and --alibi-slope-scale are ignored (this is stock transformer)"
        )


def _check_cross_options(args):
    """Clear errors for the cross-attention position options and ``--position-shift``."""
    mode, heads = args.cross_alibi, args.decoder_attention_heads
    if mode not in CROSS_ALIBI_MODES:
        raise ValueError(f"unknown --cross-alibi {mode!r}; choose one of: "
                         f"{', '.join(CROSS_ALIBI_MODES)}")
    if args.cross_alibi_heads is not None:
        if mode == "none":
            raise ValueError("--cross-alibi-heads chooses the heads of the --cross-alibi bias; "
                             "with --cross-alibi none there is none: drop it, or pass "
                             "--cross-alibi pointer (or ratio)")
        if not 1 <= args.cross_alibi_heads <= heads:
            raise ValueError(f"--cross-alibi-heads must be between 1 and the "
                             f"{heads} decoder attention heads, got {args.cross_alibi_heads}")
    slope_scale = args.cross_alibi_slope_scale
    if slope_scale != 1.0:
        if mode == "none":
            raise ValueError("--cross-alibi-slope-scale scales the slopes of the --cross-alibi "
                             "bias; with --cross-alibi none there is none: drop it, or pass "
                             "--cross-alibi pointer (or ratio)")
        if not slope_scale > 0:
            raise ValueError(f"--cross-alibi-slope-scale must be positive, got {slope_scale}")
    ratio = args.cross_alibi_ratio
    if mode == "ratio" and ratio is None:
        raise ValueError("--cross-alibi ratio needs --cross-alibi-ratio R, the source tokens "
                         "per target token of the training corpus (total source tokens / total "
                         "target tokens)")
    if ratio is not None and mode != "ratio":
        raise ValueError(f"--cross-alibi-ratio anchors --cross-alibi ratio; it does nothing with "
                         f"--cross-alibi {mode}: drop it, or pass --cross-alibi ratio")
    if ratio is not None and not ratio > 0:
        raise ValueError(f"--cross-alibi-ratio must be positive (source tokens per target "
                         f"token), got {ratio}")
    scale = args.cross_attention_length_scale
    if not (scale == 0 or scale > 1):
        raise ValueError(f"--cross-attention-length-scale N must be 0 (off) or a reference "
                         f"source length above 1 (e.g. the mean training source length), got "
                         f"{scale}")
    guard = args.cross_alibi_eos_guard
    if guard != -1:
        if mode != "pointer":
            raise ValueError("--cross-alibi-eos-guard D reads the source pointer: it needs "
                             f"--cross-alibi pointer (got --cross-alibi {mode})")
        if not guard >= 0:
            raise ValueError(f"--cross-alibi-eos-guard must be -1 (off) or a distance >= 0 in "
                             f"source tokens, got {guard}")
    guard_layer = args.cross_alibi_eos_guard_layer
    if guard_layer not in EOS_GUARD_LAYERS:
        raise ValueError(f"unknown --cross-alibi-eos-guard-layer {guard_layer!r}; choose one of: "
                         f"{', '.join(EOS_GUARD_LAYERS)}")
    if guard_layer != "last" and guard == -1:
        raise ValueError("--cross-alibi-eos-guard-layer chooses the pointer that the EOS guard "
                         "reads: it needs --cross-alibi-eos-guard D")
    if (mode != "none" or scale) and safe_getattr(args, "no_cross_attention", False):
        raise ValueError("--cross-alibi / --cross-attention-length-scale act on the "
                         "cross-attention, which --no-cross-attention removes: drop one of them")
    shift = args.position_shift
    if shift:
        stock = [side for side in ("encoder", "decoder")
                 if getattr(args, f"{side}_alibi_variant") == "none"]
        if shift < 0:
            raise ValueError(f"--position-shift must be >= 0, got {shift}")
        if not stock:
            raise ValueError("--position-shift offsets stock sinusoidal positions; both sides "
                             "use ALiBi (relative positions already): drop it, or pass "
                             "--encoder-alibi-variant none / --decoder-alibi-variant none")
        for flag in [f"--{side}-learned-pos" for side in stock
                     if safe_getattr(args, f"{side}_learned_pos", False)] + \
                ["--no-token-positional-embeddings"
                 if safe_getattr(args, "no_token_positional_embeddings", False) else None]:
            if flag:
                raise ValueError(f"--position-shift offsets sinusoidal positions, which {flag} "
                                 "replaces (a learned table has a fixed size): drop one of them")


def _shift_positions(side, args):
    """SHAPE on a stock side: its sinusoidal ``embed_positions`` offset while training."""
    if args.position_shift:
        side.embed_positions = ShiftedPositions(side.embed_positions, args.position_shift)
    return side


def _lift_task_length_limits(task, source: bool, target: bool):
    """Let the translation task keep sources (targets) of any length on an ALiBi side.

    fairseq drops (train) or refuses (valid, generate, interactive) pairs longer than
    ``min(task.max_positions(), model.max_positions())``: the task's
    ``--max-source-positions`` / ``--max-target-positions`` (1024 by default) only exist
    because position embeddings stop there. Only this task object is changed, never its
    saved options.
    """
    if task is None or not (source or target):
        return
    limits = task.max_positions()
    if not (isinstance(limits, tuple) and len(limits) == 2):
        return  # not a (source, target) task: leave it as configured
    lifted = (
        UNBOUNDED_POSITIONS if source else limits[0],
        UNBOUNDED_POSITIONS if target else limits[1],
    )
    if lifted != limits:
        task.max_positions = lambda: lifted
        sides = " and ".join(n for n, lift in (("source", source), ("target", target)) if lift)
        logger.info(f"ALiBi: the task's {sides} length limit is lifted ({limits} -> {lifted})")


def _side_scales(cfg, side):
    """The learned-slope-scale options of one side, as its modules name them."""
    return dict(
        alibi_learned_scales=str(safe_getattr(cfg, f"{side}_alibi_learned_scales", "none")),
        alibi_scale_init=float(safe_getattr(cfg, f"{side}_alibi_scale_init", 1.0)),
    )


def _side_config(cfg, **values):
    """A copy of the model config for one side (the side's modules set fields on it)."""
    side = copy.deepcopy(cfg)
    for name, value in values.items():
        setattr(side, name, value)
    return side


class CrossPositionDecoderMixin:
    """A decoder whose layers' cross-attention has a position signal, and the EOS guard.

    ``--cross-alibi-eos-guard D`` acts on the decoder's output, at a decoding step only (an
    ``incremental_state``, not training, not teacher forcing): the logit of EOS is floored
    (:func:`~fairseq_alibi.modules.cross_position.forbid_early_eos`) in every row whose last
    layer's pointer is more than ``D`` source tokens before the row's last real source token.
    ``get_normalized_probs`` then gives EOS no probability, so stock ``fairseq-generate``,
    ``fairseq-interactive`` and the hub need nothing; at the generator's ``max_len`` EOS is the
    only token left and still ends the hypothesis. ``--cross-alibi-eos-guard-layer`` chooses the
    pointer read: ``last`` (default), ``first``, or ``min``, the pointer furthest behind (the
    largest distance left over the layers).
    """

    def guard_eos(self, args):
        self.cross_alibi_eos_guard = float(safe_getattr(args, "cross_alibi_eos_guard", -1.0))
        self.cross_alibi_eos_guard_layer = safe_getattr(args, "cross_alibi_eos_guard_layer",
                                                        None) or "last"
        attentions = [m for m in self.modules() if isinstance(m, CrossPositionAttention)]
        read = {"last": attentions[-1:], "first": attentions[:1], "min": attentions}
        # the pointers read, as plain references (the layers own the modules)
        object.__setattr__(self, "guard_attentions", read[self.cross_alibi_eos_guard_layer])
        return self

    def eos_distance(self, incremental_state):
        """``(B,)``: source tokens left before the last one, by the guarded pointer (with
        ``min``, the pointer furthest behind), or ``None`` before the first step."""
        left = [m.eos_distance(incremental_state) for m in self.guard_attentions]
        if not left or left[0] is None:
            return None
        return left[0] if len(left) == 1 else torch.stack(left).amax(0)

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None,
                features_only=False, **kwargs):
        x, extra = super().forward(prev_output_tokens, encoder_out=encoder_out,
                                   incremental_state=incremental_state,
                                   features_only=features_only, **kwargs)
        if self.cross_alibi_eos_guard >= 0 and incremental_state is not None \
                and not features_only and not self.training:
            left = self.eos_distance(incremental_state)
            if left is not None:
                forbid_early_eos(x, left, self.dictionary.eos(), self.cross_alibi_eos_guard)
        return x, extra


class AlibiCrossPositionDecoder(CrossPositionDecoderMixin, AlibiTransformerDecoder):
    """The ALiBi decoder (its layers' hook builds the cross-attention) with the EOS guard."""


class StockCrossPositionDecoder(CrossPositionDecoderMixin, TransformerDecoderBase):
    """The stock decoder (stock positions) whose layers have the cross-attention hook."""

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(CrossPositionDecoderLayer(cfg, no_encoder_attn), cfg)


@register_model(MODEL_NAME)
class AlibiTransformerModel(ScalesFollowPrunedLayers, TransformerModel):
    """Encoder-decoder transformer, ALiBi self-attention on either side (or both)."""

    alibi_scales_keys = {"encoder": "encoder.alibi.scales", "decoder": "decoder.alibi.scales"}

    @classmethod
    def hub_models(cls):
        return {}  # no downloads: from_pretrained() takes a local directory

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt",
                        data_name_or_path=".", **kwargs):
        """The stock hub loader (``.translate(...)``, ``.sample``, ``.generate``), offline,
        refusing checkpoints of other models; a sentence longer than the training run's
        ``--max-tokens`` gets a batch of its own instead of an assertion error."""
        loaded = load_pretrained(cls, MODEL_NAME, model_name_or_path, checkpoint_file,
                                 data_name_or_path, **kwargs)
        return AlibiLanguageModelHubInterface(loaded["args"], loaded["task"], loaded["models"])

    @staticmethod
    def add_args(parser):
        TransformerModel.add_args(parser)
        parser.add_argument(
            "--encoder-alibi-variant", choices=ENCODER_VARIANTS,
            help="encoder self-attention bias: offset (default; future keys -m(j-i-0.5)), "
            "symmetric -m|i-j|, one_sided (half the heads look back, half ahead), asymmetric "
            "(forward slope = ratio x backward), none = stock position embeddings, no bias",
        )
        parser.add_argument(
            "--decoder-alibi-variant", choices=DECODER_VARIANTS,
            help="decoder self-attention bias: causal (default) -m(i-j), or none = stock "
            "position embeddings",
        )
        parser.add_argument(
            "--encoder-alibi-future-slope-ratio", type=float, metavar="R",
            help="asymmetric only: forward slope = R x backward slope, per head (default 1.0)",
        )
        parser.add_argument(
            "--encoder-alibi-learnable-future-slopes", action="store_true",
            help="asymmetric only: learn the forward/backward slope ratio of every head",
        )
        for side in ("encoder", "decoder"):
            parser.add_argument(
                f"--{side}-alibi-learned-scales", choices=SCALE_MODES,
                help=f"learn a multiplier of the {side}'s ALiBi slopes (data2vec 2.0's learned "
                "alibi scale): none (fixed slopes, default), shared, per_head, per_layer, "
                "per_layer_head",
            )
            parser.add_argument(
                f"--{side}-alibi-scale-init", type=float, metavar="S",
                help=f"initial value of the {side}'s learned slope scales (with none: a fixed "
                "multiplier); positive, default 1.0",
            )
        parser.add_argument(
            "--alibi-attention", choices=ATTENTION_BACKENDS,
            help="attention implementation of both sides (default auto); can be overridden "
            "at load time with --model-overrides \"{'alibi_attention': 'naive'}\"",
        )
        parser.add_argument(
            "--cross-alibi", choices=CROSS_ALIBI_MODES,
            help="cross-attention position bias on --cross-alibi-heads heads: none (default, "
            "stock), pointer -m|j - p_t| around a learned monotonic source pointer "
            "p_t = p_{t-1} + softplus(w.x_t + b), ratio -m|j - r.t| (r: --cross-alibi-ratio)",
        )
        parser.add_argument(
            "--cross-alibi-heads", type=int, metavar="K",
            help="how many decoder heads get the --cross-alibi bias (slopes of K heads); the "
            "others are content only (default: half the heads, at least 1)",
        )
        parser.add_argument(
            "--cross-alibi-slope-scale", type=float, metavar="X",
            help="the --cross-alibi heads' slopes are X times Press's slopes of K heads "
            "(default 1; 16 with 2 biased heads: slopes 1 and 1/16)",
        )
        parser.add_argument(
            "--cross-alibi-ratio", type=float, metavar="R",
            help="--cross-alibi ratio: source tokens per target token of the training corpus "
            "(required with ratio)",
        )
        parser.add_argument(
            "--cross-attention-length-scale", type=float, metavar="N",
            help="multiply the cross-attention content logits by log S / log N (S: the row's "
            "real source length; N > 1, e.g. the mean training source length); 0 = off "
            "(default)",
        )
        parser.add_argument(
            "--cross-alibi-eos-guard", type=float, metavar="D",
            help="decoding only, with --cross-alibi pointer: EOS is forbidden while the last "
            "layer's pointer (--cross-alibi-eos-guard-layer) is more than D source tokens before "
            "the last source token; -1 = off (default)",
        )
        parser.add_argument(
            "--cross-alibi-eos-guard-layer", choices=EOS_GUARD_LAYERS,
            help="the pointer the EOS guard reads: last (default), first, or min (the pointer "
            "furthest behind over the layers); a decoding option (--model-overrides)",
        )
        parser.add_argument(
            "--position-shift", type=int, metavar="K",
            help="SHAPE on a side with --*-alibi-variant none: offset each training sentence's "
            "sinusoidal positions by a random integer in [0, K] (0 at inference); 0 = off",
        )
        parser.add_argument(
            "--alibi-slope-scale", type=float, metavar="S",
            help="multiply every ALiBi slope (both sides) by S at run time (default 1.0 = as "
            "trained); a load-time override",
        )

    @classmethod
    def build_model(cls, args, task):
        from omegaconf import OmegaConf

        if OmegaConf.is_config(args):
            # the stock legacy model reads options as attributes of a flat namespace; its
            # config dataclass keeps the unknown ones (ours) only from a Namespace
            args = argparse.Namespace(**OmegaConf.to_container(args, resolve=True))
        alibi_transformer_defaults(args)
        _check_options(args)
        model = super().build_model(args, task)
        _lift_task_length_limits(task, model.encoder_uses_alibi, model.decoder_uses_alibi)
        return model

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        variant = safe_getattr(cfg, "encoder_alibi_variant", "offset")
        if variant == "none":
            return _shift_positions(super().build_encoder(cfg, src_dict, embed_tokens), cfg)
        side = _side_config(
            cfg,
            alibi_variant=variant,
            alibi_future_slope_ratio=float(
                safe_getattr(cfg, "encoder_alibi_future_slope_ratio", 1.0)),
            alibi_learnable_future_slopes=bool(
                safe_getattr(cfg, "encoder_alibi_learnable_future_slopes", False)),
            alibi_attention=safe_getattr(cfg, "alibi_attention", "auto"),
            alibi_slope_scale=float(safe_getattr(cfg, "alibi_slope_scale", 1.0)),
            **_side_scales(cfg, "encoder"),
        )
        return AlibiTransformerEncoder(side, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        cross = uses_cross_position(cfg)
        no_encoder_attn = bool(safe_getattr(cfg, "no_cross_attention", False))
        if safe_getattr(cfg, "decoder_alibi_variant", "causal") == "none":
            if not cross:
                return _shift_positions(super().build_decoder(cfg, tgt_dict, embed_tokens), cfg)
            decoder = StockCrossPositionDecoder(TransformerConfig.from_namespace(cfg), tgt_dict,
                                                embed_tokens, no_encoder_attn=no_encoder_attn)
            return _shift_positions(decoder.guard_eos(cfg), cfg)
        side = _side_config(
            cfg,
            alibi_attention=safe_getattr(cfg, "alibi_attention", "auto"),
            alibi_slope_scale=float(safe_getattr(cfg, "alibi_slope_scale", 1.0)),
            **_side_scales(cfg, "decoder"),
        )
        if not cross:
            return AlibiTransformerDecoder(side, tgt_dict, embed_tokens,
                                           no_encoder_attn=no_encoder_attn)
        return AlibiCrossPositionDecoder(side, tgt_dict, embed_tokens,
                                         no_encoder_attn=no_encoder_attn).guard_eos(cfg)

    @property
    def encoder_uses_alibi(self):
        return hasattr(self.encoder, "alibi")

    @property
    def decoder_uses_alibi(self):
        return hasattr(self.decoder, "alibi")

    def upgrade_state_dict_named(self, state_dict, name):
        prefix = f"{name}." if name else ""
        sides = (("encoder", self.encoder), ("decoder", self.decoder))
        for side, module in sides:
            reject_other_dictionary(
                state_dict, f"{prefix}{side}.embed_tokens.weight", module.dictionary
            )
        _reject_missing_slopes(state_dict, prefix, sides)
        for side, module in sides:
            _check_side(state_dict, f"{prefix}{side}", module, f"--{side}-alibi-variant")
        _check_cross_position(state_dict, f"{prefix}decoder", self.decoder)
        return super().upgrade_state_dict_named(state_dict, name)


def _reject_missing_slopes(state_dict, prefix, sides):
    """One error naming every ALiBi side whose slopes the checkpoint lacks (a stock
    ``transformer`` checkpoint lacks both: one message gives the whole fix)."""
    missing = [side for side, module in sides if getattr(module, "alibi", None) is not None
               and f"{prefix}{side}.alibi.slopes" not in state_dict]
    if not missing:
        return
    for side in missing:  # learned positions: a stock model's, with its own advice
        reject_position_embeddings(state_dict, f"{prefix}{side}", MODEL_NAME)
    keys = ", ".join(f"{prefix}{side}.alibi.slopes" for side in missing)
    flags = " ".join(f"--{side}-alibi-variant none" for side in missing)
    raise ValueError(
        f"this checkpoint has no ALiBi slopes ({keys}): it was not written by {MODEL_NAME} "
        f"with ALiBi on the {' and '.join(missing)} (a stock `transformer` checkpoint?). Load "
        f"it with the architecture it was trained with, or pass `{flags}` if "
        f"{'those sides' if len(missing) > 1 else 'that side'} used stock positions"
    )


def _check_cross_position(state_dict, prefix, decoder):
    """A clear error when the checkpoint's cross-attention pointer and the model's differ."""
    built = [name for name, _ in decoder.named_parameters() if ".pointer_step." in name]
    saved = [k for k in state_dict if k.startswith(f"{prefix}.") and ".pointer_step." in k]
    if bool(built) != bool(saved):
        raise ValueError(
            f"this checkpoint was trained {'with' if saved else 'without'} --cross-alibi "
            f"pointer ({(saved or [f'{prefix}.{built[0]}'])[0]}), the model being built "
            f"{'lacks' if saved else 'has'} it: pass the checkpoint's --cross-alibi"
        )


def _check_side(state_dict, prefix, module, flag):
    """A clear error when a checkpoint's side was not built like this model's side."""
    slopes_key = f"{prefix}.alibi.slopes"
    alibi = getattr(module, "alibi", None)
    if alibi is None:
        if slopes_key in state_dict:
            heads = state_dict[slopes_key].numel()
            raise ValueError(
                f"this checkpoint was trained with ALiBi on the {prefix.rsplit('.', 1)[-1]} "
                f"({slopes_key}, {heads} heads), but the model being built has stock positions "
                f"there: drop `{flag} none` (or pass the variant it was trained with)"
            )
        return
    saved = state_dict[slopes_key]
    if saved.shape != alibi.slopes.shape or not torch.equal(saved.float(), alibi.slopes.float()):
        one_sided = variant_slopes(saved.numel(), "one_sided") if saved.numel() % 2 == 0 else None
        hint = "one_sided" if one_sided is not None and torch.equal(saved.float(), one_sided) \
            else "another variant or head count"
        raise ValueError(
            f"this checkpoint's {slopes_key} ({saved.numel()} heads) are the slopes of {hint}, "
            f"not those of the model being built ({alibi.variant}, {alibi.num_heads} heads): "
            f"pass the checkpoint's {flag} and attention heads"
        )
    ratio_key = f"{prefix}.alibi.future_slope_ratio"
    if (ratio_key in state_dict) != (alibi.future_slope_ratio is not None):
        raise ValueError(
            f"this checkpoint's {prefix} is {'' if ratio_key in state_dict else 'not '}an "
            f"asymmetric ALiBi one, the model being built is {alibi.variant}: pass the "
            f"checkpoint's {flag}"
        )


def _alibi_defaults(args):
    args.encoder_alibi_variant = safe_getattr(args, "encoder_alibi_variant", "offset")
    args.decoder_alibi_variant = safe_getattr(args, "decoder_alibi_variant", "causal")
    args.encoder_alibi_future_slope_ratio = float(
        safe_getattr(args, "encoder_alibi_future_slope_ratio", 1.0)
    )
    args.encoder_alibi_learnable_future_slopes = bool(
        safe_getattr(args, "encoder_alibi_learnable_future_slopes", False)
    )
    args.alibi_attention = safe_getattr(args, "alibi_attention", "auto")
    args.alibi_slope_scale = float(safe_getattr(args, "alibi_slope_scale", 1.0))
    args.cross_alibi = safe_getattr(args, "cross_alibi", "none")
    args.cross_alibi_heads = safe_getattr(args, "cross_alibi_heads", None)
    args.cross_alibi_ratio = safe_getattr(args, "cross_alibi_ratio", None)
    args.cross_alibi_slope_scale = float(safe_getattr(args, "cross_alibi_slope_scale", 1.0))
    args.cross_attention_length_scale = float(
        safe_getattr(args, "cross_attention_length_scale", 0.0))
    args.cross_alibi_eos_guard = float(safe_getattr(args, "cross_alibi_eos_guard", -1.0))
    args.cross_alibi_eos_guard_layer = safe_getattr(args, "cross_alibi_eos_guard_layer",
                                                    None) or "last"
    args.position_shift = int(safe_getattr(args, "position_shift", 0))
    for side in ("encoder", "decoder"):
        setattr(args, f"{side}_alibi_learned_scales",
                safe_getattr(args, f"{side}_alibi_learned_scales", "none"))
        setattr(args, f"{side}_alibi_scale_init",
                float(safe_getattr(args, f"{side}_alibi_scale_init", 1.0)))


@register_model_architecture(MODEL_NAME, MODEL_NAME)
def alibi_transformer_defaults(args):
    """Stock ``transformer`` sizes (6+6 layers, 512 dims, 8 heads), offset + causal ALiBi."""
    _alibi_defaults(args)
    ARCH_CONFIG_REGISTRY["transformer"](args)


def _mirror_stock_architectures():
    """Register ``alibi_<arch>`` for every stock ``transformer`` architecture.

    ``alibi_transformer_iwslt_de_en``, ``alibi_transformer_wmt_en_de``,
    ``alibi_transformer_vaswani_wmt_en_de_big``, ... each set the same sizes as their stock
    namesake, plus the ALiBi defaults.
    """
    for arch in sorted(ARCH_MODEL_INV_REGISTRY["transformer"]):
        if arch == "transformer":
            continue
        stock = ARCH_CONFIG_REGISTRY[arch]

        def mirrored(args, stock=stock):
            _alibi_defaults(args)
            stock(args)

        mirrored.__doc__ = f"Stock ``{arch}`` sizes with ALiBi (offset encoder, causal decoder)."
        register_model_architecture(MODEL_NAME, f"alibi_{arch}")(mirrored)


_mirror_stock_architectures()
