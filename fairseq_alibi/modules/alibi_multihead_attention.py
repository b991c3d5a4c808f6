"""fairseq's MultiheadAttention with an ALiBi bias, computed by one of the attention backends.

fairseq's own attention only adds a 3-D float mask on its fast path and encoder layers
``masked_fill`` any float mask away, so the bias cannot be passed through ``attn_mask``: this
module owns the attention computation and hands it, with the model's shared
:class:`~fairseq_alibi.alibi.AlibiPositionalBias`, to the backend it is configured with
(``attention``: ``--alibi-attention``, see :mod:`fairseq_alibi.modules.attention`).
Projections, parameter names, the incremental-state layout (``prev_key``/``prev_value`` as
``(B, H, T, D)``) and beam reordering are the parent's, so checkpoints and fairseq's
generators work unchanged.
"""

from typing import Dict, Optional, Tuple

import torch
from fairseq.modules import MultiheadAttention
from torch import Tensor

from fairseq_alibi.alibi import AlibiPositionalBias
from fairseq_alibi.modules.attention import attend, check_attention_backend, dense


class AlibiMultiheadAttention(MultiheadAttention):
    """Self-attention ``softmax(QKᵀ/√d + ALiBi + masks) V``.

    ``alibi`` is the model's shared bias module (held by reference, not as a submodule, so that
    its slopes are saved once per model); ``layer_index`` the layer's place in its stack (it
    picks the layer's learned slope scales, if the bias has any: ``alibi.at_layer``);
    ``attention`` the backend name (``auto``, ``fold``, ``sdpa``, ``flex``, ``flash``,
    ``naive``). ``attn_mask`` and ``key_padding_mask`` keep their
    fairseq meaning and are added on top of the bias. The attention weights (``need_weights``)
    and the raw scores (``before_softmax``) are computed explicitly, whatever the backend.
    """

    def __init__(self, embed_dim, num_heads, alibi: AlibiPositionalBias, attention="auto",
                 layer_index: int = 0, **kwargs):
        if kwargs.get("add_bias_kv") or kwargs.get("add_zero_attn"):
            raise ValueError(
                "ALiBi attention does not support add_bias_kv/add_zero_attn (the extra key has "
                "no position); turn those options off"
            )
        if alibi.num_heads != num_heads:
            raise ValueError(f"ALiBi bias has {alibi.num_heads} heads, attention {num_heads}")
        super().__init__(embed_dim, num_heads, self_attention=True, **kwargs)
        object.__setattr__(self, "alibi", alibi)
        self.layer_index = layer_index
        self.attention_backend = check_attention_backend(attention)

    def extra_repr(self):
        return f"attention_backend={self.attention_backend}, layer_index={self.layer_index}"

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        if static_kv:
            raise ValueError("ALiBi attention is self-attention only (static_kv=True given)")
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, embed_dim = query.size()
        H, D = self.num_heads, self.head_dim
        alibi = self.alibi.at_layer(self.layer_index)  # the shared module itself if unscaled

        def heads(x):  # (T, B, C) -> (B, H, T, D)
            return x.contiguous().view(x.size(0), bsz, H, D).permute(1, 2, 0, 3)

        q, k, v = heads(self.q_proj(query)), heads(self.k_proj(query)), heads(self.v_proj(query))

        if incremental_state is not None:
            saved = self._get_input_buffer(incremental_state)
            if saved.get("prev_key") is not None:
                k = torch.cat([saved["prev_key"], k], dim=2)
                v = torch.cat([saved["prev_value"], v], dim=2)
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask,
                prev_key_padding_mask=saved.get("prev_key_padding_mask"),
                batch_size=bsz,
                src_len=k.size(2),
                static_kv=False,
            )
            saved["prev_key"], saved["prev_value"] = k, v
            saved["prev_key_padding_mask"] = key_padding_mask
            incremental_state = self._set_input_buffer(incremental_state, saved)

        src_len = k.size(2)
        if key_padding_mask is not None and key_padding_mask.dim() == 0:
            key_padding_mask = None
        dropout_p = self.dropout_module.p
        if not (self.training or self.dropout_module.apply_during_inference):
            dropout_p = 0.0

        weights = None
        if before_softmax:  # fairseq's raw-scores protocol: (B·H, T, S) scores and values
            scores = dense.scores(q, k, alibi, key_padding_mask, attn_mask, self.scaling)
            return scores.view(bsz * H, tgt_len, src_len), v.reshape(bsz * H, src_len, D)
        if need_weights:
            out, probs = dense.naive_with_weights(
                q, k, v, alibi, key_padding_mask, attn_mask, dropout_p, self.scaling
            )
            weights = probs.view(bsz, H, tgt_len, src_len).transpose(1, 0)
            if not need_head_weights:
                weights = weights.mean(dim=0)
        else:
            out = attend(self.attention_backend, q, k, v, alibi, key_padding_mask,
                         attn_mask, dropout_p, self.scaling)

        out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)
        return self.out_proj(out), weights


def set_attention_backend(model: torch.nn.Module, attention: str) -> torch.nn.Module:
    """Switch every ALiBi attention layer of ``model`` to backend ``attention``; returns it.

    The same as building the model with ``--alibi-attention`` (or loading it with
    ``--model-overrides "{'alibi_attention': ...}"``), for a model already in memory.
    """
    check_attention_backend(attention)
    for module in model.modules():
        if isinstance(module, AlibiMultiheadAttention):
            module.attention_backend = attention
    return model
