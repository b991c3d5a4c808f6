"""Exact resume and faults, through fairseq-train itself.

* 20 updates straight == 10 updates, stop, resume for 10: the same logged losses, and every
  checkpoint (weights, optimizer moments, scheduler, data iterator, loss meters) bit for bit.
* A run killed with SIGKILL mid-training restarts from its last checkpoint, loses nothing
  beyond the checkpoint interval, and ends bit for bit where the straight run ends.
* fairseq copies ``checkpoint_last.pt`` in place after writing the numbered checkpoint
  atomically: a kill during that copy leaves a truncated file, which
  ``fairseq-alibi checkpoints repair`` restores from the intact numbered one.
* A save that fails (file too large) leaves the previous ``checkpoint_last.pt`` untouched.
"""

import functools
import os
import re
import shutil
import signal
import subprocess

import pytest
import torch

from fairseq_alibi.cli.checkpoints import check, inspect_checkpoint, repair
from tests.helpers.checkpoints import load, train_loss
from tests.helpers.cli import BIN, child_env, python_module, run_cli
from tests.helpers.training import loaded_at, logged_losses, train, train_args

#: end to end through fairseq's real command lines
pytestmark = pytest.mark.slow

SAVE_EVERY = ["--save-interval-updates", 5, "--dropout", 0.1]  # dropout: RNG state matters too


def assert_identical(a, b):
    """Two checkpoints hold the same training state, bit for bit."""
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    sa, sb = a["last_optimizer_state"]["state"], b["last_optimizer_state"]["state"]
    assert sa.keys() == sb.keys()
    for p in sa:
        for k, v in sa[p].items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(sb[p][k])), (p, k)
    ha, hb = a["optimizer_history"][-1], b["optimizer_history"][-1]
    assert ha["num_updates"] == hb["num_updates"]
    assert ha["lr_scheduler_state"] == hb["lr_scheduler_state"]
    assert a["extra_state"]["train_iterator"] == b["extra_state"]["train_iterator"]
    assert train_loss(a) == train_loss(b)


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tiny_lm_data, alibi_user_dir):
    """model -> (save dir, output) of 20 updates in one go, trained once, on demand."""

    @functools.cache
    def get(model):
        save = tmp_path_factory.mktemp(f"straight_{model}")
        out = train(model, tiny_lm_data, alibi_user_dir, save, *SAVE_EVERY, "--max-update", 20)
        assert [u for u, _ in logged_losses(out)] == list(range(1, 21))
        return save, out

    return get


@pytest.mark.parametrize("model", ["lm", "encoder"])
def test_stop_and_resume_equals_straight_run(model, straight, tmp_path, tiny_lm_data, alibi_user_dir):
    straight_dir, straight_out = straight(model)
    first = train(model, tiny_lm_data, alibi_user_dir, tmp_path, *SAVE_EVERY, "--max-update", 10)
    second = train(model, tiny_lm_data, alibi_user_dir, tmp_path, *SAVE_EVERY, "--max-update", 20)
    assert loaded_at(first) is None and loaded_at(second) == 10
    assert logged_losses(first) + logged_losses(second) == logged_losses(straight_out)
    names = sorted(p.name for p in straight_dir.glob("checkpoint*.pt"))
    assert names == sorted(p.name for p in tmp_path.glob("checkpoint*.pt"))
    assert len(names) == 5  # updates 5, 10, 15, 20 and last
    for name in names:
        assert_identical(load(tmp_path / name), load(straight_dir / name))


