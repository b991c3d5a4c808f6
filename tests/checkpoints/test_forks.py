"""Checkpoints of the two ALiBi forks (Press's, EIFY's) converted and checked against their outputs.

``/work/shared/fixtures/forks`` (beside the project) holds tiny real checkpoints written by each
fork's own CLIs, with the fork's outputs on fixed inputs (``ref.pt``). After
``python -m fairseq_alibi.convert`` the models must give the same log-probabilities / features /
MLM logits (1e-5), the same ``fairseq-eval-lm`` perplexity, work through the hub, train on
through the stock CLIs, and every weight must keep its value. Generality: fork-format
checkpoints of other sizes, head counts (non-powers of two) and lengths are written here and
compared with a float64 re-implementation of each fork's math, itself checked on the fixtures.
"""

import math
import random
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fairseq_alibi.alibi import get_slopes
from tests.helpers.checkpoints import load
from tests.helpers.cli import REPO, SHARED_DATA, run_cli

FORKS = REPO.parent / "shared" / "fixtures" / "forks"
GPT2 = SHARED_DATA / "gpt2_bpe"

pytestmark = pytest.mark.skipif(not FORKS.is_dir(), reason=f"no fork fixtures at {FORKS}")

LM = {"press_lm": "press", "press_lm_wiki103": "press", "eify_lm_alibi": None}
TRANSLATION = "eify_translation_alibi"
ROBERTA = ["eify_roberta_baseline", "eify_roberta_learned_clap", "eify_roberta_alibi_symmetric",
           "eify_roberta_alibi_offset", "eify_roberta_zero_clap"]
TOL = 1e-5


def fixture(name):
    return FORKS / name


def ref(name):
    return torch.load(fixture(name) / "ref.pt", weights_only=True)


def convert_to(input_path, output_path, **kwargs):
    from fairseq_alibi.cli.convert_checkpoints import convert_file

    return convert_file(input_path, output_path, **kwargs)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Every fixture converted once: name -> (path of the converted checkpoint, summary)."""
    out = {}
    for name, source in {**LM, **{n: None for n in ROBERTA + [TRANSLATION]}}.items():
        folder = tmp_path_factory.mktemp(name)
        summary = convert_to(fixture(name) / "checkpoint_last.pt", folder / "model.pt",
                             source=source)
        out[name] = (folder / "model.pt", summary)
    return out


def load_converted(path, data):
    from fairseq import checkpoint_utils

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides={"data": str(data)})
    return models[0].eval(), task


# --------------------------------------------------------------------------- float64 references


def fork_slopes(n):
    """The forks' get_slopes, as their READMEs quote it (Press's and EIFY's are the same)."""
    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start**i for i in range(n)]
    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + fork_slopes(2 * closest)[0::2][: n - closest]


