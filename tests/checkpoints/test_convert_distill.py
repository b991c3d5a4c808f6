"""Converting a stock transformer_lm to ALiBi, and distilling it from the original.

``python -m fairseq_alibi.convert`` on checkpoints with sinusoidal and learned positions: every
other weight bit-identical, the result evaluated by fairseq-eval-lm beyond the training length,
clear errors for what cannot be converted. ``lm_distillation``: the loss against the formula
on a hand-built example, gradients only in the student, and training through fairseq-train
with the teacher nowhere in the student's checkpoints.
"""

import math
import os
import re
import subprocess
import sys

import pytest
import torch

from fairseq_alibi.alibi import get_slopes
from fairseq_alibi.criterions.lm_distillation import distillation_loss
from tests.helpers.building import setup_from_command_line, write_dictionary
from tests.helpers.cli import run_cli

L = 16
HEADS = 4
DIMS = ["--decoder-layers", "2", "--decoder-embed-dim", "32", "--decoder-input-dim", "32",
        "--decoder-output-dim", "32", "--decoder-ffn-embed-dim", "64",
        "--decoder-attention-heads", str(HEADS), "--share-decoder-input-output-embed"]
TRAIN = ["--task", "language_modeling", *DIMS, "--tokens-per-sample", str(L),
         "--sample-break-mode", "none", "--max-tokens", "256", "--optimizer", "adam",
         "--lr", "0.003", "--cpu", "--no-progress-bar", "--log-interval", "1", "--seed", "1",
         "--num-workers", "0", "--disable-validation"]
POSITIONS = {"sinusoidal": [], "learned": ["--decoder-learned-pos"]}


@pytest.fixture(scope="module")
def stock(tmp_path_factory, tiny_lm_data, alibi_user_dir):
    """Stock transformer_lm checkpoints, one per kind of position embedding."""
    found = {}
    for kind, flags in POSITIONS.items():
        save = tmp_path_factory.mktemp(f"stock_{kind}")
        run_cli("fairseq-train", tiny_lm_data, "--user-dir", alibi_user_dir, *TRAIN, *flags,
                "--arch", "transformer_lm", "--max-update", "4", "--save-dir", save)
        found[kind] = save / "checkpoint_last.pt"
    return found


@pytest.fixture(scope="module")
def lm_dictionary(tmp_path_factory):
    """A data folder holding only the dictionary of ``tiny_lm_data`` (60 words, 64 symbols):
    all that building a language-modelling task reads."""
    return write_dictionary(tmp_path_factory.mktemp("lm_dictionary"), 60)


@pytest.fixture(scope="module")
def written(lm_dictionary, tmp_path_factory):
    """Stock transformer_lm checkpoints, one per kind of position embedding, written in this
    process by fairseq's own ``Trainer`` (what fairseq-train saves with), untrained: for the
    in-process tests, which read the format, not trained weights (``stock`` trains them)."""
    from fairseq.trainer import Trainer

    found = {}
    for kind, flags in POSITIONS.items():
        save = tmp_path_factory.mktemp(f"written_{kind}")
        cfg, task = setup_from_command_line(lm_dictionary, *TRAIN, *flags, "--arch",
                                            "transformer_lm", "--save-dir", save)
        model = task.build_model(cfg.model)
        trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
        trainer.consolidate_optimizer()  # what fairseq's save_checkpoint does first
        trainer.save_checkpoint(str(save / "checkpoint_last.pt"), {})
        found[kind] = save / "checkpoint_last.pt"
    return found


def convert(source, target, *extra, expect_ok=True):
    proc = subprocess.run(
        [sys.executable, "-m", "fairseq_alibi.convert", "--input", str(source), "--output",
         str(target), *extra], capture_output=True, text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert (proc.returncode == 0) == expect_ok, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def converted(stock, tmp_path_factory):
    out = tmp_path_factory.mktemp("converted")
    for kind, path in stock.items():
        printed = convert(path, out / f"{kind}.pt")
        assert f"dropped  {kind} positions" in printed
    return {kind: out / f"{kind}.pt" for kind in stock}


def load(path):
    return torch.load(path, map_location="cpu")


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(POSITIONS))
def test_conversion_keeps_every_other_weight_bit_identical(stock, converted, tiny_lm_data, kind):
    before, after = load(stock[kind]), load(converted[kind])
    positional = {k for k in before["model"] if k.startswith("decoder.embed_positions.")}
    # learned positions are a weight; sinusoidal ones are computed, not stored
    assert positional == ({"decoder.embed_positions.weight"} if kind == "learned" else set())
    kept = set(before["model"]) - positional
    assert set(after["model"]) == kept | {"decoder.alibi.slopes"}
    for key in kept:
        a, b = before["model"][key], after["model"][key]
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), key
    assert torch.equal(after["model"]["decoder.alibi.slopes"], get_slopes(HEADS))
    assert after["cfg"]["model"]["_name"] == "alibi_transformer_lm"
    assert after["last_optimizer_state"] is None
    # what fairseq loads from it, with the original dictionary, holds exactly those weights
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel

    hub = AlibiTransformerLanguageModel.from_pretrained(
        str(converted[kind].parent), converted[kind].name, data_name_or_path=str(tiny_lm_data))
    loaded = hub.models[0].state_dict()
    assert set(loaded) == set(after["model"])
    for key, value in loaded.items():
        assert torch.equal(value, after["model"][key]), key


