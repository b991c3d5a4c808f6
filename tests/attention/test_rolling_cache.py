"""Decoding in bounded memory: with slope windows a causal layer's KV cache
keeps only the last ``max_h W_h`` keys (:func:`~fairseq_alibi.modules.attention.windowed.
decoding_reach`), in a buffer that rolls, and still equals the full forward with the same
cutoff (float64 reference of the windowed definition): step by step and in chunks, long enough
that the buffer rolls several times, through beam reorders, left-padded prompts, a shared
prefix and autograd; the cache and its buffer never outgrow the bound. Heads without a bias,
global tokens, other variants and no cutoff keep every key, as before. The ``windowed``
backend's decoding step reads only each head group's window."""

import pytest
import torch

from fairseq_alibi.modules.attention import Call, dispatch, tuning, windowed
from fairseq_alibi.modules.attention.windowed import decoding_reach
from fairseq_alibi.modules.bias import AlibiBias
from tests.helpers.references import reference_windowed_bias
from tests.helpers.rolling_cache import (CUTOFF, DIM, HEADS, LENGTH, NAIVE_TOL, TOL, Decoder,
                                         attention, bound, full)

CASES = {  # name -> (AlibiBias options, whether the cache is bounded)
    "plain": ({}, True),
    "learned scales": (dict(learned_scales="per_layer_head"), True),
    "slope scale 2": (dict(slope_scale=2.0), True),
    "2 of 4 heads": (dict(heads=2), False),  # the unbiased heads see every key
    "1 global token": (dict(global_tokens=1), False),  # the first key stays visible
}
BACKENDS = ["auto", "sdpa", "naive", "windowed"]


def test_the_reach_is_the_largest_back_window_of_a_bounded_causal_call():
    _, alibi = attention("auto")
    assert decoding_reach(alibi.layer(1)) == bound(alibi) == 64
    _, scaled = attention("auto", slope_scale=2.0)
    assert decoding_reach(scaled.layer(1)) == 32
    for options in (dict(heads=2), dict(global_tokens=1), dict(variant="symmetric"),
                    dict(cutoff=0.0)):
        _, other = attention("auto", **options)
        assert decoding_reach(other.layer(1)) is None, options


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES)
def test_step_by_step_decoding_equals_the_full_forward_and_stays_bounded(backend, case):
    options, bounded = CASES[case]
    attn, alibi = attention(backend, **options)
    torch.manual_seed(1)
    x = torch.randn(LENGTH, 2, DIM, dtype=torch.float64)
    decoder = Decoder(attn)
    with torch.no_grad():
        steps = decoder.run(x, 0, LENGTH)
    torch.testing.assert_close(steps, full(attn, alibi, x),
                               **(NAIVE_TOL if backend == "naive" else TOL))
    reach = bound(alibi)
    if not bounded:
        assert decoder.lengths == list(range(1, LENGTH + 1))  # every key kept, as before
        return
    assert decoder.lengths == [min(t + 1, reach) for t in range(LENGTH)]
    # the buffer: one size from its first roll on, about 2·reach; it rolled several times
    rooms = decoder.rooms[2 * reach:]
    assert len(set(rooms)) == 1 and rooms[0] <= 2 * reach + 16 + 1
    assert LENGTH // (rooms[0] - reach) >= 3


@pytest.mark.parametrize("backend", ["auto", "windowed"])
@pytest.mark.parametrize("step", [5, 17])
def test_a_prompt_then_chunks_of_queries_equal_the_full_forward(backend, step):
    """Multi-token calls against the cache (a prompt, chunks): trimmed after each call."""
    attn, alibi = attention(backend)
    torch.manual_seed(2)
    x = torch.randn(LENGTH, 2, DIM, dtype=torch.float64)
    decoder = Decoder(attn)
    with torch.no_grad():
        out = torch.cat([decoder.run(x, 0, 100, step=100), decoder.run(x, 100, LENGTH, step=step)])
    torch.testing.assert_close(out, full(attn, alibi, x), **TOL)
    assert max(decoder.lengths) == bound(alibi)


