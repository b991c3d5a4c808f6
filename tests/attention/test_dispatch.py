"""The one attention dispatch: ``auto``'s policy as a table, the errors of a named backend that
cannot serve a call, one validation of the name, and the backend saved with a checkpoint
(overridable at load; the ``sdpa`` of checkpoints written before ``fold`` was a backend)."""

import dataclasses
import itertools

import pytest
import torch

from fairseq_alibi.alibi import VARIANTS
from fairseq_alibi.modules.bias import AlibiBias
from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention, set_attention_backend
from fairseq_alibi.modules.attention import (
    ATTENTION_BACKENDS,
    REGISTRY,
    Call,
    auto_backend,
    check_attention_backend,
    dispatch,
    flash,
    flex,
    tuning,
    windowed,
)
from tests.helpers.checkpoints import load
from tests.helpers.cli import run_cli

TOL = dict(atol=2e-5, rtol=1e-4)
MIB = 2**20


@pytest.fixture(params=[False, True], ids=["no flash_attn", "flash_attn"])
def flash_installed(request, monkeypatch):
    monkeypatch.setattr(flash, "installed", lambda: request.param)
    return request.param


# ------------------------------------------------------------------------ auto's policy table

#: (call, backend auto must choose); heads 8, batch 1 unless given. Every threshold of
#: auto_backend is crossed here: FOLD_MIN_LENGTH (640), DENSE_MASK_BUDGET (64 MiB), the
#: merged variants, what the fold cannot serve, and flash on CUDA.
CPU32 = dict(device="cpu", dtype=torch.float32, heads=8)
POLICY = [
    (Call(variant="causal", query_len=512, key_len=512, **CPU32), "sdpa"),
    (Call(variant="causal", query_len=639, key_len=639, **CPU32), "sdpa"),
    (Call(variant="causal", query_len=640, key_len=640, **CPU32), "fold"),
    # a bias of each layer's own (learned scales, a row per layer): sdpa would build it per
    # call; the bidirectional variants' two merged passes stay slower (docs/learned_scales.md)
    (Call(variant="causal", query_len=128, key_len=128, per_layer=True, **CPU32), "sdpa"),
    (Call(variant="causal", query_len=256, key_len=256, per_layer=True, **CPU32), "fold"),
    (Call(variant="offset", query_len=512, key_len=512, per_layer=True, **CPU32), "sdpa"),
    (Call(variant="offset", query_len=1024, key_len=1024, per_layer=True, **CPU32), "fold"),
    (Call(variant="one_sided", query_len=1024, key_len=1024, **CPU32), "fold"),
    (Call(variant="causal", query_len=1024, key_len=1024, grad=True, **CPU32), "fold"),
    (Call(variant="causal", query_len=1024, key_len=1024, dtype=torch.float64, device="cpu",
          heads=8), "fold"),
    # the bidirectional variants: two merged passes, slower than the mask while it fits
    (Call(variant="symmetric", query_len=1024, key_len=1024, **CPU32), "sdpa"),
    (Call(variant="offset", query_len=2048, key_len=2048, heads=4, device="cpu",
          dtype=torch.float32), "sdpa"),  # (4, 2048, 2048) float32 = 64 MiB: just fits
    (Call(variant="offset", query_len=2048, key_len=2048, **CPU32), "fold"),  # 128 MiB
    # key padding is a query/key column, not a per-sequence mask: the bias stays (H, T, S)
    (Call(variant="asymmetric", query_len=512, key_len=512, batch=16, padded=True, **CPU32),
     "sdpa"),
    (Call(variant="offset", query_len=2048, key_len=2048, batch=16, padded=True, **CPU32),
     "fold"),  # (8, 2048, 2048) float32 = 128 MiB
    (Call(variant="asymmetric", query_len=512, key_len=512, batch=16, **CPU32), "sdpa"),
    # what the fold cannot serve goes to sdpa, at any length
    (Call(variant="causal", query_len=1, key_len=4096, **CPU32), "sdpa"),  # a decoding step
    (Call(variant="causal", query_len=8, key_len=4096, **CPU32), "sdpa"),
    (Call(variant="causal", query_len=1024, key_len=1024, dropout_p=0.1, **CPU32), "sdpa"),
    (Call(variant="causal", query_len=1024, key_len=1024, attn_mask=True, **CPU32), "sdpa"),
    (Call(variant="causal", query_len=1024, key_len=1024, device="cpu", dtype=torch.bfloat16,
          heads=8), "sdpa"),
    (Call(variant="symmetric", query_len=4096, key_len=4096, device="mps",
          dtype=torch.float32, heads=8), "sdpa"),
]
#: on CUDA: flash where installed and it serves, else sdpa
CUDA16 = dict(device="cuda", dtype=torch.float16, heads=8)
POLICY_CUDA = [
    (Call(variant="causal", query_len=512, key_len=512, **CUDA16), ("sdpa", "flash")),
    (Call(variant="symmetric", query_len=512, key_len=512, padded=True, **CUDA16),
     ("sdpa", "flash")),
    (Call(variant="causal", query_len=1, key_len=512, **CUDA16), ("sdpa", "flash")),
    (Call(variant="causal", query_len=1, key_len=512, padded=True, **CUDA16), ("sdpa", "sdpa")),
    (Call(variant="one_sided", query_len=512, key_len=512, **CUDA16), ("sdpa", "sdpa")),
    (Call(variant="causal", query_len=512, key_len=512, device="cuda", dtype=torch.float32,
          heads=8), ("sdpa", "sdpa")),
    (Call(variant="causal", query_len=512, key_len=512, attn_mask=True, **CUDA16),
     ("sdpa", "sdpa")),
    # compiled flex: causal, whole sequences, half precision, from FLEX_MIN_LENGTH keys
    (Call(variant="causal", query_len=4096, key_len=4096, attn_mask=True, **CUDA16),
     ("sdpa", "sdpa")),
    (Call(variant="causal", query_len=4095, key_len=4095, **CUDA16), ("sdpa", "flash")),
    (Call(variant="causal", query_len=1, key_len=8192, device="cuda", dtype=torch.float32,
          heads=8), ("sdpa", "sdpa")),
    (Call(variant="causal", query_len=8192, key_len=8192, device="cuda", dtype=torch.float32,
          heads=8), ("sdpa", "sdpa")),
    (Call(variant="causal", query_len=8192, key_len=8192, padded=True, device="cuda",
          dtype=torch.float32, heads=8), ("sdpa", "sdpa")),
    (Call(variant="causal", query_len=8192, key_len=8192, dropout_p=0.1, device="cuda",
          dtype=torch.bfloat16, heads=8), ("sdpa", "flash")),
    (Call(variant="offset", query_len=8192, key_len=8192, device="cuda", dtype=torch.bfloat16,
          heads=8), ("sdpa", "sdpa")),
]

