"""``--alibi-window-cutoff T`` (slope windows) as a model option: declared once, it is
a flag of every family and side with a distance bias, a hydra field, 0 (today's bias) for
checkpoints written before it, saved and loaded, a load-time override of a model trained
without it, a one-line error for bad values, and cached decoding equals the full forward with
the same cutoff."""

import pytest
import torch
from fairseq import checkpoint_utils

from fairseq_alibi import options
from fairseq_alibi.config_access import cfg_get
from tests.helpers.building import (build_model, compose, decode_token_by_token,
                                    build_tiny_translation, write_dictionary)
from tests.helpers.checkpoints import saved_by_trainer as save
from tests.helpers.cli import REPO
from tests.helpers.training import COMMON, MODELS

FIXTURES = REPO / "tests" / "fixtures" / "saved_models"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dictionary(tmp_path_factory.mktemp("window_cutoff"), 40)


def tokens(rows=2, length=16):
    torch.manual_seed(3)
    return torch.randint(4, 40, (rows, length))


def perturbed(model):
    """Weights away from their initial values (every term counts)."""
    torch.manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def test_every_family_and_side_with_a_distance_bias_has_the_flag(data, tmp_path):
    lm, _ = build_model("lm", data, "--alibi-window-cutoff", 8)
    assert lm.decoder.alibi.window_cutoff == 8.0
    encoder, _ = build_model("encoder", data, "--alibi-window-cutoff", 4.5)
    assert encoder.encoder.sentence_encoder.alibi.window_cutoff == 4.5
    mt = build_tiny_translation(write_dictionary(tmp_path / "pair", 20),
                                "--encoder-alibi-window-cutoff", 6,
                                "--decoder-alibi-window-cutoff", 2)
    assert (mt.encoder.alibi.window_cutoff, mt.decoder.alibi.window_cutoff) == (6.0, 2.0)
    assert options.default_of("window_cutoff") == 0.0
    assert lm.decoder.alibi.layer(0).windowed and not build_model(
        "lm", data)[0].decoder.alibi.layer(0).windowed


@pytest.mark.parametrize("model,flags,error", [
    ("lm", ["--alibi-window-cutoff", -1],
     "--alibi-window-cutoff must be a finite number of nats >= 0 .0 = off., got -1"),
    ("lm", ["--alibi-window-cutoff", "nan"], "--alibi-window-cutoff must be a finite number"),
    ("lm", ["--alibi-window-cutoff", "inf"], "--alibi-window-cutoff must be a finite number"),
    ("encoder", ["--alibi-variant", "none", "--alibi-window-cutoff", 8],
     "--alibi-window-cutoff needs --alibi-variant symmetric, one_sided, offset or asymmetric, "
     "not none: it shapes the ALiBi bias"),
])
def test_nonsense_is_a_one_line_error(data, model, flags, error):
    with pytest.raises(ValueError, match=error) as raised:
        build_model(model, data, *flags)
    assert "\n" not in str(raised.value)


def test_a_translation_side_without_a_bias_refuses_it_by_its_own_flag():
    decoder = options.read(options.StackOptions, {"decoder_alibi_variant": "none",
                                                  "decoder_alibi_window_cutoff": 2.0},
                           options.TRANSLATION_DECODER)
    with pytest.raises(ValueError, match="^--decoder-alibi-window-cutoff needs "
                                         "--decoder-alibi-variant causal, not none"):
        decoder.check(options.TRANSLATION_DECODER, 4)
    encoder = options.read(options.StackOptions, {"encoder_alibi_window_cutoff": -2.0},
                           options.TRANSLATION_ENCODER)
    with pytest.raises(ValueError, match="^--encoder-alibi-window-cutoff must be a finite"):
        encoder.check(options.TRANSLATION_ENCODER, 4)


