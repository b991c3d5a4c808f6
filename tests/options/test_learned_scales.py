"""Learned ALiBi slope scales (``--alibi-learned-scales``, ``--alibi-scale-init``).

* every variant × scale mode × CPU backend against a float64 reference, output and gradients
  (train) and output (eval); flex eager and inference only (no CPU backward), flash on CUDA;
* the scales' gradients against central finite differences (float64 modules);
* the default (no learned scale, 1.0) equals the code before scales existed, bit for bit
  (that code, from git, run in a subprocess: slow);
* a clear error for a non-positive initial scale or an unknown mode, in every model family;
* checkpoints without scales load as 1.0; scales of another mode are a clear error;
* which backend trains them (``auto`` folds; ``flash`` refuses);
* save / resume through fairseq-train bit for bit (slow).
"""

import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from fairseq_alibi.alibi import SCALE_MODES, mask_value
from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention
from fairseq_alibi.modules.attention import dispatch, flash, flex
from fairseq_alibi.modules.attention.dispatch import Call
from fairseq_alibi.modules.bias import AlibiBias
from tests.helpers.building import (
    build_model, decode_token_by_token, setup_from_command_line, write_dictionary,
)
from tests.helpers.checkpoints import load
from tests.helpers.cli import REPO
from tests.helpers.references import reference_scaled_attention, scaled_bias
from tests.helpers.training import train
from tests.helpers.translation import TINY_TRANSLATION, write_translation_dictionaries

VARIANTS = ["causal", "symmetric", "one_sided", "offset", "asymmetric"]
LEARNED = [m for m in SCALE_MODES if m != "none"]
LAYERS, HEADS, DIM = 3, 4, 16
TOL = dict(atol=2e-5, rtol=1e-4)  # float32 computation against float64


@pytest.fixture
def eager_flex(monkeypatch):
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setattr(flex, "_compiled_flex", lambda: flex_attention)


