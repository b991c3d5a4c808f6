"""Every attention backend on CUDA against the float64 CPU reference (skipped without a GPU).

Each backend that runs on CUDA (``naive``, ``sdpa`` with the float bias, compiled ``flex``,
``auto``, and ``flash`` where flash_attn is installed; ``fold`` is CPU-only and refuses) × every
variant × {float32, bfloat16, float16} × {a training step (output and input gradient), the same
with left padding, cached decoding}; the learned slope scales' gradient; one bf16 layer at 8192
tokens whose bias keeps its resolution; flex compiling once per shape, not per call.

The reference is ``tests/helpers/references.reference_scaled_attention`` (float64, on the CPU, from
the same weights and inputs rounded to the dtype under test), so only the computation's own
rounding is measured: ``‖got - ref‖ / ‖ref‖`` must stay under :data:`REL_TOL`, a few units of
rounding of the dtype (the CPU tests' float32 tolerance for float32). A missing or wrong bias costs
far more (checked: :func:`test_the_tolerance_catches_a_missing_bias`). Run on the device with
``python -m pytest tests/cuda/test_cuda.py`` (``python -m benchmarks.gpu`` does, and records it).
"""

import copy
import os

import pytest
import torch

from fairseq_alibi.alibi import alibi_bias, variant_slopes
from fairseq_alibi.modules.bias import AlibiBias
from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention, set_attention_backend
from fairseq_alibi.modules.attention import dispatch, flash
from tests.helpers.references import reference_scaled_attention, scaled_bias

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

VARIANTS = ["causal", "symmetric", "one_sided", "offset", "asymmetric"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: ‖got - ref‖ / ‖ref‖ allowed: 4 machine epsilons of the half types (bf16 2^-7, fp16 2^-10);
#: float32 as the CPU tests (tests/attention/test_attention.py: rtol 1e-4)
REL_TOL = {torch.float32: 1e-4, torch.bfloat16: 4 * 2**-7, torch.float16: 4 * 2**-10}
HEADS, DIM, T, B = 4, 128, 48, 3
LAYERS = 3  # of the bias with learned scales; the attention is its layer 1


def cuda_backends():
    found = ["naive", "sdpa", "flex", "auto"]
    return found + ["flash"] if flash.installed() else found


@pytest.fixture(autouse=True)
def many_flex_graphs():
    """One process compiles flex for every variant, dtype and padding here: more graphs than
    dynamo's default recompile limit (8), past which it would silently run flex eagerly."""
    import torch._dynamo

    with torch._dynamo.config.patch(recompile_limit=256, accumulated_recompile_limit=4096):
        yield


@pytest.fixture(autouse=True)
def a_cuda_fault_ends_the_process():
    """A CUDA fault (a misaligned or illegal address) poisons the process: every later test in
    it would fail with the same error. It is reported at the end of the test that caused it;
    then a pytest-xdist worker exits, and xdist reports that test as crashed and runs the rest
    on a fresh worker; a run without xdist stops there."""
    yield
    try:
        torch.cuda.synchronize()
    except RuntimeError as error:  # (torch.AcceleratorError is a RuntimeError)
        if os.environ.get("PYTEST_XDIST_WORKER"):
            os._exit(3)
        pytest.exit(f"CUDA fault, later tests in this process cannot run: {error}", returncode=1)


def skip_unservable(backend, variant, dtype, **call):
    if backend in ("auto", "naive"):
        return
    c = dispatch.Call("cuda", dtype, variant, call.get("query_len", T), call.get("key_len", T),
                      B, HEADS, padded=call.get("padded", False), grad=call.get("grad", False),
                      scale_grad=call.get("scale_grad", False))
    reason = dispatch.REGISTRY[backend].unsupported(c)
    if reason:
        pytest.skip(reason)


def rel_err(got, want, keep=None):
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    if keep is not None:
        got, want = got * keep, want * keep
    return ((got - want).norm() / want.norm()).item()


def layer(variant, dtype, learned="none", seed=0):
    """``(module on CUDA in dtype, its CPU twin with the same rounded weights, ratio)``."""
    ratio = 0.7 if variant == "asymmetric" else 1.0
    torch.manual_seed(seed)
    if learned == "none":
        alibi = AlibiBias(HEADS, variant=variant, future_slope_ratio=ratio)
    else:
        alibi = scaled_bias(HEADS, LAYERS, variant, learned, ratio=ratio)
    attn = AlibiMultiheadAttention(DIM, HEADS, alibi.layer(1))
    for p in attn.parameters():  # biases away from zero, so that every term counts
        if p.dim() == 1 and p is not getattr(alibi, "scales", None):
            torch.nn.init.normal_(p, std=0.3)
    attn = attn.to(dtype)
    twin = copy.deepcopy(attn).float()  # (its own copy of the bias module, on the CPU)
    alibi.cuda()  # owned by the model, not by the layer: moved on its own
    return attn.cuda(), twin, ratio


def scales_of(cpu_twin, learned):
    alibi = cpu_twin.alibi.stack
    if learned == "none":
        return torch.ones(1, HEADS, dtype=torch.float64)
    return alibi.scales.detach().double().requires_grad_()


def left_padding():
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, :11] = True  # fairseq pads prompts and translation sources on the left
    pad[2, :1] = True
    return pad


