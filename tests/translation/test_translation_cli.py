"""alibi_transformer through the real tools, on a tiny parallel corpus the test writes: the
prepare pipeline (and its clear errors), fairseq-train and resume, fairseq-generate on sources 4x
longer than any training source (every hypothesis present), fairseq-interactive, the hub's
``translate``, the shipped hydra configs, and clear errors for a stock checkpoint and a
dictionary that does not match."""

import json
import os
import random
import re
import subprocess
import sys

import pytest

from fairseq_alibi.preprocess.pipeline_io import DataError
from fairseq_alibi.preprocess.parallel import main as prepare_main
from fairseq_alibi.preprocess.parallel import restoration_pair, sentences_of
from tests.helpers.cli import BIN, REPO, run_cli
from tests.helpers.translation import TINY_TRANSLATION

WORDS = [f"w{i}" for i in range(16)]
TRAIN_MAX = 10  # words per training source
TEST_LENGTHS = (4 * TRAIN_MAX, 4 * TRAIN_MAX + 4)
TEST_LINES = 20  # with --batch-size 8, stock generate's default drops 4 of them (see below)
TRAIN = ["--task", "translation", "--source-lang", "src", "--target-lang", "tgt",
         *TINY_TRANSLATION, "--optimizer", "adam", "--lr", 0.003, "--lr-scheduler", "inverse_sqrt",
         "--warmup-updates", 5, "--criterion", "label_smoothed_cross_entropy",
         "--label-smoothing", 0.1, "--max-tokens", 256, "--cpu", "--num-workers", 0, "--seed", 1,
         "--no-epoch-checkpoints", "--log-format", "json", "--log-interval", 1,
         "--no-progress-bar", "--required-batch-size-multiple", 1]


def write_pairs(prefix, n, low, high, rng):
    """Reversal with case change: target = the source's words reversed, upper-cased."""
    sources, targets = [], []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(low, high))]
        sources.append(" ".join(words))
        targets.append(" ".join(reversed(words)).upper())
    prefix.parent.mkdir(parents=True, exist_ok=True)
    (prefix.parent / f"{prefix.name}.src").write_text("\n".join(sources) + "\n")
    (prefix.parent / f"{prefix.name}.tgt").write_text("\n".join(targets) + "\n")
    return sources


def prepare(raw, destdir, *extra):
    return run_cli_module("fairseq_alibi.preprocess.parallel", "-s", "src", "-t", "tgt",
                          "--trainpref", raw / "train", "--validpref", raw / "valid",
                          "--testpref", raw / "test", "--destdir", destdir, *extra)


