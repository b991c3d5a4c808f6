"""Session-wide fixtures: tiny corpora written by the tests, and a tiny LM trained on one (helpers
are in ``tests/helpers/``)."""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    # tests/run.sh runs one worker per core: each worker, and each tool a test starts, gets one
    # thread, so that two workers do not fight over the same cores
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"

# the fairseq commands the tests and the tools they start run are forked from one process that
# imported fairseq once (fairseq_alibi.cli.fairseq_runs): hundreds of tiny runs, seconds of
# imports each; tests/cli/test_preloaded_runs.py checks a forked run equals a new interpreter's
os.environ.setdefault("FAIRSEQ_ALIBI_FORKSERVER", "1")

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

from tests.helpers.cli import preprocess, user_dir
from tests.helpers.corpora import write_tiny_corpus
from tests.helpers.training import train


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: runs fairseq's real command lines end to end (deselect with -m 'not slow' for the "
        "fast in-process half)",
    )


#: files whose end-to-end runs take the longest (experiment and benchmark smoke runs): run first,
#: so that the workers do not wait on one of them at the end (pytest-xdist hands out files in
#: collection order)
LONGEST_FIRST = ("tests/translation/test_translation_length.py", "tests/experiments/",
                 "tests/benchmarks/")


def pytest_collection_modifyitems(session, config, items):
    def rank(item):
        path = item.nodeid.split("::")[0]
        return next((i for i, start in enumerate(LONGEST_FIRST) if path.startswith(start)),
                    len(LONGEST_FIRST))
    items.sort(key=rank)  # stable: the order within each group is pytest's


@pytest.fixture(scope="session")
def alibi_user_dir():
    return user_dir()


@pytest.fixture(scope="session")
def tiny_lm_data(tmp_path_factory):
    """A binarized word-level corpus for language_modeling / masked_lm tasks."""
    root = tmp_path_factory.mktemp("tiny_lm")
    write_tiny_corpus(root / "raw")
    preprocess(  # fairseq-preprocess's own main, in this process
        "--only-source",
        "--trainpref", root / "raw/train.txt", "--validpref", root / "raw/valid.txt",
        "--testpref", root / "raw/test.txt", "--destdir", root / "bin", "--workers", "1",
    )
    return root / "bin"


@pytest.fixture(scope="session")
def trained_lm_checkpoint(tmp_path_factory, tiny_lm_data, alibi_user_dir):
    """``checkpoint_last.pt`` of the tiny LM after 2 updates of fairseq-train (tests read it or
    copy it, never change it)."""
    save = tmp_path_factory.mktemp("trained_lm")
    train("lm", tiny_lm_data, alibi_user_dir, save, "--max-update", 2)
    return save / "checkpoint_last.pt"
