"""alibi_transformer_lm in process: every architecture, KV-cache decoding, no absolute positions,
clear errors for checkpoints of the wrong kind, and torch>=2.6 loading of fairseq checkpoints."""

import argparse
import subprocess
import sys

import pytest
import torch
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import ARCH_MODEL_REGISTRY

import fairseq_alibi  # noqa: F401  (registers the models)
from fairseq_alibi.modules.stacks import UNBOUNDED_POSITIONS

TINY = ["--decoder-layers", "2", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
        "--decoder-attention-heads", "4", "--decoder-input-dim", "32", "--decoder-output-dim", "32"]
ALIBI_ARCHS = sorted(a for a, m in ARCH_MODEL_REGISTRY.items() if m.__name__ == "AlibiTransformerLanguageModel")


def build(data, arch, *extra, tokens_per_sample=16):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        str(data), "--task", "language_modeling", "--arch", arch, "--cpu",
        "--tokens-per-sample", str(tokens_per_sample), *extra,
    ])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    return task.build_model(cfg.model).eval(), task


def test_the_mirrored_architectures_are_registered():
    for arch in ["alibi_transformer_lm", "alibi_transformer_lm_wiki103", "alibi_transformer_lm_gpt",
                 "alibi_transformer_lm_gpt2_small", "alibi_transformer_lm_gpt2_medium"]:
        assert arch in ALIBI_ARCHS


@pytest.mark.parametrize("arch", ALIBI_ARCHS)
def test_every_architecture_builds_and_runs_at_test_dims(tiny_lm_data, arch):
    extra = list(TINY)
    if "wiki103" in arch or "gbw" in arch:  # adaptive input/softmax: cutoffs inside a tiny vocab
        extra += ["--adaptive-input-cutoff", "20,40", "--adaptive-softmax-cutoff", "20,40"]
    model, task = build(tiny_lm_data, arch, *extra)
    assert model.decoder.embed_positions is None
    assert model.max_positions() == UNBOUNDED_POSITIONS
    tokens = torch.randint(4, len(task.dictionary), (2, 40))  # longer than tokens_per_sample
    out = model(tokens)[0]
    assert out.shape[:2] == (2, 40) and torch.isfinite(out).all()


@pytest.fixture(scope="module")
def model_and_task(tiny_lm_data):
    torch.manual_seed(0)
    return build(tiny_lm_data, "alibi_transformer_lm", *TINY, "--dropout", "0.1")


def test_incremental_decoding_equals_full_forward_beyond_training_length(model_and_task):
    model, task = model_and_task
    torch.manual_seed(1)
    tokens = torch.randint(4, len(task.dictionary), (2, 64))  # 4x the training length (16)
    with torch.no_grad():
        full = model(tokens)[0]
        state = {}
        steps = [model.decoder(tokens[:, : t + 1], incremental_state=state)[0][:, -1]
                 for t in range(tokens.size(1))]
    assert torch.allclose(torch.stack(steps, 1), full, atol=1e-5, rtol=0)


def test_beam_reordering_of_the_cache(model_and_task):
    model, task = model_and_task
    tokens = torch.randint(4, len(task.dictionary), (3, 10))
    with torch.no_grad():
        state = {}
        for t in range(9):  # an incremental decoder consumes one new token per call
            model.decoder(tokens[:, : t + 1], incremental_state=state)
        order = torch.tensor([2, 0, 1])
        model.decoder.reorder_incremental_state_scripting(state, order)
        step = model.decoder(tokens[order], incremental_state=state)[0][:, -1]
        full = model(tokens[order])[0][:, -1]
    assert torch.allclose(step, full, atol=1e-5, rtol=0)


