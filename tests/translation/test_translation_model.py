"""alibi_transformer in process: the whole encoder-decoder against a float64 reference computed
on unpadded sentences (left-padded sources, right-padded targets, every attention backend),
cached beam-search decoding, every mirrored architecture, stock equivalence of ``none``, the
task's length limits, and clear errors for bad options and checkpoints of the wrong kind."""

import argparse
import dataclasses

import pytest
import torch
from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_alibi.alibi import ENCODER_VARIANTS
from fairseq_alibi.models.alibi_transformer import AlibiTransformerModel
from fairseq_alibi.modules.stacks import UNBOUNDED_POSITIONS
from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention, set_attention_backend
from fairseq_alibi.modules.attention import REGISTRY, flex
from tests.helpers.building import setup_from_command_line
from tests.helpers.translation import (
    TGT_WORDS, TINY_TRANSLATION, assert_cached_decoding_matches_the_full_forward,
    build_translation, reference_translation_logits, token_sentences, translation_batch,
    write_translation_dictionaries,
)

ALIBI_VARIANTS = [v for v in ENCODER_VARIANTS if v != "none"]
ARCHS = sorted(a for a, m in ARCH_MODEL_REGISTRY.items() if m is AlibiTransformerModel)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_translation_dictionaries(tmp_path_factory.mktemp("translation_dicts"))


# ---------------------------------------------------------------- the float64 reference


ATTENTIONS = ["naive", "sdpa", "fold", "flex"]


def select_attention(name, monkeypatch, calls):
    """Set up backend ``name`` (flex eager, not compiled per variant); count its calls."""
    if name == "flex":
        if not flex.available():
            pytest.skip("this torch has no flex_attention")
        from torch.nn.attention.flex_attention import flex_attention

        monkeypatch.setattr(flex, "_compiled_flex", lambda: flex_attention)
    backend = REGISTRY[name]

    def spy(*args, **kwargs):
        calls.append(name)
        return backend.run(*args, **kwargs)

    monkeypatch.setitem(REGISTRY, name, dataclasses.replace(backend, run=spy))
    return name


@pytest.mark.parametrize("attention_name", ATTENTIONS)
def test_the_attention_flag_reaches_every_self_attention_layer(data, attention_name):
    model, _ = build_translation(data, "--alibi-attention", attention_name)
    layers = [m for m in model.modules() if isinstance(m, AlibiMultiheadAttention)]
    assert len(layers) == 4 and {m.attention_backend for m in layers} == {attention_name}


@pytest.mark.parametrize("attention_name", ATTENTIONS)
@pytest.mark.parametrize("variant", ALIBI_VARIANTS)
def test_left_padded_batch_matches_float64_reference_on_unpadded_sentences(
        data, variant, attention_name, monkeypatch):
    ratio = 0.25 if variant == "asymmetric" else 1.0
    extra = ["--encoder-alibi-future-slope-ratio", ratio] if variant == "asymmetric" else []
    calls = []
    backend = select_attention(attention_name, monkeypatch, calls)
    # built once per variant (the flag's wiring: the test above), then switched to the backend
    model, task = build_translation(data, "--encoder-alibi-variant", variant, *extra)
    set_attention_backend(model, backend)
    # unequal lengths: left padding of 0, 4 and 9 sources tokens; one target with no padding
    sources = token_sentences(task, [11, 7, 2])
    targets = token_sentences(task, [5, 9, 3], side="tgt", seed=1)
    src, lengths, prev = translation_batch(task, sources, targets)
    assert src[2, 0] == task.source_dictionary.pad() and src[0, 0] != task.source_dictionary.pad()
    with torch.no_grad():
        got = model(src, lengths, prev)[0]
    for b, (source, target) in enumerate(zip(sources, targets)):
        prev_b = torch.cat([target[-1:], target[:-1]])  # eos first, as fairseq shifts
        want = reference_translation_logits(model, source, prev_b, variant, ratio)
        assert torch.allclose(got[b, : len(target)].double(), want, atol=1e-5, rtol=0), b
    # every ALiBi self-attention call (2 encoder + 2 decoder layers) went to that backend
    assert calls == [attention_name] * 4


def test_sources_with_no_padding_at_all_match_the_reference(data):
    model, task = build_translation(data)
    sources = token_sentences(task, [6, 6])
    targets = token_sentences(task, [4, 4], side="tgt")
    src, lengths, prev = translation_batch(task, sources, targets)
    assert not src.eq(task.source_dictionary.pad()).any()
    with torch.no_grad():
        got = model(src, lengths, prev)[0]
    for b in range(2):
        prev_b = torch.cat([targets[b][-1:], targets[b][:-1]])
        want = reference_translation_logits(model, sources[b], prev_b, "offset")
        assert torch.allclose(got[b].double(), want, atol=1e-5, rtol=0)


# ---------------------------------------------------------------- cached decoding


