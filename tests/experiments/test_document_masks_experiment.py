"""experiments/document_masks.py: the report of its runs (synthetic perplexities: the settings
against packing over seeds, in both evaluations) and its flags; that masked_lm's ``complete``
blocks hold the empty line between documents as ``</s> </s>``, where ``doc`` splits them; and
the masked-LM family's ``--smoke`` end to end through fairseq-train (slow). The experiment
itself is run by hand (docs/documents.md); the causal LM's fairseq steps are those of the
window-training smoke run."""

import json

import pytest

from experiments import document_masks as experiment
from tests.helpers.cli import preprocess


@pytest.fixture(scope="module")
def documents_data(tmp_path_factory):
    """A binarized corpus of 40 documents of 1–4 lines each, one empty line between them; the
    words of document ``k`` are ``d<k>a``, ``d<k>b``, ``d<k>c`` (a token names its
    document)."""
    import random

    root = tmp_path_factory.mktemp("documents")
    rng = random.Random(0)
    for split in ("train", "test"):
        documents = []
        for k in range(40):
            words = [f"d{k}{c}" for c in "abc"]
            documents.append("".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
                                     + "\n" for _ in range(rng.randint(1, 4))))
        (root / f"{split}.txt").write_text("\n".join(documents))
    preprocess("--only-source", "--trainpref", root / "train.txt", "--testpref",
               root / "test.txt", "--destdir", root / "bin", "--workers", "1")
    return root / "bin"


def test_complete_blocks_hold_the_empty_line_as_two_eos_where_doc_splits_them(documents_data):
    """fairseq's masked_lm with ``--sample-break-mode complete``: whole lines packed across
    documents into blocks of ``tokens_per_sample - 1``, ``<s>`` prepended. The empty line is a
    sample of one ``</s>``, so a block crossing documents reads ``... </s> </s> ...`` and
    ``doc`` cuts it into pieces of one document each."""
    from fairseq.data import data_utils
    from fairseq.tasks.masked_lm import MaskedLMConfig, MaskedLMTask

    from fairseq_alibi.alibi import document_ids

    task = MaskedLMTask.setup_task(MaskedLMConfig(
        data=str(documents_data), tokens_per_sample=64, sample_break_mode="complete"))
    blocks = task._load_dataset_split("test", 1, False)
    d = task.source_dictionary
    crossing = 0
    for i in range(len(blocks)):
        block = blocks[i]
        assert block[0] == d.bos() and len(block) <= 64
        ids = document_ids(block.eq(d.eos())[None], "doc")[0]
        crossing += int(ids.max() > ids.min())
        for piece in ids.unique():
            words = {d[t][:-1] for t in block[ids.eq(piece)].tolist()
                     if t not in (d.bos(), d.eos(), d.unk())}
            assert len(words) <= 1, (i, words)  # one document's words only
    assert crossing > 5  # blocks do cross documents
    # every token of the split is in a block once (complete keeps whole lines)
    lines = data_utils.load_indexed_dataset(str(documents_data / "test"), d)
    assert sum(len(blocks[i]) - 1 for i in range(len(blocks))) == int(lines.sizes.sum())


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
    assert (args.family, args.out) == ("lm", "outputs/document_masks")
    smoke = experiment.parse_args(["--smoke"])
    assert (smoke.seeds, smoke.L) == ([1], 16) and smoke.max_update <= 20
    mlm = experiment.parse_args(["--family", "mlm"])
    assert (mlm.max_update, mlm.L, mlm.out) == (
        experiment.FAMILIES["mlm"].max_update, 256, "outputs/document_masks_mlm")
    for bad in (["--L", "1"], ["--max-update", "0"], ["--seeds", "x"], ["--family", "x"]):
        with pytest.raises(SystemExit):
            experiment.parse_args(bad)


def test_reuse_keeps_a_finished_run_of_the_same_command_only(tmp_path):
    """``--reuse``: a run is kept where its log starts with the same command and fairseq-train
    finished it; another command, an unfinished log or a missing checkpoint trains again."""
    from experiments.lm_runs import finished_run

    log, checkpoint = tmp_path / "train.log", tmp_path / "checkpoint_last.pt"
    cmd = ["fairseq-train", "data", "--seed", "4"]
    log.write_text("$ fairseq-train data --seed 4\n...\ndone training in 412.5 seconds\n")
    assert finished_run(log, cmd, checkpoint) is None  # no checkpoint
    checkpoint.write_bytes(b"x")
    assert finished_run(log, cmd, checkpoint)["seconds"] == 412.5
    assert finished_run(log, cmd + ["--criterion", "masked_lm_documents"], checkpoint) is None
    log.write_text("$ fairseq-train data --seed 4\n| epoch 001 ...\n")  # cut short
    assert finished_run(log, cmd, checkpoint) is None


@pytest.mark.slow
def test_masked_lm_smoke_trains_the_four_settings_and_scores_the_same_masked_tokens(
        documents_data, tmp_path):
    out = tmp_path / "out"
    assert experiment.main(["--family", "mlm", "--smoke", "--max-update", "4", "--jobs", "2",
                            "--data", str(documents_data), "--out", str(out)]) == 0
    report = (out / "document_masks_mlm.md").read_text()
    record = json.loads((out / "run.json").read_text())
    found = {(r["evaluation"], r["setting"]): r for r in record["rows"]}
    assert set(found) == {(e, s) for e in experiment.MLM_EVALUATIONS
                          for s in experiment.MLM_SETTINGS}
    # the same blocks and masked tokens for every model and evaluation (with every </s> kept:
    # the masked tokens less the hidden </s>)
    scored = {e: {(r["tokens"], r["masked_tokens"]) for r in record["rows"]
                  if r["evaluation"] == e} for e in experiment.MLM_EVALUATIONS}
    assert all(len(pairs) == 1 for pairs in scored.values())
    assert scored["per document"] == scored["packed"]
    (tokens, masked), = scored["per document"]
    (kept_tokens, kept_masked), = scored["per document, </s> kept"]
    assert kept_tokens == tokens and kept_masked <= masked
    # the test blocks cross documents, so scoring per document changes the score
    assert record["boundaries"]["blocks_with_boundary"] > 0
    assert (found["per document", "complete"]["perplexity"]
            != found["packed", "complete"]["perplexity"])
    first = {name: (out / "logs" / f"train_{name}_seed1.log").read_text().splitlines()[0]
             for name in ("complete", "complete_mask", "complete_mask_masked_lm_documents",
                          "complete_doc")}
    assert all("--task masked_lm" in line and "--sample-break-mode complete" in line
               for line in first.values())
    assert "--alibi-document-mask doc" in first["complete_mask"]
    assert first["complete_mask_masked_lm_documents"].endswith(
        "--alibi-document-mask doc --criterion masked_lm_documents")
    assert first["complete_doc"].endswith("--sample-break-mode complete_doc")
    assert "| per document | complete + mask |" in report and "median − complete" in report
