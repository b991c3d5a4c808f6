"""Document masks in the models: a document inside a packed row computes what it computes on its
own (LM and encoder), cached decoding and streaming equal the full forward with documents and
slope windows, the load-time override, checkpoints saved before the option, the errors."""

import pytest
import torch
from fairseq import checkpoint_utils

import fairseq_alibi  # noqa: F401  (registers the models)
from fairseq_alibi.modules.streaming import stream_log_probs
from tests.helpers.building import build_model, decode_token_by_token, write_dictionary
from tests.helpers.cli import REPO

FIXTURES = REPO / "tests" / "fixtures" / "saved_models"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dictionary(tmp_path_factory.mktemp("documents"), 40)


def packed(eos, first, second, seed=0):
    """``(row, second_alone)``: a row holding the end of one document (``first`` tokens) and a
    second one opened by ``</s>`` (``second`` tokens, ``</s>`` included), and that document
    on its own."""
    generator = torch.Generator().manual_seed(seed)
    row = torch.randint(4, 40, (first + second,), generator=generator)
    row[first] = eos
    return row[None], row[None, first:]


def lm(data, *flags):
    model, task = build_model("lm", data, "--alibi-document-mask", "eos", *flags)
    return model.eval(), task.source_dictionary.eos()


@pytest.mark.parametrize("flags", [(), ("--alibi-window-cutoff", "1")])
def test_a_document_in_a_packed_lm_row_computes_what_it_computes_alone(data, flags):
    model, eos = lm(data, *flags)
    row, alone = packed(eos, 9, 14)
    with torch.no_grad():
        together = model(row)[0][:, 9:]
        by_itself = model(alone)[0]
    torch.testing.assert_close(together, by_itself, rtol=1e-5, atol=1e-5)


def test_the_split_into_documents_is_laid_out_once_per_forward_pass(data, monkeypatch):
    """Every layer reads the same documents: the first layer's layout serves the others."""
    from fairseq_alibi.modules.attention import documents

    model, eos = lm(data)  # 2 layers
    calls = []
    real = documents.layout
    monkeypatch.setattr(documents, "layout", lambda ids: calls.append(ids) or real(ids))
    row, _ = packed(eos, 9, 14)
    with torch.no_grad():
        model(row)
        model(row)
    assert len(calls) == 2  # one per pass, not per layer