#: where flash_attn is absent, flex serves these (triton present)
FLEX_CUDA = [
    Call(variant="causal", query_len=4096, key_len=4096, **CUDA16),
    Call(variant="causal", query_len=8192, key_len=8192, grad=True, device="cuda",
         dtype=torch.bfloat16, heads=16),
]


@pytest.mark.parametrize("call,expected", POLICY, ids=[str(i) for i in range(len(POLICY))])
def test_auto_policy_on_the_cpu(call, expected, flash_installed):
    assert auto_backend(call) == expected


@pytest.mark.parametrize("call,expected", POLICY_CUDA,
                         ids=[str(i) for i in range(len(POLICY_CUDA))])
def test_auto_policy_on_cuda(call, expected, flash_installed):
    assert auto_backend(call) == expected[flash_installed]


@pytest.mark.parametrize("call", FLEX_CUDA, ids=[str(i) for i in range(len(FLEX_CUDA))])
def test_auto_takes_compiled_flex_for_long_causal_sequences_on_cuda(call, flash_installed,
                                                                     monkeypatch):
    monkeypatch.setattr(flex, "compilable", lambda: True)
    assert auto_backend(call) == ("flash" if flash_installed else "flex")
    monkeypatch.setattr(flex, "compilable", lambda: False)  # no triton: no compiled flex
    assert auto_backend(call) == ("flash" if flash_installed else "sdpa")
    learned = call._replace(scale_grad=True)  # flash refuses; flex's was not measured
    assert auto_backend(learned) == "sdpa"


