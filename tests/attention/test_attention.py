"""Every attention backend against a float64 reference and against ``naive``: values,
gradients, padding (never NaN), KV-cache decoding, fairseq's ``need_weights`` /
``before_softmax``, dropout, the exactness of the fold. (Which backend ``auto`` picks, and the
errors of a named one that cannot serve a call: tests/attention/test_dispatch.py.)"""

import pytest
import torch
import torch.nn.functional as F

from fairseq_alibi.alibi import alibi_bias, get_slopes, variant_slopes
from fairseq_alibi.modules.bias import AlibiBias
from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention, set_attention_backend
from fairseq_alibi.modules.attention import flex, fold, tuning
from fairseq_alibi.modules.attention.fold import alibi_fold, folded_attention, split_slopes

VARIANTS = ["causal", "symmetric", "one_sided", "offset", "asymmetric"]

#: every backend this machine can run (flash needs CUDA: tests/cuda/test_cuda.py)
CPU_BACKENDS = ["naive", "sdpa", "fold", "flex"]

# float32 on the CPU: outputs and gradients are O(1); the reference itself is float32
TOL = dict(atol=2e-5, rtol=1e-4)


@pytest.fixture
def eager_flex(monkeypatch):
    """flex_attention unfused: the same score_mod/mask_mod, without a compile per variant."""
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setattr(flex, "_compiled_flex", lambda: flex_attention)


# ------------------------------------------------------------------ the float64 reference


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
    slopes = attn.alibi.stack.slopes.double().tolist()
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
    alibi = AlibiBias(heads, variant=variant, future_slope_ratio=ratio)
    attn = AlibiMultiheadAttention(dim, heads, alibi.layer(0), dropout=dropout)
    for p in attn.parameters():  # non-zero biases so that every term is exercised
        torch.nn.init.normal_(p, std=0.3)
    return attn


def right_padding(lengths, T):
    return torch.arange(T)[None, :] >= torch.tensor(lengths)[:, None]


