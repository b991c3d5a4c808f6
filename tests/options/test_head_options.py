"""Partial-head ALiBi (``--alibi-heads``), global first tokens (``--alibi-global-tokens``) and
the classification pooler (``--classification-pooler``): exact against a float64 reference on
every backend that claims them (the others refuse, so ``auto`` never picks them), padding
invariance, save/load, hydra fields, and what export-hf cannot express."""


import pytest
import torch
from fairseq import checkpoint_utils

from fairseq_alibi.alibi import get_slopes
from fairseq_alibi.cli.checkpoint_io import PlaceholderTask
from fairseq_alibi.config_access import cfg_get
from fairseq_alibi.modules.alibi_multihead_attention import (
    AlibiMultiheadAttention,
    set_attention_backend,
)
from fairseq_alibi.modules.attention import dispatch
from fairseq_alibi.modules.bias import AlibiBias
from fairseq_alibi.modules.stacks import UNBOUNDED_POSITIONS
from tests.helpers.building import build_model, compose, setup_from_command_line, write_dictionary
from tests.helpers.checkpoints import saved_by_trainer as save
from tests.helpers.cli import REPO
from tests.helpers.references import reference_bias, reference_module_attention
from tests.helpers.training import COMMON, MODELS


HEADS, DIM = 4, 32
BACKENDS = ["naive", "sdpa", "fold", "flex", "auto"]


def attention(variant, **options):
    torch.manual_seed(0)
    ratio = 0.5 if variant == "asymmetric" else 1.0
    alibi = AlibiBias(HEADS, variant=variant, future_slope_ratio=ratio, **options)
    attn = AlibiMultiheadAttention(DIM, HEADS, alibi.layer(0)).eval()
    for p in attn.parameters():  # every term away from zero
        torch.nn.init.normal_(p, std=0.3)
    return attn, alibi


CASES = {  # name -> (AlibiBias options, variants)
    "2 of 4 heads": (dict(heads=2), ["causal", "symmetric", "offset", "asymmetric"]),
    "1 of 4 heads": (dict(heads=1), ["causal", "offset"]),
    "2 global tokens": (dict(global_tokens=2),
                        ["causal", "symmetric", "one_sided", "offset", "asymmetric"]),
    "both": (dict(heads=2, global_tokens=1), ["offset", "asymmetric"]),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case,variant", [(c, v) for c, (_, vs) in CASES.items() for v in vs])
@pytest.mark.parametrize("padded", [False, True])
def test_every_backend_matches_the_float64_reference_or_refuses(case, variant, backend, padded):
    options = CASES[case][0]
    attn, alibi = attention(variant, **options)
    T, B = 9, 3
    x = torch.randn(T, B, DIM)
    kpm = torch.arange(T)[None, :] >= torch.tensor([9, 6, 4])[:, None] if padded else None
    call = dispatch.Call("cpu", torch.float32, variant, T, T, B, HEADS, padded=padded,
                         global_tokens=alibi.global_tokens)
    reason = dispatch.REGISTRY[backend].unsupported(call) if backend != "auto" else None
    set_attention_backend(attn, backend)
    if reason is not None:
        assert "global tokens" in reason  # the only thing these options make a backend refuse
        with pytest.raises(ValueError, match="cannot serve this call: global tokens"):
            attn(x, x, x, key_padding_mask=kpm, need_weights=False)
        assert dispatch.auto_backend(call) in ("sdpa", "naive")
        return
    with torch.no_grad():
        out, _ = attn(x, x, x, key_padding_mask=kpm, need_weights=False)
    slopes, future = alibi.slopes_of()
    future = future.tolist() if future is not None else None
    want = reference_module_attention(attn, x, reference_bias(variant, slopes.tolist(), future, T,
                                             alibi.global_tokens), kpm)
    real = ~kpm.T if padded else torch.ones(T, B, dtype=torch.bool)
    rows = torch.isfinite(want).all(-1) & real
    assert torch.allclose(out.double()[rows], want[rows], atol=1e-5, rtol=0)


def test_partial_heads_take_presss_slopes_of_k_heads_and_none_for_the_rest():
    alibi = AlibiBias(8, variant="offset", heads=4)
    assert torch.equal(alibi.slopes, torch.cat([get_slopes(4), torch.zeros(4)]))
    bias = alibi(5, 5)
    assert (bias[4:] == 0).all() and (bias[:4] != 0).any()
    causal = AlibiBias(8, variant="causal", heads=2)(5, 5)
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)
    assert (causal[2:][:, ~future] == 0).all() and (causal[2:][:, future] < -1e30).all()