def _layer(x, p, prefix, heads, bias, pre_norm, act, key_pad=None):
    """One fairseq transformer layer in float64: x (B, T, C), bias (H, T, T) with -inf masks."""
    B, T, C = x.shape
    d = C // heads

    def lin(name, h):
        return h @ p[f"{prefix}.{name}.weight"].T + p[f"{prefix}.{name}.bias"]

    def ln(name, h):
        return F.layer_norm(h, (C,), p[f"{prefix}.{name}.weight"], p[f"{prefix}.{name}.bias"])

    res, h = x, (ln("self_attn_layer_norm", x) if pre_norm else x)
    q, k, v = (lin(f"self_attn.{n}_proj", h).view(B, T, heads, d).transpose(1, 2)
               for n in ("q", "k", "v"))
    logits = (q * d**-0.5) @ k.transpose(-1, -2) + bias[None]
    if key_pad is not None:
        logits = logits.masked_fill(key_pad[:, None, None, :], float("-inf"))
    h = (logits.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
    x = res + lin("self_attn.out_proj", h)
    if not pre_norm:
        x = ln("self_attn_layer_norm", x)
    res, h = x, (ln("final_layer_norm", x) if pre_norm else x)
    x = res + lin("fc2", act(lin("fc1", h)))
    return x if pre_norm else ln("final_layer_norm", x)


def fork_lm_logprobs(state, fork, tokens):
    """log p(next | prefix) (B, T, V) of a plain-embedding fork LM (Press: bias m·j on the
    causal mask; EIFY: -m|i-j|), float64, from the fork's saved weights and config."""
    cfg = state["cfg"]["model"]
    p = {k: v.double() for k, v in state["model"].items()}
    C, H, T = cfg["decoder_embed_dim"], cfg["decoder_attention_heads"], tokens.shape[1]
    x = p["decoder.embed_tokens.weight"][tokens]
    if not cfg["no_scale_embedding"]:
        x = x * math.sqrt(C)
    m = torch.tensor(fork_slopes(H), dtype=torch.float64)[:, None, None]
    i, j = torch.arange(T)[:, None].double(), torch.arange(T)[None, :].double()
    bias = (m * j if fork == "press" else -m * (i - j).abs()).expand(H, T, T)
    bias = bias.masked_fill(j > i, float("-inf"))
    act = F.relu if cfg["activation_fn"] == "relu" else F.gelu
    pre = cfg["decoder_normalize_before"]
    for layer in range(cfg["decoder_layers"]):
        x = _layer(x, p, f"decoder.layers.{layer}", H, bias, pre, act)
    if pre and not cfg["no_decoder_final_norm"]:
        x = F.layer_norm(x, (C,), p["decoder.layer_norm.weight"], p["decoder.layer_norm.bias"])
    return (x @ p["decoder.output_projection.weight"].T).log_softmax(-1)


def fork_roberta(state, tokens, pad=1):
    """EIFY's RoBERTa (features, MLM logits) in float64 from its saved weights and config."""
    cfg = state["cfg"]["model"]
    p = {k: v.double() for k, v in state["model"].items()}
    enc = "encoder.sentence_encoder"
    C, H = cfg["encoder_embed_dim"], cfg["encoder_attention_heads"]
    B, T = tokens.shape
    table = p[f"{enc}.embed_tokens.weight"]
    x = table[tokens.clamp(max=table.shape[0] - 1)]
    if cfg["contrastive_pretraining"] and cfg["l2norm_embedding"]:
        x = F.normalize(x, dim=-1)
    if cfg["zero_masking"]:  # ids >= len(dictionary) (= rows) embed to zero
        x = x * (tokens < table.shape[0]).unsqueeze(-1)
    if not cfg["no_scale_embedding"]:
        x = x * math.sqrt(C)
    not_pad = tokens.ne(pad)
    if not cfg["no_token_positional_embeddings"]:
        positions = torch.cumsum(not_pad, 1) * not_pad + pad
        x = x + p[f"{enc}.embed_positions.weight"][positions]
    if cfg["layernorm_embedding"]:
        x = F.layer_norm(x, (C,), p[f"{enc}.layernorm_embedding.weight"],
                         p[f"{enc}.layernorm_embedding.bias"])
    x = x * not_pad.unsqueeze(-1)
    bias = torch.zeros(H, T, T, dtype=torch.float64)
    if cfg["encoder_alibi"]:
        i, j = torch.arange(T)[:, None].double(), torch.arange(T)[None, :].double()
        rel = (j - i).abs() - (0.5 * (j > i) if cfg["encoder_alibi_asymmetrical"] else 0.0)
        bias = -torch.tensor(fork_slopes(H), dtype=torch.float64)[:, None, None] * rel
    for layer in range(cfg["encoder_layers"]):
        x = _layer(x, p, f"{enc}.layers.{layer}", H, bias, cfg["encoder_normalize_before"],
                   F.gelu, key_pad=~not_pad)
    weight = p["encoder.lm_head.weight"]
    if cfg["contrastive_pretraining"]:
        w = F.normalize(weight, dim=-1) if cfg["l2norm_embedding"] else weight
        return x, p["encoder.lm_head.beta"] * (x @ w.T)
    h = F.gelu(x @ p["encoder.lm_head.dense.weight"].T + p["encoder.lm_head.dense.bias"])
    h = F.layer_norm(h, (C,), p["encoder.lm_head.layer_norm.weight"],
                     p["encoder.lm_head.layer_norm.bias"])
    return x, h @ weight.T + p["encoder.lm_head.bias"]


def test_the_float64_references_reproduce_the_forks_own_outputs():
    """The references used for the generality tests below compute what the forks computed."""
    for name in ("press_lm", "eify_lm_alibi"):
        state, r = load(fixture(name) / "checkpoint_last.pt"), ref(name)
        for tag in ("L", "2L"):
            lp = fork_lm_logprobs(state, r["meta"]["fork"], r[f"inputs_{tag}"])
            got = lp.gather(-1, r[f"targets_{tag}"].unsqueeze(-1)).squeeze(-1)
            assert (got - r[f"target_logprobs_{tag}"]).abs().max() < TOL, (name, tag)
    for name in ROBERTA:
        state, r = load(fixture(name) / "checkpoint_last.pt"), ref(name)
        features, _ = fork_roberta(state, r["src_tokens"])
        keep = ~r["pad_mask"]
        assert (features - r["features"])[keep].abs().max() < TOL, name
        _, logits = fork_roberta(state, r["masked_src"])
        at = r["masked_positions"]
        assert (logits[at[:, 0], at[:, 1]] - r["mlm_logits"]).abs().max() < TOL, name


# ------------------------------------------------------------------- the fixtures, converted


@pytest.mark.parametrize("name", list(LM))
def test_lm_log_probs_equal_the_forks_at_L_and_2L(converted, name):
    model, _ = load_converted(converted[name][0], fixture(name) / "data-bin")
    r = ref(name)
    with torch.no_grad():
        for tag in ("L", "2L"):  # 2L: the fork needed --model-overrides, ours nothing
            lprobs = model.get_normalized_probs(model(r[f"inputs_{tag}"]), log_probs=True)
            got = lprobs.gather(-1, r[f"targets_{tag}"].unsqueeze(-1)).squeeze(-1)
            assert (got - r[f"target_logprobs_{tag}"]).abs().max() < TOL, tag
            assert (lprobs[0] - r[f"lprobs_full_seq0_{tag}"]).abs().max() < TOL, tag


@pytest.mark.parametrize("name", ROBERTA)
def test_roberta_features_and_mlm_logits_equal_the_forks(converted, name):
    model, task = load_converted(converted[name][0], fixture(name) / "data-bin")
    r = ref(name)
    keep = ~r["pad_mask"]
    assert task.mask_idx == r["meta"]["mask_idx"]  # stock masked_lm puts <mask> where the fork did
    with torch.no_grad():
        features = model(r["src_tokens"], features_only=True)[0]
        assert (features - r["features"])[keep].abs().max() < TOL
        logits = model(r["masked_src"])[0]
        at = r["masked_positions"]
        assert logits.shape[-1] == r["mlm_logits_all"].shape[-1]
        assert (logits[at[:, 0], at[:, 1]] - r["mlm_logits"]).abs().max() < TOL
        assert (logits - r["mlm_logits_all"])[keep].abs().max() < TOL
        masked = model(r["masked_src"], features_only=True)[0]
        assert (masked - r["masked_features"])[keep].abs().max() < TOL


def test_every_weight_keeps_its_value_and_only_alibi_buffers_are_added(converted):
    for name, (path, summary) in converted.items():
        fork, ours = load(fixture(name) / "checkpoint_last.pt")["model"], load(path)["model"]
        placeholder = [k for k in fork if k.endswith("embed_positions._float_tensor")]
        for key, value in fork.items():
            if key not in placeholder:
                assert torch.equal(ours[key], value), (name, key)
        added = set(ours) - set(fork)
        assert added <= {"decoder.alibi.slopes", "encoder.model_kind", "encoder.alibi.slopes",
                         "encoder.sentence_encoder.alibi.slopes"}, (name, added)
        if "clap" in name:  # CLAP beta and the trained (non-zero) pad row travel unchanged
            assert torch.equal(ours["encoder.lm_head.beta"], fork["encoder.lm_head.beta"])
            assert ours["encoder.sentence_encoder.embed_tokens.weight"][1].abs().sum() > 0


def test_translation_teacher_forced_log_probs_and_encoder_equal_the_forks(converted):
    model, _ = load_converted(converted[TRANSLATION][0], fixture(TRANSLATION) / "data-bin")
    r = ref(TRANSLATION)
    with torch.no_grad():
        out = model(r["src_tokens"], r["src_lengths"], r["prev_output_tokens"])
        lprobs = model.get_normalized_probs(out, log_probs=True)
        keep = r["target"].ne(1)
        assert (lprobs - r["lprobs"])[keep].abs().max() < TOL
        got = lprobs.gather(-1, r["target"].unsqueeze(-1)).squeeze(-1) * keep
        assert (got - r["target_logprobs"]).abs().max() < TOL
        encoded = model.encoder(r["src_tokens"], r["src_lengths"])["encoder_out"][0]
        assert (encoded.transpose(0, 1) - r["encoder_out"])[~r["encoder_padding_mask"]].abs().max() < TOL
    cfg = load(converted[TRANSLATION][0])["cfg"]["model"]
    cfg = vars(cfg) if not isinstance(cfg, dict) else cfg
    assert (cfg["_name"], cfg["encoder_alibi_variant"], cfg["decoder_alibi_variant"]) == (
        "alibi_transformer", "offset", "causal")
    assert not any(k in cfg for k in ("encoder_alibi", "decoder_alibi"))


def test_convert_reports_a_translation_checkpoint_of_the_fork(tmp_path, capsys):
    """The command's report of an EIFY translation checkpoint: what was kept and added, the
    options, and what generation will differ in."""
    from fairseq_alibi.cli.convert_checkpoints import main

    assert main(["--input", str(fixture(TRANSLATION) / "checkpoint_last.pt"), "--output",
                 str(tmp_path / "model.pt")]) in (0, None)
    out = capsys.readouterr().out
    assert f"converted EIFY-fork transformer -> alibi_transformer: {tmp_path / 'model.pt'}" in out
    assert "added decoder.alibi.slopes, encoder.alibi.slopes" in out
    assert "options  --encoder-alibi-variant offset --decoder-alibi-variant causal" in out
    assert "the decoder keeps its ALiBi bias in incremental decoding" in out
    assert "optimizer state kept: fairseq-train --restore-file resumes" in out


def test_the_slopes_and_biases_are_the_forks(converted):
    from fairseq_alibi.alibi import alibi_bias

    for name in ("press_lm", "press_lm_wiki103"):
        slopes = load(converted[name][0])["model"]["decoder.alibi.slopes"]
        assert torch.equal(slopes, ref(name)["decoder_slopes"])
    r = ref("eify_lm_alibi")
    slopes = load(converted["eify_lm_alibi"][0])["model"]["decoder.alibi.slopes"]
    past = torch.tril(torch.ones(8, 8, dtype=torch.bool))
    ours = alibi_bias(slopes, 8, 8, "causal")
    assert torch.equal(ours[:, past], r["decoder_alibi_bias_8x8"][:, past])
    translation, r = load(converted[TRANSLATION][0])["model"], ref(TRANSLATION)
    assert torch.equal(alibi_bias(translation["encoder.alibi.slopes"], 8, 8, "offset"),
                       r["encoder_alibi_bias_8x8"])
    decoder = alibi_bias(translation["decoder.alibi.slopes"], 8, 8, "causal")
    assert torch.equal(decoder[:, past], r["decoder_alibi_bias_8x8"][:, past])
    for name, variant in (("eify_roberta_alibi_symmetric", "symmetric"),
                          ("eify_roberta_alibi_offset", "offset"),
                          ("eify_roberta_zero_clap", "offset")):
        slopes = load(converted[name][0])["model"]["encoder.sentence_encoder.alibi.slopes"]
        assert torch.equal(alibi_bias(slopes, 8, 8, variant), ref(name)["encoder_alibi_bias_8x8"])


def test_press_rule_for_every_head_count_and_loading_keeps_the_saved_slopes(converted, tmp_path):
    for heads in range(1, 33):
        assert torch.equal(get_slopes(heads), torch.tensor(fork_slopes(heads)).float()), heads
    # the slopes are a saved buffer: what the checkpoint holds is what the model uses
    for name, key in (("eify_lm_alibi", "decoder.alibi.slopes"),
                      ("eify_roberta_alibi_offset", "encoder.sentence_encoder.alibi.slopes")):
        state = load(converted[name][0])
        custom = torch.tensor([0.3, 0.11, 0.07, 0.013])
        state["model"][key] = custom
        torch.save(state, tmp_path / f"{name}.pt")
        model, _ = load_converted(tmp_path / f"{name}.pt", fixture(name) / "data-bin")
        assert torch.equal(model.state_dict()[key], custom), name


def test_the_zero_clap_model_has_the_forks_options_by_name(converted):
    cfg = load(converted["eify_roberta_zero_clap"][0])["cfg"]
    model = cfg["model"]
    assert model["_name"] == "alibi_roberta"
    assert (model["alibi_variant"], model["mlm_head"], model["zero_mask_embedding"],
            model["embedding_omits_mask"], model["embedding_padding_idx"]) == (
        "offset", "clap", True, True, "none")
    assert not any(k in model for k in ("encoder_alibi", "contrastive_pretraining",
                                        "zero_masking", "l2norm_embedding"))
    assert "omit_mask" not in cfg["task"]
    baseline = load(converted["eify_roberta_baseline"][0])["cfg"]["model"]
    assert (baseline["alibi_variant"], baseline["mlm_head"], baseline["embedding_padding_idx"],
            baseline["embedding_omits_mask"]) == ("none", "roberta", "pad", False)


def test_fork_detection():
    from fairseq_alibi.cli.forks import detect_fork

    for name in ROBERTA + ["eify_lm_alibi", TRANSLATION]:
        assert detect_fork(load(fixture(name) / "checkpoint_last.pt")) == "eify", name
    for name in ("press_lm", "press_lm_wiki103"):  # indistinguishable from stock: --from press
        assert detect_fork(load(fixture(name) / "checkpoint_last.pt")) is None, name


def test_an_eify_checkpoint_with_the_forks_options_off_is_a_stock_model(tmp_path):
    state = load(fixture("eify_lm_alibi") / "checkpoint_last.pt")
    state["cfg"]["model"]["decoder_alibi"] = False
    torch.save(state, tmp_path / "fork.pt")
    summary = convert_to(tmp_path / "fork.pt", tmp_path / "ours.pt")
    assert summary["source"] == "stock" and "decoder_alibi" in summary["dropped_options"]
    from fairseq_alibi.cli.convert_checkpoints import ConversionError

    with pytest.raises(ConversionError, match="trained without ALiBi .*--from stock"):
        convert_to(tmp_path / "fork.pt", tmp_path / "again.pt", source="eify")


def test_the_new_embedding_options_keep_todays_models_bit_for_bit(tmp_path):
    """Defaults: a frozen, zero-initialised pad row and a <mask> row, as before."""
    from tests.helpers.building import build_from_command_line, write_dictionary

    data = write_dictionary(tmp_path, 30)
    flags = ["--task", "masked_lm", "--arch", "alibi_roberta", "--encoder-layers", "1",
             "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
             "--encoder-attention-heads", "2", "--mlm-head", "clap", "--zero-mask-embedding"]
    torch.manual_seed(0)
    default, task = build_from_command_line(data, *flags)
    torch.manual_seed(0)
    named, _ = build_from_command_line(data, *flags, "--embedding-padding-idx", "pad")
    for (k, a), (_, b) in zip(default.state_dict().items(), named.state_dict().items()):
        assert torch.equal(a, b), k
    embed = default.encoder.sentence_encoder.embed_tokens
    assert embed.padding_idx == task.dictionary.pad() and embed.weight.shape[0] == len(task.dictionary)
    assert embed.weight[task.dictionary.pad()].abs().sum() == 0

    fork_like, task = build_from_command_line(data, *flags, "--embedding-omits-mask",
                                              "--embedding-padding-idx", "none")
    embed = fork_like.encoder.sentence_encoder.embed_tokens
    assert embed.padding_idx is None and embed.weight.shape[0] == len(task.dictionary) - 1
    assert embed.weight[task.dictionary.pad()].abs().sum() > 0  # drawn like any other row
    assert fork_like.encoder.sentence_encoder.padding_idx == task.dictionary.pad()
    tokens = torch.tensor([[0, 5, task.mask_idx, 7, 2, 1]])
    logits = fork_like(tokens)[0]
    assert logits.shape[-1] == len(task.dictionary) - 1 and torch.isfinite(logits).all()
    assert embed(tokens)[0, 2].abs().sum() == 0  # <mask>, outside the table, embeds to zero
    for model, trained in ((default, False), (fork_like, True)):  # the input side's gradient
        table = model.encoder.sentence_encoder.embed_tokens
        table.weight.grad = None
        table(tokens).sum().backward()
        assert (table.weight.grad[task.dictionary.pad()].abs().sum() > 0) == trained
    with pytest.raises(ValueError, match="--embedding-omits-mask needs --zero-mask-embedding"):
        build_from_command_line(data, *flags[:-1], "--embedding-omits-mask")


# -------------------------------------------------------- other sizes, heads and lengths


def _scale(values):
    return max(1.0, values.abs().max().item())


def _resized(template, dims, seed):
    """A fork-format checkpoint like ``template`` with other sizes and random weights."""
    rng = torch.Generator().manual_seed(seed)
    state = load(template)
    weights, made = {}, {}
    for key, value in state["model"].items():
        if not key.endswith(("weight", "bias", "beta")):  # version, placeholders: as saved
            weights[key] = value
            continue
        shape = tuple(dims.get(s, s) for s in value.shape)
        tied = "output_projection" in key or key == "encoder.lm_head.weight"
        if tied and value.data_ptr() in made:
            weights[key] = made[value.data_ptr()]
            continue
        if "norm" in key and key.endswith("weight"):
            new = 1 + 0.1 * torch.randn(shape, generator=rng)
        elif key.endswith("beta"):
            new = torch.tensor(1.7)
        else:
            new = 0.2 * torch.randn(shape, generator=rng)
        weights[key] = made[value.data_ptr()] = new
    state["model"] = weights
    state["last_optimizer_state"] = None
    return state


@pytest.mark.parametrize("name,heads", [("press_lm", 6), ("eify_lm_alibi", 3),
                                        ("press_lm", 12)])
def test_lm_of_other_sizes_heads_and_lengths_matches_the_forks_math(name, heads, tmp_path):
    from fairseq_alibi.cli.convert_checkpoints import convert_file

    dim = 4 * heads if heads != 12 else 48
    state = _resized(fixture(name) / "checkpoint_last.pt", {64: dim, 128: 2 * dim}, heads)
    model_cfg = state["cfg"]["model"]
    length = 20
    model_cfg.update(decoder_embed_dim=dim, decoder_input_dim=dim, decoder_output_dim=dim,
                     decoder_ffn_embed_dim=2 * dim, decoder_attention_heads=heads,
                     tokens_per_sample=length, decoder_layers=2)
    state["cfg"]["task"]["tokens_per_sample"] = length
    torch.save(state, tmp_path / "fork.pt")
    convert_file(tmp_path / "fork.pt", tmp_path / "ours.pt", source=LM[name])
    model, _ = load_converted(tmp_path / "ours.pt", fixture(name) / "data-bin")
    assert torch.equal(model.decoder.alibi.slopes, torch.tensor(fork_slopes(heads)).float())
    tokens = ref(name)["test_stream"][: 3 * length].view(1, -1)  # 3L, one batch
    with torch.no_grad():
        ours = model.get_normalized_probs(model(tokens), log_probs=True).double()
    expected = fork_lm_logprobs(state, "press" if LM[name] else "eify", tokens)
    assert (ours - expected).abs().max() < TOL * _scale(expected)


@pytest.mark.parametrize("name,heads", [("eify_roberta_zero_clap", 6),
                                        ("eify_roberta_alibi_symmetric", 5),
                                        ("eify_roberta_learned_clap", 3),
                                        ("eify_roberta_alibi_offset", 12)])
def test_roberta_of_other_sizes_and_heads_matches_the_forks_math(name, heads, tmp_path):
    from fairseq_alibi.cli.convert_checkpoints import convert_file

    dim = 8 * heads
    state = _resized(fixture(name) / "checkpoint_last.pt", {64: dim, 128: 2 * dim}, heads)
    state["cfg"]["model"].update(encoder_embed_dim=dim, encoder_ffn_embed_dim=2 * dim,
                                 encoder_attention_heads=heads)
    torch.save(state, tmp_path / "fork.pt")
    convert_file(tmp_path / "fork.pt", tmp_path / "ours.pt")
    model, task = load_converted(tmp_path / "ours.pt", fixture(name) / "data-bin")
    # ALiBi: 92 tokens, beyond the fork's max_positions (64); learned positions stop at 64
    length = 60 if "learned" in name else 90
    rng = random.Random(heads)
    tokens = torch.tensor([[0] + [rng.randrange(4, 700) for _ in range(length)] + [2],
                           [0] + [rng.randrange(4, 700) for _ in range(length - 30)] + [2]
                           + [1] * 30])
    tokens[0, 7] = tokens[1, 3] = task.mask_idx
    keep = tokens.ne(1)
    with torch.no_grad():
        features, logits = model(tokens, features_only=True)[0], model(tokens)[0]
    ref_features, ref_logits = fork_roberta(state, tokens)
    # float32 against float64: 1e-5 relative to the size of the values
    assert (features.double() - ref_features)[keep].abs().max() < TOL * _scale(ref_features)
    assert (logits.double() - ref_logits)[keep].abs().max() < TOL * _scale(ref_logits)


# ------------------------------------------------------------------------------- errors


def test_error_cases(converted, tmp_path, capsys):
    from fairseq_alibi.cli.convert_checkpoints import main

    zero_clap = load(fixture("eify_roberta_zero_clap") / "checkpoint_last.pt")
    zero_clap["cfg"]["model"]["mask_prob"] = 0.15
    torch.save(zero_clap, tmp_path / "mask_prob.pt")
    other = load(fixture("eify_lm_alibi") / "checkpoint_last.pt")
    other["cfg"]["model"]["_name"] = "bart_base"
    torch.save(other, tmp_path / "bart.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    data = (fixture("press_lm") / "checkpoint_last.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    cases = [
        (tmp_path / "mask_prob.pt", [], "the fork option mask_prob=0.15 is not supported"),
        (tmp_path / "bart.pt", [], "only fairseq transformer_lm checkpoints"),
        (converted["eify_roberta_zero_clap"][0], [], "already converted (alibi_roberta)"),
        (converted[TRANSLATION][0], [], "already converted (alibi_transformer)"),
        (converted["press_lm"][0], [], "already an ALiBi language model"),
        (fixture("eify_lm_alibi") / "checkpoint_last.pt", ["--from", "press"],
         "it is not a press checkpoint"),
        (fixture("press_lm") / "checkpoint_last.pt", ["--from", "eify"],
         "holds none of the EIFY fork's options"),
        (tmp_path / "empty.pt", [], "the file is empty (0 bytes"),
        (tmp_path / "truncated.pt", [], "the file is truncated or damaged"),
    ]
    for source, extra, message in cases:
        out = tmp_path / "out.pt"
        assert main(["--input", str(source), "--output", str(out), *extra]) == 1, message
        err = capsys.readouterr().err
        assert message in err, (message, err)
        assert len(err.strip().splitlines()) == 1, err  # one line, no traceback
        assert not out.exists()
        if "empty" in message or "truncated" in message:
            assert f"fairseq-alibi checkpoints repair {tmp_path}" in err


def test_a_fork_checkpoint_loaded_without_conversion_says_to_convert_it():
    from fairseq import checkpoint_utils

    for name in ("eify_roberta_zero_clap", "eify_roberta_alibi_symmetric", "eify_lm_alibi",
                 TRANSLATION):
        with pytest.raises(ValueError, match=r"trained with EIFY's ALiBi fork .*"
                                             r"fairseq-alibi convert"):
            checkpoint_utils.load_model_ensemble_and_task(
                [str(fixture(name) / "checkpoint_last.pt")],
                arg_overrides={"data": str(fixture(name) / "data-bin")})


@pytest.mark.parametrize("name,expected", [
    ("eify_roberta_zero_clap", "convert it first with `fairseq-alibi convert --input"),
    ("eify_roberta_alibi_offset", "convert it first with `fairseq-alibi convert --input"),
    # every fork option off, but the fork's task option saved: stock masked_lm fails on it
    ("eify_roberta_baseline", "(omit_mask in its task config, which stock fairseq's tasks do "
     "not have): convert it first"),
    ("press_lm", "Convert it first with `fairseq-alibi convert --from press --input"),
])
def test_the_tools_refuse_an_unconverted_fork_checkpoint(name, expected):
    """`windows` and `glue` stop where fairseq-validate and the hub do: "convert it first",
    not a deep error or the checkpoint misread as a stock model."""
    from fairseq_alibi.cli import glue_finetune as glue
    from fairseq_alibi.cli.windows_inputs import WindowsInputError, checkpoint_config

    path = fixture(name) / "checkpoint_last.pt"
    with pytest.raises(WindowsInputError, match=re.escape(expected)):
        checkpoint_config(path)
    if name.startswith("eify_roberta"):
        with pytest.raises(glue.GlueError, match=re.escape(expected)):
            glue.read_pretrained(path)


def test_convert_io_mistakes_are_one_line_and_write_nothing(tmp_path, capsys):
    from fairseq_alibi.cli.convert_checkpoints import main

    source = str(fixture("eify_roberta_alibi_offset") / "checkpoint_last.pt")
    (tmp_path / "a_file").write_text("")
    cases = [
        (["--output", str(tmp_path / "out.pt"), "--dict", str(tmp_path / "missing.txt")],
         f"--dict {tmp_path / 'missing.txt'}: no such file"),
        (["--output", str(tmp_path / "a_file" / "out.pt")],
         f"--output {tmp_path / 'a_file' / 'out.pt'}: cannot write there"),
    ]
    if Path("/proc/self").is_dir():  # a folder where torch.save itself fails
        cases.append((["--output", "/proc/out.pt"], "--output /proc/out.pt: cannot write there"))
    for args, message in cases:
        assert main(["--input", source, *args]) == 1, message
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "out.pt").exists() and not list(tmp_path.rglob(".*.tmp"))


def test_fork_leftovers_are_named_for_what_they_are(tmp_path, capsys):
    """The fork's --arch in a new run; --from eify on a file already converted; a fork file
    whose task config is gone (where the fork keeps omit_mask): one line each, nothing
    written."""
    from argparse import Namespace

    from fairseq.models import ARCH_CONFIG_REGISTRY

    from fairseq_alibi.error_hints import OneLineError

    with pytest.raises(OneLineError, match=r"^--arch transformer_lm_alibi is the architecture of "
                                           r"EIFY's ALiBi fork.*--arch alibi_transformer_lm"):
        ARCH_CONFIG_REGISTRY["transformer_lm_alibi"](Namespace())
    converted = tmp_path / "lm.pt"
    assert _main(capsys, "--input", fixture("eify_lm_alibi") / "checkpoint_last.pt",
                 "--output", converted)[0] == 0
    state = load(fixture("eify_roberta_zero_clap") / "checkpoint_last.pt")
    del state["cfg"]["task"]
    torch.save(state, tmp_path / "no_task.pt")
    for source, extra, message in (
            (converted, ["--from", "eify"], "this is already an ALiBi language model "
             "(alibi_transformer_lm): nothing to convert"),
            (tmp_path / "no_task.pt", [], "the checkpoint's config has no task section")):
        code, out, err = _main(capsys, "--input", source, "--output", tmp_path / "x.pt", *extra)
        assert code == 1 and message in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "x.pt").exists()


