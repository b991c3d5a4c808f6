"""Slope interpolation: ``alibi_slope_scale`` (slopes × L_train / L_eval) as a load-time override.

Off (1.0) is bit-identical to the default model; on, every slope the model uses is multiplied by
exactly the ratio and nothing else changes; the checkpoint keeps the trained slopes, and
``fairseq-eval-lm --model-overrides`` and the extrapolation sweep apply it at load time.
"""

import os
import re
import subprocess
import sys

import pytest
import torch

from fairseq_alibi.alibi import alibi_bias, get_slopes, variant_slopes
from fairseq_alibi.modules.bias import AlibiBias
from tests.helpers.building import build_from_command_line, write_dictionary
from tests.helpers.cli import run_cli

L = 16
LM = ["--task", "language_modeling", "--arch", "alibi_transformer_lm", "--decoder-layers", "2",
      "--decoder-embed-dim", "32", "--decoder-input-dim", "32", "--decoder-output-dim", "32",
      "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "4",
      "--share-decoder-input-output-embed"]
RATIOS = [0.25, 0.5, 64 / 80, 0.3]


@pytest.fixture(scope="module")
def dict_dir(tmp_path_factory):
    return write_dictionary(tmp_path_factory.mktemp("slope_dict"), 60)


def lm(dict_dir, *extra):
    torch.manual_seed(0)
    model, _ = build_from_command_line(dict_dir, *LM, *extra)
    return model.eval()


@pytest.mark.parametrize("ratio", RATIOS)
def test_bias_module_scales_every_slope_exactly_by_the_ratio(ratio):
    heads = 8
    scaled = AlibiBias(heads, slope_scale=ratio)
    slopes, _ = scaled.slopes_of()
    assert torch.equal(slopes, get_slopes(heads) * ratio)
    if ratio in (0.25, 0.5):  # powers of two: the product is exact
        assert slopes.double().tolist() == [m * ratio for m in get_slopes(heads).double().tolist()]
    assert torch.equal(scaled(5, 9), alibi_bias(get_slopes(heads) * ratio, 5, 9, "causal"))
    assert torch.equal(scaled.state_dict()["slopes"], get_slopes(heads))  # trained slopes kept


def test_slope_scale_off_is_bit_identical_to_the_default_model(dict_dir):
    default, off = lm(dict_dir), lm(dict_dir, "--alibi-slope-scale", "1.0")
    assert off.decoder.alibi.slope_scale == 1.0
    for (k, a), (k2, b) in zip(default.state_dict().items(), off.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    tokens = torch.randint(4, 60, (2, 4 * L))
    with torch.no_grad():
        assert torch.equal(default(tokens)[0], off(tokens)[0])
    assert torch.equal(default.decoder.alibi(7, 7), off.decoder.alibi(7, 7))


@pytest.mark.parametrize("ratio", [0.25, 64 / 80])
def test_slope_scale_on_equals_a_model_with_slopes_times_the_ratio(dict_dir, ratio):
    """Scaling changes the slopes, exactly by the ratio, and nothing else in the model."""
    scaled = lm(dict_dir, "--alibi-slope-scale", str(ratio))
    by_hand = lm(dict_dir)
    by_hand.decoder.alibi.slopes.mul_(ratio)  # the same weights, slopes multiplied in place
    tokens = torch.randint(4, 60, (2, 4 * L))
    with torch.no_grad():
        out_scaled, out_by_hand = scaled(tokens)[0], by_hand(tokens)[0]
        out_default = lm(dict_dir)(tokens)[0]
    assert torch.equal(out_scaled, out_by_hand)
    assert not torch.allclose(out_scaled, out_default)
    assert torch.equal(scaled.state_dict()["decoder.alibi.slopes"], get_slopes(4))


def test_encoder_slope_scale(dict_dir):
    model, _ = build_from_command_line(
        dict_dir, "--task", "masked_lm", "--arch", "alibi_roberta", "--encoder-layers", "1",
        "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", "4", "--alibi-variant", "one_sided",
        "--alibi-slope-scale", "0.5")
    slopes, _ = model.encoder.sentence_encoder.alibi.slopes_of()
    assert torch.equal(slopes, variant_slopes(4, "one_sided") * 0.5)


# ------------------------------------------------------------------ at load time, through the CLIs


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_lm_data, alibi_user_dir):
    save = tmp_path_factory.mktemp("slope_ckpt")
    run_cli("fairseq-train", tiny_lm_data, "--user-dir", alibi_user_dir, *LM,
            "--tokens-per-sample", L, "--sample-break-mode", "none", "--max-tokens", 256,
            "--optimizer", "adam", "--lr", 0.003, "--cpu", "--no-progress-bar", "--seed", 1,
            "--num-workers", 0, "--disable-validation", "--max-update", 6, "--save-dir", save)
    return save / "checkpoint_last.pt"


