"""``fairseq-alibi glue``: scoring, collapse detection, input truncation, the model flags read
from a checkpoint and the one-line errors in process; one slow end-to-end grid (fine-tuning
through the real fairseq-train, resumed, from MNLI)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.building import setup_from_command_line, write_dictionary
from tests.helpers.cli import REPO, run_cli
from tests.helpers.corpora import write_glue, write_tiny_bpe

from fairseq_alibi.cli import glue_finetune as glue

# ---------------------------------------------------------------- scoring and collapse


def test_metrics_equal_scikit_learn_and_scipy():
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import f1_score, matthews_corrcoef

    rng = np.random.default_rng(0)
    gold = rng.integers(0, 2, 300)
    pred = np.where(rng.random(300) < 0.7, gold, 1 - gold)
    found = glue.score("CoLA", pred, gold, ["0", "1"])
    assert found["mcc"] == pytest.approx(100 * matthews_corrcoef(gold, pred), abs=1e-9)
    assert found["accuracy"] == pytest.approx(100 * (pred == gold).mean())
    found = glue.score("MRPC", pred, gold, ["0", "1"])
    assert found["f1"] == pytest.approx(100 * f1_score(gold, pred), abs=1e-9)
    # the positive class is the label "1", wherever the label dictionary put it
    found = glue.score("MRPC", pred, gold, ["1", "0"])
    assert found["f1"] == pytest.approx(100 * f1_score(gold, pred, pos_label=0), abs=1e-9)
    three = rng.integers(0, 3, 200), rng.integers(0, 3, 200)
    assert glue.matthews(*three) == pytest.approx(matthews_corrcoef(three[1], three[0]))

    score = rng.random(400) * 5
    out = score + rng.normal(0, 1.5, 400)
    out[:40] = np.round(out[:40])  # ties, for the ranks
    found = glue.score("STS-B", out, score)
    assert found["pearson"] == pytest.approx(100 * pearsonr(out, score)[0], abs=1e-9)
    assert found["spearman"] == pytest.approx(100 * spearmanr(out, score)[0], abs=1e-9)
    assert not found["collapsed"]


def test_collapse_flags():
    gold = np.array([0, 1, 1, 0, 1, 1])
    one_class = glue.score("SST-2", np.ones(6, dtype=int), gold, ["0", "1"])
    assert one_class["collapsed"] and one_class["collapse"] == \
        "all 6 dev predictions are class '1'"
    assert one_class["accuracy"] == pytest.approx(one_class["majority_rate"])
    # two classes predicted, independently of the labels: MCC exactly 0
    independent = glue.score("CoLA", np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1]),
                             ["0", "1"])
    assert independent["mcc"] == 0 and independent["collapsed"]
    assert independent["collapse"].startswith("MCC 0")
    healthy = glue.score("CoLA", np.array([0, 1, 1, 1]), np.array([0, 0, 1, 1]), ["0", "1"])
    assert healthy["mcc"] > 0 and not healthy["collapsed"] and healthy["collapse"] is None
    # a constant regression output: its correlation is undefined, counted as 0
    constant = glue.score("STS-B", np.full(5, 0.6), np.array([0.1, 0.4, 0.5, 0.9, 1.0]))
    assert constant["collapsed"] and constant["collapse"].startswith("constant output")
    assert constant["pearson"] == 0 and constant["spearman"] == 0
    nearly = glue.score("STS-B", 0.6 + 1e-7 * np.arange(5), np.array([0.1, 0.4, 0.5, 0.9, 1.0]))
    assert nearly["collapsed"]  # a spread of 1e-7 against labels spread 0.3 is no output


def test_summary_counts_collapses_and_takes_medians():
    runs = [{"task": "SST-2", "seed": s, "accuracy": a, "collapsed": c, "majority_rate": 50.9,
             "collapse": "all 872 dev predictions are class '1'" if c else None}
            for s, a, c in ((1, 80.0, False), (2, 50.9, True), (3, 78.0, False))]
    summary = glue.summarize(runs, ["SST-2", "CoLA"])
    assert list(summary) == ["SST-2"]
    entry = summary["SST-2"]
    assert entry["collapsed"] == 1 and entry["runs"] == 3
    assert entry["metrics"]["accuracy"] == {"median": 78.0, "min": 50.9, "max": 80.0,
                                            "values": [80.0, 50.9, 78.0]}
    text = glue.markdown(summary, runs, ["title"])
    assert "| SST-2 | accuracy | 78.0 | 50.9–80.0 | 1 of 3 | 80.0 50.9 78.0 |" in text
    assert "- SST-2 seed 2: all 872 dev predictions are class '1'" in text


def test_runs_in_turn_on_one_device_and_one_per_gpu_on_several():
    import threading
    import time

    busy, seen, lock = set(), [], threading.Lock()

    def runner(job, device):
        with lock:
            assert device not in busy  # a GPU runs one fine-tuning at a time
            busy.add(device)
            seen.append((job, device))
        time.sleep(0.02)
        with lock:
            busy.discard(device)
        return job

    jobs = [("SST-2", s) for s in range(1, 9)]
    assert glue.run_grid(jobs, [None], runner) == jobs  # the CPU: in order
    assert [d for _, d in seen] == [None] * 8
    seen.clear()
    assert glue.run_grid(jobs, [0, 1, 2], runner) == jobs  # results in the jobs' order
    assert sorted(j for j, _ in seen) == sorted(jobs) and {d for _, d in seen} == {0, 1, 2}


# ---------------------------------------------------------------- long inputs


def test_pairs_lose_tokens_from_the_longer_segment_first():
    assert glue.cut_pair(30, 5, 20) == (13, 5)  # <s> 13 + sep 5 = 20 tokens
    assert glue.cut_pair(12, 11, 20) == (9, 9)
    assert glue.cut_pair(4, 5, 20) == (4, 5)  # fits: untouched
    assert glue.cut_pair(50, None, 20) == (19, None)  # one segment: <s> + 19


def write_task(folder, segments, labels=("0", "1")):
    """A binarized task folder: ``segments`` = per input, a list of segments (lists of ids)."""
    from fairseq_alibi.preprocess.pipeline_io import IndexedWriter

    pair = len(segments[0]) == 2
    write_dictionary(folder / "input0", 40)
    for k in range(2 if pair else 1):
        sub = folder / f"input{k}"
        if k:
            write_dictionary(sub, 40)
        for split in ("train", "valid"):
            writer = IndexedWriter(sub / split, 44)
            for sample in segments:
                writer.add(np.array(sample[k]))
            writer.finalize()
    write_dictionary(folder / "label", 0)
    (folder / "label" / "dict.txt").write_text("".join(f"{x} 1\n" for x in labels))
    for split in ("train", "valid"):
        writer = IndexedWriter(folder / "label" / split, 6)
        for i in range(len(segments)):
            writer.add(np.array([4 + i % 2, 2]))
        writer.finalize()
    return folder


def test_truncated_copy_keeps_each_segments_end(tmp_path):
    from fairseq.data import data_utils

    eos = 2
    long_first = [list(range(5, 30)) + [eos], [7, 8, eos]]  # 26 + 3 tokens
    short = [[5, 6, eos], [9, eos]]
    source = write_task(tmp_path / "RTE-bin", [long_first, short])
    assert list(glue.input_lengths(source, "train")) == [1 + 26 + 1 + 3, 1 + 3 + 1 + 2]
    info = glue.task_data("RTE", source, tmp_path / "out", 12)
    assert info["inputs_cut"] == {"train": 1, "valid": 1} and info["longest_input"] == 31
    copy = tmp_path / "out" / "data" / "RTE-max12"
    assert info["folder"] == str(copy) and info["longest_seen"] == 12
    first = data_utils.load_indexed_dataset(str(copy / "input0" / "train"), None)
    second = data_utils.load_indexed_dataset(str(copy / "input1" / "train"), None)
    assert first[0].tolist() == [5, 6, 7, 8, 9, 10, eos] and second[0].tolist() == [7, 8, eos]
    assert first[1].tolist() == short[0] and second[1].tolist() == short[1]  # untouched
    assert (copy / "label" / "dict.txt").is_file()
    # nothing longer than the limit: the folder itself is used
    assert glue.task_data("RTE", source, tmp_path / "out", 64)["folder"] == str(source)


# ---------------------------------------------------------------- the checkpoint's model


ENCODER = ["--task", "masked_lm", "--criterion", "masked_lm", "--tokens-per-sample", 24,
           "--encoder-layers", 2, "--encoder-embed-dim", 32, "--encoder-ffn-embed-dim", 64,
           "--encoder-attention-heads", 4, "--optimizer", "adam", "--lr", 1e-3, "--cpu",
           "--dropout", 0.3]


def save_untrained(data, save_dir, *flags):
    """A checkpoint of an untrained model, written by fairseq's own Trainer in this process."""
    from fairseq.trainer import Trainer

    save_dir.mkdir(parents=True, exist_ok=True)
    cfg, task = setup_from_command_line(data, *flags, "--save-dir", save_dir)
    model = task.build_model(cfg.model)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    trainer.consolidate_optimizer()
    trainer.save_checkpoint(str(save_dir / "checkpoint_last.pt"), {})
    return save_dir / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def dictionary_folder(tmp_path_factory):
    return write_dictionary(tmp_path_factory.mktemp("glue_dict"), 40)