def test_gradients_of_partial_heads_and_global_tokens_match_naive():
    for backend in ("sdpa", "fold"):
        outs = {}
        for name in ("naive", backend):
            attn, _ = attention("offset", heads=2)
            set_attention_backend(attn.train(), name)
            x = torch.randn(11, 2, DIM, generator=torch.Generator().manual_seed(1),
                            requires_grad=True)
            out, _ = attn(x, x, x, need_weights=False)
            out.square().sum().backward()
            outs[name] = (out.detach(), x.grad, attn.q_proj.weight.grad)
        for got, want in zip(outs[backend], outs["naive"]):  # (sums over every logit)
            torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)


def test_cached_decoding_with_partial_heads_equals_the_full_forward():
    attn, _ = attention("causal", heads=2)
    x = torch.randn(12, 2, DIM)
    with torch.no_grad():
        full, _ = attn(x, x, x, need_weights=False)
        state, steps = {}, []
        for t in range(12):
            step, _ = attn(x[t:t + 1], x[t:t + 1], x[t:t + 1], incremental_state=state,
                           need_weights=False)
            steps.append(step)
    torch.testing.assert_close(torch.cat(steps), full, atol=1e-5, rtol=0)


# ------------------------------------------------------------------ alibi_roberta with them


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dictionary(tmp_path_factory.mktemp("head_options"), 40)


OPTIONS = ["--alibi-heads", 2, "--alibi-global-tokens", 1, "--classification-pooler", "mean"]


def encoder(data, *extra):
    model, task = build_model("encoder", data, *extra)
    model.register_classification_head("head", num_classes=3)
    return model.eval(), task


def batch(rows=((9, 0), (6, 1), (4, 2))):
    torch.manual_seed(3)
    tokens = torch.full((len(rows), max(n for n, _ in rows)), 1)  # <pad> is 1
    for b, (n, _) in enumerate(rows):
        tokens[b, :n] = torch.randint(4, 40, (n,))
        tokens[b, 0] = 0  # <s>
    return tokens


def test_a_padded_row_equals_the_same_row_alone(data):
    model, _ = encoder(data, *OPTIONS)
    tokens = batch()
    with torch.no_grad():
        together = model(tokens, classification_head_name="head")[0]
        features = model(tokens, features_only=True)[0]
        for b in range(tokens.size(0)):
            n = int(tokens[b].ne(1).sum())
            alone = model(tokens[b:b + 1, :n], classification_head_name="head")[0]
            torch.testing.assert_close(together[b:b + 1], alone, atol=1e-5, rtol=0)
            alone_features = model(tokens[b:b + 1, :n], features_only=True)[0]
            torch.testing.assert_close(features[b:b + 1, :n], alone_features, atol=1e-5, rtol=0)


def test_the_mean_pooler_reads_the_mean_of_the_real_tokens(data):
    model, _ = encoder(data, "--classification-pooler", "mean")
    first, _ = encoder(data)
    first.load_state_dict({k: v for k, v in model.state_dict().items() if "pooler" not in k})
    tokens = batch()
    with torch.no_grad():
        features = model(tokens, features_only=True)[0]
        real = tokens.ne(1)[..., None].float()
        mean = (features * real).sum(1) / real.sum(1)
        # the stock head, reading the mean as if it were <s>'s features
        want = first.classification_heads["head"](mean[:, None, :])
        got = model(tokens, classification_head_name="head")[0]
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="call the model"):
        model.classification_heads["head"](torch.randn(2, 5, 32))  # features of another batch


