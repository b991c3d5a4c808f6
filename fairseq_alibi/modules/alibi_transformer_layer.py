"""Stock fairseq transformer layers whose self-attention is :class:`AlibiMultiheadAttention`.

Each layer overrides one hook, ``build_self_attention``; everything else (layer norms, FFN,
dropout, residuals, quant-noise, pre/post-norm) is fairseq's own. The decoder layers' second
hook, ``build_encoder_attention``, gives the cross-attention a position signal when the model's
:class:`~fairseq_alibi.options.CrossOptions` ask for one
(:mod:`fairseq_alibi.modules.cross_position`) and is stock otherwise. A layer is given its view
of the stack's bias (``alibi``: :meth:`fairseq_alibi.modules.bias.AlibiBias.layer`) and the
attention backend (``--alibi-attention``).
"""

from fairseq.distributed import fsdp_wrap
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)

from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention
from fairseq_alibi.modules.attention import check_attention_backend
from fairseq_alibi.modules.cross_position import build_cross_attention


def wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping exactly as fairseq's ``build_*_layer`` do."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    # when checkpointing, FSDP must always wrap the checkpointed layer, whatever its size
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not checkpoint else 0)


def keep_references(module, **references):
    """Plain attributes set before ``nn.Module.__init__`` runs: fairseq builds a layer's
    attention (and a stack's layers) inside ``__init__``, so what the hooks read must be there
    first; plain references also keep a shared bias out of the layer's state dict."""
    for name, value in references.items():
        object.__setattr__(module, name, value)


def _self_attention(layer, embed_dim, num_heads, cfg, add_bias_kv=False, add_zero_attn=False):
    """The layer's ALiBi self-attention, with the arguments fairseq's own hook passes."""
    return AlibiMultiheadAttention(
        embed_dim,
        num_heads,
        layer.alibi,
        attention=layer.attention_backend,
        dropout=cfg.attention_dropout,
        add_bias_kv=add_bias_kv,
        add_zero_attn=add_zero_attn,
        q_noise=layer.quant_noise,
        qn_block_size=layer.quant_noise_block_size,
    )


class CrossPositionHook:
    """``build_encoder_attention``: :class:`~fairseq_alibi.modules.cross_position.CrossPositionAttention`
    when the layer's ``cross`` options ask for a position signal, fairseq's own otherwise."""

    def build_encoder_attention(self, embed_dim, cfg):
        attention = build_cross_attention(embed_dim, cfg, self.cross, self.attention_backend,
                                          self.quant_noise, self.quant_noise_block_size)
        return super().build_encoder_attention(embed_dim, cfg) if attention is None else attention


class CrossPositionDecoderLayer(CrossPositionHook, TransformerDecoderLayerBase):
    """The stock decoder layer (stock self-attention) with the cross-attention hook."""

    def __init__(self, cfg, no_encoder_attn=False, cross=None, attention="auto", **kwargs):
        keep_references(self, cross=cross, attention_backend=check_attention_backend(attention))
        super().__init__(cfg, no_encoder_attn, **kwargs)


class AlibiTransformerDecoderLayer(CrossPositionHook, TransformerDecoderLayerBase):
    def __init__(self, cfg, alibi, no_encoder_attn=False, attention="auto", cross=None,
                 **kwargs):
        if cfg.cross_self_attention:
            raise ValueError("--cross-self-attention is not supported with ALiBi self-attention")
        keep_references(self, alibi=alibi, cross=cross,
                        attention_backend=check_attention_backend(attention))
        super().__init__(cfg, no_encoder_attn, **kwargs)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        return _self_attention(self, embed_dim, cfg.decoder.attention_heads, cfg, add_bias_kv,
                               add_zero_attn)


class AlibiTransformerEncoderLayer(TransformerEncoderLayerBase):
    def __init__(self, cfg, alibi, attention="auto", **kwargs):
        keep_references(self, alibi=alibi, attention_backend=check_attention_backend(attention))
        super().__init__(cfg, **kwargs)

    def build_self_attention(self, embed_dim, cfg):
        return _self_attention(self, embed_dim, cfg.encoder.attention_heads, cfg)