def test_an_argparse_era_fork_encoders_task_keys_leave_its_flags(tmp_path):
    """fairseq-train of the argparse era saved one Namespace of every argument, the fork's task
    key omit_mask among the model's: the converted model's resume overrides and the flags glue
    gives fairseq-train name only the package's options (a fork key there is refused)."""
    import argparse

    from fairseq_alibi.cli.forks import convert_eify_roberta
    from fairseq_alibi.cli.glue_finetune import flags_of

    state = load(fixture("eify_roberta_zero_clap") / "checkpoint_last.pt")
    model = dict(state["cfg"]["model"], arch="roberta", omit_mask=True, mask_prob=0.0)
    state["cfg"]["model"] = argparse.Namespace(**model)
    summary = convert_eify_roberta(state)
    assert "++model.embedding_omits_mask=true" in summary["overrides"]
    assert not any("omit_mask" in o for o in summary["overrides"])
    flags = flags_of(vars(state["cfg"]["model"]), summary["target_arch"])
    assert "--embedding-omits-mask" in flags and "--omit-mask" not in flags


def _main(capsys, *args):
    from fairseq_alibi.cli.convert_checkpoints import main

    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_press_checkpoint_is_converted_only_with_from_press(tmp_path, capsys):
    """Its max_tokens key marks it (models.checks.is_unconverted_press_config): as stock it
    would be told to fine-tune, with the unconverted file as a teacher the package refuses."""
    press = fixture("press_lm") / "checkpoint_last.pt"
    for extra, said in (([], ""), (["--from", "stock"], " instead of --from stock")):
        code, out, err = _main(capsys, "--input", press, "--output", tmp_path / "x.pt", *extra)
        assert code == 1 and not out and err == (
            "error: this checkpoint was trained with Press's ALiBi fork (max_tokens in its model "
            f"config, which only that fork writes): convert it with --from press{said} (it "
            "already computes ALiBi)\n"), err
        assert not (tmp_path / "x.pt").exists()
    code, out, err = _main(capsys, "--input", press, "--output", tmp_path / "press.pt",
                           "--from", "press")
    assert code == 0 and not err and "press fork" in out and "config   dropped max_tokens" in out
    assert ("dropped  sinusoidal positions, which the fork built but never added: no parameter "
            "(computed, not stored), only the placeholder buffer "
            "decoder.embed_positions._float_tensor\n") in out, out
    assert load(tmp_path / "press.pt")["last_optimizer_state"] is not None  # resumable
    # without the marker (a stock sinusoidal model, or a Press one stripped of it): the hint
    state = load(press)
    del state["cfg"]["model"]["max_tokens"]
    torch.save(state, tmp_path / "unmarked.pt")
    code, out, _ = _main(capsys, "--input", tmp_path / "unmarked.pt", "--output",
                         tmp_path / "stock.pt")
    assert code == 0 and "pass --from press" in out and "--teacher-path" in out
    assert load(tmp_path / "stock.pt")["last_optimizer_state"] is None  # a stock model changes
    assert torch.equal(load(tmp_path / "stock.pt")["model"]["decoder.layers.0.fc1.weight"],
                       load(tmp_path / "press.pt")["model"]["decoder.layers.0.fc1.weight"])


