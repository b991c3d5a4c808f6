"""Cross-attention with a position signal: the decoder's ``encoder_attn`` for ``--cross-alibi``
and ``--cross-attention-length-scale`` (the math: :mod:`fairseq_alibi.cross_alibi`).

:class:`CrossPositionAttention` is fairseq's encoder-decoder ``MultiheadAttention`` (same
projections and parameter names, the keys/values of the source computed once per sentence and
kept in the incremental state) whose attention adds, on its first ``K`` heads, a bias around an
anchor in the source, and/or multiplies the content logits by ``log S / log N``:

* ``pointer``: each layer has its own pointer ``p_t = p_{t-1} + softplus(w·x_t + b)``, ``x_t``
  the layer's cross-attention input (``pointer_step``, a ``Linear(C, 1)`` started at step 1).
  One pointer per layer, not one shared: each layer reads a different state, the layers may
  track the source at different resolutions, and the pointer stays inside the layer's own
  build hook and incremental state (no cross-layer wiring, fairseq's beam reorder reaches it).
  Teacher forcing computes it as a cumulative sum; decoding carries the offsets ``j - p_t`` of
  the source's keys in the incremental state (one subtraction a step; the last source token's
  is what the EOS guard reads), reordered with the beam.
* ``ratio``: the anchor ``r·t``; the state holds only the step count ``t``.

The bias is per row ``(B, H, T, S)`` (left padding shifts each row's positions), built in
float32 and cast to the model's precision: a :class:`RowBias`, which the dispatch gives to the
dense backends only (``auto`` runs ``sdpa``; ``naive`` with ``--alibi-attention naive``, and
whenever fairseq asks for the weights). Sources are sentences, so the dense bias is small.
"""

from typing import Dict, Optional

import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch import Tensor

from fairseq_alibi.alibi import get_slopes, mask_value
from fairseq_alibi.cross_alibi import (
    bias_of_offsets,
    cross_alibi_bias,
    length_scale,
    pointer_positions,
    slopes_by_length,
    source_positions,
)
from fairseq_alibi.modules.alibi_multihead_attention import attend_and_project
from fairseq_alibi.options import CrossOptions

#: the incremental-state entry of a layer's position (beside the parent's ``attn_state``)
_STATE = "cross_position"

#: ``softplus⁻¹(1)``: the pointer starts moving one source token per target token
_STEP_ONE = 0.5413248546129181


