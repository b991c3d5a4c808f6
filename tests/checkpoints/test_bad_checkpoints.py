"""Checkpoints of the wrong kind (docs/reliability.md, catalogue of bad inputs): an ALiBi
checkpoint in stock fairseq, a stock one in the plugin's models, another kind of ``alibi_roberta``,
a dictionary that does not match; each a clear error naming the fix, the checkpoint untouched.

Backed elsewhere, not repeated here: checkpoints of the other kind at the weights level
(test_lm_model, test_roberta_model), fork checkpoints (test_forks, test_press_unconverted), the
hub given a stock checkpoint (test_bad_hub). ``# row N`` marks a row of issue 12 (what an
experienced fairseq user hit on first contact). Tests that run fairseq's command lines are
marked ``slow``.
"""

import shutil

import pytest

from tests.helpers.building import build_model, setup_from_command_line
from tests.helpers.checkpoints import saved_in_process
from tests.helpers.cli import last_line, run_cli, snapshot
from tests.helpers.corpora import write_tiny_bpe
from tests.helpers.training import MODELS, STOCK, train


# ---------------------------------------------------------------- checkpoints and dictionaries


@pytest.mark.slow
def test_alibi_checkpoint_without_the_plugin(trained_lm_checkpoint, tiny_lm_data, tmp_path):
    """Stock fairseq cannot build a model it does not know; its own error message is broken
    (it formats the config into a format string): KeyError "'_name'". The plugin is not loaded
    at that point, so only the docs can name the fix: --user-dir."""
    before = snapshot(trained_lm_checkpoint.parent)
    out = run_cli("fairseq-eval-lm", tiny_lm_data, "--path", trained_lm_checkpoint, "--cpu",
                  "--tokens-per-sample", 16, "--max-tokens", 256, expect_ok=False)
    assert out.strip().splitlines()[-1].startswith("KeyError: \"'_name'\"")
    assert snapshot(trained_lm_checkpoint.parent) == before


@pytest.mark.slow
def test_alibi_checkpoint_restored_into_stock_transformer_lm(trained_lm_checkpoint, tiny_lm_data,
                                                             alibi_user_dir, tmp_path):
    save = tmp_path / "stock"
    save.mkdir()
    shutil.copy(trained_lm_checkpoint, save / "checkpoint_last.pt")
    before = snapshot(save)
    out = train("lm", tiny_lm_data, alibi_user_dir, save, "--arch", "transformer_lm",
                "--max-update", 4, expect_ok=False)
    assert "Cannot load model parameters from checkpoint" in out
    assert "please ensure that the architectures match" in out and "alibi.slopes" in out
    assert snapshot(save) == before  # nothing written, the checkpoint untouched


@pytest.mark.slow
@pytest.mark.parametrize("model", ["lm", "encoder"])
def test_dictionary_that_does_not_match_the_checkpoint(model, trained_lm_checkpoint, tmp_path,
                                                       tiny_lm_data, alibi_user_dir):
    from fairseq import checkpoint_utils

    checkpoint = trained_lm_checkpoint
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


# row 3: a stock RoBERTa checkpoint, and row 12: the message fits how the run was started


def test_stock_roberta_checkpoint_names_the_none_variant(tiny_lm_data):
    cfg, task = setup_from_command_line(tiny_lm_data, "--cpu", *STOCK["encoder"])
    stock = task.build_model(cfg.model)
    ours, _ = build_model("encoder", tiny_lm_data)  # --alibi-variant offset
    with pytest.raises(ValueError) as error:
        ours.load_state_dict(stock.state_dict())
    message = str(error.value)
    assert "--alibi-variant none --mlm-head roberta" in message and "convert" not in message
    none, _ = build_model("encoder", tiny_lm_data, "--alibi-variant", "none")
    none.load_state_dict(stock.state_dict())  # what the message says works


def test_a_language_models_checkpoint_given_to_an_encoder_says_what_it_holds(tiny_lm_data):
    """fairseq-train resumes --save-dir's checkpoint_last.pt whatever wrote it: an LM's
    restored into an encoder is named as a decoder's, not sent to the fork converter."""
    lm, _ = build_model("lm", tiny_lm_data)
    ours, _ = build_model("encoder", tiny_lm_data)
    with pytest.raises(ValueError) as error:
        ours.load_state_dict(lm.state_dict())
    message = str(error.value)
    assert message.startswith("this checkpoint holds a decoder (decoder.layers...), a language "
                              "or translation model's, not an encoder") and "convert" not in message


