"""experiments/slope_windows.py: the lost attention mass against a float64 reference (padded
queries left out), the recommendation rule, the flags of every family, and ``--smoke`` of every
family end to end (slow): the quickstart LM and the WikiText-2 LM through fairseq-train and
fairseq-eval-lm, an encoder of the encoder study through its pretraining and masked-LM scoring,
a translation model through fairseq-train and fairseq-generate."""

import csv
import json

import pytest
import torch

from experiments import slope_windows as experiment
from fairseq_alibi.alibi import variant_windows
from tests.helpers.cli import REPO, python_module


def reference_lost_mass(probs, windows, sinks=0):
    """The definition, one query at a time: the mass on keys beyond the window, but for the
    first ``sinks`` keys (attention sinks: kept)."""
    H, B, T, S = probs.shape
    worst = 0.0
    for h in range(H):
        back, ahead = windows[0][h], windows[1][h]
        for b in range(B):
            for i in range(T):
                position = i + S - T
                lost = sum(float(probs[h, b, i, j]) for j in range(sinks, S)
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
        for sinks in (1, 3, keys):  # the sinks' mass is not lost
            found = experiment.lost_masses(probs, {(cutoff, sinks): windows},
                                           sinks={(cutoff, sinks): sinks})[(cutoff, sinks)]
            assert found == pytest.approx(reference_lost_mass(probs, windows, sinks), abs=1e-7)
    unbounded = ([None] * heads, [None] * heads)
    assert experiment.lost_mass(probs, unbounded) == 0.0


def test_padded_queries_lose_nothing():
    """A padded encoder position may see no key (a one_sided head at the end of a block) and
    spread its weight evenly over every key: not a loss of any real query."""
    heads, keys = 2, 6
    probs = torch.full((heads, 2, keys, keys), 1.0 / keys)
    windows = variant_windows(torch.tensor([1.0, 0.5]), 1.0, "symmetric")
    padding = torch.zeros(2, keys, dtype=torch.bool)
    padding[1, 3:] = True
    probs[:, 0] = torch.eye(keys)  # the first row's queries see only themselves: nothing lost
    assert experiment.lost_masses(probs, {1.0: windows}, padding)[1.0] == pytest.approx(
        reference_lost_mass(probs[:, 1:, :3], windows))
    assert experiment.lost_masses(probs, {1.0: windows})[1.0] == pytest.approx(
        reference_lost_mass(probs, windows))


def test_the_smallest_cutoff_within_the_goal_at_every_length_is_named():
    rows = [{"cutoff": "T=2", "change": 0.01}, {"cutoff": "T=2", "change": 0.0},
            {"cutoff": "T=4", "change": -0.0005}, {"cutoff": "T=4", "change": 0.0009},
            {"cutoff": "T=8", "change": 0.0}, {"cutoff": "T=8", "change": 0.0}]
    assert experiment.smallest_within_goal(rows, [8, 2, 4]) == 4
    assert experiment.smallest_within_goal(rows[:2], [2]) is None


def test_blocks_whose_weights_exceed_the_budget_are_reported_not_measured():
    assert experiment.mass_measurable(8192, 8) and not experiment.mass_measurable(16384, 8)
    rows = [{"cutoff": name, "T": t, "S": 0, "length": 64, "tokens": 100, "perplexity": 10.0,
             "change": 0.0, "tokens_per_s": 1.0, "speed_vs_dense": 1.0, "lost_mass": None}
            for name, t in (("off", None), ("off (again)", None), ("T=4", 4.0))]
    tables = experiment.report_tables(rows, [(4.0, 0)], [64], 16)
    assert "| T=4 | not measured |" in tables.replace("  ", " ")


def test_flags():
    args = experiment.parse_args([])
    assert args.cutoffs == [2, 4, 6, 8, 12, 16] and args.multiples == [1, 2, 4, 8, 16, 64]
    assert args.L == 64 and args.max_update == 1000
    args = experiment.parse_args(["--cutoffs", "8,4,8", "--multiples", "1,16", "--L", "32"])
    assert args.cutoffs == [4.0, 8.0] and args.multiples == [1, 16]
    assert experiment.label(None) == "off" and experiment.label(8.0) == "T=8"
    assert experiment.label(8.0, 4) == "T=8 S=4" and args.sinks == [0]
    assert experiment.parse_args(["--sinks", "4,0,1"]).sinks == [0, 1, 4]
    args = experiment.parse_args(["--family", "encoder"])
    assert (args.L, args.multiples, args.heldout_lines) == (32, [1, 4, 16], 400)
    assert args.out == "outputs/slope_windows_encoder" and args.variants == ["offset", "one_sided"]
    args = experiment.parse_args(["--family", "translation", "--smoke"])
    assert (args.L, args.per_bucket, args.cutoffs) == (16, 3, [4.0])
    assert experiment.parse_args(["--family", "wikitext2"]).multiples == [1, 4, 16]
    for bad in (["--cutoffs", "0"], ["--cutoffs", "x"], ["--checkpoint", "model.pt"],
                ["--family", "encoder", "--checkpoint", "m.pt", "--data", "d"],
                ["--family", "decoder"], ["--sinks", "-1"],
                ["--family", "encoder", "--sinks", "4"]):
        with pytest.raises(SystemExit):
            experiment.parse_args(bad)


@pytest.mark.slow
def test_smoke_runs_every_step(tmp_path):
    out = tmp_path / "out"
    python_module("experiments.slope_windows", "--smoke", "--out", out, "--sample-tokens", "128",
                  timeout=900)
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


def smoke(tmp_path, family, *extra):
    """``--smoke --family family``: its output folder, the CSV's rows and the run record."""
    out = tmp_path / family
    python_module("experiments.slope_windows", "--smoke", "--family", family, "--out", out,
                  "--sample-tokens", "128", *extra, timeout=900)
    with open(out / "slope_windows.csv") as f:
        rows = list(csv.DictReader(f))
    return out, rows, json.loads((out / "run.json").read_text())


@pytest.mark.slow
def test_smoke_of_the_wikitext2_lm(tmp_path):
    if not (REPO.parent / "shared" / "data" / "wikitext-2").is_dir():
        pytest.skip("WikiText-2 is not at ../shared/data/wikitext-2")
    out, rows, record = smoke(tmp_path, "wikitext2")
    assert [(r["cutoff"], r["length"]) for r in rows] == [
        (name, length) for length in ("16", "64") for name in ("off", "T=4", "off (again)")]
    assert record["lengths"] == [16, 64] and len({r["tokens"] for r in rows}) == 1
    for row in (r for r in rows if r["T"]):
        assert 0.0 <= float(row["lost_mass"]) < 1.0
    report = (out / "slope_windows.md").read_text()
    assert "the wikitext2 LM" in report and "6 updates" in report


@pytest.mark.slow
def test_smoke_of_an_encoder(tmp_path):
    if not (REPO.parent / "shared" / "data" / "wikitext-2").is_dir():
        pytest.skip("WikiText-2 is not at ../shared/data/wikitext-2")
    out, rows, record = smoke(tmp_path, "encoder")
    assert [(r["variant"], r["cutoff"], r["length"]) for r in rows] == [
        (variant, name, length) for variant in ("offset", "one_sided")
        for length in ("16", "64") for name in ("off", "T=4")]
    for row in rows:
        assert float(row["perplexity"]) > 1 and int(row["masked_tokens"]) > 0
        # one_sided's heads each look one way: the way they do not look loses nothing
        assert not row["T"] or 0.0 <= float(row["lost_mass"]) < 0.5
    assert record["variants"] == ["offset", "one_sided"]
    assert "masked-lm perplexity" in (out / "slope_windows.md").read_text().lower()


@pytest.mark.slow
def test_smoke_of_a_translation_model(tmp_path):
    out, rows, record = smoke(tmp_path, "translation", "--sinks", "0,2")
    buckets = ["9-16 (N)", "17-32 (2N)", "33-64 (4N)", "65-128 (8N)", "all"]
    assert [(r["cutoff"], r["length"]) for r in rows] == [
        (name, bucket) for name in ("off", "T=4", "T=4 S=2") for bucket in buckets]
    for row in rows:
        assert float(row["bleu"]) >= 0 and int(row["tokens"]) >= 1
        assert not row["T"] or 0.0 <= float(row["lost_mass"]) <= 1.0
    assert record["N"] == 16 and record["cutoffs"] == [4.0] and record["sinks"] == [0, 2]
    logs = sorted(p.name for p in (out / "generate").glob("*.log"))
    assert logs == ["T4.log", "T4_S2.log", "off.log"]
    assert "encoder_alibi_window_cutoff" in (out / "generate" / "T4.json").read_text()
