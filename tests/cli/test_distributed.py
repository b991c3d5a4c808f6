"""fairseq's own distributed data-parallel training of both models, on CPU (gloo).

Two workers started by hand (``--distributed-no-spawn --distributed-init-method tcp://...``),
or by ``torchrun`` through a shell that passes ``--distributed-rank $RANK``, train exactly
like one process with the same global batch (``--update-freq 2``): the same logged losses, the
same loss meters within 1e-4 and the same weights; and a checkpoint written by either one
resumes in the other. fairseq's ``c10d`` DDP backend does not run on CPU; ``legacy_ddp`` and its
alias ``no_c10d`` do (docs/reliability.md).
"""

import shutil
import subprocess

import pytest
import torch

from fairseq_alibi.cli.checkpoints import set_world_size
from tests.helpers.checkpoints import load, max_weight_difference, train_loss
from tests.helpers.cli import BIN, child_env, last_line, python_module
from tests.helpers.training import loaded_at, logged_losses, train, train_args, train_distributed

#: end to end through fairseq's real command lines
pytestmark = pytest.mark.slow

# no dropout: worker 1 and the second micro-batch of one process draw different masks
SAVE_EVERY = ["--save-interval-updates", 4, "--dropout", 0, "--attention-dropout", 0]
WORLD = 2


def assert_same_training(a, b, weights_atol=1e-6, loss_atol=1e-4):
    """Two checkpoints of equivalent runs: the same update, loss meters and weights."""
    assert a["optimizer_history"][-1]["num_updates"] == b["optimizer_history"][-1]["num_updates"]
    for x, y in zip(train_loss(a), train_loss(b)):
        assert abs(x - y) <= loss_atol, (train_loss(a), train_loss(b))
    assert max_weight_difference(a, b) <= weights_atol


