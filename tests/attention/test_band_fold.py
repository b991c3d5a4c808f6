"""One-way slope windows as the fold's kernel over blocks
(fairseq_alibi/modules/attention/band_fold.py) against a float64 reference written from the
definition: every block plan (one block, ``W = c``, ``W = m·c``, a padded last block), both
directions, key padding, the gradients of q, k, v and the slopes; and where ``windowed`` uses it.
"""

import math

import pytest
import torch

from fairseq_alibi.alibi import variant_slopes, variant_windows
from fairseq_alibi.modules.attention import band_fold, tuning, windowed
from tests.helpers.references import MASKED, reference_windowed_bias

#: windows whose plans differ (MIN_BLOCK = 4 below): smaller than a block (one edge pass), a
#: block edge inside the window or past it, several whole blocks
WINDOWS = [1, 3, 7, 12, 33, 60]


def reference(q, k, v, slopes, window, key_padding_mask=None, ahead=False, scale=None):
    """float64 ``softmax(q·kᵀ·scale - m·|i - j| on i - W <= j <= i) v`` (ahead: ``i <= j <=
    i+W``; scale ``1/√d``) from the definition; all-padding rows have no reference value
    (``rows``). Differentiable in the slopes."""
    T, D = q.size(2), q.size(-1)
    m = slopes.double()[:, None, None]
    d = torch.arange(T)[:, None] - torch.arange(T)[None, :]  # i - j
    d = (-d if ahead else d).double()
    bias = torch.where((d >= 0) & (d <= window), -m * d, torch.tensor(MASKED, dtype=torch.float64))
    bias = bias[None].expand(q.size(0), -1, -1, -1)
    if key_padding_mask is not None:
        bias = bias.masked_fill(key_padding_mask[:, None, None, :], MASKED)
    rows = (bias > MASKED).any(-1)
    scale = 1 / math.sqrt(D) if scale is None else scale
    logits = q.double() @ k.double().transpose(-1, -2) * scale + bias
    return torch.softmax(logits, -1) @ v.double(), rows


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 4 positions and up, and ``windowed`` sending every one-way window here: the
    plans of long sequences at test sizes."""
    monkeypatch.setattr(tuning, "MIN_BLOCK", 4)
    monkeypatch.setattr(tuning, "BANDED_MIN_WINDOW", 1)


def leaves(B, H, T, D=8, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, dtype=dtype).requires_grad_() for _ in range(3)]


def padding(B, T):
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[0, 5:9] = True  # inside the sequence
    mask[-1, -6:] = True  # right padding
    return mask


#: power-of-two slopes and scale (D = 16): the fold columns are exact, the float64 kernel agrees
#: to rounding
SLOPES = torch.tensor([0.5, 0.125, 2.0**-5, 2.0**-7])


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("T", [100, 70, 5])
@pytest.mark.parametrize("ahead", [False, True], ids=["back", "ahead"])
@pytest.mark.parametrize("padded", [False, True], ids=["", "padded"])
def test_matches_the_float64_definition_with_gradients(small_blocks, window, T, ahead, padded):
    q, k, v = leaves(2, 4, T, D=16)
    slopes = SLOPES.clone().double().requires_grad_()
    kpm = padding(2, T) if padded and T > 10 else None
    out = band_fold.banded_attention(q, k, v, slopes, window, 0.25, kpm, ahead)
    want, rows = reference(q, k, v, slopes, window, kpm, ahead)
    torch.testing.assert_close(out[rows], want[rows], atol=1e-10, rtol=1e-10)
    grad = torch.randn_like(out) * rows[..., None]
    found = torch.autograd.grad(out, (q, k, v, slopes), grad)
    expected = torch.autograd.grad(want, (q, k, v, slopes), grad)
    for name, f, e in zip("qkv", found, expected):
        torch.testing.assert_close(f, e, atol=1e-10, rtol=1e-10, msg=lambda m, n=name: f"d{n}: {m}")
    # the slopes' gradient through the float32 fold columns, as the fold's own
    torch.testing.assert_close(found[3].double(), expected[3],
                               atol=1e-5 * expected[3].abs().max().item(), rtol=1e-4)


@pytest.mark.parametrize("ahead", [False, True], ids=["back", "ahead"])
def test_float32_any_slopes(small_blocks, ahead):
    q, k, v = (x.detach().float() for x in leaves(2, 4, 90, D=16))
    slopes = torch.tensor([0.3, 0.07, 0.011, 0.002])
    kpm = padding(2, 90)
    out = band_fold.banded_attention(q, k, v, slopes, 24, 0.25 / 1.3, kpm, ahead)
    want, rows = reference(q, k, v, slopes, 24, kpm, ahead, 0.25 / 1.3)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out[rows], want[rows].float(), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("window,length,want", [
    (1024, 4096, 256),  # a quarter of the window, no padding
    (512, 768, 128),
    (1536, 2000, 250),  # 384 would pad to 2304: 250 divides 2000
    (100, 4096, 128),  # at least MIN_BLOCK
    (700, 100, 100),  # at most the sequence
])
def test_block_sizes(window, length, want):
    assert band_fold.block_size(window, length) == want


def test_a_window_over_the_whole_sequence_looking_back_is_the_fold():
    assert band_fold.plan(2048, 2049) == (2049, [band_fold._Pass(0, causal=True)])
    assert band_fold.plan(4000, 2049) == (2049, [band_fold._Pass(0, causal=True)])


@pytest.mark.parametrize("window", WINDOWS + [99, 300])
@pytest.mark.parametrize("length", [5, 64, 100, 257])
@pytest.mark.parametrize("ahead", [False, True], ids=["back", "ahead"])
def test_the_passes_keep_exactly_the_window(monkeypatch, window, length, ahead):
    """Every distance of the window is kept by exactly one pass, and no other: the passes
    partition the window (no key read twice, none missed)."""
    monkeypatch.setattr(tuning, "MIN_BLOCK", 4)
    size, passes = band_fold.plan(window, length, ahead)
    n = -(-length // size)
    count = torch.zeros(n * size, n * size, dtype=torch.long)
    a = torch.arange(n * size)
    for p in passes:
        for k in range(max(0, p.offset), n + min(0, p.offset)):
            i = a[k * size:(k + 1) * size][:, None]
            j = a[(k - p.offset) * size:(k - p.offset + 1) * size][None, :]
            d = i - j
            kept = (d >= 0) if p.causal else torch.ones_like(d, dtype=torch.bool)
            if p.keep is not None:
                kept = kept & (d >= p.keep[0]) & (d <= p.keep[1])
            count[k * size:(k + 1) * size, (k - p.offset) * size:(k - p.offset + 1) * size] += kept
    d = (a[:, None] - a[None, :])[:length, :length]
    d = -d if ahead else d
    assert torch.equal(count[:length, :length], ((d >= 0) & (d <= window)).long())


def test_all_padding_rows_stay_finite_with_their_gradients(small_blocks):
    q, k, v = (x.detach().float().requires_grad_() for x in leaves(2, 2, 40))
    kpm = torch.zeros(2, 40, dtype=torch.bool)
    kpm[1] = True
    for ahead in (False, True):
        out = band_fold.banded_attention(q, k, v, SLOPES[:2], 12, 0.3, kpm, ahead)
        assert torch.isfinite(out).all()
        assert all(torch.isfinite(g).all() for g in torch.autograd.grad(out.sum(), (q, k, v)))


def run_windowed(q, k, v, variant, cutoff, H=4):
    slopes = variant_slopes(H, variant)
    windows = variant_windows(slopes, cutoff, variant)
    return windowed.attention(q, k, v, slopes, None, variant, windows, None, 8**-0.5)


@pytest.mark.parametrize("variant", ["causal", "one_sided"])
def test_windowed_runs_one_way_windows_of_half_the_sequence_here(monkeypatch, variant):
    """``windowed`` hands a one-way group to the blocks when its window is half the sequence
    or more (or BANDED_MIN_WINDOW), the narrower ones to its chunks, and the result is the
    definition's."""
    seen = []
    real = band_fold.banded_attention

    def recording(q, k, v, slopes, window, *args):
        seen.append(window)
        return real(q, k, v, slopes, window, *args)

    monkeypatch.setattr(band_fold, "banded_attention", recording)
    q, k, v = leaves(1, 4, 200)
    slopes = variant_slopes(4, variant)
    out = run_windowed(q, k, v, variant, 2.0)
    reach = [b or a for b, a in zip(*variant_windows(slopes, 2.0, variant))]
    assert sorted(set(reach)) == ([8, 32, 128, 512] if variant == "causal" else [32, 512])
    # 512 covers the sequence (199 keys back or ahead: the fold); 128 >= 200 / 2; 8, 32 chunks
    assert sorted(seen) == ([128, 199] if variant == "causal" else [199, 199])
    bias = reference_windowed_bias(variant, slopes, None, 200, 2.0)
    want = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 8**0.5 + bias, -1) @ v
    # (the scale 8^-1/2 is rounded in float32 in the fold columns' m / scale)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-6)


def test_no_bias_tensor_is_made_for_a_long_one_way_window(monkeypatch):
    """A causal call whose every window is 512 keys or more runs with no ALiBi bias tensor at
    all: the slopes are fold columns."""
    made = []
    monkeypatch.setattr(windowed, "alibi_bias_between",
                        lambda *a, **kw: made.append(1) or (_ for _ in ()).throw(AssertionError))
    q, k, v = (torch.randn(1, 2, 1024, 16) for _ in range(3))
    slopes = torch.tensor([2.0**-6, 2.0**-8])  # T = 8: W = 512, 2048
    windows = variant_windows(slopes, 8.0, "causal")
    with torch.no_grad():
        out = windowed.attention(q, k, v, slopes, None, "causal", windows)
    assert not made and torch.isfinite(out).all()
