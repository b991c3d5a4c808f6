"""The ALiBi layer stacks every model family builds: fairseq's own encoder and decoder with no
position embeddings, ALiBi self-attention layers sharing one bias, and no length limit.

* :class:`AlibiTransformerEncoder`: ``alibi_roberta``'s encoder and ``alibi_transformer``'s
  (with attention sinks, a source padded on the left runs with its padding at its end: the
  sinks are its first real tokens).
* :class:`AlibiTransformerDecoder`: ``alibi_transformer_lm``'s decoder and
  ``alibi_transformer``'s (with its cross-attention).
* :class:`AlibiCrossPositionDecoder`, :class:`StockCrossPositionDecoder`: a decoder (ALiBi or
  stock positions) whose cross-attention has a position signal, with the EOS guard
  (:class:`~fairseq_alibi.options.CrossOptions`).

A stack is given its options as one object (:class:`~fairseq_alibi.options.StackOptions`); its
one :class:`~fairseq_alibi.modules.bias.AlibiBias` is built with its first layer
(:meth:`AlibiStack.next_layer_bias`: fairseq builds the layers inside ``__init__``) and each
layer gets its view of it.
"""

import torch
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoder,
    TransformerDecoderBase,
    TransformerEncoder,
)

from fairseq_alibi.error_hints import OneLineError
from fairseq_alibi.modules.alibi_transformer_layer import (
    AlibiTransformerDecoderLayer,
    AlibiTransformerEncoderLayer,
    CrossPositionDecoderLayer,
    keep_references,
    wrap_layer,
)
from fairseq_alibi.modules.bias import AlibiBias, LayerBias
from fairseq_alibi.modules.cross_position import (
    CrossPositionAttention,
    distance_left,
    forbid_early_eos,
)
from fairseq_alibi.options import CrossOptions, StackOptions

#: what ``max_positions()`` reports: ALiBi has no length limit, only memory does
UNBOUNDED_POSITIONS = 1_000_000_000


class AlibiStack:
    """What the ALiBi stacks share: the options, the one bias built with the first layer,
    each layer's view of it, and no maximum length."""

    def next_layer_bias(self, num_heads: int, num_layers: int) -> LayerBias:
        """The view of the stack's bias for the next layer built (the bias is built first)."""
        if "alibi" not in self._modules:
            self.alibi = AlibiBias(num_heads, self.alibi_options, num_layers)
            self.alibi_layers_built = 0
        view = self.alibi.layer(self.alibi_layers_built)
        self.alibi_layers_built += 1
        return view

    def max_positions(self):
        return UNBOUNDED_POSITIONS

    def read_tokens(self, tokens):
        """Before a forward pass: the bias finds the documents of ``--alibi-document-mask`` in
        the tokens' ``</s>`` (the full prefix while decoding: the cache numbers on from it)."""
        if "alibi" in self._modules:
            self.alibi.read_tokens(tokens, self.dictionary.eos())


class AlibiTransformerEncoder(AlibiStack, TransformerEncoder):
    """Stock ``TransformerEncoder``: no position embeddings, ALiBi self-attention layers."""

    def __init__(self, args, dictionary, embed_tokens, options: StackOptions, **kwargs):
        keep_references(self, alibi_options=options)
        args.no_token_positional_embeddings = True  # the bias replaces them
        super().__init__(args, dictionary, embed_tokens, **kwargs)

    def forward_scriptable(self, src_tokens, src_lengths=None, return_all_hiddens=False,
                           token_embeddings=None):
        # attention sinks are a sequence's first real tokens, and fairseq pads translation
        # sources on the left: each row runs with its padding moved to its end (the bias
        # depends on i - j only, so nothing else changes) and its outputs are put back; a
        # batch padded on the right runs as it is (stock's encoder asks .any() of its padding too)
        if ("alibi" not in self._modules or not self.alibi.sinks
                or not bool(src_tokens[:, :1].eq(self.padding_idx).any())):
            self.read_tokens(src_tokens)
            return super().forward_scriptable(src_tokens, src_lengths, return_all_hiddens,
                                              token_embeddings)
        there, back = _padding_to_the_end(src_tokens, self.padding_idx)
        rolled = src_tokens.gather(1, there)
        if token_embeddings is not None:
            token_embeddings = token_embeddings.gather(1, _along(there, token_embeddings))
        self.read_tokens(rolled)
        out = super().forward_scriptable(rolled, src_lengths, return_all_hiddens,
                                         token_embeddings)
        by_time = back.t()  # the (T, B, C) outputs
        for key in ("encoder_out", "encoder_states", "fc_results"):
            out[key] = [x if x is None else x.gather(0, _along(by_time, x)) for x in out[key]]
        out["encoder_embedding"] = [x.gather(1, _along(back, x))
                                    for x in out["encoder_embedding"]]
        out["encoder_padding_mask"] = [src_tokens.eq(self.padding_idx)]
        return out

    def build_encoder_layer(self, args):
        cfg = TransformerConfig.from_namespace(args)
        alibi = self.next_layer_bias(cfg.encoder.attention_heads, cfg.encoder.layers)
        layer = AlibiTransformerEncoderLayer(cfg, alibi, attention=self.alibi_options.attention,
                                             return_fc=self.return_fc)
        return wrap_layer(layer, cfg)