def eval_lm(path, data, user_dir, length):
    out = run_cli("fairseq-eval-lm", data, "--user-dir", user_dir, "--path", path, "--cpu",
                  "--max-tokens", 4096, "--num-workers", 0, "--tokens-per-sample", length)
    tokens = int(re.search(r"Evaluated ([\d,]+) tokens", out).group(1).replace(",", ""))
    return tokens, float(re.search(r"Perplexity: ([\d.]+)", out).group(1))


@pytest.mark.slow
def test_converted_model_runs_through_eval_lm_beyond_the_learned_positions(
        converted, tiny_lm_data, alibi_user_dir):
    tokens_l, ppl_l = eval_lm(converted["learned"], tiny_lm_data, alibi_user_dir, L)
    tokens_4l, ppl_4l = eval_lm(converted["learned"], tiny_lm_data, alibi_user_dir, 4 * L)
    assert tokens_l > 0 and tokens_l == tokens_4l  # nothing skipped at 4L
    # measured 2026-11-26 (--seed 1 of the stock model; seeds 2, 3; the same on 2 threads):
    # at L 103.0 (110.3, 105.2), at 4L 105.7 (111.3, 108.7), 4L / L 1.026 (1.009, 1.033); the
    # bounds add the seeds' spread on each side
    assert 95 < ppl_l < 118 and 99 < ppl_4l < 117
    assert 0.98 < ppl_4l / ppl_l < 1.06  # beyond the learned positions, no blow-up


@pytest.mark.slow
def test_conversion_refuses_what_it_cannot_convert(stock, converted, tmp_path, capsys):
    from fairseq_alibi.cli.convert_checkpoints import main

    out = tmp_path / "x.pt"
    assert "already an ALiBi language model" in convert(converted["sinusoidal"], out,
                                                        expect_ok=False)

    state = load(stock["sinusoidal"])
    state["cfg"]["model"]["_name"] = "transformer"
    torch.save(state, tmp_path / "mt.pt")
    state["cfg"]["model"]["_name"] = "transformer_lm"
    state["cfg"]["model"]["character_embeddings"] = True
    torch.save(state, tmp_path / "chars.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    cases = {
        tmp_path / "mt.pt": "only fairseq transformer_lm checkpoints",
        tmp_path / "chars.pt": "character-level input embeddings",
        tmp_path / "junk.pt": "cannot read",
        tmp_path / "missing.pt": "no checkpoint at",
        stock["sinusoidal"]: "--output must differ from --input",
    }
    cases[stock["learned"]] = "not an ALiBi language model architecture"  # with --arch below
    for source, message in cases.items():
        target = source if "differ" in message else out
        arch = ["--arch", "transformer_lm"] if "architecture" in message else []
        assert main(["--input", str(source), "--output", str(target), *arch]) == 1
        assert message in capsys.readouterr().err, message
        assert not out.exists() and not list(tmp_path.glob(".*.tmp"))


def test_conversion_drops_the_placeholder_of_older_sinusoidal_checkpoints(written, tmp_path):
    from fairseq_alibi.cli.convert_checkpoints import convert_file

    state = load(written["sinusoidal"])
    state["model"]["decoder.embed_positions._float_tensor"] = torch.zeros(1)
    torch.save(state, tmp_path / "old.pt")
    summary = convert_file(tmp_path / "old.pt", tmp_path / "new.pt")
    assert summary["dropped"] == ["decoder.embed_positions._float_tensor"]
    assert not any("embed_positions" in k for k in load(tmp_path / "new.pt")["model"])


