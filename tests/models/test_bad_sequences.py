"""Inputs of unusual shape (docs/reliability.md, catalogue of bad inputs): empty sequences,
all-padding rows, an empty batch, and sequences 16x the training length give correct output.

Backed elsewhere, not repeated here: all-padding rows per layer (test_attention,
test_roberta_model), the hub scoring a text longer than ``--max-tokens`` (test_bad_hub). Tests
that run fairseq's command lines (or read their checkpoints) are marked ``slow``.
"""

import pytest
import torch

from fairseq_alibi.modules.alibi_multihead_attention import set_attention_backend

from tests.helpers.building import build_model, decode_token_by_token

ENCODER_VARIANTS = ["symmetric", "one_sided", "offset", "asymmetric"]


# ---------------------------------------------------------------- empty sequences and padding


@pytest.mark.parametrize("model,extra", [("lm", [])] + [
    ("encoder", ["--alibi-variant", v]) for v in ENCODER_VARIANTS])
def test_zero_length_and_all_padding_rows(model, extra, tiny_lm_data):
    net, task = build_model(model, tiny_lm_data, *extra)
    net.eval()
    vocab, pad = len(task.source_dictionary), task.source_dictionary.pad()
    with torch.no_grad():
        empty = net(torch.zeros(2, 0, dtype=torch.long))[0]
        assert empty.shape[:2] == (2, 0)
        tokens = torch.randint(4, vocab, (3, 9))
        tokens[1, :] = pad  # a row with no real token at all
        tokens[2, 4:] = pad
        out = net(tokens)[0]
        assert torch.isfinite(out).all()
        alone = net(tokens[:1])[0]  # the padded rows change nothing in the others
        assert torch.allclose(out[:1], alone, atol=1e-5, rtol=0)


def test_a_batch_of_no_sequences(tiny_lm_data):
    net, _ = build_model("lm", tiny_lm_data)
    with torch.no_grad():
        assert net.eval()(torch.zeros(0, 5, dtype=torch.long))[0].shape[:2] == (0, 5)


# ---------------------------------------------------------------- 16x the training length


@pytest.mark.slow
def test_lm_sequence_16x_the_training_length(trained_lm_checkpoint, tiny_lm_data):
    """Trained at 16 tokens, scored at 256: finite, causal (a prefix is scored the same
    whatever follows), and equal to token-by-token decoding with the KV cache."""
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel

    hub = AlibiTransformerLanguageModel.from_pretrained(
        str(trained_lm_checkpoint.parent), trained_lm_checkpoint.name,
        data_name_or_path=str(tiny_lm_data),
        max_tokens=4096)  # else the hub batches with the training run's --max-tokens (128)
    words = " ".join(f"w{(7 * i) % 60}" for i in range(256))  # 16 x 16 tokens scored
    scores = hub.score(words)["positional_scores"]
    assert scores.numel() == 256 and torch.isfinite(scores).all()
    prefix = hub.score(" ".join(words.split()[:40]))["positional_scores"]
    n = prefix.numel() - 1  # the last one scores </s>, which the long text does not have there
    assert n >= 38 and torch.allclose(scores[:n], prefix[:n], atol=1e-5, rtol=0)
    model = hub.models[0]  # in eval mode already (hub models cannot be put back in training)
    tokens = hub.encode(words)[None, :]
    with torch.no_grad():
        full = model(tokens)[0]
        steps = decode_token_by_token(model, tokens)
    assert torch.allclose(steps, full, atol=1e-4, rtol=0)


@pytest.mark.parametrize("variant", ENCODER_VARIANTS)
def test_encoder_sequence_16x_the_training_length(variant, tiny_lm_data):
    """tokens_per_sample 16, input 256: finite, and the default attention path agrees with
    the explicit reference (naive backend) at that length."""
    net, task = build_model("encoder", tiny_lm_data, "--alibi-variant", variant,
                            "--alibi-future-slope-ratio", 0.5 if variant == "asymmetric" else 1.0)
    net.eval()
    tokens = torch.randint(4, len(task.source_dictionary), (2, 256))
    tokens[1, 200:] = task.source_dictionary.pad()
    with torch.no_grad():
        out = net(tokens)[0]
        set_attention_backend(net, "naive")
        reference = net(tokens)[0]
    real = tokens.ne(task.source_dictionary.pad())  # padding positions output nothing useful
    assert torch.isfinite(out).all()
    assert torch.allclose(out[real], reference[real], atol=1e-4, rtol=0)


def test_learned_positions_refuse_16x_the_training_length(tiny_lm_data):
    """``--alibi-variant none`` is stock RoBERTa: its task keeps its length limit."""
    net, task = build_model("encoder", tiny_lm_data, "--alibi-variant", "none")
    assert net.max_positions() == task.max_positions() == 16
