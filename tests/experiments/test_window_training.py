"""experiments/window_training.py: the seed-noise rule, the flags, the speed measurement at a
toy size, and ``--smoke`` end to end through fairseq-train and fairseq-eval-lm (slow)."""

import json

import pytest

from experiments import window_training as experiment


def rows(values):
    """``{(setting, seed): perplexity}`` as the rows of one split."""
    return [{"setting": s, "seed": seed, "split": "test", "perplexity": p, "tokens": 100}
            for (s, seed), p in values.items()]


def test_a_difference_within_the_seeds_spread_is_within_the_noise():
    found = rows({("off", 1): 10.0, ("off", 2): 11.0, ("off", 3): 12.0,
                  ("T=8", 1): 10.5, ("T=8", 2): 11.5, ("T=8", 3): 11.9})
    summary = experiment.summarise(found, "test", "T=8", "off")
    assert summary["median"] == 11.5 and summary["spread"] == pytest.approx(1.4)
    assert summary["difference"] == pytest.approx(0.5)
    assert summary["paired"] == pytest.approx({1: 0.5, 2: 0.5, 3: -0.1})
    assert summary["noise"] == pytest.approx(2.0) and summary["within_noise"]


def test_a_difference_beyond_the_seeds_spread_is_not():
    found = rows({("off", 1): 10.0, ("off", 2): 10.1, ("T=8", 1): 11.0, ("T=8", 2): 11.2})
    summary = experiment.summarise(found, "test", "T=8", "off")
    assert summary["difference"] == pytest.approx(1.05) and not summary["within_noise"]
    assert summary["relative"] == pytest.approx(11.1 / 10.05 - 1)


def test_flags():
    args = experiment.parse_args([])
    assert (args.cutoffs, args.seeds, args.max_update, args.L, args.speed_length) == (
        [8.0], [1, 2, 3], experiment.MAX_UPDATE, 64, 4096)
    assert args.splits == ("valid", "test")
    assert experiment.parse_args(["--cutoffs", "8,4"]).cutoffs == [4.0, 8.0]
    for bad in (["--cutoffs", "0"], ["--cutoffs", "inf"], ["--cutoffs", "x"], ["--seeds", "1"],
                ["--rounds", "0"]):
        with pytest.raises(SystemExit):
            experiment.parse_args(bad)


def test_settings_pass_the_cutoff_to_fairseq_train():
    assert experiment.settings([4.0, 8.0]) == {
        "off": [], "T=4": ["--alibi-window-cutoff", "4"], "T=8": ["--alibi-window-cutoff", "8"]}


def test_speed_times_both_steps_and_the_attention_alone(tmp_path):
    speed = experiment.measure_speed(32, 2.0, experiment.SMOKE_SPEED_DIMS, 1, tmp_path,
                                     log=lambda msg: None)
    for name in ("step off", "step T=2", "attention off", "attention T=2"):
        assert speed["seconds"][name] > 0
    assert speed["speedup"] > 0 and speed["bound"] == pytest.approx(
        1 / (1 - speed["share off"]))
    assert "Step speed-up with T=2" in experiment.speed_report(speed)


@pytest.mark.slow
def test_smoke_trains_dense_and_windowed_over_seeds(tmp_path):
    out = tmp_path / "out"
    assert experiment.main(["--smoke", "--out", str(out), "--rounds", "1"]) == 0
    report = (out / "window_training.md").read_text()
    assert "python -m experiments.window_training --smoke" in report
    record = json.loads((out / "run.json").read_text())
    found = {(r["setting"], r["seed"]): r for r in record["rows"]}
    assert set(found) == {(s, seed) for s in ("off", "T=2") for seed in (1, 2)}
    assert len({r["tokens"] for r in record["rows"]}) == 1  # the same tokens every run
    # the cutoff's window (8 keys for the steepest head) is shorter than L = 16: it changes
    # the trained model, so the same seed gives another perplexity
    assert found["T=2", 1]["perplexity"] != found["off", 1]["perplexity"]
    for seed in (1, 2):
        log = (out / "logs" / f"train_T2_seed{seed}.log").read_text()
        assert "--alibi-window-cutoff 2" in log.splitlines()[0]
    assert "| test | T=2 |" in report and "Step speed-up with T=2" in report