def test_policy_thresholds_are_the_documented_ones():
    assert tuning.FOLD_MIN_LENGTH == 640 and tuning.DENSE_MASK_BUDGET == 64 * MIB
    assert (tuning.FOLD_PER_LAYER_MIN_LENGTH, tuning.FOLD_PER_LAYER_MERGED_MIN_LENGTH) == (
        256, 1024)
    assert tuning.FLEX_MIN_LENGTH == 4096 and tuning.FLEX_MASKS_MIN_LENGTH == 2048
    assert tuning.FLEX_DOCUMENTS_MIN_LENGTH == 1024 and tuning.FLEX_MASKS_OTHERS_MIN_LENGTH == 4096


#: the grid of calls of the tests before the dispatch was one table (need_weights is the
#: module's business now: see test_need_weights_uses_the_explicit_path_whatever_the_backend)
ALL_CALLS = [
    Call(device, dtype, variant, q_len, key_len, 2, 8, padded, attn_mask, drop, grad)
    for device, dtype, variant, (q_len, key_len, grad), attn_mask, padded, drop in
    itertools.product(
        ["cpu", "cuda", "mps"], [torch.float32, torch.bfloat16, torch.float16], VARIANTS,
        [(8, 8, False), (8, 8, True), (1, 8, False), (1024, 1024, True), (2048, 2048, False)],
        [False, True], [False, True], [0.0, 0.1],
    )
]


def test_auto_never_picks_a_backend_that_cannot_serve(flash_installed):
    for call in ALL_CALLS:
        chosen = auto_backend(call)
        assert REGISTRY[chosen].unsupported(call) is None, (call, chosen)
        assert chosen != "naive"
        if chosen == "flex":  # only where it was measured faster
            assert call.device == "cuda" and call.variant == "causal" and not call.padded
            assert call.query_len == call.key_len >= tuning.FLEX_MIN_LENGTH
        if call.device == "cpu":
            assert chosen in ("fold", "sdpa")  # measured fastest on the CPU, train and inference
        if chosen == "flash":
            assert call.variant in ("causal", "symmetric") and call.device == "cuda"


# ------------------------------------------------------------------------ names and errors


def test_one_list_of_names_and_one_validation():
    assert ATTENTION_BACKENDS == ("auto", "fold", "sdpa", "flex", "flash", "naive",
                                  "windowed")
    for name in ATTENTION_BACKENDS:
        assert check_attention_backend(name) == name
    with pytest.raises(ValueError, match="unknown ALiBi attention backend 'cuda-magic'.*auto, fold"):
        check_attention_backend("cuda-magic")
    alibi = AlibiBias(4)
    with pytest.raises(ValueError, match="unknown ALiBi attention backend"):
        AlibiMultiheadAttention(32, 4, alibi.layer(0), attention="cuda-magic")
    with pytest.raises(ValueError, match="unknown ALiBi attention backend"):
        set_attention_backend(torch.nn.Sequential(), "sdpa-fold")


@pytest.mark.parametrize("model,flags,reason", [
    ("lm", ["--alibi-attention", "fold", "--alibi-window-cutoff", 8], "slope windows"),
    ("encoder", ["--alibi-attention", "flash", "--alibi-variant", "offset"],
     "causal and symmetric only, not offset"),
    ("encoder", ["--alibi-attention", "fold", "--alibi-global-tokens", 1], "global tokens"),
])
def test_a_named_backend_that_the_options_rule_out_is_refused_when_the_model_is_built(
        model, flags, reason, tiny_lm_data):
    """Not at its first call: a load-time override is refused where it is given."""
    from fairseq_alibi.options import OptionError
    from tests.helpers.building import build_model

    with pytest.raises(OptionError, match=f"--alibi-attention {flags[1]} cannot serve this "
                       f"model: .*{reason}.*Use --alibi-attention auto"):
        build_model(model, tiny_lm_data, *flags)
    build_model(model, tiny_lm_data, *flags[2:])  # auto serves it


