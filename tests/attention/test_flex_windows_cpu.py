"""``flex`` with slope windows on the CPU (the eager path): the windowed call computed exactly,
against the float64 definition, and the per-head block mask skipping the blocks beyond each
head's window. (The compiled CUDA path and its backward: tests/cuda/test_flex_windows.py.)"""

import pytest
import torch

from fairseq_alibi.alibi import VARIANTS
from fairseq_alibi.modules.attention import dispatch, flex, tuning
from fairseq_alibi.modules.bias import AlibiBias
from tests.helpers.flex_windows import (
    CASES, HEADS, make_inputs, windowed_layer, windowed_reference)

pytestmark = pytest.mark.skipif(not flex.available(), reason="this torch has no flex_attention")

@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_flex_computes_the_windowed_definition_on_the_cpu(variant, case):
    batch, query_len, key_len, padded, heads_with_bias = CASES[case]
    if heads_with_bias and variant == "one_sided":
        pytest.skip("one_sided takes no --alibi-heads")
    layer = windowed_layer(variant, heads_with_bias)
    q, k, v, kpm = make_inputs(batch, query_len, key_len, padded)
    with torch.no_grad():
        got = dispatch.attend("flex", q, k, v, layer, key_padding_mask=kpm)
    want, rows = windowed_reference(q, k, v, layer, kpm)
    assert rows.sum() > 0
    torch.testing.assert_close(got.double()[rows], want[rows], atol=2e-5, rtol=1e-4)
    # the windows drop something here: the plain bias would not pass
    plain = AlibiBias(HEADS, variant=variant).layer(0)
    with torch.no_grad():
        dense = dispatch.attend("flex", q, k, v, plain, key_padding_mask=kpm)
    assert not torch.allclose(dense.double()[rows], want[rows], atol=1e-3)


def test_flex_windowed_training_on_the_cpu_is_the_one_refusal():
    layer = windowed_layer("causal")
    q, k, v, _ = make_inputs(1, 8, 8, False)
    q.requires_grad_()
    call = dispatch.call_of(q, k, v, layer)
    assert call.windowed and dispatch.serves("flex", call._replace(grad=False))
    with pytest.raises(ValueError, match="flex cannot serve this call: flex has no CPU backward"):
        dispatch.attend("flex", q, k, v, layer)


def test_the_block_mask_is_per_head_and_skips_the_blocks_beyond_each_window():
    """Causal, 8 heads, T = 2: windows 4, 8, …, 512 keys back; at 1024 keys in blocks of 128,
    head 0 reads at most 2 key blocks per query block (its own and the one before), the last
    head (window 512) at most 6, and no head a block above the diagonal."""
    layer = windowed_layer("causal")
    windows = layer.windows()
    assert list(windows[0]) == [4, 8, 16, 32, 64, 128, 256, 512]
    mask = flex._window_block_mask(tuple(tuple(side) for side in windows), 1024, 1024, "cpu")
    # kv_num_blocks (B, H, query blocks) plus the partial ones
    counts = mask.kv_num_blocks + mask.full_kv_num_blocks
    assert counts.shape == (1, HEADS, 8)
    assert counts[0, 0].max() <= 2 and counts[0, -1].max() <= 6
    assert (counts[0, :, 0] == 1).all()  # the first query block: only its own (causal)
    assert counts[0, 0].sum() < counts[0, -1].sum()
    again = flex._window_block_mask(tuple(tuple(side) for side in windows), 1024, 1024, "cpu")
    assert again is mask  # cached per windows and lengths


def test_auto_picks_flex_for_a_windowed_call_only_compiled_on_cuda(monkeypatch):
    """Never on the CPU; on CUDA from tuning.FLEX_MASKS_MIN_LENGTH keys on, where triton can
    compile it (whether this machine has triton or not)."""
    layer = windowed_layer("causal")
    for compilable in (False, True):
        monkeypatch.setattr(flex, "compilable", lambda: compilable)
        for device, dtype in (("cpu", torch.float32), ("cuda", torch.bfloat16)):
            for length in (64, 4096, 8192):
                call = dispatch.Call(device, dtype, "causal", length, length, heads=HEADS,
                                     windowed=True, windows=layer.windows())
                assert dispatch.serves("flex", call)
                picked = (compilable and device == "cuda"
                          and length >= tuning.FLEX_MASKS_MIN_LENGTH)
                assert (dispatch.auto_backend(call) == "flex") == picked, call
