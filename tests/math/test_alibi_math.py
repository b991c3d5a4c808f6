"""Exact tests of the ALiBi math against the paper's reference code and literal values."""

import math

import pytest
import torch

from fairseq_alibi.alibi import (
    alibi_bias,
    check_variant,
    get_slopes,
    mask_value,
)
from fairseq_alibi.modules.bias import AlibiBias


def reference_slopes(n):
    """Verbatim logic of Press et al.'s get_slopes (ofirpress/attention_with_linear_biases)."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (
        get_slopes_power_of_2(closest_power_of_2)
        + reference_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
    )


@pytest.mark.parametrize("heads", range(1, 65))
def test_slopes_match_reference_formula(heads):
    got = get_slopes(heads)
    assert got.dtype == torch.float32 and got.shape == (heads,)
    want = torch.tensor(reference_slopes(heads), dtype=torch.float32)
    assert torch.equal(got, want)


def test_slopes_literal_values():
    assert get_slopes(8).tolist() == [1 / 2**k for k in range(1, 9)]
    twelve = [1 / 2**k for k in range(1, 9)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]
    assert torch.allclose(get_slopes(12), torch.tensor(twelve), rtol=0, atol=1e-7)


@pytest.mark.parametrize("bad", [0, -1, 2.5, "8", True])
def test_slopes_reject_bad_head_counts(bad):
    with pytest.raises(ValueError, match="positive whole number"):
        get_slopes(bad)


def naive_causal_bias(slopes, q, k):
    out = torch.empty(len(slopes), q, k, dtype=torch.float64)
    for h, m in enumerate(slopes.tolist()):
        for t in range(q):
            i = k - q + t
            for j in range(k):
                out[h, t, j] = -m * (i - j) if j <= i else float("-inf")
    return out


@pytest.mark.parametrize("q,k", [(5, 5), (1, 7), (3, 9), (6, 6)])
def test_causal_bias_is_relative_and_aligned_to_the_end_of_the_keys(q, k):
    slopes = get_slopes(4)
    got = alibi_bias(slopes, q, k, "causal")
    want = naive_causal_bias(slopes, q, k)
    visible = torch.isfinite(want)
    assert got.shape == (4, q, k) and got.dtype == torch.float32
    assert torch.equal(got[visible].double(), want[visible])
    assert (got[~visible] == mask_value(torch.float32)).all()


@pytest.mark.parametrize("variant", ["causal", "symmetric", "one_sided", "offset", "asymmetric"])
def test_kv_cache_rows_equal_the_full_matrix(variant):
    slopes, future = get_slopes(8), get_slopes(8) * 0.5
    full = alibi_bias(slopes, 40, 40, variant, future)
    for k in range(1, 41):
        for q in {1, min(k, 16)}:
            assert torch.equal(alibi_bias(slopes, q, k, variant, future), full[:, k - q : k, :k])


def test_bias_depends_only_on_distance():
    """No absolute position: the bias of positions s..s+n equals that of 0..n."""
    slopes = get_slopes(8)
    for variant in ("causal", "symmetric", "offset", "one_sided"):
        long = alibi_bias(slopes, 40, 40, variant)
        assert torch.equal(long[:, 25:35, 25:35], alibi_bias(slopes, 10, 10, variant))


def test_no_row_trick_precision_at_long_lengths_in_half_precision():
    """Neighbouring keys differ by exactly one slope far from the start, even in bf16/fp16."""
    slopes = get_slopes(8)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        row = alibi_bias(slopes, 1, 8001, "causal", dtype=dtype)[:, 0, :]
        diffs = (row[:, -1].float() - row[:, -2].float())
        assert torch.equal(diffs, slopes), dtype


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_mask_value_is_finite_in_every_dtype(dtype):
    for variant in ("causal", "one_sided"):
        b = alibi_bias(get_slopes(8), 4, 4, variant, dtype=dtype)
        assert b.dtype == dtype and torch.isfinite(b).all()
        assert (b == mask_value(dtype)).any()


def test_unknown_variant_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown ALiBi variant 'bidirectional'.*causal"):
        alibi_bias(get_slopes(4), 2, 2, "bidirectional")
    with pytest.raises(ValueError, match="even number of attention heads"):
        check_variant("one_sided", 7)
    with pytest.raises(ValueError, match="cannot exceed"):
        alibi_bias(get_slopes(4), 3, 2)


def test_shared_bias_is_memoised_and_never_sized_by_a_maximum_length():
    alibi = AlibiBias(8)
    first = alibi(16, 16)
    assert alibi(16, 16) is first  # all layers of a forward share one tensor
    step = alibi(1, 300)  # one decoding step: (H, 1, k), nothing of size (k, k)
    assert step.shape == (8, 1, 300)
    assert set(dict(alibi.named_buffers())) == {"slopes"}
    assert alibi.slopes.numel() == 8


@pytest.mark.parametrize("variant", ["causal", "symmetric", "one_sided", "offset", "asymmetric"])
def test_the_models_memoised_bias_is_the_math_functions_bit_for_bit(variant):
    """AlibiBias (what the models build: memoised, decoding rows from a table) returns exactly
    what :func:`alibi_bias` computes from its slopes: full blocks, KV-cache blocks and decoding
    rows, in every dtype, the memoised ones included."""
    ratio = 0.5 if variant == "asymmetric" else 1.0
    cached = AlibiBias(8, variant=variant, future_slope_ratio=ratio, slope_scale=0.75)
    slopes = get_slopes(4).repeat(2) if variant == "one_sided" else get_slopes(8)
    slopes = slopes * 0.75
    future = slopes * 0.5 if variant == "asymmetric" else None
    for dtype in (torch.float32, torch.bfloat16):
        for query_len, key_len in ((7, 7), (3, 9), (1, 9), (1, 2000), (7, 7)):
            want = alibi_bias(slopes, query_len, key_len, variant, future, dtype)
            assert torch.equal(cached(query_len, key_len, dtype), want), (query_len, key_len)


def test_half_conversion_keeps_float32_slopes():
    alibi = AlibiBias(12).half()
    assert alibi.slopes.dtype == torch.float32
    assert torch.equal(alibi.slopes, get_slopes(12))


def test_slope_scale_multiplies_slopes_exactly():
    plain, scaled = AlibiBias(8), AlibiBias(8, slope_scale=0.25)
    assert torch.equal(scaled(6, 6), alibi_bias(get_slopes(8) * 0.25, 6, 6))
    assert not torch.equal(scaled(6, 6), plain(6, 6))
    with pytest.raises(ValueError, match="positive"):
        AlibiBias(8, slope_scale=0)


@pytest.mark.parametrize("variant", ["causal", "symmetric", "one_sided", "offset", "asymmetric"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_decoding_step_row_is_exactly_the_last_row_of_the_bias(variant, dtype):
    """A decoding step (one query, at the end of the keys) takes its row from a cached table:
    bit for bit the last row of the full bias, at every length, after the table grows, and
    after the slope scale changes. (The reference is the last of the bias's last 16 rows, not
    of all ``k``: the rows of a block are those of the full matrix, test above.)"""
    alibi = AlibiBias(8, variant=variant, future_slope_ratio=0.5)
    for key_len in (1, 2, 37, 1024, 1025, 3000, 1):
        if key_len == 1025:
            alibi.slope_scale = 0.25
        slopes, future = alibi.slopes_of()
        want = alibi_bias(slopes, min(key_len, 16), key_len, variant, future, dtype)[:, -1:]
        got = alibi(1, key_len, dtype)
        assert got.shape == (8, 1, key_len) and got.dtype == dtype
        assert torch.equal(got, want), (variant, key_len)


def test_decoding_steps_slice_one_cached_table():
    alibi = AlibiBias(8)
    first = alibi(1, 100)
    for key_len in range(101, 130):  # one step after another: views of the same table
        step = alibi(1, key_len)
        assert step.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
    assert first.untyped_storage().nbytes() == 8 * 1024 * 4  # sized by doubling, from 1024
