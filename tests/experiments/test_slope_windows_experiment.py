"""experiments/slope_windows.py: the lost attention mass against a float64 reference, the
recommendation rule, the flags, and ``--smoke`` end to end through fairseq-train and
fairseq-eval-lm (slow)."""

import csv
import json
import os
import subprocess
import sys

import pytest
import torch

from experiments import slope_windows as experiment
from fairseq_alibi.alibi import variant_windows
from tests.helpers.cli import REPO


def reference_lost_mass(probs, windows):
    """The definition, one query at a time: the mass on keys beyond the window."""
    H, B, T, S = probs.shape
    worst = 0.0
    for h in range(H):
        back, ahead = windows[0][h], windows[1][h]
        for b in range(B):
            for i in range(T):
                position = i + S - T
                lost = sum(float(probs[h, b, i, j]) for j in range(S)
                           if (back is not None and position - j > back)
                           or (ahead is not None and j - position > ahead))
                worst = max(worst, lost)
    return worst


@pytest.mark.parametrize("variant", ["causal", "symmetric", "one_sided"])
@pytest.mark.parametrize("queries", [9, 4])
def test_lost_mass_is_the_largest_mass_beyond_a_window(variant, queries):
    generator = torch.Generator().manual_seed(0)
    heads, keys = 4, 9
    probs = torch.softmax(torch.randn(heads, 2, queries, keys, generator=generator), -1)
    slopes = torch.tensor([1.0, 0.5, 0.25, 0.0])  # the last head has no bias: no window
    for cutoff in (0.5, 1.0, 2.0):
        windows = variant_windows(slopes, cutoff, variant)
        assert experiment.lost_mass(probs, windows) == pytest.approx(
            reference_lost_mass(probs, windows), abs=1e-7)
    unbounded = ([None] * heads, [None] * heads)
    assert experiment.lost_mass(probs, unbounded) == 0.0


def test_the_smallest_cutoff_within_the_goal_at_every_length_is_named():
    rows = [{"cutoff": "T=2", "change": 0.01}, {"cutoff": "T=2", "change": 0.0},
            {"cutoff": "T=4", "change": -0.0005}, {"cutoff": "T=4", "change": 0.0009},
            {"cutoff": "T=8", "change": 0.0}, {"cutoff": "T=8", "change": 0.0}]
    assert experiment.smallest_within_goal(rows, [8, 2, 4]) == 4
    assert experiment.smallest_within_goal(rows[:2], [2]) is None


def test_flags():
    args = experiment.parse_args([])
    assert args.cutoffs == [2, 4, 6, 8, 12, 16] and args.multiples == [1, 2, 4, 8, 16, 64]
    assert args.L == 64 and args.max_update == 1000
    args = experiment.parse_args(["--cutoffs", "8,4,8", "--multiples", "1,16", "--L", "32"])
    assert args.cutoffs == [4.0, 8.0] and args.multiples == [1, 16]
    assert experiment.label(None) == "off" and experiment.label(8.0) == "T=8"
    for bad in (["--cutoffs", "0"], ["--cutoffs", "x"], ["--checkpoint", "model.pt"]):
        with pytest.raises(SystemExit):
            experiment.parse_args(bad)


@pytest.mark.slow
def test_smoke_runs_every_step(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "experiments.slope_windows", "--smoke",
                           "--out", str(out), "--sample-tokens", "128"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    with open(out / "slope_windows.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["cutoff"], r["length"]) for r in rows] == [
        (name, length) for length in ("16", "64") for name in ("off", "T=4", "off (again)")]
    assert len({r["tokens"] for r in rows}) == 1  # every run scored every test token
    for row in (r for r in rows if r["T"]):
        assert 0.0 <= float(row["lost_mass"]) < 1.0 and float(row["tokens_per_s"]) > 0
    record = json.loads((out / "run.json").read_text())
    assert record["cutoffs"] == [4.0] and record["lengths"] == [16, 64]
    assert "Choosing the slope-window cutoff T" in (out / "slope_windows.md").read_text()