@pytest.mark.parametrize("flags", [(), ("--alibi-window-cutoff", "1")])
def test_cached_decoding_and_streaming_equal_the_full_forward_with_documents(data, flags):
    model, eos = lm(data, *flags)
    row = torch.randint(4, 40, (2, 40), generator=torch.Generator().manual_seed(3))
    row[0, [7, 8, 30]] = eos  # a document of one token, one of 22
    row[1, 19] = eos
    with torch.no_grad():
        full = model.get_normalized_probs(model(row), log_probs=True)
        steps = decode_token_by_token(model, row)
        streamed = stream_log_probs(model, row, chunk=6)
    torch.testing.assert_close(model.get_normalized_probs((steps, None), log_probs=True), full,
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(streamed, full, rtol=1e-5, atol=1e-5)


def test_the_doc_mode_opens_documents_at_the_empty_line_only(data):
    model, eos = lm(data)
    model.decoder.alibi.document_mask = "doc"
    row, alone = packed(eos, 9, 14)
    with torch.no_grad():
        lone_eos = model(row)[0][:, 9:]  # one </s>: the same document in doc mode
        row[0, 8] = eos  # </s> </s>: the empty line
        empty_line = model(row)[0][:, 9:]
        by_itself = model(alone)[0]
    assert not torch.allclose(lone_eos, by_itself, atol=1e-3)
    torch.testing.assert_close(empty_line, by_itself, rtol=1e-5, atol=1e-5)


def test_an_encoder_document_in_a_packed_row_computes_what_it_computes_alone(data):
    model, task = build_model("encoder", data, "--alibi-document-mask", "eos",
                              "--alibi-variant", "symmetric")
    model.eval()
    eos = task.source_dictionary.eos()
    row, alone = packed(eos, 7, 12)
    with torch.no_grad():
        together = model(row)[0][:, 7:]
        by_itself = model(alone)[0]
    torch.testing.assert_close(together, by_itself, rtol=1e-5, atol=1e-5)


def test_a_model_saved_with_a_document_mask_loads_with_it(data, tmp_path):
    from tests.helpers.checkpoints import saved_in_process
    from tests.helpers.training import MODELS

    path = saved_in_process(tmp_path / "checkpoint.pt", data, *MODELS["lm"],
                            "--alibi-document-mask", "doc")
    loaded = checkpoint_utils.load_model_ensemble([str(path)], arg_overrides={"data": str(data)})
    assert loaded[0][0].decoder.alibi.document_mask == "doc"


def test_checkpoints_saved_before_the_option_load_without_it_and_take_the_override():
    path = str(FIXTURES / "lm_fixed_slopes" / "checkpoint.pt")
    old = checkpoint_utils.load_model_ensemble([path], arg_overrides={"data": str(FIXTURES)})
    assert old[0][0].decoder.alibi.document_mask == "none"
    new = checkpoint_utils.load_model_ensemble(
        [path], arg_overrides={"data": str(FIXTURES), "alibi_document_mask": "doc"})
    assert new[0][0].decoder.alibi.document_mask == "doc"


def test_a_misspelt_or_unknown_document_mask_is_a_one_line_error(data):
    with pytest.raises(SystemExit):  # argparse: an invalid choice
        build_model("lm", data, "--alibi-document-mask", "lines")
    with pytest.raises(ValueError, match="--alibi-document-mask eos cannot be combined with "
                                         "--alibi-global-tokens"):
        build_model("encoder", data, "--alibi-document-mask", "eos", "--alibi-global-tokens", "1")
    path = str(FIXTURES / "lm_fixed_slopes" / "checkpoint.pt")
    with pytest.raises(Exception, match="alibi_document_mask"):
        checkpoint_utils.load_model_ensemble(
            [path], arg_overrides={"data": str(FIXTURES), "alibi_documents_mask": "eos"})


def test_a_side_without_alibi_self_attention_refuses_a_document_mask(data):
    from tests.helpers.building import build_tiny_translation

    with pytest.raises(ValueError) as raised:
        build_tiny_translation(data, "--decoder-alibi-variant", "none",
                               "--decoder-alibi-document-mask", "eos")
    assert str(raised.value) == (
        "--decoder-alibi-document-mask needs --decoder-alibi-variant causal, not none: it masks "
        "this side's ALiBi self-attention")


def test_eos_on_a_translation_encoder_is_a_one_line_error(data, caplog):
    """A source is ``A </s>``: ``eos`` would make its ``</s>`` a document of its own, cut off
    from the sentence; ``doc`` (two ``</s>`` in a row) and the decoder's ``eos`` are built,
    with a note that a pair's lines hold one document each unless they join some."""
    from tests.helpers.building import build_tiny_translation

    with pytest.raises(ValueError) as raised:
        build_tiny_translation(data, "--encoder-alibi-document-mask", "eos")
    assert str(raised.value).startswith(
        "--encoder-alibi-document-mask eos: a source ends with its </s>, and eos makes every "
        "</s> open a document") and "\n" not in str(raised.value)
    for flags in (["--encoder-alibi-document-mask", "doc"],
                  ["--decoder-alibi-document-mask", "eos"]):
        caplog.clear()
        with caplog.at_level("WARNING"):
            model = build_tiny_translation(data, *flags)
        assert f"{flags[0]} {flags[1]} with --task translation: each side of a pair is one " \
               "line with one </s>" in caplog.text
        assert {m.alibi.document_mask for m in model.modules()
                if hasattr(m, "alibi") and hasattr(m.alibi, "document_mask")} >= {flags[1]}


def test_a_document_mask_that_cannot_do_its_work_is_a_logged_note(data, caplog):
    """eos with --sample-break-mode eos (every sample one line: nothing to mask), doc with eos or
    complete_doc (no two documents in a sample), and a masked LM (a masked </s> hides its
    boundary): built, each with a note naming the flag."""
    with caplog.at_level("WARNING"):
        build_model("lm", data, "--alibi-document-mask", "eos", "--sample-break-mode", "eos")
    assert "--alibi-document-mask eos with --sample-break-mode eos" in caplog.text
    for breaks in ("eos", "complete_doc"):  # doc finds no boundary in such samples either
        caplog.clear()
        with caplog.at_level("WARNING"):
            build_model("lm", data, "--alibi-document-mask", "doc", "--sample-break-mode", breaks)
        assert (f"--alibi-document-mask doc with --sample-break-mode {breaks}: " in caplog.text
                and "the mask changes nothing" in caplog.text)
    caplog.clear()
    with caplog.at_level("WARNING"):  # eos keeps the lines of a complete_doc sample apart
        build_model("lm", data, "--alibi-document-mask", "eos", "--sample-break-mode",
                    "complete_doc")
    assert "changes nothing" not in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        build_model("encoder", data, "--alibi-document-mask", "doc")
    assert "--alibi-document-mask doc on a masked LM" in caplog.text
    assert "--criterion masked_lm leaves a </s> replaced" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):  # the criterion that keeps them: nothing to say
        build_model("encoder", data, "--alibi-document-mask", "doc", "--criterion",
                    "masked_lm_documents")
    assert "on a masked LM" not in caplog.text


