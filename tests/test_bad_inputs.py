"""The catalogue of bad inputs (docs/reliability.md): each gives correct output or a clear
error, and nothing on disk is overwritten or lost.

Rows already backed elsewhere are not repeated here: unknown variant/backend and odd head
counts at the math level (test_alibi_math, test_encoder_math), all-padding rows per layer
(test_attention, test_encoder_math), a wrong ``--user-dir`` (test_lm_cli), checkpoints of the
other kind at the weights level (test_lm_model, test_encoder_math), and truncated or corrupt
checkpoint files (test_resume).
"""

import shutil

import pytest
import torch

from tests.conftest import run_cli
from tests.training_runs import build_model, train

ENCODER_VARIANTS = ["symmetric", "one_sided", "offset", "asymmetric"]


@pytest.fixture(scope="module")
def lm_checkpoint(tmp_path_factory, tiny_lm_data, alibi_user_dir):
    save = tmp_path_factory.mktemp("bad_inputs_lm")
    train("lm", tiny_lm_data, alibi_user_dir, save, "--max-update", 2)
    return save / "checkpoint_last.pt"


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# ---------------------------------------------------------------- options


@pytest.mark.parametrize("model,flag,value,choices", [
    ("lm", "--alibi-attention", "cuda-magic", "auto"),
    ("encoder", "--alibi-attention", "cuda-magic", "auto"),
    ("encoder", "--alibi-variant", "bidirectional", "symmetric"),
])
def test_unknown_variant_or_backend_flag_names_the_choices(model, flag, value, choices,
                                                         tiny_lm_data, capsys):
    with pytest.raises(SystemExit):
        build_model(model, tiny_lm_data, flag, value)
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{flag}: invalid choice: '{value}'" in error and choices in error


def test_odd_head_count_with_one_sided_is_a_clear_error(tiny_lm_data):
    with pytest.raises(ValueError, match="even number of attention heads.*got 3"):
        build_model("encoder", tiny_lm_data, "--alibi-variant", "one_sided",
                    "--encoder-attention-heads", 3, "--encoder-embed-dim", 33)


# ---------------------------------------------------------------- inputs


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


def test_lm_sequence_16x_the_training_length(lm_checkpoint, tiny_lm_data):
    """Trained at 16 tokens, scored at 256: finite, causal (a prefix is scored the same
    whatever follows), and equal to token-by-token decoding with the KV cache."""
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel

    hub = AlibiTransformerLanguageModel.from_pretrained(
        str(lm_checkpoint.parent), lm_checkpoint.name, data_name_or_path=str(tiny_lm_data),
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
        state = {}
        steps = [model.decoder(tokens[:, : t + 1], incremental_state=state)[0][:, -1]
                 for t in range(tokens.size(1))]
    assert torch.allclose(torch.stack(steps, 1), full, atol=1e-4, rtol=0)


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
        net.encoder.sentence_encoder.alibi.backend = "naive"
        reference = net(tokens)[0]
    real = tokens.ne(task.source_dictionary.pad())  # padding positions output nothing useful
    assert torch.isfinite(out).all()
    assert torch.allclose(out[real], reference[real], atol=1e-4, rtol=0)


def test_learned_positions_refuse_16x_the_training_length(tiny_lm_data):
    """``--alibi-variant none`` is stock RoBERTa: its task keeps its length limit."""
    net, task = build_model("encoder", tiny_lm_data, "--alibi-variant", "none")
    assert net.max_positions() == task.max_positions() == 16


# ---------------------------------------------------------------- checkpoints and data


def test_alibi_checkpoint_without_the_plugin(lm_checkpoint, tiny_lm_data, tmp_path):
    """Stock fairseq cannot build a model it does not know; its own error message is broken
    (it formats the config into a format string): KeyError "'_name'". The plugin is not loaded
    at that point, so only the docs can name the fix: --user-dir."""
    before = snapshot(lm_checkpoint.parent)
    out = run_cli("fairseq-eval-lm", tiny_lm_data, "--path", lm_checkpoint, "--cpu",
                  "--tokens-per-sample", 16, "--max-tokens", 256, expect_ok=False)
    assert out.strip().splitlines()[-1].startswith("KeyError: \"'_name'\"")
    assert snapshot(lm_checkpoint.parent) == before


def test_alibi_checkpoint_restored_into_stock_transformer_lm(lm_checkpoint, tiny_lm_data,
                                                             alibi_user_dir, tmp_path):
    save = tmp_path / "stock"
    save.mkdir()
    shutil.copy(lm_checkpoint, save / "checkpoint_last.pt")
    before = snapshot(save)
    out = train("lm", tiny_lm_data, alibi_user_dir, save, "--arch", "transformer_lm",
                "--max-update", 4, expect_ok=False)
    assert "Cannot load model parameters from checkpoint" in out
    assert "please ensure that the architectures match" in out and "alibi.slopes" in out
    assert snapshot(save) == before  # nothing written, the checkpoint untouched


@pytest.mark.parametrize("model", ["lm", "encoder"])
def test_dictionary_that_does_not_match_the_checkpoint(model, lm_checkpoint, tmp_path,
                                                       tiny_lm_data, alibi_user_dir):
    from fairseq import checkpoint_utils

    checkpoint = lm_checkpoint
    if model == "encoder":
        train("encoder", tiny_lm_data, alibi_user_dir, tmp_path / "enc", "--max-update", 1)
        checkpoint = tmp_path / "enc" / "checkpoint_last.pt"
    other = tmp_path / "other"  # a data directory binarized with another dictionary
    other.mkdir()
    (other / "dict.txt").write_text("".join(f"v{i} 1\n" for i in range(92)))  # + 4 specials
    trained, given = (64, 96) if model == "lm" else (65, 97)  # masked_lm adds <mask>
    with pytest.raises(ValueError, match=rf"dictionary of {trained} symbols, but the data "
                                         rf"directory's dict.txt has {given}: give the data"):
        checkpoint_utils.load_model_ensemble_and_task(
            [str(checkpoint)], arg_overrides={"data": str(other)})


def test_empty_training_file(lm_checkpoint, tmp_path, alibi_user_dir, tiny_lm_data):
    """fairseq binarizes an empty file ("0 sents") and fails to read it at the start of
    training; the checkpoints already in --save-dir are untouched."""
    from fairseq.data import indexed_dataset

    data = tmp_path / "bin"  # the tiny corpus with an empty training split
    shutil.copytree(tiny_lm_data, data)
    # exactly what fairseq-preprocess writes for a file of no lines
    builder = indexed_dataset.make_builder(str(data / "train.bin"), "mmap", vocab_size=64)
    builder.finalize(str(data / "train.idx"))
    assert (data / "train.bin").stat().st_size == 0
    save = tmp_path / "save"
    save.mkdir()
    shutil.copy(lm_checkpoint, save / "checkpoint_last.pt")
    before = snapshot(save)
    out = train("lm", data, alibi_user_dir, save, "--max-update", 4, expect_ok=False)
    assert "ValueError: cannot mmap an empty file" in out
    assert snapshot(save) == before