CPU_TRAIN_BACKENDS = ["naive", "sdpa", "fold"]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", LEARNED)
@pytest.mark.parametrize("backend", CPU_TRAIN_BACKENDS + ["flex"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_matches_float64_reference(variant, mode, backend, train, eager_flex):
    if backend == "flex" and train:
        pytest.skip("flex_attention has no CPU backward (tests/attention/test_dispatch.py)")
    ratio = 0.7 if variant == "asymmetric" else 1.0
    alibi = scaled_bias(HEADS, LAYERS, variant, mode, ratio=ratio)
    layer = 1
    torch.manual_seed(0)
    attn = AlibiMultiheadAttention(DIM, HEADS, alibi.layer(layer), attention=backend)
    attn.train(train)
    T, B = 9, 2
    x = torch.randn(T, B, DIM)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, -2:] = True  # fairseq pads at the end
    with torch.set_grad_enabled(train):
        out, _ = attn(x, x, x, key_padding_mask=pad, need_weights=False)
    scales64 = alibi.scales.detach().double().requires_grad_()
    expected = reference_scaled_attention(attn, x, scales64, layer, variant, ratio, pad)
    keep = ~pad.T[:, :, None]  # padded query rows are not compared (their value is arbitrary)
    torch.testing.assert_close(torch.where(keep, out.double(), 0.0),
                               torch.where(keep, expected.detach(), 0.0), **TOL)
    if not train:
        return
    upstream = torch.randn_like(out) * keep
    (out * upstream).sum().backward()
    (expected * upstream.double()).sum().backward()
    torch.testing.assert_close(alibi.scales.grad.double(), scales64.grad, atol=5e-5, rtol=1e-4)
    rows = alibi.scales.size(0)
    if rows > 1:  # other layers' scales get nothing from this layer
        assert torch.all(alibi.scales.grad[[r for r in range(rows) if r != layer]] == 0)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("backend", ["sdpa", "fold"])
def test_scale_gradients_match_finite_differences(variant, backend):
    """float64 modules. The bias is built in float32 (alibi.py): dyadic slopes, scales, ratio
    and step keep every bias value exact there, so the differences measure the function, not
    float32 rounding. (``naive`` takes its softmax in float32, whose rounding swamps a finite
    difference; its gradient is autograd's through the same bias, checked against float64
    above.)"""
    ratio = 0.75 if variant == "asymmetric" else 1.0
    alibi = scaled_bias(HEADS, LAYERS, variant, "per_layer_head", ratio=ratio).double()
    with torch.no_grad():
        alibi.scales.copy_(torch.tensor([0.5, 1.25, 1.5, 2.75]).expand(LAYERS, HEADS))
    torch.manual_seed(1)
    attn = AlibiMultiheadAttention(DIM, HEADS, alibi.layer(2), attention=backend).double()
    x = torch.randn(7, 2, DIM, dtype=torch.float64)
    weights = torch.randn(7, 2, DIM, dtype=torch.float64)

    def loss():
        return (attn(x, x, x, need_weights=False)[0] * weights).sum()

    alibi.scales.grad = None
    loss().backward()
    analytic = alibi.scales.grad[2].clone()
    eps = 2.0**-10
    numeric = torch.zeros(HEADS, dtype=torch.float64)
    with torch.no_grad():
        for h in range(HEADS):
            s = alibi.scales[2, h].item()
            alibi.scales[2, h] = s + eps
            up = loss().item()
            alibi.scales[2, h] = s - eps
            down = loss().item()
            alibi.scales[2, h] = s
            numeric[h] = (up - down) / (2 * eps)
    assert analytic.abs().max() > 1e-3  # the scales matter here: the check is not vacuous
    torch.testing.assert_close(analytic, numeric, atol=1e-6, rtol=1e-5)


def test_every_mode_has_the_documented_shape():
    shapes = {"shared": (1, 1), "per_head": (1, HEADS), "per_layer": (LAYERS, 1),
              "per_layer_head": (LAYERS, HEADS)}
    for mode, shape in shapes.items():
        alibi = AlibiBias(HEADS, variant="causal", num_layers=LAYERS, learned_scales=mode,
                                scale_init=0.5)
        assert tuple(alibi.scales.shape) == shape
        assert torch.all(alibi.scales == 0.5)
        assert alibi.scales.requires_grad
    fixed = AlibiBias(HEADS, variant="causal", num_layers=LAYERS)
    assert fixed.scales is None and "scales" not in fixed.state_dict()
    # nothing is multiplied: every layer shares one bias tensor
    assert all(fixed.layer(i).dense(5, 5) is fixed.layer(0).dense(5, 5) for i in range(LAYERS))


def test_fixed_scale_init_multiplies_without_a_parameter():
    fixed = AlibiBias(HEADS, variant="offset", scale_init=0.5)
    base = AlibiBias(HEADS, variant="offset")
    assert fixed.scales is None and not list(fixed.parameters())
    torch.testing.assert_close(fixed(5, 5), base(5, 5) * 0.5)


def test_slope_scale_multiplies_on_top_of_learned_scales():
    learned = scaled_bias(HEADS, LAYERS, "causal", "per_head")
    interpolated = scaled_bias(HEADS, LAYERS, "causal", "per_head")
    interpolated.slope_scale = 0.25
    with torch.no_grad():
        torch.testing.assert_close(interpolated.slopes_of(0)[0],
                                   learned.slopes_of(0)[0] * 0.25)
        visible = learned(6, 6, layer=0) > mask_value(torch.float32)  # masked keys stay masked
        torch.testing.assert_close(interpolated(6, 6, layer=0)[visible],
                                   learned(6, 6, layer=0)[visible] * 0.25)
        assert torch.equal(interpolated(6, 6, layer=0)[~visible], learned(6, 6, layer=0)[~visible])


def test_per_layer_scales_need_the_layer():
    alibi = scaled_bias(HEADS, LAYERS, "causal", "per_layer")
    with pytest.raises(ValueError, match="need the index of the layer"):
        alibi.slopes_of()
    with pytest.raises(ValueError, match="need the index of the layer"):
        alibi.slopes_of(LAYERS)


# ------------------------------------------------------------------ options and clear errors


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    return write_dictionary(tmp_path_factory.mktemp("scales_lm_dict"), 40)


@pytest.mark.parametrize("init", [0, -1, float("nan")])
def test_non_positive_initial_scale_is_a_clear_error(init):
    with pytest.raises(ValueError, match="--alibi-scale-init must be a positive finite number"):
        AlibiBias(HEADS, variant="causal", learned_scales="per_head", scale_init=init)
    with pytest.raises(ValueError, match="--alibi-scale-init must be a positive finite number"):
        AlibiBias(HEADS, variant="offset", scale_init=init)  # a fixed scale is checked too


def test_every_family_names_its_scale_init_flag(lm_data, tmp_path):
    """The flag reaches the check above in every model family, named as the user typed it
    (one bad value: the values themselves are the test above's)."""
    init = 0
    with pytest.raises(ValueError, match="--alibi-scale-init must be a positive finite number"):
        build_model("lm", lm_data, "--alibi-learned-scales", "per_head",
                    "--alibi-scale-init", init)
    with pytest.raises(ValueError, match="--alibi-scale-init must be a positive finite number"):
        build_model("encoder", lm_data, "--alibi-scale-init", init)
    pair = write_translation_dictionaries(tmp_path / "pair")
    for side in ("encoder", "decoder"):
        with pytest.raises(ValueError, match=f"--{side}-alibi-scale-init must be a positive"):
            setup_and_build_translation(pair, f"--{side}-alibi-scale-init", init)


def setup_and_build_translation(data, *extra):
    cfg, task = setup_from_command_line(
        data, "--task", "translation", "--source-lang", "src", "--target-lang", "tgt",
        "--arch", "alibi_transformer", *TINY_TRANSLATION, *extra)
    return task.build_model(cfg.model), task


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown --alibi-learned-scales 'per_token'"):
        AlibiBias(HEADS, variant="causal", learned_scales="per_token")


def test_scales_without_alibi_are_a_clear_error(lm_data):
    with pytest.raises(ValueError, match="--alibi-learned-scales needs --alibi-variant "
                                         "symmetric, .* not none: it shapes the ALiBi bias"):
        build_model("encoder", lm_data, "--alibi-variant", "none",
                    "--alibi-learned-scales", "per_head")


def test_every_family_learns_its_scales_per_layer(lm_data, tmp_path):
    lm, _ = build_model("lm", lm_data, "--alibi-learned-scales", "per_layer_head")
    enc, _ = build_model("encoder", lm_data, "--alibi-learned-scales", "per_layer")
    pair = write_translation_dictionaries(tmp_path / "pair")
    mt, _ = setup_and_build_translation(pair, "--encoder-alibi-learned-scales", "per_head",
                                        "--decoder-alibi-learned-scales", "per_layer_head",
                                        "--decoder-alibi-scale-init", "0.5")
    found = {
        "lm": (lm.state_dict()["decoder.alibi.scales"], (2, 4), 1.0),
        "encoder": (enc.state_dict()["encoder.sentence_encoder.alibi.scales"], (2, 1), 1.0),
        "mt encoder": (mt.state_dict()["encoder.alibi.scales"], (1, 4), 1.0),
        "mt decoder": (mt.state_dict()["decoder.alibi.scales"], (2, 4), 0.5),
    }
    for name, (scales, shape, init) in found.items():
        assert tuple(scales.shape) == shape and torch.all(scales == init), name
    for model, expected in ((lm, [0, 1]), (enc, [0, 1]), (mt, [0, 1, 0, 1])):
        indices = [m.alibi.index for m in model.modules()
                   if isinstance(m, AlibiMultiheadAttention)]
        assert indices == expected
    # the scales are parameters the optimizer sees
    assert any(n.endswith("alibi.scales") for n, _ in lm.named_parameters())


@pytest.mark.parametrize("attention", ["auto", "windowed"])
def test_the_bias_and_windows_follow_scales_an_optimizer_changes(lm_data, attention):
    """fairseq's optimizers write ``p.data``, which no version counts: the bias of an eval pass
    and the slope windows were kept from before the step (validation scored the first
    validation's bias, and windows never followed the scales in a run that was not resumed)."""
    lm, _ = build_model("lm", lm_data, "--alibi-learned-scales", "per_head",
                        "--alibi-window-cutoff", 2, "--alibi-attention", attention)
    fresh, _ = build_model("lm", lm_data, "--alibi-learned-scales", "per_head",
                           "--alibi-window-cutoff", 2, "--alibi-attention", attention)
    tokens = torch.randint(4, 40, (2, 40), generator=torch.Generator().manual_seed(0))
    lm.eval(), fresh.eval()
    fresh.load_state_dict(lm.state_dict())
    with torch.no_grad():
        before = lm(tokens)[0]
        torch.optim.SGD(lm.parameters(), lr=0.0).step()  # a step that changes nothing
        lm.decoder.alibi.scales.data.mul_(torch.tensor([[0.25, 1.0, 4.0, 0.5]]))  # as Adam does
        fresh.load_state_dict(lm.state_dict())
        after, expected = lm(tokens)[0], fresh(tokens)[0]
    assert not torch.equal(before, after)
    assert torch.equal(after, expected)
    assert lm.decoder.alibi.windows_of(0) == fresh.decoder.alibi.windows_of(0)
    # unchanged scales: a scoring run's passes share what they memoise (not rebuilt per pass)
    cache = lm.decoder.alibi.cache
    kept = (cache.bias, cache.windows)
    with torch.no_grad():
        assert torch.equal(lm(tokens)[0], after)
    assert cache.bias is kept[0] and cache.windows is kept[1]
    assert attention == "windowed" or kept[0] is not None  # auto reads a dense bias here
    # a training pass reads the values only where asked: with windows, once; else never (no
    # sync of a GPU each step for a memo that a bias with a gradient does not use)
    lm.train()
    lm(tokens)[0].sum().backward()
    assert cache.learned_values is not None
    unwindowed, _ = build_model("lm", lm_data, "--alibi-learned-scales", "per_head",
                                "--alibi-attention", attention)
    unwindowed.train()
    unwindowed(tokens)[0].sum().backward()
    assert unwindowed.decoder.alibi.cache.learned_values is None


# ------------------------------------------------------------------ checkpoints
# ------------------------------------------------------------------ checkpoints


def test_checkpoint_without_scales_loads_as_fixed_slopes(lm_data):
    torch.manual_seed(0)
    # one backend for both (auto takes fold for a bias per layer): the same function bit for bit
    fixed, task = build_model("lm", lm_data, "--alibi-attention", "sdpa")
    old = fixed.state_dict()
    assert not any("scales" in k for k in old)
    torch.manual_seed(1)
    learned, _ = build_model("lm", lm_data, "--alibi-learned-scales", "per_layer_head",
                             "--alibi-attention", "sdpa")
    learned.load_state_dict(dict(old))
    assert torch.all(learned.decoder.alibi.scales == 1.0)
    assert learned.decoder.alibi.scales.requires_grad  # it learns them from here on
    tokens = torch.randint(4, 40, (2, 12))
    fixed.eval(), learned.eval()
    with torch.no_grad():
        assert torch.equal(learned(tokens)[0], fixed(tokens)[0])


def test_scales_of_another_mode_are_a_clear_error(lm_data):
    learned, _ = build_model("lm", lm_data, "--alibi-learned-scales", "per_head")
    state = learned.state_dict()
    fixed, _ = build_model("lm", lm_data)
    with pytest.raises(ValueError, match="trained with --alibi-learned-scales per_head .*has --alibi-learned-scales none: build it with --alibi-learned-scales per_head"):
        fixed.load_state_dict(dict(state))
    per_layer, _ = build_model("lm", lm_data, "--alibi-learned-scales", "per_layer_head")
    with pytest.raises(ValueError, match=r"trained with --alibi-learned-scales per_head \(scales 1x4: decoder.alibi.scales\); "
                   r".*per_layer_head \(scales 2x4\): build it with --alibi-learned-scales per_head$"):
        per_layer.load_state_dict(dict(state))


def test_scales_survive_half_precision_and_a_state_dict_round_trip():
    alibi = scaled_bias(HEADS, LAYERS, "offset", "per_layer_head")
    copy = AlibiBias(HEADS, variant="offset", num_layers=LAYERS, learned_scales="per_layer_head")
    copy.load_state_dict(alibi.state_dict())
    assert torch.equal(copy.scales, alibi.scales)
    assert copy.half().slopes.dtype == torch.float32  # the slopes stay exact


# ------------------------------------------------------------------ which backend trains them


def test_auto_folds_when_the_scales_need_their_gradient():
    cpu = dict(device="cpu", dtype=torch.float32)
    for variant in VARIANTS:
        call = Call(variant=variant, query_len=64, key_len=64, grad=True, scale_grad=True, **cpu)
        assert dispatch.auto_backend(call) == "fold", variant
        assert dispatch.auto_backend(call._replace(scale_grad=False)) == "sdpa", variant
        # what fold cannot serve goes to sdpa, which is exact (the reference tests above)
        assert dispatch.auto_backend(call._replace(dropout_p=0.1)) == "sdpa"


def test_flash_refuses_training_learned_scales():
    call = Call("cuda", torch.float16, "causal", 64, 64, grad=True, scale_grad=True)
    reason = dispatch.unsupported("flash", call)
    if flash.installed():
        assert "no gradient" in reason
    else:
        assert reason  # not installed: refused anyway, and auto never picks it
    assert dispatch.auto_backend(call) != "flash"


def test_attend_reports_whether_the_scales_need_a_gradient(monkeypatch):
    seen = []
    real = dispatch.auto_backend
    monkeypatch.setattr(dispatch, "auto_backend", lambda call: seen.append(call) or real(call))
    alibi = scaled_bias(HEADS, LAYERS, "causal", "per_head")
    attn = AlibiMultiheadAttention(DIM, HEADS, alibi.layer(0), attention="auto")
    x = torch.randn(5, 1, DIM)
    attn(x, x, x, need_weights=False)
    with torch.no_grad():
        attn(x, x, x, need_weights=False)
    alibi.scales.requires_grad_(False)  # frozen scales: nothing to train
    attn(x, x, x, need_weights=False)
    assert [c.scale_grad for c in seen] == [True, False, False]


# ------------------------------------------------------------------ the default, bit for bit

#: the last commit before learned scales existed (the attention redesign)
BEFORE_SCALES = "05ad139"

_OUTPUTS = textwrap.dedent("""
    import sys, torch
    import fairseq_alibi
    assert fairseq_alibi.__file__.startswith(sys.argv[1]), fairseq_alibi.__file__
    from tests.helpers.building import build_model  # this checkout's, second on PYTHONPATH
    results = {}
    # (no attention dropout: the fold has none)
    for model_name, extra in (("lm", []),
                              ("encoder", ["--alibi-variant", "offset", "--attention-dropout", "0"]),
                              ("encoder", ["--alibi-variant", "one_sided", "--attention-dropout", "0"])):
        for backend in ("auto", "fold", "sdpa", "naive"):
            torch.manual_seed(0)
            model, task = build_model(model_name, sys.argv[3], "--alibi-attention", backend,
                                      *extra)
            model.train()
            for padded in (False, True):
                model.zero_grad()
                tokens = torch.randint(4, 40, (3, 20))
                if padded:
                    tokens[1, -3:] = 1
                torch.manual_seed(1)
                out = model(tokens)[0][tokens.ne(1)]  # the real positions (padding's are noise)
                (out.float() * torch.linspace(-1, 1, out.size(-1))).sum().backward()
                key = f"{model_name}/{' '.join(extra)}/{backend}/{'padded' if padded else 'full'}"
                results[key + "/out"] = out.detach().clone()
                for n, p in model.named_parameters():
                    if p.grad is not None:
                        results[f"{key}/grad/{n}"] = p.grad.clone()
    torch.save(results, sys.argv[4])
""")


def _outputs(package_root, data, path):
    subprocess.run([sys.executable, "-c", _OUTPUTS, str(package_root), str(REPO), str(data),
                    str(path)], check=True, cwd=str(package_root),
                   env={"PYTHONPATH": f"{package_root}:{REPO}", "OMP_NUM_THREADS": "1",
                        "PATH": "/usr/bin:/bin"})
    return torch.load(path)


@pytest.mark.slow  # two Python processes, one of them the code checked out from git
def test_default_equals_the_code_before_scales_bit_for_bit(lm_data, tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is needed to check out the code before learned scales")
    old = tmp_path / "before"
    old.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", BEFORE_SCALES, "fairseq_alibi"],
                             capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"commit {BEFORE_SCALES} is not in this checkout's history")
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
    before = _outputs(old, lm_data, tmp_path / "before.pt")
    now = _outputs(REPO, lm_data, tmp_path / "now.pt")
    assert before.keys() == now.keys() and len(now) > 12
    for key in now:
        if "/padded/" in key and ("/sdpa/" in key or "/auto/" in key):
            # since then, sdpa hides padding keys with one more query/key column instead of a
            # per-sequence mask (dense.padding_column): the same function through another
            # kernel path, equal to float32 rounding, relative to the tensor's largest entry
            # (the unpadded batch stays bit for bit)
            error = (now[key] - before[key]).abs().max().item()
            assert error <= 1e-5 * before[key].abs().max().item() + 1e-6, (key, error)
        else:
            assert torch.equal(before[key], now[key]), key


# ------------------------------------------------------------------ through fairseq-train


@pytest.mark.slow
@pytest.mark.parametrize("model,flags", [
    ("lm", ["--alibi-learned-scales", "per_layer_head"]),
    ("encoder", ["--alibi-learned-scales", "per_head", "--alibi-scale-init", "0.5"]),
])
def test_save_and_resume_bit_for_bit(model, flags, tmp_path, tiny_lm_data, alibi_user_dir):
    common = [*flags, "--save-interval-updates", 4, "--dropout", 0.1]
    straight = tmp_path / "straight"
    train(model, tiny_lm_data, alibi_user_dir, straight, *common, "--max-update", 8)
    split = tmp_path / "split"
    train(model, tiny_lm_data, alibi_user_dir, split, *common, "--max-update", 4)
    out = train(model, tiny_lm_data, alibi_user_dir, split, *common, "--max-update", 8)
    assert "Loaded checkpoint" in out
    a, b = load(straight / "checkpoint_last.pt"), load(split / "checkpoint_last.pt")
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    key = next(k for k in a["model"] if k.endswith("alibi.scales"))
    init = 0.5 if "0.5" in flags else 1.0
    assert not torch.all(a["model"][key] == init)  # they were trained
    saved = a["cfg"]["model"]  # the options travel with the checkpoint (a dict or a Namespace)
    saved = saved if isinstance(saved, dict) else vars(saved)
    assert saved["alibi_learned_scales"] == flags[1]


@pytest.mark.slow
def test_resuming_with_scales_added_names_reset_optimizer(tmp_path, tiny_lm_data,
                                                          alibi_user_dir):
    """Torch's optimizer refused the checkpoint's state with a bare ValueError after the model
    loaded; the run stops before that in one line naming the fix, which trains."""
    train("lm", tiny_lm_data, alibi_user_dir, tmp_path, "--max-update", 2)
    added = ["--alibi-learned-scales", "per_head", "--max-update", 4]
    out = train("lm", tiny_lm_data, alibi_user_dir, tmp_path, *added, expect_ok=False)
    assert out.strip().splitlines()[-1].startswith(
        f"OneLineError: {tmp_path / 'checkpoint_last.pt'} was trained with --alibi-learned-scales "
        "none, and this run has --alibi-learned-scales per_head"), out[-2000:]
    assert "start a new phase with --reset-optimizer" in out
    assert "Loaded checkpoint" in train("lm", tiny_lm_data, alibi_user_dir, tmp_path, *added,
                                        "--reset-optimizer")


def test_per_layer_scales_train_in_the_memory_of_fixed_slopes():
    """benchmarks/learned_scales.py's claim, at a small size: with ``auto``, per-layer-and-head
    scales peak as fixed slopes folded (to a few bytes), far below the dense mask's per-layer weights."""
    from benchmarks.learned_scales import HEADS, measure

    length, layers = 256, 3
    for variant in ("causal", "offset"):
        found = measure(variant, length, layers, 1)
        # (the same but for slope-sized tensors: the scales' gradients, per-layer slopes)
        assert found["per_layer_head, auto"] <= found["fixed slopes, fold"] + 4096, variant
        bias = HEADS * length * length * 4
        assert found["per_layer_head, sdpa"] > found["per_layer_head, auto"] + layers * bias / 2


@pytest.mark.slow
def test_experiment_smoke_run_writes_its_tables_and_figure(tmp_path):
    out = tmp_path / "exp"
    # one run at a time: under xdist the other core runs another test file
    proc = subprocess.run([sys.executable, "-m", "experiments.learned_scales", "--smoke",
                           "--out", str(out), "--jobs", "1"], capture_output=True, text=True,
                          timeout=1200, cwd=REPO,
                          env=dict(__import__("os").environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    report = (out / "learned_scales.md").read_text()
    for row in ("| fixed | nonoverlapping |", "| per_layer_head | nonoverlapping |",
                "| offset | per_head |", "| one_sided | fixed |", "| LM per_layer_head |"):
        assert row in report, row
    assert (out / "learned_scales.png").stat().st_size > 10_000
    import json

    scales = json.loads((out / "scales.json").read_text())
    assert len(scales) == 6 and all(v["key"].endswith("alibi.scales") for v in scales.values())


def test_a_decoding_step_uses_the_scales(lm_data):
    """KV-cache decoding, one token at a time, equals the full forward: learned per-layer scales
    and a fixed (not learned) initial scale alike."""
    for flags in (["--alibi-learned-scales", "per_layer_head"], ["--alibi-scale-init", "0.5"]):
        torch.manual_seed(0)
        lm, _ = build_model("lm", lm_data, *flags)
        if lm.decoder.alibi.scales is not None:
            with torch.no_grad():
                lm.decoder.alibi.scales.uniform_(0.3, 3.0)
        lm.eval()
        tokens = torch.randint(4, 40, (2, 10))
        with torch.no_grad():
            full = lm(tokens)[0]
            steps = decode_token_by_token(lm, tokens)
        torch.testing.assert_close(steps, full, atol=2e-5, rtol=1e-4)
