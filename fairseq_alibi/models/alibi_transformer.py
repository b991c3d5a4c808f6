"""``alibi_transformer``: fairseq's encoder-decoder ``transformer`` with ALiBi, for translation.

Everything is stock ``transformer`` (``--task translation``, shared or separate dictionaries,
``--share-all-embeddings``, pre/post-norm, layerdrop, activation checkpointing, alignment
printing, beam search, the hub interface) except the two build hooks of
:class:`~fairseq.models.transformer.TransformerModel`:

* ``build_encoder``: with ``--encoder-alibi-variant`` one of ``symmetric``, ``one_sided``,
  ``offset`` (default), ``asymmetric``, the ALiBi encoder stack
  (:class:`~fairseq_alibi.modules.stacks.AlibiTransformerEncoder`, ``alibi_roberta``'s too): no
  position embeddings, every self-attention adds the bidirectional bias of that variant.
  ``none`` keeps the stock encoder and its sinusoidal (or ``--encoder-learned-pos``) positions.
* ``build_decoder``: with ``--decoder-alibi-variant causal`` (default), the ALiBi decoder stack
  (:class:`~fairseq_alibi.modules.stacks.AlibiTransformerDecoder`, ``alibi_transformer_lm``'s
  too) with its cross-attention kept: causal ALiBi self-attention, exact with a KV cache and
  beam reordering. ``none`` keeps the stock decoder.

Cross-attention (decoder queries, encoder keys) is stock by default: no position bias, as in
EIFY's fork and T5; the two sequences have no common position axis for ``i - j`` to measure.
The options of docs/translation.md, "Cross-attention position options", give it one (either
decoder variant): ``--cross-alibi {pointer,ratio}`` on ``--cross-alibi-heads`` heads (a bias
around a learned monotonic source pointer, or around ``--cross-alibi-ratio`` × the target
position), ``--cross-attention-length-scale N`` (content logits × ``log S / log N``) and, at
decoding, ``--cross-alibi-eos-guard D`` (:class:`~fairseq_alibi.modules.stacks.EosGuard`):
:class:`~fairseq_alibi.options.CrossOptions`. The decoder
layers build that attention in their ``build_encoder_attention`` hook
(:mod:`fairseq_alibi.modules.cross_position`); with the options off it is fairseq's own.
``--position-shift K`` (SHAPE) offsets the positions of a stock sinusoidal side by a random
``k ∈ [0, K]`` per sentence while training (:mod:`fairseq_alibi.modules.position_shift`).

An ALiBi side has no maximum length: its ``max_positions()`` is unbounded and the translation
task's ``--max-source-positions`` / ``--max-target-positions`` filter is lifted for that side,
so long sources are translated instead of skipped or refused.

Options: the stacks' (``--encoder-alibi-*``, ``--decoder-alibi-*``, the model-wide
``--alibi-attention`` / ``--alibi-slope-scale``) and the cross-attention's are declared once in
:mod:`fairseq_alibi.options` and reach the stacks as objects (:func:`model_options`).

The saved state is the stock ``transformer``'s (same parameter names) plus the slopes buffers
``encoder.alibi.slopes`` / ``decoder.alibi.slopes`` of the ALiBi sides (and
``encoder.alibi.future_slope_ratio`` with ``asymmetric``, ``encoder.alibi.scales`` /
``decoder.alibi.scales`` with ``--encoder-alibi-learned-scales`` /
``--decoder-alibi-learned-scales``: docs/learned_scales.md), and, with a cross-attention
position option, ``longest_training_source.tokens``: the longest real source the model was
trained on (tokens, EOS included), raised by every training forward pass, which
``--cross-alibi-inference-longer-than`` follows unless it is given (a checkpoint saved before
it loads with none recorded: every source, as then), and with ``--cross-alibi`` each layer's
``encoder_attn.slopes`` (the training slopes, whose non-zero count, ``--cross-alibi-heads``,
is checked at load; a checkpoint saved before gets the built ones).
"""

import argparse
import copy
import logging

from fairseq.models import ARCH_CONFIG_REGISTRY, register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig, TransformerModel
from fairseq.utils import safe_getattr

from fairseq_alibi import options
from fairseq_alibi.hub import AlibiLanguageModelHubInterface, load_pretrained
from fairseq_alibi.models.architectures_and_limits import (
    lift_task_length_limit,
    mirror_stock_architectures,
)
from fairseq_alibi.models.checks import (check_attention_heads, check_document_mask,
                                          check_saved_sizes, check_saved_stacks,
                                          refuse_fork_flags, reject_other_dictionary)
from fairseq_alibi.models.layer_pruning import ScalesFollowPrunedLayers
from fairseq_alibi.modules.checkpoint_match import mismatch
from fairseq_alibi.modules.cross_position import CrossPositionAttention, LongestSource
from fairseq_alibi.modules.position_shift import ShiftedPositions
from fairseq_alibi.modules.stacks import (
    AlibiCrossPositionDecoder,
    AlibiTransformerDecoder,
    AlibiTransformerEncoder,
    StockCrossPositionDecoder,
)

