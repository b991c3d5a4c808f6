"""Bad options and flags (docs/reliability.md, catalogue of bad inputs): a clear error that names
the fix, on the command line, in Python and through the tools.

Backed elsewhere, not repeated here: unknown variants and odd head counts at the math level
(test_alibi_math, test_roberta_model), the hydra configs' position options
(test_hydra_position_options). ``# row N`` marks a row of issue 12 (what an experienced fairseq
user hit on first contact). Tests that run fairseq's command lines are marked ``slow``.
"""

import pytest
import torch

from fairseq_alibi.options import OptionError
from tests.helpers.building import build_model, training_config
from tests.helpers.checkpoints import saved_in_process
from tests.helpers.cli import REPO, last_line, run_cli
from tests.helpers.training import MODELS


# ---------------------------------------------------------------- choices and head counts


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


@pytest.mark.parametrize("model,side", [("lm", "decoder"), ("encoder", "encoder")])
@pytest.mark.parametrize("heads,reason", [(0, "must be a positive whole number"),
                                          (-2, "must be a positive whole number"),
                                          (6, "embed-dim 32 is not divisible by")])
def test_head_count_the_width_cannot_split_is_one_line(model, side, heads, reason,
                                                      tiny_lm_data):
    # before: a traceback from the slopes' construction or fairseq's assertion, flag unnamed
    with pytest.raises(OptionError, match=f"{reason}.*--{side}-attention-heads|"
                       f"--{side}-attention-heads {reason}"):
        build_model(model, tiny_lm_data, f"--{side}-attention-heads", heads)


def test_a_language_model_for_a_task_of_sentence_pairs_is_refused():
    # before: fairseq-generate/-interactive of a translation folder with an LM checkpoint
    # translated nothing (the LM ignores the source), exit 0
    from fairseq import checkpoint_utils

    from tests.helpers.building import setup_from_command_line

    saved = REPO / "tests" / "fixtures" / "saved_models"
    _, pairs = setup_from_command_line(saved, "--task", "translation", "--source-lang", "src",
                                       "--target-lang", "tgt", "--arch", "transformer", "--cpu")
    with pytest.raises(OptionError, match=r"^alibi_transformer_lm is a language model: it reads "
                                          r"no source sentence, and the task translation"):
        checkpoint_utils.load_model_ensemble([str(saved / "lm_fixed_slopes" / "checkpoint.pt")],
                                             task=pairs)
    # an encoder's: it failed on the folder's dictionaries, naming a dict.txt the folder lacks
    with pytest.raises(OptionError, match=r"^alibi_roberta is an encoder: it generates no "
                                          r"text, and the task translation"):
        checkpoint_utils.load_model_ensemble(
            [str(saved / "roberta_one_sided_head" / "checkpoint.pt")], task=pairs)


def test_global_tokens_covering_a_whole_block_are_refused(tiny_lm_data):
    # before: accepted, every position exempt from the bias
    with pytest.raises(OptionError, match=r"^--alibi-global-tokens 16 exempts every position "
                                          r"of a block of 16 tokens \(--tokens-per-sample\)"):
        build_model("encoder", tiny_lm_data, "--alibi-global-tokens", 16)
    build_model("encoder", tiny_lm_data, "--alibi-global-tokens", 1)


def test_a_backend_that_cannot_train_the_model_is_refused_before_the_first_step(tiny_lm_data):
    # before: refused inside fairseq's first training step, which first saved crash.pt
    from fairseq_alibi.error_hints import OneLineError

    model, _ = build_model("encoder", tiny_lm_data, "--alibi-attention", "fold",
                           "--attention-dropout", 0.1)
    model.eval()  # evaluation has no dropout: served
    with pytest.raises(OneLineError, match=r"^--alibi-attention fold cannot serve training "
                                           r"this model: fold has no attention dropout"):
        model.train()  # what fairseq's trainer calls before each step
    build_model("encoder", tiny_lm_data, "--alibi-attention", "fold",
                "--attention-dropout", 0)[0].train()
    flex, _ = build_model("encoder", tiny_lm_data, "--alibi-attention", "flex",
                          "--attention-dropout", 0)
    if not torch.cuda.is_available():  # the CPU is all there is: flex's backward is not
        with pytest.raises(OneLineError, match=r"flex cannot serve training this model: flex "
                                               r"has no CPU backward"):
            flex.train()


