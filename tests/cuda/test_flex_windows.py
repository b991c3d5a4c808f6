"""``flex`` with slope windows on CUDA (skipped without a GPU): the compiled kernel with the
per-head block mask, against the float64 windowed definition on the CPU, every variant, left
padding, partial heads, forward and backward (the input gradients); the eager decoding step.

Packed rows of documents too (the block plan's per-row mask, compiled), and ``auto`` taking
flex for long packed rows with windows. Run on the device with
``python -m pytest tests/cuda/test_flex_windows.py``.
"""

import pytest
import torch

from fairseq_alibi.alibi import VARIANTS
from fairseq_alibi.modules.attention import dispatch, flex
from tests.helpers.flex_windows import (
    CASES, make_inputs, windowed_layer, windowed_reference)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or not flex.available(),
                                reason="needs a CUDA GPU and flex_attention")

#: ‖got - ref‖ / ‖ref‖ allowed, as tests/cuda/test_cuda.py: float32 as the CPU tests, bf16 4
#: machine epsilons
REL_TOL = {torch.float32: 1e-4, torch.bfloat16: 4 * 2**-7}


@pytest.fixture(autouse=True)
def many_flex_graphs():
    """Every variant, case and dtype compiles a graph of its own: more than dynamo's default
    recompile limit (8), past which it would silently run flex eagerly."""
    import torch._dynamo

    with torch._dynamo.config.patch(recompile_limit=256, accumulated_recompile_limit=4096):
        yield


def relative_error(got, want, rows):
    got, want = got.detach().double().cpu()[rows], want[rows]
    return float((got - want).norm() / want.norm())


@pytest.mark.parametrize("dtype", REL_TOL, ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_flex_windows_forward_and_backward_match_the_definition(variant, case, dtype):
    batch, query_len, key_len, padded, heads_with_bias = CASES[case]
    if heads_with_bias and variant == "one_sided":
        pytest.skip("one_sided takes no --alibi-heads")
    layer = windowed_layer(variant, heads_with_bias, device="cuda")
    q, k, v, kpm = make_inputs(batch, query_len, key_len, padded, "cuda", dtype)
    # the reference from the same values, rounded to the dtype under test
    want, rows = windowed_reference(q, k, v, layer, kpm)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    got = dispatch.attend("flex", *leaves, layer, key_padding_mask=kpm)
    assert relative_error(got, want, rows) < REL_TOL[dtype]

    # backward: the gradients of q, k, v for an output gradient on the rows with a visible key
    grad = torch.randn(want.shape, dtype=torch.float64).masked_fill(~rows[..., None], 0)
    ref_leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    ref_out, _ = windowed_reference(*ref_leaves, layer, kpm)
    ref_grads = torch.autograd.grad(ref_out, ref_leaves, grad)
    grads = torch.autograd.grad(got, leaves, grad.to("cuda", dtype))
    for name, g, r in zip("qkv", grads, ref_grads):
        assert float((g.double().cpu() - r).norm() / r.norm()) < 4 * REL_TOL[dtype], name


def test_flex_windows_skip_blocks_on_cuda():
    """The block mask on the GPU is the one built on the CPU: per head, the key blocks in reach
    only (tests/attention/test_flex_windows_cpu.py checks the counts)."""
    windows = windowed_layer("symmetric", device="cuda").windows()
    key = tuple(tuple(side) for side in windows)
    on_gpu = flex._window_block_mask(key, 1024, 1024, torch.device("cuda"))
    on_cpu = flex._window_block_mask(key, 1024, 1024, "cpu")
    for name in ("kv_num_blocks", "full_kv_num_blocks"):
        assert torch.equal(getattr(on_gpu, name).cpu(), getattr(on_cpu, name))
    counts = on_gpu.kv_num_blocks + on_gpu.full_kv_num_blocks
    assert counts[0, 0].max() <= 3 < counts.shape[-1]


@pytest.mark.parametrize("dtype", REL_TOL, ids=["fp32", "bf16"])
@pytest.mark.parametrize("cutoff,sinks", [(0.0, 0), (1.0, 0), (1.0, 2)])
@pytest.mark.parametrize("variant", ["causal", "symmetric"])
def test_flex_documents_forward_and_backward_match_the_definition(variant, cutoff, sinks,
                                                                  dtype):
    """Packed rows of documents over several blocks of 128 (the block plan's per-row mask,
    compiled), with and without windows and sinks, against the float64 definition."""
    check_documents("flex", [[130, 40, 200, 30], [400]], variant, cutoff, sinks, dtype)


def test_auto_runs_long_packed_rows_with_windows_on_flex():
    """A packed row of 4,096 keys in bf16 with windows, sinks and documents: ``auto`` takes
    flex (the documents masked in its block plan, not split), exact as the definition."""
    L = 4096
    call = check_documents("auto", [[1500, 900, L - 2400]], "causal", 1.0, 2, torch.bfloat16)
    q = torch.zeros(1, 4, L, 16, device="cuda", dtype=torch.bfloat16)
    judged = dispatch.call_of(q, q, q, call)
    assert dispatch.resolve("auto", judged) == "flex"
    assert not dispatch.splits_documents("auto", judged)


def check_documents(backend, lengths, variant, cutoff, sinks, dtype):
    """``backend``'s output and input gradients on rows of documents of ``lengths`` against
    the float64 definition; returns the call's bias."""
    from fairseq_alibi.modules.attention import attend
    from fairseq_alibi.modules.bias import AlibiBias
    from tests.helpers.documents import EOS, packed_tokens
    from tests.helpers.references import reference_document_attention

    tokens = packed_tokens(lengths)
    B, L = tokens.shape
    bias = AlibiBias(4, variant=variant, window_cutoff=cutoff, document_mask="eos",
                     window_sinks=sinks).to("cuda")
    bias.read_tokens(tokens.cuda(), EOS)
    call = bias.layer(0).for_call(None, B, L, L, False)
    torch.manual_seed(0)
    ref_leaves = [torch.randn(B, 4, L, 16, dtype=torch.float64).requires_grad_()
                  for _ in "qkv"]
    leaves = [t.detach().to("cuda", dtype).requires_grad_() for t in ref_leaves]
    slopes, future = (None if x is None else x.double().cpu() for x in call.head_slopes())
    want = reference_document_attention(*ref_leaves, call.documents.ids.cpu(), variant, slopes,
                                        future, cutoff, sinks=sinks)
    got = attend(backend, *leaves, call)
    rows = torch.ones(B, 4, L, dtype=torch.bool)
    assert relative_error(got, want.detach(), rows) < REL_TOL[dtype]
    grad = torch.randn(want.shape, dtype=torch.float64)
    ref_grads = torch.autograd.grad(want, ref_leaves, grad)
    grads = torch.autograd.grad(got, leaves, grad.to("cuda", dtype))
    for name, g, r in zip("qkv", grads, ref_grads):
        assert float((g.double().cpu() - r).norm() / r.norm()) < 4 * REL_TOL[dtype], name
    return call