logger = logging.getLogger(__name__)

MODEL_NAME = "alibi_transformer"
SIDES = {"encoder": options.TRANSLATION_ENCODER, "decoder": options.TRANSLATION_DECODER}


def model_options(cfg):
    """The model's option objects: ``(encoder stack, decoder stack, cross-attention)``."""
    return (options.read(options.StackOptions, cfg, options.TRANSLATION_ENCODER),
            options.read(options.StackOptions, cfg, options.TRANSLATION_DECODER),
            options.read(options.CrossOptions, cfg))


@options.one_line_errors
def _check_options(args, task):
    """Clear errors for option values and combinations that cannot work (and ``task``'s notes
    on the document masks)."""
    check_attention_heads(args, "encoder", "decoder")
    encoder, decoder, cross = model_options(args)
    options.check_stacks({options.TRANSLATION_ENCODER: (encoder, args.encoder_attention_heads),
                          options.TRANSLATION_DECODER: (decoder, args.decoder_attention_heads)})
    for side, stack in (("encoder", encoder), ("decoder", decoder)):
        if stack.uses_alibi and safe_getattr(args, f"{side}_learned_pos", False):
            raise ValueError(
                f"--{side}-learned-pos asks for learned position embeddings, which ALiBi "
                f"replaces: drop it, or pass --{side}-alibi-variant none for stock positions"
            )
    if str(encoder.document_mask) == "eos":
        raise ValueError(
            "--encoder-alibi-document-mask eos: a source ends with its </s>, and eos makes every "
            "</s> open a document, so that </s> would be a document of its own, cut off from "
            "its sentence; use doc (a document opens at an </s> right after an </s>: join a "
            "packed source's documents with two) or none (a model saved with it loads with "
            "--model-overrides \"{'encoder_alibi_document_mask': 'none'}\")"
        )
    for side, stack in (("encoder", encoder), ("decoder", decoder)):
        check_document_mask(stack, task, f"--{side}-alibi-document-mask")
    if decoder.uses_alibi and safe_getattr(args, "cross_self_attention"):
        raise ValueError(
            "--cross-self-attention puts encoder states into the decoder's self-attention, "
            "where a causal ALiBi bias has no position for them: drop it, or use "
            "--decoder-alibi-variant none"
        )
    stock_sides = [side for side, stack in (("encoder", encoder), ("decoder", decoder))
                   if not stack.uses_alibi]
    cross.check(args.decoder_attention_heads, stock_sides, args)


def _shift_positions(side, cross: options.CrossOptions):
    """SHAPE on a stock side: its sinusoidal ``embed_positions`` offset while training."""
    if cross.position_shift:
        side.embed_positions = ShiftedPositions(side.embed_positions, cross.position_shift)
    return side

options.declare_family(MODEL_NAME, (options.StackOptions, tuple(SIDES.values())),
                       (options.CrossOptions, (None,)))


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
        options.add_args(parser, options.StackOptions, *SIDES.values())
        options.add_args(parser, options.CrossOptions, None)
        refuse_fork_flags(parser, MODEL_NAME)

    @classmethod
    def build_model(cls, args, task):
        from omegaconf import OmegaConf

        if OmegaConf.is_config(args):
            # the stock legacy model reads options as attributes of a flat namespace; its
            # config dataclass keeps the unknown ones (ours) only from a Namespace
            args = argparse.Namespace(**OmegaConf.to_container(args, resolve=True))
        alibi_transformer_defaults(args)
        _check_options(args, task)
        model = super().build_model(args, task)
        lift_task_length_limit(task, (model.encoder_uses_alibi, model.decoder_uses_alibi))
        return model

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        stack, _, cross = model_options(cfg)
        if not stack.uses_alibi:
            return _shift_positions(super().build_encoder(cfg, src_dict, embed_tokens), cross)
        # a copy: the stack marks its config as having no position embeddings
        return AlibiTransformerEncoder(copy.deepcopy(cfg), src_dict, embed_tokens, stack)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        _, stack, cross = model_options(cfg)
        no_encoder_attn = bool(safe_getattr(cfg, "no_cross_attention", False))
        if not stack.uses_alibi:
            if not cross.uses_cross_position:
                return _shift_positions(super().build_decoder(cfg, tgt_dict, embed_tokens), cross)
            decoder = StockCrossPositionDecoder(
                TransformerConfig.from_namespace(cfg), tgt_dict, embed_tokens, cross,
                attention=stack.attention, no_encoder_attn=no_encoder_attn)
            return _shift_positions(decoder, cross)
        decoder = AlibiCrossPositionDecoder if cross.uses_cross_position \
            else AlibiTransformerDecoder
        return decoder(copy.deepcopy(cfg), tgt_dict, embed_tokens, stack,
                       no_encoder_attn=no_encoder_attn, cross=cross)

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        cross = [m for m in decoder.modules() if isinstance(m, CrossPositionAttention)]
        # with a cross-attention position option only (the others save what they did): the
        # longest training source, saved with the model, what the cross-attention reads when
        # --cross-alibi-inference-longer-than is not given
        self.longest_training_source = LongestSource() if cross else None
        for m in cross:
            m.use_longest_source(self.longest_training_source)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, **kwargs):
        if self.training and self.longest_training_source is not None:
            self.longest_training_source.record(src_lengths)  # real lengths, EOS included
        return super().forward(src_tokens, src_lengths, prev_output_tokens, **kwargs)

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
            which = "source" if side == "encoder" else "target"
            reject_other_dictionary(
                state_dict, f"{prefix}{side}.embed_tokens.weight", module.dictionary,
                file_name=f"dict.<{which}-lang>.txt",
                preprocess_flag="--srcdict" if side == "encoder" else "--tgtdict")
        check_saved_sizes(state_dict, self.state_dict(),
                          {f"{prefix}{side}": (side, side) for side, _ in sides})
        check_saved_stacks(
            state_dict, {f"{prefix}{side}": (getattr(module, "alibi", None), SIDES[side].flag,
                                             f"--{side}-attention-heads")
                         for side, module in sides},
            MODEL_NAME, stock_flag="--{side}-alibi-variant none")
        _check_cross_position(state_dict, f"{prefix}decoder", self.decoder)
        return super().upgrade_state_dict_named(state_dict, name)