@pytest.mark.parametrize("padded", [False, True], ids=["full", "left-padded"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("backend", cuda_backends())
def test_training_step_matches_float64(backend, variant, dtype, padded):
    skip_unservable(backend, variant, dtype, padded=padded, grad=True)
    attn, twin, ratio = layer(variant, dtype)
    set_attention_backend(attn, backend)
    attn.train()  # dropout 0: the training path of every backend, deterministic
    x = torch.randn(T, B, DIM).to(dtype)
    pad = left_padding() if padded else None
    keep = torch.ones(T, B, 1) if pad is None else (~pad.T)[:, :, None].double()
    upstream = torch.randn(T, B, DIM).to(dtype) * keep.to(dtype)

    x_cuda = x.cuda().detach().requires_grad_()
    out, _ = attn(x_cuda, x_cuda, x_cuda, need_weights=False,
                  key_padding_mask=None if pad is None else pad.cuda())
    (out * upstream.cuda()).sum().backward()

    x64 = x.double().requires_grad_()
    want = reference_scaled_attention(twin, x64, scales_of(twin, "none"), 1, variant, ratio, pad)
    (want * upstream.double()).sum().backward()
    assert out.dtype == dtype and torch.isfinite(out).all() and torch.isfinite(x_cuda.grad).all()
    assert rel_err(out, want, keep) < REL_TOL[dtype]
    assert rel_err(x_cuda.grad, x64.grad) < REL_TOL[dtype]


@pytest.mark.parametrize("padded", [False, True], ids=["full", "left-padded"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("backend", cuda_backends())
def test_cached_decoding_matches_float64(backend, dtype, padded):
    """Token by token through the KV cache (a decoding step is a (1, S) query)."""
    skip_unservable(backend, "causal", dtype, query_len=1, key_len=T, padded=padded)
    attn, twin, ratio = layer("causal", dtype)
    set_attention_backend(attn, backend)
    attn.eval()
    x = torch.randn(T, B, DIM).to(dtype)
    pad = left_padding() if padded else None
    keep = torch.ones(T, B, 1) if pad is None else (~pad.T)[:, :, None].double()
    xc = x.cuda()
    state = {}
    with torch.no_grad():
        steps = [attn(xc[t:t + 1], xc[t:t + 1], xc[t:t + 1], incremental_state=state,
                      key_padding_mask=None if pad is None else pad[:, t:t + 1].cuda(),
                      need_weights=False)[0] for t in range(T)]
        want = reference_scaled_attention(twin, x.double(), scales_of(twin, "none"), 1, "causal",
                                          ratio, pad)
    got = torch.cat(steps)
    assert torch.isfinite(got).all()
    assert rel_err(got, want, keep) < REL_TOL[dtype]


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("backend", cuda_backends())
def test_all_padding_rows_stay_finite(backend, dtype):
    """A sequence that is padding throughout, and left padding under causal attention (queries
    whose visible keys are all padding): finite outputs and gradients, never NaN."""
    for variant in VARIANTS:
        if backend not in ("auto", "naive"):
            c = dispatch.Call("cuda", dtype, variant, T, T, B, HEADS, padded=True, grad=True)
            if dispatch.REGISTRY[backend].unsupported(c):
                continue
        attn, _, _ = layer(variant, dtype)
        set_attention_backend(attn, backend)
        pad = left_padding()
        pad[0] = True
        x = torch.randn(T, B, DIM, device="cuda", dtype=dtype, requires_grad=True)
        out, _ = attn(x, x, x, key_padding_mask=pad.cuda(), need_weights=False)
        (g,) = torch.autograd.grad(out.float().sum(), x)
        assert torch.isfinite(out).all() and torch.isfinite(g).all(), variant


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_learned_scale_gradients_match_float64(backend, variant, dtype):
    """The learned slope scales' gradient through the bias (sdpa) and through flex's score_mod
    (its captured slopes), with left padding, against float64."""
    skip_unservable(backend, variant, dtype, padded=True, grad=True, scale_grad=True)
    attn, twin, ratio = layer(variant, dtype, learned="per_layer_head")
    set_attention_backend(attn, backend)
    attn.train()
    x = torch.randn(T, B, DIM).to(dtype)
    pad = left_padding()
    keep = (~pad.T)[:, :, None].double()
    upstream = torch.randn(T, B, DIM).to(dtype) * keep.to(dtype)
    out, _ = attn(*(x.cuda(),) * 3, key_padding_mask=pad.cuda(), need_weights=False)
    (out * upstream.cuda()).sum().backward()
    scales64 = scales_of(twin, "per_layer_head")
    want = reference_scaled_attention(twin, x.double(), scales64, 1, variant, ratio, pad)
    (want * upstream.double()).sum().backward()
    got = attn.alibi.stack.scales.grad
    assert got is not None and torch.isfinite(got).all()
    assert (got[[0, 2]] == 0).all()  # only layer 1's scales take part
    assert rel_err(got[1], scales64.grad[1]) < REL_TOL[dtype] * 4  # a sum over every logit


def test_the_tolerance_catches_a_missing_bias():
    """The bf16 tolerance is well below what halving or dropping the bias costs, so the checks
    above can fail (the row trick at length: test_long_bf16_keeps_the_bias_resolution)."""
    attn, twin, ratio = layer("causal", torch.bfloat16)
    x = torch.randn(T, B, DIM).to(torch.bfloat16)
    with torch.no_grad():
        scales = scales_of(twin, "none")
        want = reference_scaled_attention(twin, x.double(), scales, 1, "causal", ratio)
        half = reference_scaled_attention(twin, x.double(), scales / 2, 1, "causal", ratio)
        none = reference_scaled_attention(twin, x.double(), scales * 0, 1, "causal", ratio)
    assert rel_err(half, want) > 2 * REL_TOL[torch.bfloat16]  # half the slopes
    assert rel_err(none, want) > 4 * REL_TOL[torch.bfloat16]  # no bias (causal mask kept)


LONG = 8192


@pytest.mark.parametrize("variant", ["causal", "symmetric", "offset"])
@pytest.mark.parametrize("backend", [b for b in cuda_backends() if b != "naive"])
def test_long_bf16_keeps_the_bias_resolution(backend, variant):
    """bf16 at 8192 tokens: the last 64 queries (positions 8128…8191) against float64. The
    bias is relative (``-m·(i-j)``, rounded once, exact next to the diagonal; flex adds it to
    float32 scores); the "row trick" ``m·j`` rounded to bf16 at these positions is off by up to
    ``ulp(m·8191)/2`` (16 for m = 1/2) and fails the same check."""
    skip_unservable(backend, variant, torch.bfloat16, query_len=LONG, key_len=LONG, grad=False)
    heads, head_dim = 8, 64
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, LONG, head_dim, device="cuda").bfloat16() for _ in range(3))
    alibi = AlibiBias(heads, variant=variant).cuda()
    with torch.no_grad():
        got = dispatch.attend(backend, q, k, v, alibi.layer(0))[:, :, -64:]
    slopes = variant_slopes(heads, variant).double()
    s = head_dim**-0.5
    qd, kd, vd = (t.double().cpu() for t in (q[:, :, -64:], k, v))
    bias = alibi_bias(slopes, 64, LONG, variant, dtype=torch.float64)  # the last 64 queries
    want = torch.softmax(qd @ kd.transpose(-1, -2) * s + bias, -1) @ vd
    row_trick = slopes[:, None, None] * torch.arange(LONG, dtype=torch.float64)
    row_trick = row_trick.to(torch.bfloat16).double()  # m·j rounded to bf16, softmax-invariant
    if variant == "causal":
        row_trick = row_trick + torch.where(bias < -1e300, float("-inf"), 0.0)  # its mask
        trick = torch.softmax(qd @ kd.transpose(-1, -2) * s + row_trick, -1) @ vd
        assert rel_err(trick, want) > 4 * REL_TOL[torch.bfloat16]
    assert torch.isfinite(got).all()
    assert rel_err(got, want) < REL_TOL[torch.bfloat16]


def test_flex_compiles_once_per_shape_not_per_call():
    """The flex backend builds a new score_mod closure every call: dynamo must reuse the
    compiled kernel (guards on the closure's contents, not its identity)."""
    from torch._dynamo.utils import counters

    attn, _, _ = layer("causal", torch.bfloat16)
    set_attention_backend(attn, "flex")
    x = torch.randn(T, B, DIM, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        attn(x, x, x, need_weights=False)
        before = dict(counters["stats"])
        for _ in range(5):
            attn(x, x, x, need_weights=False)
    assert dict(counters["stats"]).get("unique_graphs", 0) == before.get("unique_graphs", 0)


def test_fold_refuses_cuda_and_auto_never_picks_it_there():
    for dtype in DTYPES.values():
        for variant in VARIANTS:
            call = dispatch.Call("cuda", dtype, variant, 4096, 4096, 4, 8, grad=True)
            assert dispatch.unsupported("fold", call)
            assert dispatch.auto_backend(call) != "fold"


@pytest.mark.skipif(not flash.installed(), reason="needs the flash_attn package")
@pytest.mark.parametrize("variant", ["causal", "symmetric"])
def test_flash_matches_naive(variant):
    torch.manual_seed(0)
    alibi = AlibiBias(4, variant=variant, slope_scale=0.8)
    attn = AlibiMultiheadAttention(64, 4, alibi.layer(0)).eval().cuda().half()
    x = torch.randn(33, 2, 64, device="cuda", dtype=torch.half)
    with torch.no_grad():
        attn.attention_backend = "naive"
        want = attn(x, x, x, need_weights=False)[0]
        attn.attention_backend = "flash"
        got = attn(x, x, x, need_weights=False)[0]
    torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("variant", ["causal", "symmetric"])
def test_learned_scales_serve_inference_and_flash_refuses_training(variant):
    """Learned slope scales (per layer and head) on CUDA: sdpa equals naive at inference, flash
    (fp16) too where installed; training with flash is refused (its slopes take no gradient)."""
    heads, layers, dim = 4, 3, 16
    alibi = scaled_bias(heads, layers, variant, "per_layer_head").cuda()
    attn = AlibiMultiheadAttention(dim, heads, alibi.layer(2), attention="naive").cuda()
    x = torch.randn(9, 2, dim, device="cuda")
    with torch.no_grad():
        expected, _ = attn(x, x, x, need_weights=False)
        attn.attention_backend = "sdpa"
        torch.testing.assert_close(attn(x, x, x, need_weights=False)[0], expected,
                                   atol=2e-5, rtol=1e-4)
        if flash.installed():
            half = copy.deepcopy(attn).half()
            half.attention_backend = "flash"
            got = half(x.half(), x.half(), x.half(), need_weights=False)[0]
            torch.testing.assert_close(got.float(), expected, atol=2e-2, rtol=2e-2)
    call = dispatch.Call("cuda", torch.float16, variant, 9, 9, grad=True, scale_grad=True)
    assert dispatch.unsupported("flash", call)


def test_document_masks_training_table_runs_on_cuda(tmp_path):
    """``python -m benchmarks.documents --tables training --device cuda --precision bf16``: the
    Trainer steps of packed rows with and without document masks, and complete_doc's, run on
    the GPU in bf16 (the command that measures fairseq training with masks there)."""
    import json

    from benchmarks import documents

    records = tmp_path / "documents.json"
    assert documents.main(["--quick", "--tables", "training", "--device", "cuda",
                           "--precision", "bf16", "--work", str(tmp_path),
                           "--json", str(records)]) == 0
    training = json.loads(records.read_text())["training"][0]
    assert all(v > 0 for v in training["useful_tokens_per_second"].values())
