"""``alibi_transformer_lm``: fairseq's ``transformer_lm`` with ALiBi instead of position embeddings.

Everything is stock ``transformer_lm`` (adaptive input/softmax, tied embeddings, layerdrop,
pre/post-norm, activation checkpointing, fp16/bf16) except that the decoder has no position
embeddings, every self-attention adds the causal ALiBi bias, and the model has no maximum
length: a model trained at L evaluates and generates at any length.

Compact (ALBERT-style) models: ``--share-decoder-layers`` makes every layer use the first one's
parameters, and the stock ``--decoder-input-dim E --decoder-output-dim E`` with
``--share-decoder-input-output-embed`` factorise the embedding (``V·E + 2·E·H`` parameters,
the two projections included, instead of ``V·H``); see :mod:`fairseq_alibi.modules.compact`.
"""

import copy
import logging
from dataclasses import dataclass, field

import torch

from fairseq.models import (
    ARCH_CONFIG_REGISTRY,
    ARCH_MODEL_INV_REGISTRY,
    register_model,
    register_model_architecture,
)
from fairseq.models.transformer import TransformerConfig, TransformerDecoder
from fairseq.models.transformer_lm import (
    TransformerLanguageModel,
    TransformerLanguageModelConfig,
)

from fairseq.dataclass import ChoiceEnum

from fairseq_alibi.alibi import SCALE_MODES
from fairseq_alibi.modules.bias_cache import CachedAlibiBias
from fairseq_alibi.modules.attention import ATTENTION_BACKENDS
from fairseq_alibi.modules import AlibiTransformerDecoderLayer, wrap_layer
from fairseq_alibi.hub import AlibiLanguageModelHubInterface, load_pretrained
from fairseq_alibi.models.checks import (
    UNBOUNDED_POSITIONS,
    check_tokens_per_sample,
    refuse_position_embedding_flags,
    reject_other_dictionary,
    reject_position_embeddings,
)
from fairseq_alibi.models.layer_pruning import ScalesFollowPrunedLayers
from fairseq_alibi.modules.compact import describe_parameters, share_layer_parameters

logger = logging.getLogger(__name__)

def check_factorized_embedding(args, embed_tokens):
    """A clear error for a tied output layer whose size differs from the input embedding's.

    A factorised embedding is stock fairseq: ``--decoder-input-dim E`` embeds tokens in ``E``
    dims and projects them to ``--decoder-embed-dim``; ``--decoder-output-dim E`` projects the
    features back, and ``--share-decoder-input-output-embed`` ties the output layer to the
    ``V × E`` table, which needs both dims equal (the stock model only fails at the first batch).
    """
    if not getattr(args, "share_decoder_input_output_embed", False):
        return
    input_dim = getattr(embed_tokens, "embedding_dim", None)
    if isinstance(embed_tokens, torch.nn.Embedding) and input_dim != args.decoder_output_dim:
        raise ValueError(
            f"--share-decoder-input-output-embed ties the output layer to the {input_dim}-dim "
            f"input embedding, but --decoder-output-dim is {args.decoder_output_dim}: set "
            f"--decoder-output-dim {input_dim} (a factorised embedding sets --decoder-input-dim "
            f"and --decoder-output-dim to the same small size)"
        )


@dataclass
class AlibiTransformerLanguageModelConfig(TransformerLanguageModelConfig):
    alibi_attention: ChoiceEnum(ATTENTION_BACKENDS) = field(
        default="auto",
        metadata={"help": "attention implementation; saved with the model, can be overridden "
                  "at load time with --model-overrides \"{'alibi_attention': 'naive'}\""},
    )
    alibi_slope_scale: float = field(
        default=1.0,
        metadata={"help": "multiply every ALiBi slope by this at run time (slope "
                  "interpolation: L_train / L_eval); a load-time override, 1.0 = as trained"},
    )
    alibi_learned_scales: ChoiceEnum(SCALE_MODES) = field(
        default="none",
        metadata={"help": "learn a multiplier of the ALiBi slopes (data2vec 2.0's learned "
                  "alibi scale): none (fixed slopes, the default), shared (one), per_head, "
                  "per_layer, per_layer_head; saved with the model (docs/learned_scales.md)"},
    )
    alibi_scale_init: float = field(
        default=1.0,
        metadata={"help": "initial value of the learned slope scales (with none: a fixed "
                  "multiplier); must be positive, 1.0 = Press et al.'s slopes"},
    )
    share_decoder_layers: bool = field(
        default=False,
        metadata={"help": "ALBERT-style cross-layer sharing: every decoder layer uses the "
                  "parameters of the first (one layer's parameters, --decoder-layers layers "
                  "computed)"},
    )


