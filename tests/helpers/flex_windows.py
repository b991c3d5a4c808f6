"""What the tests of ``flex`` with slope windows share (tests/attention/test_flex_windows_cpu.py
on the CPU, tests/cuda/test_flex_windows.py on CUDA): the calls, the inputs and the float64
reference of the windowed definition."""

import torch

from fairseq_alibi.modules.bias import AlibiBias
from tests.helpers.references import MASKED, reference_windowed_bias

HEADS, DIM = 8, 16
CUTOFF = 2.0
#: (batch, query_len, key_len, padded, heads with a bias): whole sequences, left padding,
#: partial heads (slope 0: every key), a decoding step of 3 queries against 60 keys
CASES = {
    "whole": (2, 60, 60, False, None),
    "padded": (2, 60, 60, True, None),
    "partial heads": (2, 60, 60, True, 4),
    "kv cache": (2, 3, 60, True, None),
}


def windowed_layer(variant, heads_with_bias=None, cutoff=CUTOFF, device="cpu", **options):
    if heads_with_bias is not None:
        options["heads"] = heads_with_bias
    return AlibiBias(HEADS, variant=variant, window_cutoff=cutoff, **options).to(device).layer(0)


def make_inputs(batch, query_len, key_len, padded, device="cpu", dtype=torch.float32, seed=0):
    """q ``(B, H, T, D)``, k, v ``(B, H, S, D)``, a left-padding mask ``(B, S)`` or None."""
    torch.manual_seed(seed)
    q = torch.randn(batch, HEADS, query_len, DIM, dtype=dtype, device=device)
    k, v = (torch.randn(batch, HEADS, key_len, DIM, dtype=dtype, device=device) for _ in "kv")
    kpm = None
    if padded:
        kpm = torch.zeros(batch, key_len, dtype=torch.bool, device=device)
        kpm[1, :7] = True
    return q, k, v, kpm


def windowed_reference(q, k, v, layer, kpm, cutoff=CUTOFF):
    """``(out, rows)``: float64 ``softmax(q·kᵀ/√D + windowed bias + padding) v`` from the
    definition (:func:`reference_windowed_bias`, the layer's attention sinks kept; queries aligned
    to the end of the keys), on the
    CPU (differentiable in ``q``, ``k``, ``v``); ``rows`` ``(B, H, T)``: the queries with a visible key (the others have no reference
    value: every backend returns something finite there, not the same thing)."""
    T, S = q.size(2), k.size(2)
    slopes, future = (None if s is None else s.detach().double().cpu()
                      for s in layer.head_slopes())
    bias = reference_windowed_bias(layer.variant, slopes, future, S, cutoff,
                                   sinks=layer.sinks)[:, S - T:]
    bias = bias[None].expand(q.size(0), -1, -1, -1)
    if kpm is not None:
        bias = bias.masked_fill(kpm.cpu()[:, None, None, :], MASKED)
    scores = q.double().cpu() @ k.double().cpu().transpose(-1, -2) / DIM**0.5
    out = (scores + bias).softmax(-1) @ v.double().cpu()
    return out, (bias > MASKED / 2).any(-1)
