"""Attention sinks with document masks (``--alibi-window-sinks S`` with
``--alibi-document-mask``): the sinks are the first ``S`` positions of each document. Against
the float64 definition (each document its own windowed sequence with sinks,
:func:`tests.helpers.references.reference_document_attention`): the bias of
``alibi.document_alibi_bias`` (every backend, forward and backward, is
tests/attention/test_document_masks.py's, with sinks); cached decoding, token by token with left padding and a beam reorder, and a prompt
then chunks, keeps each row's current document's sinks in a bounded cache and equals the full
forward."""

import pytest
import torch

from fairseq_alibi.alibi import (VARIANTS, alibi_bias_between, document_alibi_bias, document_ids,
                                 document_mask, document_offsets, document_starts, masked_with,
                                 variant_windows)
from fairseq_alibi.modules.attention import dispatch
from fairseq_alibi.modules.attention.dispatch import CachedDocuments
from tests.helpers.document_sinks import SINKS, STREAM, decode, full, layer, stream
from tests.helpers.documents import CUTOFF, EOS, LENGTHS, packed_tokens
from tests.helpers.references import MASKED, reference_document_bias
from tests.helpers.rolling_cache import NAIVE_TOL, TOL, bound
from tests.helpers.slope_windows import TOL64, head_slopes


def test_offsets_count_from_each_documents_first_position_and_go_on_from_a_cache():
    eos = torch.tensor([[0, 0, 1, 0, 0, 1, 1, 0]], dtype=torch.bool)
    starts = document_starts(eos, "eos")
    assert document_offsets(starts).tolist() == [[0, 1, 0, 1, 2, 0, 0, 1]]
    head = document_offsets(starts[:, :4])
    tail = document_offsets(starts[:, 4:], head[:, -1:])
    assert torch.cat([head, tail], 1).tolist() == document_offsets(starts).tolist()
    steps = [document_offsets(starts[:, :1])]  # a position at a time, as decoding steps
    for t in range(1, starts.size(1)):
        steps.append(document_offsets(starts[:, t:t + 1], steps[-1]))
    assert torch.cat(steps, 1).tolist() == document_offsets(starts).tolist()


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_definition_keeps_each_documents_first_keys(variant):
    tokens = packed_tokens(LENGTHS)
    eos = tokens.eq(EOS)
    ids = document_ids(eos, "eos")
    slopes, future = head_slopes(variant)
    got = document_alibi_bias(slopes, ids, document_offsets(document_starts(eos, "eos")),
                              ids.size(1), variant, future, torch.float64,
                              variant_windows(slopes, CUTOFF, variant, future), SINKS)
    want = reference_document_bias(variant, slopes.double(), None if future is None
                                   else future.double(), ids, CUTOFF, SINKS)
    assert torch.equal(got > MASKED, want > MASKED)
    torch.testing.assert_close(got[got > MASKED], want[want > MASKED], **TOL64)
    if variant == "causal":  # the last query of the 24-token document sees its first two keys
        start = sum(LENGTHS[0][:3])
        assert (got[0, 0, -1, start:start + SINKS] > MASKED).all()
        assert (got[0, 0, -1, start + SINKS:start + 12] == got.min()).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("windowed", [True, False])
def test_a_decoding_steps_bias_is_the_general_builders_bit_for_bit(dtype, windowed):
    """One causal query (a decoding step) takes a shorter way to the same numbers: keys of a
    cache's sink slots (of no document, ``-1``, or of an earlier one) before its window,
    offsets out of order, keys beyond a window or after the query, every bit equal to the
    general builder's."""
    slopes, _ = head_slopes("causal")
    windows = variant_windows(slopes, CUTOFF, "causal") if windowed else None
    generator = torch.Generator().manual_seed(0)
    window = torch.randint(0, 3, (3, 300), generator=generator).sort(dim=1).values + 1
    offsets = torch.randint(0, 400, (3, 300), generator=generator).sort(dim=1).values
    slots = torch.tensor([[-1, 3, 3, 3], [1, 1, 1, 1], [3, -1, 3, -1]])[:, :SINKS]
    ids = torch.cat([slots, window], 1)
    offsets = torch.cat([torch.arange(SINKS).expand(3, -1), offsets], 1)
    ids[:, -2], offsets[:, -2] = ids[:, -1], offsets[:, -1] + 5  # after the query: causal
    got = document_alibi_bias(slopes, ids, offsets, 1, "causal", None, dtype, windows, SINKS)
    general = alibi_bias_between(slopes, offsets[:, -1:], offsets, "causal", None, dtype,
                                 windows=windows, sinks=SINKS)
    want = masked_with(general, document_mask(ids, 1), dtype)
    assert got.shape == want.shape == (3, 4, 1, SINKS + 300) and got.dtype == dtype
    assert torch.equal(got, want)
    kept = got > MASKED
    assert kept[:, :, :, :SINKS].any() and kept[:, :, :, SINKS:].any() and not kept.all()


