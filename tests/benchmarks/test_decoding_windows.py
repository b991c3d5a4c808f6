"""``python -m benchmarks.decoding_windows --smoke`` runs end to end (toy sizes), so it cannot
rot: its table has a row per checkpoint, the bounded model's KV cache (attention sinks kept
too) stops growing at its bound while the dense one's grows, and its generated tokens pass the
equality check. No timing
is asserted (the figures of a smoke run mean nothing)."""

import os
import subprocess
import sys

import pytest

from tests.helpers.cli import REPO

#: a generation of 512 tokens per model, three times (side by side, then each for its RSS)
pytestmark = pytest.mark.slow


def run(*flags):
    """``(process, table rows)`` of ``python -m benchmarks.decoding_windows FLAGS``, 1 thread."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.decoding_windows", *flags],
                          capture_output=True, text=True, env=env, timeout=900, cwd=REPO)
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in proc.stdout.splitlines()
            if line.startswith("| ")][1:]
    return proc, rows


def test_the_smoke_run_writes_its_table_and_the_bounded_cache_stays_flat():
    proc, rows = run("--smoke", "--sinks", "2")
    assert proc.returncode == 0, proc.stderr[-6000:]
    out = proc.stdout
    assert "Command: `python -m benchmarks.decoding_windows --smoke --sinks 2`" in out
    assert [r[0] for r in rows] == ["64", "128", "256", "512"]
    assert all(float(x) > 0 for r in rows for x in r[1:4]), rows
    bounded, dense = [float(r[4]) for r in rows], [float(r[5]) for r in rows]
    assert bounded[2] == bounded[3] and dense[3] > dense[2] > bounded[3], rows
    assert "max_h W_h = 128 keys, plus 2 attention sinks (its cache's bound: 130 keys)" in out
    assert "its KV cache is constant" in out
    aged = float(out.split("median of 64 pairs: ")[1].split(".\n")[0])
    assert aged > 0, out
    assert "Equality: 512 of the first 512 generated tokens" in out and "(all)" in out


def test_the_attention_steps_smoke_run_writes_a_ratio_per_case():
    proc, rows = run("--attention-steps", "--smoke")
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert [tuple(r[:3]) for r in rows] == [(d, b, s) for d in ("16", "64") for b in ("1", "5")
                                             for s in ("65", "257")]
    assert all(float(r[4]) > 0 and r[5] in ("sdpa", "windowed") for r in rows), rows
    assert rows[0][3] == "80", rows  # 1 row of 65 keys: windows 16 and 32 skip 48 + 32 keys


def test_the_beam_search_smoke_run_holds_the_dense_models_cache():
    """A short beam search, windows wider than the generation: the bounded model's KV buffers
    hold what the dense model's do (they had held the whole bound from the first step)."""
    proc, rows = run("--beam-search", "--smoke", "--sinks", "2")
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert len(rows) == 1 and rows[0][:3] == ["10", "4", "20"], rows
    assert float(rows[0][3]) > 0 and rows[0][4] == rows[0][5] != "0", rows


def test_the_sinks_cost_smoke_run_writes_a_ratio_per_segment():
    """A long generation with sinks against the same model without, side by side: a paired
    ratio per segment, past the point where the cache keeps its sinks apart; --sinks needed;
    with a document mask too (the sinks each document's first positions)."""
    proc, rows = run("--sinks-cost", "--smoke", "--sinks", "2")
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert [r[0] for r in rows] == ["64", "128", "256", "512"] and all(
        float(r[1]) > 0 for r in rows), rows
    refused, _ = run("--sinks-cost", "--smoke")
    assert refused.returncode == 2 and "--sinks-cost needs --sinks S" in refused.stderr
    documents, rows = run("--sinks-cost", "--smoke", "--sinks", "2", "--document-mask", "eos")
    assert documents.returncode == 0 and "--alibi-document-mask eos" in documents.stdout, (
        documents.stderr[-6000:])
    assert len(rows) == 4 and all(float(r[1]) > 0 for r in rows), rows
    ignored, _ = run("--smoke", "--document-mask", "eos")
    assert ignored.returncode == 2 and "--document-mask is read by --sinks-cost" in ignored.stderr


def test_the_step_backends_smoke_run_times_each_backend_against_sdpa():
    proc, rows = run("--step-backends", "--smoke", "--sinks", "2")
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert [r[0] for r in rows] == ["sdpa", "windowed", "auto", "windowed, sinks joined"], rows
    assert rows[0][2] == "1.000" and all(float(r[1]) > 0 < float(r[2]) for r in rows), rows
    for dims in ("2,130,8", "2,x,8", "2,128"):
        proc, _ = run("--step-backends", "--dims", dims)
        assert proc.returncode == 2 and "--dims takes L,D,H" in proc.stderr, proc.stderr
    for flags, said in ((("--tokens", "50"), "--tokens must exceed 192"),
                        (("--tokens", "0"), "--tokens must be 1 or more"),
                        (("--cutoff", "-1"), "--cutoff must be a positive finite number")):
        proc, _ = run("--step-backends", "--smoke", *flags)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr
