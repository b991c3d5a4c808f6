"""The bias protocol and the backends' declared capabilities.

* The attention module reads its bias through ``AttentionBias`` only: a bias object that
  implements nothing but the protocol (no stack behind it) runs on every backend that serves
  the call and computes the float64 reference, whole sequences and KV-cache steps alike.
* Each backend's ``CAPABILITIES`` (declared once, beside it) say exactly what it computes: a
  call it declares served matches the float64 definition (output, and the query gradient where
  it trains); a call it declares refused is the dispatch's one error, with the reason from the
  declaration and the backends that serve it.
"""

import dataclasses
import itertools

import pytest
import torch

from fairseq_alibi.alibi import VARIANTS, alibi_bias, variant_slopes
from fairseq_alibi.error_hints import OneLineError
from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention
from fairseq_alibi.modules.attention import (REGISTRY, Call, dense, dispatch, flash, flex, fold,
                                             windowed)
from fairseq_alibi.modules.attention.capabilities import Capabilities
from fairseq_alibi.modules.cross_position import RowBias
from tests.helpers.references import (MASKED, reference_module_attention,
                                      reference_windowed_bias)

HEADS, DIM = 4, 32
CPU_BACKENDS = [name for name in REGISTRY if name != "flash"]


class ProtocolOnlyBias:
    """The ``AttentionBias`` and ``DistanceBias`` protocols and nothing else: no stack, no
    cache, no option object. Records what each call asked of it."""

    kind, global_tokens, scales_need_grad, windowed = "distance", 0, False, False

    def __init__(self, variant, heads):
        self.variant, self.num_heads = variant, heads
        self.slopes = variant_slopes(heads, variant) * 0.7
        self.future = self.slopes * 0.5 if variant == "asymmetric" else None
        self.asked = []

    def for_call(self, key_padding_mask, batch, query_len, key_len, incremental):
        self.asked.append((batch, query_len, key_len, incremental))
        return self

    def head_slopes(self):
        return self.slopes, self.future

    def windows(self):
        return None

    def dense(self, query_len, key_len, dtype):
        return alibi_bias(self.slopes, query_len, key_len, self.variant, self.future, dtype)


def _module(bias, backend):
    torch.manual_seed(0)
    attn = AlibiMultiheadAttention(DIM, HEADS, bias, attention=backend).eval()
    for p in attn.parameters():  # every term away from zero
        torch.nn.init.normal_(p, std=0.3)
    return attn


@pytest.mark.parametrize("backend", CPU_BACKENDS + ["auto"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("padded", [False, True])
def test_a_bias_of_the_protocol_alone_runs_on_every_backend_that_serves_it(backend, variant,
                                                                          padded):
    bias = ProtocolOnlyBias(variant, HEADS)
    attn = _module(bias, backend)
    T, B = 7, 3
    x = torch.randn(T, B, DIM)
    kpm = torch.arange(T)[None, :] >= torch.tensor([7, 5, 4])[:, None] if padded else None
    call = Call("cpu", torch.float32, variant, T, T, B, HEADS, padded=padded)
    if backend != "auto" and not dispatch.serves(backend, call):
        with pytest.raises(ValueError, match=f"{backend} cannot serve this call"):
            attn(x, x, x, key_padding_mask=kpm, need_weights=False)
        return
    with torch.no_grad():
        out, _ = attn(x, x, x, key_padding_mask=kpm, need_weights=False)
    future = None if bias.future is None else bias.future.tolist()
    want = reference_module_attention(attn, x, reference_windowed_bias(
        variant, bias.slopes.tolist(), future, T, 0.0), kpm)
    real = ~kpm.t()[..., None] if padded else torch.ones(T, B, 1, dtype=torch.bool)
    torch.testing.assert_close(out.double() * real, want * real, atol=2e-5, rtol=1e-4)
    assert bias.asked == [(B, T, T, False)]  # one question per call, nothing else read


@pytest.mark.parametrize("backend", ["sdpa", "naive", "flex", "auto"])
def test_decoding_steps_ask_the_protocol_with_the_cache(backend):
    """Cached decoding with a protocol-only bias equals the full forward; each step's call
    says it is incremental."""
    bias = ProtocolOnlyBias("causal", HEADS)
    attn = _module(bias, backend)
    T, B = 6, 2
    x = torch.randn(T, B, DIM)
    state = {}
    with torch.no_grad():
        full, _ = attn(x, x, x, need_weights=False)
        steps = [attn(x[t:t + 1], x[t:t + 1], x[t:t + 1], incremental_state=state,
                      need_weights=False)[0] for t in range(T)]
    torch.testing.assert_close(torch.cat(steps), full, atol=2e-5, rtol=1e-4)
    assert bias.asked[1:] == [(B, 1, t + 1, True) for t in range(T)]


# ------------------------------------------------------------------ capabilities vs numbers


def _reference(q, k, v, bias, scale, key_padding_mask, attn_mask):
    """float64 ``softmax(q·kᵀ·scale + bias + masks)·v``; ``bias`` (1 or B, H, T, S)."""
    q, k, v = (t.double() for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) * scale + bias.double()
    if attn_mask is not None:
        scores = scores.masked_fill(attn_mask, MASKED)
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], MASKED)
    return torch.softmax(scores, -1) @ v


