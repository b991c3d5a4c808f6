"""Attention sinks under slope windows (``--alibi-window-sinks S``): the first ``S`` keys stay
visible to every query of every windowed head with their true bias, besides the window
(fairseq_alibi/alibi.py). Every backend that declares sinks computes the float64 definition
(:func:`tests.helpers.references.reference_windowed_bias` with ``sinks``), forward and
backward (the learned slopes' gradient too), for every variant, with padding, global tokens,
KV caches; ``S = 0`` is the windowed model as before; cached decoding keeps the sinks and the
last ``max_h W_h`` keys (bounded) and equals the full forward; backends that cannot keep sinks
refuse."""

import dataclasses

import pytest
import torch

from fairseq_alibi.alibi import VARIANTS, alibi_bias_between, variant_slopes, variant_windows
from fairseq_alibi.modules.attention import REGISTRY, dispatch, windowed
from fairseq_alibi.modules.bias import AlibiBias
from tests.helpers.flex_windows import make_inputs, windowed_layer, windowed_reference
from tests.helpers.references import (MASKED, reference_module_attention,
                                      reference_windowed_bias)
from tests.helpers.rolling_cache import DIM, NAIVE_TOL, TOL, Decoder, attention, bound
from tests.helpers.slope_windows import (CASES, TOL64, check_close, head_slopes, inputs, padding,
                                         reference, run_case, run_windowed)

SINKS = [0, 1, 4]
#: the backends that keep sinks (flex: forward only on the CPU, eager and slow: fewer cases)
KEEPING = [name for name, backend in REGISTRY.items() if backend.capabilities.sinks]
BACKEND_CASES = [(backend, variant, sinks, case) for backend in KEEPING + ["auto"]
                 for variant in VARIANTS for sinks in (1, 4) for case in ("padded", "kv cache")
                 if backend != "flex" or (case == "padded" and (sinks == 4 or
                                                               variant == "causal"))]
#: a stream of 160 positions rolls a cache of reach 64 (tests/attention/test_rolling_cache.py)
STREAM = 160


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("global_tokens", [0, 2, 5])
def test_the_definition_keeps_the_first_keys_with_their_bias(variant, global_tokens):
    slopes, future = head_slopes(variant)
    windows = variant_windows(slopes, 1.0, variant, future)
    got = alibi_bias_between(slopes, torch.arange(30), torch.arange(30), variant, future,
                             torch.float64, global_tokens, windows=windows, sinks=3)
    want = reference_windowed_bias(variant, slopes.double(), None if future is None else
                                   future.double(), 30, 1.0, global_tokens, sinks=3)
    assert torch.equal(got > MASKED, want > MASKED)
    torch.testing.assert_close(got[got > MASKED], want[want > MASKED], **TOL64)
    if variant == "causal":  # sinks are past keys: a query before a sink does not see it
        assert (got[:, 1, 2:] < MASKED).all() and (got[:, 29, :3] > MASKED).all()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("sinks", SINKS)
@pytest.mark.parametrize("case", [CASES[i] for i in (0, 1, 2, 4, 6, 7)],
                         ids=lambda c: "-".join(map(str, c)))
def test_windowed_attention_keeps_the_sinks(variant, sinks, case):
    if case[5] and variant == "one_sided":
        pytest.skip("one_sided takes no partial heads")
    out, want = run_case(variant, case, sinks)
    check_close(out, want, **TOL64)
    if sinks == 0:  # today's call (no sinks argument), bit for bit
        T, S, cutoff, padded, G, partial, chunk = case
        slopes, future = head_slopes(variant, partial)
        q, k, v = inputs(2, 4, T, S)
        assert torch.equal(out, windowed.attention(
            q, k, v, slopes, future, variant, variant_windows(slopes, cutoff, variant, future),
            padding(2, S, G) if padded else None, None, G, chunk, sinks=0))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[4]],
                         ids=lambda c: "-".join(map(str, c)))