def torchrun(model, data, user_dir, save_dir, *extra, ddp_backend="no_c10d"):
    """The torchrun recipe: a shell hands each worker its $RANK (fairseq's own torchrun
    support divides by torch.cuda.device_count(), which is 0 on CPU)."""
    args = train_args(model, data, user_dir, save_dir, *extra,
                      "--distributed-world-size", WORLD, "--distributed-init-method", "env://",
                      "--distributed-no-spawn", "--distributed-backend", "gloo",
                      "--ddp-backend", ddp_backend)
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", WORLD, "--no-python",
           "sh", "-c", 'exec "$0" "$@" --distributed-rank "$RANK"', BIN / "fairseq-train", *args]
    proc = subprocess.run([str(c) for c in cmd], env=child_env(), capture_output=True,
                          text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    return out


@pytest.fixture(scope="module")
def single_lm(tmp_path_factory, tiny_lm_data, alibi_user_dir):
    save = tmp_path_factory.mktemp("single_lm")
    out = train("lm", tiny_lm_data, alibi_user_dir, save, *SAVE_EVERY, "--update-freq", WORLD,
                "--max-update", 8)
    return save, out


@pytest.fixture(scope="module")
def distributed_lm(tmp_path_factory, tiny_lm_data, alibi_user_dir):
    save = tmp_path_factory.mktemp("distributed_lm")
    out = train_distributed("lm", tiny_lm_data, alibi_user_dir, save, *SAVE_EVERY,
                            "--max-update", 8, ddp_backend="legacy_ddp")
    return save, out


def test_lm_two_workers_train_like_one_process_with_the_same_global_batch(single_lm, distributed_lm):
    (single, single_out), (dist, dist_out) = single_lm, distributed_lm
    assert "distributed init (rank 0)" in dist_out
    assert logged_losses(dist_out) == logged_losses(single_out)
    assert len(logged_losses(single_out)) == 8
    for name in ("checkpoint_1_4.pt", "checkpoint_last.pt"):
        assert_same_training(load(dist / name), load(single / name))


def test_lm_distributed_checkpoint_resumes_in_one_process(single_lm, distributed_lm, tmp_path,
                                                          tiny_lm_data, alibi_user_dir):
    shutil.copy(distributed_lm[0] / "checkpoint_1_4.pt", tmp_path / "checkpoint_last.pt")
    # saved mid-epoch by 2 workers: its position in the epoch is counted in batches of one;
    # resumed as it is, one process would train on other batches (it did, silently)
    refused = train("lm", tiny_lm_data, alibi_user_dir, tmp_path, *SAVE_EVERY, "--update-freq",
                    WORLD, "--max-update", 8, expect_ok=False)
    assert last_line(refused) == (
        f"OneLineError: {tmp_path / 'checkpoint_last.pt'} was saved 4 batches into epoch 1 by 2 "
        "worker(s), and this run has 1: fairseq counts that position in batches of one worker, "
        "so the run would train on other batches than the one it continues; run `fairseq-alibi "
        f"checkpoints set-world-size {tmp_path} 1` first, which rewrites the position "
        "(docs/reliability.md), or pass --reset-dataloader to start the epoch over")
    assert "batch 8 of epoch 1 (saved by 2)" in set_world_size(tmp_path, 1)
    out = train("lm", tiny_lm_data, alibi_user_dir, tmp_path, *SAVE_EVERY,
                "--update-freq", WORLD, "--max-update", 8)
    assert loaded_at(out) == 4
    assert_same_training(load(tmp_path / "checkpoint_last.pt"),
                         load(single_lm[0] / "checkpoint_last.pt"))


def test_lm_single_process_checkpoint_resumes_under_torchrun(single_lm, tmp_path, tiny_lm_data,
                                                             alibi_user_dir):
    shutil.copy(single_lm[0] / "checkpoint_1_4.pt", tmp_path / "checkpoint_last.pt")
    _, moved = python_module("fairseq_alibi.checkpoints", "set-world-size", tmp_path, WORLD)
    assert "now resumes with 2 worker(s) at batch 8 of epoch 1 (saved by 1)" in moved
    assert (tmp_path / "checkpoint_last.pt.world1").read_bytes() == \
        (single_lm[0] / "checkpoint_1_4.pt").read_bytes()
    out = torchrun("lm", tiny_lm_data, alibi_user_dir, tmp_path, *SAVE_EVERY, "--max-update", 8)
    assert loaded_at(out) == 4
    assert_same_training(load(tmp_path / "checkpoint_last.pt"),
                         load(single_lm[0] / "checkpoint_last.pt"))


def test_workers_given_different_alibi_options_are_refused(tmp_path, tiny_lm_data,
                                                         alibi_user_dir):
    """Hand-started workers with different ALiBi flags trained one model averaged from
    different computations, silently; now each worker stops before training, in one line,
    with status 1 (not gloo's abort at the interpreter's exit: status -6 and a last line of
    "terminate called without an active exception", seen once in a loaded run)."""
    results = train_distributed("lm", tiny_lm_data, alibi_user_dir, tmp_path, "--max-update", 2,
                                rank_extra={1: ["--alibi-window-cutoff", 8]}, expect_ok=False)
    for status, out in results:
        assert status == 1 and last_line(out).endswith(  # torch prefixes "[rankN]: "
            "OneLineError: worker 1 has --alibi-window-cutoff 8.0, worker 0 0.0: the workers "
            "would train one model that none of them describes; give every worker the same "
            "options"), out[-3000:]
    assert not list(tmp_path.glob("checkpoint*.pt"))


def test_only_a_fairseq_train_worker_ends_the_process_on_a_refusal(tmp_path, monkeypatch):
    """A refusal ends the process itself only in a worker that fairseq-train runs with
    --distributed-no-spawn; a Python caller with a process group of its own, or fairseq's
    spawned workers (their parent reports the exception), get the exception back."""
    import sys
    from types import SimpleNamespace

    import torch.distributed as dist

    from fairseq_alibi.error_hints import OneLineError
    from fairseq_alibi.exit_cleanup import exit_refusing_worker

    def trainer(no_spawn):
        return SimpleNamespace(cfg={"distributed_training": {"distributed_no_spawn": no_spawn}})

    # init_process_group wraps sys.excepthook for good ([rankN]: prefixes): restored after
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0,
                            world_size=1)
    try:
        assert exit_refusing_worker(OneLineError("refused"), trainer(True)) is None  # pytest
        monkeypatch.setattr(sys, "argv", ["/venv/bin/fairseq-train", "data"])
        assert exit_refusing_worker(OneLineError("refused"), trainer(False)) is None  # spawned
    finally:
        dist.destroy_process_group()