def test_an_arch_that_does_not_fit_the_checkpoint_is_blamed(tmp_path, capsys):
    """--arch's defaults (the wiki103 adaptive softmax) fill what the saved config leaves unset:
    the fix is dropping --arch, not changing the cutoffs."""
    code, _, err = _main(capsys, "--input", fixture("press_lm") / "checkpoint_last.pt",
                         "--output", tmp_path / "x.pt", "--from", "press",
                         "--arch", "alibi_transformer_lm_wiki103")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: --arch alibi_transformer_lm_wiki103 does not fit this "
                          "transformer_lm checkpoint"), err
    assert err.endswith("drop --arch (the default, alibi_transformer_lm, builds the "
                        "checkpoint's own model)\n") and "give cutoffs" not in err, err


def test_the_printed_glue_command_sets_the_task_length_of_a_learned_position_model(
        converted, tmp_path, capsys):
    """config/glue/*.yaml say task.max_positions: 512, which sizes a learned-position model;
    ALiBi models get no limit. The configs train in fp16: the line after says what CPUs need."""
    code, out, _ = _main(capsys, "--input",
                         fixture("eify_roberta_baseline") / "checkpoint_last.pt",
                         "--output", tmp_path / "model.pt")
    assert code == 0
    line = next(x for x in out.splitlines() if "fairseq-hydra-train" in x)
    assert " task.max_positions=64 " in line and "++model.max_positions=64" in line, line
    assert "add common.fp16=false" in out
    assert converted["eify_roberta_learned_clap"][1]["task_overrides"] == [
        "task.max_positions=64"]
    for name in ("eify_roberta_zero_clap", "eify_roberta_alibi_offset"):
        assert converted[name][1]["task_overrides"] == [], name