def test_doc_on_data_without_an_empty_line_is_a_logged_note(data, tmp_path, caplog):
    """doc's boundary is an empty line: a train split without one (written without
    --document-breaks) has none, and the mask changes nothing; said once, naming the fix."""
    from tests.helpers.cli import preprocess

    for name, text in (("lines", "w1 w2 w3\nw4 w5\n" * 20), ("documents", "w1 w2\n\nw3\n" * 20)):
        (tmp_path / f"{name}.txt").write_text(text)
        preprocess("--only-source", "--srcdict", data / "dict.txt", "--trainpref",
                   tmp_path / f"{name}.txt", "--destdir", tmp_path / name, "--workers", "1")
        caplog.clear()
        with caplog.at_level("WARNING"):
            build_model("lm", tmp_path / name, "--alibi-document-mask", "doc")
        said = f"--alibi-document-mask doc: the train split of {tmp_path / name} holds no " \
               "empty line (an </s> right after an </s>), so no document boundary"
        assert (said in caplog.text) == (name == "lines"), caplog.text


def test_a_document_mask_on_sentence_prediction_is_a_one_line_error(data, tmp_path):
    """GLUE's pairs are ``<s> A </s> </s> B </s>``: either mode would hide B from ``<s>``."""
    from tests.helpers.building import build_from_command_line

    write_dictionary(tmp_path / "input0", 40)
    (tmp_path / "label").mkdir()
    (tmp_path / "label" / "dict.txt").write_text("0 1\n1 1\n")
    flags = ["--task", "sentence_prediction", "--criterion", "sentence_prediction",
             "--num-classes", "2", "--arch",
             "alibi_roberta_base", "--encoder-layers", "1", "--encoder-embed-dim", "16",
             "--encoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--cpu"]
    with pytest.raises(ValueError) as raised:
        build_from_command_line(tmp_path, *flags, "--alibi-document-mask", "doc")
    assert str(raised.value).startswith(
        "--alibi-document-mask doc with --task sentence_prediction: a sample is one example "
        "whose sentences are joined by </s>")
    build_from_command_line(tmp_path, *flags)  # without it: built
    # a classifier saved with the mask (before this refusal) loads with the override it names
    from tests.helpers.checkpoints import saved_in_process

    path = saved_in_process(tmp_path / "saved" / "checkpoint.pt", tmp_path, *flags)
    state = torch.load(path, weights_only=False)
    setattr(state["cfg"]["model"], "alibi_document_mask", "doc")  # an argparse Namespace
    torch.save(state, path)
    with pytest.raises(ValueError, match="a model saved with it loads with --model-overrides"):
        checkpoint_utils.load_model_ensemble([str(path)], arg_overrides={"data": str(tmp_path)})
    models, _ = checkpoint_utils.load_model_ensemble(
        [str(path)], arg_overrides={"data": str(tmp_path), "alibi_document_mask": "none"})
    assert models[0].encoder.sentence_encoder.alibi.document_mask == "none"


