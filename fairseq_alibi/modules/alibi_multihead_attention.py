"""fairseq's MultiheadAttention with an ALiBi bias, computed with scaled_dot_product_attention.

fairseq's own attention only adds a 3-D float mask on its fast path and encoder layers
``masked_fill`` any float mask away, so the bias cannot be passed through ``attn_mask``: this
module owns the attention computation and asks the model's shared
:class:`~fairseq_alibi.alibi.AlibiPositionalBias` for the bias. Projections, parameter names,
the incremental-state layout (``prev_key``/``prev_value`` as ``(B, H, T, D)``) and beam
reordering are the parent's, so checkpoints and fairseq's generators work unchanged.

The attention itself is one of the backends of
:mod:`~fairseq_alibi.modules.attention_backends`, chosen per call from the bias module's
``backend`` (``--alibi-attention``): most need no bias tensor at all.
"""

from typing import Dict, Optional, Tuple

import torch
from fairseq.modules import MultiheadAttention
from torch import Tensor

from fairseq_alibi.alibi import AlibiPositionalBias
from fairseq_alibi.modules import attention_backends as backends


class AlibiMultiheadAttention(MultiheadAttention):
    """Self-attention ``softmax(QKᵀ/√d + ALiBi + masks) V``.

    ``alibi`` is the model's shared bias module (held by reference, not as a submodule, so that
    its slopes are saved once per model). ``attn_mask`` and ``key_padding_mask`` keep their
    fairseq meaning and are added on top of the bias.
    """

    def __init__(self, embed_dim, num_heads, alibi: AlibiPositionalBias, **kwargs):
        if kwargs.get("add_bias_kv") or kwargs.get("add_zero_attn"):
            raise ValueError(
                "ALiBi attention does not support add_bias_kv/add_zero_attn (the extra key has "
                "no position); turn those options off"
            )
        if alibi.num_heads != num_heads:
            raise ValueError(f"ALiBi bias has {alibi.num_heads} heads, attention {num_heads}")
        super().__init__(embed_dim, num_heads, self_attention=True, **kwargs)
        object.__setattr__(self, "alibi", alibi)

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
        request = backends.Request(
            device_type=q.device.type,
            dtype=q.dtype,
            variant=self.alibi.variant,
            query_len=tgt_len,
            key_len=src_len,
            needs_grad=q.requires_grad or k.requires_grad or v.requires_grad,
            need_weights=need_weights or before_softmax,
            has_attn_mask=attn_mask is not None,
            has_padding=key_padding_mask is not None,
            dropout_p=dropout_p,
        )
        backend = backends.select_backend(self.alibi.backend, request)

        weights = None
        if backend == "naive":
            mask = backends.dense_mask(
                self.alibi, bsz, tgt_len, src_len, q.dtype, key_padding_mask, attn_mask
            )
            if before_softmax:  # fairseq's raw-scores protocol: (B·H, T, S) scores and values
                scores = torch.matmul(q * self.scaling, k.transpose(-1, -2)) + mask
                return scores.view(bsz * H, tgt_len, src_len), v.reshape(bsz * H, src_len, D)
            out, probs = backends.naive_attention(q, k, v, mask, self.scaling, self.dropout_module)
            if need_weights:
                weights = probs.view(bsz, H, tgt_len, src_len).transpose(1, 0)
                if not need_head_weights:
                    weights = weights.mean(dim=0)
        elif backend == "sdpa":
            out = backends.sdpa_attention(
                q, k, v, self.alibi, key_padding_mask, attn_mask, dropout_p, self.scaling
            )
        elif backend == "flex":
            out = backends.flex_attention(
                q, k, v, self.alibi, key_padding_mask, attn_mask, self.scaling
            )
        else:
            out = backends.flash_attention(
                q, k, v, self.alibi, key_padding_mask, dropout_p, self.scaling
            )

        out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)
        return self.out_proj(out), weights