# ------------------------------------------------------------------ the KV cache

@pytest.mark.parametrize("backend", ["auto", "sdpa", "naive"])
def test_step_by_step_decoding_keeps_the_current_documents_sinks(backend):
    attn, alibi = layer(backend)
    tokens, x = stream()
    with torch.no_grad():
        steps, most = decode(attn, alibi, tokens, x, {}, 0, STREAM)
        want = full(attn, alibi, tokens, x)
    torch.testing.assert_close(steps, want, **(TOL if backend != "naive" else NAIVE_TOL))
    assert most == bound(alibi) + SINKS
    # the sinks count: row 0's document of positions 20 … 119 reads its first keys at the end
    without = full(attn, alibi, tokens, x, sinks=0)
    assert not torch.allclose(without[119, 0], steps[119, 0], atol=1e-4)


@pytest.mark.parametrize("step", [5, 17])
def test_a_prompt_then_chunks_keep_the_current_documents_sinks(step):
    attn, alibi = layer("auto")
    tokens, x = stream(seed=1)
    state = {}
    with torch.no_grad():
        prompt, _ = decode(attn, alibi, tokens, x, state, 0, 100, step=100)
        rest, most = decode(attn, alibi, tokens, x, state, 100, STREAM, step=step)
        want = full(attn, alibi, tokens, x)
    torch.testing.assert_close(torch.cat([prompt, rest]), want, **TOL)
    assert most <= bound(alibi) + SINKS + step


def test_a_beam_reorder_and_left_padding_keep_each_rows_document_sinks():
    attn, alibi = layer("auto")
    tokens, x = stream(rows=3, seed=2)
    kpm = torch.arange(STREAM)[None, :] < torch.tensor([0, 2, 30])[:, None]
    order = torch.tensor([2, 2, 0])
    state = {}
    with torch.no_grad():
        decode(attn, alibi, tokens, x, state, 0, 40, step=40, kpm=kpm)
        decode(attn, alibi, tokens, x, state, 40, 110, kpm=kpm)
        attn.reorder_incremental_state(state, order)
        after, _ = decode(attn, alibi, tokens[order], x[:, order], state, 110, STREAM,
                          kpm=kpm[order])
        want = full(attn, alibi, tokens[order], x[:, order], kpm[order])[110:]
    real = ~kpm[order].t()[110:, :, None]
    torch.testing.assert_close(after * real, want * real, **TOL)
    saved = attn._get_input_buffer(state)
    assert saved["prev_document_ids"].shape == (3, bound(alibi) + SINKS)


def prompted(backend, length):
    """``(attn, alibi, tokens, x, state)``: a layer whose cache read a prompt of ``length``
    positions of one row (past the cache's reach: the document's sinks apart)."""
    attn, alibi = layer(backend)
    tokens, x = stream(rows=1)
    state = {}
    with torch.no_grad():
        decode(attn, alibi, tokens, x, state, 0, length, step=length)
    return attn, alibi, tokens, x, state


def test_flex_refuses_a_cache_that_holds_its_documents_sinks_apart():
    attn, alibi, tokens, x, state = prompted("flex", 79)
    with torch.no_grad(), pytest.raises(ValueError, match="flex cannot read a KV cache that "
                                                          "kept its attention sinks"):
        decode(attn, alibi, tokens, x, state, 79, 80)


def test_calls_against_a_cache_go_to_a_backend_that_masks_documents():
    attn, alibi, tokens, _, state = prompted("auto", 100)
    alibi.read_tokens(tokens[:, :101], EOS)
    saved = attn._get_input_buffer(state)
    cached = CachedDocuments(saved["prev_document_ids"], saved["prev_document_eos"],
                             saved["prev_document_offsets"])
    step = alibi.layer(1).for_call(None, 1, 1, cached.ids.size(1) + 1, True,
                                   cached_documents=cached, dropped=SINKS)
    q = torch.randn(1, 4, 1, 8)
    k = torch.randn(1, 4, cached.ids.size(1) + 1, 8)
    call = dispatch.call_of(q, k, k, step)
    assert call.documents and call.sink_cache and dispatch.auto_backend(call) == "sdpa"