def default_cross_heads(num_heads: int) -> int:
    """``--cross-alibi-heads`` by default: half the heads (at least one), the others content
    only (fixed alignment alone cost BLEU in range: You et al. 2020)."""
    return max(1, num_heads // 2)


def build_cross_attention(embed_dim, cfg, cross: CrossOptions, attention: str,
                          quant_noise=0.0, qn_block_size=8):
    """The decoder layer's ``encoder_attn`` for the model's cross-attention options, or
    ``None`` when none is on (the stock attention is kept, so models and checkpoints without
    them compute what they did); ``cfg`` the layer's fairseq ``TransformerConfig`` (sizes,
    dropout), ``attention`` the model's ``--alibi-attention``."""
    if cross is None or not cross.uses_cross_position:
        return None
    return CrossPositionAttention(
        embed_dim, cfg.decoder.attention_heads, cross, attention,
        kdim=cfg.encoder.embed_dim, vdim=cfg.encoder.embed_dim,
        dropout=cfg.attention_dropout, q_noise=quant_noise, qn_block_size=qn_block_size,
    )


class LongestSource(torch.nn.Module):
    """The longest real source a translation model was trained on, in tokens, EOS included (as
    fairseq counts source positions): a saved buffer ``tokens`` that every training forward
    pass raises to the batch's longest row (:meth:`record`, no host synchronisation); 0 = none
    recorded (a model not trained yet, or a checkpoint saved before the record existed, which
    loads with 0 and so keeps its behaviour). What ``--cross-alibi-inference-longer-than``
    defaults to (:meth:`CrossPositionAttention.longer_than`). In distributed training each
    process records the sources it saw, and the checkpoint holds the saving process's record."""

    def __init__(self):
        super().__init__()
        self.register_buffer("tokens", torch.zeros((), dtype=torch.long))
        self._on_host = None  # int(tokens), read once after each change

    def record(self, real_lengths: Tensor):
        """Raise the record to the longest of a training batch's real source lengths ``(B,)``."""
        torch.maximum(self.tokens, real_lengths.max().to(self.tokens), out=self.tokens)
        self._on_host = None

    def tokens_on_host(self) -> int:
        if self._on_host is None:
            self._on_host = int(self.tokens)
        return self._on_host

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        key = prefix + "tokens"
        if key not in state_dict:  # saved before the record existed: none recorded
            self.tokens.zero_()
            if key in missing_keys:
                missing_keys.remove(key)
        self._on_host = None


class RowBias:
    """A bias of its own per batch row: this call's float32 ``(B, H, T, S)`` bias, cast to the
    attention's dtype when asked (``None``: no bias, a zero). Built for one call, it is its own
    call's bias (:class:`~fairseq_alibi.modules.attention.dispatch.AttentionBias` and
    :class:`~fairseq_alibi.modules.attention.dispatch.CallBias` of kind ``rows``), which only
    the dense backends take."""

    kind, variant, scales_need_grad, global_tokens, windowed = "rows", None, False, 0, False

    def __init__(self, bias: Optional[Tensor], num_heads: int, device):
        self.bias, self.num_heads, self.device = bias, num_heads, device

    def for_call(self, key_padding_mask, batch, query_len, key_len, incremental):
        return self

    def dense(self, query_len, key_len, dtype):
        if self.bias is None:
            return torch.zeros((1, 1, 1, 1), dtype=dtype, device=self.device)
        return self.bias.to(dtype)


class CrossPositionAttention(MultiheadAttention):
    """Encoder-decoder attention ``softmax(f_b·QKᵀ/√d + bias + padding)·V``.

    ``cross``, the model's :class:`~fairseq_alibi.options.CrossOptions` (validated where they
    are declared): the mode ``cross_alibi`` (``none``, ``pointer`` or ``ratio``); how many
    heads ``K`` (the first) get the bias, ``cross_alibi_heads`` (0: half of them), with slopes
    ``slope_scale·get_slopes(K)`` in training and ``inference_slope_scale·get_slopes(K)``
    outside it (0: ``slope_scale``), for the rows whose real source length exceeds
    ``inference_longer_than`` (0: every row; ``None``: the model's record of its longest
    training source, :meth:`use_longest_source`); ``r`` of ``ratio``; ``N`` of the length
    scale ``f_b = log S_b / log N`` (``cross_attention_length_scale``, 0: ``f_b = 1``).
    ``attention``: ``--alibi-attention`` (``naive`` runs the explicit reference; any other
    choice leaves it to ``auto``, which gives a per-row bias to ``sdpa``).
    """

    def __init__(self, embed_dim, num_heads, cross: CrossOptions, attention="auto", **kwargs):
        super().__init__(embed_dim, num_heads, encoder_decoder_attention=True, **kwargs)
        mode = str(cross.cross_alibi)
        self.mode = mode
        self.length_reference = float(cross.cross_attention_length_scale)
        self.biased_heads = (int(cross.cross_alibi_heads or default_cross_heads(num_heads))
                             if mode != "none" else 0)
        ratio = cross.cross_alibi_ratio
        self.ratio = None if ratio is None else float(ratio)
        self.slope_scale = float(cross.cross_alibi_slope_scale)
        self.inference_slope_scale = (float(cross.cross_alibi_inference_slope_scale)
                                      or self.slope_scale)
        # None: the longest source the decoder recorded in training (use_longest_source)
        longer = cross.cross_alibi_inference_longer_than
        self.inference_longer_than = None if longer is None else int(longer)
        object.__setattr__(self, "longest_source", None)  # the model's, not saved here
        self.attention_backend = attention
        if self.biased_heads:
            # kept float32 by _apply: the training slopes, saved (no other tensor tells K,
            # which the model's load check reads from them), and outside training's, not
            # saved (a load-time option), in the shape a decoding step broadcasts
            self.register_buffer("slopes", self._head_slopes())
            self.register_buffer("inference_slopes", self._head_slopes(inference=True).view(
                1, -1, 1, 1), persistent=False)
        if mode == "pointer":
            self.pointer_step = torch.nn.Linear(embed_dim, 1)
            torch.nn.init.zeros_(self.pointer_step.weight)
            torch.nn.init.constant_(self.pointer_step.bias, _STEP_ONE)

    def extra_repr(self):
        return (f"mode={self.mode}, biased_heads={self.biased_heads}, ratio={self.ratio}, "
                f"slope_scale={self.slope_scale}, "
                f"inference_slope_scale={self.inference_slope_scale}, "
                f"inference_longer_than={self.inference_longer_than}, "
                f"length_reference={self.length_reference}")

    def use_longest_source(self, longest: LongestSource):
        """Read ``longest`` (the model's record of its training sources) when no
        ``inference_longer_than`` is given: a plain reference, saved by the model."""
        object.__setattr__(self, "longest_source", longest)

    def longer_than(self) -> int:
        """The real source length beyond which a row gets the inference slopes, outside
        training: the option if given, else the longest training source recorded (0: every
        row; also when the inference slopes are the training ones, where it changes nothing)."""
        if self.inference_longer_than is not None:
            return self.inference_longer_than
        if self.longest_source is None or self.inference_slope_scale == self.slope_scale:
            return 0
        return self.longest_source.tokens_on_host()

    def _head_slopes(self, inference=False):
        """``(H,)`` float32: Press's slopes of the ``K`` biased heads (times the slope scale,
        or the inference one), then ``H - K`` zeros."""
        slopes = torch.zeros(self.num_heads)
        scale = self.inference_slope_scale if inference else self.slope_scale
        slopes[: self.biased_heads] = get_slopes(self.biased_heads) * scale
        return slopes

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        if self.biased_heads:  # model.half() must not round the slopes
            device = self.slopes.device
            self.slopes = self._head_slopes().to(device)
            self.inference_slopes = self._head_slopes(inference=True).to(device).view(
                1, -1, 1, 1)
        return out

    def position_state(self, incremental_state) -> Optional[Dict[str, Tensor]]:
        """A decoding step's ``offsets`` (``pointer``: ``j - p_t`` of the last query,
        ``(B, 1, S)``) or ``steps`` (``ratio``: queries seen, ``(B,)``)."""
        if incremental_state is None:
            return None
        return self.get_incremental_state(incremental_state, _STATE)

    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None,
                need_weights=True, static_kv=False, attn_mask=None, before_softmax=False,
                need_head_weights=False):
        tgt_len, bsz, _ = query.size()
        H, D = self.num_heads, self.head_dim
        q = self.q_proj(query)  # (T, B, H·D): a decoding step takes it as (B·H, 1, D), a view
        if key_padding_mask is not None and key_padding_mask.dim() == 0:
            key_padding_mask = None
        saved = self._source_state(key, value, key_padding_mask, incremental_state, bsz, q)
        k, v = saved["prev_key"], saved["prev_value"]

        if self.length_reference > 0:  # f_b·(q·k): on the queries, per row
            q = q * saved["length_factor"].to(q.dtype)

        bias = None
        if self.mode != "none":
            bias = self._position_bias(query, saved, incremental_state, bsz, tgt_len, q.device)
            key_padding_mask = None  # in the bias

        if incremental_state is not None and tgt_len == 1 and attn_mask is None \
                and not before_softmax and not self.training:
            if bias is None and "source_padding" in saved:
                bias = saved["source_padding"]
            return self._decoding_step(q.view(bsz * H, 1, D), k, v, bias,
                                       need_weights or need_head_weights, need_head_weights)
        queries = q.contiguous().view(tgt_len, bsz, H, D).permute(1, 2, 0, 3)
        return attend_and_project(self, "naive" if self.attention_backend == "naive" else "auto",
                                  queries, k, v, RowBias(bias, H, q.device), key_padding_mask,
                                  attn_mask, need_weights, need_head_weights, before_softmax)

    def _source_state(self, key, value, key_padding_mask, incremental_state, bsz, q):
        """The source's keys and values as ``(B, H, S, D)`` and what follows from its padding
        and lengths, computed once a sentence and kept in the parent's buffer for the decoding
        steps (reordered with the keys, by the parent's rule)."""
        H, D = self.num_heads, self.head_dim
        saved = self._get_input_buffer(incremental_state) if incremental_state is not None \
            else {}
        if saved.get("prev_key") is None:
            # the source's keys, contiguous once (not copied by the kernel at every step)
            saved["prev_key"] = self.k_proj(key).view(key.size(0), bsz, H, D).permute(
                1, 2, 0, 3).contiguous()
            saved["prev_value"] = self.v_proj(value).view(value.size(0), bsz, H, D).permute(
                1, 2, 0, 3).contiguous()
        if saved.get("source_positions") is None:
            positions, real_len = source_positions(key_padding_mask, bsz,
                                                   saved["prev_key"].size(2), q.device)
            saved["source_positions"] = positions
            if key_padding_mask is not None and bool(key_padding_mask[:, -1].any()):
                # not left-padded: the column of each row's last source token (the first
                # maximum of the running count of real tokens)
                saved["last_key"] = (~key_padding_mask.bool()).int().cumsum(dim=1).argmax(
                    dim=1, keepdim=True)
            if key_padding_mask is not None:
                # the padding merged into the bias (one op per step, no mask of its own), by a
                # value that stays finite in the attention's dtype; (B, 1, 1, S), the shape a
                # decoding step adds
                saved["source_padding"] = key_padding_mask.view(bsz, 1, 1, -1).to(
                    q.dtype) * mask_value(q.dtype)  # in q's dtype: float32 would overflow
                # float64's value to -inf, and 0 · -inf is NaN on every real key
            longer_than = self.longer_than() if self.biased_heads and not self.training else 0
            if longer_than:
                # outside training, each row's slopes by its source length: (B, H, 1, 1)
                saved["row_slopes"] = slopes_by_length(
                    self.slopes, self.inference_slopes, real_len, longer_than)
            if self.length_reference > 0:
                # (B, 1): broadcast on the queries' (T, B, H·D), and the batch first, as the
                # parent's reorder of this buffer expects
                saved["length_factor"] = length_scale(real_len, self.length_reference).view(
                    bsz, 1)
            if incremental_state is not None:
                self._set_input_buffer(incremental_state, saved)
        return saved

    def _position_bias(self, query, saved, incremental_state, bsz, tgt_len, device):
        """The cross-attention position bias of these queries, ``(B, H, T, S)`` (padding
        merged in), and the position state carried to the next decoding step."""
        slopes = self.slopes if self.training else saved.get("row_slopes", self.inference_slopes)
        previous = self.position_state(incremental_state)
        positions = saved["source_positions"]
        if self.mode == "pointer":
            if not previous and tgt_len == 1:
                # the first query alone (a first decoding step): p_0 = 0, its step unused
                offsets = positions.view(bsz, 1, -1)
                state = {"offsets": offsets}
            else:
                step = self.pointer_step  # F.linear: no module call at every step
                steps = F.linear(query, step.weight, step.bias)  # (T, B, 1)
                if steps.dtype != torch.float32:
                    steps = steps.float()
                steps = F.softplus(steps)
            if previous and tgt_len == 1:
                # a decoding step: j - p_t = (j - p_{t-1}) - step_t, the state updated in
                # place (a step's host-side work is most of what it costs: no new dict)
                offsets = previous["offsets"] - steps.view(bsz, 1, 1)
                previous["offsets"] = offsets
                state = None
            elif tgt_len > 1:
                anchors = pointer_positions(  # p_{t-1} = j - (j - p_{t-1})
                    steps.view(tgt_len, bsz).t(),
                    positions[:, -1] - previous["offsets"][:, 0, -1] if previous else None)
                offsets = positions[:, None, :] - anchors[:, :, None]
                state = {"offsets": offsets[:, -1:]}
            if state is not None and "last_key" in saved:
                state["last_key"] = saved["last_key"]  # beside the offsets: one dict read
            bias = bias_of_offsets(slopes, offsets, saved.get("source_padding"))
        else:  # r·t, t counted in the state
            seen = previous["steps"] if previous else torch.zeros(bsz, dtype=torch.float32,
                                                                  device=device)
            targets = seen[:, None] if tgt_len == 1 else \
                seen[:, None] + torch.arange(tgt_len, device=device)
            state = {"steps": seen + tgt_len}
            bias = cross_alibi_bias(slopes, targets * self.ratio, positions,
                                    saved.get("source_padding"))
        if incremental_state is not None and state is not None:
            self.set_incremental_state(incremental_state, _STATE, state)
        return bias

    def _decoding_step(self, q, k, v, bias, need_weights, need_head_weights):
        """A decoding step (one query per row, no dropout), with the weights fairseq's decoder
        asks of every cross-attention: three batched matrix products of ``(B·H, ·, ·)`` views
        (``q``: ``(B·H, 1, D)``; ``k``, ``v``: ``(B, H, S, D)``), the bias added inside the
        first (``baddbmm``). The same function as the general path, in fewer, larger
        operations: a small decoder's step costs what their count costs (docs/translation.md,
        "Speed of the cross-attention options")."""
        B, H, S, D = k.shape
        keys_t = k.view(B * H, S, D).transpose(1, 2)
        if bias is None:
            scores = torch.bmm(q, keys_t).mul_(self.scaling)
        else:
            if bias.dtype != q.dtype:
                bias = bias.to(q.dtype)
            if bias.size(1) != H:  # the padding alone: one row per sequence
                bias = bias.expand(B, H, 1, S)
            scores = torch.baddbmm(bias.reshape(B * H, 1, S), q, keys_t, alpha=self.scaling)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
        if probs.dtype != q.dtype:
            probs = probs.to(q.dtype)
        out = torch.bmm(probs, v.view(B * H, S, D))
        out = self.out_proj(out.view(1, B, H * D))  # (B, H, 1, D) in memory: (1, B, H·D)
        if not need_weights:
            return out, None
        weights = probs.view(B, H, 1, S).transpose(1, 0)
        return out, (weights if need_head_weights else weights.mean(dim=0))

    def position_key(self) -> str:
        """The incremental-state key of :meth:`position_state` (read directly by the EOS guard,
        which runs at every decoding step)."""
        return self._get_full_incremental_state_key(_STATE)

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        """The parent's reorder of the source's keys (only when sentences leave the batch),
        then the position, which follows every beam reorder."""
        incremental_state = super().reorder_incremental_state(incremental_state, new_order)
        state = self.position_state(incremental_state)
        if state:
            self.set_incremental_state(incremental_state, _STATE, {
                name: tensor.index_select(0, new_order) for name, tensor in state.items()})
        return incremental_state


