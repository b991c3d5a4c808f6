"""Float64 references written from the definitions: the bias of every variant, one attention
layer, one attention layer with learned slope scales."""

import torch


def naive_slopes(variant, heads):
    """2^(-8k/n), k = 1..n, with n = H (n = H/2 per half for one_sided)."""
    n = heads // 2 if variant == "one_sided" else heads
    return [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)] * (heads // n)


def naive_bias(variant, h, heads, i, j, m, ratio):
    """The bias of one (head, query, key) from the definitions; None = the key is invisible."""
    if variant == "symmetric":
        return -m * abs(i - j)
    if variant == "offset":
        return -m * (i - j) if j <= i else -m * (j - i - 0.5)
    if variant == "asymmetric":
        return -m * (i - j) if j <= i else -m * ratio * (j - i)
    if variant == "one_sided":
        looks_ahead = h >= heads // 2
        if (looks_ahead and j < i) or (not looks_ahead and j > i):
            return None
        return -m * abs(i - j)
    raise AssertionError(variant)


def scaled_bias(heads, layers, variant, mode, init=1.0, ratio=1.0):
    """An AlibiBias with learned scales set away from 1, so that every scale counts."""
    from fairseq_alibi.modules.bias import AlibiBias

    alibi = AlibiBias(heads, variant=variant, future_slope_ratio=ratio, num_layers=layers,
                      learned_scales=mode, scale_init=init)
    with torch.no_grad():
        torch.manual_seed(7)
        alibi.scales.uniform_(0.3, 3.0)
    return alibi


#: the references' finite stand-in for -inf: a row with no visible key stays finite, as the
#: module's does
MASKED = -1e9


def reference_bias(variant, slopes, future, T, global_tokens=0):
    """``(H, T, T)`` float64 bias straight from the table of fairseq_alibi/alibi.py; MASKED where
    hidden. ``slopes``/``future`` float64 ``(H,)`` (differentiable). The first
    ``global_tokens`` positions get bias 0 as queries and as keys (causality kept)."""
    slopes = torch.as_tensor(slopes, dtype=torch.float64)
    i = torch.arange(T, dtype=torch.float64)[:, None]
    j = torch.arange(T, dtype=torch.float64)[None, :]
    d = (i - j)[None]  # i - j
    m = slopes[:, None, None]
    inf = torch.tensor(MASKED, dtype=torch.float64)
    if variant == "causal":
        bias = torch.where(d >= 0, -m * d, inf)
    elif variant == "symmetric":
        bias = -m * d.abs()
    elif variant == "offset":
        bias = torch.where(d >= 0, -m * d, -m * (-d - 0.5))
    elif variant == "asymmetric":
        future = torch.as_tensor(future, dtype=torch.float64)
        bias = torch.where(d >= 0, -m * d, -future[:, None, None] * (-d))
    else:  # one_sided: the first half of the heads look back, the rest ahead
        ahead = (torch.arange(len(slopes)) >= len(slopes) // 2)[:, None, None]
        hidden = torch.where(ahead, d > 0, d < 0)
        bias = torch.where(hidden, inf, -m * d.abs())
    if global_tokens:
        exempt = ((i < global_tokens) | (j < global_tokens))[None]
        zero = inf if variant == "causal" else torch.tensor(0.0, dtype=torch.float64)
        bias = torch.where(exempt, torch.where(d >= 0, 0.0, zero), bias)
    return bias


def reference_module_attention(attn, x, bias, key_padding_mask=None):
    """What AlibiMultiheadAttention ``attn`` computes for ``x`` ``(T, B, C)`` with the float64
    ``bias`` ``(H, T, T)`` (-inf for hidden keys): softmax(QKᵀ/√d + bias) V, from its weights."""
    x = x.double()
    T, B, C = x.shape
    H, D = attn.num_heads, attn.head_dim
    w = {n: p.detach().double() for n, p in attn.named_parameters()}

    def proj(name):
        return (x @ w[f"{name}.weight"].T + w[f"{name}.bias"]).view(T, B, H, D)

    q, k, v = proj("q_proj"), proj("k_proj"), proj("v_proj")
    scores = torch.einsum("ibhd,jbhd->bhij", q, k) / D**0.5 + bias
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], MASKED)
    out = torch.einsum("bhij,jbhd->ibhd", torch.softmax(scores, -1), v).reshape(T, B, C)
    return out @ w["out_proj.weight"].T + w["out_proj.bias"]


