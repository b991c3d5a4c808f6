"""``alibi_roberta``: fairseq's RoBERTa with an ALiBi encoder and, optionally, a CLAP head.

Everything is stock ``roberta`` (masked_lm / sentence_prediction tasks and criteria,
classification heads, layerdrop, ``--untie-weights-roberta``, spectral norm, fp16/bf16, the hub
interface) except three build hooks of :class:`~fairseq.models.roberta.RobertaEncoder`:

* ``build_encoder``: with an ALiBi variant, a ``TransformerEncoder`` without position embeddings
  whose self-attention adds the bidirectional bias of ``--alibi-variant`` (see
  :mod:`fairseq_alibi.alibi`); ``--alibi-variant none`` keeps the stock encoder and its
  learned positions.
* ``build_lm_head``: ``--mlm-head clap`` gives ``β · linear(x, normalize(W))``
  (:class:`~fairseq_alibi.modules.clap_head.ClapHead`).
* ``build_embedding``: L2-normalised inputs with the CLAP head, and a fixed zero ``<mask>``
  embedding with ``--zero-mask-embedding``.

Two ALBERT-style options make compact encoders (:mod:`fairseq_alibi.modules.compact`), with any
variant: ``--share-encoder-layers`` (every layer uses the first one's parameters) and
``--encoder-input-dim E`` (tokens embedded in ``E`` dims and projected to
``--encoder-embed-dim``; the masked-LM head's dense layer maps back to ``E`` for the tied
``V × E`` output embedding).

The four configurations of the CLAP/ALiBi study are therefore flags of one model:
baseline (``none``, ``roberta``), learned-clap (``none``, ``clap``), alibi (``offset``,
``roberta``) and zero-clap (``offset``, ``clap``, ``--zero-mask-embedding``).

ALiBi variants have no maximum length: ``max_positions()`` is unbounded, and the task's length
filter (``--max-positions`` of sentence_prediction, ``--tokens-per-sample`` of masked_lm) is
lifted so that long inputs are kept, unless ``--shorten-method`` asks to shorten them.
"""

import json
import logging
from dataclasses import dataclass, field
from typing import Optional

import torch
from omegaconf import OmegaConf
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta import RobertaEncoder, RobertaModel
from fairseq.models.roberta.model import base_architecture as roberta_base_architecture
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from fairseq.utils import safe_getattr, safe_hasattr

from fairseq_alibi import options
from fairseq_alibi.config_access import flag_of_key
from fairseq_alibi.hub import load_pretrained
from fairseq_alibi.models.checks import (
    refuse_translation_task,
    check_attention_heads,
    check_global_tokens,
    check_saved_sizes,
    check_saved_stacks,
    check_shared_layers,
    check_tokens_per_sample,
    check_document_mask,
    refuse_fork_flags,
    reject_other_dictionary,
    started_by_hydra,
)
from fairseq_alibi.models.architectures_and_limits import lift_task_length_limit
from fairseq_alibi.models.layer_pruning import ScalesFollowPrunedLayers
from fairseq_alibi.modules.checkpoint_match import mismatch
from fairseq_alibi.modules.clap_head import ClapHead, EncoderTokenEmbedding
from fairseq_alibi.modules.compact import (
    FactorizedEmbedding,
    FactorizedLMHead,
    describe_parameters,
    share_layer_parameters,
)
from fairseq_alibi.modules.pooling import POOLERS, pool_the_mean, saved_pooler, set_real_tokens
from fairseq_alibi.modules.stacks import UNBOUNDED_POSITIONS, AlibiTransformerEncoder
from fairseq_alibi.paths import config_dir

logger = logging.getLogger(__name__)

MLM_HEADS = ("roberta", "clap")
#: --embedding-padding-idx: the dictionary's pad (stock) or none (EIFY's CLAP/zero masking)
EMBEDDING_PADDING = ("pad", "none")


