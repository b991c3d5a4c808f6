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
import dataclasses
import logging
from dataclasses import dataclass, field

import torch
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer_lm import (
    TransformerLanguageModel,
    TransformerLanguageModelConfig,
)

from fairseq_alibi import options
from fairseq_alibi.config_access import flag_of_key
from fairseq_alibi.hub import AlibiLanguageModelHubInterface, load_pretrained
from fairseq_alibi.models.checks import (
    refuse_translation_task,
    check_attention_heads,
    check_saved_sizes,
    check_saved_stacks,
    check_shared_layers,
    check_tokens_per_sample,
    check_document_mask,
    refuse_fork_flags,
    refuse_position_embedding_flags,
    reject_other_dictionary,
    reject_position_embeddings,
)
from fairseq_alibi.models.architectures_and_limits import mirror_stock_architectures
from fairseq_alibi.models.layer_pruning import ScalesFollowPrunedLayers
from fairseq_alibi.modules.compact import describe_parameters, share_layer_parameters
from fairseq_alibi.modules.stacks import AlibiTransformerDecoder

logger = logging.getLogger(__name__)

MODEL_NAME = "alibi_transformer_lm"


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


def check_adaptive_cutoffs(args, task):
    """A one-line error for adaptive input or softmax cutoffs that reach past the dictionary,
    which stock fairseq only asserts deep inside the build (``cannot specify cutoff larger than
    vocab size``): the ``wiki103`` architectures' ``20000,60000`` were sized for WikiText-103's
    267k words, so another corpus's smaller dictionary needs its own."""
    from fairseq.utils import eval_str_list

    found = []
    if getattr(args, "adaptive_input", False):
        found.append(("adaptive_input_cutoff", len(task.source_dictionary)))
    if getattr(args, "adaptive_softmax_cutoff", None) is not None:
        found.append(("adaptive_softmax_cutoff", len(task.target_dictionary)))
    for name, words in found:
        value = getattr(args, name, None)
        cutoffs = eval_str_list(value, type=int) if value is not None else []
        if cutoffs and max(cutoffs) > words:
            flags = [(n, flag_of_key(n)) for n, _ in found]
            example = f"{words // 4},{words // 2}"
            raise options.OptionError(
                f"{flag_of_key(name)} {value} reaches past the dictionary's {words:,} "
                f"words: give cutoffs below it, e.g. "
                f"{' '.join(f'{flag} {example}' for _, flag in flags)} (fairseq-hydra-train: "
                f"{' '.join(repr(f'++model.{n}={example!r}') for n, _ in flags)}), or an "
                "architecture without adaptive input or softmax (--arch alibi_transformer_lm)")


@dataclass
class _LanguageModelConfig(TransformerLanguageModelConfig):
    share_decoder_layers: bool = field(
        default=False,
        metadata={"help": "ALBERT-style cross-layer sharing: every decoder layer uses the "
                  "parameters of the first (one layer's parameters, --decoder-layers layers "
                  "computed)"},
    )


#: stock ``transformer_lm``'s config, plus the ALiBi options of a causal stack
#: (:data:`fairseq_alibi.options.LM`: ``--alibi-attention``, ``--alibi-slope-scale``,
#: ``--alibi-learned-scales``, ...) and ``--share-decoder-layers``
AlibiTransformerLanguageModelConfig = dataclasses.make_dataclass(
    "AlibiTransformerLanguageModelConfig",
    options.dataclass_fields(options.StackOptions, options.LM),
    bases=(_LanguageModelConfig,),
)

options.declare_family(MODEL_NAME, (options.StackOptions, (options.LM,)))