@pytest.mark.parametrize("backend", ["auto", "windowed"])
def test_a_beam_reorder_midway_equals_the_reordered_full_forward(backend):
    attn, alibi = attention(backend)
    torch.manual_seed(3)
    x = torch.randn(LENGTH, 3, DIM, dtype=torch.float64)
    order = torch.tensor([2, 2, 0])
    decoder = Decoder(attn)
    with torch.no_grad():
        decoder.run(x, 0, 150)
        decoder.reorder(order)
        decoder.reorder(torch.arange(3))  # the identity: skipped
        after = decoder.run(x[:, order], 150, LENGTH)
    torch.testing.assert_close(after, full(attn, alibi, x[:, order])[150:], **TOL)
    assert max(decoder.lengths) == bound(alibi)


@pytest.mark.parametrize("backend", ["auto", "windowed", "sdpa"])
def test_left_padded_prompts_equal_the_full_forward(backend):
    """fairseq pads prompts on the left: the padding mask is trimmed with the keys."""
    attn, alibi = attention(backend)
    torch.manual_seed(4)
    x = torch.randn(LENGTH, 3, DIM, dtype=torch.float64)
    kpm = torch.arange(LENGTH)[None, :] < torch.tensor([0, 5, 30])[:, None]
    decoder = Decoder(attn)
    with torch.no_grad():
        out = torch.cat([decoder.run(x, 0, 40, kpm, step=40), decoder.run(x, 40, LENGTH, kpm)])
    real = ~kpm.t()[..., None]
    torch.testing.assert_close(out * real, full(attn, alibi, x, kpm) * real, **TOL)
    saved = attn._get_input_buffer(decoder.state)
    assert saved["prev_key_padding_mask"].shape == (3, bound(alibi))


@pytest.mark.parametrize("backend,sinks", [("auto", 0), ("sdpa", 4)])
def test_two_continuations_of_a_shared_prefix_do_not_overwrite_each_other(backend, sinks):
    """A shallow copy of the state shares the prefix's buffers; both roll independently, with
    attention sinks too (written after the window in the shared buffer at every step)."""
    attn, alibi = attention(backend, window_sinks=sinks)
    torch.manual_seed(5)
    x = torch.randn(LENGTH, 2, DIM, dtype=torch.float64)
    other = x.clone()
    other[100:] = torch.randn(LENGTH - 100, 2, DIM, dtype=torch.float64)
    first = Decoder(attn)
    with torch.no_grad():
        first.run(x, 0, 100)
        assert (attn._get_input_buffer(first.state).get("sink_key") is None) == (not sinks)
        second = Decoder(attn)
        second.state = {key: dict(value) for key, value in first.state.items()}
        outs, others = [], []
        for t in range(100, LENGTH):  # interleaved, as a tree search would
            outs.append(first.run(x, t, t + 1))
            others.append(second.run(other, t, t + 1))
    torch.testing.assert_close(torch.cat(outs), full(attn, alibi, x)[100:], **TOL)
    torch.testing.assert_close(torch.cat(others), full(attn, alibi, other)[100:], **TOL)


@pytest.mark.parametrize("backend,sinks", [("auto", 0), ("sdpa", 4), ("windowed", 4)])
def test_cached_decoding_while_autograd_records_is_bounded_and_exact(backend, sinks):
    """With attention sinks too: a step that autograd records reads them apart from the
    window (the buffer is not written in place)."""
    attn, alibi = attention(backend, window_sinks=sinks)
    torch.manual_seed(6)
    x = torch.randn(150, 2, DIM, dtype=torch.float64)
    decoder = Decoder(attn)
    steps = decoder.run(x, 0, 150)
    steps.sum().backward()
    with torch.no_grad():
        torch.testing.assert_close(steps, full(attn, alibi, x), **TOL)
    assert max(decoder.lengths) == bound(alibi) + sinks


def test_without_a_cutoff_the_cache_keeps_every_key_from_the_front_of_its_buffer():
    attn, _ = attention("auto", cutoff=0.0)
    x = torch.randn(100, 2, DIM, dtype=torch.float64)
    decoder = Decoder(attn)
    with torch.no_grad():
        decoder.run(x, 0, 100)
    saved = attn._get_input_buffer(decoder.state)
    assert decoder.lengths == list(range(1, 101))
    assert saved["prev_key"].data_ptr() == saved["key_room"].data_ptr()