class AlibiTransformerDecoder(TransformerDecoder):
    """Stock ``TransformerDecoder``: no position embeddings, ALiBi self-attention layers."""

    def __init__(self, args, dictionary, embed_tokens, no_encoder_attn=True, **kwargs):
        args.no_token_positional_embeddings = True  # the bias replaces them
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn, **kwargs)

    def build_decoder_layer(self, args, no_encoder_attn=False):
        cfg = TransformerConfig.from_namespace(args)
        if not hasattr(self, "alibi"):  # one bias module for all layers, built with the first
            self.alibi = CachedAlibiBias(
                cfg.decoder.attention_heads,
                "causal",
                slope_scale=getattr(self.args, "alibi_slope_scale", 1.0),
                num_layers=cfg.decoder.layers,
                learned_scales=str(getattr(self.args, "alibi_learned_scales", "none")),
                scale_init=float(getattr(self.args, "alibi_scale_init", 1.0)),
            )
            self.alibi_layers_built = 0
        attention = getattr(self.args, "alibi_attention", "auto")  # validated by the layer
        layer = AlibiTransformerDecoderLayer(cfg, self.alibi, no_encoder_attn, attention=attention,
                                             layer_index=self.alibi_layers_built)
        self.alibi_layers_built += 1
        return wrap_layer(layer, cfg)

    def buffered_future_mask(self, tensor):
        return None  # causality is part of the causal ALiBi bias: no (T, T) mask to build

    def max_positions(self):
        return UNBOUNDED_POSITIONS

    def upgrade_state_dict_named(self, state_dict, name):
        reject_position_embeddings(state_dict, name, "alibi_transformer_lm")
        reject_other_dictionary(state_dict, f"{name}.embed_tokens.weight", self.dictionary)
        if f"{name}.alibi.slopes" not in state_dict:
            raise ValueError(
                f"this checkpoint has no ALiBi slopes ({name}.alibi.slopes): it was written by "
                "a stock model with position embeddings, not alibi_transformer_lm. Load it with "
                "its own architecture, or convert it with `python -m fairseq_alibi.convert`"
            )
        return super().upgrade_state_dict_named(state_dict, name)


@register_model("alibi_transformer_lm", dataclass=AlibiTransformerLanguageModelConfig)
class AlibiTransformerLanguageModel(ScalesFollowPrunedLayers, TransformerLanguageModel):
    alibi_scales_keys = {"decoder": "decoder.alibi.scales"}  # --decoder-layers-to-keep

    @classmethod
    def hub_models(cls):
        return {}

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        refuse_position_embedding_flags(parser, "alibi_transformer_lm")

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt",
                        data_name_or_path=".", **kwargs):
        """The stock hub loader, offline, refusing stock checkpoints, scoring any length."""
        loaded = load_pretrained(cls, "alibi_transformer_lm", model_name_or_path,
                                 checkpoint_file, data_name_or_path, **kwargs)
        return AlibiLanguageModelHubInterface(loaded["args"], loaded["task"], loaded["models"])

    @classmethod
    def build_model(cls, args, task):
        check_tokens_per_sample(args)
        # Let the stock model build the token embedding (plain, adaptive or character
        # input) without any layers, then build the ALiBi decoder around that embedding.
        embedding_args = copy.deepcopy(args)
        embedding_args.decoder_layers, embedding_args.decoder_layers_to_keep = 0, None
        embedding_args.no_token_positional_embeddings = True
        embed_tokens = super().build_model(embedding_args, task).decoder.embed_tokens

        if args.decoder_layers_to_keep:
            args.decoder_layers = len(args.decoder_layers_to_keep.split(","))
        check_factorized_embedding(args, embed_tokens)
        decoder = AlibiTransformerDecoder(args, task.target_dictionary, embed_tokens)
        shared = getattr(args, "share_decoder_layers", False)  # absent from older checkpoints
        if shared:
            share_layer_parameters(decoder.layers)
        model = cls(decoder)
        embed_dim = getattr(embed_tokens, "embedding_dim", args.decoder_embed_dim)
        logger.info(describe_parameters(model, len(decoder.layers), shared, embed_dim,
                                        args.decoder_embed_dim))
        return model


