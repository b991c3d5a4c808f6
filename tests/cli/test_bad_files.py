"""Empty, missing or corrupt files (docs/reliability.md, catalogue of bad inputs): an empty
training split, a save dir with no checkpoint yet, a 0-byte checkpoint, a Pile shard line that is
not JSON, a sweep's --out that holds results or is a file; each a clear error naming the fix, and
nothing on disk overwritten.

Backed elsewhere, not repeated here: truncated or corrupt checkpoint files and failed saves
(test_resume), damaged files given to convert (test_forks), the Pile pipeline's other errors
(test_pipelines). ``# row N`` marks a row of issue 12 (what an experienced fairseq user hit on
first contact). Tests that run fairseq's command lines are marked ``slow``.
"""

import os
import shutil

import pytest

from tests.helpers.cli import last_line, run_cli, snapshot
from tests.helpers.training import train


# ---------------------------------------------------------------- data


@pytest.mark.slow
def test_empty_training_file(trained_lm_checkpoint, tmp_path, alibi_user_dir, tiny_lm_data):
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
    shutil.copy(trained_lm_checkpoint, save / "checkpoint_last.pt")
    before = snapshot(save)
    out = train("lm", data, alibi_user_dir, save, "--max-update", 4, expect_ok=False)
    assert "ValueError: cannot mmap an empty file" in out
    assert snapshot(save) == before


# row 14: the Pile pipeline's JSON errors


@pytest.mark.parametrize("line,reason", [
    ('{"text": "a\tb"}', "Invalid control character at column 12"),
    ('{"text": "ab', "Unterminated string at column 10"),
    ("{not json", "Expecting property name enclosed in double quotes at column 2"),
])
def test_pile_json_error_reads_once(line, reason):
    from fairseq_alibi.preprocess.pile import DataError, parse_document

    with pytest.raises(DataError) as error:
        parse_document("shard.jsonl", 3, line)
    assert str(error.value) == f"shard.jsonl:3: not valid JSON ({reason})"
    assert " at at " not in str(error.value)


# ---------------------------------------------------------------- checkpoints


# row 9: checkpoints check/repair before the first save


@pytest.mark.parametrize("fresh", ["empty folder", "no folder yet"])
def test_repair_and_check_before_the_first_save(fresh, tmp_path, capsys):
    from fairseq_alibi.cli.checkpoints import main

    save_dir = tmp_path / "checkpoints"
    if fresh == "empty folder":
        save_dir.mkdir()
    assert main(["repair", str(save_dir)]) == 0
    assert capsys.readouterr().out.strip() == f"nothing to repair: no checkpoint in {save_dir} yet"
    assert main(["check", str(save_dir)]) == 0
    out = capsys.readouterr().out.strip()
    assert out == f"no checkpoint in {save_dir} yet" and "DAMAGED" not in out
    assert not save_dir.exists() or not any(save_dir.iterdir())  # nothing written


def fake_checkpoint(path, updates, epoch, iterations=0):
    """What ``checkpoints`` reads of a fairseq checkpoint: its updates and its position."""
    import torch

    torch.save({"model": {}, "optimizer_history": [{"num_updates": updates}],
                "extra_state": {"train_iterator": {"epoch": epoch,
                                                   "iterations_in_epoch": iterations}}}, path)