def _seen(bias, key_padding_mask, attn_mask):
    """``(B, H, T, 1)``: the queries that see at least one key (the others' output is
    unspecified: every backend keeps it finite, each its own way)."""
    visible = bias > MASKED / 2
    if attn_mask is not None:
        visible = visible & ~attn_mask
    if key_padding_mask is not None:
        visible = visible & ~key_padding_mask[:, None, None, :]
    return visible.any(-1, keepdim=True)


def _distance_bias(variant, global_tokens, S, T, cutoff=0.0):
    from fairseq_alibi.modules.bias import AlibiBias

    alibi = AlibiBias(HEADS, variant=variant, global_tokens=global_tokens,
                      future_slope_ratio=0.5 if variant == "asymmetric" else 1.0,
                      window_cutoff=cutoff)
    slopes, future = alibi.slopes_of()
    full = reference_windowed_bias(variant, slopes.tolist(),
                                   None if future is None else future.tolist(), S, cutoff,
                                   global_tokens)
    return alibi.layer(0), full[None, :, S - T:, :]


#: (variant, global tokens, (queries, keys), padded, extra mask, grad, dtype, window cutoff):
#: every limit a CPU backend declares is crossed (kind "rows": the next test); cutoff 0.1
#: (slopes 1/4 … 1/256: windows 1, 2, 7, 26 keys; one_sided 1/16, 1/256: 2, 26) drops keys of 6
GRID = list(itertools.product(
    VARIANTS, [0, 2], [(6, 6), (2, 6)], [False, True], [False, True], [False, True],
    [torch.float32, torch.float64, torch.bfloat16], [0.0, 0.1]))


def _run_or_refuse(name, call, run):
    """``run()`` if backend ``name`` declares it serves ``call``, else the one refusal."""
    reason = dispatch.unsupported(name, call)
    if reason is None:
        return run()
    with pytest.raises(OneLineError) as raised:  # a command prints its line alone
        dispatch.resolve(name, call)
    message = str(raised.value)
    assert message.startswith(f"--alibi-attention {name} cannot serve this call: {reason}. ")
    serving = [other for other in REGISTRY if dispatch.serves(other, call)]
    assert f"(or {' or '.join(serving)})" in message and name not in serving
    return None


#: flex runs eagerly on the CPU (slow): its float32 share of the grid; what it declares of the
#: other dtypes is the same code path (the float64 reference is the same for every dtype)
FLEX_GRID = [case for case in GRID if case[6] == torch.float32]


@pytest.mark.parametrize("name,grid", [
    *[pytest.param(name, GRID, id=name) for name in CPU_BACKENDS if name != "flex"],
    pytest.param("flex", FLEX_GRID, id="flex")])
def test_each_backend_computes_what_its_capabilities_declare(name, grid):
    torch.manual_seed(0)
    served = 0
    B, D = 2, 8
    for variant, global_tokens, (T, S), padded, masked, grad, dtype, cutoff in grid:
        q, k, v = (torch.randn(B, HEADS, n, D, dtype=torch.float64) for n in (T, S, S))
        kpm = None
        if padded:
            kpm = torch.zeros(B, S, dtype=torch.bool)
            kpm[0, :2] = True  # the first row left-padded, as fairseq pads a prompt
        attn_mask = torch.rand(T, S) < 0.3 if masked else None
        alibi, full = _distance_bias(variant, global_tokens, S, T, cutoff)
        call = Call("cpu", dtype, variant, T, S, B, HEADS, padded, masked, 0.0, grad,
                    global_tokens=global_tokens, windowed=cutoff > 0)
        qs, ks, vs = (t.to(dtype).requires_grad_(grad) for t in (q.clone(), k.clone(), v.clone()))
        out = _run_or_refuse(name, call, lambda: REGISTRY[name].run(
            qs, ks, vs, alibi, kpm, attn_mask, 0.0, D**-0.5))
        if out is None:
            continue
        served += 1
        want_q = q.clone().requires_grad_(grad)
        want = _reference(want_q, k, v, full, D**-0.5, kpm, attn_mask)
        seen = _seen(full, kpm, attn_mask)
        tol = dict(atol=3e-2, rtol=3e-2) if dtype == torch.bfloat16 else \
            dict(atol=2e-5, rtol=1e-4)
        case = (variant, global_tokens, T, S, padded, masked, grad, dtype, cutoff)
        out, want = (torch.where(seen, x.double(), 0.0) for x in (out, want))
        torch.testing.assert_close(out, want, **tol, msg=lambda m: f"{case}: {m}")
        if grad:
            out.pow(2).sum().backward()
            want.pow(2).sum().backward()
            torch.testing.assert_close(torch.where(seen, qs.grad.double(), 0.0),
                                       torch.where(seen, want_q.grad, 0.0), **tol,
                                       msg=lambda m: f"{case} grad: {m}")
    assert served  # every CPU backend serves part of the grid