def test_cache_with_spare_room_through_growth_reorders_and_forks(model_and_task):
    """The KV cache is written in place into a buffer with spare room (append_to_cache): exact
    across the buffer's growth (150 steps: several growths), beam reorders that duplicate and drop rows, the
    identity reorder (skipped), and two continuations of one prefix sharing its buffer."""
    model, task = model_and_task
    torch.manual_seed(2)
    tokens = torch.randint(4, len(task.dictionary), (3, 150))

    def steps(state, toks, start, stop):
        return [model.decoder(toks[:, : t + 1], incremental_state=state)[0][:, -1]
                for t in range(start, stop)]

    with torch.no_grad():
        state = {}
        steps(state, tokens, 0, 70)
        order = torch.tensor([2, 2, 0])
        model.decoder.reorder_incremental_state_scripting(state, order)
        model.decoder.reorder_incremental_state_scripting(state, torch.arange(3))  # identity
        reordered = tokens[order]
        out = torch.stack(steps(state, reordered, 70, 150), 1)
        assert torch.allclose(out, model(reordered)[0][:, 70:], atol=1e-5, rtol=0)

        # two continuations of one prefix: the second copy shares the first's buffers
        prefix = {}
        steps(prefix, tokens, 0, 20)
        fork = {key: dict(value) for key, value in prefix.items()}
        other = tokens.clone()
        other[:, 20:] = torch.flip(tokens[:, 20:], dims=[1])
        first, second = [], []
        for t in range(20, 30):  # interleaved, as a tree search would
            first += steps(prefix, tokens, t, t + 1)
            second += steps(fork, other, t, t + 1)
        first, second = torch.stack(first, 1), torch.stack(second, 1)
        assert torch.allclose(first, model(tokens[:, :30])[0][:, 20:], atol=1e-5, rtol=0)
        assert torch.allclose(second, model(other[:, :30])[0][:, 20:], atol=1e-5, rtol=0)


def test_cached_decoding_while_autograd_records(model_and_task):
    """With autograd on, the cache is concatenated (in-place writes would break backward)."""
    model, task = model_and_task
    tokens = torch.randint(4, len(task.dictionary), (2, 6))
    model.eval()
    state = {}
    outs = [model.decoder(tokens[:, : t + 1], incremental_state=state)[0][:, -1]
            for t in range(6)]
    torch.stack(outs).sum().backward()
    with torch.no_grad():
        assert torch.allclose(torch.stack(outs, 1), model(tokens)[0], atol=1e-5, rtol=0)
    model.zero_grad()


def test_output_does_not_depend_on_absolute_offset(model_and_task):
    """The same window, shifted right by left padding, gives the same outputs."""
    model, task = model_and_task
    pad = task.dictionary.pad()
    window = torch.randint(4, len(task.dictionary), (1, 20))
    with torch.no_grad():
        alone = model(window)[0]
        for shift in (1, 7, 33):
            shifted = torch.cat([torch.full((1, shift), pad), window], dim=1)
            assert torch.allclose(model(shifted)[0][:, shift:], alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("positions", [[], ["--decoder-learned-pos"]], ids=["sinusoidal", "learned"])
def test_stock_checkpoint_into_alibi_model_is_a_clear_error(tiny_lm_data, model_and_task, positions):
    stock, _ = build(tiny_lm_data, "transformer_lm", *TINY, *positions)
    alibi_model, _ = model_and_task
    with pytest.raises(ValueError, match="position embeddings.*convert"):
        alibi_model.load_state_dict(stock.state_dict(), strict=True)


def test_alibi_checkpoint_into_stock_model_is_refused(tiny_lm_data, model_and_task):
    alibi_model, _ = model_and_task
    for arch in ("transformer_lm", ):
        stock, _ = build(tiny_lm_data, arch, *TINY)
        with pytest.raises(RuntimeError, match="alibi.slopes"):
            stock.load_state_dict(alibi_model.state_dict(), strict=True)


def test_unknown_backend_flag_is_a_clear_error(tiny_lm_data):
    with pytest.raises(SystemExit):
        build(tiny_lm_data, "alibi_transformer_lm", *TINY, "--alibi-attention", "cuda-magic")


@pytest.mark.slow
def test_argparse_era_checkpoints_load_with_torch_weights_only(tmp_path):
    """torch>=2.6 refuses argparse.Namespace unless fairseq_alibi.safe_loading allow-lists it."""
    import numpy as np

    path = tmp_path / "old.pt"
    torch.save({"args": argparse.Namespace(arch="roberta_base", lr=[1e-4]),
                "model": {"w": torch.ones(2)}, "extra_state": {"val_loss": np.float64(1.5)},
                "optimizer_history": []}, path)
    # exactly the call fairseq's checkpoint_utils.load_checkpoint_to_cpu makes
    code = ("import sys, torch; {imp}"
            "s = torch.load(open(sys.argv[1], 'rb'), map_location=torch.device('cpu'));"
            "print(s['args'].arch, float(s['extra_state']['val_loss']))")
    ok = subprocess.run([sys.executable, "-c", code.format(imp="import fairseq_alibi;"), str(path)],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert ok.stdout.split()[-2:] == ["roberta_base", "1.5"]
    without = subprocess.run([sys.executable, "-c", code.format(imp=""), str(path)],
                             capture_output=True, text=True)
    assert without.returncode != 0 and "argparse.Namespace" in without.stderr