def _check_cross_position(state_dict, prefix, decoder):
    """The checkpoint's cross-attention pointer and the model's (a parameter of each layer's
    ``encoder_attn``) must both be there or both be absent."""
    built = [name for name, _ in decoder.named_parameters() if ".pointer_step." in name]
    saved = [k for k in state_dict if k.startswith(f"{prefix}.") and ".pointer_step." in k]
    if bool(built) != bool(saved):
        pointer = f"--cross-alibi pointer ({(saved or [f'{prefix}.{built[0]}'])[0]})"
        raise mismatch(pointer if saved else "no --cross-alibi pointer",
                       "no --cross-alibi pointer" if saved else pointer,
                       "--cross-alibi pointer" if saved else
                       "the --cross-alibi it was trained with (saved in its options)")
    _check_cross_slopes(state_dict, prefix, decoder)


def _check_cross_slopes(state_dict, prefix, decoder):
    """``--cross-alibi-heads`` of the checkpoint (the non-zero saved training slopes,
    ``encoder_attn.slopes``) against the model's: no other tensor tells K, and another K loads
    and computes something else. A checkpoint saved before the slopes were (none saved) gets
    the built ones, and loads as before."""
    built = {f"{prefix}.{name}": slopes for name, slopes in decoder.named_buffers()
             if name.endswith(".encoder_attn.slopes")}
    saved = [k for k in state_dict if k.startswith(f"{prefix}.") and
             k.endswith(".encoder_attn.slopes")]
    if not saved:
        state_dict.update({k: v.detach().clone() for k, v in built.items()})
        return
    key = saved[0]
    was = state_dict[key].detach().float().cpu()
    heads = int(was.ne(0).sum())
    if not built and not any(isinstance(m, CrossPositionAttention) for m in decoder.modules()):
        for k in saved:  # a stock cross-attention: loads the weights as before this record
            del state_dict[k]
        return
    if not built:
        raise mismatch(f"--cross-alibi ratio or pointer on {heads} heads ({key})",
                       "no cross-attention bias", "the --cross-alibi it was trained with "
                       "(saved in its options)")
    now = built.get(key, next(iter(built.values()))).detach().float().cpu()
    if was.numel() != now.numel():
        raise mismatch(f"{was.numel()} decoder heads ({key})", f"{now.numel()} decoder heads",
                       f"--decoder-attention-heads {was.numel()}")
    if heads != int(now.ne(0).sum()):
        raise mismatch(f"--cross-alibi-heads {heads} ({key})",
                       f"--cross-alibi-heads {int(now.ne(0).sum())}",
                       f"--cross-alibi-heads {heads}")
    # the slopes built from the options, as before they were saved: the scale is the options'
    # (the buffers _apply rebuilds from them), the saved slopes only tell K
    state_dict.update({k: v.detach().clone() for k, v in built.items() if k in state_dict})


def _alibi_defaults(args):
    options.fill_defaults(args, options.StackOptions, *SIDES.values())
    options.fill_defaults(args, options.CrossOptions, None)


@register_model_architecture(MODEL_NAME, MODEL_NAME)
def alibi_transformer_defaults(args):
    """Stock ``transformer`` sizes (6+6 layers, 512 dims, 8 heads), offset + causal ALiBi."""
    _alibi_defaults(args)
    ARCH_CONFIG_REGISTRY["transformer"](args)


mirror_stock_architectures("transformer", MODEL_NAME, _alibi_defaults)