@pytest.mark.parametrize("variant", ["offset", "one_sided", "none"])
def test_cached_decoding_with_beam_reorder_equals_the_full_forward(data, variant):
    """Step-by-step decoding with a KV cache, cross-attention and a beam reorder in the middle,
    48 target tokens (no training length exists here, and nothing is sized by one)."""
    model, task = build_translation(data, "--encoder-alibi-variant", variant)
    assert_cached_decoding_matches_the_full_forward(model, task)


def test_beam_search_scores_every_source_far_longer_than_the_default_limit(data):
    """SequenceGenerator through the task, sources of 1500 tokens (over the stock 1024)."""
    model, task = build_translation(data, "--decoder-layers", 1, "--encoder-layers", 1)
    assert task.max_positions() == (UNBOUNDED_POSITIONS, UNBOUNDED_POSITIONS)
    sources = token_sentences(task, [1500, 40])
    src, lengths, _ = translation_batch(task, sources, token_sentences(task, [1, 1], side="tgt"))
    generator = task.build_generator([model], argparse.Namespace(beam=2, max_len_a=0, max_len_b=8))
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}, "id": torch.arange(2)}
    with torch.no_grad():
        hypos = task.inference_step(generator, [model], sample)
    assert len(hypos) == 2 and all(len(h) == 2 for h in hypos)
    assert all(torch.isfinite(h[0]["score"]) for h in hypos)


# ---------------------------------------------------------------- architectures and options


def test_the_mirrored_architectures_are_registered():
    for arch in ["alibi_transformer", "alibi_transformer_iwslt_de_en", "alibi_transformer_wmt_en_de",
                 "alibi_transformer_vaswani_wmt_en_de_big", "alibi_transformer_wmt_en_de_big_t2t",
                 "alibi_transformer_tiny"]:
        assert arch in ARCHS


@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_builds_and_runs_at_test_dims(data, arch):
    model, task = build_translation(data, arch=arch)
    assert model.encoder.embed_positions is None and model.decoder.embed_positions is None
    assert model.max_positions() == (UNBOUNDED_POSITIONS, UNBOUNDED_POSITIONS)
    sources = token_sentences(task, [40, 13])  # longer than anything a test trains on
    src, lengths, prev = translation_batch(task, sources,
                                           token_sentences(task, [30, 9], side="tgt"))
    with torch.no_grad():
        out = model(src, lengths, prev)[0]
    assert out.shape == (2, 31, len(task.target_dictionary)) and torch.isfinite(out).all()


def test_stock_flags_train_layerdrop_prenorm_checkpointing_shared_embeddings(tmp_path):
    joined = tmp_path / "joined"
    joined.mkdir()
    words = "".join(f"w{i} {100 - i}\n" for i in range(20))
    for lang in ("src", "tgt"):
        (joined / f"dict.{lang}.txt").write_text(words)
    model, task = build_translation(joined, "--share-all-embeddings", "--encoder-normalize-before",
                        "--decoder-normalize-before", "--encoder-layerdrop", 0.5,
                        "--decoder-layerdrop", 0.5, "--checkpoint-activations",
                        "--encoder-alibi-variant", "symmetric")
    assert model.encoder.embed_tokens is model.decoder.embed_tokens
    assert model.decoder.output_projection.weight is model.encoder.embed_tokens.weight
    model.train()
    src, lengths, prev = translation_batch(task, token_sentences(task, [9, 4]),
                                           token_sentences(task, [6, 3], side="tgt"))
    out = model(src, lengths, prev)[0]
    out.float().sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_none_on_both_sides_is_exactly_stock_transformer(data):
    model, task = build_translation(data, "--encoder-alibi-variant", "none",
                                    "--decoder-alibi-variant", "none")
    stock, _ = build_translation(data, arch="transformer")
    stock.load_state_dict(model.state_dict(), strict=True)
    src, lengths, prev = translation_batch(task, token_sentences(task, [9, 4]),
                                           token_sentences(task, [6, 3], side="tgt"))
    with torch.no_grad():
        assert torch.equal(model(src, lengths, prev)[0], stock(src, lengths, prev)[0])
    assert task.max_positions() == (1024, 1024)


def test_each_side_is_chosen_independently_and_the_options_are_not_mutated(data):
    cfg, task = setup_from_command_line(
        data, "--task", "translation", "--source-lang", "src", "--target-lang", "tgt",
        "--arch", "alibi_transformer", *TINY_TRANSLATION, "--encoder-alibi-variant", "none")
    model = task.build_model(cfg.model)
    assert model.encoder.embed_positions is not None and not model.encoder_uses_alibi
    assert model.decoder.embed_positions is None and model.decoder_uses_alibi
    assert not cfg.model.no_token_positional_embeddings  # what the checkpoint saves
    assert task.max_positions() == (1024, UNBOUNDED_POSITIONS)
    stock, _ = build_translation(data, arch="transformer")
    assert set(model.state_dict()) - set(stock.state_dict()) == {"decoder.alibi.slopes"}