def test_an_existing_dict_txt_beside_the_output_is_replaced_only_with_overwrite(tmp_path):
    from fairseq_alibi.cli.convert_checkpoints import ConversionError

    original = (fixture("eify_roberta_zero_clap") / "data-bin" / "dict.txt").read_text()
    longer = tmp_path / "in" / "dict.txt"
    longer.parent.mkdir()
    longer.write_text(original + "madeupword0004 0\nmadeupword0005 0\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "dict.txt").write_text("another 1\n")
    source = fixture("eify_roberta_zero_clap") / "checkpoint_last.pt"
    with pytest.raises(ConversionError, match=r"out/dict.txt already exists \(another "
                                              r"dictionary\).*pass --overwrite"):
        convert_to(source, tmp_path / "out" / "model.pt", dict_path=longer)
    assert not (tmp_path / "out" / "model.pt").exists()  # checked before anything is written
    assert (tmp_path / "out" / "dict.txt").read_text() == "another 1\n"
    convert_to(source, tmp_path / "out" / "model.pt", dict_path=longer, overwrite=True)
    assert (tmp_path / "out" / "dict.txt").read_text() == original
    # the same dictionary again: nothing would be lost, only the model needs --overwrite
    (tmp_path / "out" / "model.pt").unlink()
    convert_to(source, tmp_path / "out" / "model.pt", dict_path=longer)


def test_the_dictionary_of_a_model_trained_without_the_last_madeupwords(tmp_path):
    """EIFY's zero-clap Pile models: two rows fewer than GPT-2's dict.txt; a matching one is
    written beside the converted model."""
    original = (fixture("eify_roberta_zero_clap") / "data-bin" / "dict.txt").read_text()
    longer = tmp_path / "in" / "dict.txt"
    longer.parent.mkdir()
    longer.write_text(original + "madeupword0004 0\nmadeupword0005 0\n")
    summary = convert_to(fixture("eify_roberta_zero_clap") / "checkpoint_last.pt",
                         tmp_path / "out" / "model.pt", dict_path=longer)
    assert (tmp_path / "out" / "dict.txt").read_text() == original
    assert summary["dictionary"]["dropped_symbols"] == ["madeupword0004", "madeupword0005"]
    wrong = tmp_path / "wrong.txt"
    wrong.write_text(original + "hello 3\n")
    from fairseq_alibi.cli.convert_checkpoints import ConversionError

    with pytest.raises(ConversionError, match="has 701 entries but the model's embedding needs 700"):
        convert_to(fixture("eify_roberta_zero_clap") / "checkpoint_last.pt",
                   tmp_path / "x" / "model.pt", dict_path=wrong)
    # loaded with the longer dictionary, the model says what to do
    from tests.helpers.building import setup_from_command_line

    cfg, task = setup_from_command_line(
        longer.parent, "--task", "masked_lm", "--arch", "alibi_roberta", *ROBERTA_SIZES,
        *summary["flags"].split())
    model = task.build_model(cfg.model)
    with pytest.raises(ValueError, match=r"trained without the last 2 entries .*--dict"):
        model.load_state_dict(load(tmp_path / "out" / "model.pt")["model"])


def test_loading_a_zero_clap_model_without_its_options_names_them(converted, tmp_path):
    from tests.helpers.building import setup_from_command_line

    cfg, task = setup_from_command_line(
        fixture("eify_roberta_zero_clap") / "data-bin", "--task", "masked_lm", "--arch",
        "alibi_roberta", "--encoder-layers", "2", "--encoder-embed-dim", "64",
        "--encoder-ffn-embed-dim", "128", "--encoder-attention-heads", "4", "--mlm-head", "clap",
        "--zero-mask-embedding", "--embedding-padding-idx", "none")
    model = task.build_model(cfg.model)
    with pytest.raises(ValueError, match="add --zero-mask-embedding --embedding-omits-mask"):
        model.load_state_dict(load(converted["eify_roberta_zero_clap"][0])["model"])


# --------------------------------------------------------------------------- hub interface


@pytest.mark.skipif(not (GPT2 / "encoder.json").is_file(), reason="no GPT-2 BPE files")
@pytest.mark.parametrize("name", ["eify_roberta_zero_clap", "eify_roberta_learned_clap",
                                  "eify_roberta_alibi_offset"])
def test_hub_fill_mask_features_and_classification_heads_offline(converted, name):
    from fairseq_alibi.models.alibi_roberta import AlibiRobertaModel

    path = converted[name][0]
    hub = AlibiRobertaModel.from_pretrained(
        str(path.parent), path.name, str(fixture(name) / "data-bin"), bpe="gpt2",
        gpt2_encoder_json=str(GPT2 / "encoder.json"), gpt2_vocab_bpe=str(GPT2 / "vocab.bpe"))
    hub.eval()
    r = ref(name)
    filled = hub.fill_mask(r["fill_mask"]["input"], topk=r["fill_mask"]["topk"])
    expected = r["fill_mask"]["result"]
    assert [(t, s) for t, _, s in filled] == [(t, s) for t, _, s in expected]
    assert all(abs(a[1] - b[1]) < TOL for a, b in zip(filled, expected))
    tokens = hub.encode(r["meta"]["sent0"])
    assert tokens.tolist() == r["src_tokens"][0].tolist()
    with torch.no_grad():
        features = hub.extract_features(tokens)
    assert (features[0] - r["features"][0]).abs().max() < TOL
    hub.register_classification_head("quality", num_classes=3)
    assert hub.predict("quality", tokens).shape == (1, 3)


# ----------------------------------------------------- the real command lines, end to end


def _eval_lm(path, data, length):
    out = run_cli("fairseq-eval-lm", data, "--user-dir", _user_dir(), "--path", path,
                  "--sample-break-mode", "none", "--gen-subset", "test", "--batch-size", "1",
                  "--tokens-per-sample", length, "--context-window", "0", "--cpu")
    tokens = re.search(r"Evaluated ([\d,]+) tokens", out)
    scores = re.search(r"Loss \(base 2\): ([\d.]+), Perplexity: ([\d.]+)", out)
    assert tokens and scores, out[-2000:]
    return int(tokens.group(1).replace(",", "")), float(scores.group(1)), float(scores.group(2))


def _user_dir():
    from tests.helpers.cli import user_dir

    return user_dir()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LM))