def _as_hydra_built(model_flags, data):
    """The model as fairseq-hydra-train builds it: its options are an OmegaConf config."""
    from fairseq import options, tasks
    from omegaconf import OmegaConf

    argv = [str(a) for a in [data, *MODELS["encoder"], "--cpu", *model_flags]]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    task = tasks.setup_task(args)
    cfg = OmegaConf.create({k: v for k, v in vars(args).items()
                            if v is None or isinstance(v, (bool, int, float, str, list))})
    return task.build_model(cfg)


@pytest.mark.parametrize("started,expected", [
    ("cli", "the flags `--alibi-variant offset --mlm-head clap --zero-mask-embedding`"),
    ("hydra", "the override `variant=zero_clap`"),
])
def test_kind_mismatch_message_fits_how_the_run_was_started(started, expected, tiny_lm_data,
                                                            monkeypatch):
    zero_clap = ["--alibi-variant", "offset", "--mlm-head", "clap", "--zero-mask-embedding"]
    trained, _ = build_model("encoder", tiny_lm_data, *zero_clap)
    if started == "cli":
        fresh, _ = build_model("encoder", tiny_lm_data)  # the default: offset, roberta head
    else:
        fresh = _as_hydra_built([], tiny_lm_data)  # a GLUE config without variant=
        # inside fairseq-hydra-train's job (hydra's record, which only a real job sets)
        monkeypatch.setattr("fairseq_alibi.models.alibi_roberta.started_by_hydra", lambda: True)
    with pytest.raises(ValueError, match="trained with `--alibi-variant offset --mlm-head clap"
                                         " --zero-mask-embedding`") as error:
        fresh.load_state_dict(trained.state_dict())
    assert str(error.value).endswith(expected)


def test_sizes_outside_a_hydra_job_are_flags_whatever_the_config(tiny_lm_data):
    """A model whose options are an OmegaConf config (a checkpoint fairseq-hydra-train wrote,
    loaded by the hub or eval-lm) outside a hydra job: the sizes are flags, as the fix is given
    there (and --model-overrides' hint finds its key in them)."""
    trained, _ = build_model("encoder", tiny_lm_data, "--encoder-layers", 1)
    fresh = _as_hydra_built([], tiny_lm_data)
    with pytest.raises(ValueError, match=r"trained with --encoder-layers 1; .*: build it with "
                                         r"--encoder-layers 1$"):
        fresh.load_state_dict(trained.state_dict())


@pytest.mark.slow
def test_hydra_glue_config_without_variant_names_the_override(alibi_user_dir, tmp_path):
    """The shipped GLUE config (default variant=alibi) on a zero-clap checkpoint, through the
    real fairseq-hydra-train: the hint names `variant=zero_clap`, the last line, after the
    traceback."""
    from fairseq_alibi.preprocess import glue
    from fairseq_alibi.preprocess.encoders import Gpt2BpeEncoder
    from tests.helpers.corpora import write_glue

    write_glue(tmp_path / "glue_data", rows=16)
    bpe = Gpt2BpeEncoder.from_dir(write_tiny_bpe(tmp_path / "bpe"))
    glue.prepare(tmp_path / "glue_data", tmp_path / "glue", ["RTE"], bpe)
    data = tmp_path / "glue" / "RTE-bin"
    sizes = {"encoder_layers": 1, "encoder_embed_dim": 16, "encoder_ffn_embed_dim": 32,
             "encoder_attention_heads": 2}
    checkpoint = saved_in_process(  # offset ALiBi and the RoBERTa head: the configs' `alibi`
        tmp_path / "alibi" / "model.pt", data / "input0", "--task", "masked_lm",
        "--criterion", "masked_lm", "--arch", "alibi_roberta_base", "--alibi-variant", "offset",
        "--tokens-per-sample", 64,
        *[a for k, v in sizes.items() for a in (f"--{k.replace('_', '-')}", v)])
    out = run_cli(
        "fairseq-hydra-train", "--config-dir", f"{alibi_user_dir}/config/glue",
        "--config-name", "rte", f"task.data={data}", f"checkpoint.restore_file={checkpoint}",
        *[f"++model.{k}={v}" for k, v in sizes.items()], "++model.max_positions=64",
        "task.max_positions=64", "common.cpu=true", "common.fp16=false",
        "dataset.num_workers=0", "distributed_training.distributed_world_size=1",
        "dataset.batch_size=4", "dataset.max_tokens=null", "optimization.max_update=2",
        f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, expect_ok=False)
    lines = out.strip().splitlines()
    hint = next(i for i, l in enumerate(lines)
                if l.startswith("fairseq_alibi: CheckpointMismatchError:"))
    assert lines[hint].endswith("build it with the override `variant=alibi`")
    assert "trained with `--alibi-variant offset --mlm-head roberta`" in lines[hint]
    assert "being built has `--alibi-variant offset --mlm-head clap --zero-mask-embedding`" \
        in lines[hint]
    assert hint == len(lines) - 1 and "Traceback" in out


