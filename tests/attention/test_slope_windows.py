"""Slope windows: the window math of fairseq_alibi/alibi.py, the CPU windowed backend
(fairseq_alibi/modules/attention/windowed.py) against a float64 reference written from the
definition, and the smoke run of benchmarks/windows.py."""

import pytest
import torch

from fairseq_alibi.alibi import (
    VARIANTS,
    alibi_bias,
    alibi_bias_between,
    check_window_cutoff,
    get_slopes,
    variant_slopes,
    variant_windows,
    window_lengths,
    windowed_alibi_bias,
)
from fairseq_alibi.modules.attention import tuning, windowed
from tests.helpers.references import MASKED, reference_windowed_bias
from tests.helpers.slope_windows import (CASES, TOL64, check_close, head_slopes, inputs, padding,
                                         reference, run_case, run_windowed)

# ------------------------------------------------------------------ the window math


def test_eight_causal_heads_at_cutoff_eight_keep_16_to_2048_keys():
    # slopes 1/2 … 1/256: W = ceil(8 / m) = 16, 32, …, 2048 (the example of the docs)
    assert window_lengths(get_slopes(8), 8) == [16, 32, 64, 128, 256, 512, 1024, 2048]
    back, ahead = variant_windows(get_slopes(8), 8, "causal")
    assert back == [16, 32, 64, 128, 256, 512, 1024, 2048] and ahead == [0] * 8


def test_window_is_the_first_distance_at_or_below_minus_cutoff():
    # 8 / (1/3) = 24 exactly: distance 24 has bias -8 (kept), 25 is beyond; 7.5 nats: 22.5 -> 23
    assert window_lengths(torch.tensor([1 / 2, 0.375]), 7.5) == [15, 20]
    assert window_lengths(torch.tensor([0.25]), 8) == [32]
    assert window_lengths(torch.tensor([0.3]), 8) == [27]  # 26.67 -> 27


def test_partial_heads_and_the_cutoff_off_are_unbounded():
    slopes = variant_slopes(8, "causal", biased_heads=4)  # 1/4, 1/16, 1/64, 1/256, then 0
    assert window_lengths(slopes, 8) == [32, 128, 512, 2048, None, None, None, None]
    assert window_lengths(get_slopes(8), 0) == [None] * 8  # 0 = off


def test_bidirectional_forward_windows():
    slopes = get_slopes(8)
    back = [16, 32, 64, 128, 256, 512, 1024, 2048]
    assert variant_windows(slopes, 8, "symmetric") == (back, back)
    # offset's future bias -m(j-i-0.5): ceil(8/m + 0.5)
    assert variant_windows(slopes, 8, "offset") == (back, [w + 1 for w in back])
    # asymmetric: the future slopes (here ratio 0.5) set the forward windows
    assert variant_windows(slopes, 8, "asymmetric", slopes * 0.5) == (back, [2 * w for w in back])
    with pytest.raises(ValueError, match="future_slopes"):
        variant_windows(slopes, 8, "asymmetric")


def test_one_sided_heads_keep_their_own_direction():
    slopes = variant_slopes(8, "one_sided")  # each half 1/4, 1/16, 1/64, 1/256
    half = [32, 128, 512, 2048]
    assert variant_windows(slopes, 8, "one_sided") == (half + [0] * 4, [0] * 4 + half)


@pytest.mark.parametrize("bad", [-1, -0.5, float("nan"), float("inf"), "8", None, True])
def test_bad_cutoffs_are_refused_naming_the_flag(bad):
    with pytest.raises(ValueError, match="--alibi-window-cutoff"):
        check_window_cutoff(bad)
    with pytest.raises(ValueError, match="--alibi-window-cutoff"):
        window_lengths(get_slopes(4), bad)


