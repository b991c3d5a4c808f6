"""AlibiMultiheadAttention against a naive float64 reference (explicit softmax with the bias)."""

import pytest
import torch

from fairseq_alibi.alibi import AlibiPositionalBias, get_slopes
from fairseq_alibi.modules import AlibiMultiheadAttention

VARIANTS = ["causal", "symmetric", "one_sided", "offset", "asymmetric"]


def naive_bias(h, i, j, m, variant, ratio=1.0):
    """The bias of one (head, query, key) triple straight from the definitions; None = masked."""
    d = i - j
    if variant == "causal":
        return -m * d if d >= 0 else None
    if variant == "symmetric":
        return -m * abs(d)
    if variant == "offset":
        return -m * d if d >= 0 else -m * (-d - 0.5)
    if variant == "asymmetric":
        return -m * d if d >= 0 else -m * ratio * (-d)
    if variant == "one_sided":
        looks_ahead = h >= len(HEAD_SLOPES[variant]) // 2
        if (looks_ahead and d > 0) or (not looks_ahead and d < 0):
            return None
        return -m * abs(d)
    raise AssertionError(variant)


HEAD_SLOPES = {}


def reference(attn, x, key_padding_mask, variant, ratio=1.0):
    """softmax(QKᵀ/√d + bias) V in float64, one explicit loop level at a time."""
    x = x.double()
    T, B, C = x.shape
    H, D = attn.num_heads, attn.head_dim
    w = {n: p.detach().double() for n, p in attn.named_parameters()}
    q = (x @ w["q_proj.weight"].T + w["q_proj.bias"]).view(T, B, H, D)
    k = (x @ w["k_proj.weight"].T + w["k_proj.bias"]).view(T, B, H, D)
    v = (x @ w["v_proj.weight"].T + w["v_proj.bias"]).view(T, B, H, D)
    slopes = attn.alibi.slopes.double().tolist()
    HEAD_SLOPES[variant] = slopes
    bias = torch.full((H, T, T), float("-inf"), dtype=torch.float64)
    for h in range(H):
        for i in range(T):
            for j in range(T):
                b = naive_bias(h, i, j, slopes[h], variant, ratio)
                if b is not None:
                    bias[h, i, j] = b
    scores = torch.einsum("ibhd,jbhd->bhij", q, k) / D**0.5 + bias
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhij,jbhd->ibhd", probs, v).reshape(T, B, C)
    return out @ w["out_proj.weight"].T + w["out_proj.bias"], probs


def make_attention(variant, heads=4, dim=32, dropout=0.0, ratio=1.0):
    torch.manual_seed(0)
    alibi = AlibiPositionalBias(heads, variant, future_slope_ratio=ratio)
    attn = AlibiMultiheadAttention(dim, heads, alibi, dropout=dropout)
    for p in attn.parameters():  # non-zero biases so that every term is exercised
        torch.nn.init.normal_(p, std=0.3)
    return attn


def right_padding(lengths, T):
    return torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("train", [False, True])
def test_matches_float64_reference(variant, padded, train):
    ratio = 0.5 if variant == "asymmetric" else 1.0
    attn = make_attention(variant, ratio=ratio).train(train)  # dropout 0: train == eval
    T, B = 9, 3
    x = torch.randn(T, B, 32)
    kpm = right_padding([9, 6, 4], T) if padded else None
    out, _ = attn(x, x, x, key_padding_mask=kpm, need_weights=False)
    want, _ = reference(attn, x, kpm, variant, ratio)
    real = ~kpm.T if padded else torch.ones(T, B, dtype=torch.bool)
    rows = torch.isfinite(want).all(-1) & real  # an all-padding row has no reference value
    assert torch.allclose(out.double()[rows], want[rows], atol=1e-5, rtol=0)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("variant", ["causal", "offset"])
def test_need_weights_returns_reference_probabilities(variant):
    attn = make_attention(variant).eval()
    x = torch.randn(7, 2, 32)
    kpm = right_padding([7, 5], 7)
    out, avg = attn(x, x, x, key_padding_mask=kpm, need_weights=True)
    out_h, per_head = attn(x, x, x, key_padding_mask=kpm, need_head_weights=True)
    want, probs = reference(attn, x, kpm, variant)
    assert per_head.shape == (4, 2, 7, 7) and avg.shape == (2, 7, 7)
    rows = ~kpm  # (B, T) real queries
    per_query = per_head.permute(1, 2, 0, 3).double()  # (B, T, H, S)
    assert torch.allclose(per_query[rows], probs.permute(0, 2, 1, 3)[rows], atol=1e-6)
    assert torch.allclose(avg.double()[rows], probs.mean(1)[rows], atol=1e-6)
    assert torch.allclose(out, out_h) and torch.allclose(out.double()[rows.T], want[rows.T], atol=1e-5)


def test_incremental_decoding_matches_full_forward():
    attn = make_attention("causal").eval()
    T, B = 12, 2
    x = torch.randn(T, B, 32)
    full, _ = attn(x, x, x, need_weights=False)
    state = {}
    steps = [attn(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state,
                  need_weights=False)[0] for t in range(T)]
    assert torch.allclose(torch.cat(steps), full, atol=1e-5, rtol=0)


def test_masked_prefix_does_not_shift_outputs():
    """Keys before the window are masked out: the window's output is that of the window alone."""
    attn = make_attention("causal").eval()
    window = torch.randn(6, 1, 32)
    prefix = torch.randn(5, 1, 32)
    x = torch.cat([prefix, window])
    kpm = torch.zeros(1, 11, dtype=torch.bool)
    kpm[:, :5] = True
    shifted, _ = attn(x, x, x, key_padding_mask=kpm, need_weights=False)
    alone, _ = attn(window, window, window, need_weights=False)
    assert torch.allclose(shifted[5:], alone, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_all_padding_rows_stay_finite(dtype):
    for variant in VARIANTS:
        attn = make_attention(variant).to(dtype).eval()
        x = torch.randn(5, 2, 32, dtype=dtype)
        kpm = torch.ones(2, 5, dtype=torch.bool)  # every key of every row is padding
        out, _ = attn(x, x, x, key_padding_mask=kpm, need_weights=False)
        assert torch.isfinite(out).all(), variant


def test_dropout_in_training_only():
    attn = make_attention("causal", dropout=0.5)
    x = torch.randn(8, 2, 32)
    attn.eval()
    a, _ = attn(x, x, x, need_weights=False)
    b, _ = attn(x, x, x, need_weights=False)
    assert torch.equal(a, b)
    attn.train()
    torch.manual_seed(1)
    c, _ = attn(x, x, x, need_weights=False)
    assert not torch.allclose(a, c)


def test_gradients_flow_to_projections():
    attn = make_attention("causal").train()
    x = torch.randn(6, 2, 32, requires_grad=True)
    out, _ = attn(x, x, x, need_weights=False)
    out.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in attn.parameters())
    assert torch.isfinite(x.grad).all()


def test_unsupported_options_are_clear_errors():
    alibi = AlibiPositionalBias(4)
    with pytest.raises(ValueError, match="add_bias_kv"):
        AlibiMultiheadAttention(32, 4, alibi, add_bias_kv=True)
    with pytest.raises(ValueError, match="heads"):
        AlibiMultiheadAttention(32, 8, alibi)
    assert get_slopes(4).shape == (4,)
