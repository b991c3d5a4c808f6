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

``m_h`` are Press et al.'s slopes over the ``K`` biased heads (``get_slopes(K)``), times
``--cross-alibi-slope-scale X`` (default 1; with ``K = 2`` Press's slopes are 1/16 and 1/256,
``X = 16`` makes them 1 and 1/16: one head held within a few tokens of the anchor, one loose);
the other ``H - K`` heads get no bias (content only). Everything is computed in float32, whatever the
model's precision, and from differences ``j - anchor`` (never the "row trick").
"""

from typing import Optional

import torch

#: the values of ``--cross-alibi``
CROSS_ALIBI_MODES = ("none", "pointer", "ratio")


def source_positions(key_padding_mask, bsz: int, src_len: int, device):
    """``(j, S)``: float32 ``(B, src_len)`` key positions counted from each row's first real
    (non-pad) key, and ``(B,)`` real source lengths ``S_b``, from fairseq's ``(B, src_len)``
    key padding mask (``None``: no padding)."""
    keys = torch.arange(src_len, device=device, dtype=torch.float32)
    if key_padding_mask is None:
        return keys.expand(bsz, -1), torch.full((bsz,), float(src_len), device=device)
    real = ~key_padding_mask.bool()
    first_real = real.int().argmax(dim=1, keepdim=True)  # the first maximum: the first real key
    return keys - first_real, real.sum(dim=1, dtype=torch.float32)  # float32 - int64: float32


def cross_alibi_bias(slopes: torch.Tensor, anchors: torch.Tensor, positions: torch.Tensor,
                     padding: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``bias[b, h, t, j] = -m_h·|positions[b, j] - anchors[b, t]| + padding[b, j]``: float32
    ``(B, H, T, S)``.

    ``slopes`` ``(H,)`` (or ``(1, H, 1, 1)``, or per row ``(B, H, 1, 1)``:
    :func:`slopes_by_length`): ``m_h`` of the ``K`` biased heads (Press's ``get_slopes(K)``),
    then 0 for the content-only heads; ``anchors`` ``(B, T)`` source
    positions (the pointer ``p_t`` or ``r·t``); ``positions`` ``(B, S)`` the keys' positions
    (:func:`source_positions`);
    ``padding`` ``(B, S)`` (or ``(B, 1, 1, S)``): 0, or a large finite negative on padding keys
    (``None``: no padding keys). All float32 (a decoding step calls this for every layer: no
    conversions).
    """
    (B, S), T = positions.shape, anchors.size(1)
    return bias_of_offsets(slopes, positions.view(B, 1, S) - anchors.view(B, T, 1), padding)


def bias_of_offsets(slopes: torch.Tensor, offsets: torch.Tensor,
                    padding: Optional[torch.Tensor] = None) -> torch.Tensor:
    """:func:`cross_alibi_bias` from the offsets ``offsets[b, t, j] = positions[b, j] -
    anchors[b, t]``, ``(B, T, S)``: what a decoding step of the pointer carries (one subtraction
    a step, ``j - p_t = (j - p_{t-1}) - step_t``, and the offset of the last source token is the
    distance the EOS guard reads).

    ``slopes`` ``(H,)`` or already ``(1, H, 1, 1)`` (or ``(B, H, 1, 1)``), ``padding``
    ``(B, S)`` or already
    ``(B, 1, 1, S)``: a decoding step passes the broadcast shapes it keeps (each reshape is a
    host-side cost of a step that does little else)."""
    B, T, S = offsets.shape
    distance = offsets.abs().view(B, 1, T, S)
    if slopes.dim() == 1:
        slopes = slopes.view(1, -1, 1, 1)
    if padding is None:  # (B, 1, T, S) times (1, H, 1, 1): not in place
        return torch.mul(distance, slopes).neg_()
    if padding.dim() == 2:
        padding = padding.view(B, 1, 1, S)
    return torch.addcmul(padding, distance, slopes, value=-1.0)


def slopes_by_length(slopes: torch.Tensor, longer: torch.Tensor,
                     real_lengths: torch.Tensor, longer_than: int) -> torch.Tensor:
    """``(B, H, 1, 1)`` float32: each row's slopes, ``longer`` (``(H,)`` or ``(1, H, 1, 1)``)
    for a row whose real source length ``S_b`` exceeds ``longer_than``, ``slopes`` for the
    others: sharper slopes for sources longer than training's, while a source like training's
    is attended as in training."""
    beyond = (real_lengths > longer_than).view(-1, 1, 1, 1)
    return torch.where(beyond, longer.view(1, -1, 1, 1), slopes.view(1, -1, 1, 1))


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
    if steps.size(1) == 1:  # a decoding step
        return previous[:, None] + steps
    return previous[:, None] + steps.cumsum(dim=1)


def length_scale(real_lengths: torch.Tensor, reference: float) -> torch.Tensor:
    """``log S_b / log N``, float32 ``(B,)``: the factor of row ``b``'s content logits.

    With ``N`` the reference length (e.g. the mean training source length) a source of ``N``
    tokens keeps its logits; a longer one gets sharper ones, so that the attention's entropy does
    not grow with ``log S`` (a source of one token gets 0: its one key takes all the weight).
    """
    return real_lengths.float().clamp(min=1).log() / torch.log(torch.tensor(float(reference)))