@pytest.mark.parametrize("flags,learned", [
    (["--arch", "alibi_roberta_base", "--alibi-variant", "symmetric", "--mlm-head", "clap",
      "--zero-mask-embedding", "--alibi-learned-scales", "per_head", "--alibi-document-mask",
      "eos"], None),
    (["--arch", "alibi_roberta_small", "--alibi-variant", "none", "--untie-weights-roberta",
      "--no-layernorm-embedding"], 24),
])
def test_model_flags_read_from_the_checkpoint_rebuild_it(flags, learned, dictionary_folder,
                                                         tmp_path):
    from fairseq_alibi.cli.checkpoint_io import read_checkpoint

    path = save_untrained(dictionary_folder, tmp_path, *ENCODER, *flags)
    found = glue.read_pretrained(path)
    assert found.arch == flags[1] and found.learned_positions == learned
    assert found.pretraining_length == 24
    assert "--dropout" not in found.flags  # the recipe's own, not the pretraining's
    assert "--alibi-document-mask" not in found.flags  # packing, which would cut pairs apart
    saved = vars(read_checkpoint(path)["cfg"]["model"])
    cfg, _ = setup_from_command_line(dictionary_folder, *ENCODER[:4], "--arch", found.arch,
                                     *found.flags)
    rebuilt = vars(cfg.model)
    for key in ("encoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim",
                "encoder_attention_heads", "alibi_variant", "mlm_head", "zero_mask_embedding",
                "alibi_learned_scales", "untie_weights_roberta", "layernorm_embedding"):
        assert rebuilt[key] == saved[key], key


