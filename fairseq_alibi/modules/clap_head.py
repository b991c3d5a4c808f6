"""The CLAP masked-LM head and the token embedding that goes with it.

The stock RoBERTa head computes ``W·LayerNorm(GELU(dense(x))) + b``. The CLAP head drops the
dense layer, the activation, the layer norm and the bias, and compares the features with
L2-normalised token embeddings, scaled by one learned temperature ``β``::

    logits = β · x · normalize(W)ᵀ          normalize(w) = w / ‖w‖₂ row-wise (0 stays 0)

With the weight tied to the input embedding, the inputs are normalised the same way
(:class:`EncoderTokenEmbedding`), so a token is represented by its direction only, on both
sides of the model.

The head never builds ``normalize(W)``: with a GPT-2 vocabulary ``W`` is 50k × d, and
normalising it whole (forward and backward, several full-size temporaries) at every step cost a
third of a small encoder's training step. It computes the same logits as
``β · (x·Wᵀ) · diag(1/‖w‖)``, scaling the few masked tokens' logits column-wise by the rows'
inverse norms (:class:`_ScaledByInverseNorms`, with its gradient written out), so ``W`` is
only read: once for its row norms, once by the matmul, as the stock head reads it.
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


def inverse_row_norms(weight: torch.Tensor) -> torch.Tensor:
    """``1/‖w‖₂`` of every row, in float32; 0 for a zero row (it has no direction, as in
    :func:`normalize_rows`)."""
    norm = torch.linalg.vector_norm(weight, dim=-1, dtype=torch.float32)
    return torch.where(norm > 0, 1.0 / torch.where(norm > 0, norm, 1.0), 0.0)


class _ScaledByInverseNorms(torch.autograd.Function):
    """``β · linear(x, normalize_rows(W))`` computed as ``β · (x·Wᵀ) · r`` with ``r = 1/‖w‖``.

    Gradients, with ``g`` the logits' gradient, ``s = x·Wᵀ``, ``G = gᵀ·x`` and
    ``t_v = G_v·w_v = Σ_n g_nv s_nv``::

        ∂x = (β · g · r)·W        ∂β = Σ_v t_v r_v        ∂w_v = β r_v G_v − β t_v r_v³ w_v

    (the second term of ``∂w_v`` is the normalisation's: it removes ``G_v``'s component along
    ``w_v``). ``G`` is the one ``V × d`` tensor built, the same as the stock head's weight
    gradient, and it is scaled into ``∂W`` in place. A zero row has ``r = 0``: logit 0, no
    gradient.
    """

    @staticmethod
    def forward(ctx, features, weight, beta):
        inverse = inverse_row_norms(weight)
        scale = beta.detach().float() * inverse
        logits = F.linear(features, weight.to(features.dtype))
        logits.mul_(scale.to(logits.dtype))
        ctx.save_for_backward(features, weight, beta, inverse)
        return logits

    @staticmethod
    def backward(ctx, grad):
        features, weight, beta, inverse = ctx.saved_tensors
        beta_value = beta.detach().float()
        scale = beta_value * inverse
        grad_features = grad_weight = grad_beta = None
        if ctx.needs_input_grad[0]:
            grad_features = (grad * scale.to(grad.dtype)) @ weight.to(grad.dtype)
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:  # any leading dims: (N, ·)
            flat_grad, flat_features = grad.reshape(-1, grad.size(-1)), features.reshape(
                -1, features.size(-1))
            outer = flat_grad.t().to(weight.dtype) @ flat_features.to(weight.dtype)  # G, (V, d)
            along = torch.bmm(outer.unsqueeze(1), weight.unsqueeze(2)).view(-1).float()  # t
            if ctx.needs_input_grad[2]:
                grad_beta = (along * inverse).sum().to(beta.dtype)
            if ctx.needs_input_grad[1]:
                radial = -beta_value * along * inverse.pow(3)
                grad_weight = outer.mul_(scale.to(outer.dtype).unsqueeze(1)).addcmul_(
                    weight, radial.to(weight.dtype).unsqueeze(1))
        return grad_features, grad_weight, grad_beta


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
        if self.normalize:
            return _ScaledByInverseNorms.apply(features, self.weight, self.beta)
        return self.beta.to(features.dtype) * F.linear(features, self.weight.to(features.dtype))


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