@dataclass
class RobertaOptions(FairseqDataclass):
    """``alibi_roberta``'s options besides the ALiBi stack's
    (:class:`~fairseq_alibi.options.StackOptions`): the masked-LM head, the embedding, and the
    ALBERT-style compact encoders."""

    mlm_head: ChoiceEnum(MLM_HEADS) = field(default="roberta", metadata={
        "help": "masked-LM head: roberta (dense, GELU, layer norm, tied projection, bias) or "
                "clap (beta * x . normalize(E)^T; inputs L2-normalised too)"})
    clap_initial_beta: float = field(default=1.0, metadata={
        "help": "initial value of the learned CLAP temperature beta",
        "needs": options.Needs("mlm_head", "it is the CLAP head's", ("clap",))})
    clap_no_normalize: bool = field(default=False, metadata={
        "help": "CLAP head without the L2 normalisation (of the head weight and the inputs)",
        "needs": options.Needs("mlm_head", "it is the CLAP head's", ("clap",))})
    zero_mask_embedding: bool = field(default=False, metadata={
        "help": "the <mask> token embeds to a fixed zero vector instead of a learned one"})
    embedding_omits_mask: bool = field(default=False, metadata={
        "help": "with --zero-mask-embedding: the embedding and the masked-LM output have no row "
                "for <mask> (the last dictionary symbol, added by the task), which is never "
                "predicted (EIFY's omit_mask, the zero-clap checkpoints)",
        "needs": options.Needs("zero_mask_embedding",
                               "a <mask> with no embedding row can only embed to zero")})
    embedding_padding_idx: ChoiceEnum(EMBEDDING_PADDING) = field(default="pad", metadata={
        "help": "pad: the token embedding's padding row is frozen, as in stock RoBERTa; none: "
                "it is initialised and trained like any other row (EIFY's CLAP and "
                "zero-masking models); padding is masked in attention either way"})
    share_encoder_layers: bool = field(default=False, metadata={
        "help": "ALBERT-style cross-layer sharing: every encoder layer uses the parameters of "
                "the first (one layer's parameters, --encoder-layers layers computed)"})
    encoder_input_dim: Optional[int] = field(default=None, metadata={
        "help": "factorised embedding (ALBERT): tokens embedded in E dims, projected to "
                "--encoder-embed-dim; the masked-LM head maps back to E for the tied output "
                "embedding (default: --encoder-embed-dim, no factorisation)",
        "check": options.positive})
    classification_pooler: ChoiceEnum(POOLERS) = field(default="first", metadata={
        "help": "what a sentence classification head reads: first (the <s> token, as stock "
                "RoBERTa) or mean (the mean of the real tokens' features, JinaBERT's pooling); "
                "saved with the head"})

    @options.one_line_errors
    def check(self, embed_dim: int):
        """Clear errors for values and combinations that cannot work: the declarations'
        (:func:`~fairseq_alibi.options.check_declared`), then the factorised embedding's."""
        options.check_declared(self)
        if self.encoder_input_dim in (None, embed_dim):
            return
        if self.mlm_head == "clap":
            raise ValueError(
                "--encoder-input-dim (a factorised embedding) needs --mlm-head roberta: the "
                "CLAP head compares the features with the embeddings directly, so both must "
                "have --encoder-embed-dim dims")
        if self.embedding_omits_mask or self.embedding_padding_idx != "pad":
            raise ValueError(
                "--embedding-omits-mask / --embedding-padding-idx none are options of the forks' "
                "full-size embeddings; they do not combine with --encoder-input-dim")

    @property
    def normalize(self) -> bool:
        """The CLAP head's L2 normalisation (of its weight and the inputs)."""
        return self.mlm_head == "clap" and not self.clap_no_normalize


#: the options ``encoder.model_kind`` records, by name, so a checkpoint says how it was built
KIND_FIELDS = ("alibi_variant", "mlm_head", "clap_normalize", "zero_mask_embedding")
#: the model options each shipped ``variant=`` config group sets (config/shared/variant)
VARIANT_GROUP_KEYS = ("alibi_variant", "mlm_head", "zero_mask_embedding")
#: how checkpoints written before the names were stored encoded the same options: positions in
#: these tuples (frozen here; never reorder them)
_LEGACY_KIND_VALUES = (
    ("symmetric", "one_sided", "offset", "asymmetric", "none"),
    ("roberta", "clap"),
    (False, True),
    (False, True),
)


def _kind_of(stack: options.StackOptions, roberta: RobertaOptions) -> dict:
    return dict(
        alibi_variant=stack.variant,
        mlm_head=roberta.mlm_head,
        clap_normalize=roberta.normalize,
        zero_mask_embedding=roberta.zero_mask_embedding,
    )


