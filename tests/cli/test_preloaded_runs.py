"""A fairseq command forked from the preload server (``FAIRSEQ_ALIBI_FORKSERVER=1``, what the
tests run) does what the same command does in a new interpreter: the same checkpoint bit for
bit, the same losses, the same refusal and exit code, this package's models unknown without
``--user-dir``; a timeout kills it."""

import os
import subprocess
import time

import pytest

from fairseq_alibi.cli import fairseq_runs
from tests.helpers.checkpoints import load, max_weight_difference
from tests.helpers.cli import BIN, child_env
from tests.helpers.training import logged_losses, train_args

pytestmark = pytest.mark.slow


def _run(tool, args, forked, **kwargs):
    env = child_env(FAIRSEQ_ALIBI_FORKSERVER="1" if forked else "0")
    return fairseq_runs.run([str(BIN / tool)] + [str(a) for a in args], env, **kwargs)


def test_a_forked_run_equals_a_new_interpreters(tmp_path, tiny_lm_data, alibi_user_dir):
    runs = {}
    for forked in (False, True):
        save = tmp_path / f"forked_{forked}"
        proc = _run("fairseq-train", train_args("lm", tiny_lm_data, alibi_user_dir, save,
                                                "--max-update", 4), forked)
        assert proc.returncode == 0, proc.stdout[-3000:]
        runs[forked] = (logged_losses(proc.stdout), load(save / "checkpoint_last.pt"))
    assert len(runs[False][0]) == 4 and runs[False][0] == runs[True][0]
    assert max_weight_difference(runs[False][1], runs[True][1]) == 0


def test_a_refusal_is_the_same_and_the_package_is_not_preloaded(tiny_lm_data, tmp_path):
    # no --user-dir: stock fairseq does not know alibi_transformer_lm, forked or not
    args = [tiny_lm_data, "--task", "language_modeling", "--arch", "alibi_transformer_lm",
            "--save-dir", tmp_path]
    answers = [_run("fairseq-train", args, forked) for forked in (False, True)]
    assert [a.returncode for a in answers] == [2, 2]
    last = [a.stdout.strip().splitlines()[-1] for a in answers]
    assert last[0] == last[1] and "invalid choice: 'alibi_transformer_lm'" in last[0]


def test_a_timeout_kills_the_forked_command(tmp_path, tiny_lm_data, alibi_user_dir):
    args = train_args("lm", tiny_lm_data, alibi_user_dir, tmp_path, "--max-update", 10**6)
    env = child_env(FAIRSEQ_ALIBI_FORKSERVER="1")
    started = fairseq_runs.start([str(BIN / "fairseq-train")] + [str(a) for a in args], env,
                                 tmp_path / "log")
    with pytest.raises(subprocess.TimeoutExpired):
        started.wait(timeout=3)
    with pytest.raises(ProcessLookupError):  # gone (the server's handler reaped it)
        for _ in range(100):
            os.kill(started.pid, 0)
            time.sleep(0.1)