def test_a_resume_in_a_later_epoch_is_exact_with_update_epoch_batch_itr(tmp_path, tiny_lm_data,
                                                                         alibi_user_dir):
    """fairseq-fixed 0.12.3 makes a run's batches from ``--seed`` plus the epoch it starts in and
    keeps them for every epoch: resumed in epoch 2, a run's batches are not the uninterrupted
    run's (stock). With ``--update-epoch-batch-itr True`` every epoch makes its own in both, and
    the resume is exact: the recipe docs/reliability.md gives."""
    flags = ["--dropout", 0.1, "--update-epoch-batch-itr", "True"]
    straight = train("lm", tiny_lm_data, alibi_user_dir, tmp_path / "straight", *flags,
                     "--max-epoch", 2)
    resumed = tmp_path / "resumed"
    first = train("lm", tiny_lm_data, alibi_user_dir, resumed, *flags, "--max-epoch", 1)
    second = train("lm", tiny_lm_data, alibi_user_dir, resumed, *flags, "--max-epoch", 2)
    assert loaded_at(second) == logged_losses(first)[-1][0]  # resumed at the end of epoch 1
    assert "(epoch 2 @" in second
    assert logged_losses(first) + logged_losses(second) == logged_losses(straight)
    assert_identical(load(resumed / "checkpoint_last.pt"),
                     load(tmp_path / "straight" / "checkpoint_last.pt"))


