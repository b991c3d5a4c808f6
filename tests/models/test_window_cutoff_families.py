"""The load-time window cutoff reaches the encoder and the translation families through the tools
that score them: ``--model-overrides "{'alibi_window_cutoff': T}"`` of masked-LM validation
(``fairseq-validate --task masked_lm``, and the encoder study's in-process scoring that computes
the same), and ``{'encoder_alibi_window_cutoff': T, 'decoder_alibi_window_cutoff': T}`` of
``fairseq-generate``. Each test fails if the override were ignored: the figures with the cutoff
differ from the dense ones (saved models with weights off their initial values, 4 heads with
slopes 1/4 … 1/256: a cutoff of 1/4 nat keeps 1, 4, 16 and 64 keys a side)."""

import re

import pytest
import torch
from fairseq import checkpoint_utils

import fairseq_alibi  # noqa: F401  (registers the models, loads their checkpoints)

from tests.helpers.cli import REPO, run_cli

FIXTURES = REPO / "tests" / "fixtures" / "saved_models"
CUTOFF = 0.25
WORDS = 30


def saved(name):
    return FIXTURES / name / "checkpoint.pt"


def load(name, **overrides):
    return checkpoint_utils.load_model_ensemble(
        [str(saved(name))], arg_overrides={"data": str(FIXTURES), **overrides})[0][0].eval()


def sentences(count, low, high, seed=0):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (count,), generator=generator).tolist()
    return [" ".join(f"w{int(i)}" for i in torch.randint(0, WORDS, (n,), generator=generator))
            for n in lengths]


@pytest.mark.parametrize("name", ["roberta_zero_clap", "roberta_one_sided_head"])
def test_a_masked_lm_takes_the_cutoff_at_load_time_and_computes_with_it(name):
    dense, windowed = load(name), load(name, alibi_window_cutoff=CUTOFF)
    assert windowed.encoder.sentence_encoder.alibi.window_cutoff == CUTOFF
    assert dense.encoder.sentence_encoder.alibi.window_cutoff == 0.0
    tokens = torch.randint(4, WORDS, (2, 16), generator=torch.Generator().manual_seed(1))
    tokens[:, 0] = 0  # <s>
    with torch.no_grad():
        assert not torch.allclose(dense(tokens)[0], windowed(tokens)[0], atol=1e-4)


def test_a_translation_model_takes_each_sides_cutoff_at_load_time():
    model = load("translation_pointer", encoder_alibi_window_cutoff=CUTOFF,
                 decoder_alibi_window_cutoff=2 * CUTOFF)
    assert model.encoder.alibi.window_cutoff == CUTOFF
    assert model.decoder.alibi.window_cutoff == 2 * CUTOFF


@pytest.fixture(scope="module")
def binarized(tmp_path_factory):
    """The fixtures' dictionaries' words as a masked-LM ``test`` split and a parallel one."""
    root = tmp_path_factory.mktemp("window_families")
    raw = root / "raw"
    raw.mkdir()
    (raw / "test.txt").write_text("\n".join(sentences(24, 10, 30)) + "\n")
    for side, seed in (("src", 1), ("tgt", 2)):
        (raw / f"test.{side}").write_text("\n".join(sentences(12, 10, 14, seed)) + "\n")
    run_cli("fairseq-preprocess", "--only-source", "--testpref", raw / "test.txt",
            "--srcdict", FIXTURES / "dict.txt", "--destdir", root / "mlm", "--workers", 1)
    run_cli("fairseq-preprocess", "-s", "src", "-t", "tgt", "--testpref", raw / "test",
            "--srcdict", FIXTURES / "dict.src.txt", "--tgtdict", FIXTURES / "dict.tgt.txt",
            "--destdir", root / "mt", "--workers", 1)
    return root


def validate(data, name, *overrides):
    out = run_cli("fairseq-validate", data, "--user-dir", REPO / "fairseq_alibi",
                  "--path", saved(name), "--task", "masked_lm", "--valid-subset", "test",
                  "--tokens-per-sample", 16, "--max-tokens", 256, "--cpu", "--seed", 1,
                  "--num-workers", 0, *overrides)
    found = re.search(r"valid on 'test' subset \| loss ([\d.]+)", out)
    assert found, out[-2000:]
    return float(found.group(1))


@pytest.mark.slow
def test_masked_lm_validation_accepts_the_cutoff_and_computes_with_it(binarized):
    data = binarized / "mlm"
    dense = validate(data, "roberta_zero_clap")
    assert validate(data, "roberta_zero_clap", "--model-overrides",
                    "{'alibi_window_cutoff': 0}") == dense
    windowed = validate(data, "roberta_zero_clap", "--model-overrides",
                        f"{{'alibi_window_cutoff': {CUTOFF}}}")
    assert windowed != dense


def generate(data, *overrides):
    out = run_cli("fairseq-generate", data, "--user-dir", REPO / "fairseq_alibi",
                  "--path", saved("translation_pointer"), "--gen-subset", "test",
                  "--beam", 2, "--batch-size", 4, "--required-batch-size-multiple", 1,
                  "--cpu", "--max-len-a", 1.2, "--max-len-b", 4, *overrides)
    hyps = dict(re.findall(r"^H-(\d+)\t(\S+\t.*)$", out, re.M))
    assert len(hyps) == 12 and "Translated 12 sentences" in out, out[-2000:]
    return hyps


@pytest.mark.slow
def test_generation_applies_the_cutoff_of_each_side(binarized):
    data = binarized / "mt"
    dense = generate(data)
    both = generate(data, "--model-overrides", f"{{'encoder_alibi_window_cutoff': {CUTOFF}, "
                                               f"'decoder_alibi_window_cutoff': {CUTOFF}}}")
    decoder = generate(data, "--model-overrides",
                       f"{{'decoder_alibi_window_cutoff': {CUTOFF}}}")
    assert both != dense and decoder != dense and both != decoder
    # the scores (first field) differ, not only by rounding of the same hypotheses
    assert any(both[i].split("\t")[0] != dense[i].split("\t")[0] for i in dense)