@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_a_per_row_bias_goes_to_the_backends_that_declare_rows(name):
    B, T, S, D = 2, 3, 5, 8
    torch.manual_seed(1)
    q, k, v = (torch.randn(B, HEADS, n, D) for n in (T, S, S))
    rows = torch.randn(B, HEADS, T, S)
    bias = RowBias(rows, HEADS, q.device)
    assert bias.for_call(None, B, T, S, False) is bias  # built for one call: its own answer
    call = Call("cpu", torch.float32, None, T, S, B, HEADS, kind="rows")
    out = _run_or_refuse(name, call,
                         lambda: REGISTRY[name].run(q, k, v, bias, None, None, 0.0, D**-0.5))
    assert (out is not None) == ("rows" in REGISTRY[name].capabilities.kinds)
    if out is not None:
        torch.testing.assert_close(out.double(), _reference(q, k, v, rows, D**-0.5, None, None),
                                   atol=1e-5, rtol=1e-4)


def test_each_backend_declares_its_capabilities_once_beside_it():
    assert {name: backend.capabilities for name, backend in REGISTRY.items()} == {
        "fold": fold.CAPABILITIES, "sdpa": dense.CAPABILITIES, "flex": flex.CAPABILITIES,
        "flash": flash.CAPABILITIES, "naive": dense.CAPABILITIES,
        "windowed": windowed.CAPABILITIES}
    for module in (fold, dense, flex, flash, windowed):  # no refusal of their own
        assert not hasattr(module, "unsupported")


def test_a_limit_declared_is_refused_by_the_dispatch_in_its_one_place(monkeypatch):
    """Declaring a limit is all it takes: the module's call is refused with the reason, and
    auto goes elsewhere."""
    attn = _module(ProtocolOnlyBias("causal", HEADS), "naive").train()
    attn.dropout_module.p = 0.1
    x = torch.randn(5, 2, DIM)
    attn(x, x, x, need_weights=False)  # naive serves dropout
    limited = dataclasses.replace(REGISTRY["naive"],
                                  capabilities=Capabilities(kinds=("distance", "rows"),
                                                            dropout=False))
    monkeypatch.setitem(REGISTRY, "naive", limited)
    with pytest.raises(ValueError, match=r"--alibi-attention naive cannot serve this call: naive "
                                         r"has no attention dropout\. Use --alibi-attention auto "
                                         r"\(or sdpa\)"):
        attn(x, x, x, need_weights=False)
    call = Call("cpu", torch.float32, "causal", 5, 5, dropout_p=0.1)
    assert dispatch.unsupported("naive", call) == "naive has no attention dropout"
    assert dispatch.auto_backend(call) == "sdpa"


def test_refusals_name_the_limit_in_words():
    one_sided = Call("cuda", torch.float16, "one_sided", 8, 8)
    reasons = {
        ("fold", Call("cuda", torch.float32, "causal", 8, 8)): "fold runs on CPU only",
        ("fold", Call("cpu", torch.float16, "causal", 8, 8)):
            "fold needs float32 or float64 inputs, got torch.float16",
        ("fold", Call("cpu", torch.float32, "causal", 8, 8, kind="rows")):
            "fold takes no dense bias of its own per batch row",
        ("flex", Call("cpu", torch.float32, "causal", 8, 8, global_tokens=1)):
            "global tokens (--alibi-global-tokens) are not part of flex's bias",
        ("flex", Call("cpu", torch.float32, "causal", 8, 8, dropout_p=0.1)):
            "flex has no attention dropout",
        ("fold", Call("cpu", torch.float32, "causal", 8, 8, attn_mask=True)):
            "fold takes no extra attn_mask",
    }
    for (name, call), reason in reasons.items():
        assert dispatch.unsupported(name, call).startswith(reason), (name, call)
    assert dispatch.unsupported("flash", one_sided).startswith(
        "flash implements causal and symmetric only, not one_sided")
    if not flash.installed():  # what the installation lacks: after the call's own limits
        assert dispatch.unsupported("flash", one_sided._replace(variant="causal")) == \
            "the flash_attn package is not installed"
