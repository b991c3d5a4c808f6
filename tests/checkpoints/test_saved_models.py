"""Checkpoints written before the option/stack/bias redesign load and compute what they did.

``tests/fixtures/saved_models`` holds tiny checkpoints of every model family, written at commit
bd1dbc2 by fairseq's own ``Trainer`` with the options that have state of their own (learned
slope scales of every shape, asymmetric learnable forward slopes, one_sided, CLAP with a zero
``<mask>`` omitted from the embedding, learned positions, the cross-attention pointer with its
slope scale and EOS guard, the ratio anchor with the length scale, SHAPE on stock positions),
and what each computed then (``outputs.pt``; ``make.py`` wrote both). Each is loaded here by
fairseq's own loader, as ``fairseq-eval-lm`` / ``fairseq-generate`` do, and must give the same
outputs (1e-5), the same step-by-step decoding, and the same beam hypotheses.
"""

import pytest
import torch
from fairseq import checkpoint_utils

from tests.fixtures.saved_models.make import MODELS, _generation_args
from tests.helpers.cli import REPO

FIXTURES = REPO / "tests" / "fixtures" / "saved_models"
SAVED = torch.load(FIXTURES / "outputs.pt", weights_only=False)


def load(name):
    overrides = {"data": str(FIXTURES)}
    if name.startswith("roberta"):
        overrides["load_checkpoint_heads"] = True
    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(FIXTURES / name / "checkpoint.pt")], arg_overrides=overrides)
    return models[0].eval(), task


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_checkpoint_written_before_the_redesign_computes_what_it_did(name):
    model, task = load(name)
    saved = SAVED[name]
    with torch.no_grad():
        if name.startswith("lm"):
            out = model(saved["tokens"])[0]
            state, steps = {}, []
            for t in range(saved["tokens"].size(1)):
                steps.append(model.decoder(saved["tokens"][:, : t + 1],
                                           incremental_state=state)[0][:, -1])
            torch.testing.assert_close(torch.stack(steps, 1), saved["decoded"], rtol=0,
                                       atol=1e-5)
        elif name.startswith("roberta"):
            out = model(saved["tokens"])[0]
            if "classification" in saved:
                head = model(saved["tokens"], features_only=True,
                             classification_head_name="fixture_head")[0]
                torch.testing.assert_close(head, saved["classification"], rtol=0, atol=1e-5)
        else:
            out = model(saved["src_tokens"], saved["src_lengths"],
                        saved["prev_output_tokens"])[0]
            generator = task.build_generator([model], _generation_args(beam=3))
            sample = {"net_input": {"src_tokens": saved["src_tokens"],
                                    "src_lengths": saved["src_lengths"]},
                      "id": torch.arange(saved["src_tokens"].size(0))}
            hypos = generator.generate([model], sample)
            got = [[h["tokens"].tolist() for h in row] for row in hypos]
            assert got == [[t.tolist() for t in row] for row in saved["hypotheses"]]
            scores = torch.stack([torch.stack([h["score"] for h in row]) for row in hypos])
            torch.testing.assert_close(scores, saved["scores"], rtol=0, atol=1e-5)
    torch.testing.assert_close(out, saved["output"], rtol=0, atol=1e-5)


def test_the_fixtures_exercise_what_they_claim():
    """The saved state that the test above must carry across (not initial values)."""
    def state(name):
        return torch.load(FIXTURES / name / "checkpoint.pt", weights_only=False)["model"]

    scales = state("lm_learned_per_layer_head")["decoder.alibi.scales"]
    assert scales.shape == (2, 4) and scales.std() > 0.1
    ratio = state("roberta_asymmetric_learnable")[
        "encoder.sentence_encoder.alibi.future_slope_ratio"]
    assert ratio.shape == (4,) and (ratio - 0.5).abs().max() > 0.1
    pointer = state("translation_pointer")
    assert any(".pointer_step." in k for k in pointer)
    lengths = [len(h) for row in SAVED["translation_pointer"]["hypotheses"] for h in row]
    assert max(lengths) > min(lengths) > 1  # beam search did more than stop at once