def test_a_hydra_field_and_the_default_of_old_configurations():
    assert compose(REPO / "config" / "lm", "wikitext103_alibi").model.alibi_window_cutoff == 0
    cfg = compose(REPO / "config" / "lm", "wikitext103_alibi", ["++model.alibi_window_cutoff=8"])
    assert cfg.model.alibi_window_cutoff == 8
    assert options.read(options.StackOptions, cfg.model, options.LM).window_cutoff == 8.0
    old = {"alibi_variant": "offset"}  # a configuration written before the option
    options.fill_defaults(old, options.StackOptions, options.ENCODER)
    assert old["alibi_window_cutoff"] == 0.0


@pytest.mark.parametrize("backend", ["auto", "windowed", "naive"])
@pytest.mark.parametrize("learned", ["none", "per_layer_head"])
def test_cached_decoding_equals_the_full_forward_with_the_same_cutoff(data, backend, learned):
    """4 heads, slopes 1/4 … 1/256, cutoff 1: windows 4, 16, 64, 256 keys; 24 tokens."""
    model, _ = build_model("lm", data, "--alibi-window-cutoff", 1, "--alibi-attention", backend,
                           "--alibi-learned-scales", learned)
    model = perturbed(model)
    x = tokens(length=24)
    dense, _ = build_model("lm", data, "--alibi-attention", backend,
                           "--alibi-learned-scales", learned)
    dense.load_state_dict(model.state_dict())
    with torch.no_grad():
        full = model(x)[0]
        steps = decode_token_by_token(model, x)
        assert not torch.allclose(full, dense.eval()(x)[0], atol=1e-3)  # the windows count
    torch.testing.assert_close(steps, full, atol=2e-5, rtol=1e-4)


def test_saved_and_loaded_it_computes_the_same(data, tmp_path):
    flags = ["--alibi-window-cutoff", 1.5]
    model, task = build_model("lm", data, *flags)
    model = perturbed(model)
    path = save(model, task, [data, *MODELS["lm"], *COMMON, *flags], tmp_path / "lm.pt")
    loaded = checkpoint_utils.load_model_ensemble(
        [str(path)], arg_overrides={"data": str(data)})[0][0].eval()
    assert loaded.decoder.alibi.window_cutoff == 1.5
    with torch.no_grad():
        assert torch.equal(loaded(tokens())[0], model(tokens())[0])
    saved = torch.load(path, weights_only=False)["cfg"]["model"]
    assert cfg_get(saved, "alibi_window_cutoff") == 1.5


def _fixture(**overrides):
    return checkpoint_utils.load_model_ensemble(
        [str(FIXTURES / "lm_learned_per_layer_head" / "checkpoint.pt")],
        arg_overrides={"data": str(FIXTURES), **overrides})[0][0].eval()


def test_a_model_saved_without_it_takes_it_at_load_time():
    """``--model-overrides "{'alibi_window_cutoff': 1}"`` on a checkpoint written before the
    option (learned per-layer scales: each layer its own windows): the stack gets the cutoff,
    and the model computes what the same weights compute with the cutoff on (each layer's
    windowed bias: tests/attention/test_window_cutoff.py), not the dense figures."""
    saved = torch.load(FIXTURES / "outputs.pt", weights_only=False)["lm_learned_per_layer_head"]
    windowed = _fixture(alibi_window_cutoff=1)
    assert windowed.decoder.alibi.window_cutoff == 1.0
    plain = _fixture()
    assert plain.decoder.alibi.window_cutoff == 0.0  # filled for the old configuration
    x = saved["tokens"]
    with torch.no_grad():
        torch.testing.assert_close(plain(x)[0], saved["output"], rtol=0, atol=1e-5)
        got = windowed(x)[0]
        assert not torch.allclose(got, saved["output"], atol=1e-3)
        plain.decoder.alibi.window_cutoff = 1.0  # the use, on the model loaded as trained
        assert torch.equal(got, plain(x)[0])
        torch.testing.assert_close(decode_token_by_token(windowed, x), got, atol=2e-5,
                                   rtol=1e-4)


def test_a_misspelt_override_is_refused():
    with pytest.raises(ValueError, match="unknown ALiBi option 'alibi_window_cutof' in "
                                         "--model-overrides .did you mean "
                                         "'alibi_window_cutoff'.."):
        _fixture(alibi_window_cutof=8)