def test_windowed_gradients_with_sinks_match_the_reference(variant, case):
    T, S, cutoff, padded, G, partial, chunk = case
    slopes, future = head_slopes(variant)
    kpm = padding(2, S, G) if padded else None
    leaves = [x.requires_grad_() for x in inputs(2, 4, T, S, seed=1)]
    grad = torch.randn(2, 4, T, 8, dtype=torch.float64)
    want, rows = reference(*leaves, slopes, future, variant, cutoff, kpm, G, 4)
    expected = torch.autograd.grad(want, leaves, grad * rows)
    out = run_windowed(*leaves, slopes, future, variant, cutoff, key_padding_mask=kpm,
                       global_tokens=G, chunk=chunk, sinks=4)
    for name, g, e in zip("qkv", torch.autograd.grad(out, leaves, grad * rows), expected):
        torch.testing.assert_close(g, e, **TOL64, msg=lambda text, name=name: f"d{name}: {text}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_chunks_with_sinks_and_no_hiding_column_have_the_reference_gradients(variant):
    """Chunks of real keys only (no padding: no hiding column) and the sinks merged into them."""
    slopes, future = head_slopes(variant)
    leaves = [x.requires_grad_() for x in inputs(2, 4, 48, 48, seed=3)]
    grad = torch.randn(2, 4, 48, 8, dtype=torch.float64)
    want, rows = reference(*leaves, slopes, future, variant, 1.0, None, 0, 4)
    out = run_windowed(*leaves, slopes, future, variant, 1.0, chunk=8, sinks=4)
    check_close(out, (want, rows), **TOL64)
    got = torch.autograd.grad(out, leaves, grad * rows)
    for name, g, e in zip("qkv", got, torch.autograd.grad(want, leaves, grad * rows)):
        torch.testing.assert_close(g, e, **TOL64, msg=lambda text, name=name: f"d{name}: {text}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_slopes_gradient_flows_through_the_sinks_bias(variant):
    """Learned slope scales: the sinks' bias ``-m·(i - j)`` (the chunks' shared part and the
    column of each chunk) carries the slopes' gradient as the dense definition does."""
    base = variant_slopes(4, variant)
    scales = torch.tensor([1.3, 0.7, 1.1, 0.9], dtype=torch.float64, requires_grad=True)
    q, k, v = inputs(1, 4, 40, 40, seed=2)

    def slopes():
        found = base * scales
        return found, (found * 0.6 if variant == "asymmetric" else None)

    found = []
    for run in ("windowed", "dense"):
        m, mf = slopes()
        windows = variant_windows(m.detach(), 1.0, variant, None if mf is None else mf.detach())
        if run == "windowed":
            out = windowed.attention(q, k, v, m, mf, variant, windows, chunk=8, sinks=4)
        else:
            bias = alibi_bias_between(m, torch.arange(40), torch.arange(40), variant, mf,
                                      torch.float64, windows=windows, sinks=4)
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        found.append(torch.autograd.grad(out.sum(), scales)[0])
    torch.testing.assert_close(*found, **TOL64)


@pytest.mark.parametrize("variant", ["causal", "one_sided", "symmetric"])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("chunk", [None, 4], ids=["planned", "small-chunks"])
def test_chunks_with_sinks_match_the_definition_with_every_gradient(variant, padded, chunk):
    """Chunk groups with their sinks merged into their softmax by the kernel's own forward and
    backward: the output, ``q``/``k``/``v``'s and the learned slope scales' gradients (the
    chunks' share through their shared bias's gradient; ``small-chunks``: many overlapping
    chunks per window)."""
    T, cutoff = 48, {"causal": 4.0, "one_sided": 2.0, "symmetric": 2.0}[variant]
    base = variant_slopes(4, variant)
    scales = torch.tensor([1.0, 2.0, 0.5, 1.0], dtype=torch.float64, requires_grad=True)
    kpm = padding(2, T) if padded else None
    leaves = [x.requires_grad_() for x in inputs(2, 4, T, T, seed=4)]
    grad = torch.randn(2, 4, T, 8, dtype=torch.float64)
    found = []
    for run in ("dense", "windowed"):
        m = base * scales
        windows = variant_windows(m.detach(), cutoff, variant)
        if run == "windowed":
            assert any(g.kind in ("chunks", "whole") and g.sinks
                       for g in windowed.plan(windows, variant, T, T, chunk=chunk, sinks=4))
            out = windowed.attention(*leaves, m, None, variant, windows, kpm, chunk=chunk,
                                     sinks=4)
        else:
            bias = alibi_bias_between(m, torch.arange(T), torch.arange(T), variant, None,
                                      torch.float64, windows=windows, sinks=4)[None]
            if kpm is not None:
                bias = bias.masked_fill(kpm[:, None, None, :], MASKED)
            out = torch.nn.functional.scaled_dot_product_attention(*leaves, attn_mask=bias)
            # an all-padding row has no reference value
            grad = grad * (bias > MASKED).any(-1, keepdim=True)
        found.append([out * (grad != 0), *torch.autograd.grad(out, leaves + [scales], grad)])
    for name, g, e in zip(["out", "q", "k", "v", "slopes"], *found):
        # windowed takes float32 slopes, so their gradient is a float32 sum over every query
        # and key
        tol = dict(atol=1e-5, rtol=1e-5) if name == "slopes" else TOL64
        torch.testing.assert_close(g, e, **tol, msg=lambda text, name=name: f"{name}: {text}")


@pytest.mark.parametrize("backend,variant,sinks,case", BACKEND_CASES)
def test_every_backend_that_declares_sinks_computes_them(backend, variant, sinks, case):
    batch, query_len, key_len, padded = {"padded": (2, 60, 60, True),
                                         "kv cache": (2, 3, 60, True)}[case]
    layer = windowed_layer(variant, window_sinks=sinks)
    q, k, v, kpm = make_inputs(batch, query_len, key_len, padded)
    with torch.no_grad():
        got = dispatch.attend(backend, q, k, v, layer, key_padding_mask=kpm)
    want, rows = windowed_reference(q, k, v, layer, kpm)
    torch.testing.assert_close(got.double()[rows], want[rows], atol=2e-5, rtol=1e-4)


def test_sinks_need_a_backend_that_declares_them():
    """A backend that drops the keys beyond the windows but does not know the sinks would
    silently drop those too: the capability is its own, refused by name."""
    layer = windowed_layer("causal", window_sinks=2)
    q, k, v, _ = make_inputs(1, 8, 8, False)
    call = dispatch.call_of(q, k, v, layer)
    assert call.sinks == 2
    blind = dataclasses.replace(REGISTRY["sdpa"].capabilities, sinks=False)
    assert "cannot keep the attention sinks (--alibi-window-sinks)" in blind.refusal("x", call)
    assert call._replace(sinks=0) == dispatch.call_of(q, k, v, windowed_layer("causal"))


def test_the_plan_prices_the_sinks_and_keeps_the_groups():
    """Sinks are a small pass merged into the window's softmax: the groups run as without them."""
    slopes = variant_slopes(8, "causal")
    windows = variant_windows(slopes, 8.0, "causal")
    plain = windowed.plan(windows, "causal", 4096, 4096)
    sunk = windowed.plan(windows, "causal", 4096, 4096, sinks=4)
    assert {group.kind for group in plain} == {"chunks"}
    assert [g.kind for g in sunk] == [g.kind for g in plain]
    assert all(group.sinks == 4 for group in sunk)
    assert dispatch.windowed_cost(windows, "symmetric", 4096, sinks=4) > \
        dispatch.windowed_cost(windows, "symmetric", 4096)


# ------------------------------------------------------------------ the KV cache


def full_with_sinks(attn, alibi, x, sinks, kpm=None):
    """The float64 reference of the whole sequence with the layer's cutoff and ``sinks``."""
    slopes, _ = alibi.slopes_of(1)
    bias = reference_windowed_bias("causal", slopes.detach().tolist(), None, x.size(0),
                                   alibi.window_cutoff, sinks=sinks)
    return reference_module_attention(attn, x, bias, kpm)


def held(attn, state):
    """``(window keys, sink keys)`` the cache holds."""
    saved = attn._get_input_buffer(state)
    sunk = saved.get("sink_key")
    return saved["prev_key"].size(2), 0 if sunk is None else sunk.size(2)


@pytest.mark.parametrize("backend,sinks", [("auto", 4), ("sdpa", 4), ("naive", 4),
                                           ("windowed", 4), ("windowed", 1)])
def test_step_by_step_decoding_keeps_the_sinks_and_stays_bounded(backend, sinks):
    attn, alibi = attention(backend, window_sinks=sinks)
    torch.manual_seed(1)
    x = torch.randn(STREAM, 2, DIM, dtype=torch.float64)
    decoder = Decoder(attn)
    most = 0
    with torch.no_grad():
        steps = []
        for t in range(STREAM):
            steps.append(decoder.run(x, t, t + 1))
            most = max(most, sum(held(attn, decoder.state)))
    torch.testing.assert_close(torch.cat(steps), full_with_sinks(attn, alibi, x, sinks),
                               **(NAIVE_TOL if backend == "naive" else TOL))
    assert most == bound(alibi) + sinks
    assert held(attn, decoder.state) == (bound(alibi), sinks)
    # the sinks count: the windowed model without them differs
    plain, _ = attention(backend)
    with torch.no_grad():
        assert not torch.allclose(Decoder(plain).run(x, 0, STREAM, step=STREAM)[-1],
                                  torch.cat(steps)[-1], atol=1e-4)


@pytest.mark.parametrize("backend,apart", [("sdpa", True), ("naive", False),
                                            ("windowed", True)])
def test_the_sinks_stay_apart_from_the_window_where_the_backend_can(backend, apart, monkeypatch):
    """Once the cache keeps its sinks apart, a step that ``sdpa`` or ``windowed`` serves reads
    the two parts as they are (joining them copied the whole cache at every step and layer);
    the other backends read them joined, into a scratch buffer the layer reuses; every step
    equals the full forward."""
    from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention

    joined = []
    real = AlibiMultiheadAttention._joined
    monkeypatch.setattr(AlibiMultiheadAttention, "_joined",
                        lambda self, *args: joined.append(1) or real(self, *args))
    attn, alibi = attention(backend, window_sinks=4)
    torch.manual_seed(9)
    x = torch.randn(STREAM, 2, DIM, dtype=torch.float64)
    decoder = Decoder(attn)
    with torch.no_grad():
        steps = decoder.run(x, 0, STREAM)
        scratch = dict(attn._scratch)
    torch.testing.assert_close(steps, full_with_sinks(attn, alibi, x, 4),
                               **(NAIVE_TOL if backend == "naive" else TOL))
    assert held(attn, decoder.state)[1] == 4  # the sinks were kept apart
    assert (not joined) == apart and (not scratch) == apart
    if not apart:  # one buffer of the joined shape, reused by every later step
        assert scratch["key"].shape == (2, attn.num_heads, 4 + bound(alibi) + 1,
                                        DIM // attn.num_heads)


def sinks_last_steps(monkeypatch):
    """``(viewed, attn, alibi, x)``: an ``sdpa`` layer with 4 sinks and its float64 inputs, and
    the list that records what each step's :func:`sinks_after_window` gives (``None``: the
    window and sinks not in one buffer)."""
    from fairseq_alibi.modules import alibi_multihead_attention as layer

    viewed = []
    joins = layer.sinks_after_window
    monkeypatch.setattr(layer, "sinks_after_window",
                        lambda *a: viewed.append(joins(*a)) or viewed[-1])
    attn, alibi = attention("sdpa", window_sinks=4)
    torch.manual_seed(6)
    return viewed, attn, alibi, torch.randn(STREAM, 2, DIM, dtype=torch.float64)


def test_an_sdpa_step_reads_its_window_and_sinks_in_one_call_on_the_cache(monkeypatch):
    """Once the sinks are apart, an ``sdpa`` step writes them after the window in the window's
    own buffer and reads both in one fused call: its keys are the cache's storage (no copy of
    the window), the window's and the 4 sinks', and every step equals the full forward."""
    from fairseq_alibi.modules.attention import dense

    read = []
    fused = dense.F.scaled_dot_product_attention
    monkeypatch.setattr(dense.F, "scaled_dot_product_attention",
                        lambda q, k, *a, **kw: read.append(k) or fused(q, k, *a, **kw))
    viewed, attn, alibi, x = sinks_last_steps(monkeypatch)
    decoder = Decoder(attn)
    with torch.no_grad():
        steps = decoder.run(x, 0, STREAM)
    torch.testing.assert_close(steps, full_with_sinks(attn, alibi, x, 4), **TOL)
    room = attn._get_input_buffer(decoder.state)["key_room"]
    last = read[-1]
    assert last.size(2) == 4 + bound(alibi) + 1  # the step's window, then the sinks
    assert last.untyped_storage().data_ptr() == room.untyped_storage().data_ptr()
    # every step since the sinks went apart (past 4 + 64 keys) read them so
    assert len(viewed) >= STREAM - 80 and all(x is not None for x in viewed)


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 6e-2), (torch.float16, 2e-2)])
def test_a_half_precision_step_reads_the_sinks_after_the_window(monkeypatch, dtype, tol):
    """In half precision too, a step against a cache that dropped keys reads its window and its
    sinks as one view of the buffer (``dense.sinks_last``, the bias and padding reordered) and
    stays within half precision's rounding of the float64 full forward, finite, with the
    sinks' true bias: the model without sinks lies further off than that."""
    viewed, attn, alibi, x = sinks_last_steps(monkeypatch)
    expected = full_with_sinks(attn, alibi, x, 4)
    plain, _ = attention("sdpa")
    with torch.no_grad():
        steps = Decoder(attn.to(dtype)).run(x.to(dtype), 0, STREAM).double()
        without = Decoder(plain.to(dtype)).run(x.to(dtype), 0, STREAM).double()
    assert bool(torch.isfinite(steps).all())
    torch.testing.assert_close(steps, expected, atol=tol, rtol=tol)
    assert (without - expected).abs().max() > 5 * (steps - expected).abs().max()
    assert len(viewed) >= STREAM - 80 and all(x is not None for x in viewed)


