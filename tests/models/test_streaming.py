"""Streaming a causal ALiBi LM (fairseq_alibi/modules/streaming.py): chunks of one text through
ordinary forward calls, every attention keeping the keys before, give the per-token
log-probabilities of one forward pass over the whole text (with or without slope windows), and
only causal ALiBi models stream."""

import pytest
import torch

from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention
from fairseq_alibi.modules.streaming import stream_log_probs, stream_states, streamed_attentions
from tests.helpers.building import build_model, decode_token_by_token, write_dictionary

VOCAB = 40


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dictionary(tmp_path_factory.mktemp("stream_dict"), VOCAB)


def lm(data, *extra):
    torch.manual_seed(0)
    model, _ = build_model("lm", data, "--dropout", "0.1", *extra)  # dropout: off in eval()
    return model.double().eval()


def full_log_probs(model, tokens):
    with torch.no_grad():
        return model.get_normalized_probs(model(tokens), log_probs=True)


def tokens_of(length, batch=2, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(4, VOCAB + 4, (batch, length), generator=generator)


# 4 heads: slopes 1/4 ... 1/256; a cutoff of 2 nats gives windows of 8, 32, 128 and 512 keys,
# so the windows drop keys of a 150-token text in three heads
@pytest.mark.parametrize("extra", [(), ("--alibi-window-cutoff", "2"), ("--alibi-heads", "2"),
                                   ("--alibi-window-cutoff", "2", "--alibi-heads", "3")],
                         ids=["dense", "cutoff", "partial-heads", "cutoff-partial-heads"])
def test_streaming_in_chunks_equals_one_forward_pass(data, extra):
    model = lm(data, *extra)
    tokens = tokens_of(150)
    want = full_log_probs(model, tokens)
    with torch.no_grad():
        for chunk in (1, 3, 16, 64, 150, 400):
            got = stream_log_probs(model, tokens, chunk)
            torch.testing.assert_close(got, want, atol=1e-10, rtol=0,
                                       msg=f"chunk {chunk}, {extra}")


def test_long_text_with_windows_streams_as_the_windowed_whole_sequence(data):
    """1100 tokens with a cutoff: the whole sequence runs the ``windowed`` backend (auto, from
    1024 keys), each chunk ``sdpa`` with the dense windowed bias over cache + chunk."""
    model = lm(data, "--alibi-window-cutoff", "2")
    tokens = tokens_of(1100, batch=1)
    with torch.no_grad():
        torch.testing.assert_close(stream_log_probs(model, tokens, 96),
                                   full_log_probs(model, tokens), atol=1e-9, rtol=0)


@pytest.mark.parametrize("backend", ["naive", "windowed", "sdpa"])
def test_named_backends_serve_cached_chunks(data, backend):
    """Each CPU backend that serves a KV cache, named: chunks of several queries against
    cache + chunk keys (the softmax of ``naive`` is float32, hence the tolerance)."""
    model = lm(data, "--alibi-window-cutoff", "2", "--alibi-attention", backend)
    tokens = tokens_of(150)
    want = full_log_probs(model, tokens)
    with torch.no_grad():
        for chunk in (1, 7, 64):
            torch.testing.assert_close(stream_log_probs(model, tokens, chunk), want,
                                       atol=1e-5, rtol=0)


def test_without_the_stream_chunks_lose_their_context_and_the_hooks_are_removed(data):
    model = lm(data)
    tokens = tokens_of(40)
    want = full_log_probs(model, tokens)
    with torch.no_grad():
        with stream_states(model) as state:
            model(tokens[:, :20])
            assert state  # every attention's cache lives in the yielded incremental state
        assert all(not m._forward_pre_hooks for m in model.modules()
                   if isinstance(m, AlibiMultiheadAttention))
        alone = full_log_probs(model, tokens[:, 20:])  # a new text: no earlier keys
        assert (alone - want[:, 20:]).abs().max() > 1e-3
        torch.testing.assert_close(alone[:, :1], full_log_probs(model, tokens[:, 20:21]))


def test_a_callers_own_incremental_state_is_left_alone(data):
    """A generator's decoding step inside the context keeps its own cache (and its slicing)."""
    model = lm(data)
    tokens = tokens_of(24)
    with torch.no_grad():
        want = model.decoder(tokens)[0]
        with stream_states(model) as state:
            stepped = decode_token_by_token(model, tokens)
            assert not state
    torch.testing.assert_close(stepped, want, atol=1e-10, rtol=0)


def test_only_causal_alibi_models_stream(data):
    stock, _ = build_model("lm", data, "--arch", "transformer_lm")
    with pytest.raises(ValueError, match="has no ALiBi self-attention.*causal ALiBi language"):
        streamed_attentions(stock)
    encoder, _ = build_model("encoder", data)
    with pytest.raises(ValueError, match="offset .*streaming scores causal ALiBi"):
        with stream_states(encoder):
            pass
    with pytest.raises(ValueError, match="at least 1 token"):
        stream_log_probs(lm(data), tokens_of(8), 0)