def test_one_line_errors(dictionary_folder, tmp_path):
    with pytest.raises(glue.GlueError, match=r"no checkpoint at .*missing\.pt: give "):
        glue.read_pretrained(tmp_path / "missing.pt")
    lm = save_untrained(dictionary_folder, tmp_path / "lm", "--task", "language_modeling",
                        "--arch", "alibi_transformer_lm", "--decoder-layers", 1,
                        "--decoder-embed-dim", 16, "--decoder-ffn-embed-dim", 32,
                        "--decoder-attention-heads", 2, "--tokens-per-sample", 8, "--cpu",
                        "--optimizer", "adam", "--lr", 1e-3)
    with pytest.raises(glue.GlueError, match="is a checkpoint of alibi_transformer_lm "
                       r"\(AlibiTransformerLanguageModel\): fairseq-alibi glue fine-tunes "
                       "masked-LM encoders"):
        glue.read_pretrained(lm)
    (tmp_path / "bin" / "SST-2-bin").mkdir(parents=True)
    with pytest.raises(glue.GlueError, match=r"has no CoLA-bin, STS-B-bin folder; write it "
                       r"with python -m fairseq_alibi.preprocess.glue .* --tasks CoLA STS-B"):
        glue.find_tasks(tmp_path / "bin", ["SST-2", "CoLA", "STS-B"])
    assert list(glue.find_tasks(tmp_path / "bin", None)) == ["SST-2"]
    with pytest.raises(glue.GlueError, match="unknown GLUE task.*SST2"):
        glue.find_tasks(tmp_path / "bin", ["SST2"])
    with pytest.raises(glue.GlueError, match="SST-2-bin lacks input0/dict.txt, input0/train.idx"):
        glue.task_data("SST-2", tmp_path / "bin" / "SST-2-bin", tmp_path / "out", 16)
    learned = save_untrained(dictionary_folder, tmp_path / "none", *ENCODER, "--arch",
                             "alibi_roberta_base", "--alibi-variant", "none")
    with pytest.raises(glue.GlueError, match=r"learned positions \(24\), which stop there; "
                       "give --max-length 24 or less"):
        glue.main(["--checkpoint", str(learned), "--data", str(tmp_path / "bin"),
                   "--out", str(tmp_path / "out"), "--max-length", "none"])


