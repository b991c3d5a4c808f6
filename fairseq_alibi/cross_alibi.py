"""The math of the cross-attention position options (decoder queries, encoder keys).

Self-attention ALiBi gives each side relative order only; the cross-attention of a stock
encoder-decoder has no position signal at all, so a decoder finds its place in the source by
content learned on short sources. These formulas give it one. Source positions ``j`` count from
the first real (non-pad) token of each row (fairseq pads sources on the left), target positions
``t`` from the first decoder input (the start symbol); ``S_b`` is row ``b``'s real source length.

=============  =================================================================================
option         added to (or multiplying) the logit of query ``t``, key ``j``, head ``h``
=============  =================================================================================
``pointer``    ``-m_h·|j - p_t|``, heads ``h < K``; ``p_0 = 0``, ``p_t = p_{t-1} + step_t`` with a
               learned ``step_t > 0`` (:func:`pointer_positions`)
``ratio``      ``-m_h·|j - r·t|``, heads ``h < K``; ``r`` = source tokens per target token
length scale   content logit ``q·k/√d`` times ``log S_b / log N`` (:func:`length_scale`)
=============  =================================================================================

``m_h`` are Press et al.'s slopes over the ``K`` biased heads (``get_slopes(K)``); the other
``H - K`` heads get no bias (content only). Everything is computed in float32, whatever the
model's precision, and from differences ``j - anchor`` (never the "row trick").
"""

import torch


def cross_alibi_bias(slopes: torch.Tensor, anchors: torch.Tensor, first_real: torch.Tensor,
                     src_len: int, num_heads: int) -> torch.Tensor:
    """``bias[b, h, t, j] = -m_h·|(j - first_real_b) - anchors[b, t]|`` for ``h < K``, 0 for
    the other heads: float32 ``(B, num_heads, T, src_len)``.

    ``slopes`` ``(K,)``; ``anchors`` ``(B, T)`` source positions (the pointer ``p_t`` or
    ``r·t``); ``first_real`` ``(B,)`` the index of each row's first non-pad key (its left
    padding). Padding keys get a finite value here; the key padding mask hides them.
    """
    keys = torch.arange(src_len, device=anchors.device, dtype=torch.float32)
    rel = keys[None, None, :] - first_real.float()[:, None, None] - anchors.float()[:, :, None]
    biased = -slopes.float().to(anchors.device)[None, :, None, None] * rel.abs()[:, None]
    return torch.nn.functional.pad(biased, (0, 0, 0, 0, 0, num_heads - slopes.numel()))


def pointer_positions(steps: torch.Tensor, previous=None) -> torch.Tensor:
    """The pointer ``p_t`` of every query, ``(B, T)`` from the steps ``(B, T)`` of the queries.

    ``p_t = p_{t-1} + step_t``: a cumulative sum, so teacher forcing computes every query's
    pointer in parallel. With ``previous`` (``(B,)``, the pointer of the query before the
    first one here: a decoding step) it continues from there; without it the first query is
    the start, ``p_0 = 0`` (its step is not used).
    """
    if previous is None:
        steps = torch.cat([torch.zeros_like(steps[:, :1]), steps[:, 1:]], dim=1)
        return steps.cumsum(dim=1)
    return previous[:, None] + steps.cumsum(dim=1)


def length_scale(real_lengths: torch.Tensor, reference: float) -> torch.Tensor:
    """``log S_b / log N``, float32 ``(B,)``: the factor of row ``b``'s content logits.

    With ``N`` the reference length (e.g. the mean training source length) a source of ``N``
    tokens keeps its logits; a longer one gets sharper ones, so that the attention's entropy does
    not grow with ``log S`` (a source of one token gets 0: its one key takes all the weight).
    """
    return real_lengths.float().clamp(min=1).log() / torch.log(torch.tensor(float(reference)))