def test_options_reach_the_layers_and_the_task_keeps_long_inputs(data):
    model, task = encoder(data, *OPTIONS)
    stack = model.encoder.sentence_encoder.alibi
    assert stack.global_tokens == 1 and int(stack.slopes.ne(0).sum()) == 2
    assert all(layer.self_attn.alibi.global_tokens == 1
               for layer in model.encoder.sentence_encoder.layers)
    assert model.max_positions() == UNBOUNDED_POSITIONS


@pytest.mark.parametrize("flags,error", [
    (["--alibi-heads", 5], "--alibi-heads must be between 1 and the 4 attention heads, got 5"),
    (["--alibi-heads", 0], "--alibi-heads must be >= 1"),
    (["--alibi-global-tokens", -1], "--alibi-global-tokens must be >= 0"),
    (["--alibi-variant", "one_sided", "--alibi-heads", 2], "one_sided splits its heads"),
    (["--alibi-variant", "none", "--alibi-global-tokens", 1],
     "--alibi-global-tokens needs --alibi-variant symmetric, one_sided, offset or asymmetric, "
     "not none: it shapes the ALiBi bias"),
])
def test_nonsense_is_a_one_line_error(data, flags, error):
    with pytest.raises(ValueError, match=error):
        build_model("encoder", data, *flags)


def test_global_tokens_are_an_encoder_option_only(data, capsys):
    """A causal LM's prompts and a translation's sources are padded on the left: their first
    positions are not the same tokens in every row, so the flag does not exist there."""
    with pytest.raises(SystemExit):
        build_model("lm", data, "--alibi-global-tokens", 1)
    assert "unrecognized arguments: --alibi-global-tokens" in capsys.readouterr().err


def test_partial_heads_reach_every_family(data, tmp_path):
    lm, _ = build_model("lm", data, "--alibi-heads", 2)
    assert int(lm.decoder.alibi.slopes.ne(0).sum()) == 2
    pair = tmp_path / "pair"
    pair.mkdir()
    for side in ("src", "tgt"):
        (pair / f"dict.{side}.txt").write_text("".join(f"w{i} 1\n" for i in range(20)))
    cfg, task = setup_from_command_line(
        pair, "--task", "translation", "-s", "src", "-t", "tgt", "--arch", "alibi_transformer",
        "--encoder-layers", 1, "--decoder-layers", 1, "--encoder-embed-dim", 16,
        "--decoder-embed-dim", 16, "--encoder-attention-heads", 4,
        "--decoder-attention-heads", 4, "--encoder-alibi-heads", 1, "--decoder-alibi-heads", 3)
    mt = task.build_model(cfg.model)
    assert int(mt.encoder.alibi.slopes.ne(0).sum()) == 1
    assert int(mt.decoder.alibi.slopes.ne(0).sum()) == 3


def test_saved_and_loaded_they_compute_the_same(data, tmp_path):
    args = [data, *MODELS["encoder"], *COMMON, *OPTIONS]
    model, task = encoder(data, *OPTIONS)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    path = save(model, task, args, tmp_path / "checkpoint.pt")
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides={"data": str(data), "load_checkpoint_heads": True})
    loaded = models[0].eval()
    tokens = batch()
    with torch.no_grad():
        for kwargs in (dict(classification_head_name="head"), dict()):
            torch.testing.assert_close(loaded(tokens, **kwargs)[0], model(tokens, **kwargs)[0],
                                       atol=0, rtol=0)
    state = torch.load(path, weights_only=False)
    saved = state["cfg"]["model"]
    assert cfg_get(saved, "alibi_heads") == 2 and cfg_get(saved, "alibi_global_tokens") == 1
    assert bytes(state["model"]["classification_heads.head.pooler"].tolist()) == b"mean"


