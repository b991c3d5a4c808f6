"""``--alibi-window-sinks S`` as a model option: a flag of every family and side that has slope
windows, a hydra field, 0 for configurations written before it, saved and loaded, a load-time
override (``--model-overrides``, the hub's keyword), one-line errors; a causal LM decodes token
by token and streams with a bounded cache that keeps its sinks, equal to the full forward; and a
model built to park its attention on its first token (``</s>``, what a fairseq LM block starts
with) equals the dense model with sinks, and not without."""

import pytest
import torch
from fairseq import checkpoint_utils

from fairseq_alibi import options
from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel
from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention
from fairseq_alibi.modules.streaming import stream_log_probs
from tests.helpers.building import (build_model, build_tiny_translation, compose,
                                    decode_token_by_token, write_dictionary)
from tests.helpers.checkpoints import saved_by_trainer as save
from tests.helpers.cli import REPO
from tests.helpers.training import COMMON, MODELS

#: 4 heads, slopes 1/4 … 1/256: at T = 1/4 windows 1, 4, 16, 64 keys; 100 tokens roll them
CUTOFF, LENGTH, REACH = 0.25, 100, 64
VOCAB = 40


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dictionary(tmp_path_factory.mktemp("window_sinks"), VOCAB)


def tokens(length, rows=2):
    x = torch.randint(4, VOCAB, (rows, length), generator=torch.Generator().manual_seed(3))
    x[:, 0] = 2  # </s>, as fairseq's LM blocks begin
    return x


def lm(data, *flags, seed=0):
    torch.manual_seed(seed)
    return build_model("lm", data, *flags)


def test_every_family_and_side_with_windows_has_the_flag(data, tmp_path):
    model, _ = lm(data, "--alibi-window-cutoff", 8, "--alibi-window-sinks", 4)
    assert model.decoder.alibi.sinks == 4
    encoder, _ = build_model("encoder", data, "--alibi-window-cutoff", 4,
                             "--alibi-window-sinks", 1)
    assert encoder.encoder.sentence_encoder.alibi.sinks == 1
    mt = build_tiny_translation(write_dictionary(tmp_path / "pair", 20),
                                "--encoder-alibi-window-cutoff", 6,
                                "--encoder-alibi-window-sinks", 2,
                                "--decoder-alibi-window-cutoff", 2,
                                "--decoder-alibi-window-sinks", 3)
    assert (mt.encoder.alibi.sinks, mt.decoder.alibi.sinks) == (2, 3)
    assert options.default_of("window_sinks") == 0
    assert lm(data)[0].decoder.alibi.sinks == 0


@pytest.mark.parametrize("flags,error", [
    (["--alibi-window-sinks", 4],
     "^--alibi-window-sinks needs --alibi-window-cutoff: "),
    (["--alibi-window-cutoff", 8, "--alibi-window-sinks", -1],
     "^--alibi-window-sinks must be >= 0, got -1$"),
    (["--alibi-window-sinks", 4, "--alibi-document-mask", "eos"],
     "^--alibi-window-sinks needs --alibi-window-cutoff: "),
])
def test_nonsense_is_a_one_line_error(data, flags, error):
    with pytest.raises(ValueError, match=error) as raised:
        build_model("lm", data, *flags)
    assert "\n" not in str(raised.value)


def test_a_hydra_field_and_the_default_of_old_configurations():
    assert compose(REPO / "config" / "lm", "wikitext103_alibi").model.alibi_window_sinks == 0
    cfg = compose(REPO / "config" / "lm", "wikitext103_alibi",
                  ["++model.alibi_window_cutoff=8", "++model.alibi_window_sinks=4"])
    assert options.read(options.StackOptions, cfg.model, options.LM).window_sinks == 4
    old = {"alibi_window_cutoff": 8.0}  # a configuration written before the option
    options.fill_defaults(old, options.StackOptions, options.LM)
    assert old["alibi_window_sinks"] == 0


