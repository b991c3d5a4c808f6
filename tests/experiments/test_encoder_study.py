"""experiments/encoder_study.py: its bookkeeping in process (configurations this checkout cannot
build are skipped and named, length buckets, per-bucket scores from saved predictions) and
``--smoke`` end to end through the real tools (slow; needs ../shared/data)."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from experiments import encoder_study as study
from experiments import encoder_study_report as study_report
from tests.helpers.cli import REPO, SHARED_DATA


def test_configurations_needing_missing_options_are_named():
    known = study.known_options()
    assert "--alibi-variant" in known and "--regression-target" in known  # model and task
    assert study.missing_options("offset", known) == []
    assert study.missing_options("learned_scales", known) == []
    lacking = {"--alibi-global-tokens", "--alibi-heads", "--classification-pooler"}
    assert study.missing_options("combination", known - lacking) == [
        "--alibi-global-tokens", "--alibi-heads", "--classification-pooler"]
    assert study.missing_options("mean_pooler", known - lacking) == ["--classification-pooler"]
    # a fine-tuning-only configuration fine-tunes another one's checkpoint
    assert study.pretrained_name("mean_pooler") == "offset"


def test_parse_adds_the_baseline_and_the_checkpoints_fine_tuned():
    args, settings = study.parse_args(["--configs", "mean_pooler", "--L", "64"])
    assert args.names == ["learned", "offset", "mean_pooler"]
    assert settings.L == 64 and settings.dim == study.Settings().dim
    args, settings = study.parse_args(["--smoke"])
    assert args.names == list(study.SMOKE_CONFIGS) and settings.glue_seeds == (1,)
    with pytest.raises(SystemExit):
        study.parse_args(["--configs", "offset,nope"])


def test_the_sinusoidal_flag_builds_stock_roberta_with_sinusoidal_positions(tmp_path):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.modules import SinusoidalPositionalEmbedding

    from tests.helpers.building import write_dictionary

    config = study.CONFIGS["sinusoidal"]
    assert config.sinusoidal and not config.learned_positions and not config.glue
    assert study.CONFIGS["learned"].learned_positions
    flags = [str(write_dictionary(tmp_path, 30)), "--task", "masked_lm",
             "--arch", "alibi_roberta_base", "--encoder-layers", "1", "--encoder-embed-dim",
             "16", "--encoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
             "--tokens-per-sample", "16", *config.pretrain[2:], *config.pretrain[:2]]
    args = options.parse_args_and_arch(options.get_training_parser(), flags,
                                       modify_parser=study.add_sinusoidal_flag)
    cfg = convert_namespace_to_omegaconf(args)
    model = tasks.setup_task(cfg.task).build_model(cfg.model)
    positions = model.encoder.sentence_encoder.embed_positions
    assert isinstance(positions, SinusoidalPositionalEmbedding)
    assert not any("embed_positions" in k for k in model.state_dict())  # nothing learned


def test_length_buckets_and_their_scores(tmp_path):
    assert [study_report.bucket_of(n, 32) for n in (1, 32, 33, 64, 65, 128, 129)] == [
        "≤ L (32)", "≤ L (32)", "L–2L (33–64)", "L–2L (33–64)", "2L–4L (65–128)",
        "2L–4L (65–128)", "> 4L (> 128)"]
    lengths = [10, 20, 40, 50, 70]
    runs = []
    for seed, pred in ((1, [1, 0, 1, 1, 0]), (2, [1, 1, 1, 0, 0])):
        folder = tmp_path / f"seed{seed}"
        (folder / "checkpoints").mkdir(parents=True)
        np.save(folder / "dev_predictions.npy", np.array(pred))
        np.save(folder / "dev_labels.npy", np.array([1, 0, 1, 0, 0]))
        runs.append({"task": "SST-2", "seed": seed,
                     "checkpoint": str(folder / "checkpoints" / "checkpoint_best.pt")})
    scored = study_report.bucket_scores({"runs": runs}, "SST-2", lengths, 32)
    assert scored == {"≤ L (32)": {"n": 2, "values": [100.0, 50.0]},
                      "L–2L (33–64)": {"n": 2, "values": [50.0, 100.0]},
                      "2L–4L (65–128)": {"n": 1, "values": [100.0, 100.0]}}


def _criterion_perplexity(checkpoint, data, length, seed):
    """exp(loss / masked targets) of fairseq's own ``valid_step`` (what fairseq-validate sums)
    on the study's held-out blocks."""
    import math

    import torch

    model, cfg, task, batches = study.held_out_blocks(str(checkpoint), str(data), length, seed)
    criterion = task.build_criterion(cfg.criterion)
    loss = masked = 0.0
    with torch.no_grad():
        for sample in batches:
            batch_loss, sample_size, _ = task.valid_step(sample, model, criterion)
            loss, masked = loss + float(batch_loss), masked + float(sample_size)
    return math.exp(loss / masked)


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED_DATA / "glue" / "SST-2").is_dir()
                    or not (SHARED_DATA / "wikitext-2").is_dir(), reason="needs ../shared/data")
