"""Stock fairseq transformer layers whose self-attention is :class:`AlibiMultiheadAttention`.

Each layer overrides one hook, ``build_self_attention``; everything else (layer norms, FFN,
dropout, residuals, quant-noise, pre/post-norm) is fairseq's own. The decoder layers' second
hook, ``build_encoder_attention``, gives the cross-attention a position signal when the model's
options ask for one (``--cross-alibi``, ``--cross-attention-length-scale``:
:mod:`fairseq_alibi.modules.cross_position`) and is stock otherwise. ``attention`` is the backend of the layer's self-attention (``--alibi-attention``),
``layer_index`` its place in the stack (which learned slope scales it uses, if any).
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


def _keep_reference(layer, alibi, attention, layer_index):
    # The parent builds its attention inside __init__, so the shared bias and the backend must
    # be reachable before nn.Module.__init__ runs; a plain reference also keeps the bias out of
    # the layer's state dict (the model owns it once).
    object.__setattr__(layer, "alibi", alibi)
    object.__setattr__(layer, "attention_backend", check_attention_backend(attention))
    object.__setattr__(layer, "alibi_layer_index", layer_index)


def _self_attention(layer, embed_dim, num_heads, cfg, add_bias_kv=False, add_zero_attn=False):
    """The layer's ALiBi self-attention, with the arguments fairseq's own hook passes."""
    return AlibiMultiheadAttention(
        embed_dim,
        num_heads,
        layer.alibi,
        attention=layer.attention_backend,
        layer_index=layer.alibi_layer_index,
        dropout=cfg.attention_dropout,
        add_bias_kv=add_bias_kv,
        add_zero_attn=add_zero_attn,
        q_noise=layer.quant_noise,
        qn_block_size=layer.quant_noise_block_size,
    )


class CrossPositionHook:
    """``build_encoder_attention``: :class:`~fairseq_alibi.modules.cross_position.CrossPositionAttention`
    when ``cfg`` asks for a cross-attention position option, fairseq's own otherwise."""

    def build_encoder_attention(self, embed_dim, cfg):
        attention = build_cross_attention(embed_dim, cfg, self.quant_noise,
                                          self.quant_noise_block_size)
        return super().build_encoder_attention(embed_dim, cfg) if attention is None else attention


class CrossPositionDecoderLayer(CrossPositionHook, TransformerDecoderLayerBase):
    """The stock decoder layer (stock self-attention) with the cross-attention hook."""


class AlibiTransformerDecoderLayer(CrossPositionHook, TransformerDecoderLayerBase):
    def __init__(self, cfg, alibi, no_encoder_attn=False, attention="auto", layer_index=0,
                 **kwargs):
        if cfg.cross_self_attention:
            raise ValueError("--cross-self-attention is not supported with ALiBi self-attention")
        _keep_reference(self, alibi, attention, layer_index)
        super().__init__(cfg, no_encoder_attn, **kwargs)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        return _self_attention(self, embed_dim, cfg.decoder.attention_heads, cfg, add_bias_kv,
                               add_zero_attn)


class AlibiTransformerEncoderLayer(TransformerEncoderLayerBase):
    def __init__(self, cfg, alibi, attention="auto", layer_index=0, **kwargs):
        _keep_reference(self, alibi, attention, layer_index)
        super().__init__(cfg, **kwargs)

    def build_self_attention(self, embed_dim, cfg):
        return _self_attention(self, embed_dim, cfg.encoder.attention_heads, cfg)