def test_a_named_backend_that_cannot_serve_is_a_clear_error(monkeypatch):
    train = Call("cpu", torch.float32, "causal", 8, 8, grad=True)
    with pytest.raises(ValueError, match="flex cannot serve.*no CPU backward.*auto"):
        dispatch.resolve("flex", train)
    with pytest.raises(ValueError, match="CUDA only"):
        dispatch.resolve("flash", train)
    with pytest.raises(ValueError, match="fold cannot serve.*KV cache"):
        dispatch.resolve("fold", Call("cpu", torch.float32, "causal", 1, 8))
    with pytest.raises(ValueError, match="fold cannot serve.*bfloat16"):
        dispatch.resolve("fold", Call("cpu", torch.bfloat16, "causal", 8, 8))
    monkeypatch.setattr(flash, "installed", lambda: True)
    one_sided = Call("cuda", torch.float16, "one_sided", 8, 8)
    with pytest.raises(ValueError, match="causal and symmetric only, not one_sided"):
        dispatch.resolve("flash", one_sided)
    for name in ("sdpa", "naive"):  # these serve every call
        assert dispatch.resolve(name, Call("mps", torch.float16, "one_sided", 1, 8, 2, 8,
                                           True, True, 0.1, True)) == name
    # the module raises it too: put in training mode where the CPU is all there is (before
    # fairseq's first step), else at the call that cannot be served
    attn = AlibiMultiheadAttention(32, 4, AlibiBias(4).layer(0), attention="flex")
    with pytest.raises(ValueError, match="no CPU backward"):
        attn.train()
        attn(*(torch.randn(5, 2, 32),) * 3, need_weights=False)


def test_the_module_runs_the_backend_it_was_given(monkeypatch):
    """One path for every backend: the configured name reaches the table, nothing in between."""
    ran = []
    for name, backend in list(REGISTRY.items()):
        def spy(*args, _name=name, _run=backend.run):
            ran.append(_name)
            return _run(*args)
        monkeypatch.setitem(REGISTRY, name, dataclasses.replace(backend, run=spy))
    attn = AlibiMultiheadAttention(32, 4, AlibiBias(4).layer(0)).eval()
    x = torch.randn(6, 2, 32)
    with torch.no_grad():
        for name in ("fold", "sdpa", "naive", "auto"):
            set_attention_backend(attn, name)
            attn(x, x, x, need_weights=False)
    assert ran == ["fold", "sdpa", "naive", "sdpa"]  # auto: 6 causal keys -> the dense mask


# ------------------------------------------------------------------------ saved with the model


def _train_lm(data, user_dir, save_dir, attention):
    run_cli(
        "fairseq-train", data, "--user-dir", user_dir, "--task", "language_modeling",
        "--arch", "alibi_transformer_lm", "--alibi-attention", attention, "--cpu",
        "--decoder-layers", "1", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim", "32",
        "--decoder-attention-heads", "2", "--tokens-per-sample", "16", "--batch-size", "4",
        "--optimizer", "adam", "--lr", "1e-3", "--max-update", "1", "--no-epoch-checkpoints",
        "--save-dir", save_dir, "--log-format", "none", "--num-workers", "0",
    )
    return str(save_dir / "checkpoint_last.pt")


def _backends_of(model):
    return {m.attention_backend for m in model.modules() if isinstance(m, AlibiMultiheadAttention)}


@pytest.mark.slow
def test_backend_is_saved_with_the_model_and_overridable_at_load(
    tiny_lm_data, alibi_user_dir, tmp_path
):
    from fairseq import checkpoint_utils

    path = _train_lm(tiny_lm_data, alibi_user_dir, tmp_path, "naive")
    (saved,), _ = checkpoint_utils.load_model_ensemble([path])
    assert _backends_of(saved) == {"naive"}
    (loaded,), _ = checkpoint_utils.load_model_ensemble(
        [path], arg_overrides={"alibi_attention": "fold"}
    )
    assert _backends_of(loaded) == {"fold"}
    saved.eval(), loaded.eval()
    tokens = torch.randint(4, 20, (2, 30))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens)[0], saved(tokens)[0], **TOL)