def test_a_configuration_without_its_glue_or_long_results_is_said_not_run(tmp_path):
    """The published report listed partial_heads and combination in its masked-LM table and
    said nothing of their missing GLUE and long-input rows."""
    from experiments.encoder_study_report import cost_section

    found = {"glue": {"offset": {}}, "long": {"offset": {}}}
    lines = cost_section(tmp_path, ["offset", "partial_heads"], {}, found)
    assert "- `partial_heads`: GLUE and inputs longer than pretraining: no result in this " \
           "folder (`--configs partial_heads --steps glue,long`)" in lines
    assert not any(line.startswith("- `offset`") for line in lines)


def test_smoke_runs_every_step_and_resumes(tmp_path):
    out = tmp_path / "study"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "experiments.encoder_study", "--smoke",
                           "--out", str(out)], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    report = (out / "encoder_study.md").read_text()
    for section in ("### Masked-LM perplexity on held-out text", "### GLUE dev",
                    "### Inputs longer than pretraining", "### `<s>`'s attention reach",
                    "### CPU time"):
        assert section in report, section
    assert "| learned | " in report and "n/a (L positions)" in report
    for name in ("mlm", "glue", "long", "reach"):
        rows = (out / f"{name}.csv").read_text().splitlines()
        assert len(rows) > 1, name
    assert (out / "encoder_study.png").stat().st_size > 10_000
    glue = json.loads((out / "glue" / "offset" / "glue.json").read_text())
    assert {r["task"] for r in glue["runs"]} == {"SST-2", "STS-B"}
    assert all("collapsed" in r for r in glue["runs"])
    # the perplexity of every masked target is fairseq's masked_lm criterion's; the text's
    # leaves out the masked <s> (fewer targets, which were the easiest)
    scored = json.loads((out / "mlm" / "offset" / "N16_seed1.json").read_text())
    assert scored["perplexity"] == pytest.approx(
        _criterion_perplexity(out / "pretrain" / "offset" / "checkpoints" / "checkpoint_last.pt",
                              out / "data" / "text" / "bin", 16, 1), rel=1e-6)
    assert 0 < scored["text_masked_tokens"] < scored["masked_tokens"]
    assert scored["text_perplexity"] > scored["perplexity"]
    long = json.loads((out / "long" / "offset" / "glue.json").read_text())
    assert long["settings"]["max_length"] is None  # whole inputs
    seconds = time.time() - started
    print(f"smoke: {seconds:.0f} s")

    # again: every piece is there, nothing is trained again
    again = subprocess.run([sys.executable, "-m", "experiments.encoder_study", "--smoke",
                            "--out", str(out)], capture_output=True, text=True, cwd=REPO,
                           env=env, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    logged = [line for line in again.stdout.splitlines() if line.startswith("[")]
    assert logged and not [line for line in logged
                           if "pretraining" in line or ": fine-tuning" in line]