def test_a_window_wider_than_the_generation_allocates_what_no_window_does():
    """A bound the cache never reaches (here 4,096 positions, 300 generated) grows the buffer
    as without a cutoff: it had allocated ``reach`` spare positions at the first step (a
    cutoff of 1,000 nats took 4 GiB per layer for a beam search of 60 tokens)."""
    x = torch.randn(LENGTH, 2, DIM, dtype=torch.float64)
    rooms = {}
    for cutoff in (0.0, 16.0):
        attn, alibi = attention("auto", cutoff=cutoff)
        decoder = Decoder(attn)
        with torch.no_grad():
            decoder.run(x, 0, LENGTH)
        rooms[cutoff] = decoder.rooms
    assert bound(alibi) == 4096 and rooms[16.0] == rooms[0.0]
    assert max(r for r in rooms[16.0] if r) <= LENGTH + LENGTH // 4 + 16


def test_the_windowed_decoding_step_reads_only_each_groups_window(monkeypatch):
    """T = 1 against S cached keys: head group ``h`` reads ``back_h + 1`` keys, not S (one
    kernel call per group and sequence)."""
    attn, alibi = attention("windowed", cutoff=0.0)  # no trimming: the cache holds S keys
    read = []

    def recording(call):  # scaled_dot_product_attention, or the fold's kernel (the chunks')
        def record(q, k, v, *args, **kwargs):
            read.append(k.size(-2))
            return call(q, k, v, *args, **kwargs)
        return record

    S, D = 200, DIM // HEADS
    q = torch.randn(2, HEADS, 1, D)
    k, v = torch.randn(2, HEADS, S, D), torch.randn(2, HEADS, S, D)
    slopes = alibi.slopes_of(1)[0]
    windows = ([1, 4, 16, 64], [0] * HEADS)
    monkeypatch.setattr(windowed.F, "scaled_dot_product_attention",
                        recording(windowed.F.scaled_dot_product_attention))
    monkeypatch.setattr(windowed.fold, "kernel_forward", recording(windowed.fold.kernel_forward))
    out = windowed.attention(q, k, v, slopes, None, "causal", windows)
    assert read == [2, 2, 5, 5, 17, 17, 65, 65]  # each group, each of the 2 sequences
    monkeypatch.undo()
    bias = reference_windowed_bias("causal", slopes.tolist(), None, S, CUTOFF)[:, -1:]
    scores = (q.double() @ k.double().transpose(-1, -2)) * D**-0.5 + bias
    want = torch.softmax(scores, -1) @ v.double()
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("padded", [False, True])
def test_few_queries_against_a_cache_read_only_each_groups_window(monkeypatch, padded):
    """The ``windowed`` backend's decoding step (``few_queries``): group ``h`` reads
    ``back_h + T`` keys; it equals the dense windowed definition, key padding included."""
    attn, alibi = attention("windowed")
    read = []
    sdpa = windowed.F.scaled_dot_product_attention

    def recording(q, k, v, **kwargs):
        read.append(k.size(-2))
        return sdpa(q, k, v, **kwargs)

    S, T, D = 200, 3, DIM // HEADS
    torch.manual_seed(8)
    q = torch.randn(2, HEADS, T, D, dtype=torch.float64)
    k, v = (torch.randn(2, HEADS, S, D, dtype=torch.float64) for _ in range(2))
    kpm = (torch.arange(S)[None, :] < torch.tensor([0, 150])[:, None]) if padded else None
    call = alibi.layer(1)
    monkeypatch.setattr(windowed.F, "scaled_dot_product_attention", recording)
    out = windowed.run(q, k, v, call, kpm, None, 0.0, D**-0.5)
    assert read == [1 + T, 4 + T, 16 + T, 64 + T]
    monkeypatch.undo()
    bias = reference_windowed_bias("causal", alibi.slopes_of(1)[0].tolist(), None, S,
                                   CUTOFF)[:, -T:]
    scores = (q @ k.transpose(-1, -2)) * D**-0.5 + bias
    if padded:
        scores = scores.masked_fill(kpm[:, None, None, :], -1e9)
    torch.testing.assert_close(out, torch.softmax(scores, -1) @ v, **TOL)