def test_decoding_and_streaming_keep_the_sinks_in_a_bounded_cache(data):
    model, _ = lm(data, "--alibi-window-cutoff", CUTOFF, "--alibi-window-sinks", 4)
    model.eval()
    x = tokens(LENGTH)
    state, steps, most = {}, [], 0
    with torch.no_grad():
        full = model(x)[0]
        for t in range(LENGTH):
            steps.append(model.decoder(x[:, :t + 1], incremental_state=state)[0][:, -1])
            for m in model.modules():
                if isinstance(m, AlibiMultiheadAttention):
                    saved = m._get_input_buffer(state)
                    sunk = saved.get("sink_key")
                    most = max(most, saved["prev_key"].size(2) + (0 if sunk is None
                                                                  else sunk.size(2)))
        streamed = stream_log_probs(model, x, 24)
        plain, _ = lm(data, "--alibi-window-cutoff", CUTOFF)
        plain.load_state_dict(model.state_dict())
        assert not torch.allclose(plain.eval()(x)[0], full, atol=1e-4)  # the sinks count
    assert most == REACH + 4
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=0)
    torch.testing.assert_close(streamed, model.get_normalized_probs((full,), log_probs=True),
                               atol=1e-5, rtol=0)


def test_with_a_document_mask_each_document_keeps_its_own_sinks(data):
    """A document packed after another computes what it computes alone (its sinks are its own
    first positions), and decoding token by token and streaming, whose caches keep the
    current document's sinks, equal the full forward."""
    model, _ = lm(data, "--alibi-window-cutoff", CUTOFF, "--alibi-window-sinks", 4,
                  "--alibi-document-mask", "eos")
    model.eval()
    x = tokens(LENGTH)
    x[0, 20] = x[1, 7] = 2  # documents of 80 and 93 tokens after one of 20 and 7
    with torch.no_grad():
        full = model(x)[0]
        alone = model(x[:1, 20:])[0]
        steps = decode_token_by_token(model, x)
        streamed = stream_log_probs(model, x, 24)
    torch.testing.assert_close(full[:1, 20:], alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=0)
    torch.testing.assert_close(streamed, model.get_normalized_probs((full,), log_probs=True),
                               atol=1e-5, rtol=0)


def test_saved_loaded_and_overridden_at_load_time(data, tmp_path):
    flags = ["--alibi-window-cutoff", CUTOFF]
    for folder in ("sinks", "plain"):
        (tmp_path / folder).mkdir()
    model, task = lm(data, *flags, "--alibi-window-sinks", 4)
    path = save(model, task, [data, *MODELS["lm"], *COMMON, *flags, "--alibi-window-sinks", 4],
                tmp_path / "sinks" / "lm.pt")
    x = tokens(60)
    with torch.no_grad():
        want = model.eval()(x)[0]
        loaded = checkpoint_utils.load_model_ensemble(
            [str(path)], arg_overrides={"data": str(data)})[0][0].eval()
        assert loaded.decoder.alibi.sinks == 4
        assert torch.equal(loaded(x)[0], want)
        # a model saved without sinks takes them at load time, and the hub's keyword too
        path = save(model, task, [data, *MODELS["lm"], *COMMON, *flags],
                    tmp_path / "plain" / "lm.pt")
        overridden = checkpoint_utils.load_model_ensemble(
            [str(path)], arg_overrides={"data": str(data), "alibi_window_sinks": 4})[0][0]
        assert overridden.decoder.alibi.sinks == 4
        assert torch.equal(overridden.eval()(x)[0], want)
        hub = AlibiTransformerLanguageModel.from_pretrained(
            str(path.parent), path.name, data_name_or_path=str(data), alibi_window_sinks=4)
        assert hub.models[0].decoder.alibi.sinks == 4
        assert torch.equal(hub.models[0](x)[0], want)


def test_a_model_that_parks_its_attention_on_its_first_token_needs_its_sinks(data):
    """One layer, every head's query a constant and every key reading only the ``</s>``
    direction of the embeddings: each head puts a logit of 60 on key 0 (``</s>``) and 0 on the
    others, so the dense model attends to ``</s>`` from every position. At T = 8 head 0's
    window is 32 keys: over 100 tokens the windows lose ``</s>`` (far from dense); with 4 sinks
    the windowed model is the dense one, whole and decoded token by token."""
    models = {name: lm(data, "--decoder-layers", 1, *flags)[0].eval() for name, flags in (
        ("dense", []), ("no sinks", ["--alibi-window-cutoff", 8]),
        ("4 sinks", ["--alibi-window-cutoff", 8, "--alibi-window-sinks", 4]))}
    dense = models["dense"]
    attention = dense.decoder.layers[0].self_attn
    with torch.no_grad():
        embeddings = dense.decoder.embed_tokens.weight
        embeddings[:, 0] = 0.0
        embeddings[2, 0] = 1.0  # </s>: the only token along dimension 0
        attention.k_proj.weight.zero_()
        attention.k_proj.bias.zero_()
        attention.k_proj.weight[:, 0] = 1.0  # keys: x[0] (times √32, the embedding scale)
        attention.q_proj.weight.zero_()
        attention.q_proj.bias.fill_(60 / (attention.head_dim**0.5 * 32**0.5))
    x = tokens(100)
    with torch.no_grad():
        out = {}
        for name, model in models.items():
            model.load_state_dict(dense.state_dict())
            out[name] = model.get_normalized_probs(model(x), log_probs=True)
        steps = decode_token_by_token(models["4 sinks"], x)
    assert (out["no sinks"] - out["dense"]).abs().max() > 0.1
    torch.testing.assert_close(out["4 sinks"], out["dense"], atol=1e-5, rtol=0)
    torch.testing.assert_close(steps, models["4 sinks"](x)[0], atol=1e-5, rtol=0)