def test_eval_lm_prints_the_forks_perplexity(converted, name):
    r = ref(name)
    for tag, length in (("L", 32), ("2L", 64)):  # 2L without --model-overrides
        tokens, loss, ppl = _eval_lm(converted[name][0], fixture(name) / "data-bin", length)
        assert tokens == r[f"eval_lm_{tag}"]["tokens"]
        assert loss == pytest.approx(r[f"eval_lm_{tag}"]["loss_base2"], abs=1.5e-4)
        assert ppl == pytest.approx(r[f"eval_lm_{tag}"]["perplexity"], abs=0.015)
    log = (fixture(name) / "eval_lm_L.log").read_text()
    assert f"Perplexity: {r['eval_lm_L']['perplexity']:.2f}" in log


LM_TRAIN = ["--task", "language_modeling", "--decoder-layers", "2", "--decoder-embed-dim", "64",
            "--decoder-input-dim", "64", "--decoder-output-dim", "64",
            "--decoder-ffn-embed-dim", "128", "--decoder-attention-heads", "4",
            "--share-decoder-input-output-embed", "--tokens-per-sample", "32",
            "--sample-break-mode", "none", "--max-tokens", "256",
            "--required-batch-size-multiple", "1", "--optimizer", "adam", "--adam-betas",
            "(0.9,0.98)", "--lr", "0.003", "--lr-scheduler", "inverse_sqrt", "--warmup-updates",
            "4", "--warmup-init-lr", "1e-4", "--clip-norm", "0.1", "--criterion",
            "cross_entropy", "--seed", "1", "--cpu", "--num-workers", "0", "--no-progress-bar",
            "--log-format", "simple", "--log-interval", "1", "--disable-validation"]


