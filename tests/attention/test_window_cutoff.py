"""Slope windows in the attention (``--alibi-window-cutoff``): a stack's bias with a
cutoff gives each call its windows, every backend that declares ``windows`` computes the
windowed definition through ``AlibiMultiheadAttention`` (float64 reference: each variant, key
padding, learned scales, global tokens, partial heads, windows that drop keys), the others
refuse with the one message, ``auto`` picks ``windowed`` only where it was measured faster, and
the windows are computed once per forward pass and scale row."""

import pytest
import torch

from fairseq_alibi.alibi import VARIANTS
from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention
from fairseq_alibi.modules.attention import REGISTRY, Call, dispatch, tuning
from fairseq_alibi.modules.bias import AlibiBias
from tests.helpers.references import MASKED, reference_module_attention, reference_windowed_bias

HEADS, DIM = 4, 32
#: 4 heads, slopes 1/4 … 1/256: windows 4, 16, 64, 256 keys (one_sided's halves 1/16, 1/256:
#: 16, 256); at 100 positions the first three drop keys and windowed's short ones run banded
CUTOFF, LENGTH = 1.0, 100
WINDOWED = [name for name, backend in REGISTRY.items() if backend.capabilities.windows]
REFUSING = [name for name in REGISTRY if name not in WINDOWED]

CASES = {  # name -> AlibiBias options (the variants take what they can)
    "plain": {},
    "learned scales": dict(learned_scales="per_layer_head", num_layers=2),
    "2 global tokens": dict(global_tokens=2),
    "2 of 4 heads": dict(heads=2),
}


def attention(variant, backend, cutoff=CUTOFF, layer=1, **options):
    """``(attn, alibi)``: a module of layer ``layer`` of a stack with the cutoff (learned scales
    set away from 1, every head its own)."""
    options.setdefault("num_layers", 2)
    alibi = AlibiBias(HEADS, variant=variant, window_cutoff=cutoff,
                      future_slope_ratio=0.5 if variant == "asymmetric" else 1.0, **options)
    if alibi.scales is not None:
        with torch.no_grad():
            torch.manual_seed(7)
            alibi.scales.uniform_(0.5, 2.0)
    torch.manual_seed(0)
    attn = AlibiMultiheadAttention(DIM, HEADS, alibi.layer(layer), attention=backend).eval()
    for p in attn.parameters():  # every term away from zero
        torch.nn.init.normal_(p, std=0.3)
    return attn, alibi


def reference(attn, alibi, x, kpm, layer=1, cutoff=CUTOFF):
    slopes, future = alibi.slopes_of(layer)
    bias = reference_windowed_bias(alibi.variant, slopes.detach().tolist(),
                                   None if future is None else future.detach().tolist(),
                                   x.size(0), cutoff, alibi.global_tokens)
    return reference_module_attention(attn, x, bias, kpm), bias


def inputs(T=LENGTH, padded=False):
    torch.manual_seed(1)
    x = torch.randn(T, 2, DIM)
    kpm = None
    if padded:  # the second row right-padded by 30
        kpm = torch.arange(T)[None, :] >= torch.tensor([T, T - 30])[:, None]
    return x, kpm