# row 6: position-embedding flags


def test_position_embedding_flag_is_refused(tiny_lm_data, capsys):
    with pytest.raises(SystemExit):
        build_model("lm", tiny_lm_data, "--decoder-learned-pos")
    error = last_line(capsys.readouterr().err)
    assert error.endswith("error: argument --decoder-learned-pos: alibi_transformer_lm has no "
                          "position embeddings (the ALiBi bias replaces them); drop "
                          "--decoder-learned-pos, or train a stock model for learned positions")


@pytest.mark.parametrize("model, flag, fix", [
    (MODELS["lm"], "--decoder-alibi", "none: alibi_transformer_lm is ALiBi already"),
    (MODELS["encoder"], "--encoder-alibi-asymmetrical", "--alibi-variant offset"),
    # the fork's task flag: stock masked_lm does not declare it
    (MODELS["encoder"], "--omit-mask", "--embedding-omits-mask, with --zero-mask-embedding"),
    (["--task", "translation", "--arch", "alibi_transformer"], "--decoder-alibi",
     "--decoder-alibi-variant causal"),
])
def test_the_forks_flags_name_what_replaces_them(model, flag, fix, tiny_lm_data, capsys):
    """Not argparse's bare "unrecognized arguments" for a fork user's old command line."""
    with pytest.raises(SystemExit):
        training_config([tiny_lm_data, *model, flag])
    assert last_line(capsys.readouterr().err).endswith(
        f"error: argument {flag}: a flag of EIFY's ALiBi fork; here: {fix} (docs/migrating.md)")


def test_a_task_declaring_the_forks_task_flag_keeps_it(monkeypatch):
    """Where a registered task declares ``--omit-mask`` (it adds its flags after the model's),
    the model leaves the flag to it rather than make argparse's conflict."""
    import argparse
    from dataclasses import dataclass

    from fairseq import tasks

    from fairseq_alibi.models import checks

    @dataclass
    class ForkTaskConfig:
        omit_mask: bool = False

    monkeypatch.setitem(tasks.TASK_DATACLASS_REGISTRY, "fork_masked_lm", ForkTaskConfig)
    checks._task_declares.cache_clear()
    try:
        parser = argparse.ArgumentParser()
        checks.refuse_fork_flags(parser, "alibi_roberta")
        parser.add_argument("--omit-mask", action="store_true")  # the task's own, no conflict
        assert parser.parse_args(["--omit-mask"]).omit_mask
        assert "--zero-masking" in parser._option_string_actions  # the model's flags still are
    finally:
        checks._task_declares.cache_clear()


def test_saved_learned_pos_field_still_loads(tiny_lm_data, tmp_path):
    """Only the command line is refused: a saved config with decoder_learned_pos (the stock
    gpt3 architectures set it, converted checkpoints keep it) loads as before."""
    from fairseq import checkpoint_utils

    path = saved_in_process(tmp_path / "model.pt", tiny_lm_data, *MODELS["lm"])
    state = torch.load(path, weights_only=False)
    state["cfg"]["model"]["decoder_learned_pos"] = True
    torch.save(state, path)
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(path)])
    assert models[0].decoder.embed_positions is None


# row 11: bad lengths


@pytest.mark.parametrize("lengths,reason", [
    ("64,abc", "expected comma-separated whole numbers of tokens"),
    ("0", "every evaluation length must be at least 2 tokens"),
    ("", "every evaluation length must be at least 2 tokens"),
])
def test_sweep_bad_lengths_are_argparse_errors(lengths, reason, tmp_path, capsys):
    from fairseq_alibi.cli.sweep import main

    with pytest.raises(SystemExit) as exit_:
        main(["--path", str(tmp_path / "x.pt"), "--data", str(tmp_path), "--out",
              str(tmp_path / "out"), "--lengths", lengths])
    assert exit_.value.code == 2
    error = last_line(capsys.readouterr().err)
    assert error.startswith("fairseq-alibi sweep: error: argument --lengths: " + reason)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags,key", [
    (["--slope-interpolation", "--train-length", "16"], "alibi_slope_scale"),
    (["--sinusoidal-overrides"], "tokens_per_sample"),
])
def test_sweep_overrides_of_what_it_sets_per_length_are_refused_before_any_run(
        flags, key, tiny_lm_data, tmp_path, capsys):
    """Refused at parsing, not once the first length's run has been evaluated and its log
    written into --out (which then asked a corrected rerun for --overwrite)."""
    from fairseq_alibi.cli.sweep import main

    path = saved_in_process(tmp_path / "model.pt", tiny_lm_data, *MODELS["lm"])
    with pytest.raises(SystemExit) as exit_:
        main(["--path", str(path), "--data", str(tiny_lm_data), "--out", str(tmp_path / "out"),
              "--lengths", "16,32", "--model-overrides", f"{{'{key}': 7}}", *flags])
    assert exit_.value.code == 2
    assert last_line(capsys.readouterr().err) == (
        f"fairseq-alibi sweep: error: --model-overrides sets {key}, which the sweep sets per "
        "length")
    assert not (tmp_path / "out").exists()