def test_sigkill_mid_training_resumes_from_the_last_checkpoint(
        straight, tmp_path, tiny_lm_data, alibi_user_dir):
    model = "lm"  # the machinery under test is fairseq's, the same for both models
    straight_dir, _ = straight(model)
    # a run meant to go on for a long time, killed while it trains update 13
    args = train_args(model, tiny_lm_data, alibi_user_dir, tmp_path, *SAVE_EVERY,
                      "--max-update", 10**6)
    proc = subprocess.Popen([str(BIN / "fairseq-train")] + [str(a) for a in args],
                            env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    log = []
    try:
        for line in proc.stdout:
            log.append(line)
            if '"num_updates": "12"' in line:
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        log.append(proc.communicate()[0])
    log = "".join(log)
    assert proc.returncode == -signal.SIGKILL, log[-3000:]
    saved = [int(u) for u in re.findall(r"Saved checkpoint \S+ \(epoch \d+ @ (\d+) updates", log)]
    assert saved and max(saved) >= 10
    # nothing corrupted, unless the kill landed inside a save (then repair restores the last)
    in_a_save = log.count("Preparing to save checkpoint") > len(saved)
    ok, report = check(tmp_path)
    assert ok or in_a_save, report
    if not in_a_save:
        assert all("intact" in line or line.endswith("safe to delete") for line in report), report
    repair(tmp_path)
    # restarting the same command line resumes; no progress lost beyond the save interval
    out = train(model, tiny_lm_data, alibi_user_dir, tmp_path, *SAVE_EVERY, "--max-update", 20)
    assert loaded_at(out) >= max(saved)
    assert_identical(load(tmp_path / "checkpoint_last.pt"), load(straight_dir / "checkpoint_last.pt"))


def test_interrupted_copy_to_checkpoint_last_is_repaired(straight, tmp_path):
    """The state a kill during fairseq's in-place copy of checkpoint_last.pt leaves behind."""
    from fairseq.checkpoint_utils import load_checkpoint_to_cpu

    straight_dir, _ = straight("lm")
    for name in ("checkpoint_1_15.pt", "checkpoint_1_20.pt", "checkpoint_last.pt"):
        shutil.copy(straight_dir / name, tmp_path / name)
    last = tmp_path / "checkpoint_last.pt"
    os.truncate(last, last.stat().st_size * 2 // 5)
    damaged = last.read_bytes()
    with pytest.raises(RuntimeError, match="corrupted"):  # what fairseq-train would hit
        load_checkpoint_to_cpu(str(last))
    ok, report = check(tmp_path)
    assert not ok and report[0].startswith("checkpoint_last.pt: DAMAGED")
    assert "fairseq-alibi checkpoints repair" in report[-1]

    _, out = python_module("fairseq_alibi.checkpoints", "repair", tmp_path)
    assert "restored checkpoint_last.pt from checkpoint_1_20.pt (epoch 1 @ 20 updates)" in out
    assert last.read_bytes() == (tmp_path / "checkpoint_1_20.pt").read_bytes()
    assert (tmp_path / "checkpoint_last.pt.corrupt").read_bytes() == damaged  # nothing deleted
    assert load_checkpoint_to_cpu(str(last))["optimizer_history"][-1]["num_updates"] == 20
    assert repair(tmp_path).startswith("nothing to do") and check(tmp_path)[0]


def test_a_damaged_best_is_restored_and_a_full_disk_is_one_line(tmp_path, tiny_lm_data,
                                                                 alibi_user_dir, monkeypatch):
    """A kill during the copy to checkpoint_best.pt (resuming does not read it, so check passes)
    is restored from the checkpoint saved after the best validation; a repair that cannot write
    (a full disk) says so in one line and leaves no .tmp behind."""
    import fairseq_alibi.cli.checkpoints as checkpoints

    validated = [a for a in train_args("lm", tiny_lm_data, alibi_user_dir, tmp_path,
                                       *SAVE_EVERY, "--max-update", 20)
                 if a != "--disable-validation"]
    run_cli("fairseq-train", *validated)
    best = tmp_path / "checkpoint_best.pt"
    os.truncate(best, 100)
    ok, report = check(tmp_path)
    assert ok and "checkpoint_best is unusable" in report[-1]
    saved = [inspect_checkpoint(p) for p in tmp_path.glob("checkpoint_1_*.pt")]
    source = min(saved, key=lambda c: (c.val_loss, -c.num_updates))
    assert repair(tmp_path).startswith(
        f"nothing to do: checkpoint_last.pt: intact (epoch 1 @ 20 updates); restored "
        f"checkpoint_best.pt from {source.path.name}")
    assert best.read_bytes() == source.path.read_bytes()

    last = tmp_path / "checkpoint_last.pt"
    os.truncate(last, 100)

    def full(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoints.shutil, "copyfile", full)
    with pytest.raises(checkpoints.CheckpointError, match=r"^could not write "
                       r"checkpoint_last.pt.tmp in .* \(No space left on device\): restoring "
                       r"checkpoint_last.pt copies checkpoint_1_20.pt"):
        repair(tmp_path)
    assert not list(tmp_path.glob("*.tmp")) and last.stat().st_size == 100


def test_a_flipped_byte_that_torch_load_accepts_is_reported(straight, tmp_path):
    import zipfile

    path = tmp_path / "checkpoint_last.pt"
    shutil.copy(straight("lm")[0] / "checkpoint_last.pt", path)
    with zipfile.ZipFile(path) as archive:
        record = next(i for i in archive.infolist() if "/data/" in i.filename and i.file_size > 64)
    with open(path, "r+b") as f:  # one byte inside that tensor's stored data
        f.seek(record.header_offset + 26)
        name_len, extra_len = (int.from_bytes(f.read(2), "little") for _ in range(2))
        f.seek(record.header_offset + 30 + name_len + extra_len + 8)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x40]))
    torch.load(path, map_location="cpu", weights_only=False)  # loads: torch checks no CRC
    found = inspect_checkpoint(path)
    assert not found.intact and "CRC-32" in found.error


def test_a_failed_save_keeps_the_last_good_checkpoint(straight, tmp_path, tiny_lm_data,
                                                     alibi_user_dir):
    model = "lm"
    straight_dir, _ = straight(model)
    good = (straight_dir / "checkpoint_last.pt").read_bytes()
    (tmp_path / "checkpoint_last.pt").write_bytes(good)
    # files may not grow beyond 64 KiB: the save at update 25 fails half written
    limited = ["bash", "-c", 'ulimit -f 64 && exec "$@"', "fairseq-train",
               str(BIN / "fairseq-train")]
    args = train_args(model, tiny_lm_data, alibi_user_dir, tmp_path, *SAVE_EVERY, "--max-update", 25)
    proc = subprocess.run(limited + [str(a) for a in args], env=child_env(),
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "File too large" in out, out[-3000:]
    assert loaded_at(out) == 20 and "Saved checkpoint" not in out
    assert (tmp_path / "checkpoint_last.pt").read_bytes() == good  # untouched
    assert not (tmp_path / "checkpoint_1_25.pt").exists()  # only its .tmp was written
    assert inspect_checkpoint(tmp_path / "checkpoint_last.pt").num_updates == 20