@register_model(MODEL_NAME, dataclass=AlibiTransformerLanguageModelConfig)
class AlibiTransformerLanguageModel(ScalesFollowPrunedLayers, TransformerLanguageModel):
    """Stock ``transformer_lm`` whose decoder is the ALiBi stack (no position embeddings)."""

    alibi_scales_keys = {"decoder": "decoder.alibi.scales"}  # --decoder-layers-to-keep

    @classmethod
    def hub_models(cls):
        return {}

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        refuse_position_embedding_flags(parser, MODEL_NAME)
        refuse_fork_flags(parser, MODEL_NAME)

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt",
                        data_name_or_path=".", **kwargs):
        """The stock hub loader, offline, refusing stock checkpoints, scoring any length."""
        loaded = load_pretrained(cls, MODEL_NAME, model_name_or_path, checkpoint_file,
                                 data_name_or_path, **kwargs)
        return AlibiLanguageModelHubInterface(loaded["args"], loaded["task"], loaded["models"])

    @classmethod
    def build_model(cls, args, task):
        refuse_translation_task(task, MODEL_NAME)
        check_tokens_per_sample(args)
        check_attention_heads(args, "decoder")
        stack = options.read(options.StackOptions, args, options.LM)
        options.check_stacks({options.LM: (stack, args.decoder_attention_heads)})
        check_document_mask(stack, task)
        check_adaptive_cutoffs(args, task)
        # Let the stock model build the token embedding (plain, adaptive or character
        # input) without any layers, then build the ALiBi decoder around that embedding.
        embedding_args = copy.deepcopy(args)
        embedding_args.decoder_layers, embedding_args.decoder_layers_to_keep = 0, None
        embedding_args.no_token_positional_embeddings = True
        embed_tokens = super().build_model(embedding_args, task).decoder.embed_tokens

        if args.decoder_layers_to_keep:
            args.decoder_layers = len(args.decoder_layers_to_keep.split(","))
        check_factorized_embedding(args, embed_tokens)
        decoder = AlibiTransformerDecoder(args, task.target_dictionary, embed_tokens, stack)
        shared = getattr(args, "share_decoder_layers", False)  # absent from older checkpoints
        if shared:
            share_layer_parameters(decoder.layers)
        model = cls(decoder)
        embed_dim = getattr(embed_tokens, "embedding_dim", args.decoder_embed_dim)
        logger.info(describe_parameters(model, len(decoder.layers), shared, embed_dim,
                                        args.decoder_embed_dim))
        if embed_dim > args.decoder_embed_dim:  # a factorisation that grows: the stock defaults
            d = args.decoder_embed_dim
            logger.warning(
                f"the token embedding has {embed_dim} dims, more than the model's {d}: stock "
                "transformer_lm defaults --decoder-input-dim and --decoder-output-dim to 512 "
                f"whatever --decoder-embed-dim is; for a new model give --decoder-input-dim {d} "
                f"--decoder-output-dim {d} for a plain {d}-dim embedding")
        return model

    def upgrade_state_dict_named(self, state_dict, name):
        decoder = f"{name}.decoder" if name else "decoder"
        reject_position_embeddings(state_dict, decoder, MODEL_NAME)
        reject_other_dictionary(state_dict, f"{decoder}.embed_tokens.weight",
                                self.decoder.dictionary)
        check_saved_sizes(state_dict, self.state_dict(), {decoder: ("decoder", "decoder")})
        check_saved_stacks(state_dict, {decoder: (self.decoder.alibi, options.LM.flag,
                                                  "--decoder-attention-heads")}, MODEL_NAME)
        check_shared_layers(state_dict, decoder, self.decoder.layers, "share_decoder_layers")
        return super().upgrade_state_dict_named(state_dict, name)


mirror_stock_architectures("transformer_lm", MODEL_NAME)


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
        "alibi_learned_scales": "none", "alibi_scale_init": 1.0, "alibi_heads": None,
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
    scale = getattr(args, "alibi_slope_scale", 1.0)
    if scale is not None and float(scale) != 1.0:  # kept: a load-time slope scale is valid
        logger.warning(f"alibi_bloom: alibi_slope_scale={scale!r} is not BLOOM's (Press's "
                       "slopes, 1.0): export-hf refuses a model trained with it")
    base_lm_architecture(args)


register_model_architecture("alibi_transformer_lm", "alibi_bloom")(alibi_bloom_architecture)
for _size, (_dim, _layers, _heads) in BLOOM_SIZES.items():
    register_model_architecture("alibi_transformer_lm", f"alibi_bloom_{_size}")(
        lambda args, d=_dim, n=_layers, h=_heads: alibi_bloom_architecture(args, d, n, h))
