"""What the tests of the CPU windowed backend share (tests/attention/test_slope_windows.py,
tests/attention/test_window_sinks.py): the float64 reference of the windowed definition, the
inputs, the call, the cases and the tolerance."""

import math

import torch

from fairseq_alibi.alibi import variant_slopes, variant_windows
from fairseq_alibi.modules.attention import windowed
from tests.helpers.references import MASKED, reference_windowed_bias


def reference(q, k, v, slopes, future, variant, cutoff, key_padding_mask=None,
              global_tokens=0, sinks=0):
    """float64 ``softmax(q·kᵀ/√d + bias) v`` with the windowed bias of the definition
    (:func:`tests.helpers.references.reference_windowed_bias`: keys beyond ``ceil(T/m)`` dropped
    unless a global token or a sink, one of the first ``sinks``) of ``S`` positions, the last
    ``T`` of them queries; padding dropped.
    Returns ``(out, rows)``: ``rows`` ``(B, H, T, 1)`` the queries with a visible key (the
    others have no reference value; their outputs here are finite, for autograd)."""
    B, H, T, D = q.shape
    S = k.size(2)
    bias = reference_windowed_bias(variant, slopes, future, S, cutoff, global_tokens,
                                   sinks)[:, S - T:]
    bias = bias[None].expand(B, -1, -1, -1)
    if key_padding_mask is not None:
        bias = bias.masked_fill(key_padding_mask[:, None, None, :], MASKED)
    rows = (bias > MASKED).any(-1, keepdim=True)
    logits = q.double() @ k.double().transpose(-1, -2) / math.sqrt(D) + bias
    return torch.softmax(logits, -1) @ v.double(), rows


def inputs(B, H, T, S, D=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g, dtype=dtype) for n in (T, S, S)]


def run_windowed(q, k, v, slopes, future, variant, cutoff, **kwargs):
    windows = variant_windows(slopes, cutoff, variant, future)
    return windowed.attention(q, k, v, slopes, future, variant, windows, **kwargs)


def head_slopes(variant, partial=False, H=4):
    slopes = variant_slopes(H, variant, biased_heads=H // 2 if partial else None)
    return slopes, (slopes * 0.6 if variant == "asymmetric" else None)


def padding(B, S, global_tokens=0):
    mask = torch.zeros(B, S, dtype=torch.bool)
    mask[0, global_tokens:global_tokens + 3] = True  # inside the sequence (and the windows)
    mask[-1, -4:] = True  # right padding
    return mask


#: (query_len, key_len, cutoff, key padding, global tokens, partial heads, chunk)
CASES = [
    (48, 48, 2.0, False, 0, False, None),
    (48, 48, 1.0, True, 0, False, 8),
    (48, 48, 2.0, True, 2, False, 4),
    (40, 40, 0.7, False, 0, True, 8),
    (17, 60, 1.5, True, 0, False, 4),  # a KV cache: queries at the end of the keys
    (1, 30, 1.0, False, 0, False, None),  # one decoding step
    (9, 40, 2.0, True, 3, True, 4),
    (5, 8, 2.0, False, 6, False, 2),  # queries among the global tokens
    (33, 33, 8.0, False, 0, False, None),  # windows larger than the sequence
    (36, 36, 1.0, True, 0, True, 8),  # slope-0 heads (no window) with padding: folded
]


#: the bias is computed in float32 (fairseq_alibi/alibi.py), exact for power-of-two slopes
#: only: a float64 attention with it agrees with the float64 reference to about float32's
#: relative precision of the bias
TOL64 = dict(atol=1e-6, rtol=1e-6)


def check_close(out, reference_out, **tol):
    want, rows = reference_out
    rows = rows[..., 0]  # an all-padding row has no reference value
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[rows], want[rows].to(out.dtype), **tol)


def run_case(variant, case, sinks=0):
    """``(out, (reference, rows))``: :func:`run_windowed` of a case of :data:`CASES` (two rows,
    4 heads, float64) with ``sinks`` attention sinks, and its :func:`reference`."""
    T, S, cutoff, padded, G, partial, chunk = case
    slopes, future = head_slopes(variant, partial)
    q, k, v = inputs(2, 4, T, S)
    kpm = padding(2, S, G) if padded else None
    out = run_windowed(q, k, v, slopes, future, variant, cutoff, key_padding_mask=kpm,
                       global_tokens=G, chunk=chunk, **({"sinks": sinks} if sinks else {}))
    return out, reference(q, k, v, slopes, future, variant, cutoff, kpm, G, sinks)