def test_good_cutoffs_are_floats():
    assert check_window_cutoff(0) == 0.0 and check_window_cutoff(8) == 8.0
    assert check_window_cutoff(2.5) == 2.5


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("global_tokens", [0, 2])
def test_bias_between_positions_is_alibi_bias(variant, global_tokens):
    slopes = variant_slopes(8, variant)
    future = slopes * 0.7
    want = alibi_bias(slopes, 5, 9, variant, future, global_tokens=global_tokens)
    got = alibi_bias_between(slopes, torch.arange(4, 9), torch.arange(9), variant, future,
                             global_tokens=global_tokens)
    assert torch.equal(got, want)
    assert torch.equal(windowed_alibi_bias(slopes, 5, 9, variant, future,
                                           global_tokens=global_tokens, cutoff=0), want)
    some = [1, 6]  # a subset of the heads keeps each head's own bias (one_sided's direction)
    assert torch.equal(alibi_bias_between(slopes, torch.arange(4, 9), torch.arange(9), variant,
                                          future, global_tokens=global_tokens, heads=some),
                       want[some])


@pytest.mark.parametrize("variant", VARIANTS)
def test_dropped_keys_are_exactly_those_biased_below_the_cutoff(variant):
    cutoff, L = 1.0, 40
    slopes = variant_slopes(4, variant)
    future = slopes * 0.6
    dense = alibi_bias(slopes, L, L, variant, future, torch.float64)
    windowed_dense = windowed_alibi_bias(slopes, L, L, variant, future, torch.float64,
                                         cutoff=cutoff)
    masked = dense < -1e30
    dropped = (windowed_dense < -1e30) & ~masked
    assert dropped.any()
    assert (dense[dropped] < -cutoff).all()  # every dropped key lies beyond -T
    # kept keys reach at most one distance past -T (W = ceil(T/m))
    assert (dense[~dropped & ~masked] >= -cutoff - slopes.max() - 1e-6).all()
    assert torch.equal(windowed_dense[~dropped], dense[~dropped])


def test_global_tokens_are_exempt_from_the_windows():
    slopes = get_slopes(4)
    bias = windowed_alibi_bias(slopes, 30, 30, "symmetric", cutoff=1.0, global_tokens=2)
    assert (bias[:, :, :2] == 0).all() and (bias[:, :2, :] == 0).all()
    assert bias[0, 20, 5] < -1e30  # far (window 4), neither one global: dropped


# ------------------------------------------------------------------ the windowed backend

@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_windowed_attention_matches_the_float64_definition(variant, case):
    if case[5] and variant == "one_sided":
        pytest.skip("one_sided takes no partial heads")
    check_close(*run_case(variant, case), **TOL64)


@pytest.mark.parametrize("variant", VARIANTS)
def test_windowed_attention_in_float32(variant):
    slopes, future = head_slopes(variant)
    q, k, v = inputs(2, 4, 64, 64, D=16, dtype=torch.float32)
    kpm = padding(2, 64)
    out = run_windowed(q, k, v, slopes, future, variant, 2.0, key_padding_mask=kpm)
    assert out.dtype == torch.float32
    check_close(out, reference(q, k, v, slopes, future, variant, 2.0, kpm),
                atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", [CASES[2], CASES[3], CASES[4], CASES[6], CASES[9]],
                         ids=lambda c: "-".join(map(str, c)))
def test_windowed_gradients_match_the_reference(variant, case):
    T, S, cutoff, padded, G, partial, chunk = case
    if partial and variant == "one_sided":
        pytest.skip("one_sided takes no partial heads")
    slopes, future = head_slopes(variant, partial)
    kpm = padding(2, S, G) if padded else None
    leaves = [x.requires_grad_() for x in inputs(2, 4, T, S, seed=1)]
    grad = torch.randn(2, 4, T, 8, dtype=torch.float64)
    want, rows = reference(*leaves, slopes, future, variant, cutoff, kpm, G)
    expected = torch.autograd.grad(want, leaves, grad * rows)
    out = run_windowed(*leaves, slopes, future, variant, cutoff, key_padding_mask=kpm,
                       global_tokens=G, chunk=chunk)
    found = torch.autograd.grad(out, leaves, grad * rows)
    for name, g, e in zip("qkv", found, expected):
        torch.testing.assert_close(g, e, **TOL64, msg=lambda text, name=name: f"d{name}: {text}")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("T,S", [(40, 40), (20, 40)])
