"""Shared fixtures: tiny corpora written by the tests, and a runner for fairseq's real CLIs."""

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
BIN = Path(sys.executable).parent  # fairseq-* console scripts of this environment


def user_dir() -> str:
    """What users pass to --user-dir (``python -m fairseq_alibi --user-dir``)."""
    out = subprocess.run(
        [sys.executable, "-m", "fairseq_alibi", "--user-dir"],
        check=True, capture_output=True, text=True,
    )
    return out.stdout.strip().splitlines()[-1]


def run_cli(tool, *args, cwd=None, expect_ok=True, timeout=600, env=None):
    """Run a fairseq console script (``fairseq-train`` ...) and return its combined output."""
    cmd = [str(BIN / tool)] + [str(a) for a in args]
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    full_env.update(env or {})
    proc = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env
    )
    out = proc.stdout + proc.stderr
    if expect_ok and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-6000:]}")
    if not expect_ok and proc.returncode == 0:
        raise AssertionError(f"{' '.join(cmd)} was expected to fail:\n{out[-3000:]}")
    return out


def write_tiny_corpus(folder: Path, seed=0, vocab=60, lines=(400, 60, 60), max_len=30):
    """Random-word text files train/valid/test.txt (word level), written by the test itself."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in zip(("train", "valid", "test"), lines):
        with open(folder / f"{split}.txt", "w") as f:
            for _ in range(n):
                f.write(" ".join(rng.choice(words) for _ in range(rng.randint(5, max_len))) + "\n")
    return folder


@pytest.fixture(scope="session")
def alibi_user_dir():
    return user_dir()


@pytest.fixture(scope="session")
def tiny_lm_data(tmp_path_factory):
    """A binarized word-level corpus for language_modeling / masked_lm tasks."""
    root = tmp_path_factory.mktemp("tiny_lm")
    write_tiny_corpus(root / "raw")
    run_cli(
        "fairseq-preprocess", "--only-source",
        "--trainpref", root / "raw/train.txt", "--validpref", root / "raw/valid.txt",
        "--testpref", root / "raw/test.txt", "--destdir", root / "bin", "--workers", "1",
    )
    return root / "bin"
