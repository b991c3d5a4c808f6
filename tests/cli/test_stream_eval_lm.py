"""``fairseq-alibi eval-lm-stream`` end to end on a trained tiny LM: the token count of
fairseq-eval-lm, the perplexity of fairseq-eval-lm with the whole split as one block (both give
every token all earlier ones as context), the load-time cutoff and document mask, the output read by the sweep's
parser, and its one-line errors."""

import functools
from pathlib import Path

import pytest

from fairseq_alibi.cli.sweep import parse_eval_output, split_token_count
from tests.helpers.checkpoints import saved_in_process
from tests.helpers.cli import SHARED_DATA, preprocess, run_cli
from tests.helpers.training import MODELS, STOCK

#: end to end through fairseq's real command lines
pytestmark = pytest.mark.slow

FIXTURES = "tests/fixtures/saved_models"
SHARED_FORKS = SHARED_DATA.parent / "fixtures" / "forks"


def stream(data, checkpoint, *extra, expect_ok=True):
    """``fairseq-alibi eval-lm-stream``'s output (``expect_ok=False``: a failing run's, its exit
    status checked by :func:`run_cli`)."""
    return run_cli("fairseq-alibi", "eval-lm-stream", data, "--path", checkpoint, "--cpu",
                   *extra, expect_ok=expect_ok)


def eval_lm(data, checkpoint, user_dir, *extra):
    return run_cli("fairseq-eval-lm", data, "--user-dir", user_dir, "--path", checkpoint,
                   "--cpu", "--num-workers", "0", *extra)


@pytest.fixture(scope="module")
def eval_lm_once():
    """:func:`eval_lm`, each command line run once in this module (its output kept)."""
    return functools.cache(eval_lm)


@pytest.mark.parametrize("overrides", [None, "{'alibi_window_cutoff': 2}",
                                       "{'alibi_document_mask': 'eos', 'alibi_window_cutoff': 2}"])
def test_stream_scores_every_token_with_every_earlier_one(trained_lm_checkpoint, tiny_lm_data,
                                                          alibi_user_dir, eval_lm_once, overrides):
    extra = [] if overrides is None else ["--model-overrides", overrides]
    whole = split_token_count(tiny_lm_data, "test")
    blocks, _ = parse_eval_output(eval_lm_once(tiny_lm_data, trained_lm_checkpoint,
                                               alibi_user_dir, "--tokens-per-sample", "16",
                                               *extra))
    one_block = parse_eval_output(eval_lm_once(
        tiny_lm_data, trained_lm_checkpoint, alibi_user_dir, "--tokens-per-sample", str(whole),
        "--max-tokens", str(whole), *extra))
    documents = bool(overrides and "document" in overrides)
    assert blocks == one_block[0] == whole
    if documents:  # honoured: every line its own document (the cutoff alone: scored above)
        plain = parse_eval_output(eval_lm_once(
            tiny_lm_data, trained_lm_checkpoint, alibi_user_dir, "--tokens-per-sample",
            str(whole), "--max-tokens", str(whole), "--model-overrides",
            "{'alibi_window_cutoff': 2}"))
        assert plain[1] != one_block[1]
    for chunk in ("16",) if documents else ("1", "16", "10000"):
        out = stream(tiny_lm_data, trained_lm_checkpoint, "--stream-chunk", chunk, *extra)
        assert f"{whole:,} tokens as one stream, {chunk} per forward call" in out
        tokens, loss = parse_eval_output(out)
        assert tokens == whole
        # fairseq prints the loss to 4 decimals: the same scores give the same line
        assert loss == pytest.approx(one_block[1], abs=1.5e-4), (chunk, overrides)
    assert "Perplexity: " in out.splitlines()[-1]


def test_word_probabilities_and_the_default_chunk(trained_lm_checkpoint, tiny_lm_data):
    out = stream(tiny_lm_data, trained_lm_checkpoint, "--output-word-probs")
    assert "64 per forward call" in out
    assert "\tw" in out and "[-" in out  # fairseq's "word [log-prob]" lines, per chunk


