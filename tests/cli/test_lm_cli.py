"""alibi_transformer_lm end to end through fairseq's real command lines, on tiny data.

preprocess -> train -> resume -> eval-lm at 4x the training length (no overrides) ->
interactive sampling beyond the training length -> the Python hub interface.
"""

import re

import pytest
import torch

from tests.helpers.cli import run_cli

#: end to end through fairseq's real command lines
pytestmark = pytest.mark.slow

L = 16  # training length (tokens per sample)
TRAIN = ["--task", "language_modeling", "--arch", "alibi_transformer_lm",
         "--decoder-layers", "2", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
         "--decoder-attention-heads", "4", "--tokens-per-sample", str(L),
         "--sample-break-mode", "none", "--max-tokens", "256", "--optimizer", "adam",
         "--lr", "0.003", "--cpu", "--no-progress-bar", "--log-interval", "1", "--seed", "1",
         "--num-workers", "0", "--disable-validation"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_lm_data, alibi_user_dir):
    save = tmp_path_factory.mktemp("alibi_lm_ckpt")
    out = run_cli("fairseq-train", tiny_lm_data, "--user-dir", alibi_user_dir, *TRAIN,
                  "--max-update", "4", "--save-dir", save)
    assert "num_updates 4" in out
    return save


def test_train_resumes_from_checkpoint_last(trained, tiny_lm_data, alibi_user_dir):
    out = run_cli("fairseq-train", tiny_lm_data, "--user-dir", alibi_user_dir, *TRAIN,
                  "--max-update", "8", "--save-dir", trained)
    assert re.search(r"[Ll]oaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ 4 updates\)", out)
    assert "num_updates 8" in out
    state = torch.load(trained / "checkpoint_last.pt", map_location="cpu")
    assert state["cfg"]["model"]["_name"] == "alibi_transformer_lm"
    assert "decoder.alibi.slopes" in state["model"]


def eval_lm(trained, data, user_dir, *extra):
    out = run_cli("fairseq-eval-lm", data, "--user-dir", user_dir, "--path",
                  trained / "checkpoint_last.pt", "--cpu", "--max-tokens", "4096",
                  "--num-workers", "0", *extra)
    tokens = int(re.search(r"Evaluated ([\d,]+) tokens", out).group(1).replace(",", ""))
    ppl = float(re.search(r"Perplexity: ([\d.]+)", out).group(1))
    return tokens, ppl


def test_eval_lm_at_4x_training_length_without_overrides(trained, tiny_lm_data, alibi_user_dir):
    n_short, ppl_short = eval_lm(trained, tiny_lm_data, alibi_user_dir, "--tokens-per-sample", str(L))
    n_long, ppl_long = eval_lm(trained, tiny_lm_data, alibi_user_dir,
                               "--tokens-per-sample", str(4 * L), "--context-window", str(2 * L))
    n_flat, ppl_flat = eval_lm(trained, tiny_lm_data, alibi_user_dir, "--tokens-per-sample", str(4 * L))
    assert n_short > 0 and n_short == n_long == n_flat  # nothing skipped at 4L
    # measured 2026-11-26 at --seed 1 (seeds 2, 3; the same on 2 threads): at L 67.08 (69.06,
    # 68.63), 4L with a window 67.17 (68.83, 68.94), 4L flat 66.95 (68.89, 68.61): within 0.5%
    # of L; the bounds add the seeds' spread on each side
    for ppl in (ppl_short, ppl_long, ppl_flat):
        assert 65 < ppl < 71.1
    for ppl in (ppl_long, ppl_flat):  # ALiBi at 4x the training length: no blow-up
        assert abs(ppl / ppl_short - 1) < 0.013


def test_interactive_generates_beyond_training_length(trained, tiny_lm_data, alibi_user_dir, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("w1 w2 w3\n")
    out = run_cli("fairseq-interactive", tiny_lm_data, "--user-dir", alibi_user_dir,
                  "--task", "language_modeling", "--path", trained / "checkpoint_last.pt",
                  "--cpu", "--sampling", "--sampling-topk", "10", "--beam", "1", "--nbest", "1",
                  "--min-len", str(3 * L), "--max-len-b", str(4 * L), "--seed", "3",
                  "--input", prompt)
    hypo = re.search(r"^H-0\t[-\d.]+\t(.*)$", out, re.M)
    assert hypo, out[-2000:]
    words = hypo.group(1).split()
    assert words[:3] == ["w1", "w2", "w3"] and len(words) > 3 * L


def test_hub_interface_samples_beyond_training_length(trained, tiny_lm_data):
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel

    hub = AlibiTransformerLanguageModel.from_pretrained(
        str(trained), "checkpoint_last.pt", data_name_or_path=str(tiny_lm_data))
    torch.manual_seed(0)
    text = hub.sample("w1 w2", sampling=True, sampling_topk=10, min_len=3 * L, max_len_b=4 * L)
    assert text.startswith("w1 w2") and len(text.split()) > 3 * L
    scores = hub.score("w1 w2 w3 " * 20)["positional_scores"]  # 60 tokens, > 3x L
    assert torch.isfinite(scores).all() and scores.numel() == 60


def test_wrong_user_dir_is_a_clear_error(tiny_lm_data, tmp_path):
    out = run_cli("fairseq-train", tiny_lm_data, "--user-dir", tmp_path / "no_such_plugin",
                  *TRAIN, "--max-update", "1", "--save-dir", tmp_path / "ck", expect_ok=False)
    assert "no_such_plugin" in out

