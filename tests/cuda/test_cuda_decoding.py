"""Cached decoding with slope windows, attention sinks and document masks on CUDA (skipped
without a GPU): a layer decoding two packed rows token by token and in chunks through ``auto``
and ``sdpa`` (float32 on the GPU) keeps each row's current document's sinks in a bounded cache
and equals the float64 full forward of the definition on the CPU. The rolling cache hands the
CUDA kernels rows cut from the sinks kept apart and the window (the kind of row that once
faulted with a misaligned address). Run on the device with ``python -m pytest tests/cuda``."""

import pytest
import torch

from tests.helpers.document_sinks import SINKS, STREAM, decode, full, layer, stream
from tests.helpers.rolling_cache import bound

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

#: float32 on the GPU against float64; a key dropped or kept wrongly moves an output by far more
#: (the windows' weights are ``e^-0.25`` and up)
TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("step", [1, 17])
@pytest.mark.parametrize("backend", ["auto", "sdpa"])
def test_windowed_decoding_keeps_each_documents_sinks_on_cuda(backend, step, device="cuda"):
    attn, alibi = layer(backend)
    tokens, x = stream()
    with torch.no_grad():
        want = full(attn, alibi, tokens, x)  # float64, on the CPU, before the move
        without = full(attn, alibi, tokens, x, sinks=0)
        attn, alibi = attn.to(device, torch.float32), alibi.to(device)
        got, most = decode(attn, alibi, tokens.to(device), x.to(device, torch.float32), {}, 0,
                           STREAM, step=step)
    got = got.double().cpu()
    torch.testing.assert_close(got, want, **TOL)
    assert most <= bound(alibi) + SINKS + step - 1
    # the sinks count: row 0's document of positions 20 … 119 reads its first keys at the end
    assert not torch.allclose(without[119, 0], got[119, 0], **TOL)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 6e-2)])
@pytest.mark.parametrize("backend", ["auto", "sdpa"])
def test_windowed_decoding_reads_the_sinks_after_the_window_on_cuda(monkeypatch, backend,
                                                                    dtype, tol, device="cuda"):
    """Sinks without documents: once the cache drops keys, each step writes its 4 sinks after
    the window in the window's buffer and reads both as one view (``dense.sinks_last``, every
    step past the drop); every step equals the float64 full forward, the cache stays at
    ``max_h W_h + 4`` keys."""
    from fairseq_alibi.modules.attention import dense, dispatch
    from tests.helpers.references import reference_module_attention, reference_windowed_bias
    from tests.helpers.rolling_cache import Decoder, attention

    viewed = []
    monkeypatch.setitem(dispatch.SINKS_LAST, "sdpa",
                        lambda q, k, *a: viewed.append(k.size(2)) or dense.sinks_last(q, k, *a))
    attn, alibi = attention(backend, window_sinks=4)
    x = torch.randn(STREAM, 2, attn.embed_dim, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(6))
    slopes, _ = alibi.slopes_of(1)
    bias = reference_windowed_bias("causal", slopes.detach().tolist(), None, STREAM,
                                   alibi.window_cutoff, sinks=4)
    want = reference_module_attention(attn, x, bias)
    attn, alibi = attn.to(device, dtype), alibi.to(device)
    decoder = Decoder(attn)
    with torch.no_grad():
        got = decoder.run(x.to(device, dtype), 0, STREAM).double().cpu()
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    saved = attn._get_input_buffer(decoder.state)
    assert (saved["prev_key"].size(2), saved["sink_key"].size(2)) == (bound(alibi), 4)
    # every step from the drop (past 4 + max_h W_h keys) read one view: window, then sinks
    assert len(viewed) >= STREAM - bound(alibi) - 5 and set(viewed) == {bound(alibi) + 1 + 4}