def reference_scaled_attention(attn, x, scales, layer, variant, ratio, key_padding_mask=None):
    """:func:`reference_module_attention` with the bias ``s[layer, h]·bias_h`` of ``variant``;
    differentiable in ``scales``."""
    from fairseq_alibi.alibi import variant_slopes

    row = scales[layer if scales.size(0) > 1 else 0]
    slopes = variant_slopes(attn.num_heads, variant).double() * row
    bias = reference_bias(variant, slopes, slopes * ratio, x.size(0))
    return reference_module_attention(attn, x, bias, key_padding_mask)


def reference_windowed_bias(variant, slopes, future, T, cutoff, global_tokens=0, sinks=0):
    """:func:`reference_bias` with slope windows ``T`` (nats) from the definition: head ``h``
    hides the key ``j`` of query ``i`` when ``i - j > ceil(T / m_h)`` or ``j - i`` exceeds its
    look-ahead window (``ceil(T / m_h)``; ``offset`` ``ceil(T / m_h + 0.5)``; ``asymmetric``
    ``ceil(T / m_f,h)``), unless ``i`` or ``j`` is a global token or ``j < sinks`` (attention
    sinks: the variant's own masks stay); a head with slope 0 hides nothing; ``T = 0`` is off. Written with Python's ``math`` per head, not the package's
    functions."""
    import math

    bias = reference_bias(variant, slopes, future, T, global_tokens)
    if not cutoff:  # 0 = off
        return bias
    slopes = torch.as_tensor(slopes, dtype=torch.float64).tolist()
    future = None if future is None else torch.as_tensor(future, dtype=torch.float64).tolist()
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    exempt = (i < global_tokens) | (j < global_tokens) | (j < sinks)
    for h, m in enumerate(slopes):
        if m <= 0:
            continue
        back = math.ceil(cutoff / m)
        ahead = {"offset": math.ceil(cutoff / m + 0.5),
                 "asymmetric": math.ceil(cutoff / future[h]) if future and future[h] > 0
                 else math.inf}.get(variant, back)
        hidden = ((i - j > back) | (j - i > ahead)) & ~exempt
        bias[h] = bias[h].masked_fill(hidden, MASKED)
    return bias


def reference_document_bias(variant, slopes, future, ids, cutoff=0.0, sinks=0):
    """``(B, H, L, L)`` float64: each run of equal ``ids`` ``(B, L)`` of a row its own sequence
    with :func:`reference_windowed_bias` of its length (``sinks``: its first positions),
    MASKED across documents; differentiable in the slopes."""
    B, L = ids.shape
    bias = torch.full((B, len(slopes), L, L), MASKED, dtype=torch.float64)
    for b in range(B):
        starts = [0] + [t for t in range(1, L) if ids[b, t] != ids[b, t - 1]]
        for s, e in zip(starts, starts[1:] + [L]):
            bias[b, :, s:e, s:e] = reference_windowed_bias(variant, slopes, future, e - s,
                                                           cutoff, sinks=sinks)
    return bias


def reference_document_attention(q, k, v, ids, variant, slopes, future, cutoff=0.0,
                                 key_padding_mask=None, sinks=0):
    """The definition of a document mask, float64 ``(B, H, L, D)``: each run of equal ``ids``
    ``(B, L)`` of a row attended as its own sequence (:func:`reference_document_bias`, its
    first ``sinks`` positions kept beyond the windows; ``key_padding_mask`` ``(B, L)`` True =
    padding); differentiable in every input."""
    bias = reference_document_bias(variant, slopes, future, ids, cutoff, sinks)
    if key_padding_mask is not None:
        bias = bias.masked_fill(key_padding_mask[:, None, None, :], MASKED)
    scores = q.double() @ k.double().transpose(-1, -2) * q.size(-1) ** -0.5 + bias
    return torch.softmax(scores, -1) @ v.double()