def distance_left(position: Optional[Dict[str, Tensor]]) -> Optional[Tensor]:
    """``(B, 1)`` source tokens left before each row's last real source token by a layer's
    pointer, from its position state (:meth:`CrossPositionAttention.position_state`; ``None``
    before the first step)."""
    if not position:
        return None
    offsets = position["offsets"]  # j - p_t: at the last source token, the distance left
    last = position.get("last_key")  # sources padded on the right only
    return offsets[..., -1] if last is None else offsets[:, 0].gather(1, last)


def forbid_early_eos(logits: Tensor, distance_left: Tensor, eos: int, distance):
    """The EOS guard of a decoding step: the last position's EOS logit of the rows whose
    pointer is more than ``distance`` source tokens before their last real source token
    (``distance_left``, ``(B, 1)``: :func:`distance_left`; ``distance``
    a number or a 0-dim tensor) becomes :func:`~fairseq_alibi.alibi.mask_value` (in place;
    returns ``logits``).

    A finite floor, not ``-inf``: at the generator's last step (``max_len``) fairseq leaves
    only EOS open, and an EOS of ``-inf`` there would leave no finite candidate (its
    ``assert step < max_len`` fails); with the floor EOS is still chosen there, so a pointer that
    never reaches the end cannot keep beam search from ending, and such a hypothesis scores
    below every one that ended on its own (sampling too: :func:`_sample_floored_rows`).
    """
    # (B, 1), the shape of distance_left: a decoding step's logits are (B, 1, V)
    last = logits[..., eos] if logits.size(1) == 1 else logits[:, -1:, eos]
    last.masked_fill_(distance_left > distance, mask_value(logits.dtype))
    return logits