def run_cli_module(module, *args, expect_ok=True):
    proc = subprocess.run([sys.executable, "-m", module, *[str(a) for a in args]],
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert (proc.returncode == 0) == expect_ok, out[-4000:]
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("translation_cli")
    rng = random.Random(0)
    raw = root / "raw"
    write_pairs(raw / "train", 300, 3, TRAIN_MAX, rng)
    write_pairs(raw / "valid", 16, 3, TRAIN_MAX, rng)
    test_sources = write_pairs(raw / "test", TEST_LINES, *TEST_LENGTHS, rng)
    prepare(raw, root / "bin")
    return root, raw, test_sources


@pytest.fixture(scope="module")
def trained(corpus, alibi_user_dir):
    root, _, _ = corpus
    save = root / "ckpt"
    out = run_cli("fairseq-train", root / "bin", "--user-dir", alibi_user_dir,
                  "--arch", "alibi_transformer", *TRAIN, "--max-update", 4, "--save-dir", save)
    return save, out


def hypotheses(output):
    return [line for line in output.splitlines() if re.match(r"^H-\d+\t", line)]


# ---------------------------------------------------------------- the prepare pipeline


@pytest.mark.slow
def test_prepare_wrote_stock_binaries_and_counted_the_pairs(corpus):
    root, _, _ = corpus
    names = {p.name for p in (root / "bin").iterdir()}
    assert {"dict.src.txt", "dict.tgt.txt", "train.src-tgt.src.bin", "test.src-tgt.tgt.idx"} <= names
    assert json.loads((root / "bin" / "pairs.json").read_text())["pairs"] == {
        "train": 300, "valid": 16, "test": TEST_LINES}


def latin1_line(path, n):
    """Line ``n`` (from 1) of ``path`` made Latin-1 (one byte no UTF-8 text has there)."""
    lines = path.read_bytes().split(b"\n")
    lines[n - 1] = "café".encode("latin-1") + lines[n - 1]
    path.write_bytes(b"\n".join(lines))


@pytest.mark.parametrize("damage,error", [
    (lambda raw: (raw / "train.tgt").write_text("A B\n" * 299), "has 300 lines but .* has 299"),
    (lambda raw: latin1_line(raw / "train.src", 250),
     r"train.src:250: not UTF-8 text \(byte 0xe9 at byte 4 of the line\); convert the file to "
     r"UTF-8 \(iconv"),
    (lambda raw: (raw / "valid.tgt").unlink(), "valid.tgt not found: a parallel corpus needs both"),
    (lambda raw: (raw / "test.src").write_text("w1\n\nw2\n"), "test.src:2 is empty"),
])
def test_prepare_refuses_a_broken_corpus_with_one_clear_line(tmp_path, damage, error):
    rng = random.Random(1)
    raw = tmp_path / "raw"
    for split in ("train", "valid", "test"):
        write_pairs(raw / split, 300 if split == "train" else 3, 2, 4, rng)
    damage(raw)
    with pytest.raises(DataError, match=error):
        prepare_main(["-s", "src", "-t", "tgt", "--trainpref", str(raw / "train"),
                      "--validpref", str(raw / "valid"), "--testpref", str(raw / "test"),
                      "--destdir", str(tmp_path / "bin")])
    assert not (tmp_path / "bin").exists()  # nothing half-written


def test_restoration_pairs_drop_punctuation_and_case():
    assert restoration_pair("The cat , in 1990 @-@ ish , sat .") == (
        "the cat in 1990 ish sat", "The cat , in 1990 @-@ ish , sat .")
    assert restoration_pair(" , . ") is None
    text = [" = Heading = \n", " \n", " One sentence . Another one ! And a tail \n"]
    assert list(sentences_of(text)) == ["One sentence .", "Another one !", "And a tail"]


# ---------------------------------------------------------------- train, resume, generate


@pytest.mark.slow
def test_train_then_resume(trained, corpus, alibi_user_dir):
    save, first = trained
    assert '"num_updates": "4"' in first
    root, _, _ = corpus
    resumed = root / "resumed"
    resumed.mkdir()
    (resumed / "checkpoint_last.pt").write_bytes((save / "checkpoint_last.pt").read_bytes())
    out = run_cli("fairseq-train", root / "bin", "--user-dir", alibi_user_dir,
                  "--arch", "alibi_transformer", *TRAIN, "--max-update", 6, "--save-dir", resumed)
    assert "Loaded checkpoint" in out and "@ 4 updates" in out
    assert '"num_updates": "6"' in out


@pytest.mark.slow
def test_generate_translates_every_source_4x_longer_than_training(trained, corpus, alibi_user_dir):
    save, _ = trained
    root, _, test_sources = corpus
    assert min(len(s.split()) for s in test_sources) >= 4 * TRAIN_MAX
    out = run_cli("fairseq-generate", root / "bin", "--user-dir", alibi_user_dir,
                  "--path", save / "checkpoint_last.pt", "--gen-subset", "test", "--beam", 4,
                  "--batch-size", 8, "--required-batch-size-multiple", 1, "--cpu",
                  "--scoring", "bleu", "--max-len-a", 1.2, "--max-len-b", 10)
    assert len(hypotheses(out)) == TEST_LINES
    assert f"Translated {TEST_LINES} sentences" in out and "BLEU4 =" in out
    # the stock trap this option avoids: fairseq's batch_by_size drops the last batch when it
    # is not a multiple of --required-batch-size-multiple (default 8): 16 of 20 translated
    stock_default = run_cli("fairseq-generate", root / "bin", "--user-dir", alibi_user_dir,
                            "--path", save / "checkpoint_last.pt", "--gen-subset", "test",
                            "--beam", 1, "--batch-size", 8, "--cpu")
    assert len(hypotheses(stock_default)) == 16


@pytest.mark.slow
def test_interactive_translates_every_line(trained, corpus, alibi_user_dir):
    save, _ = trained
    root, _, test_sources = corpus
    lines = test_sources[:5] + [" ".join(test_sources[:3])]  # the last one ~130 words
    proc = subprocess.run(
        [str(BIN / "fairseq-interactive"), str(root / "bin"), "--user-dir", alibi_user_dir, "--path",
         str(save / "checkpoint_last.pt"), "--source-lang", "src", "--target-lang", "tgt",
         "--beam", "4", "--cpu", "--buffer-size", "4", "--batch-size", "4"],
        input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert len(hypotheses(out)) == len(lines)


@pytest.mark.slow
def test_hub_translate(trained, corpus):
    save, _ = trained
    root, _, test_sources = corpus
    code = (
        "import sys, fairseq_alibi\n"
        "from fairseq_alibi.models.alibi_transformer import AlibiTransformerModel\n"
        "hub = AlibiTransformerModel.from_pretrained(sys.argv[1], 'checkpoint_last.pt',\n"
        "    data_name_or_path=sys.argv[2], source_lang='src', target_lang='tgt')\n"
        "lines = open(sys.argv[3]).read().splitlines()\n"
        "long = ' '.join(lines * 4)  # longer than the training run's --max-tokens (256)\n"
        "out = hub.translate(lines[:3] + [long], beam=2)\n"
        "print('HYPOS', len(out), all(isinstance(o, str) and o for o in out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(save), str(root / "bin"),
                           str(root / "raw" / "test.src")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "HYPOS 4 True" in proc.stdout


@pytest.mark.slow
def test_cross_attention_options_train_resume_and_generate(corpus, alibi_user_dir, tmp_path):
    """--cross-alibi pointer, the length scale and the EOS guard through the real tools:
    train, resume (the options come back from the checkpoint), generate every long source."""
    root, _, _ = corpus
    cross = ["--cross-alibi", "pointer", "--cross-attention-length-scale", 8,
             "--cross-alibi-eos-guard", 2]
    train = ["fairseq-train", root / "bin", "--user-dir", alibi_user_dir,
             "--arch", "alibi_transformer", *TRAIN, *cross, "--save-dir", tmp_path]
    assert '"num_updates": "4"' in run_cli(*train, "--max-update", 4)
    out = run_cli(*train, "--max-update", 6)
    assert "Loaded checkpoint" in out and "@ 4 updates" in out and '"num_updates": "6"' in out
    out = run_cli("fairseq-generate", root / "bin", "--user-dir", alibi_user_dir,
                  "--path", tmp_path / "checkpoint_last.pt", "--gen-subset", "test",
                  "--beam", 4, "--batch-size", 8, "--required-batch-size-multiple", 1, "--cpu",
                  "--max-len-a", 1.2, "--max-len-b", 10)
    assert len(hypotheses(out)) == TEST_LINES and f"Translated {TEST_LINES} sentences" in out


# ---------------------------------------------------------------- shared embeddings, configs


@pytest.mark.slow
def test_joined_dictionary_and_shared_embeddings(corpus, alibi_user_dir, tmp_path):
    root, raw, _ = corpus
    prepare(raw, tmp_path / "joined", "--joined-dictionary")
    assert (tmp_path / "joined" / "dict.src.txt").read_text() == \
        (tmp_path / "joined" / "dict.tgt.txt").read_text()
    out = run_cli("fairseq-train", tmp_path / "joined", "--user-dir", alibi_user_dir,
                  "--arch", "alibi_transformer", *TRAIN, "--share-all-embeddings",
                  "--encoder-alibi-variant", "symmetric", "--max-update", 2,
                  "--save-dir", tmp_path / "ckpt")
    assert '"num_updates": "2"' in out


@pytest.mark.slow
@pytest.mark.parametrize("config,model", [("iwslt14_de_en_alibi", "AlibiTransformerModel"),
                                          ("iwslt14_de_en_alibi_pointer", "AlibiTransformerModel"),
                                          ("iwslt14_de_en_sinusoidal", "TransformerModel")])
def test_shipped_configs_compose_and_train_two_updates(corpus, alibi_user_dir, tmp_path,
                                                       config, model):
    root, _, _ = corpus
    sizes = [f"+model.{k}={v}" for k, v in dict(
        encoder_layers=1, decoder_layers=1, encoder_embed_dim=32, decoder_embed_dim=32,
        encoder_ffn_embed_dim=64, decoder_ffn_embed_dim=64, encoder_attention_heads=4,
        decoder_attention_heads=4).items()]
    out = run_cli(
        "fairseq-hydra-train", "--config-dir", f"{alibi_user_dir}/config/translation",
        "--config-name", config, f"task.data={root / 'bin'}", "task.source_lang=src",
        "task.target_lang=tgt", "common.cpu=true", "optimization.max_update=2",
        "optimization.max_epoch=0", "dataset.max_tokens=256", "dataset.num_workers=0",
        "common.log_format=json", f"hydra.run.dir={tmp_path}", *sizes,
        cwd=tmp_path)  # any folder: the config finds the plugin itself
    assert f"model: {model}" in out and '"train_num_updates": "2"' in out
    assert (tmp_path / "checkpoints" / "checkpoint_last.pt").is_file()
    if config.endswith("pointer"):  # the recommended cross-attention options, saved
        import torch

        state = torch.load(tmp_path / "checkpoints" / "checkpoint_last.pt", weights_only=False)
        saved = state["cfg"]["model"]
        saved = vars(saved) if not isinstance(saved, dict) else saved  # a Namespace (legacy)
        assert (saved["cross_alibi"], saved["cross_alibi_slope_scale"],
                saved["cross_alibi_heads"], saved["cross_alibi_eos_guard"],
                saved["cross_alibi_eos_guard_layer"]) == ("pointer", 16.0, 2, 2.0, "min")
        # (chosen on validation); the inference slopes beyond the longest source trained on,
        # which the model recorded, not a length given by hand
        assert saved["cross_alibi_inference_longer_than"] is None
        assert int(state["model"]["longest_training_source.tokens"]) > 1


# ---------------------------------------------------------------- bad input at the command line


@pytest.mark.slow
def test_stock_checkpoint_and_other_dictionary_are_clear_errors(trained, corpus, alibi_user_dir,
                                                                 tmp_path):
    save, _ = trained
    root, raw, _ = corpus
    stock = tmp_path / "stock"
    # stock fairseq without this package's exit handler: no batch-prefetch thread, or
    # Python 3.11 can abort the process at exit after a good run (fairseq_alibi/exit_cleanup.py)
    run_cli("fairseq-train", root / "bin", "--arch", "transformer", *TRAIN, "--max-update", 1,
            "--data-buffer-size", 0, "--save-dir", stock)
    # a stock checkpoint (sinusoidal on both sides): ONE hint naming both sides' flag
    out = run_cli("fairseq-train", root / "bin", "--user-dir", alibi_user_dir,
                  "--arch", "alibi_transformer", *TRAIN, "--max-update", 2,
                  "--finetune-from-model", stock / "checkpoint_last.pt",
                  "--save-dir", tmp_path / "alibi", expect_ok=False)
    hint = out.strip().splitlines()[-1]
    assert hint.startswith("fairseq_alibi: CheckpointMismatchError: this checkpoint was trained "
                           "with no ALiBi on the encoder and decoder (no encoder.alibi.slopes, "
                           "decoder.alibi.slopes")
    assert "`--encoder-alibi-variant none --decoder-alibi-variant none`" in hint
    prepare(raw, tmp_path / "joined", "--joined-dictionary")  # another dictionary size
    out = run_cli("fairseq-generate", tmp_path / "joined", "--user-dir", alibi_user_dir,
                  "--path", save / "checkpoint_last.pt", "--gen-subset", "test", "--cpu",
                  "--batch-size", 8, expect_ok=False)
    # one line, no traceback (a translation folder's dictionaries are per side)
    assert re.search(r"^CheckpointMismatchError: this checkpoint was trained with a dictionary "
                     r"of \d+ symbols, but the data directory's dict.<source-lang>.txt has",
                     out.strip().splitlines()[-1])
    assert "Traceback" not in out


# ---------------------------------------------------------------- the extrapolation experiment


@pytest.mark.slow
def test_the_extrapolation_experiment_runs_on_the_embedded_corpus(tmp_path):
    """experiments/punctuation_restoration.py end to end at toy sizes, on the corpus built from
    Python's own documentation (no download): every test input translated and scored."""
    out = tmp_path / "restoration"
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.punctuation_restoration"] + [
            str(a) for a in ["--embedded", "--out", out, "--N", 8, "--per-bucket", 3,
                             "--max-update", 3, "--layers", 1, "--dim", 16, "--vocab", 200]],
        capture_output=True, text=True, timeout=900, cwd=str(REPO),
        env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert set(results["results"]) == {"ALiBi", "Sinusoidal"}
    for rows in results["results"].values():
        assert [r["bucket"] for r in rows] == ["5-8", "9-16", "17-32", "33-64"]
        assert all(r["sentences"] == 3 for r in rows)
    assert "translated all 12 test inputs" in proc.stdout
    assert (out / "results.md").is_file() and (out / "results.csv").is_file()