def test_slope_gradients_flow_as_through_the_dense_definition(variant, T, S):
    """Learned slope scales: the slopes' gradient (the windows themselves are integers, from
    the detached slopes) equals that of the dense windowed bias, folded groups included."""
    base = variant_slopes(4, variant, biased_heads=None if variant == "one_sided" else 3)
    scales = torch.tensor([1.3, 0.7, 1.1, 0.9], dtype=torch.float64, requires_grad=True)
    q, k, v = inputs(1, 4, T, S, seed=2)

    def slopes():
        found = base * scales
        return found, (found * 0.6 if variant == "asymmetric" else None)

    m, mf = slopes()
    windows = variant_windows(m.detach(), 2.0, variant, None if mf is None else mf.detach())
    out = windowed.attention(q, k, v, m, mf, variant, windows, chunk=8)
    (found,) = torch.autograd.grad(out.sum(), scales)
    m, mf = slopes()
    bias = alibi_bias_between(m, torch.arange(S - T, S), torch.arange(S), variant, mf,
                              torch.float64, windows=windows)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    (expected,) = torch.autograd.grad(want.sum(), scales)
    torch.testing.assert_close(found, expected, **TOL64)


@pytest.mark.parametrize("variant", VARIANTS)
def test_windows_covering_the_sequence_are_plain_dense_alibi(variant):
    slopes, future = head_slopes(variant)
    q, k, v = inputs(2, 4, 50, 50, D=16, dtype=torch.float32)
    bias = alibi_bias(slopes, 50, 50, variant, future)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    for cutoff in (1000.0, 0.0):  # windows past the sequence, and the cutoff off
        out = run_windowed(q, k, v, slopes, future, variant, cutoff)
        torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-5)
    narrow = run_windowed(q, k, v, slopes, future, variant, 1.0)
    assert not torch.allclose(narrow, want, atol=1e-3)  # (the windows do drop keys)


@pytest.mark.parametrize("variant", VARIANTS)
def test_chunk_sizes_agree(variant):
    slopes, future = head_slopes(variant)
    q, k, v = inputs(1, 4, 70, 70)
    outs = [run_windowed(q, k, v, slopes, future, variant, 2.0, chunk=c) for c in (3, 16, 64)]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=1e-12, rtol=1e-12)


def test_all_padding_rows_stay_finite_with_their_gradients():
    slopes, _ = head_slopes("causal")
    leaves = [x.requires_grad_() for x in inputs(2, 4, 20, 20, dtype=torch.float32)]
    kpm = torch.ones(2, 20, dtype=torch.bool)
    out = run_windowed(*leaves, slopes, None, "causal", 2.0, key_padding_mask=kpm, chunk=4)
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(g).all() for g in torch.autograd.grad(out.sum(), leaves))


def test_no_bias_spans_the_keys_of_a_long_sequence(monkeypatch):
    """The chunks' bias is ``(H_g, c, R)``: never as wide as the keys (no ``(H, L, L)``)."""
    widths = []

    def recording(*args, **kwargs):
        bias = alibi_bias_between(*args, **kwargs)
        widths.append(bias.shape[-1])
        return bias

    monkeypatch.setattr(windowed, "alibi_bias_between", recording)
    monkeypatch.setattr(windowed, "_CHUNK_BIASES", {})  # none kept from an earlier test
    slopes = get_slopes(4)  # cutoff 1: windows 4, 16, 64, 256 keys
    q, k, v = inputs(1, 4, 2048, 2048, dtype=torch.float32)
    run_windowed(q, k, v, slopes, None, "causal", 1.0)
    assert widths and max(widths) < 1024


def test_longer_queries_than_keys_are_refused():
    q, k, v = inputs(1, 4, 10, 5)
    with pytest.raises(ValueError, match="query_len"):
        run_windowed(q, k, v, get_slopes(4), None, "causal", 2.0)


# ------------------------------------------------------------------ the benchmark


def test_the_benchmark_smoke_run(capsys):
    from benchmarks import windows as bench

    body = bench.main(["--quick", "--lengths", "64", "--tables", "targets,cutoffs,chunks"])
    printed = capsys.readouterr().out
    assert "| 64 | forward |" in body and "| 64 | fwd+bwd |" in body
    assert "× faster than dense auto" in printed and "windows 16, 32" in printed
    assert "| causal | 64 | 16 | fwd+bwd |" in body and "Chunk sizes" in body


