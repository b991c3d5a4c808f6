"""experiments/streaming_scoring.py: the held-out prefix both tools read, the runs it compares
(the stride-1 window's command line), the comparison, the flags, and ``--smoke`` end to end
through fairseq-train, fairseq-eval-lm and eval-lm-stream (slow)."""

import csv
import json

import pytest
import torch
from fairseq.data import data_utils

from experiments import streaming_scoring as experiment
from fairseq_alibi.cli.sweep import split_token_count
from tests.helpers.cli import python_module


def stream_of(folder):
    dataset = data_utils.load_indexed_dataset(str(folder / "test"), None)
    return torch.cat([dataset[i].long() for i in range(len(dataset))])


def test_the_prefix_is_the_first_tokens_of_the_test_split(tiny_lm_data, tmp_path):
    whole = stream_of(tiny_lm_data)
    for tokens in (1, 37, 100):
        folder = tmp_path / f"p{tokens}"
        assert experiment.write_prefix(tiny_lm_data, tokens, folder) == tokens
        assert split_token_count(str(folder), "test") == tokens
        assert torch.equal(stream_of(folder), whole[:tokens])
        assert (folder / "dict.txt").read_text() == (tiny_lm_data / "dict.txt").read_text()
    assert experiment.write_prefix(tiny_lm_data, 10**9, tmp_path / "all") == whole.numel()


def test_the_window_scores_one_token_per_pass_with_all_but_one_of_its_tokens_before(tmp_path):
    args = experiment.parse_args(["--lengths", "256,1024", "--chunks", "1,64"])
    runs = experiment.scorers(args, tmp_path / "model.pt", tmp_path / "prefix", "python")
    window = runs["window L'=1024"]["command"]
    after = {flag: window[window.index(flag) + 1]
             for flag in ("--tokens-per-sample", "--context-window", "--batch-size")}
    # fairseq 0.12's eval_lm takes the window off the tokens per sample: blocks of one token
    assert after == {"--tokens-per-sample": "1024", "--context-window": "1023",
                     "--batch-size": "16"}
    assert list(runs) == ["window L'=256", "window L'=1024", "stream dense, chunk 1",
                          "stream dense, chunk 64", "stream T=8, chunk 1", "stream T=8, chunk 64"]
    stream = runs["stream T=8, chunk 64"]["command"]
    assert stream[1:4] == ["-m", "fairseq_alibi", "eval-lm-stream"]
    assert stream[-2:] == ["--model-overrides", "{'alibi_window_cutoff': 8.0}"]
    assert "--model-overrides" not in runs["stream dense, chunk 1"]["command"]


def test_every_stream_is_compared_with_every_window():
    rows = [{"scorer": "w", "kind": "window", "length": 256, "perplexity": 10.0,
             "tokens_per_s": 100.0},
            {"scorer": "s", "kind": "stream", "length": None, "perplexity": 9.9,
             "tokens_per_s": 2500.0}]
    (pair,) = experiment.compare(rows)
    assert pair["change"] == pytest.approx(-0.01) and pair["speedup"] == pytest.approx(25.0)
    rows[1]["loss_base2"] = rows[0]["loss_base2"] = 3.3
    rows[1]["tokens_per_s_rounds"] = rows[0]["tokens_per_s_rounds"] = [1.0]
    assert "met by 1 of the 1 pairs" in experiment.report_tables(rows, [pair])
    pair["speedup"] = 19.0
    assert "met by 0 of the 1 pairs" in experiment.report_tables(rows, [pair])


def test_flags():
    args = experiment.parse_args([])
    assert (args.lengths, args.chunks, args.cutoff) == ([256, 1024], [1, 64], 8.0)
    assert (args.prefix_tokens, args.rounds, args.L) == (2048, 3, 64)
    smoke = experiment.parse_args(["--smoke"])
    assert smoke.rounds == 1 and smoke.L == 16 and smoke.lengths == [32, 64]
    for bad in (["--lengths", "1"], ["--chunks", "0"], ["--chunks", "x"], ["--cutoff", "0"],
                ["--cutoff", "nan"], ["--checkpoint", "model.pt"], ["--prefix-tokens", "-3"]):
        with pytest.raises(SystemExit):
            experiment.parse_args(bad)


@pytest.mark.slow
def test_smoke_runs_every_step(tmp_path):
    out = tmp_path / "out"
    python_module("experiments.streaming_scoring", "--smoke", "--out", out, "--prefix-tokens",
                  "96", "--chunks", "8", timeout=900)
    with open(out / "streaming_scoring.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["scorer"] for r in rows] == ["window L'=32", "window L'=64",
                                           "stream dense, chunk 8", "stream T=8, chunk 8"]
    assert {r["tokens"] for r in rows} == {"96"}  # every run scored every prefix token
    streams = [float(r["loss_base2"]) for r in rows if r["kind"] == "stream"]
    # T = 8 drops only keys whose weight is below e^-8 of their bias-free weight
    assert max(streams) - min(streams) <= 2e-3
    record = json.loads((out / "run.json").read_text())
    assert record["tokens"] == 96 and len(record["pairs"]) == 4
    assert "Streaming scoring against the stride-1" in (out / "streaming_scoring.md").read_text()
