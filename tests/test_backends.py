"""Every attention backend against ``naive`` (values, gradients, padding, KV-cache decoding),
the exactness of the fold, ``auto``'s choices, and the backend saved with / overridden at load."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from fairseq_alibi.alibi import (
    VARIANTS,
    AlibiPositionalBias,
    alibi_bias,
    alibi_fold,
    split_slopes,
    variant_slopes,
)
from fairseq_alibi.modules import AlibiMultiheadAttention
from fairseq_alibi.modules import attention_backends as backends
from fairseq_alibi.modules.folded_attention import folded_attention

from tests.conftest import run_cli

# float32 on the CPU: outputs and gradients are O(1); the reference itself is float32
TOL = dict(atol=2e-5, rtol=1e-4)


@pytest.fixture
def eager_flex(monkeypatch):
    """flex_attention unfused: the same score_mod/mask_mod, without a compile per variant."""
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setattr(backends, "_compiled_flex", lambda: flex_attention)


def make_attention(variant, heads=4, dim=32, ratio=0.7, learnable=False, seed=0):
    torch.manual_seed(seed)
    alibi = AlibiPositionalBias(
        heads, variant, future_slope_ratio=ratio, learnable_future_slopes=learnable,
        slope_scale=0.8,
    )
    return AlibiMultiheadAttention(dim, heads, alibi).eval()


def padding_mask(B, T, left=False):
    pad = torch.zeros(B, T, dtype=torch.bool)
    if left:
        pad[1, :5] = True
    else:
        pad[1, -5:] = True
    return pad


def run(attn, backend, x, pad=None, attn_mask=None, train=False):
    attn.alibi.backend = backend
    attn.train(train)
    return attn(x, x, x, key_padding_mask=pad, need_weights=False, attn_mask=attn_mask)[0]


def valid_rows(pad, T, B):
    """(T, B, 1): True where the query is not padding (its output is used)."""
    if pad is None:
        return torch.ones(T, B, 1, dtype=torch.bool)
    return ~pad.t()[:, :, None]


@pytest.fixture(params=["folded", "chunked", "dense mask"])
def formulation(request, monkeypatch):
    """How sdpa computes: folded (every variant), folded a head at a time, or the dense mask.

    Yields a list that records the formulation of every sdpa call, to check it was used.
    """
    calls = []
    folded = backends.folded_attention.folded_attention

    def spy(*args, **kwargs):
        calls.append("folded")
        return folded(*args, **kwargs)

    monkeypatch.setattr(backends.folded_attention, "folded_attention", spy)
    if request.param == "dense mask":
        monkeypatch.setattr(backends, "folds", lambda *args: False)
    else:
        monkeypatch.setattr(backends, "DENSE_MASK_BUDGET", 0)  # fold at any length, any variant
    if request.param == "chunked":
        monkeypatch.setattr(backends.folded_attention, "CHUNK_BYTES", 1)  # a call per head
    return request.param, calls


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_sdpa_values_and_gradients_match_naive(variant, padded, formulation):
    attn = make_attention(variant, learnable=variant == "asymmetric")
    T, B = 23, 3
    x = torch.randn(T, B, 32)
    pad = padding_mask(B, T) if padded else None
    keep = valid_rows(pad, T, B)
    grad = torch.randn(T, B, 32) * keep
    params = [p for p in attn.parameters()] + [x.requires_grad_()]
    if variant == "asymmetric":
        params.append(attn.alibi.future_slope_ratio)
    results = {}
    for backend in ("naive", "sdpa"):
        out = run(attn, backend, x, pad, train=True)
        results[backend] = (out * keep, torch.autograd.grad(out, params, grad))
    name, calls = formulation
    assert calls == ([] if name == "dense mask" else ["folded"])
    torch.testing.assert_close(results["sdpa"][0], results["naive"][0], **TOL)
    for got, want in zip(results["sdpa"][1], results["naive"][1]):
        torch.testing.assert_close(got, want, **TOL)


def test_sdpa_folds_where_measured_faster_or_where_the_mask_is_too_big():
    short, long = torch.zeros(2, 8, 512, 16), torch.zeros(1, 8, 1024, 16)
    for variant in VARIANTS:
        merged = variant in ("symmetric", "offset", "asymmetric")
        assert not backends.folds(short, 512, variant, None, None, 0.0)
        assert backends.folds(long, 1024, variant, None, None, 0.0) is not merged
    huge = torch.zeros(1, 8, 2048, 16)  # (8, 2048, 2048) float32 = 128 MiB of mask
    assert backends.folds(huge, 2048, "symmetric", None, None, 0.0)
    padded = torch.zeros(16, 8, 512, 16)  # padding: a (16, 8, 512, 512) mask = 128 MiB
    assert backends.folds(padded, 512, "offset", torch.zeros(16, 512, dtype=torch.bool), None, 0.0)
    # what cannot be folded: dropout, an extra attn_mask, a KV cache, half precision
    assert not backends.folds(long, 1024, "causal", None, None, 0.1)
    assert not backends.folds(long, 1024, "causal", None, torch.zeros(1024, 1024), 0.0)
    assert not backends.folds(long, 1025, "causal", None, None, 0.0)
    assert not backends.folds(long.bfloat16(), 1024, "causal", None, None, 0.0)


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_flex_values_match_naive(variant, padded, eager_flex):
    attn = make_attention(variant)
    T, B = 21, 2
    x = torch.randn(T, B, 32)
    pad = padding_mask(B, T) if padded else None
    keep = valid_rows(pad, T, B)
    with torch.no_grad():
        want = run(attn, "naive", x, pad)
        got = run(attn, "flex", x, pad)
    torch.testing.assert_close(got * keep, want * keep, **TOL)


def test_flex_compiled_on_the_cpu_matches_naive():
    """The real compiled path (one compile: causal, padded)."""
    attn = make_attention("causal")
    T, B = 40, 2
    x = torch.randn(T, B, 32)
    pad = padding_mask(B, T)
    keep = valid_rows(pad, T, B)
    with torch.no_grad():
        want = run(attn, "naive", x, pad)
        got = run(attn, "flex", x, pad)
    torch.testing.assert_close(got * keep, want * keep, **TOL)


@pytest.mark.parametrize("variant", VARIANTS)
def test_dense_mask_formulation_of_sdpa_matches_naive(variant):
    """An extra attn_mask cannot be folded: sdpa passes the dense bias as a float mask."""
    attn = make_attention(variant)
    T, B = 17, 2
    x = torch.randn(T, B, 32)
    extra = torch.zeros(T, T).masked_fill(torch.rand(T, T) < 0.2, float("-inf"))
    extra.fill_diagonal_(0)
    with torch.no_grad():
        want = run(attn, "naive", x, attn_mask=extra)
        got = run(attn, "sdpa", x, attn_mask=extra)
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_incremental_decoding_matches_naive_full_forward(backend, eager_flex):
    attn = make_attention("causal")
    T, B = 12, 2
    x = torch.randn(T, B, 32)
    with torch.no_grad():
        want = run(attn, "naive", x)
        attn.alibi.backend = backend
        state = {}
        steps = [attn(x[t:t + 1], x[t:t + 1], x[t:t + 1], incremental_state=state,
                      need_weights=False)[0] for t in range(T)]
    torch.testing.assert_close(torch.cat(steps), want, **TOL)


@pytest.mark.parametrize("backend", ["naive", "sdpa", "sdpa folded", "flex"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_rows_are_never_nan(variant, backend, eager_flex, monkeypatch):
    """Left padding gives causal/one_sided queries whose visible keys are all padding."""
    if backend == "sdpa folded":
        monkeypatch.setattr(backends, "DENSE_MASK_BUDGET", 0)
        backend = "sdpa"
    attn = make_attention(variant)
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


ALL_REQUESTS = [
    backends.Request(device, dtype, variant, q_len, 8, grad, weights, attn_mask, padding, drop)
    for device, dtype, variant, (q_len, grad), weights, attn_mask, padding, drop in
    itertools.product(
        ["cpu", "cuda", "mps"], [torch.float32, torch.bfloat16, torch.float16], VARIANTS,
        [(8, False), (8, True), (1, False)], [False, True], [False, True], [False, True],
        [0.0, 0.1],
    )
]


@pytest.mark.parametrize("flash_installed", [False, True])
def test_auto_never_picks_a_backend_that_cannot_serve(monkeypatch, flash_installed):
    monkeypatch.setattr(backends, "flash_attn_installed", lambda: flash_installed)
    for request in ALL_REQUESTS:
        chosen = backends.select_backend("auto", request)
        assert backends.unsupported_reason(chosen, request) is None, (request, chosen)
        if request.need_weights:
            assert chosen == "naive"
        if request.device_type == "cpu" and not request.need_weights:
            assert chosen == "sdpa"  # measured fastest on the CPU, training and inference
        if chosen == "flash":
            assert request.variant in ("causal", "symmetric") and request.device_type == "cuda"


def test_a_named_backend_that_cannot_serve_is_a_clear_error(monkeypatch):
    train = backends.Request("cpu", torch.float32, "causal", 8, 8, needs_grad=True)
    with pytest.raises(ValueError, match="no CPU backward.*sdpa"):
        backends.select_backend("flex", train)
    with pytest.raises(ValueError, match="CUDA only"):
        backends.select_backend("flash", train)
    monkeypatch.setattr(backends, "flash_attn_installed", lambda: True)
    one_sided = backends.Request("cuda", torch.float16, "one_sided", 8, 8)
    with pytest.raises(ValueError, match="causal and symmetric only, not one_sided"):
        backends.select_backend("flash", one_sided)
    # the module raises it too, at the call that cannot be served
    attn = make_attention("causal")
    attn.alibi.backend = "flex"
    attn.train()
    with pytest.raises(ValueError, match="no CPU backward"):
        attn(*(torch.randn(5, 2, 32),) * 3, need_weights=False)


def test_need_weights_uses_the_explicit_path_whatever_the_backend(eager_flex):
    attn = make_attention("symmetric")
    x = torch.randn(9, 2, 32)
    with torch.no_grad():
        attn.alibi.backend = "naive"
        out_n, w_n = attn(x, x, x, need_weights=True)
        attn.alibi.backend = "flex"
        out_f, w_f = attn(x, x, x, need_weights=True)
    torch.testing.assert_close(out_f, out_n, **TOL)
    torch.testing.assert_close(w_f, w_n, **TOL)


@pytest.mark.skipif(
    not (torch.cuda.is_available() and backends.flash_attn_installed()),
    reason="flash_attn needs CUDA and the flash_attn package",
)
@pytest.mark.parametrize("variant", ["causal", "symmetric"])
def test_flash_matches_naive_on_cuda(variant):
    attn = make_attention(variant, heads=4, dim=64).cuda().half()
    x = torch.randn(33, 2, 64, device="cuda", dtype=torch.half)
    with torch.no_grad():
        want = run(attn, "naive", x)
        got = run(attn, "flash", x)
    torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)


def test_backend_is_saved_with_the_model_and_overridable_at_load(
    tiny_lm_data, alibi_user_dir, tmp_path
):
    from fairseq import checkpoint_utils

    run_cli(
        "fairseq-train", tiny_lm_data, "--user-dir", alibi_user_dir, "--task", "language_modeling",
        "--arch", "alibi_transformer_lm", "--alibi-attention", "naive", "--cpu",
        "--decoder-layers", "1", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32",
        "--decoder-attention-heads", "2", "--tokens-per-sample", "16", "--batch-size", "4",
        "--optimizer", "adam", "--lr", "1e-3", "--max-update", "1", "--no-epoch-checkpoints",
        "--save-dir", tmp_path, "--log-format", "none", "--num-workers", "0",
    )
    path = str(tmp_path / "checkpoint_last.pt")
    (saved,), _ = checkpoint_utils.load_model_ensemble([path])
    assert saved.decoder.alibi.backend == "naive"
    (loaded,), _ = checkpoint_utils.load_model_ensemble(
        [path], arg_overrides={"alibi_attention": "sdpa"}
    )
    assert loaded.decoder.alibi.backend == "sdpa"
    saved.eval(), loaded.eval()
    tokens = torch.randint(4, 20, (2, 30))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens)[0], saved(tokens)[0], **TOL)