def test_bad_input_is_one_line_naming_the_fix(trained_lm_checkpoint, tiny_lm_data, tmp_path):
    stock = saved_in_process(tmp_path / "stock" / "checkpoint.pt", tiny_lm_data, *STOCK["lm"])
    pairs = tmp_path / "pairs"  # a translation folder: a dictionary per side, no dict.txt
    pairs.mkdir()
    for side in ("src", "tgt"):
        (pairs / f"dict.{side}.txt").write_text(Path(FIXTURES, f"dict.{side}.txt").read_text())
    empty_raw = tmp_path / "empty.txt"
    empty_raw.write_text("")
    preprocess("--only-source", "--srcdict", tiny_lm_data / "dict.txt", "--testpref", empty_raw,
               "--destdir", tmp_path / "empty", "--workers", "1")
    cases = [
        ((tiny_lm_data, trained_lm_checkpoint, "--stream-chunk", "0"),
         "--stream-chunk must be at least 1 token, got 0"),
        ((tiny_lm_data, stock), "TransformerLanguageModel has no ALiBi self-attention"),
        ((tiny_lm_data, f"{FIXTURES}/roberta_one_sided_head/checkpoint.pt"),
         "architecture alibi_roberta (AlibiRobertaModel), not a language model"),
        # its kind before the data's (whose language-model split it lacks)
        ((tiny_lm_data, f"{FIXTURES}/translation_pointer/checkpoint.pt"),
         "architecture alibi_transformer (AlibiTransformerModel), not a language model"),
        ((tiny_lm_data, trained_lm_checkpoint, "--tokens-per-sample", "64"),
         "drop --tokens-per-sample"),
    ]
    # a backend named at training that serves no KV cache with documents: at the first call
    named = saved_in_process(tmp_path / "named" / "checkpoint.pt", tiny_lm_data, *MODELS["lm"],
                             "--alibi-attention", "windowed", "--alibi-document-mask", "eos",
                             "--alibi-window-cutoff", 4)
    cases.append(((tiny_lm_data, named), "--alibi-attention windowed cannot serve this call: "
                  "windowed cannot mask the keys of other documents"))
    press = SHARED_FORKS / "press_lm"
    if (press / "checkpoint_last.pt").is_file():  # loads as stock transformer_lm: not eval-lm
        cases.append(((press / "data-bin", press / "checkpoint_last.pt", "--gen-subset", "test"),
                      "Convert it first with `fairseq-alibi convert --from press"))
    cases += [
        ((tmp_path / "empty", trained_lm_checkpoint), "holds no tokens: give --gen-subset"),
        ((tiny_lm_data, trained_lm_checkpoint, "--gen-subset", "valid7"), "no split 'valid7'"),
        ((pairs, trained_lm_checkpoint), "is a translation folder (dict.src.txt, "
         "dict.tgt.txt, "),
        ((tiny_lm_data, trained_lm_checkpoint, "--context-window", "8"),
         "drop --context-window"),
        ((tiny_lm_data, trained_lm_checkpoint, "--sample-break-mode", "eos"),
         "drop --sample-break-mode"),
        ((tiny_lm_data, trained_lm_checkpoint, "--model-overrides",
          "{'alibi_window_cutoff': -1}"), "--alibi-window-cutoff must be a finite number"),
        ((tiny_lm_data, trained_lm_checkpoint, "--model-overrides",
          "{'alibi_window_cutof': 8}"), "did you mean 'alibi_window_cutoff'"),
        ((tiny_lm_data, trained_lm_checkpoint, "--model-overrides", "alibi_window_cutoff=8"),
         "--model-overrides takes a Python dict of option names, e.g. \"{'alibi_window_cutoff': "
         "8}\" (quoted for the shell), got alibi_window_cutoff=8"),
    ]
    for args, message in cases:
        out = stream(*args, expect_ok=False)
        last = out.strip().splitlines()[-1]
        assert last.startswith("fairseq-alibi eval-lm-stream: error: "), out[-2000:]
        assert "Traceback" not in out, out[-2000:]
        assert message in last, last