# row 4: a stock checkpoint through --restore-file / --finetune-from-model


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--restore-file", "--finetune-from-model"])
def test_stock_checkpoint_restored_shows_the_plugin_message_last(flag, tiny_lm_data,
                                                                 alibi_user_dir, tmp_path):
    stock = saved_in_process(tmp_path / "stock" / "model.pt", tiny_lm_data, *STOCK["lm"])
    out = train("lm", tiny_lm_data, alibi_user_dir, tmp_path / "save", "--max-update", 2,
                flag, stock, expect_ok=False)
    assert "please ensure that the architectures match" in out  # fairseq's, above ours
    assert last_line(out).startswith(
        "fairseq_alibi: CheckpointMismatchError: this checkpoint was trained with no ALiBi on "
        "the decoder (no decoder.alibi.slopes")
    assert "convert" in last_line(out)


# a custom-size encoder fine-tuned with the architecture's default sizes


def restore_failure(data, checkpoint, *flags) -> Exception:
    """What fairseq's trainer raises restoring ``checkpoint`` into the model ``flags`` build."""
    from fairseq.trainer import Trainer

    cfg, task = setup_from_command_line(data, "--cpu", *flags)
    model = task.build_model(cfg.model)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    with pytest.raises(Exception, match="please ensure that the architectures match") as failed:
        trainer.load_checkpoint(str(checkpoint), reset_optimizer=True)
    return failed.value


def test_checkpoint_of_another_size_names_the_size_flags(tiny_lm_data, tmp_path):
    """fairseq's trainer buries torch's ``size mismatch`` under ``please ensure that the
    architectures match``; the hint names every flag that builds the checkpoint's sizes, read
    from its tensors before they load (before: the first mismatching tensor's alone; with
    another head count, only the heads)."""
    from fairseq_alibi.error_hints import hint_for

    encoder = ["--task", "masked_lm", "--criterion", "masked_lm", "--arch", "alibi_roberta_base",
               "--tokens-per-sample", 16, "--optimizer", "adam", "--lr", 1e-3,
               "--encoder-layers", 2, "--encoder-attention-heads", 4]
    custom = saved_in_process(tmp_path / "custom" / "model.pt", tiny_lm_data, *encoder,
                              "--encoder-embed-dim", 32, "--encoder-ffn-embed-dim", 64)
    failed = restore_failure(tiny_lm_data, custom, *encoder,
                             "--encoder-embed-dim", 48)  # FFN: the default 3072
    assert hint_for(failed) == (
        "CheckpointMismatchError: this checkpoint was trained with --encoder-embed-dim 32, "
        "--encoder-ffn-embed-dim 64; the model being built has --encoder-embed-dim 48, "
        "--encoder-ffn-embed-dim 3072: build it with --encoder-embed-dim 32 "
        "--encoder-ffn-embed-dim 64")