@pytest.mark.slow
def test_converted_lm_resumes_training_where_the_fork_stopped(converted, tmp_path):
    out = run_cli("fairseq-train", fixture("eify_lm_alibi") / "data-bin", "--user-dir",
                  _user_dir(), *LM_TRAIN, "--arch", "alibi_transformer_lm",
                  "--decoder-normalize-before", "--restore-file",
                  converted["eify_lm_alibi"][0], "--save-dir", tmp_path, "--max-update", "14")
    assert re.search(r"Loaded checkpoint .*model\.pt \(epoch \d+ @ 12 updates\)", out), out[-3000:]
    assert load(tmp_path / "checkpoint_last.pt")["optimizer_history"][-1]["num_updates"] == 14


ROBERTA_SIZES = ["--encoder-layers", "2", "--encoder-embed-dim", "64", "--encoder-ffn-embed-dim",
                 "128", "--encoder-attention-heads", "4", "--max-positions", "64"]


def _hydra_train(config_dir, name, *overrides, cwd):
    return run_cli("fairseq-hydra-train", "--config-dir", config_dir, "--config-name", name,
                   *overrides, f"hydra.run.dir={cwd / 'run'}", cwd=cwd,
                   env={"HYDRA_FULL_ERROR": "1"})


@pytest.mark.slow
def test_converted_zero_clap_resumes_masked_lm_training_with_the_printed_options(
        converted, tmp_path):
    """The fork's optimizer state is kept: training goes on from update 12, through stock
    masked_lm (which appends <mask>, at the id the fork's omit_mask used)."""
    path, summary = converted["eify_roberta_zero_clap"]
    data = fixture("eify_roberta_zero_clap") / "data-bin"
    (tmp_path / "resume.yaml").write_text(f"""
common: {{user_dir: {_user_dir()}, cpu: true, seed: 1, log_format: simple, log_interval: 1}}
task: {{_name: masked_lm, data: {data}, tokens_per_sample: 64, sample_break_mode: complete}}
model: {{_name: alibi_roberta}}
criterion: masked_lm
optimizer: {{_name: adam, adam_betas: '(0.9,0.98)', adam_eps: 1e-06, weight_decay: 0.01}}
lr_scheduler: {{_name: polynomial_decay, warmup_updates: 4, total_num_update: 20}}
optimization: {{max_update: 15, lr: [0.003]}}
dataset: {{batch_size: 8, num_workers: 0, disable_validation: true}}
checkpoint: {{save_dir: {tmp_path / 'ck'}, restore_file: {path}}}
""")
    out = _hydra_train(tmp_path, "resume", *summary["overrides"], cwd=tmp_path)
    assert re.search(r"Loaded checkpoint .*model\.pt \(epoch \d+ @ 12 updates\)", out), out[-3000:]
    state = load(tmp_path / "ck" / "checkpoint_last.pt")
    assert state["optimizer_history"][-1]["num_updates"] == 15
    assert state["model"]["encoder.sentence_encoder.embed_tokens.weight"].shape[0] == 704
    assert not state["cfg"]["model"]["layernorm_embedding"]


def _glue_data(name, tmp_path):
    """A tiny binary sentence-classification set in the GLUE layout, with the model's dict.txt."""
    lines = [line for line in (FORKS / "corpus" / "bpe.train.txt").read_text().splitlines()
             if line][:64]
    rng = random.Random(0)
    raw = tmp_path / "raw"
    raw.mkdir()
    for split, rows in (("train", lines[:48]), ("dev", lines[48:])):
        (raw / f"{split}.input0").write_text("\n".join(rows) + "\n")
        (raw / f"{split}.label").write_text("\n".join(rng.choice("01") for _ in rows) + "\n")
    bin_dir = tmp_path / "bin"
    run_cli("fairseq-preprocess", "--only-source", "--trainpref", raw / "train.input0",
            "--validpref", raw / "dev.input0", "--destdir", bin_dir / "input0", "--srcdict",
            fixture(name) / "data-bin" / "dict.txt", "--workers", "1")
    run_cli("fairseq-preprocess", "--only-source", "--trainpref", raw / "train.label",
            "--validpref", raw / "dev.label", "--destdir", bin_dir / "label", "--workers", "1")
    return bin_dir


def _check_fine_tuned(name, checkpoint, updates):
    state = load(checkpoint)
    assert state["optimizer_history"][-1]["num_updates"] == updates
    heads = "encoder.classification_heads.sentence_classification_head.out_proj.weight"
    assert heads.replace("encoder.", "") in state["model"] or heads in state["model"]
    fork = load(fixture(name) / "checkpoint_last.pt")["model"]
    key = "encoder.sentence_encoder.embed_tokens.weight"
    assert state["model"][key].shape == fork[key].shape


