"""The CLAP masked-LM head and the token embedding that goes with it.

The stock RoBERTa head computes ``W·LayerNorm(GELU(dense(x))) + b``. The CLAP head drops the
dense layer, the activation, the layer norm and the bias, and compares the features with
L2-normalised token embeddings, scaled by one learned temperature ``β``::

    logits = β · x · normalize(W)ᵀ          normalize(w) = w / ‖w‖₂ row-wise (0 stays 0)

With the weight tied to the input embedding, the inputs are normalised the same way
(:class:`EncoderTokenEmbedding`), so a token is represented by its direction only, on both
sides of the model.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


def normalize_rows(weight: torch.Tensor) -> torch.Tensor:
    """Row-wise L2 normalisation ``w / ‖w‖₂``, computed in float32.

    A zero row (the padding row of a tied embedding is zero) has no direction: it stays zero and
    gets no gradient. ``F.normalize`` would give it a gradient of ``1/eps`` (1e12), which swamps
    the gradient norm, gradient clipping and the fp16 loss scale.
    """
    w = weight.float()
    norm = w.norm(dim=-1, keepdim=True)
    nonzero = norm > 0
    unit = w / torch.where(nonzero, norm, torch.ones_like(norm))
    return unit.masked_fill(~nonzero, 0.0).type_as(weight)


class ClapHead(nn.Module):
    """``logits = β · linear(features, normalize(W))``; only masked positions while training.

    ``weight`` is the ``(vocab, dim)`` matrix to compare with (the tied input embedding, or a
    fresh one with ``--untie-weights-roberta``); ``normalize=False`` (``--clap-no-normalize``)
    uses ``W`` as it is. ``β`` is a learned scalar starting at ``initial_beta``.
    """

    def __init__(
        self,
        embed_dim: int,
        output_dim: int,
        weight: Optional[nn.Parameter] = None,
        initial_beta: float = 1.0,
        normalize: bool = True,
    ):
        super().__init__()
        if weight is None:
            weight = nn.Linear(embed_dim, output_dim, bias=False).weight
        self.weight = weight
        self.normalize = normalize
        self.beta = nn.Parameter(torch.tensor(float(initial_beta)))

    def extra_repr(self):
        return f"normalize={self.normalize}"

    def forward(self, features, masked_tokens=None, **kwargs):
        if masked_tokens is not None:  # as the stock head: project the masked tokens only
            features = features[masked_tokens, :]
        weight = normalize_rows(self.weight) if self.normalize else self.weight
        return self.beta.to(features.dtype) * F.linear(features, weight.to(features.dtype))


class EncoderTokenEmbedding(nn.Embedding):
    """``nn.Embedding`` with two options of the CLAP study.

    ``normalize``: every looked-up vector is L2-normalised (the input side of the CLAP head;
    the encoder's ``embed_scale`` — 1, or √d without ``no_scale_embedding`` — is applied
    after it, as for any embedding). ``zero_index``: that token (``<mask>``) embeds to a fixed
    zero vector whatever its weight row holds, so it never learns a representation of its own.
    ``zero_index`` may be ``num_embeddings`` (the table has no row for it at all: EIFY's
    ``omit_mask``); ids from there on are looked up as the last row, then zeroed, as the fork
    does. ``padding_idx=None`` (EIFY's CLAP/zero-masking embedding) trains the padding row like
    any other; the encoder still masks padding by the dictionary's pad symbol.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: Optional[int],
        normalize: bool = False,
        zero_index: Optional[int] = None,
    ):
        super().__init__(num_embeddings, embedding_dim, padding_idx)
        if zero_index is not None and not 0 <= zero_index <= num_embeddings:
            raise ValueError(
                f"the zero-embedded <mask> id {zero_index} is neither a row of the {num_embeddings}"
                f"-row embedding nor the id just after it"
            )
        self.normalize = normalize
        self.zero_index = zero_index

    def extra_repr(self):
        return super().extra_repr() + f", normalize={self.normalize}, zero_index={self.zero_index}"

    def forward(self, tokens):
        outside = self.zero_index is not None and self.zero_index >= self.num_embeddings
        x = super().forward(tokens.clamp(max=self.num_embeddings - 1) if outside else tokens)
        if self.normalize:
            x = normalize_rows(x)
        if self.zero_index is not None:
            zeroed = tokens >= self.zero_index if outside else tokens == self.zero_index
            x = x.masked_fill(zeroed.unsqueeze(-1), 0.0)
        return x
