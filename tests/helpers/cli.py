"""Running fairseq's real command lines (its console scripts, ``python -m``, the in-process
fairseq-preprocess) in this environment, and reading what they printed and wrote."""

import functools
import os
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]  # tests/helpers/cli.py -> the repository


SHARED_DATA = REPO.parent / "shared" / "data"


BIN = Path(sys.executable).parent  # fairseq-* console scripts of this environment


@functools.cache
def user_dir() -> str:
    """What users pass to --user-dir (``python -m fairseq_alibi --user-dir``), asked once per
    test process (each ask starts an interpreter that imports fairseq)."""
    out = subprocess.run(
        [sys.executable, "-m", "fairseq_alibi", "--user-dir"],
        check=True, capture_output=True, text=True,
    )
    return out.stdout.strip().splitlines()[-1]


def child_env(**extra):
    return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                **extra)


def run_cli(tool, *args, cwd=None, expect_ok=True, timeout=600, env=None):
    """Run a fairseq console script (``fairseq-train`` ...) and return its combined output
    (forked from the preload server when the tests set ``FAIRSEQ_ALIBI_FORKSERVER=1``:
    :mod:`fairseq_alibi.cli.fairseq_runs`)."""
    # imported here: a test may import these helpers beside an earlier release of the package
    from fairseq_alibi.cli import fairseq_runs

    cmd = [str(BIN / tool)] + [str(a) for a in args]
    full_env = child_env()
    full_env.update(env or {})  # may override child_env's own variables
    proc = fairseq_runs.run(cmd, full_env, cwd=cwd, timeout=timeout)
    out = proc.stdout
    if expect_ok and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-6000:]}")
    if not expect_ok and proc.returncode == 0:
        raise AssertionError(f"{' '.join(cmd)} was expected to fail:\n{out[-3000:]}")
    return out


def python_module(*args, expect_ok=True, timeout=600):
    """``python -m ...`` in this environment, from the repository root with it on the path (the
    ``experiments`` and ``benchmarks`` packages); returns (exit code, combined output)."""
    proc = subprocess.run([sys.executable, "-m", *[str(a) for a in args]], cwd=REPO,
                          env=child_env(PYTHONPATH=str(REPO)), capture_output=True, text=True,
                          timeout=timeout)
    out = proc.stdout + proc.stderr
    if expect_ok:
        assert proc.returncode == 0, out[-3000:]
    return proc.returncode, out


def preprocess(*args):
    """fairseq-preprocess in this process: the CLI's own parser and ``main``, for data that is
    not what a test is about (the per-call log file handler it adds is removed again)."""
    import logging

    from fairseq import options
    from fairseq_cli.preprocess import main

    log = logging.getLogger("fairseq_cli.preprocess")
    before = list(log.handlers)
    try:
        main(options.get_preprocessing_parser().parse_args([str(a) for a in args]))
    finally:
        for handler in log.handlers[len(before):]:
            log.removeHandler(handler)
            handler.close()


def last_line(output):
    """The last non-empty line a command printed (where the plugin puts its one-line fix)."""
    return output.strip().splitlines()[-1]


def snapshot(folder):
    """Name -> bytes of every file in ``folder``: equal before and after = nothing written."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