def test_auto_sends_decoding_steps_to_windowed_where_their_windows_skip_enough_keys(monkeypatch):
    """``auto``'s rule for a decoding step (docs/decoding.md, "Decoding step"): ``windowed``
    where the keys the windows skip over the batch, times ``√D``, reach the tuned threshold;
    the keys counted are exactly those :func:`.windowed.few_queries` does not read."""
    windows = AlibiBias(8, window_cutoff=8.0).layer(0).windows()  # 16, 32, ..., 2048
    step = Call("cpu", torch.float32, "causal", 1, 4097, 1, 8, windowed=True, windows=windows,
                head_dim=64)
    # every window but none reaches past the cache: 8·4096 - (16 + 32 + ... + 2048) keys
    assert dispatch.step_skipped_keys(step) == 8 * 4096 - 4080
    assert dispatch.step_skipped_keys(step._replace(batch=3)) == 3 * (8 * 4096 - 4080)
    assert dispatch.step_skipped_keys(step._replace(sinks=4)) == 8 * 4096 - 4080 - 8 * 4
    assert dispatch.step_skipped_keys(step._replace(windows=None)) == 0
    assert dispatch.auto_backend(step) == "windowed"  # 0.36x sdpa's time
    # a long generation's rolling cache at its bound: windowed's step 0.88x sdpa's end to end
    assert dispatch.auto_backend(step._replace(key_len=2049)) == "windowed"
    assert dispatch.auto_backend(step._replace(key_len=2049, head_dim=16)) == "sdpa"  # 1.58x
    # many short rows (8 prompts x beam 5, 129 keys): sdpa's one call was faster (1.39x at D=16)
    short = step._replace(batch=40, key_len=129, head_dim=16)
    assert dispatch.auto_backend(short) == "sdpa"
    needed = tuning.WINDOWED_STEP_MIN_SKIPPED / 16**0.5
    assert dispatch.step_skipped_keys(short) < needed <= dispatch.step_skipped_keys(
        short._replace(key_len=1025))
    assert dispatch.auto_backend(short._replace(key_len=1025)) == "windowed"
    for call in (step._replace(query_len=tuning.FEW_QUERIES + 1),
                 step._replace(global_tokens=1), step._replace(dtype=torch.bfloat16),
                 step._replace(dropout_p=0.1), step._replace(windowed=False, windows=None)):
        assert dispatch.auto_backend(call) != "windowed", call

    # through the module: auto's decoding steps run few_queries and equal the full forward
    monkeypatch.setattr(tuning, "WINDOWED_STEP_MIN_SKIPPED", 0)
    ran = []
    original = windowed.few_queries
    monkeypatch.setattr(windowed, "few_queries", lambda *a: ran.append(1) or original(*a))
    attn, alibi = attention("auto")
    torch.manual_seed(9)
    x = torch.randn(150, 2, DIM, dtype=torch.float64)
    with torch.no_grad():
        steps = Decoder(attn).run(x, 0, 150)
    assert len(ran) == 149  # every step but the first (no cache yet)
    torch.testing.assert_close(steps, full(attn, alibi, x), **TOL)


@pytest.mark.parametrize("variant", ["causal", "symmetric", "offset"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_a_decoding_steps_windowed_row_from_the_table_is_the_dense_definition(variant, dtype):
    """The hot path of a step (``BiasCache.last_query_row``) with windows: the last column of
    ``windowed_alibi_bias`` exactly, at every key length (the table grows past 1024), and after
    the cutoff changes."""
    from fairseq_alibi.alibi import windowed_alibi_bias

    alibi = AlibiBias(HEADS, variant=variant, window_cutoff=CUTOFF)
    for cutoff in (CUTOFF, 2.0, 0.0):
        alibi.window_cutoff = cutoff
        slopes = alibi.slopes_of()[0]
        for key_len in (1, 5, 64, 65, 300, 1500):
            row = alibi(1, key_len, dtype)
            want = windowed_alibi_bias(slopes, 1, key_len, variant, None, dtype, 0, cutoff)
            assert torch.equal(row, want), (cutoff, key_len)