@pytest.mark.slow
def test_checkpoint_saved_with_the_old_sdpa_loads_and_computes_the_same(
    tiny_lm_data, alibi_user_dir, tmp_path
):
    """Before ``fold`` was a backend, ``sdpa`` meant "fold where measured faster, the dense
    float mask otherwise", and a checkpoint held nothing but ``cfg.model.alibi_attention:
    'sdpa'`` — exactly what a checkpoint of today trained with ``--alibi-attention sdpa``
    holds, so one is written that way (a checkpoint written by the code of that time was
    checked the same way when the dispatch changed). It loads as today's ``sdpa`` (see
    ``dispatch.check_attention_backend``): the same outputs as the fold and the explicit
    reference, at a length where the old code folded (640 and more) and where it did not."""
    from fairseq import checkpoint_utils

    path = _train_lm(tiny_lm_data, alibi_user_dir, tmp_path, "sdpa")
    assert load(path)["cfg"]["model"]["alibi_attention"] == "sdpa"  # the old format's value
    (old,), _ = checkpoint_utils.load_model_ensemble([path])
    assert _backends_of(old) == {"sdpa"}
    (reference,), _ = checkpoint_utils.load_model_ensemble(
        [path], arg_overrides={"alibi_attention": "naive"})
    old.eval(), reference.eval()
    torch.manual_seed(0)
    tokens = torch.randint(4, 20, (2, 700))
    with torch.no_grad():
        want = reference(tokens)[0]
        torch.testing.assert_close(old(tokens)[0], want, **TOL)
        torch.testing.assert_close(old(tokens[:, :40])[0], want[:, :40], **TOL)
        set_attention_backend(old, "auto")  # the old sdpa's formulation at 700 tokens: folded
        torch.testing.assert_close(old(tokens)[0], want, **TOL)


# ------------------------------------------------------------ auto with slope windows


def windowed_call(variant, length, cutoff, heads=8, **fields):
    """A whole-sequence call on the CPU with the windows of ``cutoff`` (Press's slopes)."""
    windows = AlibiBias(heads, variant=variant, window_cutoff=cutoff).layer(0).windows()
    fields = dict(dict(device="cpu", dtype=torch.float32), **fields)
    return Call(variant=variant, query_len=length, key_len=length, heads=heads, windowed=True,
                windows=windows, **fields)


#: (variant, length, cutoff, auto's choice): what was measured (docs/benchmarks.md, "auto's
#: choice with windows"): the one-way variants (causal, one_sided) run windowed from 768 keys
#: on (one_sided at 640 was slower than sdpa with today's chunks), sdpa's memoised windowed
#: bias below; the bidirectional
#: variants run windowed where the cost model predicts it faster (slower than sdpa's dense
#: windowed bias below 1024 keys, and at 1024 keys from T = 4: their windows then cover much
#: of the sequence; faster for small windows of long sequences) and wherever sdpa's bias would
#: exceed the dense mask's budget, as without a cutoff (from 1449 keys with 8 heads)
ONE_WAY = ("causal", "one_sided")
WINDOWED_POLICY = [
    (variant, length, cutoff, "sdpa") for variant in VARIANTS
    for length, cutoff in ((256, 2.0), (512, 2.0), (640, 16.0), (767, 16.0))] + [
    (variant, length, cutoff, "windowed" if variant in ONE_WAY else "sdpa")
    for variant in VARIANTS for length, cutoff in ((768, 2.0), (1023, 2.0))] + [
    ("causal", 2048, 2.0, "windowed"),
    ("causal", 2048, 8.0, "windowed"),
    ("causal", 4096, 16.0, "windowed"),
    ("causal", 8192, 8.0, "windowed"),
    ("symmetric", 1024, 2.0, "windowed"),
    ("symmetric", 1024, 8.0, "sdpa"),
    ("offset", 1024, 16.0, "sdpa"),
    ("offset", 1448, 16.0, "sdpa"),  # the dense bias within its budget
    ("offset", 1449, 16.0, "windowed"),  # beyond it
    ("offset", 2048, 8.0, "windowed"),
    ("asymmetric", 1536, 16.0, "windowed"),
    ("one_sided", 1024, 16.0, "windowed"),
    ("symmetric", 8192, 12.0, "windowed"),
    ("symmetric", 8192, 16.0, "windowed"),
] + [(variant, 4096, 2.0, "windowed") for variant in VARIANTS]


@pytest.mark.parametrize("variant,length,cutoff,expected", WINDOWED_POLICY,
                         ids=[f"{v}-{n}-T{c:g}" for v, n, c, _ in WINDOWED_POLICY])