@pytest.mark.parametrize("backend", CPU_BACKENDS + ["auto"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("train", [False, True])
def test_matches_float64_reference(variant, padded, train, backend, eager_flex):
    if backend == "flex" and train:
        pytest.skip("flex_attention has no CPU backward (test_dispatch: a clear error)")
    ratio = 0.5 if variant == "asymmetric" else 1.0
    attn = make_attention(variant, ratio=ratio).train(train)  # dropout 0: train == eval
    set_attention_backend(attn, backend)
    T, B = 9, 3
    x = torch.randn(T, B, 32)
    kpm = right_padding([9, 6, 4], T) if padded else None
    with torch.set_grad_enabled(backend != "flex"):  # (flex: no CPU backward)
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
    alibi = AlibiBias(4)
    with pytest.raises(ValueError, match="add_bias_kv"):
        AlibiMultiheadAttention(32, 4, alibi.layer(0), add_bias_kv=True)
    with pytest.raises(ValueError, match="heads"):
        AlibiMultiheadAttention(32, 8, alibi.layer(0))
    assert get_slopes(4).shape == (4,)


# ------------------------------------------------------------------ every backend against naive


def make_backend_attention(variant, heads=4, dim=32, ratio=0.7, learnable=False, seed=0):
    torch.manual_seed(seed)
    alibi = AlibiBias(
        heads, variant=variant, future_slope_ratio=ratio, learnable_future_slopes=learnable,
        slope_scale=0.8,
    )
    return AlibiMultiheadAttention(dim, heads, alibi.layer(0)).eval()


def padding_mask(B, T, left=False):
    pad = torch.zeros(B, T, dtype=torch.bool)
    if left:
        pad[1, :5] = True
    else:
        pad[1, -5:] = True
    return pad


def run(attn, backend, x, pad=None, attn_mask=None, train=False):
    set_attention_backend(attn, backend)
    attn.train(train)
    return attn(x, x, x, key_padding_mask=pad, need_weights=False, attn_mask=attn_mask)[0]


def valid_rows(pad, T, B):
    """(T, B, 1): True where the query is not padding (its output is used)."""
    if pad is None:
        return torch.ones(T, B, 1, dtype=torch.bool)
    return ~pad.t()[:, :, None]


@pytest.fixture(params=["fold", "fold chunked", "sdpa"])
def trainable_backend(request, monkeypatch):
    """The backends with a CPU backward (naive is the reference): the fold in one kernel call,
    the fold a head at a time, and sdpa's dense mask. Yields ``(backend, fold calls)``."""
    calls = []
    folded = fold.folded_attention

    def spy(*args, **kwargs):
        calls.append("folded")
        return folded(*args, **kwargs)

    monkeypatch.setattr(fold, "folded_attention", spy)
    if request.param == "fold chunked":
        monkeypatch.setattr(tuning, "CHUNK_BYTES", 1)  # a kernel call per head
    return request.param.split()[0], calls


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_values_and_gradients_match_naive(variant, padded, trainable_backend):
    backend, calls = trainable_backend
    attn = make_backend_attention(variant, learnable=variant == "asymmetric")
    T, B = 23, 3
    x = torch.randn(T, B, 32)
    pad = padding_mask(B, T) if padded else None
    keep = valid_rows(pad, T, B)
    grad = torch.randn(T, B, 32) * keep
    params = [p for p in attn.parameters()] + [x.requires_grad_()]
    if variant == "asymmetric":
        params.append(attn.alibi.stack.future_slope_ratio)
    results = {}
    for name in ("naive", backend):
        out = run(attn, name, x, pad, train=True)
        results[name] = (out * keep, torch.autograd.grad(out, params, grad))
    assert calls == (["folded"] if backend == "fold" else [])
    torch.testing.assert_close(results[backend][0], results["naive"][0], **TOL)
    for got, want in zip(results[backend][1], results["naive"][1]):
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_flex_values_match_naive(variant, padded, eager_flex):
    attn = make_backend_attention(variant)
    T, B = 21, 2
    x = torch.randn(T, B, 32)
    pad = padding_mask(B, T) if padded else None
    keep = valid_rows(pad, T, B)
    with torch.no_grad():
        want = run(attn, "naive", x, pad)
        got = run(attn, "flex", x, pad)
    torch.testing.assert_close(got * keep, want * keep, **TOL)


def test_flex_as_run_on_the_cpu_matches_naive():
    """The real path on the CPU (eager: torch 2.13's compiled CPU kernel was intermittently
    wrong), without the eager_flex fixture."""
    attn = make_backend_attention("causal")
    T, B = 40, 2
    x = torch.randn(T, B, 32)
    pad = padding_mask(B, T)
    keep = valid_rows(pad, T, B)
    with torch.no_grad():
        want = run(attn, "naive", x, pad)
        got = run(attn, "flex", x, pad)
    torch.testing.assert_close(got * keep, want * keep, **TOL)


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_extra_attn_mask_matches_naive(variant, backend, eager_flex):
    """fairseq's (T, S) attn_mask on top of the bias (the fold refuses it: test_dispatch)."""
    attn = make_backend_attention(variant)
    T, B = 17, 2
    x = torch.randn(T, B, 32)
    extra = torch.zeros(T, T).masked_fill(torch.rand(T, T) < 0.2, float("-inf"))
    extra.fill_diagonal_(0)
    with torch.no_grad():
        want = run(attn, "naive", x, attn_mask=extra)
        got = run(attn, backend, x, attn_mask=extra)
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("backend", ["auto", "sdpa", "flex", "naive"])
@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
def test_incremental_decoding_matches_naive_full_forward(backend, padded, eager_flex):
    attn = make_backend_attention("causal")
    T, B = 12, 2
    x = torch.randn(T, B, 32)
    pad = padding_mask(B, T, left=True) if padded else None  # fairseq pads prompts on the left
    keep = valid_rows(pad, T, B)
    with torch.no_grad():
        want = run(attn, "naive", x, pad)
        set_attention_backend(attn, backend)
        state = {}
        steps = [attn(x[t:t + 1], x[t:t + 1], x[t:t + 1], incremental_state=state,
                      key_padding_mask=None if pad is None else pad[:, t:t + 1],
                      need_weights=False)[0] for t in range(T)]
    torch.testing.assert_close(torch.cat(steps) * keep, want * keep, **TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_decoding_rows_given_to_cuda_kernels_are_aligned(dtype):
    """A decoding step's bias row is a view into one table at any offset; CUDA's fused kernels
    read it with "misaligned address" (fairseq-generate crashed on an H100,
    tests/cuda/test_cuda.py), so sdpa hands them an aligned copy. Checked here on the rows
    themselves."""
    from fairseq_alibi.modules.attention.dense import CUDA_BIAS_ALIGNMENT, aligned
    from fairseq_alibi.modules.bias import AlibiBias

    alibi = AlibiBias(4, variant="causal")
    offsets = set()
    for key_len in range(1, 40):
        row = alibi(1, key_len, dtype)
        offsets.add(row.storage_offset() * row.element_size() % CUDA_BIAS_ALIGNMENT)
        fixed = aligned(row)
        assert fixed.data_ptr() % CUDA_BIAS_ALIGNMENT == 0 and torch.equal(fixed, row)
        if row.data_ptr() % CUDA_BIAS_ALIGNMENT == 0:
            assert fixed is row  # no copy where none is needed
    assert len(offsets) > 1  # the rows do start off the boundary: the check is not vacuous


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_rows_are_never_nan(variant, backend, eager_flex):
    """Left padding gives causal/one_sided queries whose visible keys are all padding."""
    attn = make_backend_attention(variant)
    T, B = 15, 2
    x = torch.randn(T, B, 32, requires_grad=True)
    pad = padding_mask(B, T, left=True)
    pad[0] = True  # a sequence that is padding throughout
    train = backend != "flex"  # flex has no CPU backward
    with torch.set_grad_enabled(train):
        out = run(attn, backend, x, pad, train=train)
    assert torch.isfinite(out).all()
    if train:
        (g,) = torch.autograd.grad(out.sum(), x)
        assert torch.isfinite(g).all()


def test_need_weights_uses_the_explicit_path_whatever_the_backend(eager_flex):
    attn = make_backend_attention("symmetric")
    x = torch.randn(9, 2, 32)
    with torch.no_grad():
        out_n, w_n = run_with_weights(attn, "naive", x)
        for backend in ("fold", "sdpa", "flex", "auto"):
            out_b, w_b = run_with_weights(attn, backend, x)
            torch.testing.assert_close(out_b, out_n, **TOL)
            torch.testing.assert_close(w_b, w_n, **TOL)


def run_with_weights(attn, backend, x):
    set_attention_backend(attn, backend)
    return attn(x, x, x, need_weights=True)


def test_before_softmax_returns_the_biased_scores():
    """fairseq's raw-scores protocol: ``(B·H, T, S)`` logits with the bias, and the values."""
    attn = make_backend_attention("causal")
    T, B, H = 7, 2, 4
    x = torch.randn(T, B, 32)
    with torch.no_grad():
        scores, values = attn(x, x, x, before_softmax=True)
        out = run(attn, "fold", x)
    assert scores.shape == (B * H, T, T) and values.shape == (B * H, T, 8)
    probs = torch.softmax(scores, -1)
    manual = torch.bmm(probs, values).view(B, H, T, 8).permute(2, 0, 1, 3).reshape(T, B, 32)
    torch.testing.assert_close(attn.out_proj(manual), out, **TOL)


# ------------------------------------------------------------------ the fold's algebra


def test_fold_is_exact_in_float32():
    """The fold's columns multiply out to -m·(i - j) exactly, summed in float32, in order."""
    for heads, scale, length in [(8, 1.0, 4096), (12, 0.37, 3000), (6, 1.7, 777)]:
        slopes = variant_slopes(heads, "causal") * scale
        positions = torch.arange(length)
        q_cols, k_cols = alibi_fold(slopes, positions, positions)
        rows = torch.linspace(0, length - 1, 97).long()  # queries across the whole range
        q_cols = q_cols[:, rows]
        acc = torch.zeros(heads, len(rows), length)
        for c in range(q_cols.shape[-1]):  # float32, column by column, like the kernel
            acc = acc + q_cols[:, :, None, c] * k_cols[None, None, :, c]
        exact = -slopes.double()[:, None, None] * (rows[:, None] - positions[None, :])
        # m_hi terms cancel exactly; the m_lo terms are 2^-(24 - bits(L)) of m: within an ulp
        err = (acc.double() - exact).abs() / exact.abs().clamp(min=1)
        assert err.max() < 4 * 2.0**-23, (heads, scale, length, err.max())
        hi, lo = split_slopes(slopes, length)
        assert torch.equal(hi + lo, slopes)


def test_fold_is_as_accurate_as_a_stored_bias_at_long_lengths():
    """Against float64: the folded kernel's error is the float mask's, not ulp(m·L) worse."""
    torch.manual_seed(0)
    for variant, heads, dim, scale, length in [("causal", 12, 24, 0.37, 1536),
                                                ("symmetric", 6, 40, 1.7, 1024)]:
        q, k, v = (torch.randn(1, heads, length, dim) * 2 for _ in range(3))
        slopes = variant_slopes(heads, variant) * scale
        bias = alibi_bias(slopes, length, length, variant)
        s = dim**-0.5
        exact = torch.softmax(q.double() @ k.double().transpose(-1, -2) * s + bias.double(), -1)
        exact = exact @ v.double()
        folded = folded_attention(q, k, v, slopes, None, variant, s)
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=bias[None], scale=s)
        fold_err = (folded.double() - exact).abs().max()
        mask_err = (masked.double() - exact).abs().max()
        assert fold_err < 2 * mask_err + 1e-6, (variant, fold_err, mask_err)