def encode_kind(kind: dict) -> torch.Tensor:
    """The kind as a tensor (so it travels in the state dict): the UTF-8 bytes of its JSON."""
    text = json.dumps({k: kind[k] for k in KIND_FIELDS}, sort_keys=True)
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.uint8)


def decode_kind(saved: torch.Tensor) -> dict:
    """:func:`encode_kind` undone; also reads the integer positions of older checkpoints."""
    if saved.dtype == torch.uint8:
        return json.loads(bytes(saved.tolist()).decode("utf-8"))
    return {field: values[int(v)]
            for field, values, v in zip(KIND_FIELDS, _LEGACY_KIND_VALUES, saved.tolist())}


def roberta_flags(values: dict) -> str:
    """The command-line flags of ``alibi_roberta`` options given by name (the variant and head
    always; the embedding options, its layer norm among them, when they differ from stock
    RoBERTa's)."""
    flags = [f"--alibi-variant {values['alibi_variant']}", f"--mlm-head {values['mlm_head']}"]
    for name in ("clap_no_normalize", "zero_mask_embedding", "embedding_omits_mask"):
        if values.get(name):
            flags.append(flag_of_key(name))
    if values.get("embedding_padding_idx", "pad") != "pad":
        flags.append(f"--embedding-padding-idx {values['embedding_padding_idx']}")
    if values.get("layernorm_embedding") is False:
        flags.append("--no-layernorm-embedding")
    return " ".join(flags)


def _kind_flags(kind: dict) -> str:
    """The command-line flags that build a model of this kind."""
    return roberta_flags(dict(
        kind, clap_no_normalize=kind["mlm_head"] == "clap" and not kind["clap_normalize"]))


def _kind_overrides(kind: dict) -> str:
    """The hydra overrides that build a model of this kind: a shipped ``variant=`` if one is."""
    from pathlib import Path

    for path in sorted(Path(config_dir("shared", "variant")).glob("*.yaml")):
        shipped = OmegaConf.to_container(OmegaConf.load(path))
        if kind["clap_normalize"] == (shipped.get("mlm_head") == "clap") and all(
            shipped.get(k) == kind[k] for k in VARIANT_GROUP_KEYS):
            return f"variant={path.stem}"
    overrides = [f"model.{k}={str(kind[k]).lower()}" for k in VARIANT_GROUP_KEYS]
    if kind["mlm_head"] == "clap" and not kind["clap_normalize"]:
        overrides.append("++model.clap_no_normalize=true")
    return " ".join(overrides)


def _how_to_build(kind: dict, hydra: bool) -> str:
    """How the user asks for a model of this kind: hydra overrides or command-line flags."""
    if hydra:
        return f"the override `{_kind_overrides(kind)}`"
    return f"the flags `{_kind_flags(kind)}`"


