"""``fairseq-alibi quickstart --window-cutoff T [T ...]``: the flag, its rows and their tokens/s
table (the end-to-end run is tests/cli/test_quickstart.py's smoke)."""

from pathlib import Path

import pytest

from fairseq_alibi.cli import quickstart
from fairseq_alibi.cli.sweep import SweepPoint, SweepResult


def test_cutoffs_are_sorted_once_each_and_off_by_default():
    assert quickstart.parse_args([]).window_cutoff == []
    assert quickstart.parse_args(["--window-cutoff", "8", "4", "8"]).window_cutoff == [4.0, 8.0]


@pytest.mark.parametrize("bad", ["0", "-1", "inf", "nan", "eight"])
def test_a_cutoff_that_is_not_a_finite_positive_number_is_refused(bad, capsys):
    with pytest.raises(SystemExit):
        quickstart.parse_args(["--window-cutoff", bad])
    error = capsys.readouterr().err
    assert "--window-cutoff" in error and "finite number of nats > 0" in error


def test_each_cutoff_is_a_row_of_the_alibi_checkpoint_with_the_load_time_override():
    models = quickstart.window_models("alibi.pt", [4.0, 8.0])
    assert list(models) == ["ALiBi T=4", "ALiBi T=8"]
    assert {m.path for m in models.values()} == {"alibi.pt"}
    assert models["ALiBi T=8"].overrides(512) == {"alibi_window_cutoff": 8.0}
    assert models["ALiBi T=4"].overrides(64) == {"alibi_window_cutoff": 4.0}


def _point(tmp_path: Path, model: str, length: int, per_second: float) -> SweepPoint:
    log = tmp_path / f"{model.replace(' ', '_').replace('=', '')}_{length}.log"
    log.write_text(f"INFO:fairseq_cli.eval_lm:Evaluated 1,000 tokens in 0.5s "
                   f"({per_second:.2f} tokens/s)\n")
    return SweepPoint(model, "nonoverlapping", length, 0, 1000, 1000, 1.0, 2.0, 1.0, str(log))


def test_the_speed_table_gives_each_row_against_the_dense_row(tmp_path):
    speeds = {("ALiBi", 64): 1000.0, ("ALiBi", 128): 800.0,
              ("ALiBi T=8", 64): 500.0, ("ALiBi T=8", 128): 1200.0}
    points = [_point(tmp_path, m, n, v) for (m, n), v in speeds.items()]
    result = SweepResult(points, ["ALiBi", "ALiBi T=8"], [64, 128], ["nonoverlapping"],
                         tmp_path, train_length=64)
    table = quickstart.window_speed_table(result, [8.0])
    assert "| model | 64 (L) | 128 |" in table
    assert "| ALiBi | 1,000 | 800 |" in table
    assert "| ALiBi T=8 | 500 (0.50×) | 1,200 (1.50×) |" in table
    assert quickstart.eval_tokens_per_second(points[0].log) == 1000.0
    (tmp_path / "failed.log").write_text("Traceback ...")
    assert quickstart.eval_tokens_per_second(tmp_path / "failed.log") is None


def test_without_the_optional_packages_nothing_measured_is_lost(tmp_path, monkeypatch, caplog):
    """matplotlib missing: the table and CSV are written, the figure is skipped with a warning
    (it failed after the whole run); sentencepiece missing: the quickstart stops before any
    work, naming the extra to install."""
    import sys

    from fairseq_alibi.cli import sweep

    points = [_point(tmp_path, "ALiBi", n, 1000.0) for n in (64, 128)]
    result = SweepResult(points, ["ALiBi"], [64, 128], ["nonoverlapping"], tmp_path / "out",
                         train_length=64)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    files = sweep.write_outputs(result)
    assert set(files) == {"csv", "markdown"} and all(p.is_file() for p in files.values())
    assert "no extrapolation.png: matplotlib is not installed" in caplog.text
    monkeypatch.setitem(sys.modules, "sentencepiece", None)
    with pytest.raises(SystemExit, match="needs the sentencepiece package: pip install "
                                         "'fairseq-alibi\\[examples\\]'"):
        quickstart.main(["--out", str(tmp_path / "quickstart")])
    assert not (tmp_path / "quickstart").exists()