def test_sweep_two_checkpoints_of_one_name_are_an_argparse_error(tiny_lm_data, tmp_path,
                                                                capsys):
    from fairseq_alibi.cli.sweep import main

    path = saved_in_process(tmp_path / "model.pt", tiny_lm_data, *MODELS["lm"])
    with pytest.raises(SystemExit) as exit_:
        main(["--path", f"a={path}", "--path", f"a={path}", "--data", str(tiny_lm_data),
              "--out", str(tmp_path / "out"), "--lengths", "16"])
    assert exit_.value.code == 2 and last_line(capsys.readouterr().err) == (
        "fairseq-alibi sweep: error: --path: two checkpoints named 'a': give them names with "
        "NAME=CKPT")


@pytest.mark.parametrize("model", ["lm", "encoder"])
def test_zero_tokens_per_sample_is_a_clear_error(model, tiny_lm_data):
    with pytest.raises(ValueError, match=r"^--tokens-per-sample must be at least 1 .* got 0;"):
        build_model(model, tiny_lm_data, "--tokens-per-sample", 0)


@pytest.mark.slow
@pytest.mark.parametrize("flags,error,line", [
    (["--tokens-per-sample", 0], "ZeroDivisionError",
     "--tokens-per-sample must be at least 1 (the tokens of one block), got 0"),
    (["--tokens-per-sample", -5], "negative dimensions",
     "--tokens-per-sample must be at least 1 (the tokens of one block), got -5"),
    (["--tokens-per-sample", 8, "--context-window", 12], "negative dimensions",
     "--tokens-per-sample 8 must be larger than --context-window 12"),
    (["--tokens-per-sample", 64, "--max-tokens", 32], "should not exceed max_tokens=32",
     "--max-tokens 32 is smaller than a sample (a language model's: a block of "
     "--tokens-per-sample tokens;"),
    (["--pad-to-fixed-bsz", "--batch-size", 7, "--tokens-per-sample", 16], "IndexError",
     "--pad-to-fixed-bsz fills the last batch with dummy rows, which fairseq-eval-lm scores"),
])
def test_a_block_size_below_one_in_eval_lm_is_named(flags, error, line, tiny_lm_data,
                                                    alibi_user_dir, tmp_path):
    """eval-lm builds the model from the checkpoint, which never sees the flag: fairseq fails
    splitting the data (its block: --tokens-per-sample less --context-window), batching a
    block longer than --max-tokens or scoring the dummy rows of --pad-to-fixed-bsz, and the
    last line names the flags."""
    checkpoint = saved_in_process(tmp_path / "model.pt", tiny_lm_data, *MODELS["lm"])
    out = run_cli("fairseq-eval-lm", tiny_lm_data, "--user-dir", alibi_user_dir, "--path",
                  checkpoint, "--cpu", *flags, expect_ok=False)
    assert error in out
    assert last_line(out).startswith(f"fairseq_alibi: {line}")


def test_a_block_size_below_minus_the_splits_tokens_is_named_too():
    """Below minus the split's tokens fairseq's blocks fail with a bare IndexError (an empty
    list of slices), not the ValueError above: the same line."""
    import numpy as np
    from fairseq.data import TokenBlockDataset

    from fairseq_alibi.error_hints import hint_for

    with pytest.raises(IndexError) as failed:
        TokenBlockDataset([torch.tensor([5, 6, 2])] * 2, np.array([3, 3]), -368, pad=1, eos=2,
                          break_mode="none")
    assert hint_for(failed.value).startswith(
        "--tokens-per-sample must be at least 1 (the tokens of one block), got -368")