def _padding_to_the_end(tokens, padding_idx: int):
    """``(there, back)``, ``(B, T)`` indices along the time axis: ``tokens.gather(1, there)``
    moves each row's leading padding to its end (its first real token to position 0), and
    ``gather(1, back)`` of the result puts every position back."""
    B, T = tokens.shape
    leading = tokens.eq(padding_idx).long().cumprod(dim=1).sum(dim=1, keepdim=True)
    steps = torch.arange(T, device=tokens.device)[None]
    return (steps + leading) % T, (steps - leading) % T


def _along(index, x):
    """``index`` ``(A, B)`` expanded over ``x``'s trailing dimensions, for ``x.gather``."""
    return index.view(*index.shape, *([1] * (x.dim() - 2))).expand(*index.shape, *x.shape[2:])


class AlibiTransformerDecoder(AlibiStack, TransformerDecoder):
    """Stock ``TransformerDecoder``: no position embeddings, ALiBi self-attention layers (the
    causal bias is the causal mask), the cross-attention of ``cross`` if it has one."""

    def __init__(self, args, dictionary, embed_tokens, options: StackOptions,
                 no_encoder_attn=True, cross: CrossOptions = None, **kwargs):
        keep_references(self, alibi_options=options, cross_options=cross)
        args.no_token_positional_embeddings = True  # the bias replaces them
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn, **kwargs)

    def extract_features_scriptable(self, prev_output_tokens, encoder_out=None,
                                    incremental_state=None, *args, **kwargs):
        # attention sinks are a sequence's first real tokens: a row padded on the left (a
        # batch built by hand; fairseq's generators pad on the right) runs with its padding
        # moved to its end, exactly as the encoder does; causal, so its real tokens never see it
        # (read once a sequence: a KV cache already filled passed this check on its first step)
        if ("alibi" not in self._modules or not self.alibi.sinks or incremental_state
                or not bool(prev_output_tokens[:, :1].eq(self.padding_idx).any())):
            self.read_tokens(prev_output_tokens)
            return super().extract_features_scriptable(prev_output_tokens, encoder_out,
                                                       incremental_state, *args, **kwargs)
        if incremental_state is not None:  # its first step, the cache empty
            raise OneLineError(
                "decoding with a KV cache from rows padded on the left, with attention sinks "
                "(--alibi-window-sinks): the sinks would be the padding; pad the prompts on "
                "the right, as fairseq's generators do")
        there, back = _padding_to_the_end(prev_output_tokens, self.padding_idx)
        rolled = prev_output_tokens.gather(1, there)
        self.read_tokens(rolled)
        x, extra = super().extract_features_scriptable(rolled, encoder_out, None, *args,
                                                       **kwargs)
        extra["inner_states"] = [state.gather(0, _along(back.t(), state))
                                 for state in extra["inner_states"]]
        extra["attn"] = [a if a is None else a.gather(1, _along(back, a)) for a in extra["attn"]]
        return x.gather(1, _along(back, x)), extra

    def build_decoder_layer(self, args, no_encoder_attn=False):
        cfg = TransformerConfig.from_namespace(args)
        alibi = self.next_layer_bias(cfg.decoder.attention_heads, cfg.decoder.layers)
        layer = AlibiTransformerDecoderLayer(cfg, alibi, no_encoder_attn,
                                             attention=self.alibi_options.attention,
                                             cross=self.cross_options)
        return wrap_layer(layer, cfg)

    def buffered_future_mask(self, tensor):
        return None  # causality is part of the causal ALiBi bias: no (T, T) mask to build