def test_conversion_of_an_argparse_era_checkpoint(written, lm_dictionary, tmp_path):
    """Older fairseq checkpoints hold an argparse Namespace ("args") instead of "cfg"."""
    from fairseq import options

    from fairseq_alibi.cli.convert_checkpoints import convert_file
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel

    state = load(written["learned"])
    state["args"] = options.parse_args_and_arch(options.get_training_parser(), [
        str(lm_dictionary), *TRAIN, *POSITIONS["learned"], "--arch", "transformer_lm"])
    state["cfg"] = None
    torch.save(state, tmp_path / "old.pt")
    summary = convert_file(tmp_path / "old.pt", tmp_path / "new.pt")
    assert summary["dropped"] == ["decoder.embed_positions.weight"]
    hub = AlibiTransformerLanguageModel.from_pretrained(
        str(tmp_path), "new.pt", data_name_or_path=str(lm_dictionary))
    for key, value in hub.models[0].state_dict().items():
        expected = get_slopes(HEADS) if key == "decoder.alibi.slopes" else state["model"][key]
        assert torch.equal(value, expected), key


def _main(capsys, *args):
    """``fairseq-alibi convert`` in this process: (exit status, stdout, stderr)."""
    from fairseq_alibi.cli.convert_checkpoints import main

    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_placeholder_buffer_is_not_reported_as_parameters(written, tmp_path, capsys):
    state = load(written["sinusoidal"])
    state["model"]["decoder.embed_positions._float_tensor"] = torch.zeros(1)
    torch.save(state, tmp_path / "old.pt")
    code, out, _ = _main(capsys, "--input", tmp_path / "old.pt", "--output", tmp_path / "new.pt")
    assert code == 0 and "parameters)" not in out, out
    assert ("dropped  sinusoidal positions: no parameter (computed, not stored), only the "
            "placeholder buffer decoder.embed_positions._float_tensor") in out
    table = load(written["learned"])["model"]["decoder.embed_positions.weight"]
    code, out, _ = _main(capsys, "--input", written["learned"], "--output", tmp_path / "l.pt")
    assert code == 0 and ("dropped  learned positions: decoder.embed_positions.weight "
                          f"({table.numel():,} parameters)") in out, out


def test_an_existing_output_is_replaced_only_with_overwrite(written, tmp_path, capsys):
    """The package's rule (docs/configs_and_data.md): nothing existing is replaced silently."""
    target = tmp_path / "new.pt"
    assert _main(capsys, "--input", written["learned"], "--output", target)[0] == 0
    target.write_bytes(b"kept")
    code, out, err = _main(capsys, "--input", written["learned"], "--output", target)
    assert code == 1 and err == f"error: --output {target} already exists; pass --overwrite " \
                                "to replace it\n", err
    assert target.read_bytes() == b"kept"
    assert _main(capsys, "--input", written["learned"], "--output", target, "--overwrite")[0] == 0
    assert "decoder.alibi.slopes" in load(target)["model"]


def test_an_output_in_a_missing_folder_is_created_and_said(written, tmp_path, capsys):
    """Missing folders are made, as the package's other tools make them (and
    docs/workflows.md's alibi/converted.pt needs), and said; a folder as --output is refused."""
    target = tmp_path / "nodir" / "sub" / "x.pt"
    code, out, _ = _main(capsys, "--input", written["learned"], "--output", target)
    assert code == 0 and target.is_file()
    assert out.startswith(f"created the folder {tmp_path / 'nodir'} for --output\n"), out
    code, out, _ = _main(capsys, "--input", written["learned"], "--output", tmp_path / "y.pt")
    assert code == 0 and "created the folder" not in out
    code, _, err = _main(capsys, "--input", written["learned"], "--output", tmp_path)
    assert code == 1 and err == (f"error: --output {tmp_path} is a folder: give the file to "
                                 f"write (e.g. {tmp_path / 'model.pt'})\n"), err


def test_an_input_folder_names_the_checkpoints_in_it(written, tmp_path, capsys):
    """A save directory given to --input: the file to give, from those there (read_checkpoint,
    shared with the other tools)."""
    folder = written["learned"].parent
    code, _, err = _main(capsys, "--input", folder, "--output", tmp_path / "x.pt")
    assert code == 1 and err == (f"error: {folder} is a folder: give a checkpoint file in it, "
                                 f"e.g. {folder / 'checkpoint_last.pt'} (.pt files there: "
                                 "checkpoint_last.pt)\n"), err
    code, _, err = _main(capsys, "--input", tmp_path, "--output", tmp_path / "x.pt")
    assert code == 1 and f"{tmp_path} is a folder, with no .pt file in it" in err