@pytest.mark.parametrize("backend", WINDOWED + ["auto"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("padded", [False, True])
def test_every_backend_that_declares_windows_computes_the_windowed_definition(
        backend, variant, case, padded):
    options = dict(CASES[case])
    if variant == "one_sided" and "heads" in options:
        pytest.skip("one_sided takes no --alibi-heads")
    if backend == "flex" and "global_tokens" in options:
        pytest.skip("flex takes no global tokens (its refusal: tests/attention/test_dispatch.py)")
    attn, alibi = attention(variant, backend, **options)
    x, kpm = inputs(padded=padded)
    want, bias = reference(attn, alibi, x, kpm)
    _, plain = reference(attn, alibi, x, kpm, cutoff=0.0)
    assert (bias == MASKED).sum() > (plain == MASKED).sum()  # the windows drop keys
    with torch.no_grad():
        out, _ = attn(x, x, x, key_padding_mask=kpm, need_weights=False)
    real = ~kpm.t()[..., None] if padded else torch.ones(LENGTH, 2, 1, dtype=torch.bool)
    torch.testing.assert_close(out.double() * real, want * real, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", ["causal", "offset", "asymmetric"])
def test_the_learned_scales_gradient_matches_the_dense_windowed_bias(variant):
    """The windows are integers of the detached slopes: the scales' gradient flows through the
    kept keys' bias alone, the same for the banded backend and the dense definition."""
    x, kpm = inputs(padded=True)
    grads = {}
    for backend in ("naive", "windowed"):
        attn, alibi = attention(variant, backend, learned_scales="per_layer_head")
        attn.train().dropout_module.p = 0.0
        out, _ = attn(x, x, x, key_padding_mask=kpm, need_weights=False)
        out.masked_fill(kpm.t()[..., None], 0).pow(2).sum().backward()
        grads[backend] = alibi.scales.grad.clone()
    assert grads["naive"].abs().sum() > 0
    torch.testing.assert_close(grads["windowed"], grads["naive"], atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("backend", REFUSING)
def test_backends_that_compute_the_whole_bias_refuse_a_windowed_call(backend):
    reason = (f"{backend} computes the whole ALiBi bias: it cannot drop the keys beyond the "
              "slope windows (--alibi-window-cutoff)")
    device = "cuda" if backend == "flash" else "cpu"
    dtype = torch.float16 if backend == "flash" else torch.float32
    call = Call(device, dtype, "causal", 8, 8, windowed=True)
    assert dispatch.unsupported(backend, call) == reason
    assert dispatch.unsupported(backend, call._replace(windowed=False)) != reason
    attn, _ = attention("causal", backend)
    x, _ = inputs(T=8)
    with pytest.raises(ValueError, match=(f"--alibi-attention {backend} cannot serve this call: "
                                          f"{reason.replace('(', '.').replace(')', '.')}")):
        attn(x, x, x, need_weights=False)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("backend", ["sdpa", "naive", "windowed"])
def test_a_cutoff_that_drops_no_key_is_the_dense_bias(variant, backend):
    """A window longer than the sequence drops nothing: the dense backends compute exactly the
    dense bias (the same tensor); windowed its own way (to rounding)."""
    x, kpm = inputs(T=40, padded=True)
    wide, _ = attention(variant, backend, cutoff=1000.0, global_tokens=1)
    dense, _ = attention(variant, "naive" if backend == "windowed" else backend, cutoff=0.0,
                         global_tokens=1)
    with torch.no_grad():
        got = wide(x, x, x, key_padding_mask=kpm, need_weights=False)[0]
        want = dense(x, x, x, key_padding_mask=kpm, need_weights=False)[0]
    if backend == "windowed":
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    else:
        assert torch.equal(got, want)
        assert torch.equal(wide.alibi.dense(40, 40), dense.alibi.dense(40, 40))


def test_auto_picks_windowed_where_it_was_measured_faster():
    # (which windows at which lengths: tests/attention/test_dispatch.py, windowed_cost)
    long = Call("cpu", torch.float32, "causal", tuning.ONE_WAY_WINDOWED_MIN_LENGTH,
                tuning.ONE_WAY_WINDOWED_MIN_LENGTH, heads=8, windowed=True,
                windows=AlibiBias(8, window_cutoff=CUTOFF).layer(0).windows())
    assert dispatch.auto_backend(long) == "windowed"
    for call in (long._replace(query_len=long.key_len - 1, key_len=long.key_len - 1),
                 long._replace(query_len=1),  # a decoding step: sdpa's windowed row
                 long._replace(dropout_p=0.1), long._replace(dtype=torch.bfloat16),
                 long._replace(device="cuda", dtype=torch.float16)):
        assert dispatch.auto_backend(call) == "sdpa", call
    # without windows, nothing changes (tests/attention/test_dispatch.py: every case)
    assert dispatch.auto_backend(long._replace(windowed=False)) == "fold"


def test_auto_runs_windowed_on_a_long_sequence(monkeypatch):
    ran = []
    original = REGISTRY["windowed"]
    monkeypatch.setitem(REGISTRY, "windowed", original.__class__(
        original.name, lambda *a: ran.append(1) or original.run(*a), original.capabilities))
    attn, alibi = attention("causal", "auto")
    T = tuning.WINDOWED_MIN_LENGTH
    torch.manual_seed(2)
    x = torch.randn(T, 1, DIM)
    with torch.no_grad():
        out, _ = attn(x, x, x, need_weights=False)
    assert ran == [1]
    want, _ = reference(attn, alibi, x, None)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("learned,rows", [("none", 1), ("per_layer", 2)])
def test_the_windows_are_computed_once_per_pass_and_scale_row(monkeypatch, learned, rows):
    import fairseq_alibi.modules.bias as bias_module

    computed = []
    original = bias_module.variant_windows
    monkeypatch.setattr(bias_module, "variant_windows",
                        lambda *a, **k: computed.append(1) or original(*a, **k))
    alibi = AlibiBias(HEADS, variant="causal", window_cutoff=2.0, num_layers=2,
                      learned_scales=learned)
    layers = [AlibiMultiheadAttention(DIM, HEADS, alibi.layer(i), attention="windowed").train()
              for i in range(2)]
    x, _ = inputs(T=20)
    for layer in layers:
        layer(x, x, x, need_weights=False)[0].sum().backward()
    assert len(computed) == rows
    for layer in layers:  # the same slopes: nothing recomputed
        layer(x, x, x, need_weights=False)
    assert len(computed) == rows
    if alibi.scales is not None:  # an optimizer step changes the slopes: computed again
        with torch.no_grad():
            alibi.scales.mul_(2.0)
        layers[0](x, x, x, need_weights=False)
        assert len(computed) == rows + 1
        assert alibi.windows_of(0) == ([4, 16, 64, 256], [0] * 4)  # slopes 1/2 … 1/128
    alibi.window_cutoff = 0.0
    assert alibi.windows_of(0) is None and not alibi.layer(0).windowed


def test_partial_heads_keep_every_key_and_the_windows_follow_the_slope_scale():
    alibi = AlibiBias(HEADS, variant="offset", window_cutoff=8.0, heads=2)
    # Press's slopes of 2 heads, 1/16 and 1/256; offset looks ahead half a key further
    assert alibi.windows_of() == ([128, 2048, None, None], [129, 2049, None, None])
    alibi.slope_scale = 2.0
    assert alibi.windows_of() == ([64, 1024, None, None], [65, 1025, None, None])


@pytest.mark.parametrize("backend", ["auto", "sdpa", "naive"])
def test_the_length_scaled_rows_are_windowed_with_each_sequences_slopes(backend):
    """``--alibi-length-scale N`` with a cutoff: each sequence's slopes ``f(n)·m`` set its own
    windows, in the dense per-row bias (kind ``rows``: sdpa, naive)."""
    import math

    N, T = 8, 40
    attn, alibi = attention("symmetric", backend, cutoff=1.0, length_scale=N)
    x, kpm = inputs(T=T, padded=True)  # real lengths 40 and 10
    with torch.no_grad():
        out, _ = attn(x, x, x, key_padding_mask=kpm, need_weights=False)
    slopes = alibi.slopes_of(1)[0].double()
    for b, n in enumerate((T, T - 30)):
        factor = max(1.0, math.log(n) / math.log(N))
        bias = reference_windowed_bias("symmetric", (slopes * factor).tolist(), None, T, 1.0)
        want = reference_module_attention(attn, x[:, b:b + 1], bias, kpm[b:b + 1])
        torch.testing.assert_close(out[:n, b:b + 1].double(), want[:n], atol=2e-5, rtol=1e-4)
