"""A checkpoint of Press's ALiBi fork that was not converted: the plugin's loaders stop with the
convert command instead of returning a stock ``transformer_lm`` (sinusoidal positions added,
no bias: other outputs at every position). Uses the fork's own checkpoints in
``/work/shared/fixtures/forks`` (skipped when absent).

Recognised by ``max_tokens`` in the saved model config, which only the fork's
``TransformerLanguageModelConfig`` has (fairseq_alibi.models.checks.PRESS_MODEL_KEY).
"""

import argparse

import pytest
import torch

from tests.helpers.building import (
    build_from_command_line, setup_from_command_line, write_dictionary,
)
from tests.helpers.checkpoints import load
from tests.helpers.cli import REPO, run_cli, user_dir
from tests.helpers.training import MODELS

FORKS = REPO.parent / "shared" / "fixtures" / "forks"
PRESS = ["press_lm", "press_lm_wiki103"]  # arch transformer_lm / transformer_lm_wiki103
CONVERT = "fairseq-alibi convert --from press --input CHECKPOINT --output CONVERTED.pt"

needs_fixtures = pytest.mark.skipif(not FORKS.is_dir(), reason=f"no fork fixtures at {FORKS}")


def checkpoint(name):
    return FORKS / name / "checkpoint_last.pt"


def data(name):
    return FORKS / name / "data-bin"


def lm_task(name):
    """The language-modeling task on a fixture's data (what a distillation run sets up)."""
    from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

    return LanguageModelingTask.setup_task(LanguageModelingConfig(data=str(data(name))))


@needs_fixtures
@pytest.mark.parametrize("name", PRESS)
def test_press_checkpoints_are_recognised(name):
    from fairseq import checkpoint_utils

    from fairseq_alibi.models.checks import is_unconverted_press_config

    assert is_unconverted_press_config(load(checkpoint(name))["cfg"]["model"])  # plain dict
    state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint(name)))  # OmegaConf node
    assert is_unconverted_press_config(state["cfg"]["model"])


@needs_fixtures
def test_other_checkpoints_are_not_press_ones(tmp_path):
    from fairseq_alibi.cli.convert_checkpoints import convert_file
    from fairseq_alibi.models.checks import is_unconverted_press_config

    assert not is_unconverted_press_config(load(checkpoint("eify_lm_alibi"))["cfg"]["model"])
    convert_file(checkpoint("press_lm"), tmp_path / "converted.pt", source="press")
    assert not is_unconverted_press_config(load(tmp_path / "converted.pt")["cfg"]["model"])


def test_todays_stock_lm_config_is_not_a_press_one(tmp_path):
    """fairseq 0.12's own transformer_lm config, as saved, and its command-line namespace
    (which holds the dataset's max_tokens): neither is taken for the fork's."""
    from omegaconf import OmegaConf

    from fairseq_alibi.models.checks import is_unconverted_press_config

    flags = [*MODELS["lm"], "--arch", "transformer_lm_wiki103", "--adaptive-input-cutoff", "5",
             "--adaptive-softmax-cutoff", "5"]
    cfg, _ = setup_from_command_line(write_dictionary(tmp_path, 20), "--cpu", *flags)
    saved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    assert saved["model"]["_name"] == "transformer_lm_wiki103"
    assert "max_tokens" not in saved["model"] and not is_unconverted_press_config(saved["model"])
    namespace = argparse.Namespace(**saved["model"], max_tokens=128)
    assert not is_unconverted_press_config(namespace)


@needs_fixtures
@pytest.mark.parametrize("name", PRESS)
def test_hub_refuses_an_unconverted_press_checkpoint(name):
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel

    with pytest.raises(ValueError) as refused:
        AlibiTransformerLanguageModel.from_pretrained(str(FORKS / name), "checkpoint_last.pt",
                                                      data_name_or_path=str(data(name)))
    message = str(refused.value)
    assert "trained with Press's ALiBi fork (max_tokens in its model config" in message
    assert message.endswith(f"Convert it first with `{CONVERT}` (docs/migrating.md), then load "
                            "the converted file") and "\n" not in message