def _sample_floored_rows(step_fn):
    """fairseq's ``Sampling.step``, also for a row where every candidate's probability is 0
    in float32 (stock: ``invalid multinomial distribution``). With the EOS guard that is the
    generator's ``max_len`` step: only EOS is open there, at the guard's floor, whose ``exp`` is
    0. Such a row is shifted by its maximum before sampling (its best candidate, EOS there,
    gets probability 1) and the shift is added back to the score, so the hypothesis ends with
    the floored score, as beam search ends it. Every other row is unchanged, bit for bit (a
    shift of 0, no host sync)."""

    def step(self, step, lprobs, scores, *args, **kwargs):
        top = lprobs.amax(dim=-1, keepdim=True)
        floored = top.exp().eq(0) & torch.isfinite(top)  # all -inf: left to fail as stock
        shift = torch.where(floored, top, torch.zeros_like(top))
        scores_buf, indices_buf, beams_buf = step_fn(self, step, lprobs - shift, scores,
                                                     *args, **kwargs)
        shift = shift.view(shift.size(0), -1)  # (bsz, beam); step 0 samples beam 0 only
        return scores_buf + shift.gather(1, beams_buf), indices_buf, beams_buf

    step._samples_floored_rows = True
    return step


def let_sampling_end_at_the_floor():
    """Wrap fairseq's ``Sampling.step`` (:func:`_sample_floored_rows`; idempotent): called by
    :func:`fairseq_alibi.registration.register`, with the package's other process-wide
    changes."""
    from fairseq.search import Sampling

    if not getattr(Sampling.step, "_samples_floored_rows", False):
        Sampling.step = _sample_floored_rows(Sampling.step)