def test_masked_lm_documents_puts_back_the_boundaries_the_masking_hid(data):
    """``--criterion masked_lm_documents``: a ``</s>`` replaced by ``<mask>`` is put back in
    the input and not predicted, so the document mask sees the boundary: the loss of a masked
    token of the second document is what that document alone gives. Stock ``masked_lm`` on the
    same batch reads across the hidden boundary (and predicts it)."""
    from fairseq.criterions.masked_lm import MaskedLmConfig, MaskedLmLoss

    from fairseq_alibi.criterions.masked_lm_documents import (MaskedLmDocumentsConfig,
                                                              MaskedLmDocumentsLoss)

    torch.manual_seed(0)  # the tiny model's weights: how much B's token reads of A depends on them
    model, task = build_model("encoder", data, "--alibi-document-mask", "doc")
    model.eval()
    d = task.source_dictionary
    eos, pad, mask = d.eos(), d.pad(), task.mask_idx
    text = torch.randint(4, 40, (1, 20), generator=torch.Generator().manual_seed(3))
    text[0, 0], text[0, 8], text[0, 9], text[0, 19] = d.bos(), eos, eos, eos  # "A </s> </s> B"

    def batch(tokens, masked_at):
        src, target = tokens.clone(), torch.full_like(tokens, pad)
        src[0, masked_at], target[0, masked_at] = mask, tokens[0, masked_at]
        return {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([src.size(1)])},
                "target": target, "ntokens": src.numel(), "nsentences": 1}

    packed = batch(text, [9, 13])  # the boundary (the second </s>) and a token of B masked
    alone = batch(text[:, 9:], [4])  # B on its own from its boundary, the same token masked
    kept = MaskedLmDocumentsLoss(MaskedLmDocumentsConfig(tpu=False), task)
    stock = MaskedLmLoss(MaskedLmConfig(tpu=False), task)
    with torch.no_grad():
        loss, size, _ = kept(model, packed)
        want, want_size, _ = stock(model, alone)
        crossing, crossing_size, _ = stock(model, packed)
    assert (int(size), int(want_size), int(crossing_size)) == (1, 1, 2)
    torch.testing.assert_close(loss, want, rtol=0.0, atol=1e-6)
    assert packed["net_input"]["src_tokens"][0, 9] == mask  # the batch given is not changed
    # stock's loss on B's token alone differs: it reads across the hidden boundary
    with torch.no_grad():
        only_b = dict(packed, target=packed["target"].masked_fill(packed["target"].eq(eos), pad))
        across, _, _ = stock(model, only_b)
    assert abs(float(across) - float(want)) > 1e-5  # 9.2e-5 with these weights
    # on another task it would silently drop every </s> from an LM's targets: refused
    _, lm_task = build_model("lm", data)
    with pytest.raises(ValueError, match="--criterion masked_lm_documents needs --task masked_lm"
                                         r" \(this is --task language_modeling\)"):
        MaskedLmDocumentsLoss(MaskedLmDocumentsConfig(tpu=False), lm_task)


def test_masked_lm_documents_without_a_document_mask_says_so_once(data, caplog):
    """Without a document mask the criterion only stops predicting </s>: a warning at its first
    batch (it meets the model there), none with the mask."""
    from fairseq_alibi.criterions.masked_lm_documents import (MaskedLmDocumentsConfig,
                                                              MaskedLmDocumentsLoss)

    for flags, said in (((), 1), (("--alibi-document-mask", "doc"), 0)):
        model, task = build_model("encoder", data, *flags)
        d = task.source_dictionary
        tokens = torch.randint(4, 40, (1, 8))
        target = torch.full_like(tokens, d.pad())
        target[0, 3] = tokens[0, 3]
        sample = {"net_input": {"src_tokens": tokens, "src_lengths": torch.tensor([8])},
                  "target": target, "ntokens": 8, "nsentences": 1}
        criterion = MaskedLmDocumentsLoss(MaskedLmDocumentsConfig(tpu=False), task)
        caplog.clear()
        with caplog.at_level("WARNING"), torch.no_grad():
            criterion(model, sample)
            criterion(model, sample)
        assert caplog.text.count("on a model without --alibi-document-mask") == said