class EosGuard:
    """A decoder whose layers' cross-attention has a position signal, and the EOS guard.

    ``--cross-alibi-eos-guard D`` acts on the decoder's output, at a decoding step only (an
    ``incremental_state``, not training, not teacher forcing): the logit of EOS is floored
    (:func:`~fairseq_alibi.modules.cross_position.forbid_early_eos`) in every row whose guarded
    pointer is more than ``D`` source tokens before the row's last real source token:
    ``--cross-alibi-eos-guard-layer`` reads the ``last`` layer's (default), the ``first``, or
    ``min``, the pointer furthest behind (the largest distance left over the layers).
    ``get_normalized_probs`` then gives EOS no probability, so stock ``fairseq-generate``,
    ``fairseq-interactive`` and the hub need nothing; at the generator's ``max_len`` EOS is the
    only token left and still ends the hypothesis.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cross_alibi_eos_guard = float(self.cross_options.cross_alibi_eos_guard)
        attentions = [m for m in self.modules() if isinstance(m, CrossPositionAttention)]
        self.cross_alibi_eos_guard_layer = self.cross_options.cross_alibi_eos_guard_layer
        read = {"last": attentions[-1:], "first": attentions[:1], "min": attentions}
        # the pointers read, as plain references (the layers own the modules)
        object.__setattr__(self, "guard_attentions", read[self.cross_alibi_eos_guard_layer])
        # the margin as a 0-dim tensor per (margin, device): comparing with a Python float
        # wraps it into a tensor at every step
        self._guard_margins = {}

    def eos_distance(self, incremental_state):
        """``(B, 1)``: source tokens left before the last one by the guarded pointer (with
        ``min``, the pointer furthest behind), or ``None`` before the first step."""
        # at every decoding step: the layers' states read directly, one op a layer
        furthest = None
        for m in self.guard_attentions:
            left = distance_left(incremental_state.get(m.position_key()))
            if left is None:
                return None
            furthest = left if furthest is None else torch.maximum(furthest, left)
        return furthest

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None,
                features_only=False, **kwargs):
        x, extra = super().forward(prev_output_tokens, encoder_out=encoder_out,
                                   incremental_state=incremental_state,
                                   features_only=features_only, **kwargs)
        if self.cross_alibi_eos_guard >= 0 and incremental_state is not None \
                and not features_only and not self.training:
            left = self.eos_distance(incremental_state)
            if left is not None:
                key = (self.cross_alibi_eos_guard, left.device)
                margin = self._guard_margins.get(key)
                if margin is None:
                    margin = self._guard_margins[key] = torch.tensor(
                        self.cross_alibi_eos_guard, device=left.device)
                forbid_early_eos(x, left, self.dictionary.eos(), margin)
        return x, extra


class AlibiCrossPositionDecoder(EosGuard, AlibiTransformerDecoder):
    """The ALiBi decoder (its layers' hook builds the cross-attention) with the EOS guard."""


class StockCrossPositionDecoder(EosGuard, TransformerDecoderBase):
    """The stock decoder (stock positions) whose layers have the cross-attention hook."""

    def __init__(self, cfg, dictionary, embed_tokens, cross: CrossOptions, attention="auto",
                 **kwargs):
        keep_references(self, cross_options=cross, cross_attention_backend=attention)
        super().__init__(cfg, dictionary, embed_tokens, **kwargs)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        layer = CrossPositionDecoderLayer(cfg, no_encoder_attn, cross=self.cross_options,
                                          attention=self.cross_attention_backend)
        return wrap_layer(layer, cfg)