def test_a_checkpoint_of_other_heads_or_pooler_is_a_clear_error(data):
    model, _ = encoder(data, *OPTIONS)
    other_heads, _ = encoder(data, "--alibi-global-tokens", 1, "--classification-pooler", "mean")
    with pytest.raises(ValueError, match="trained with --alibi-heads 2 .*every head.*build it with --alibi-heads 2"):
        other_heads.load_state_dict(model.state_dict())
    first, _ = encoder(data, "--alibi-heads", 2, "--alibi-global-tokens", 1)
    with pytest.raises(ValueError, match="trained with --classification-pooler mean.*build it with "
                                         "--classification-pooler mean"):
        first.load_state_dict(model.state_dict())
    with pytest.raises(ValueError, match="build it with --classification-pooler first"):
        model.load_state_dict(first.state_dict())


def test_hydra_fields_build_the_same_model(data):
    cfg = compose(REPO / "config" / "glue", "sst_2", [
        "variant=alibi", "task.data=unused", "checkpoint.restore_file=unused",
        "++model.encoder_layers=1", "++model.encoder_embed_dim=32",
        "++model.encoder_ffn_embed_dim=64", "++model.encoder_attention_heads=4",
        "++model.alibi_heads=2",
        "++model.alibi_global_tokens=1", "++model.classification_pooler=mean"])
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.data import Dictionary

    dictionary = Dictionary.load(str(data / "dict.txt"))
    dictionary.add_symbol("<mask>")
    model = ARCH_MODEL_REGISTRY["alibi_roberta"].build_model(cfg.model,
                                                            PlaceholderTask(dictionary))
    model.register_classification_head("sentence_classification_head", num_classes=2)
    stack = model.encoder.sentence_encoder.alibi
    assert stack.global_tokens == 1 and int(stack.slopes.ne(0).sum()) == 2
    assert type(model.classification_heads["sentence_classification_head"]).__name__ == \
        "MeanPooledClassificationHead"


def test_export_hf_refuses_partial_heads(data, tmp_path, capsys):
    """BLOOM and MPT give every head a slope: a partial-head model has no export."""
    from fairseq_alibi.cli.hf_export_import import export_main

    args = [data, *MODELS["lm"], *COMMON, "--alibi-heads", 2]
    model, task = build_model("lm", data, "--alibi-heads", 2)
    path = save(model, task, args, tmp_path / "lm.pt")
    status = export_main([str(path), "--dict", str(data / "dict.txt"), "--bpe", "sentencepiece",
                          "--out", str(tmp_path / "hf")])
    error = capsys.readouterr().err.strip()
    assert status == 1 and "\n" not in error and \
        "--alibi-heads 2 (needs it dropped: every head has a slope there)" in error
    assert not (tmp_path / "hf").exists()


def test_the_hub_predicts_with_the_mean_pooler(data, tmp_path):
    """The hub's ``predict`` calls the head on the features itself: the model's forward pass
    before it tells the head where the padding is."""
    from fairseq_alibi.models.alibi_roberta import AlibiRobertaModel
    from tests.helpers.corpora import write_tiny_bpe

    model, task = encoder(data, *OPTIONS)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    save(model, task, [data, *MODELS["encoder"], *COMMON, *OPTIONS], tmp_path / "model.pt")
    write_tiny_bpe(tmp_path)
    roberta = AlibiRobertaModel.from_pretrained(str(tmp_path), "model.pt", str(data)).eval()
    for tokens in (batch()[1:2, :6], batch()):
        got = roberta.predict("head", tokens, return_logits=True)
        with torch.no_grad():
            want = model(tokens, classification_head_name="head")[0]
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