class AlibiRobertaEncoder(RobertaEncoder):
    """``RobertaEncoder`` whose embedding, sentence encoder and LM head follow our flags."""

    def __init__(self, args, dictionary, stack: options.StackOptions, roberta: RobertaOptions):
        # the build hooks run inside RobertaEncoder.__init__: the options must be there first
        object.__setattr__(self, "alibi_options", stack)
        object.__setattr__(self, "roberta_options", roberta)
        super().__init__(args, dictionary)
        # saved with the weights, so that a checkpoint of another kind gives a clear error
        self.register_buffer("model_kind", encode_kind(_kind_of(stack, roberta)))

    @property
    def uses_alibi(self):
        return self.alibi_options.uses_alibi

    def build_embedding(self, vocab_size, embedding_dim, padding_idx):
        zero_index, roberta = None, self.roberta_options
        if roberta.zero_mask_embedding:
            zero_index = self.dictionary.index("<mask>")
            if zero_index == self.dictionary.unk():
                raise ValueError(
                    "--zero-mask-embedding: the dictionary has no <mask> symbol (tasks masked_lm "
                    "and sentence_prediction add it); drop the flag or use one of those tasks"
                )
        if roberta.embedding_omits_mask:  # EIFY's omit_mask: <mask> is the id after the table
            if zero_index != len(self.dictionary) - 1:
                raise ValueError(
                    "--embedding-omits-mask: <mask> must be the last symbol of the dictionary "
                    f"(the task adds it after dict.txt), but it is symbol {zero_index} of "
                    f"{len(self.dictionary)}; use the dict.txt the model was trained with"
                )
            vocab_size -= 1
        if roberta.embedding_padding_idx == "none":  # the encoder still masks padding
            padding_idx = None
        normalize = roberta.normalize
        if self.factorized:
            table = EncoderTokenEmbedding(vocab_size, roberta.encoder_input_dim, padding_idx,
                                          normalize=normalize, zero_index=zero_index)
            return FactorizedEmbedding(table, embedding_dim)
        return EncoderTokenEmbedding(
            vocab_size, embedding_dim, padding_idx, normalize=normalize, zero_index=zero_index
        )

    @property
    def factorized(self):
        """``--encoder-input-dim`` asks for a smaller embedding than the model dimension."""
        dim = self.roberta_options.encoder_input_dim
        return dim is not None and dim != self.args.encoder_embed_dim

    def build_encoder(self, args, dictionary, embed_tokens):
        if self.roberta_options.embedding_padding_idx == "none" and \
                embed_tokens.padding_idx is None:
            # the stock encoder takes its pad id (padding mask, learned positions) from the
            # embedding: give it the dictionary's for the build, and keep the pad row trainable
            embed_tokens.padding_idx = dictionary.pad()
            try:
                encoder = self.build_encoder(args, dictionary, embed_tokens)
            finally:
                embed_tokens.padding_idx = None
            with torch.no_grad():  # drawn like every other row, as with no padding index
                embed_tokens.weight[dictionary.pad()].normal_(mean=0.0, std=0.02)
            return encoder
        if not self.uses_alibi:
            encoder = super().build_encoder(args, dictionary, embed_tokens)
        else:
            encoder = AlibiTransformerEncoder(args, dictionary, embed_tokens, self.alibi_options)
            encoder.apply(init_bert_params)
        if self.roberta_options.share_encoder_layers:
            share_layer_parameters(encoder.layers)
        return encoder

    def build_lm_head(self, embed_dim, output_dim, activation_fn, weight):
        roberta = self.roberta_options
        if roberta.embedding_omits_mask:  # <mask> is never predicted: no output for it
            output_dim -= 1
        if roberta.mlm_head != "clap":
            if self.factorized:  # dense H -> E, then the E-dim (tied) output embedding
                return FactorizedLMHead(
                    embed_dim, roberta.encoder_input_dim, output_dim, activation_fn, weight
                )
            return super().build_lm_head(embed_dim, output_dim, activation_fn, weight)
        return ClapHead(embed_dim, output_dim, weight, initial_beta=roberta.clap_initial_beta,
                        normalize=not roberta.clap_no_normalize)

    def max_positions(self):
        return UNBOUNDED_POSITIONS if self.uses_alibi else super().max_positions()

    def upgrade_state_dict_named(self, state_dict, name):
        reject_other_dictionary(
            state_dict, f"{name}.sentence_encoder.embed_tokens.weight", self.dictionary,
            omits_mask=self.roberta_options.embedding_omits_mask,
        )
        kind_key = f"{name}.model_kind"
        encoder = f"{name}.sentence_encoder"
        built_kind = decode_kind(self.model_kind)
        check_saved_sizes(state_dict, self.state_dict(),
                          {encoder: ("sentence_encoder", "encoder")})
        check_shared_layers(state_dict, encoder, self.sentence_encoder.layers,
                            "share_encoder_layers")
        if kind_key in state_dict:
            saved_kind = decode_kind(state_dict[kind_key])
            where = ""
        elif any(k.startswith(f"{encoder}.embed_positions.") for k in state_dict) or \
                not self.uses_alibi:
            # stock RoBERTa weights: an alibi_roberta `none` model with the stock head
            saved_kind = dict(alibi_variant="none", mlm_head="roberta", clap_normalize=False,
                              zero_mask_embedding=False)
            where = f" (a stock RoBERTa checkpoint: learned position embeddings, no {kind_key})"
        elif not any(k.startswith(f"{encoder}.") for k in state_dict) and \
                any(k.startswith(f"{name}.layers.") for k in state_dict):
            # a decoder's layers (stock RoBERTa's upgrade renamed decoder.* to encoder.*)
            raise ValueError(
                "this checkpoint holds a decoder (decoder.layers...), a language or translation "
                "model's, not an encoder: give an alibi_roberta checkpoint (fairseq-train "
                "resumes --save-dir's checkpoint_last.pt: give the encoder its own --save-dir)")
        else:  # no positions, no record: not ours, not stock RoBERTa's
            raise ValueError(
                f"this checkpoint has no {kind_key}: it was not written by alibi_roberta. "
                "Use the architecture it was trained with; a RoBERTa checkpoint of EIFY's ALiBi "
                "fork converts with `fairseq-alibi convert --input CHECKPOINT --output "
                "CONVERTED.pt` (docs/migrating.md)"
            )
        saved, built = _kind_flags(saved_kind), _kind_flags(built_kind)
        if saved != built:
            raise mismatch(f"`{saved}`{where}", f"`{built}`",
                           _how_to_build(saved_kind, started_by_hydra()))
        state_dict[kind_key] = self.model_kind.clone()  # older checkpoints: integer form
        if self.uses_alibi:
            check_saved_stacks(state_dict, {encoder: (self.sentence_encoder.alibi,
                                                      options.ENCODER.flag,
                                                      "--encoder-attention-heads")},
                               "alibi_roberta")
        positions = state_dict.get(f"{encoder}.embed_positions.weight")
        own = self.sentence_encoder.embed_positions
        if positions is not None and own is not None and positions.shape != own.weight.shape:
            trained = positions.shape[0] - own.padding_idx - 1
            raise mismatch(
                f"--max-positions {trained} (learned positions)",
                f"--max-positions {own.weight.shape[0] - own.padding_idx - 1}",
                f"--max-positions {trained} (learned positions cannot be extended; the ALiBi "
                "variants have no length limit)")
        return super().upgrade_state_dict_named(state_dict, name)