def test_checkpoint_of_another_model_names_its_architecture(tiny_lm_data, tmp_path):
    """An alibi_roberta checkpoint restored into stock roberta_base (even of the same sizes):
    the hint names the checkpoint's architecture, where the size hint sent the user round in
    circles (the sizes were right: alibi_roberta's own weights differ in kind)."""
    from fairseq_alibi.error_hints import hint_for

    common = ["--task", "masked_lm", "--criterion", "masked_lm", "--tokens-per-sample", 16,
              "--optimizer", "adam", "--lr", 1e-3, "--encoder-layers", 2,
              "--encoder-attention-heads", 4, "--encoder-embed-dim", 32,
              "--encoder-ffn-embed-dim", 64]
    saved = saved_in_process(tmp_path / "alibi" / "model.pt", tiny_lm_data, *common,
                             "--arch", "alibi_roberta")
    failed = restore_failure(tiny_lm_data, saved, *common, "--arch", "roberta_base",
                             "--max-positions", 16)
    assert hint_for(failed) == (
        "the checkpoint is a --arch alibi_roberta model (AlibiRobertaModel) and the model being "
        "built is --arch roberta_base (RobertaModel): their weights differ in kind, not in "
        "size; build it with --arch alibi_roberta (or another architecture of "
        "AlibiRobertaModel) and the options it was trained with")


def test_sizes_are_named_as_the_run_was_started():
    """Under fairseq-hydra-train the sizes are its overrides; more layers saved than built is
    fairseq's pruning (--*-layers-to-keep), which runs after the check."""
    import torch

    from fairseq_alibi.models.checks import check_saved_sizes

    def stack(layers, width, heads):
        state = {f"encoder.layers.{i}.fc1.weight": torch.zeros(2 * width, width)
                 for i in range(layers)}
        state["encoder.layers.0.self_attn.q_proj.weight"] = torch.zeros(width, width)
        state["encoder.alibi.slopes"] = torch.zeros(heads)
        return state

    with pytest.raises(ValueError, match=r"trained with \+\+model.encoder_layers=2, "
                       r"\+\+model.encoder_embed_dim=8, .*build it with \+\+model.encoder_layers=2 "
                       r"\+\+model.encoder_embed_dim=8 \+\+model.encoder_ffn_embed_dim=16 "
                       r"\+\+model.encoder_attention_heads=2$"):
        check_saved_sizes(stack(2, 8, 2), stack(4, 16, 4), {"encoder": ("encoder", "encoder")},
                          hydra=True)
    check_saved_sizes(stack(4, 8, 2), stack(2, 8, 2), {"encoder": ("encoder", "encoder")})


# a file that is no checkpoint: what it is, and what to give instead


def write_safetensors(path):
    """A Hugging Face weights file: an 8-byte header length, its JSON header, the data."""
    import json

    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(4))


@pytest.mark.parametrize("kind,expected", [
    ("text", "it is a text file, not a torch file; give the .pt file that fairseq-train wrote"),
    ("dict", "it is a torch file without fairseq's keys ('model', 'optimizer_history'; it "
             "holds 'a'); give the .pt"),
    ("safetensors", "it is a safetensors file (a Hugging Face model's weights); import the "
                    "model's folder with `fairseq-alibi import-hf FOLDER`"),
    ("unsafe", "torch's safe loader refuses what it holds (Unsupported global: GLOBAL "
               "datetime.date"),
])
def test_a_file_that_is_no_checkpoint_says_what_it_is(kind, expected, tmp_path):
    """The plugin's tools (read_checkpoint), ``checkpoints check`` and the hint of fairseq's
    own commands say what the file is in one line; never torch's advice to load it unsafely."""
    import datetime

    import torch
    from fairseq import checkpoint_utils

    from fairseq_alibi.cli.checkpoint_io import ConversionError, read_checkpoint
    from fairseq_alibi.cli.checkpoints import inspect_checkpoint
    from fairseq_alibi.error_hints import hint_for

    path = tmp_path / f"{kind}.pt"
    if kind == "text":
        path.write_text("hello\n")
    elif kind == "safetensors":
        write_safetensors(path)
    else:
        torch.save({"a": 1} if kind == "dict" else {"model": {}, "a": datetime.date(2026, 1, 1)},
                   path)
    with pytest.raises(ConversionError) as read:
        read_checkpoint(path)
    with pytest.raises(Exception) as loaded:
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    line = str(read.value)
    assert line.startswith(f"cannot read {path} as a fairseq checkpoint: ") and expected in line
    assert "weights_only" not in line and "\n" not in line
    assert hint_for(loaded.value) == line == inspect_checkpoint(path).error
