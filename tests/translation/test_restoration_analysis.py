"""The analysis of experiments/punctuation_restoration.py: where each output starts in its
source (docs/translation.md), counted on hand-made outputs, and ``--from-logs`` rescoring."""

import json

import pytest

from experiments import punctuation_restoration as pr
from experiments.seq2seq_runs import output_starts


def test_output_starts_counts_starts_and_finds_later_ones():
    # N=4: buckets 3-4, 5-8, 9-16, 17-32 source words
    sources = ["a b c", "a b c d e", "a b c d e f", "a b c d e f g h i j"]
    model_sources = ["@start@ a b c", "a <unk> c d e", "a b c d e f", "a b c d e f g h i j"]
    hyps = {
        0: "A b , c .",             # starts at the start (case, punctuation and marker ignored)
        1: "C d e .",               # starts 2 of 5 words in
        2: "x y z",                 # starts nowhere in the source
        3: "a , c d",               # first two words differ, first three not found
    }
    rows = output_starts(hyps, model_sources, sources, N=4)
    assert [r["bucket"] for r in rows] == ["3-4", "5-8", "9-16", "17-32"]
    assert [r["sentences"] for r in rows] == [1, 2, 1, 0]
    assert [r["starts_at_start"] for r in rows] == [1, 0, 0, 0]
    assert rows[1]["starts_further_in"] == 1 and rows[1]["median_start"] == pytest.approx(2 / 5)
    assert [r["starts_further_in"] for r in rows] == [0, 1, 0, 0]
    assert rows[2]["median_start"] is None and rows[3]["median_start"] is None
    assert [r["ends_at_end"] for r in rows] == [1, 1, 0, 0]  # "... d e ." ends as "a <unk> c d e"


def test_output_starts_compares_with_the_source_the_model_saw():
    """``<unk>`` in the model's source: an output starting ``<unk> b`` starts at the start."""
    rows = output_starts({0: "<unk> b c"}, ["<unk> b c d"], ["zebra b c d"], N=4)
    assert rows[0]["starts_at_start"] == 1


def test_from_logs_rescores_an_earlier_run(tmp_path, monkeypatch):
    monkeypatch.setattr(pr, "buckets", lambda N: [(1, 3), (4, 8)])
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "test.src").write_text("@start@ a b c\n@start@ d e f g h\n")
    (tmp_path / "results.json").write_text(json.dumps(
        {"meta": {"N": 4, "start_marker": True, "command": "earlier run"}, "results": {}}))
    (tmp_path / "generate_alibi.log").write_text(
        "S-1\t@start@ d e f g h\nT-1\tD e f g h .\nH-1\t-0.5\tF g h .\n"
        "S-0\t@start@ a b c\nT-0\tA b c .\nH-0\t-0.1\tA b c .\nTranslated 2 sentences\n")
    assert pr.main(["--from-logs", "--out", str(tmp_path), "--models", "ALiBi"]) == 0
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["meta"]["command"] == "earlier run" and "--from-logs" in saved["meta"]["rescored"]
    first, second = saved["results"]["ALiBi"]
    assert first["bleu"] == pytest.approx(100.0) and first["starts_at_start"] == 1
    assert second["starts_at_start"] == 0 and second["median_start"] == pytest.approx(2 / 5)
    table = (tmp_path / "results.md").read_text()
    assert "| ALiBi | 1 of 1 | 0 of 1 (40 % in, 1 found) |" in table  # starts
    assert "| ALiBi | 1 of 1 | 1 of 1 |" in table  # ends


def test_from_logs_without_logs_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "test.src").write_text("a b\n")
    assert pr.main(["--from-logs", "--out", str(tmp_path)]) == 2
    assert "no generate_<model>.log of ALiBi, Sinusoidal" in capsys.readouterr().err
