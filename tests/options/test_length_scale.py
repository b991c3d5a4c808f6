"""``--alibi-length-scale N``: beyond the training length N, a sequence of n real tokens uses the
slopes times log n / log N. Exact against a float64 reference on every backend that claims it
(the others refuse, so ``auto`` never picks them), each padded row as if alone, nothing changed
up to N, a load-time override of a model saved without it, and clear errors."""

import math

import pytest
import torch
from fairseq import checkpoint_utils

from fairseq_alibi.alibi import length_factors
from fairseq_alibi.modules.alibi_multihead_attention import (
    AlibiMultiheadAttention,
    set_attention_backend,
)
from fairseq_alibi.modules.bias import AlibiBias
from tests.helpers.building import build_model, setup_from_command_line, write_dictionary
from tests.helpers.references import reference_bias, reference_module_attention
from tests.helpers.training import COMMON, MODELS

HEADS, DIM, N = 4, 32, 4
LENGTHS = (9, 6, 4)  # factors log 9 / log 4, log 6 / log 4 and 1


def attention(variant, length_scale=N):
    torch.manual_seed(0)
    ratio = 0.5 if variant == "asymmetric" else 1.0
    alibi = AlibiBias(HEADS, variant=variant, future_slope_ratio=ratio, length_scale=length_scale)
    attn = AlibiMultiheadAttention(DIM, HEADS, alibi.layer(0)).eval()
    for p in attn.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return attn, alibi


def test_the_factor():
    got = length_factors(torch.tensor([1, 3, 4, 9, 64]), 4)
    want = torch.tensor([1.0, 1.0, 1.0, math.log(9) / math.log(4), 3.0])
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("backend", ["naive", "sdpa", "auto", "fold", "flex"])
@pytest.mark.parametrize("variant", ["symmetric", "offset", "one_sided", "asymmetric"])
def test_every_backend_matches_the_float64_reference_or_refuses(variant, backend):
    attn, alibi = attention(variant)
    T, B = max(LENGTHS), len(LENGTHS)
    x = torch.randn(T, B, DIM)
    kpm = torch.arange(T)[None, :] >= torch.tensor(LENGTHS)[:, None]
    set_attention_backend(attn, backend)
    if backend in ("fold", "flex"):
        with pytest.raises(ValueError, match="per batch row .*--alibi-length-scale"):
            attn(x, x, x, key_padding_mask=kpm, need_weights=False)
        return
    with torch.no_grad():
        out, _ = attn(x, x, x, key_padding_mask=kpm, need_weights=False)
        weighted, _ = attn(x, x, x, key_padding_mask=kpm, need_weights=True)  # naive's path
    slopes, future = alibi.slopes_of()
    for b, n in enumerate(LENGTHS):
        f = max(1.0, math.log(n) / math.log(N))
        bias = reference_bias(variant, (slopes * f).tolist(),
                              None if future is None else (future * f).tolist(), n)
        want = reference_module_attention(attn, x[:n, b:b + 1], bias)
        for got in (out, weighted):
            torch.testing.assert_close(got[:n, b:b + 1].double(), want, atol=1e-5, rtol=0)


def test_up_to_the_training_length_nothing_changes():
    scaled, _ = attention("offset")
    plain, _ = attention("offset", length_scale=0)
    plain.load_state_dict(scaled.state_dict())
    x = torch.randn(N, 2, DIM)
    with torch.no_grad():
        assert torch.equal(scaled(x, x, x)[0], plain(x, x, x)[0])
        longer = torch.randn(N + 1, 2, DIM)
        assert not torch.allclose(scaled(longer, longer, longer)[0],
                                  plain(longer, longer, longer)[0])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dictionary(tmp_path_factory.mktemp("length_scale"), 40)


def tokens_of(lengths):
    torch.manual_seed(3)
    tokens = torch.full((len(lengths), max(lengths)), 1)  # <pad> is 1
    for b, n in enumerate(lengths):
        tokens[b, :n] = torch.randint(4, 40, (n,))
        tokens[b, 0] = 0  # <s>
    return tokens


def test_a_padded_row_equals_the_same_row_alone_and_equals_its_slope_scale(data):
    model, _ = build_model("encoder", data, "--alibi-length-scale", N)
    model.eval()
    tokens = tokens_of((11, 7, 3))
    with torch.no_grad():
        together = model(tokens, features_only=True)[0]
        for b in range(tokens.size(0)):
            n = int(tokens[b].ne(1).sum())
            alone = model(tokens[b:b + 1, :n], features_only=True)[0]
            torch.testing.assert_close(together[b:b + 1, :n], alone, atol=1e-5, rtol=0)
    # an unpadded sequence of n tokens: the model at the run-time slope scale log n / log N
    plain, _ = build_model("encoder", data, "--alibi-slope-scale", math.log(11) / math.log(N))
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(model(tokens[:1], features_only=True)[0],
                                   plain.eval()(tokens[:1], features_only=True)[0],
                                   atol=1e-5, rtol=0)