def test_auto_with_slope_windows_follows_the_measurements(variant, length, cutoff, expected):
    call = windowed_call(variant, length, cutoff)
    assert auto_backend(call) == expected
    assert auto_backend(call._replace(grad=True)) == expected  # training: the same choice


@pytest.mark.parametrize("variant", VARIANTS)
def test_auto_picks_windowed_exactly_where_the_cost_model_says(variant):
    """The bidirectional variants, and the one-way ones with global tokens (which go by the
    cost model too), within the dense mask's budget; beyond it windowed."""
    for length, cutoff in itertools.product((512, 1024, 1536, 2048, 4096, 8192),
                                            (2.0, 4.0, 6.0, 8.0, 12.0, 16.0)):
        call = windowed_call(variant, length, cutoff)
        if variant in ONE_WAY:
            assert (auto_backend(call) == "windowed") == (
                length >= tuning.ONE_WAY_WINDOWED_MIN_LENGTH)
            call = call._replace(global_tokens=2)
        cost = dispatch.windowed_cost(call.windows, variant, length,
                                      global_tokens=call.global_tokens)
        over_budget = 8 * length * length * 4 > tuning.DENSE_MASK_BUDGET
        wanted = over_budget or (length >= tuning.WINDOWED_MIN_LENGTH
                                 and cost <= tuning.WINDOWED_MAX_COST)
        assert (auto_backend(call) == "windowed") == wanted, (length, cutoff, cost)


def test_the_cost_model_prices_the_plan_windowed_computes():
    """A group of several heads whose windows cover the sequence runs as chunks once their one
    chunk's bias together exceeds tuning.ONE_CHUNK_BYTES: the price follows the group, as the
    backend does (the plan is the one both read)."""
    one_way, two_way, whole_way, fixed = tuning.WINDOWED_COST
    S = 1024
    covering = ([16] * 6 + [1000] * 2, [16] * 6 + [1000] * 2)
    groups = windowed.plan(covering, "symmetric", S, S)
    assert [(g.heads, g.kind) for g in groups] == [((0, 1, 2, 3, 4, 5), "chunks"),
                                                   ((6, 7), "chunks")]
    narrow, wide = (32 + windowed.chunk_size(16, 16), 2000 + windowed.chunk_size(1000, 1000))
    assert dispatch.windowed_cost(covering, "symmetric", S) == pytest.approx(
        two_way * (6 * narrow + 2 * wide) / (8 * S) + fixed * 1000 / S)


def test_the_cost_model_counts_the_keys_each_head_reads():
    one_way, two_way, dense_way, fixed = tuning.WINDOWED_COST
    S = 4096
    overhead = fixed * 1000 / S
    # windows that drop no key: every head folded, causal reads half the keys on average
    unbounded = ([None] * 8, [0] * 8)
    assert dispatch.windowed_cost(unbounded, "causal", S) == pytest.approx(
        one_way / 2 + overhead)
    assert dispatch.windowed_cost(([None] * 8, [None] * 8), "symmetric", S) == pytest.approx(
        one_way + overhead)
    # a window of 16 back (chunk 64): 16 + 64 keys per query, one way; 16 + 64 + 16 two ways
    assert dispatch.windowed_cost(([16] * 8, [0] * 8), "causal", S) == pytest.approx(
        one_way * 80 / S + overhead)
    assert dispatch.windowed_cost(([16] * 8, [16] * 8), "symmetric", S) == pytest.approx(
        two_way * 96 / S + overhead)
    # a head that covers the sequence but drops keys reads every key through a (T, S) bias,
    # while that is at most tuning.ONE_CHUNK_BYTES (1024² float32: 4 MiB) ...
    S = 1024
    covering = ([16] * 7 + [1000], [16] * 7 + [1000])
    assert dispatch.windowed_cost(covering, "symmetric", S) == pytest.approx(
        (two_way * 7 * 96 + dense_way * S) / (8 * S) + fixed * 1000 / S)
    # ... else as chunks of 256 reading 1000 + 256 + 1000 keys, two ways (float64: 8 MiB)
    assert dispatch.windowed_cost(covering, "symmetric", S, itemsize=8) == pytest.approx(
        two_way * (7 * 96 + 2256) / (8 * S) + fixed * 1000 / S)