@pytest.mark.parametrize("flag, value, message", [
    ("--lr", "-1", "--lr must be a positive number, got -1.0"),
    ("--lr", "nan", "--lr must be a positive number, got nan"),
    ("--batch-size", "0", "--batch-size must be at least 1, got 0"),
    ("--batch-size", "-4", "--batch-size must be at least 1, got -4"),
])
def test_a_bad_learning_rate_or_batch_size_is_refused_before_any_run(flag, value, message,
                                                                      tmp_path, capsys):
    """Not trained to the end with gradient ascent, nor failed inside the first run."""
    with pytest.raises(SystemExit):
        glue.main(["--checkpoint", "x.pt", "--data", str(tmp_path), "--out",
                   str(tmp_path / "out"), flag, value])
    assert capsys.readouterr().err.strip().endswith(message)
    assert not (tmp_path / "out").exists()


def test_a_fine_tuned_classifier_is_refused(dictionary_folder, tmp_path):
    """A sentence_prediction checkpoint is no masked-LM encoder: refused before fairseq-train."""
    import torch

    path = save_untrained(dictionary_folder, tmp_path, *ENCODER, "--arch", "alibi_roberta_base")
    state = torch.load(path, weights_only=False)
    state["cfg"]["task"]["_name"] = "sentence_prediction"
    torch.save(state, tmp_path / "fine_tuned.pt")
    with pytest.raises(glue.GlueError, match=r"fine_tuned\.pt holds an encoder trained with the "
                       "sentence_prediction task: not a masked-LM encoder, which glue fine-tunes; "
                       r"give its masked_lm \(pre-training\) checkpoint$"):
        glue.read_pretrained(tmp_path / "fine_tuned.pt")
    # the fine-tuning run recorded where it started: named
    state["cfg"]["checkpoint"]["restore_file"] = "pretrained/checkpoint_best.pt"
    torch.save(state, tmp_path / "fine_tuned.pt")
    with pytest.raises(glue.GlueError, match=r"give its masked_lm \(pre-training\) checkpoint "
                       r"\(pretrained/checkpoint_best\.pt, which it was fine-tuned from\)$"):
        glue.read_pretrained(tmp_path / "fine_tuned.pt")


# ---------------------------------------------------------------- end to end


def glue_tool(*args, expect_ok=True):
    proc = subprocess.run([sys.executable, "-m", "fairseq_alibi", "glue", *map(str, args)],
                          capture_output=True, text=True, cwd=REPO, timeout=900,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))
    assert (proc.returncode == 0) == expect_ok, (proc.stdout + proc.stderr)[-5000:]
    return proc.stdout + proc.stderr


