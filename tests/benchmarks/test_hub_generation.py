"""``python -m benchmarks.hub_generation --smoke`` runs end to end (toy sizes), so it cannot rot:
800 tokens through the hub's ``generate``, a row per eighth. No timing is asserted (the figures
of a smoke run mean nothing)."""

import os
import subprocess
import sys

import pytest

from tests.helpers.cli import REPO

pytestmark = pytest.mark.slow


def test_the_smoke_run_generates_every_token_and_writes_its_table():
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.hub_generation", "--smoke"],
                          capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-6000:]
    out = proc.stdout
    assert "Command: `python -m benchmarks.hub_generation --smoke`" in out
    assert "800 tokens generated through from_pretrained(...).generate (beam 1)" in out
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
            if line.startswith("| ")][1:]
    assert [r[0] for r in rows] == [str(100 * i) for i in range(1, 9)]
    assert all(float(r[1]) > 0 and float(r[3]) > 0 for r in rows), rows
    bad = subprocess.run([sys.executable, "-m", "benchmarks.hub_generation", "--dims", "2,130,8"],
                         capture_output=True, text=True, env=env, timeout=120, cwd=REPO)
    assert bad.returncode == 2 and "--dims '2,130,8'" in bad.stderr.strip().splitlines()[-1]
