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