def test_encoder_two_workers_train_like_one_process(tmp_path, tiny_lm_data, alibi_user_dir):
    from fairseq import checkpoint_utils

    single, dist = tmp_path / "single", tmp_path / "distributed"
    single_out = train("encoder", tiny_lm_data, alibi_user_dir, single, *SAVE_EVERY,
                       "--update-freq", WORLD, "--max-update", 4)
    dist_out = train_distributed("encoder", tiny_lm_data, alibi_user_dir, dist, *SAVE_EVERY,
                                 "--max-update", 4, ddp_backend="no_c10d")
    assert logged_losses(dist_out) == logged_losses(single_out)
    a, b = load(dist / "checkpoint_last.pt"), load(single / "checkpoint_last.pt")
    assert_same_training(a, b)
    assert "encoder.sentence_encoder.alibi.slopes" in a["model"]
    # the distributed checkpoint loads in one process with fairseq's own loader
    (model,), _, task = checkpoint_utils.load_model_ensemble_and_task([str(dist / "checkpoint_last.pt")])
    (reference,), _, _ = checkpoint_utils.load_model_ensemble_and_task([str(single / "checkpoint_last.pt")])
    tokens = torch.randint(4, len(task.source_dictionary), (2, 40))  # beyond 16: no limit
    with torch.no_grad():
        out, ref = model.eval()(tokens)[0], reference.eval()(tokens)[0]
    assert torch.isfinite(out).all() and torch.allclose(out, ref, atol=1e-5, rtol=0)


def test_the_checkpoint_rank_0_sends_to_the_other_ranks_loads_safely(single_lm):
    """fairseq's trainer reads a checkpoint on rank 0 and sends it to the other ranks with
    torch.save/torch.load (weights_only since torch 2.6): the payload holds the OmegaConf
    config, which fairseq_alibi.safe_loading allow-lists, else no distributed run could resume."""
    import io

    from fairseq import checkpoint_utils
    from fairseq.distributed.utils import _split_tensors_from_obj

    state = checkpoint_utils.load_checkpoint_to_cpu(str(single_lm[0] / "checkpoint_last.pt"))
    payload = io.BytesIO()
    torch.save(_split_tensors_from_obj(state, []), payload)  # what rank 0 sends
    payload.seek(0)
    received = torch.load(payload, map_location="cpu")  # what the other ranks do
    assert received["cfg"].model._name == "alibi_transformer_lm"


def test_set_world_size_refuses_a_position_the_workers_cannot_split(single_lm, tmp_path):
    from fairseq_alibi.cli.checkpoints import CheckpointError

    shutil.copy(single_lm[0] / "checkpoint_1_4.pt", tmp_path / "checkpoint_last.pt")
    before = (tmp_path / "checkpoint_last.pt").read_bytes()
    assert set_world_size(tmp_path, 1).startswith("nothing to do")
    with pytest.raises(CheckpointError, match="after 8 batches of epoch 1, which 3 workers cannot "
                                              "split evenly.*--reset-dataloader"):
        set_world_size(tmp_path, 3)
    assert (tmp_path / "checkpoint_last.pt").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_last.pt"]


def test_set_world_size_of_a_model_with_no_training_position(tmp_path):
    """A converted or imported model (no ``train_iterator`` in its extra state) was a
    ``KeyError`` traceback; nothing to do: any number of workers starts it anew."""
    from tests.helpers.cli import REPO

    saved = REPO / "tests" / "fixtures" / "saved_models" / "lm_fixed_slopes" / "checkpoint.pt"
    shutil.copy(saved, tmp_path / "checkpoint_last.pt")
    assert set_world_size(tmp_path, 2) == (
        "nothing to do: checkpoint_last.pt holds no position in an epoch (not saved by "
        "fairseq-train's training loop): any number of workers starts it at the first batch")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_last.pt"]