def test_folders_of_no_last_checkpoints_and_of_another_suffix(tmp_path, capsys):
    """``--no-last-checkpoints``: ``check`` said ``DAMAGED (missing)``, and a later run never
    updated the ``checkpoint_last.pt`` that ``repair`` made, which every restart resumed from
    silently; a forgotten ``--checkpoint-suffix``: another suffix's files were read as the
    run's (``repair`` made ``checkpoint_last.pt`` of one); epochs as fairseq's log says them."""
    from fairseq_alibi.cli.checkpoints import main

    run = tmp_path / "no_last"
    run.mkdir()
    fake_checkpoint(run / "checkpoint_1_10.pt", 10, 1, 10)
    fake_checkpoint(run / "checkpoint1.pt", 24, 2)  # the end of epoch 1: fairseq records 2
    assert main(["check", str(run)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out[:3] == ["checkpoint_last.pt: missing", "checkpoint1.pt: intact (epoch 1 @ 24 "
                       "updates)", "checkpoint_1_10.pt: intact (epoch 1 @ 10 updates)"]
    assert out[-1].startswith(f"no checkpoint_last.pt: fairseq-train would start from scratch "
                              f"(a run with --no-last-checkpoints writes none); resume with "
                              f"--restore-file {run / 'checkpoint1.pt'}")
    assert main(["repair", str(run)]) == 0
    assert capsys.readouterr().out.strip().endswith(
        f"a run with --no-last-checkpoints does not update it: resume such a run with "
        f"--restore-file {run / 'checkpoint1.pt'} instead")
    fake_checkpoint(run / "checkpoint_2_30.pt", 30, 2, 6)  # the next run's, last not updated
    assert main(["repair", str(run)]) == 0
    assert capsys.readouterr().out.strip().endswith(
        f"note: checkpoint_2_30.pt (30 updates) is newer than checkpoint_last.pt (24), which "
        f"fairseq-train resumes from (a run with --no-last-checkpoints does not update it; "
        f"after a rollback that is right): to go on from the newest, resume with "
        f"--restore-file {run / 'checkpoint_2_30.pt'}")
    assert main(["check", str(run)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(
        "note: checkpoint_2_30.pt (30 updates) is newer")

    other = tmp_path / "suffixed"
    other.mkdir()
    fake_checkpoint(other / "checkpoint_last_x.pt", 10, 1, 10)
    fake_checkpoint(other / "checkpoint.best_loss_9.1230_x.pt", 10, 1, 10)
    for command in ("check", "repair"):
        assert main([command, str(other)]) == 0
        assert capsys.readouterr().out.strip().endswith(
            f"no checkpoint in {other} yet (it holds checkpoints of --checkpoint-suffix=_x: "
            "give the run's suffix)")
    assert sorted(p.name for p in other.iterdir()) == [
        "checkpoint.best_loss_9.1230_x.pt", "checkpoint_last_x.pt"]
    assert main(["check", str(other), "--checkpoint-suffix", "_x"]) == 0
    capsys.readouterr()
    # the fixes named for a suffixed run: the suffix given to repair, not to --restore-file
    (other / "checkpoint_last_x.pt").rename(other / "checkpoint_1_10_x.pt")
    assert main(["check", str(other), "--checkpoint-suffix=_x"]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        f"no checkpoint_last_x.pt: fairseq-train would start from scratch (a run with "
        f"--no-last-checkpoints writes none); resume with --restore-file "
        f"{other / 'checkpoint_1_10.pt'}, or run `fairseq-alibi checkpoints repair {other} "
        "--checkpoint-suffix=_x` to copy it there")


@pytest.mark.slow
def test_a_restore_file_that_names_no_file_stops_fairseq_train(tiny_lm_data, alibi_user_dir,
                                                               tmp_path):
    """Stock fairseq logged "No existing checkpoint found", trained a random initialisation to
    the end and exited 0; with a suffix, the file fairseq reads is named."""
    missing = tmp_path / "pretrained" / "model.pt"
    out = train("lm", tiny_lm_data, alibi_user_dir, tmp_path / "save", "--max-update", 2,
                "--restore-file", missing, expect_ok=False)
    assert last_line(out) == (
        f"OneLineError: --restore-file {missing}: no such file (from {os.getcwd()}); fairseq "
        "would train from a random initialisation. Give the path of the checkpoint to start "
        "from")
    assert not (tmp_path / "save").exists() or not any((tmp_path / "save").iterdir())
    from fairseq_alibi.train_guards import restore_file_refusal

    missing.parent.mkdir()
    missing.touch()
    assert restore_file_refusal(str(missing)) is None
    # a resume named by its path: a first launch rightly finds nothing
    assert restore_file_refusal(str(tmp_path / "save" / "checkpoint_last.pt"), "_x") is None
    assert f"(read as {missing.parent / 'model_x.pt'}, with --checkpoint-suffix=_x)" in \
        restore_file_refusal(str(missing), "_x")


@pytest.mark.slow
def test_a_backend_that_cannot_train_on_the_cpu_stops_fairseq_train_before_its_data_loads(
        tiny_lm_data, alibi_user_dir, tmp_path):
    """``--alibi-attention flex`` (no CPU backward) was refused at the first step, after the
    training data loaded; the guard refuses it before (fairseq logs each split it loads)."""
    out = train("lm", tiny_lm_data, alibi_user_dir, tmp_path / "save", "--max-update", 2,
                "--alibi-attention", "flex", expect_ok=False)
    assert last_line(out).startswith(
        "OneLineError: --alibi-attention flex cannot serve training this model: flex has no "
        "CPU backward")
    assert f"from: {tiny_lm_data}/train" not in out, out


@pytest.mark.slow
def test_kept_best_checkpoints_with_an_underscore_suffix_stops_before_training(
        tiny_lm_data, alibi_user_dir, tmp_path):
    """fairseq parses a kept checkpoint's score after the last '_' of its name: with
    ``--checkpoint-suffix _x`` its second save failed (``could not convert string to float:
    'x.pt'``) an epoch into training; refused before, and a suffix without '_' trains."""
    flags = ("--max-epoch", 2, "--keep-best-checkpoints", 1)
    out = train("lm", tiny_lm_data, alibi_user_dir, tmp_path / "save", *flags,
                "--checkpoint-suffix", "_x", expect_ok=False)
    assert last_line(out) == (
        "OneLineError: --keep-best-checkpoints 1 with the checkpoint suffix _x: fairseq reads "
        "each kept checkpoint's score after the last '_' of its file name, so its second save "
        "would fail; give a suffix without '_' (e.g. --checkpoint-suffix=-x) or drop "
        "--keep-best-checkpoints")
    from types import SimpleNamespace

    from fairseq_alibi.train_guards import kept_best_refusal

    parallel = SimpleNamespace(keep_best_checkpoints=1, checkpoint_suffix="", no_save=False)
    assert kept_best_refusal(parallel, "-model_part-0").endswith(
        "fairseq's model-parallel suffix holds one: drop --keep-best-checkpoints")
    parallel.no_save = True  # nothing is saved
    assert kept_best_refusal(parallel, "-model_part-0") is None
    train("lm", tiny_lm_data, alibi_user_dir, tmp_path / "save", *flags,
          "--checkpoint-suffix=-x")
    assert (tmp_path / "save" / "checkpoint2-x.pt").is_file()


def test_continue_once_is_checked_where_fairseq_reads_it(tmp_path):
    """--continue-once: read at a first launch only, as it is given; the guards before
    training refuse it missing and read it for the worker count."""
    from types import SimpleNamespace

    from fairseq_alibi.train_guards import _restored_path, continue_once_refusal

    save = tmp_path / "save"
    save.mkdir()
    cfg = SimpleNamespace(restore_file="checkpoint_last.pt", save_dir=str(save),
                          continue_once=str(tmp_path / "gone.pt"))
    assert continue_once_refusal(cfg, "") == (
        f"--continue-once {tmp_path / 'gone.pt'}: no such file (from {os.getcwd()}); fairseq "
        "would train from a random initialisation. Give the path of the checkpoint to start "
        "from")
    (tmp_path / "pretrained.pt").touch()
    cfg.continue_once = str(tmp_path / "pretrained.pt")
    assert continue_once_refusal(cfg, "") is None
    assert _restored_path(cfg, "") == str(tmp_path / "pretrained.pt")
    # saved mid-epoch by two workers, continued by one: the line names the flag that gave it
    import torch

    from fairseq_alibi.train_guards import world_size_refusal

    torch.save({"cfg": {"distributed_training": {"distributed_world_size": 2}, "common": {}},
                "extra_state": {"train_iterator": {"iterations_in_epoch": 5, "epoch": 1}}},
               tmp_path / "pretrained.pt")
    cfg.reset_dataloader = False
    refused = world_size_refusal(cfg, SimpleNamespace(data_parallel_world_size=1), "")
    assert refused.startswith(f"{tmp_path / 'pretrained.pt'} was saved 5 batches into epoch 1 "
                              "by 2 worker(s), and this run has 1")
    assert refused.endswith("and resume without --continue-once")
    cfg.continue_once = str(tmp_path / "gone.pt")
    (save / "checkpoint_last_x.pt").touch()  # a later launch resumes from its own
    assert continue_once_refusal(cfg, "_x") is None
    assert _restored_path(cfg, "_x") == str(save / "checkpoint_last_x.pt")


def test_a_resume_with_another_trained_option_is_refused(tmp_path):
    """A checkpoint's training continued (a resume, --restore-file) with other learned scales
    (or variant, global tokens) went on training its model as another one, without a word;
    the same options continue, and a new phase (--reset-optimizer) may change them."""
    from types import SimpleNamespace

    import torch
    from omegaconf import OmegaConf

    from fairseq_alibi.train_guards import resumed_options_refusal

    torch.save({"cfg": {"model": {"_name": "alibi_transformer_lm",
                                  "alibi_learned_scales": "none"}}},
               tmp_path / "checkpoint_last.pt")
    cfg = SimpleNamespace(restore_file="checkpoint_last.pt", save_dir=str(tmp_path),
                          reset_optimizer=False)

    def run(scales):
        return SimpleNamespace(cfg=SimpleNamespace(model=OmegaConf.create(
            {"_name": "alibi_transformer_lm", "alibi_learned_scales": scales})))

    last = tmp_path / "checkpoint_last.pt"
    refusal = (f"{last} was trained with --alibi-learned-scales none, and this run has "
               "--alibi-learned-scales per_head: it would go on training that model as another "
               "one; give --alibi-learned-scales none, or start a new phase with "
               "--reset-optimizer (or --finetune-from-model, in another --save-dir), where the "
               "checkpoint's weights fit the new options")
    assert resumed_options_refusal(cfg, run("per_head"), "") == refusal
    assert resumed_options_refusal(cfg, run("none"), "") is None
    cfg.restore_file = str(last)  # named: the same continuation
    assert resumed_options_refusal(cfg, run("per_head"), "") == refusal
    cfg.reset_optimizer = True
    assert resumed_options_refusal(cfg, run("per_head"), "") is None


def test_a_resume_whose_weights_the_new_options_refuse_names_only_the_way_back(tmp_path):
    """Learned scales resumed without them: the model refuses the checkpoint's scales at load,
    so a new phase cannot start from them either, and the refusal does not send the user
    there (the other way, fixed slopes to learned scales, a new phase loads)."""
    from types import SimpleNamespace

    import torch

    from omegaconf import OmegaConf

    from fairseq_alibi.train_guards import resumed_options_refusal
    from tests.helpers.building import setup_from_command_line, write_dictionary

    data = write_dictionary(tmp_path / "data", 20)

    def trainer(scales):
        cfg, task = setup_from_command_line(
            data, "--task", "language_modeling", "--arch", "alibi_transformer_lm",
            "--decoder-layers", 1, "--decoder-embed-dim", 16, "--decoder-ffn-embed-dim", 32,
            "--decoder-attention-heads", 2, "--alibi-learned-scales", scales)
        model = task.build_model(cfg.model)
        return SimpleNamespace(cfg=cfg, get_model=lambda: model)

    def save(run):
        torch.save({"cfg": {"model": OmegaConf.to_container(run.cfg.model)},
                    "model": run.get_model().state_dict()}, last)

    learned, fixed = trainer("per_head"), trainer("none")
    last = tmp_path / "checkpoint_last.pt"
    cfg = SimpleNamespace(restore_file="checkpoint_last.pt", save_dir=str(tmp_path),
                          reset_optimizer=False)
    save(learned)
    assert resumed_options_refusal(cfg, fixed, "") == (
        f"{last} was trained with --alibi-learned-scales per_head, and this run has "
        "--alibi-learned-scales none: it would go on training that model as another one; give "
        "--alibi-learned-scales per_head (the checkpoint's weights do not fit "
        "--alibi-learned-scales none, so a new phase, --reset-optimizer or "
        "--finetune-from-model, cannot start from them either)")
    save(fixed)
    assert resumed_options_refusal(cfg, learned, "").endswith(
        "or start a new phase with --reset-optimizer (or --finetune-from-model, in another "
        "--save-dir), where the checkpoint's weights fit the new options")


# row 10: a 0-byte checkpoint


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["fairseq-eval-lm", "fairseq-train"])
def test_zero_byte_checkpoint_is_named_with_the_fix(tool, tiny_lm_data, alibi_user_dir, tmp_path):
    save = tmp_path / "save"
    save.mkdir()
    (save / "checkpoint_last.pt").write_bytes(b"")
    if tool == "fairseq-train":  # resuming
        out = train("lm", tiny_lm_data, alibi_user_dir, save, "--max-update", 2, expect_ok=False)
    else:
        out = run_cli(tool, tiny_lm_data, "--user-dir", alibi_user_dir, "--path",
                      save / "checkpoint_last.pt", "--cpu", "--tokens-per-sample", 16,
                      expect_ok=False)
    assert last_line(out) == (
        f"fairseq_alibi: checkpoint {save / 'checkpoint_last.pt'} is empty (0 bytes), as an "
        f"interrupted save leaves it; `fairseq-alibi checkpoints repair {save}` "
        f"restores checkpoint_last.pt from the newest intact checkpoint (`... check {save}` "
        f"lists them)")


def test_check_reports_a_zero_byte_checkpoint(tmp_path, capsys):
    from fairseq_alibi.cli.checkpoints import main

    (tmp_path / "checkpoint_last.pt").write_bytes(b"")
    assert main(["check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "checkpoint_last.pt: DAMAGED (empty file, 0 bytes)" in out
    assert f"fairseq-alibi checkpoints repair {tmp_path}" in out


def test_check_says_truncated_or_corrupt_wherever_the_file_was_cut(trained_lm_checkpoint,
                                                                  tmp_path, capsys):
    """torch words a cut file by where it was cut ("failed finding central directory",
    "[Errno 22] Invalid argument"); check classifies every cut the same, as fairseq's commands
    do ("truncated or corrupt")."""
    from fairseq_alibi.cli.checkpoints import main

    whole = trained_lm_checkpoint.read_bytes()
    for tenths in range(1, 10):
        (tmp_path / "checkpoint_last.pt").write_bytes(whole[:len(whole) * tenths // 10])
        assert main(["check", str(tmp_path)]) == 1
        first = capsys.readouterr().out.splitlines()[0]
        assert first.startswith("checkpoint_last.pt: DAMAGED (truncated or corrupt: "), first


def test_a_damaged_checkpoint_other_than_the_last_is_not_sent_to_repair(tmp_path):
    """repair restores checkpoint_last.pt only: for another file (an averaged one, a named
    --path) the hint says to give an intact checkpoint."""
    from fairseq import checkpoint_utils

    from fairseq_alibi.error_hints import hint_for

    (tmp_path / "averaged.pt").write_bytes(b"")
    with pytest.raises(Exception) as raised:
        checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "averaged.pt"))
    assert hint_for(raised.value) == (
        f"checkpoint {tmp_path / 'averaged.pt'} is empty (0 bytes); give an intact checkpoint "
        f"(`fairseq-alibi checkpoints check {tmp_path}` lists those of its folder)")


def test_a_folder_given_as_the_checkpoint_names_its_files(tmp_path):
    """fairseq's loader given a save folder (--path checkpoints) fails with a bare
    IsADirectoryError: the hint names a file in it."""
    from fairseq import checkpoint_utils

    from fairseq_alibi.error_hints import hint_for

    (tmp_path / "checkpoint_last.pt").write_bytes(b"")
    with pytest.raises(IsADirectoryError) as failed:
        checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path))
    assert hint_for(failed.value) == (
        f"{tmp_path} is a folder: give a checkpoint file in it, e.g. "
        f"{tmp_path / 'checkpoint_last.pt'} (.pt files there: checkpoint_last.pt)")


def test_what_the_machine_lacks_gets_the_fix_as_its_last_line(monkeypatch):
    """Stock fairseq failing on the machine, not on ALiBi, with a last line that misleads: the
    hint names the fix (docs/reliability.md)."""
    import os

    import numpy

    from fairseq_alibi import error_hints

    def raised_in(path, exc):
        try:
            exec(compile("raise exc", path, "exec"), {"exc": exc})
        except BaseException as caught:  # noqa: BLE001
            return caught

    trainer = os.path.join(os.sep, "x", "fairseq", "trainer.py")
    bf16 = raised_in(trainer, AttributeError("'NoneType' object has no attribute 'xla_device'"))
    assert error_hints.hint_for(bf16).startswith("--bf16 on the CPU: stock fairseq-train takes "
                                                 "it for a TPU run; train in bf16 on the CPU "
                                                 "with fairseq-hydra-train")
    elsewhere = raised_in("/x/other.py", AttributeError("no attribute 'xla_device'"))
    assert error_hints.hint_for(elsewhere) is None
    fp16 = AssertionError("Torch not compiled with CUDA enabled")
    assert error_hints.hint_for(fp16).startswith("--fp16 (or --cuda) needs a GPU")
    assert "add common.fp16=false" in error_hints.hint_for(fp16)  # the GLUE configs' fp16: true
    cython = ImportError("Please build Cython components with: `pip install --editable .`")
    monkeypatch.setattr(numpy, "__version__", "2.4.6")
    assert error_hints.hint_for(cython) == ("fairseq 0.12's compiled parts need numpy < 2, and "
                                            "numpy 2.4.6 is installed: pip install 'numpy<2'")
    monkeypatch.setattr(numpy, "__version__", "1.26.4")
    assert error_hints.hint_for(cython) is None
    copy = ImportError("Failed to import --user-dir=/src/fairseq_alibi because the "
                       "corresponding module name (fairseq_alibi) is not globally unique. "
                       "Please rename the directory to something unique and try again.")
    installed = os.path.dirname(os.path.abspath(error_hints.__file__))
    assert error_hints.hint_for(copy) == (
        f"--user-dir /src/fairseq_alibi is another copy of fairseq_alibi than the one Python "
        f"imports ({installed}): give --user-dir {installed} (what python -m fairseq_alibi "
        "--user-dir prints outside the other copy's folder), or install that copy (pip install "
        "-e its checkout)")


# ---------------------------------------------------------------- outputs


def test_a_second_sweep_into_the_same_folder_needs_overwrite_and_then_replaces_it(
        trained_lm_checkpoint, tiny_lm_data, tmp_path, capsys):
    """A sweep into a folder holding another's results had replaced its CSV silently, its logs
    left mixed with the new ones; a file as --out had been a NotADirectoryError traceback."""
    from fairseq_alibi.cli.sweep import main

    out = tmp_path / "sweep"
    common = ["--path", f"alibi={trained_lm_checkpoint}", "--data", str(tiny_lm_data),
              "--modes", "nonoverlapping", "--cpu", "--threads", "1", "--no-progress"]
    assert main([*common, "--lengths", "8,16", "--out", str(out)]) == 0
    first = snapshot(out)

    def logs():
        return sorted(p.name for p in (out / "logs").iterdir())

    assert logs() == ["alibi_nonoverlapping_16.log", "alibi_nonoverlapping_8.log"]
    capsys.readouterr()
    (tmp_path / "file").write_text("mine")
    for taken, said in ((out, f"--out {out} already exists and is not empty; pass --overwrite"),
                        (tmp_path / "file", f"--out {tmp_path / 'file'} exists and is not a folder")):
        assert main([*common, "--lengths", "4", "--out", str(taken)]) == 1
        err = capsys.readouterr().err.strip()
        assert said in err and len(err.splitlines()) == 1, err
    assert snapshot(out) == first and len(logs()) == 2 and snapshot(tmp_path)["file"] == b"mine"

    assert main([*common, "--lengths", "4", "--out", str(out), "--overwrite"]) == 0
    assert logs() == ["alibi_nonoverlapping_4.log"]  # the earlier sweep's are gone
    lengths = [line.split(",")[2] for line in
               (out / "extrapolation.csv").read_text().splitlines()[1:]]
    assert lengths == ["4"]
    with pytest.raises(SystemExit) as refused:
        main([*common[:2], "--data", str(tmp_path / "nodata"), *common[4:], "--lengths", "4",
              "--out", str(tmp_path / "new")])
    assert refused.value.code == 2
    assert "argument --data: no folder" in capsys.readouterr().err.strip().splitlines()[-1]