@pytest.mark.slow
@pytest.mark.parametrize("name", ["eify_roberta_zero_clap", "eify_roberta_alibi_offset"])
def test_glue_fine_tuning_with_the_shipped_hydra_recipe(name, converted, tmp_path):
    """config/glue/rte.yaml (stock sentence_prediction) with the overrides the converter prints:
    the zero-clap model's (no embedding layer norm, which only hydra can say), and an offset
    model with the RoBERTa head, whose variant and head the overrides name although they are
    the architecture's defaults (the config's default variant group is zero-clap)."""
    path, summary = converted[name]
    bin_dir = _glue_data(name, tmp_path)
    out = _hydra_train(
        Path(_user_dir()) / "config" / "glue", "rte", f"task.data={bin_dir}",
        f"checkpoint.restore_file={path}", f"checkpoint.save_dir={tmp_path / 'ck'}",
        "model._name=alibi_roberta", "common.fp16=false", "common.cpu=true",
        "common.log_format=simple", "common.log_interval=1", "optimization.max_update=3",
        "dataset.num_workers=0", *summary["overrides"], cwd=tmp_path)
    assert re.search(r"Loaded checkpoint .*model\.pt", out), out[-3000:]
    _check_fine_tuned(name, tmp_path / "ck" / "checkpoint_last.pt", 3)


@pytest.mark.slow
def test_glue_fine_tuning_with_the_printed_command_of_a_learned_position_model(tmp_path, capsys):
    """The converter's line as printed (TASK, DATA-bin filled in, the CPU note's fp16=false):
    task.max_positions=64 in it, else sentence_prediction builds 512 learned positions."""
    import shlex

    name = "eify_roberta_baseline"
    (tmp_path / "m").mkdir()
    code, out, _ = _main(capsys, "--input", fixture(name) / "checkpoint_last.pt", "--output",
                         tmp_path / "m" / "model.pt")
    assert code == 0
    line = next(x for x in out.splitlines() if "fairseq-hydra-train" in x)
    command = line.split(" with ", 1)[1].replace("$(python -m fairseq_alibi --user-dir)",
                                                 _user_dir())
    command = command.replace("TASK", "rte").replace("DATA-bin", str(_glue_data(name, tmp_path)))
    tool, *args = shlex.split(command)
    out = _hydra_train_args(tool, *args, "common.fp16=false", "common.cpu=true",
                            f"checkpoint.save_dir={tmp_path / 'ck'}", "common.log_format=simple",
                            "optimization.max_update=2", "dataset.num_workers=0", cwd=tmp_path)
    assert re.search(r"Loaded checkpoint .*model\.pt", out), out[-3000:]
    _check_fine_tuned(name, tmp_path / "ck" / "checkpoint_last.pt", 2)


def _hydra_train_args(tool, *args, cwd):
    return run_cli(tool, *args, f"hydra.run.dir={cwd / 'run'}", cwd=cwd,
                   env={"HYDRA_FULL_ERROR": "1"})


@pytest.mark.slow
def test_glue_fine_tuning_with_fairseq_train_flags(converted, tmp_path):
    """The zero-clap model's printed flags, --no-layernorm-embedding among them."""
    name = "eify_roberta_zero_clap"
    path, summary = converted[name]
    assert "--no-layernorm-embedding" in summary["flags"].split()
    bin_dir = _glue_data(name, tmp_path)
    out = run_cli("fairseq-train", bin_dir, "--user-dir", _user_dir(), "--task",
                  "sentence_prediction", "--criterion", "sentence_prediction", "--arch",
                  "alibi_roberta", *ROBERTA_SIZES, *summary["flags"].split(), "--restore-file",
                  path, "--reset-optimizer", "--reset-dataloader", "--reset-meters",
                  "--num-classes", "2", "--init-token", "0", "--separator-token", "2",
                  "--batch-size", "8", "--optimizer", "adam", "--lr", "1e-4", "--max-update",
                  "3", "--save-dir", tmp_path / "ck", "--cpu", "--num-workers", "0",
                  "--no-progress-bar", "--log-format", "simple", "--log-interval", "1",
                  "--seed", "1", "--no-epoch-checkpoints")
    assert re.search(r"Loaded checkpoint .*model\.pt", out), out[-3000:]
    _check_fine_tuned(name, tmp_path / "ck" / "checkpoint_last.pt", 3)


@pytest.mark.slow
def test_fairseq_generate_keeps_the_decoder_bias_that_the_fork_dropped(converted):
    """Our incremental decoding scores a hypothesis exactly as a full (teacher-forced) pass does;
    the fork's generate dropped the decoder bias, hence its different positional scores."""
    out = run_cli("fairseq-generate", fixture(TRANSLATION) / "data-bin", "--user-dir",
                  _user_dir(), "--source-lang", "src", "--target-lang", "tgt", "--path",
                  converted[TRANSLATION][0], "--gen-subset", "test", "--beam", "2",
                  "--batch-size", "8", "--max-len-a", "1", "--max-len-b", "2", "--cpu")
    ours = {int(m.group(1)): m.group(2) for m in re.finditer(r"^H-(\d+)\t\S+\t(.*)$", out, re.M)}
    scores = {int(m.group(1)): [float(x) for x in m.group(2).split()]
              for m in re.finditer(r"^P-(\d+)\t(.*)$", out, re.M)}
    fork = {line["id"]: line for line in ref(TRANSLATION)["generate"]}
    assert set(ours) == set(fork)
    largest = 0.0
    for key, line in fork.items():
        assert ours[key] == line["hyp"]  # same hypotheses as the fork's beam search here
        assert scores[key] == pytest.approx(line["teacher_forced_logprobs_base2"], abs=6e-5)
        largest = max(largest, max(abs(a - b) for a, b in
                                   zip(scores[key], line["positional_scores_base2"])))
    assert largest == pytest.approx(ref(TRANSLATION)["generate_vs_teacher_forced_maxabs_base2"],
                                    abs=1e-4)


@pytest.mark.slow
def test_converted_translation_model_resumes_training(converted, tmp_path):
    out = run_cli("fairseq-train", fixture(TRANSLATION) / "data-bin", "--user-dir", _user_dir(),
                  "--task", "translation", "--source-lang", "src", "--target-lang", "tgt",
                  "--arch", "alibi_transformer", "--encoder-layers", "2", "--decoder-layers",
                  "2", "--encoder-embed-dim", "48", "--decoder-embed-dim", "48",
                  "--encoder-ffn-embed-dim", "96", "--decoder-ffn-embed-dim", "96",
                  "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
                  "--share-decoder-input-output-embed", "--optimizer", "adam", "--adam-betas",
                  "(0.9,0.98)", "--lr", "0.003", "--lr-scheduler", "inverse_sqrt",
                  "--warmup-updates", "4", "--warmup-init-lr", "1e-4", "--clip-norm", "0.1",
                  "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
                  "--max-tokens", "512", "--max-update", "17", "--seed", "1", "--cpu",
                  "--num-workers", "0", "--restore-file", converted[TRANSLATION][0],
                  "--save-dir", tmp_path, "--no-epoch-checkpoints", "--no-progress-bar",
                  "--log-format", "simple", "--log-interval", "1")
    assert re.search(r"Loaded checkpoint .*model\.pt \(epoch \d+ @ 15 updates\)", out), out[-3000:]
    assert load(tmp_path / "checkpoint_last.pt")["optimizer_history"][-1]["num_updates"] == 17