options.declare_family("alibi_roberta", (options.StackOptions, (options.ENCODER,)),
                       (RobertaOptions, (None,)))


@register_model("alibi_roberta")
class AlibiRobertaModel(ScalesFollowPrunedLayers, RobertaModel):
    """RoBERTa with ALiBi (``--alibi-variant``) and an optional CLAP head (``--mlm-head clap``)."""

    alibi_scales_keys = {"encoder": "encoder.sentence_encoder.alibi.scales"}

    @classmethod
    def hub_models(cls):
        return {}  # no downloads: from_pretrained() takes a local directory

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt",
                        data_name_or_path=".", bpe="gpt2", **kwargs):
        """The stock RoBERTa hub loader, offline (GPT-2 BPE files found beside the checkpoint
        or in the data folder), refusing checkpoints of other models."""
        from fairseq.models.roberta import RobertaHubInterface

        loaded = load_pretrained(cls, "alibi_roberta", model_name_or_path, checkpoint_file,
                                 data_name_or_path, bpe=bpe, load_checkpoint_heads=True,
                                 **kwargs)
        return RobertaHubInterface(loaded["args"], loaded["task"], loaded["models"][0])

    @staticmethod
    def add_args(parser):
        RobertaModel.add_args(parser)
        # stock RoBERTa's --layernorm-embedding only switches it on (its default is on): the
        # off switch that fine-tuning the EIFY fork's clap models with fairseq-train needs
        parser.add_argument("--no-layernorm-embedding", dest="layernorm_embedding",
                            action="store_false",
                            help="no layer norm on the token embeddings (as in the EIFY fork's "
                                 "learned-clap and zero-clap models); stock RoBERTa has one")
        options.add_args(parser, options.StackOptions, options.ENCODER)
        options.add_args(parser, RobertaOptions, None)
        refuse_fork_flags(parser, "alibi_roberta")

    @classmethod
    def build_model(cls, args, task):
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, False)
        alibi_roberta_architecture(args)
        refuse_translation_task(task, "alibi_roberta", "an encoder: it generates no text",
                                "--task masked_lm or sentence_prediction")
        check_tokens_per_sample(args)
        check_attention_heads(args, "encoder")
        stack = options.read(options.StackOptions, args, options.ENCODER)
        options.check_stacks({options.ENCODER: (stack, args.encoder_attention_heads)})
        check_global_tokens(stack, args, task)
        check_document_mask(stack, task)
        roberta = options.read(RobertaOptions, args)
        roberta.check(args.encoder_embed_dim)
        if not safe_hasattr(args, "max_positions"):  # as the stock model: sized by the task
            if not safe_hasattr(args, "tokens_per_sample"):
                args.tokens_per_sample = task.max_positions()
            args.max_positions = args.tokens_per_sample
        encoder = AlibiRobertaEncoder(args, task.source_dictionary, stack, roberta)
        if OmegaConf.is_config(args):
            OmegaConf.set_struct(args, True)
        if encoder.uses_alibi:
            lift_task_length_limit(task, True)
        model = cls(args, encoder)
        embedding_dim = roberta.encoder_input_dim if encoder.factorized else args.encoder_embed_dim
        logger.info(describe_parameters(model, len(encoder.sentence_encoder.layers),
                                        roberta.share_encoder_layers, embedding_dim,
                                        args.encoder_embed_dim))
        return model

    def register_classification_head(self, name, num_classes=None, inner_dim=None, **kwargs):
        """The stock head, reading the mean of the real tokens with ``--classification-pooler
        mean`` (:mod:`fairseq_alibi.modules.pooling`)."""
        super().register_classification_head(name, num_classes, inner_dim, **kwargs)
        if self.encoder.roberta_options.classification_pooler == "mean":
            pool_the_mean(self.classification_heads[name])

    def forward(self, src_tokens, *args, **kwargs):
        set_real_tokens(self.classification_heads.values(),
                        src_tokens.ne(self.encoder.dictionary.pad()))
        return super().forward(src_tokens, *args, **kwargs)

    def upgrade_state_dict_named(self, state_dict, name):
        prefix = f"{name}." if name else ""
        heads = f"{prefix}classification_heads."
        pooler = self.encoder.roberta_options.classification_pooler
        for head in sorted({k[len(heads):].split(".")[0] for k in state_dict
                            if k.startswith(heads)}):
            saved = saved_pooler(state_dict, f"{heads}{head}.")
            if saved != pooler:
                raise mismatch(f"--classification-pooler {saved} (classification head {head!r})",
                               f"--classification-pooler {pooler}",
                               f"--classification-pooler {saved}")
        # The stock method sizes the checkpoint's classification heads from
        # `out_proj.weight`, which a spectral-norm head (--spectral-norm-classification-head)
        # saves as `out_proj.weight_orig`: show it under the expected name while it looks.
        shown = [
            k[: -len("_orig")] for k in state_dict
            if k.startswith(heads) and k.endswith(".out_proj.weight_orig")
            and k[: -len("_orig")] not in state_dict
        ]
        for key in shown:
            state_dict[key] = state_dict[f"{key}_orig"]
        try:
            super().upgrade_state_dict_named(state_dict, name)
        finally:
            for key in shown:
                state_dict.pop(key, None)