def test_eval_lm_on_an_encoder_is_named():
    """An encoder has supported_targets, without the LM's: fairseq's ValueError gets the hint."""
    from fairseq_alibi.error_hints import hint_for

    class AlibiRobertaModel:
        pass

    def build_model():  # as fairseq's LanguageModelingTask.build_model fails
        model = AlibiRobertaModel()  # noqa: F841  (read from the frame by the hint)
        raise ValueError("Unsupported language modeling target: future")

    with pytest.raises(ValueError) as failed:
        build_model()
    assert hint_for(failed.value).startswith(
        "--path holds a model of class AlibiRobertaModel, not a language model")


def test_a_language_model_under_sentence_prediction_is_named(tiny_lm_data):
    """A causal LM architecture given --task sentence_prediction: its tokens_per_sample is the
    task's, which that task lacks; omegaconf's InterpolationKeyError gets a line naming the
    language model's task and the encoders a classifier is fine-tuned from."""
    from omegaconf.errors import InterpolationKeyError

    from fairseq_alibi.error_hints import hint_for

    with pytest.raises(InterpolationKeyError) as failed:
        training_config([tiny_lm_data, "--task", "sentence_prediction", "--num-classes", "2",
                         "--criterion", "sentence_prediction", "--arch", "alibi_transformer_lm"])
    assert hint_for(failed.value) == (
        "the model's option model.tokens_per_sample is the task's tokens_per_sample, which this "
        "--task does not declare: the architecture belongs with another task; it is a language "
        "model (--task language_modeling); a classifier (--task sentence_prediction) is "
        "fine-tuned from an encoder (--arch alibi_roberta_base, or fairseq's roberta_*), a "
        "translation model is --arch alibi_transformer")


def test_a_command_without_its_task_is_named(tiny_lm_data):
    """fairseq-validate's parser has no default task: without --task fairseq looks up
    ``None`` (``KeyError: None``); the hint asks for the checkpoint's task."""
    from fairseq import options

    from fairseq_alibi.error_hints import hint_for

    with pytest.raises(KeyError) as failed:
        options.parse_args_and_arch(options.get_validation_parser(),
                                    [str(tiny_lm_data), "--path", "x.pt"])
    assert hint_for(failed.value).startswith(
        "no --task given, and this command has no default: give the task the checkpoint was "
        "trained with, e.g. --task language_modeling")
    assert hint_for(KeyError(None)) is None  # a KeyError elsewhere gets no such line


def test_a_language_models_task_on_a_translation_folder_is_named(tmp_path):
    """fairseq-eval-lm on a translation folder, or fairseq-validate of an LM checkpoint there
    (its task comes from the checkpoint), fail on the dict.txt it lacks: the hint says why."""
    from fairseq_alibi.error_hints import hint_for

    for side in ("en", "fr"):
        (tmp_path / f"dict.{side}.txt").write_text("a 1\n")
    missing = FileNotFoundError(2, "No such file or directory", str(tmp_path / "dict.txt"))
    assert hint_for(missing).startswith(
        f"{tmp_path} is a translation folder (dict.en.txt, dict.fr.txt), and the checkpoint's "
        f"task reads a language model's {tmp_path / 'dict.txt'}")
    (tmp_path / "dict.txt").write_text("a 1\n")  # a language model's folder: no hint
    assert hint_for(missing) is None


@pytest.mark.slow
def test_eval_lm_on_a_translation_model_is_named(alibi_user_dir):
    """fairseq-eval-lm builds a translation model and stops on an attribute only language models
    have: the last line says what --path holds."""
    saved = REPO / "tests" / "fixtures" / "saved_models"
    out = run_cli("fairseq-eval-lm", saved, "--user-dir", alibi_user_dir, "--path",
                  saved / "translation_pointer" / "checkpoint.pt", "--cpu", expect_ok=False)
    assert "supported_targets" in out
    assert last_line(out).startswith(
        "fairseq_alibi: --path holds a model of class AlibiTransformerModel, not a language "
        "model, which --task language_modeling reads"), last_line(out)