def test_a_plain_pickle_is_one_error_line_without_torchs_warning(tmp_path, capsys):
    import pickle
    import warnings

    (tmp_path / "pickled.pt").write_bytes(pickle.dumps([1, 2], protocol=4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = _main(capsys, "--input", tmp_path / "pickled.pt", "--output",
                             tmp_path / "z.pt")
    assert code == 1 and len(err.strip().splitlines()) == 1 and "torch's safe loader" in err
    assert not [w for w in caught if "pickle protocol" in str(w.message)], caught


def test_a_stock_roberta_checkpoint_is_refused_as_the_docs_say(tiny_lm_data, tmp_path, capsys):
    """A stock RoBERTa's argparse-era config holds masked_lm's mask_prob, the name of an EIFY
    option too: it is no EIFY checkpoint (nothing to convert: alibi_roberta loads it)."""
    from tests.helpers.checkpoints import saved_in_process
    from tests.helpers.training import STOCK

    path = saved_in_process(tmp_path / "roberta.pt", tiny_lm_data, *STOCK["encoder"])
    code, out, err = _main(capsys, "--input", path, "--output", tmp_path / "x.pt")
    assert code == 1 and not out and err == (
        "error: this is a stock RoBERTa checkpoint (roberta_base): nothing to convert; load it "
        "as alibi_roberta --alibi-variant none --mlm-head roberta (learned positions)\n"), err


def test_from_press_on_a_checkpoint_nothing_marks_as_press_warns(written, tmp_path, capsys):
    code, out, err = _main(capsys, "--input", written["learned"], "--output", tmp_path / "x.pt",
                           "--from", "press")
    assert code == 0 and err.startswith(
        f"warning: nothing marks {written['learned']} as a Press checkpoint (its model config "
        "has no max_tokens"), err
    assert "convert it without --from press" in err


# ------------------------------------------------------------------ the distillation criterion


def test_distillation_loss_equals_the_formula_on_a_hand_built_example():
    student = [[1.0, 2.0, 0.5], [0.0, -1.0, 3.0], [5.0, 0.0, 0.0]]
    teacher = [[2.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 9.0, 0.0]]
    target, pad = [1, 2, 0], 0  # the third token is padding
    alpha, T = 0.3, 2.0

    def log_softmax(row, t=1.0):
        z = math.log(sum(math.exp(x / t) for x in row))
        return [x / t - z for x in row]

    ce = sum(-log_softmax(s)[y] for s, y in zip(student, target) if y != pad)
    kl = 0.0
    for s, t, y in zip(student, teacher, target):
        if y != pad:
            log_p, log_q = log_softmax(t, T), log_softmax(s, T)
            kl += sum(math.exp(lp) * (lp - lq) for lp, lq in zip(log_p, log_q))
    expected = alpha * ce + (1 - alpha) * T**2 * kl

    loss, got_ce, got_kl = distillation_loss(
        torch.tensor(student), torch.tensor(teacher), torch.tensor(target), alpha, T, pad)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert (got_ce.item(), got_kl.item()) == (pytest.approx(ce, rel=1e-6), pytest.approx(kl, rel=1e-6))
    # alpha = 1 is plain cross-entropy; identical models have no KL
    assert distillation_loss(torch.tensor(student), torch.tensor(teacher), torch.tensor(target),
                             1.0, T, pad)[0].item() == pytest.approx(ce, rel=1e-6)
    assert distillation_loss(torch.tensor(student), torch.tensor(student), torch.tensor(target),
                             0.0, T, pad)[0].item() == pytest.approx(0.0, abs=1e-6)


def test_gradients_reach_only_the_student(written, lm_dictionary, tmp_path):
    from fairseq_alibi.cli.convert_checkpoints import convert_file

    convert_file(written["sinusoidal"], tmp_path / "student.pt")
    cfg, task = setup_from_command_line(
        lm_dictionary, "--task", "language_modeling", "--arch", "alibi_transformer_lm", *DIMS,
        "--tokens-per-sample", L, "--criterion", "lm_distillation", "--teacher-path",
        written["sinusoidal"], "--distill-alpha", "0.5", "--distill-temperature", "2")
    student = task.build_model(cfg.model)
    student.load_state_dict(load(tmp_path / "student.pt")["model"])
    student.eval()  # no dropout: the loss is recomputed below
    criterion = task.build_criterion(cfg.criterion)
    teacher = criterion.teacher
    assert list(criterion.parameters()) == [] and criterion.state_dict() == {}
    criterion.train()
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())

    torch.manual_seed(0)
    tokens = torch.randint(4, len(task.dictionary), (3, L + 1))
    sample = {"net_input": {"src_tokens": tokens[:, :-1], "src_lengths": torch.full((3,), L)},
              "target": tokens[:, 1:], "ntokens": 3 * L}
    loss, sample_size, logs = criterion(student, sample)
    loss.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert all(p.grad is not None for p in student.parameters())
    assert student.decoder.embed_tokens.weight.grad.abs().sum() > 0
    with torch.no_grad():
        expected, ce, kl = distillation_loss(
            student(**sample["net_input"])[0].reshape(-1, len(task.dictionary)),
            teacher(**sample["net_input"])[0].reshape(-1, len(task.dictionary)),
            sample["target"].reshape(-1), 0.5, 2.0, task.dictionary.pad())
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert sample_size == 3 * L and logs["kl"].item() == pytest.approx(kl.item(), rel=1e-5)


@pytest.mark.slow
def test_distillation_trains_resumes_and_leaves_the_teacher_out(
        stock, converted, tiny_lm_data, alibi_user_dir, tmp_path):
    save = tmp_path / "distilled"
    flags = [*TRAIN, "--arch", "alibi_transformer_lm", "--finetune-from-model",
             converted["sinusoidal"], "--criterion", "lm_distillation", "--teacher-path",
             stock["sinusoidal"], "--distill-alpha", "0.5", "--distill-temperature", "2",
             "--save-dir", save]
    out = run_cli("fairseq-train", tiny_lm_data, "--user-dir", alibi_user_dir, *flags,
                  "--max-update", "3")
    assert re.search(r"\| kl [\d.]+ \|", out) and "num_updates 3" in out
    out = run_cli("fairseq-train", tiny_lm_data, "--user-dir", alibi_user_dir, *flags,
                  "--max-update", "5")
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ 3 updates\)", out)
    assert "num_updates 5" in out
    state = load(save / "checkpoint_last.pt")
    assert set(state["model"]) == set(load(converted["sinusoidal"])["model"])
    assert not state.get("criterion")
    assert state["cfg"]["criterion"]["teacher_path"] == str(stock["sinusoidal"])
    tokens, ppl = eval_lm(save / "checkpoint_last.pt", tiny_lm_data, alibi_user_dir, 4 * L)
    # measured 2026-11-26: 69.1 at --seed 1 (73.8, 72.7 at seeds 2, 3; the same on 2 threads);
    # the bounds add the seeds' spread on each side
    assert tokens > 0 and 64 < ppl < 79