def test_a_left_padded_lm_row_keeps_its_own_first_tokens_as_sinks(data):
    """A language model's batch padded on the left (built by hand): a short row's logits,
    states and alignment are what it gets on its own, its sinks its own first tokens; a KV
    cache from such rows is refused in one line (fairseq's generators pad on the right)."""
    from fairseq_alibi.error_hints import OneLineError

    model = lm(data, "--alibi-window-cutoff", str(CUTOFF), "--alibi-window-sinks", "2")[0].eval()
    pad = model.decoder.padding_idx
    long, short = tokens(40, 1)[0], tokens(25, 1)[0]
    batch = torch.full((2, 40), pad)
    batch[0], batch[1, 15:] = long, short
    with torch.no_grad():
        both, extra = model(batch, return_all_hiddens=True)
        alone, alone_extra = model(short[None], return_all_hiddens=True)
        full = model(long[None])[0][0]  # the row without padding: as it is
    assert (both[1, 15:] - alone[0]).abs().max() < 1e-5 and (both[0] - full).abs().max() < 1e-5
    for x, y in zip(extra["inner_states"], alone_extra["inner_states"]):
        assert (x[15:, 1] - y[:, 0]).abs().max() < 1e-5
    with pytest.raises(OneLineError, match="padded on the left, with attention sinks"):
        model.decoder(batch, incremental_state={})


def test_a_left_padded_source_keeps_its_own_first_tokens_as_sinks(data):
    """fairseq pads translation sources on the left: a short source in a batch gets the
    encoder output (and its padding mask, states and embeddings laid out as given) it gets on
    its own, its sinks its own first tokens, not the row's padding; with a document mask too."""
    for extra in ([], ["--encoder-alibi-document-mask", "doc"]):
        torch.manual_seed(0)
        model = build_tiny_translation(data, "--encoder-alibi-window-cutoff", str(CUTOFF),
                                       "--encoder-alibi-window-sinks", "2", *extra).eval()
        pad = model.encoder.padding_idx
        long, short = tokens(40, 1)[0], tokens(25, 1)[0]
        long[-1] = short[-1] = 2
        batch = torch.full((2, 40), pad)
        batch[0], batch[1, 15:] = long, short
        with torch.no_grad():
            both = model.encoder(batch, torch.tensor([40, 25]), return_all_hiddens=True)
            alone = model.encoder(short[None], torch.tensor([25]), return_all_hiddens=True)
        assert both["encoder_padding_mask"][0].tolist() == batch.eq(pad).tolist()
        for key, at in (("encoder_out", (slice(15, None), 1)),
                        ("encoder_states", (slice(15, None), 1)),
                        ("encoder_embedding", (1, slice(15, None)))):
            for x, y in zip(both[key], alone[key]):
                y = y[:, 0] if key != "encoder_embedding" else y[0]
                assert (x[at] - y).abs().max() < 1e-5, key
        # the sinks bite here: the row as laid out, its padding first, differs
        from fairseq.models.transformer import TransformerEncoder

        with torch.no_grad():
            model.encoder.read_tokens(batch)
            as_laid = TransformerEncoder.forward_scriptable(model.encoder, batch,
                                                            torch.tensor([40, 25]))
        gap = as_laid["encoder_out"][0][15:, 1] - alone["encoder_out"][0][:, 0]
        assert gap.abs().max() > 1e-3
        # padded on the right (alibi_roberta): run as it is, bit for bit
        right = torch.full((2, 40), pad)
        right[0], right[1, :25] = long, short
        with torch.no_grad():
            ours = model.encoder(right, torch.tensor([40, 25]))["encoder_out"][0]
            model.encoder.read_tokens(right)
            stock = TransformerEncoder.forward_scriptable(model.encoder, right,
                                                          torch.tensor([40, 25]))
        assert torch.equal(ours, stock["encoder_out"][0])