def test_state_dict_is_stock_plus_slopes(data):
    model, _ = build_translation(data, "--encoder-alibi-variant", "asymmetric")
    stock, _ = build_translation(data, arch="transformer", perturb=False)
    stock_keys = {k for k in stock.state_dict() if ".embed_positions." not in k}
    assert set(model.state_dict()) - stock_keys == {
        "encoder.alibi.slopes", "encoder.alibi.future_slope_ratio", "decoder.alibi.slopes"}
    assert stock_keys <= set(model.state_dict())


# ---------------------------------------------------------------- bad input


def test_unknown_variant_on_the_command_line_names_the_choices(data, capsys):
    with pytest.raises(SystemExit):
        build_translation(data, "--encoder-alibi-variant", "bidirectional")
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--encoder-alibi-variant: invalid choice: 'bidirectional'" in error
    assert "offset" in error


def test_unknown_variant_in_a_config_is_a_clear_error(data):
    from omegaconf import OmegaConf

    cfg, task = setup_from_command_line(
        data, "--task", "translation", "--source-lang", "src", "--target-lang", "tgt",
        "--arch", "alibi_transformer", *TINY_TRANSLATION)
    options = dict(vars(cfg.model), decoder_alibi_variant="symmetric")
    for model_cfg in (argparse.Namespace(**options), OmegaConf.create(options)):  # CLI, hydra
        with pytest.raises(ValueError, match="unknown --decoder-alibi-variant 'symmetric'.*causal"):
            task.build_model(model_cfg)


def test_odd_head_count_with_one_sided_is_a_clear_error(data):
    with pytest.raises(ValueError, match="even number of attention heads.*got 3"):
        build_translation(data, "--encoder-alibi-variant", "one_sided",
                          "--encoder-attention-heads", 3, "--encoder-embed-dim", 33,
                          "--decoder-embed-dim", 33, "--decoder-attention-heads", 3)


def test_learned_positions_with_an_alibi_side_are_a_clear_error(data):
    with pytest.raises(ValueError, match="--decoder-learned-pos.*--decoder-alibi-variant none"):
        build_translation(data, "--decoder-learned-pos")
    model, _ = build_translation(data, "--encoder-learned-pos", "--encoder-alibi-variant", "none")
    assert model.encoder.embed_positions.weight.requires_grad  # stock learned positions


def test_future_slope_ratio_without_asymmetric_is_a_clear_error(data):
    with pytest.raises(ValueError, match="asymmetric"):
        build_translation(data, "--encoder-alibi-future-slope-ratio", 0.5)


@pytest.mark.parametrize("learned", [False, True], ids=["sinusoidal", "learned"])
def test_stock_checkpoint_into_the_alibi_model_is_a_clear_error(data, learned):
    flags = ["--encoder-learned-pos", "--decoder-learned-pos"] if learned else []
    stock, _ = build_translation(data, *flags, arch="transformer")
    model, _ = build_translation(data)
    # learned positions are saved; sinusoidal ones are not (no tensor of theirs is persistent)
    error = "position embeddings.*not alibi_transformer" if learned else "trained with no ALiBi on the encoder and decoder.*stock"
    with pytest.raises(ValueError, match=error):
        model.load_state_dict(stock.state_dict(), strict=True)


def test_checkpoint_of_another_side_choice_is_a_clear_error(data):
    alibi, _ = build_translation(data)
    stock_decoder, _ = build_translation(data, "--decoder-alibi-variant", "none")
    with pytest.raises(ValueError, match="ALiBi on the decoder.*--decoder-alibi-variant none"):
        stock_decoder.load_state_dict(alibi.state_dict(), strict=True)
    with pytest.raises(ValueError, match="trained with no ALiBi on the decoder"):
        alibi.load_state_dict(stock_decoder.state_dict(), strict=True)


def test_checkpoint_of_another_encoder_variant_is_a_clear_error(data):
    one_sided, _ = build_translation(data, "--encoder-alibi-variant", "one_sided")
    offset, _ = build_translation(data)
    with pytest.raises(ValueError, match="trained with --encoder-alibi-variant one_sided .*has --encoder-alibi-variant offset: build it with --encoder-alibi-variant one_sided"):
        offset.load_state_dict(one_sided.state_dict(), strict=True)
    asymmetric, _ = build_translation(data, "--encoder-alibi-variant", "asymmetric")
    with pytest.raises(ValueError, match="trained with --encoder-alibi-variant asymmetric .*build it with --encoder-alibi-variant asymmetric"):
        offset.load_state_dict(asymmetric.state_dict(), strict=True)


def test_a_dictionary_that_does_not_match_is_a_clear_error(data, tmp_path):
    model, _ = build_translation(data)
    other, _ = build_translation(
        write_translation_dictionaries(tmp_path / "other", tgt_words=TGT_WORDS + 5))
    with pytest.raises(ValueError, match=f"dictionary of {TGT_WORDS + 4} symbols.*has "
                                         f"{TGT_WORDS + 9}"):
        other.load_state_dict(model.state_dict(), strict=True)