@register_model_architecture("alibi_roberta", "alibi_roberta")
def alibi_roberta_architecture(args):
    """RoBERTa-base sizes (12 layers, 768 dims, 3072 FFN, 12 heads), offset ALiBi."""
    options.fill_defaults(args, options.StackOptions, options.ENCODER)
    options.fill_defaults(args, RobertaOptions, None)
    roberta_base_architecture(args)


@register_model_architecture("alibi_roberta", "alibi_roberta_base")
def alibi_roberta_base_architecture(args):
    alibi_roberta_architecture(args)


def _default_sizes(args, layers, embed_dim, ffn_embed_dim, heads):
    """Size defaults of an architecture; sizes given on the command line win."""
    args.encoder_layers = safe_getattr(args, "encoder_layers", layers)
    args.encoder_embed_dim = safe_getattr(args, "encoder_embed_dim", embed_dim)
    args.encoder_ffn_embed_dim = safe_getattr(args, "encoder_ffn_embed_dim", ffn_embed_dim)
    args.encoder_attention_heads = safe_getattr(args, "encoder_attention_heads", heads)


@register_model_architecture("alibi_roberta", "alibi_roberta_large")
def alibi_roberta_large_architecture(args):
    """RoBERTa-large sizes: 24 layers, 1024 dims, 4096 FFN, 16 heads."""
    _default_sizes(args, 24, 1024, 4096, 16)
    alibi_roberta_architecture(args)


@register_model_architecture("alibi_roberta", "alibi_roberta_small")
def alibi_roberta_small_architecture(args):
    """BERT-small sizes (Turc et al. 2019): 4 layers, 512 dims, 2048 FFN, 8 heads."""
    _default_sizes(args, 4, 512, 2048, 8)
    alibi_roberta_architecture(args)