def test_a_model_saved_without_it_takes_it_at_load_time(data, tmp_path):
    """The evaluation case: a model trained without the option, scored with
    ``--model-overrides "{'alibi_length_scale': N}"`` (what fairseq-validate and the hub pass)."""
    from fairseq.trainer import Trainer

    args = [data, *MODELS["encoder"], *COMMON]
    cfg, task = setup_from_command_line(*args)
    model = task.build_model(cfg.model)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    trainer.consolidate_optimizer()
    path = tmp_path / "checkpoint.pt"
    trainer.save_checkpoint(str(path), {})
    scaled = checkpoint_utils.load_model_ensemble(
        [str(path)], arg_overrides={"data": str(data), "alibi_length_scale": N})[0][0].eval()
    assert scaled.encoder.sentence_encoder.alibi.length_scale == N
    plain, _ = build_model("encoder", data, "--alibi-slope-scale", math.log(11) / math.log(N))
    plain.load_state_dict(model.state_dict())
    tokens = tokens_of((11,))
    with torch.no_grad():
        torch.testing.assert_close(scaled(tokens, features_only=True)[0],
                                   plain.eval()(tokens, features_only=True)[0],
                                   atol=1e-5, rtol=0)


@pytest.mark.parametrize("flags,error", [
    (["--alibi-length-scale", 1], "--alibi-length-scale must be 0 .off. or the training length"),
    (["--alibi-variant", "none", "--alibi-length-scale", 8],
     "--alibi-length-scale needs --alibi-variant symmetric, one_sided, offset or asymmetric, "
     "not none"),
])
def test_nonsense_is_a_one_line_error(data, flags, error):
    with pytest.raises(ValueError, match=error):
        build_model("encoder", data, *flags)


def test_it_is_an_option_of_bidirectional_stacks_only(data, capsys):
    """A causal stack sees only the past, which grows at every position: no flag there."""
    with pytest.raises(SystemExit):
        build_model("lm", data, "--alibi-length-scale", 8)
    assert "unrecognized arguments: --alibi-length-scale" in capsys.readouterr().err


@pytest.mark.parametrize("learned,builds", [("none", 1), ("per_layer", 2)])
def test_the_per_sequence_bias_is_built_once_per_pass_for_layers_that_share_slopes(
        monkeypatch, learned, builds):
    """Two layers of one stack, one forward pass (the same mask): the factors are computed
    once and the (B, H, T, S) bias built once when the layers share their slopes, once per
    layer when each has its own scale; the next pass builds it again."""
    import fairseq_alibi.modules.bias as bias_module

    alibi = AlibiBias(HEADS, variant="offset", length_scale=N, learned_scales=learned,
                      num_layers=2)
    if learned != "none":
        with torch.no_grad():
            alibi.scales.copy_(torch.tensor([[0.5], [2.0]]).expand_as(alibi.scales))
    layers = [AlibiMultiheadAttention(DIM, HEADS, alibi.layer(i)).eval() for i in range(2)]
    calls = []
    real = bias_module.alibi_bias
    monkeypatch.setattr(bias_module, "alibi_bias", lambda *a, **k: calls.append(a) or real(*a, **k))
    T = max(LENGTHS)
    kpm = torch.arange(T)[None, :] >= torch.tensor(LENGTHS)[:, None]
    x = torch.randn(T, len(LENGTHS), DIM)
    distinct = len({max(1.0, math.log(n) / math.log(N)) for n in LENGTHS})
    with torch.no_grad():
        outs = [layer(x, x, x, key_padding_mask=kpm, need_weights=False)[0] for layer in layers]
        assert len(calls) == builds * distinct
        next_mask = kpm.clone()  # the next pass: a mask of its own, shared by its layers
        again = [layer(x, x, x, key_padding_mask=next_mask, need_weights=False)[0]
                 for layer in layers]
        assert len(calls) == 2 * builds * distinct
    for a, b in zip(outs, again):
        assert torch.equal(a, b)
    for i, scale in enumerate((0.5, 2.0) if learned != "none" else (1.0, 1.0)):
        # each layer with its own slopes: that layer alone with its slopes scaled by hand
        alone = AlibiMultiheadAttention(DIM, HEADS, AlibiBias(
            HEADS, variant="offset", length_scale=N, slope_scale=scale).layer(0)).eval()
        alone.load_state_dict(layers[i].state_dict())
        with torch.no_grad():
            want = alone(x, x, x, key_padding_mask=kpm, need_weights=False)[0]
        torch.testing.assert_close(outs[i], want, atol=1e-6, rtol=0)