@needs_fixtures
def test_stock_loading_of_an_architecture_named_press_checkpoint_is_refused():
    """transformer_lm_wiki103 (the paper's models): fairseq calls the architecture function on
    the saved config, which the plugin's import wraps (as for EIFY's options)."""
    from fairseq import checkpoint_utils

    with pytest.raises(ValueError, match=r"trained with Press's ALiBi fork .*stock "
                                         r"'transformer_lm_wiki103' would add sinusoidal"):
        checkpoint_utils.load_model_ensemble_and_task(
            [str(checkpoint("press_lm_wiki103"))],
            arg_overrides={"data": str(data("press_lm_wiki103"))})


@needs_fixtures
def test_stock_loading_of_a_transformer_lm_named_press_checkpoint_is_the_documented_limit():
    """``_name: transformer_lm`` is built through the model's dataclass: no architecture
    function runs and fairseq drops max_tokens first, so stock loaders (fairseq-eval-lm) return
    a stock model (docs/migrating.md); the plugin's own loaders refuse it (tests above)."""
    from fairseq import checkpoint_utils
    from fairseq.models.transformer_lm import TransformerLanguageModel

    models, cfg, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint("press_lm"))], arg_overrides={"data": str(data("press_lm"))})
    assert type(models[0]) is TransformerLanguageModel
    assert "max_tokens" not in cfg.model  # what the plugin could have recognised is gone


@needs_fixtures
@pytest.mark.parametrize("name", PRESS)
def test_distillation_refuses_an_unconverted_press_teacher(name):
    from fairseq_alibi.criterions.lm_distillation import load_teacher

    task = lm_task(name)
    with pytest.raises(ValueError, match=rf"the teacher {checkpoint(name)} was trained with "
                                         r"Press's ALiBi fork .*--from press"):
        load_teacher(str(checkpoint(name)), task)


@needs_fixtures
def test_distillation_takes_the_converted_press_model_as_teacher(tmp_path):
    from fairseq_alibi.cli.convert_checkpoints import convert_file
    from fairseq_alibi.criterions.lm_distillation import load_teacher

    convert_file(checkpoint("press_lm"), tmp_path / "converted.pt", source="press")
    task = lm_task("press_lm")
    teacher = load_teacher(str(tmp_path / "converted.pt"), task)
    assert type(teacher).__name__ == "AlibiTransformerLanguageModel"
    assert torch.equal(teacher.decoder.alibi.slopes,
                       torch.tensor([0.25, 0.0625, 0.015625, 0.00390625]))


@needs_fixtures
@pytest.mark.slow
def test_stock_eval_lm_with_the_plugin_refuses_the_papers_architecture(tmp_path):
    out = run_cli("fairseq-eval-lm", data("press_lm_wiki103"), "--user-dir", user_dir(),
                  "--path", checkpoint("press_lm_wiki103"), "--sample-break-mode", "none",
                  "--gen-subset", "test", "--batch-size", "1", "--tokens-per-sample", 32,
                  "--context-window", "0", "--cpu", cwd=tmp_path, expect_ok=False)
    assert f"Convert it first with `{CONVERT}`" in out.strip().splitlines()[-1]


@needs_fixtures
def test_press_weights_restored_into_the_alibi_lm_name_the_press_conversion():
    """--restore-file / --finetune-from-model: only the weights are seen, which look like a
    stock sinusoidal model's; the error names --from press as the other possibility."""
    model, _ = build_from_command_line(
        data("press_lm"), "--task", "language_modeling", "--arch", "alibi_transformer_lm",
        "--decoder-layers", 2, "--decoder-embed-dim", 64, "--decoder-input-dim", 64,
        "--decoder-output-dim", 64, "--decoder-ffn-embed-dim", 128,
        "--decoder-attention-heads", 4, "--share-decoder-input-output-embed",
        "--tokens-per-sample", 32, "--cpu")
    with pytest.raises(ValueError, match=r"has position embeddings \(decoder.embed_positions."
                                         r"_float_tensor\).*\(a checkpoint of Press's ALiBi "
                                         r"fork: convert it with --from press\)$"):
        model.load_state_dict(load(checkpoint("press_lm"))["model"], strict=True)


def test_learned_positions_get_no_press_hint():
    from fairseq_alibi.models.checks import reject_position_embeddings

    with pytest.raises(ValueError) as refused:
        reject_position_embeddings({"decoder.embed_positions.weight": torch.zeros(3, 2)},
                                   "decoder", "alibi_transformer_lm")
    assert "Press" not in str(refused.value)