def eval_lm(path, data, user_dir, length, *extra):
    out = run_cli("fairseq-eval-lm", data, "--user-dir", user_dir, "--path", path, "--cpu",
                  "--max-tokens", 4096, "--num-workers", 0, "--tokens-per-sample", length, *extra)
    tokens = int(re.search(r"Evaluated ([\d,]+) tokens", out).group(1).replace(",", ""))
    loss = re.search(r"Loss \(base 2\): ([\d.]+)", out).group(1)
    return tokens, loss


@pytest.mark.slow
def test_eval_lm_model_overrides_apply_slope_interpolation(trained, tiny_lm_data, alibi_user_dir):
    n = 4 * L
    tokens, default = eval_lm(trained, tiny_lm_data, alibi_user_dir, n)
    same_tokens, off = eval_lm(trained, tiny_lm_data, alibi_user_dir, n,
                               "--model-overrides", "{'alibi_slope_scale': 1.0}")
    scaled_tokens, on = eval_lm(trained, tiny_lm_data, alibi_user_dir, n,
                                "--model-overrides", "{'alibi_slope_scale': %r}" % (L / n))
    assert tokens > 0 and tokens == same_tokens == scaled_tokens
    assert off == default  # the printed loss, to every printed digit
    assert on != default


@pytest.mark.slow
def test_override_reaches_the_loaded_model_not_the_checkpoint(trained, tiny_lm_data):
    from fairseq import checkpoint_utils

    import fairseq_alibi  # noqa: F401

    state = torch.load(trained, map_location="cpu")
    assert torch.equal(state["model"]["decoder.alibi.slopes"], get_slopes(4))
    (model,), _ = checkpoint_utils.load_model_ensemble(
        [str(trained)], arg_overrides={"alibi_slope_scale": 0.25,
                                       "data": str(tiny_lm_data)})
    assert model.decoder.alibi.slope_scale == 0.25
    assert torch.equal(model.decoder.alibi.slopes_of()[0], get_slopes(4) * 0.25)
    assert torch.equal(model.decoder.alibi.slopes, get_slopes(4))


@pytest.mark.slow
def test_sweep_measures_slope_interpolation(trained, tiny_lm_data, tmp_path):
    """``python -m fairseq_alibi.sweep --slope-interpolation``: a second row, slopes x L/N, of
    the slope scale the model was saved with (an override replaces it)."""
    import csv

    state = torch.load(trained, map_location="cpu")
    state["cfg"]["model"]["alibi_slope_scale"] = 0.5  # as if trained with --alibi-slope-scale 0.5
    saved = tmp_path / "scaled.pt"
    torch.save(state, saved)
    out = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, "-m", "fairseq_alibi.sweep", "--path", f"ALiBi={saved}",
         "--data", str(tiny_lm_data), "--lengths", f"{L},{4 * L}", "--out", str(out),
         "--modes", "nonoverlapping", "--train-length", str(L), "--slope-interpolation",
         "--jobs", "2", "--threads", "1", "--no-progress", "--cpu"],
        capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(out / "extrapolation.csv") as f:
        ppl = {(r["model"], int(r["length"])): float(r["perplexity"]) for r in csv.DictReader(f)}
    interpolated = "ALiBi, slopes x L/N"
    assert ppl[("ALiBi", L)] == ppl[(interpolated, L)]  # as saved at the trained length
    assert ppl[("ALiBi", 4 * L)] != ppl[(interpolated, 4 * L)]
    log = (out / "logs" / f"ALiBi_slopes_x_L_N_nonoverlapping_{4 * L}.log").read_text()
    assert "'alibi_slope_scale': 0.125" in log  # 0.5 x L/4L
    assert interpolated in (out / "extrapolation.md").read_text()
