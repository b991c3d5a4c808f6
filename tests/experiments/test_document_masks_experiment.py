"""experiments/document_masks.py: the report of its runs (synthetic perplexities: the settings
against packing over seeds, in both evaluations) and its flags; the experiment itself is run by
hand (docs/documents.md), its fairseq steps are those of the window-training smoke run."""

import pytest

from experiments import document_masks as experiment


def test_the_report_sets_each_setting_against_packing_in_both_evaluations():
    values = {"packed": [10.0, 11.0, 12.0], "packed + mask": [9.0, 10.5, 11.0],
              "complete_doc": [13.0, 13.5, 14.0]}
    rows = [{"setting": name, "seed": seed + 1, "evaluation": evaluation, "tokens": 1000,
             "perplexity": ppl + (0.5 if evaluation == "packed" else 0.0)}
            for evaluation in experiment.EVALUATIONS for name, ppls in values.items()
            for seed, ppl in enumerate(ppls)]
    args = experiment.parse_args(["--smoke"])
    runs = {(name, 1): {"seconds": 3.0} for name in values}
    text, summaries = experiment.report(rows, args, runs, 60.0)
    by = {(s["evaluation"], s["setting"]): s for s in summaries}
    assert by[("per document", "packed + mask")]["difference"] == pytest.approx(-0.5)
    assert by[("per document", "packed + mask")]["within_noise"]
    assert not by[("packed", "complete_doc")]["within_noise"]
    assert "| per document | packed + mask | 10.50 | 2.00 |" in text
    assert "the same 1,000 tokens" in text


def test_flags():
    args = experiment.parse_args([])
    assert (args.seeds, args.max_update, args.L) == ([1, 2, 3], 1000, 256)
    smoke = experiment.parse_args(["--smoke"])
    assert (smoke.seeds, smoke.L) == ([1], 16) and smoke.max_update <= 20
    for bad in (["--L", "1"], ["--max-update", "0"], ["--seeds", "x"]):
        with pytest.raises(SystemExit):
            experiment.parse_args(bad)