def test_the_revision_benchmark_smoke_run():
    """``benchmarks.windowed_revision`` reads a revision's package from git and times its
    windowed attention beside today's (here against HEAD: the same function, equal outputs)."""
    import subprocess
    from pathlib import Path

    from benchmarks import windowed_revision as bench

    root = Path(__file__).resolve().parents[2]
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    body = bench.main(["--against", "HEAD", "--quick", "--variants", "causal",
                       "--documents", "100,156"])
    assert "| causal | 256 | fwd+bwd |" in body and "HEAD ÷ now" in body
    assert "| causal + documents | 256 | forward |" in body
    sinks = bench.main(["--against", "HEAD", "--quick", "--variants", "causal", "--sinks", "4"])
    assert "4 sink(s)" in sinks and "| causal | 256 | forward |" in sinks
    assert all(float(row.split("|")[-2]) < 1e-5 for row in sinks.splitlines()
               if row.startswith("| causal"))  # the same function (as HEAD's, or rounding)
    with pytest.raises(SystemExit):  # one line naming the flag, before any work
        bench.main(["--against", "HEAD", "--lengths", "a,b"])
    with pytest.raises(SystemExit):
        bench.main(["--against", "HEAD", "--sinks", "-1"])
    with pytest.raises(SystemExit, match="git cannot read that revision"):
        bench.main(["--against", "no-such-revision", "--quick"])


def test_chunk_biases_are_kept_for_the_next_call_within_their_budget(monkeypatch):
    monkeypatch.setattr(windowed, "_CHUNK_BIASES", {})
    made = []
    real = windowed._chunk_bias_of
    monkeypatch.setattr(windowed, "_chunk_bias_of", lambda *a: made.append(1) or real(*a))
    slopes, _ = head_slopes("symmetric")
    q, k, v = inputs(1, 4, 70, 70)
    first = run_windowed(q, k, v, slopes, None, "symmetric", 2.0, chunk=8)
    count = len(made)
    assert count and len(windowed._CHUNK_BIASES) == count
    again = run_windowed(q, k, v, slopes, None, "symmetric", 2.0, chunk=8)
    assert len(made) == count and torch.equal(first, again)  # the layers of a model: no new bias
    # learned scales (a gradient through the slopes): made per call, never kept
    run_windowed(q, k, v, slopes.clone().requires_grad_(), None, "symmetric", 2.0, chunk=8)
    assert len(made) > count and len(windowed._CHUNK_BIASES) == count
    # the budget: the least recently used go first, one bias over it is never kept
    sizes = [b.numel() * b.element_size() for b in windowed._CHUNK_BIASES.values()]
    monkeypatch.setattr(tuning, "CHUNK_BIAS_BYTES", max(sizes))
    run_windowed(q, k, v, slopes, None, "symmetric", 1.0, chunk=8)
    kept = sum(b.numel() * b.element_size() for b in windowed._CHUNK_BIASES.values())
    assert 0 < kept <= max(sizes)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[4], CASES[8]],
                         ids=lambda c: "-".join(map(str, c)))
def test_groups_whose_one_chunk_bias_would_be_large_run_as_chunks(monkeypatch, variant, case):
    """A window that covers most of the sequence runs as one chunk of every query only while
    that chunk's bias is small; else as chunks reading keys past the ends."""
    monkeypatch.setattr(tuning, "ONE_CHUNK_BYTES", 0)
    T, S, cutoff, padded, G, partial, chunk = case
    slopes, future = head_slopes(variant, partial)
    q, k, v = inputs(2, 4, T, S)
    kpm = padding(2, S, G) if padded else None
    out = run_windowed(q, k, v, slopes, future, variant, cutoff, key_padding_mask=kpm,
                       global_tokens=G, chunk=chunk or 8)
    check_close(out, reference(q, k, v, slopes, future, variant, cutoff, kpm, G), **TOL64)