def test_distillation_refuses_a_teacher_with_another_dictionary(written, tmp_path):
    data = write_dictionary(tmp_path, 30)
    with pytest.raises(ValueError, match="dictionary of 64 symbols, the task's has 34"):
        cfg, task = setup_from_command_line(
            data, "--task", "language_modeling", "--arch", "alibi_transformer_lm",
            "--criterion", "lm_distillation", "--teacher-path", written["learned"])
        task.build_criterion(cfg.criterion)


def test_distillation_past_a_teachers_length_is_refused_only_for_learned_positions(
        written, lm_dictionary):
    """A learned-position teacher cannot read past its table: refused when the criterion is
    built, before training (it was a traceback at the first batch). A sinusoidal teacher
    reads any length: it distils past its training length (it was refused, blaming learned
    positions)."""
    def criterion(kind, length):
        cfg, task = setup_from_command_line(
            lm_dictionary, "--task", "language_modeling", "--arch", "alibi_transformer_lm",
            *DIMS, "--tokens-per-sample", length, "--criterion", "lm_distillation",
            "--teacher-path", written[kind])
        return task.build_criterion(cfg.criterion), task

    most = criterion("learned", L)[0].teacher.max_positions()  # its --tokens-per-sample
    long = most + 16
    with pytest.raises(ValueError, match=rf"the teacher reads at most {most} tokens \(learned "
                       rf"position embeddings\), and samples have up to {long}: distil with "
                       rf"--tokens-per-sample {most} or less"):
        criterion("learned", long)
    built, task = criterion("sinusoidal", long)
    tokens = torch.randint(4, len(task.dictionary), (2, long))
    logits = built._teacher_logits({"net_input": {"src_tokens": tokens}}, torch.zeros(1))
    assert logits.shape == (2, long, len(task.dictionary)) and torch.isfinite(logits).all()