@pytest.mark.slow
def test_grid_end_to_end_resumed_and_from_mnli(tmp_path, alibi_user_dir):
    from fairseq_alibi.preprocess import glue as preprocess_glue
    from fairseq_alibi.preprocess.encoders import Gpt2BpeEncoder

    write_glue(tmp_path / "glue", rows=24)
    preprocess_glue.prepare(tmp_path / "glue", tmp_path / "bin",
                            ["CoLA", "STS-B", "MNLI", "RTE"],
                            Gpt2BpeEncoder.from_dir(write_tiny_bpe(tmp_path / "bpe")))
    run_cli("fairseq-train", tmp_path / "bin" / "CoLA-bin" / "input0", "--user-dir",
            alibi_user_dir, *ENCODER, "--arch", "alibi_roberta_base", "--mlm-head", "clap",
            "--zero-mask-embedding", "--batch-size", 8, "--max-update", 2,
            "--save-dir", tmp_path / "pre", "--num-workers", 0, "--no-epoch-checkpoints")
    pretrained = tmp_path / "pre" / "checkpoint_last.pt"
    out = tmp_path / "out"
    common = ["--checkpoint", pretrained, "--data", tmp_path / "bin", "--epochs", 1]
    log = glue_tool(*common, "--out", out, "--tasks", "CoLA,STS-B", "--seeds", "1,2",
                    "--max-length", 16, "--", "--log-interval", 1)
    assert "--arch alibi_roberta_base --encoder-layers 2 --encoder-embed-dim 32" in log
    assert "--mlm-head clap --zero-mask-embedding" in log
    record = json.loads((out / "glue.json").read_text())
    runs = {(r["task"], r["seed"]): r for r in record["runs"]}
    assert set(runs) == {("CoLA", 1), ("CoLA", 2), ("STS-B", 1), ("STS-B", 2)}
    for (task, seed), run in runs.items():
        assert run["dev_examples"] == 24
        assert isinstance(run["collapsed"], bool)
        assert (run["collapse"] is None) != run["collapsed"]
        assert "--max-positions 16" in run["command"] and "--log-interval 1" in run["command"]
        assert f"--save-dir {out}/runs/{task}/seed{seed}/checkpoints" in run["command"]
    assert "--report-mcc" in runs[("CoLA", 1)]["command"]
    assert "--regression-target" in runs[("STS-B", 1)]["command"]
    assert record["summary"]["CoLA"]["collapsed"] == sum(
        runs[("CoLA", s)]["collapsed"] for s in (1, 2))
    assert record["data"]["STS-B"]["inputs_cut"]["train"] > 0  # pairs longer than 16 tokens
    table = (out / "glue.md").read_text()
    assert "| CoLA | MCC |" in table and "| STS-B | Pearson |" in table
    assert len((out / "glue.csv").read_text().splitlines()) == 5

    # run again: every run is finished, nothing is fine-tuned again
    again = glue_tool(*common, "--out", out, "--tasks", "CoLA,STS-B", "--seeds", "1,2",
                      "--max-length", 16, "--", "--log-interval", 1)
    assert "fine-tuning" not in again and "| CoLA | MCC |" in again
    changed = glue_tool(*common, "--out", out, "--tasks", "CoLA", "--lr", 1e-4,
                        "--max-length", 16, expect_ok=False)
    assert "holds runs made with other settings (lr, fairseq_args)" in changed.splitlines()[-1]

    # RTE starts from the best MNLI run, whose 3-class head fairseq drops; with
    # --delete-checkpoints every run's checkpoints go once scored, but the MNLI runs' it reads
    mnli = glue_tool(*common, "--out", tmp_path / "mnli", "--tasks", "MNLI,RTE", "--seeds", 1,
                     "--from-mnli", "--delete-checkpoints")
    runs = tmp_path / "mnli" / "runs"
    rte = json.loads((runs / "RTE" / "seed1" / "result.json").read_text())
    assert rte["restored_from"].endswith("runs/MNLI/seed1/checkpoints/checkpoint_best.pt")
    assert Path(rte["restored_from"]).is_file()
    assert not (runs / "RTE" / "seed1" / "checkpoints").exists()
    assert "RTE, MRPC and STS-B start from MNLI seed 1" in mnli
    missing = glue_tool(*common, "--out", tmp_path / "x", "--tasks", "RTE", "--from-mnli",
                        expect_ok=False)
    assert missing.strip().splitlines()[-1].startswith(
        "GlueError: --from-mnli without a checkpoint starts RTE, MRPC and STS-B from this "
        "grid's MNLI runs: add MNLI to --tasks")