@pytest.mark.parametrize("backend", ["sdpa", "windowed"])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5),
                                       (torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
def test_sinks_read_apart_give_sdpas_result_on_the_joined_keys(backend, dtype, tol):
    """``dense.sinks_apart`` and ``windowed.sinks_apart`` (each head group reads the sinks and
    its window only) against ``sdpa`` on ``cat([sinks, window])``, after the cache dropped
    keys, with a padded key and a row of padding only (finite, in half precision too: its
    scores are float32)."""
    from fairseq_alibi.modules.attention import dense, dispatch
    from fairseq_alibi.modules.bias import SinkCacheBias

    call = SinkCacheBias(AlibiBias(8, window_cutoff=0.5, window_sinks=4).layer(0), 10)
    torch.manual_seed(4)
    q = torch.randn(3, 8, 2, 16).to(dtype)
    # windows of 1 ... 64 keys: past 130 keys every head skips some; past 20, two read them all
    for length in (130, 20):
        sink_k, sink_v, k, v = (torch.randn(3, 8, n, 16).to(dtype)
                                for n in (4, 4, length, length))
        padding = torch.zeros(3, 4 + length, dtype=torch.bool)
        padding[0, 5], padding[2] = True, True
        apart = dispatch.SINKS_APART[backend](q, (sink_k, sink_v), k, v, call, padding, 0.25)
        joined = dense.sdpa(q, torch.cat([sink_k, k], 2), torch.cat([sink_v, v], 2), call,
                            padding, None, 0.0, 0.25)
        assert apart.dtype == dtype and bool(torch.isfinite(apart).all())
        torch.testing.assert_close(apart[:2].double(), joined[:2].double(), atol=tol, rtol=tol)


def test_windowed_steps_read_the_sinks_after_the_window_before_the_cache_drops_keys(
        monkeypatch):
    """Before the cache drops a key its sinks are its first keys, and a head group whose
    window starts after them read them with its window as a copy (``index_select``); now every
    ``windowed`` step past the sinks writes them after the window in the buffer and reads one
    view (``last``), before the split as after it (the bias a ``SinkCacheBias`` of 0 dropped
    keys, then of those dropped), and every step equals the float64 full forward."""
    calls = []
    few = windowed.few_queries
    monkeypatch.setattr(windowed, "few_queries", lambda q, k, v, alibi, *a, **kw: calls.append(
        (k.size(2), getattr(alibi, "dropped", 0), kw.get("last", 0))) or few(q, k, v, alibi,
                                                                            *a, **kw))
    attn, alibi = attention("windowed", window_sinks=4)
    torch.manual_seed(3)
    x = torch.randn(STREAM, 2, DIM, dtype=torch.float64)
    with torch.no_grad():
        steps = Decoder(attn).run(x, 0, STREAM)
    torch.testing.assert_close(steps, full_with_sinks(attn, alibi, x, 4), **TOL)
    past_the_sinks = [call for call in calls if call[0] > 4]
    assert past_the_sinks and all(last == 4 for _, _, last in past_the_sinks)
    before = [keys for keys, dropped, _ in past_the_sinks if not dropped]
    assert before and max(before) == bound(alibi) + 1 + 4  # the step's window, the sinks


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("length,biased", [(130, 8), (20, 6)])
def test_windowed_reads_each_groups_window_and_the_sinks_after_it_as_one_view(
        monkeypatch, dtype, tol, length, biased):
    """Where the cache holds its sinks after its window in one buffer (a step without
    gradients), ``windowed`` reads each head group's keys as one view of it, the window's
    tail the group reaches and the sinks (joining them copied the window at every step):
    the result of ``sdpa`` on ``cat([sinks, window])``, with a padded key and a row of
    padding only. Windows of 1 … 64 keys: past 130 keys every head skips some; in 20, most
    read them all, as do 2 unbiased heads (unbounded)."""
    from fairseq_alibi.alibi import sinks_to_end
    from fairseq_alibi.modules.attention import dense
    from fairseq_alibi.modules.bias import SinkCacheBias

    stack = AlibiBias(8, window_cutoff=0.5, window_sinks=4, heads=biased)
    call = SinkCacheBias(stack.layer(0), 10)
    torch.manual_seed(5)
    q = torch.randn(3, 8, 1, 16, dtype=dtype)
    room_k, room_v = (torch.randn(3, 8, 200, 16, dtype=dtype) for _ in range(2))
    end = 30 + length + 4
    k, v = room_k[:, :, 30:end], room_v[:, :, 30:end]  # the window's keys, then the 4 sinks
    padding = torch.zeros(3, 4 + length, dtype=torch.bool)
    padding[0, 5], padding[2] = True, True
    read = []
    fused = windowed.F.scaled_dot_product_attention
    monkeypatch.setattr(windowed.F, "scaled_dot_product_attention", lambda q_, k_, *a, **kw: (
        read.append((k_.data_ptr() - room_k.data_ptr()) // k_.element_size() % room_k.stride(1)
                    // room_k.stride(2) + k_.size(2)  # where the view ends in the buffer
                    if k_.untyped_storage().data_ptr() == room_k.untyped_storage().data_ptr()
                    else None) or fused(q_, k_, *a, **kw)))
    with torch.no_grad():
        found = windowed.sinks_last(q, k, v, call.with_sinks_last(), sinks_to_end(padding, 4),
                                    0.25, 4)
    assert len(read) > 1 and set(read) == {end}  # every group: a view ending with the sinks
    joined = dense.sdpa(q, torch.cat([k[:, :, length:], k[:, :, :length]], 2),
                        torch.cat([v[:, :, length:], v[:, :, :length]], 2), call, padding,
                        None, 0.0, 0.25)
    torch.testing.assert_close(found[:2], joined[:2], atol=tol, rtol=tol)
    assert bool(torch.isfinite(found).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_a_decoding_steps_row_with_sinks_is_the_definition_bit_for_bit(dtype):
    """The row of one query against a KV cache (a view of one table, the sinks' true bias put
    back in a copy) equals :func:`windowed_alibi_bias` of the cache's kept positions, exactly:
    with unbiased heads too, before the cache drops a key and after it dropped ``d`` (the
    sinks then lie ``d`` positions further back than the table's distance); the same with the
    sinks after the window, as an ``sdpa`` step reads the cache (``sinks_last``)."""
    from fairseq_alibi.alibi import sinks_to_end, windowed_alibi_bias

    for heads, partial, sinks in ((8, None, 4), (6, 2, 1)):
        alibi = AlibiBias(heads, window_cutoff=0.25, window_sinks=sinks, heads=partial)
        slopes = alibi.slopes_of()[0]
        for key_len in (2, 5, 17, 300):
            for dropped in ((0,) if key_len <= sinks else (0, 1, 7, 100)):
                expected = windowed_alibi_bias(slopes, 1, key_len, "causal", None, dtype, 0,
                                               0.25, sinks, dropped)
                found = alibi.bias(1, key_len, dtype, dropped=dropped)
                assert torch.equal(found, expected), (heads, key_len, dropped)
                if dropped:
                    last = alibi.bias(1, key_len, dtype, dropped=dropped, sinks_last=True)
                    assert torch.equal(last, sinks_to_end(expected, sinks)), (heads, dropped)


def test_a_chunks_bias_with_the_sinks_last_is_kept_apart_from_its_plain_bias():
    """The bias of a few queries against a cache that has dropped no key, in the order
    ``windowed`` reads it (``sinks_last``), is memoised beside the plain one, not for it."""
    from fairseq_alibi.alibi import sinks_to_end

    stack = AlibiBias(8, window_cutoff=0.5, window_sinks=4)
    plain = stack.bias(5, 40)
    assert torch.equal(stack.bias(5, 40, sinks_last=True), sinks_to_end(plain, 4))
    assert torch.equal(stack.bias(5, 40), plain)


@pytest.mark.parametrize("backend", ["auto", "windowed"])
@pytest.mark.parametrize("step", [5, 17])
def test_a_prompt_then_chunks_keep_the_sinks(backend, step):
    attn, alibi = attention(backend, window_sinks=4)
    torch.manual_seed(2)
    x = torch.randn(STREAM, 2, DIM, dtype=torch.float64)
    decoder = Decoder(attn)
    with torch.no_grad():
        out = torch.cat([decoder.run(x, 0, 100, step=100), decoder.run(x, 100, STREAM, step=step)])
    torch.testing.assert_close(out, full_with_sinks(attn, alibi, x, 4), **TOL)
    assert held(attn, decoder.state) == (bound(alibi), 4)


@pytest.mark.parametrize("backend", ["auto", "sdpa", "windowed"])
def test_a_beam_reorder_and_left_padding_keep_each_rows_sinks(backend):
    attn, alibi = attention(backend, window_sinks=4)
    torch.manual_seed(3)
    x = torch.randn(STREAM, 3, DIM, dtype=torch.float64)
    kpm = torch.arange(STREAM)[None, :] < torch.tensor([0, 2, 30])[:, None]
    order = torch.tensor([2, 2, 0])
    decoder = Decoder(attn)
    with torch.no_grad():
        decoder.run(x, 0, 40, kpm, step=40)
        decoder.run(x, 40, 110, kpm)
        decoder.reorder(order)
        after = decoder.run(x[:, order], 110, STREAM, kpm[order])
    real = ~kpm[order].t()[110:, :, None]
    want = full_with_sinks(attn, alibi, x[:, order], 4, kpm[order])[110:]
    torch.testing.assert_close(after * real, want * real, **TOL)
    saved = attn._get_input_buffer(decoder.state)
    assert saved["prev_key_padding_mask"].shape == (3, bound(alibi) + 4)
    assert torch.equal(saved["prev_key_padding_mask"][:, :4], kpm[order][:, :4])


def test_flex_refuses_a_cache_that_dropped_the_keys_after_its_sinks():
    attn, _ = attention("flex", window_sinks=2)
    x = torch.randn(80, 1, DIM, dtype=torch.float64)
    decoder = Decoder(attn)
    with torch.no_grad():
        decoder.run(x, 0, 79, step=79)  # a prompt: the cache keeps the sinks and the window
        with pytest.raises(ValueError, match="flex cannot read a KV cache that kept its "
                                             "attention sinks"):
            decoder.run(x, 79, 80)


def test_without_a_cutoff_sinks_change_nothing():
    layer = AlibiBias(4, window_sinks=4).layer(0)
    assert layer.sinks == 0 and not layer.windowed
    plain = AlibiBias(4).layer(0)
    assert torch.equal(layer.dense(5, 20), plain.dense(5, 20))


def test_the_benchmarks_sinks_table_smoke_run():
    from benchmarks import windows as bench

    body = bench.main(["--quick", "--lengths", "64", "--tables", "sinks"])
    assert "| S=4 ÷ S=0 |" in body and "| 64 | fwd+bwd |" in body