def test_auto_with_slope_windows_keeps_sdpa_where_windowed_cannot_serve_or_has_no_windows(
        monkeypatch):
    # where triton cannot compile flex (a CUDA call goes to compiled flex where it can:
    # tests/attention/test_flex_windows_cpu.py)
    monkeypatch.setattr(flex, "compilable", lambda: False)
    long = windowed_call("causal", 4096, 2.0)
    assert auto_backend(long) == "windowed"
    for call in (long._replace(dropout_p=0.1), long._replace(attn_mask=True),
                 long._replace(dtype=torch.bfloat16),
                 long._replace(device="cuda", dtype=torch.float16),
                 long._replace(windows=None),  # a call that does not say its windows
                 long._replace(kind="rows")):  # --alibi-length-scale's rows: dense only
        assert auto_backend(call) == "sdpa", call
    # without windows nothing changes: the fold, as before
    assert auto_backend(long._replace(windowed=False, windows=None)) == "fold"


def test_auto_takes_compiled_flex_for_long_windows_and_documents_on_cuda(flash_installed,
                                                                         monkeypatch):
    """On CUDA in half precision, windows and documents run on flex's block plan, the
    documents masked there rather than split, from the lengths measured faster
    (docs/benchmarks.md, "GPU (H200)"); elsewhere as before."""
    monkeypatch.setattr(flex, "compilable", lambda: True)
    cuda = dict(device="cuda", dtype=torch.bfloat16)
    documents = Call(variant="causal", query_len=1024, key_len=1024, heads=8, documents=True,
                     **cuda)
    at = {"causal": tuning.FLEX_MASKS_MIN_LENGTH,
          "symmetric": tuning.FLEX_MASKS_OTHERS_MIN_LENGTH}
    for variant, length in at.items():
        windowed = windowed_call(variant, length, 8.0, **cuda)
        assert auto_backend(windowed) == "flex"
        shorter = windowed_call(variant, length - 1, 8.0, **cuda)
        assert auto_backend(shorter) == "sdpa"
        with_documents = "flex" if variant == "causal" else "sdpa"  # causal's from 1,024
        assert auto_backend(shorter._replace(documents=True)) == with_documents
    assert auto_backend(documents) == "flex" and not dispatch.splits_documents("auto", documents)
    assert dispatch.splits_documents("sdpa", documents) is False  # masks them itself
    for call in (documents._replace(query_len=1023, key_len=1023),
                 documents._replace(variant="symmetric"),
                 documents._replace(padded=True), documents._replace(dtype=torch.float32),
                 documents._replace(scale_grad=True), documents._replace(dropout_p=0.1),
                 documents._replace(device="cpu", dtype=torch.float32)):
        assert dispatch.splits_documents("auto", call), call
        assert auto_backend(call) != "flex", call
    step = windowed_call("causal", 4096, 8.0, **cuda)._replace(query_len=1)
    assert auto_backend(step) == "sdpa"  # a decoding step
    monkeypatch.setattr(flex, "compilable", lambda: False)  # no triton: no compiled flex
    assert (auto_backend(windowed_call("causal", 4096, 8.0, **cuda)) == "sdpa"
            and dispatch.splits_documents("auto", documents))


def test_attend_passes_the_windows_of_the_call():
    layer = AlibiBias(8, variant="symmetric", window_cutoff=4.0).layer(0)
    q = torch.zeros(1, 8, 16, 4)
    call = dispatch.call_of(q, q, q, layer)
    assert call.windowed and call.windows == layer.windows()
    plain = dispatch.call_of(q, q, q, AlibiBias(8).layer(0))
    assert not plain.windowed and plain.windows is None


def test_the_windowed_price_was_fitted_with_todays_chunks():
    """``tuning.WINDOWED_COST`` prices the chunks as they were when it was fitted: a changed
    chunk size or limit fails here until the price is re-fitted and its settings recorded."""
    today = {name: getattr(tuning, name) for name in tuning.WINDOWED_COST_FITTED_WITH}
    assert today == tuning.WINDOWED_COST_FITTED_WITH, (
        "the chunk settings changed since tuning.WINDOWED_COST was fitted: re-fit it (python -m "
        "benchmarks.windows --tables thresholds ... --json F, then --fit F) and write the new "
        "constants and tuning.WINDOWED_COST_FITTED_WITH")