def _mirror_stock_architectures():
    """Register ``alibi_<arch>`` for every stock ``transformer_lm`` architecture.

    ``alibi_transformer_lm`` (base), ``alibi_transformer_lm_wiki103`` (the paper's 16-layer,
    1024-dim, 8-head adaptive-input model), ``alibi_transformer_lm_gpt``,
    ``alibi_transformer_lm_gpt2_small``, ``alibi_transformer_lm_gpt2_medium``, ... each set the
    same defaults as their stock namesake.
    """
    for arch in sorted(ARCH_MODEL_INV_REGISTRY["transformer_lm"]):
        if arch == "transformer_lm":  # registered with the model, from the dataclass defaults
            continue
        register_model_architecture("alibi_transformer_lm", f"alibi_{arch}")(
            ARCH_CONFIG_REGISTRY[arch]
        )


_mirror_stock_architectures()


# ---------------------------------------------------------------------------------------------
# alibi_bloom: the options under which alibi_transformer_lm computes exactly what transformers'
# BloomForCausalLM computes (docs/huggingface.md has the mapping and how it was verified)

#: BLOOM's published sizes: (embedding dim, layers, heads)
BLOOM_SIZES = {"560m": (1024, 24, 16), "1b1": (1536, 24, 16), "1b7": (2048, 24, 16),
               "3b": (2560, 30, 32), "7b1": (4096, 30, 32)}


def bloom_options(embed_dim: int) -> dict:
    """Every option that differs from BLOOM somewhere in ``alibi_transformer_lm``, at BLOOM's
    value: pre-LN with the final layer norm, the embedding layer norm, tanh GELU, FFN = 4·d,
    tied input/output embeddings of the model's width, no embedding scale, nothing adaptive,
    Press's fixed slopes."""
    return {
        "decoder_normalize_before": True, "no_decoder_final_norm": False,
        "layernorm_embedding": True, "activation_fn": "gelu_accurate",
        "decoder_ffn_embed_dim": 4 * embed_dim, "no_scale_embedding": True,
        "share_decoder_input_output_embed": True,
        "decoder_input_dim": embed_dim, "decoder_output_dim": embed_dim,
        "adaptive_input": False, "adaptive_softmax_cutoff": None, "character_embeddings": False,
        "cross_self_attention": False, "share_decoder_layers": False,
        "alibi_learned_scales": "none", "alibi_scale_init": 1.0,
        "scale_fc": False, "scale_attn": False, "scale_heads": False, "scale_resids": False,
    }


def alibi_bloom_architecture(args, embed_dim=512, layers=6, heads=8):
    """Sizes by default (any size with ``--decoder-embed-dim/-layers/-attention-heads``), every
    other option BLOOM's: like stock ``base_lm_architecture`` forcing pre-LN, a flag that
    contradicts BLOOM is overridden, and said so in the log."""
    from fairseq.models.transformer_lm import base_lm_architecture

    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", embed_dim)
    args.decoder_layers = getattr(args, "decoder_layers", layers)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", heads)
    for key, value in bloom_options(args.decoder_embed_dim).items():
        given = getattr(args, key, value)
        if given != value and str(given) != str(value):
            logger.warning(f"alibi_bloom: {key}={given!r} replaced by BLOOM's {value!r}")
        setattr(args, key, value)
    base_lm_architecture(args)


register_model_architecture("alibi_transformer_lm", "alibi_bloom")(alibi_bloom_architecture)
for _size, (_dim, _layers, _heads) in BLOOM_SIZES.items():
    register_model_architecture("alibi_transformer_lm", f"alibi_bloom_{_size}")(
        lambda args, d=_dim, n=_layers, h=_heads: alibi_bloom_architecture(args, d, n, h))
