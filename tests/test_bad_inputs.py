"""The catalogue of bad inputs (docs/reliability.md): each gives correct output or a clear
error, and nothing on disk is overwritten or lost.

Rows already backed elsewhere are not repeated here: unknown variant/backend and odd head
counts at the math level (test_alibi_math, test_encoder_math), all-padding rows per layer
(test_attention, test_encoder_math), a wrong ``--user-dir`` (test_lm_cli), checkpoints of the
other kind at the weights level (test_lm_model, test_encoder_math), and truncated or corrupt
checkpoint files (test_resume).

The last section holds one test per row of issue 12 (what an experienced fairseq user hit on
first contact). Tests that run fairseq's command lines are marked ``slow``.
"""

import shutil
from pathlib import Path

import pytest
import torch

from fairseq_alibi.modules.alibi_multihead_attention import set_attention_backend

from tests.helpers import (
    MODELS,
    REPO,
    SHARED_DATA,
    build_model,
    decode_token_by_token,
    run_cli,
    saved_in_process,
    setup_from_command_line,
    train,
    write_tiny_bpe,
)

ENCODER_VARIANTS = ["symmetric", "one_sided", "offset", "asymmetric"]


@pytest.fixture(scope="module")
def lm_checkpoint(tmp_path_factory, tiny_lm_data, alibi_user_dir):
    save = tmp_path_factory.mktemp("bad_inputs_lm")
    train("lm", tiny_lm_data, alibi_user_dir, save, "--max-update", 2)
    return save / "checkpoint_last.pt"


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# ---------------------------------------------------------------- options


@pytest.mark.parametrize("model,flag,value,choices", [
    ("lm", "--alibi-attention", "cuda-magic", "auto"),
    ("encoder", "--alibi-attention", "cuda-magic", "auto"),
    ("encoder", "--alibi-variant", "bidirectional", "symmetric"),
])
def test_unknown_variant_or_backend_flag_names_the_choices(model, flag, value, choices,
                                                         tiny_lm_data, capsys):
    with pytest.raises(SystemExit):
        build_model(model, tiny_lm_data, flag, value)
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{flag}: invalid choice: '{value}'" in error and choices in error


def test_odd_head_count_with_one_sided_is_a_clear_error(tiny_lm_data):
    with pytest.raises(ValueError, match="even number of attention heads.*got 3"):
        build_model("encoder", tiny_lm_data, "--alibi-variant", "one_sided",
                    "--encoder-attention-heads", 3, "--encoder-embed-dim", 33)


# ---------------------------------------------------------------- inputs


@pytest.mark.parametrize("model,extra", [("lm", [])] + [
    ("encoder", ["--alibi-variant", v]) for v in ENCODER_VARIANTS])
def test_zero_length_and_all_padding_rows(model, extra, tiny_lm_data):
    net, task = build_model(model, tiny_lm_data, *extra)
    net.eval()
    vocab, pad = len(task.source_dictionary), task.source_dictionary.pad()
    with torch.no_grad():
        empty = net(torch.zeros(2, 0, dtype=torch.long))[0]
        assert empty.shape[:2] == (2, 0)
        tokens = torch.randint(4, vocab, (3, 9))
        tokens[1, :] = pad  # a row with no real token at all
        tokens[2, 4:] = pad
        out = net(tokens)[0]
        assert torch.isfinite(out).all()
        alone = net(tokens[:1])[0]  # the padded rows change nothing in the others
        assert torch.allclose(out[:1], alone, atol=1e-5, rtol=0)


def test_a_batch_of_no_sequences(tiny_lm_data):
    net, _ = build_model("lm", tiny_lm_data)
    with torch.no_grad():
        assert net.eval()(torch.zeros(0, 5, dtype=torch.long))[0].shape[:2] == (0, 5)


@pytest.mark.slow
def test_lm_sequence_16x_the_training_length(lm_checkpoint, tiny_lm_data):
    """Trained at 16 tokens, scored at 256: finite, causal (a prefix is scored the same
    whatever follows), and equal to token-by-token decoding with the KV cache."""
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel

    hub = AlibiTransformerLanguageModel.from_pretrained(
        str(lm_checkpoint.parent), lm_checkpoint.name, data_name_or_path=str(tiny_lm_data),
        max_tokens=4096)  # else the hub batches with the training run's --max-tokens (128)
    words = " ".join(f"w{(7 * i) % 60}" for i in range(256))  # 16 x 16 tokens scored
    scores = hub.score(words)["positional_scores"]
    assert scores.numel() == 256 and torch.isfinite(scores).all()
    prefix = hub.score(" ".join(words.split()[:40]))["positional_scores"]
    n = prefix.numel() - 1  # the last one scores </s>, which the long text does not have there
    assert n >= 38 and torch.allclose(scores[:n], prefix[:n], atol=1e-5, rtol=0)
    model = hub.models[0]  # in eval mode already (hub models cannot be put back in training)
    tokens = hub.encode(words)[None, :]
    with torch.no_grad():
        full = model(tokens)[0]
        steps = decode_token_by_token(model, tokens)
    assert torch.allclose(steps, full, atol=1e-4, rtol=0)


@pytest.mark.parametrize("variant", ENCODER_VARIANTS)
def test_encoder_sequence_16x_the_training_length(variant, tiny_lm_data):
    """tokens_per_sample 16, input 256: finite, and the default attention path agrees with
    the explicit reference (naive backend) at that length."""
    net, task = build_model("encoder", tiny_lm_data, "--alibi-variant", variant,
                            "--alibi-future-slope-ratio", 0.5 if variant == "asymmetric" else 1.0)
    net.eval()
    tokens = torch.randint(4, len(task.source_dictionary), (2, 256))
    tokens[1, 200:] = task.source_dictionary.pad()
    with torch.no_grad():
        out = net(tokens)[0]
        set_attention_backend(net, "naive")
        reference = net(tokens)[0]
    real = tokens.ne(task.source_dictionary.pad())  # padding positions output nothing useful
    assert torch.isfinite(out).all()
    assert torch.allclose(out[real], reference[real], atol=1e-4, rtol=0)


def test_learned_positions_refuse_16x_the_training_length(tiny_lm_data):
    """``--alibi-variant none`` is stock RoBERTa: its task keeps its length limit."""
    net, task = build_model("encoder", tiny_lm_data, "--alibi-variant", "none")
    assert net.max_positions() == task.max_positions() == 16


# ---------------------------------------------------------------- checkpoints and data


@pytest.mark.slow
def test_alibi_checkpoint_without_the_plugin(lm_checkpoint, tiny_lm_data, tmp_path):
    """Stock fairseq cannot build a model it does not know; its own error message is broken
    (it formats the config into a format string): KeyError "'_name'". The plugin is not loaded
    at that point, so only the docs can name the fix: --user-dir."""
    before = snapshot(lm_checkpoint.parent)
    out = run_cli("fairseq-eval-lm", tiny_lm_data, "--path", lm_checkpoint, "--cpu",
                  "--tokens-per-sample", 16, "--max-tokens", 256, expect_ok=False)
    assert out.strip().splitlines()[-1].startswith("KeyError: \"'_name'\"")
    assert snapshot(lm_checkpoint.parent) == before


@pytest.mark.slow
def test_alibi_checkpoint_restored_into_stock_transformer_lm(lm_checkpoint, tiny_lm_data,
                                                             alibi_user_dir, tmp_path):
    save = tmp_path / "stock"
    save.mkdir()
    shutil.copy(lm_checkpoint, save / "checkpoint_last.pt")
    before = snapshot(save)
    out = train("lm", tiny_lm_data, alibi_user_dir, save, "--arch", "transformer_lm",
                "--max-update", 4, expect_ok=False)
    assert "Cannot load model parameters from checkpoint" in out
    assert "please ensure that the architectures match" in out and "alibi.slopes" in out
    assert snapshot(save) == before  # nothing written, the checkpoint untouched


@pytest.mark.slow
@pytest.mark.parametrize("model", ["lm", "encoder"])
def test_dictionary_that_does_not_match_the_checkpoint(model, lm_checkpoint, tmp_path,
                                                       tiny_lm_data, alibi_user_dir):
    from fairseq import checkpoint_utils

    checkpoint = lm_checkpoint
    if model == "encoder":
        train("encoder", tiny_lm_data, alibi_user_dir, tmp_path / "enc", "--max-update", 1)
        checkpoint = tmp_path / "enc" / "checkpoint_last.pt"
    other = tmp_path / "other"  # a data directory binarized with another dictionary
    other.mkdir()
    (other / "dict.txt").write_text("".join(f"v{i} 1\n" for i in range(92)))  # + 4 specials
    trained, given = (64, 96) if model == "lm" else (65, 97)  # masked_lm adds <mask>
    with pytest.raises(ValueError, match=rf"dictionary of {trained} symbols, but the data "
                                         rf"directory's dict.txt has {given}: give the data"):
        checkpoint_utils.load_model_ensemble_and_task(
            [str(checkpoint)], arg_overrides={"data": str(other)})


@pytest.mark.slow
def test_empty_training_file(lm_checkpoint, tmp_path, alibi_user_dir, tiny_lm_data):
    """fairseq binarizes an empty file ("0 sents") and fails to read it at the start of
    training; the checkpoints already in --save-dir are untouched."""
    from fairseq.data import indexed_dataset

    data = tmp_path / "bin"  # the tiny corpus with an empty training split
    shutil.copytree(tiny_lm_data, data)
    # exactly what fairseq-preprocess writes for a file of no lines
    builder = indexed_dataset.make_builder(str(data / "train.bin"), "mmap", vocab_size=64)
    builder.finalize(str(data / "train.idx"))
    assert (data / "train.bin").stat().st_size == 0
    save = tmp_path / "save"
    save.mkdir()
    shutil.copy(lm_checkpoint, save / "checkpoint_last.pt")
    before = snapshot(save)
    out = train("lm", data, alibi_user_dir, save, "--max-update", 4, expect_ok=False)
    assert "ValueError: cannot mmap an empty file" in out
    assert snapshot(save) == before


# ---------------------------------------------------------------- first contact (issue 12)
# One test per row of the issue: what an experienced fairseq user hit following the docs.


STOCK = {  # the same tiny models, stock architectures
    "lm": [*MODELS["lm"], "--arch", "transformer_lm"],
    "encoder": ["--task", "masked_lm", "--criterion", "masked_lm", "--arch", "roberta_base",
                "--encoder-layers", 2, "--encoder-embed-dim", 32, "--encoder-ffn-embed-dim", 64,
                "--encoder-attention-heads", 4, "--tokens-per-sample", 16, "--batch-size", 8],
}


def last_line(output):
    return output.strip().splitlines()[-1]


@pytest.fixture
def no_network(monkeypatch):
    """Fail the test if fairseq tries to download anything (its GPT-2 BPE defaults are URLs)."""
    from fairseq import file_utils

    def refuse(url, *args, **kwargs):
        raise AssertionError(f"tried to download {url}")

    monkeypatch.setattr(file_utils, "get_from_cache", refuse)
    monkeypatch.setattr(file_utils, "cached_path_from_pm", refuse)


# row 1: hub, offline GPT-2 BPE


@pytest.mark.parametrize("where", ["checkpoint folder", "data folder", "shared gpt2_bpe"])
def test_hub_finds_the_gpt2_bpe_files_offline(where, tiny_lm_data, tmp_path, no_network):
    """The stock idiom, no BPE arguments: encoder.json + vocab.bpe beside the checkpoint or in
    the data folder are used, and nothing is downloaded."""
    from fairseq_alibi.models.alibi_roberta import AlibiRobertaModel

    checkpoint = saved_in_process(tmp_path / "ckpt" / "model.pt", tiny_lm_data,
                                  *MODELS["encoder"])
    data = tmp_path / "data"
    shutil.copytree(tiny_lm_data, data)
    if where == "shared gpt2_bpe":
        source = SHARED_DATA / "gpt2_bpe"
        if not (source / "encoder.json").is_file():
            pytest.skip("no shared GPT-2 BPE files (../shared/data/gpt2_bpe)")
        for name in ("encoder.json", "vocab.bpe"):
            shutil.copy(source / name, checkpoint.parent / name)
    else:
        write_tiny_bpe(checkpoint.parent if where == "checkpoint folder" else data)
    roberta = AlibiRobertaModel.from_pretrained(str(checkpoint.parent), "model.pt", str(data))
    assert roberta.cfg.bpe._name == "gpt2"
    assert roberta.cfg.bpe.gpt2_encoder_json.endswith("encoder.json")
    assert not roberta.cfg.bpe.gpt2_encoder_json.startswith("http")
    tokens = roberta.encode("the cat sat")
    assert tokens[0].item() == 0 and tokens[-1].item() == 2 and len(tokens) > 2
    assert roberta.extract_features(tokens).shape[:2] == (1, len(tokens))


def test_hub_without_gpt2_bpe_files_is_a_one_line_error(tiny_lm_data, tmp_path, no_network):
    from fairseq_alibi.models.alibi_roberta import AlibiRobertaModel

    checkpoint = saved_in_process(tmp_path / "ckpt" / "model.pt", tiny_lm_data,
                                  *MODELS["encoder"])
    with pytest.raises(ValueError) as error:
        AlibiRobertaModel.from_pretrained(str(checkpoint.parent), "model.pt", str(tiny_lm_data))
    message = str(error.value)
    assert "\n" not in message
    for needed in ("encoder.json", "vocab.bpe", "gpt2_encoder_json=", "gpt2_vocab_bpe=",
                   str(checkpoint.parent)):
        assert needed in message
    bpe = write_tiny_bpe(tmp_path / "elsewhere")  # the arguments the message names work
    AlibiRobertaModel.from_pretrained(
        str(checkpoint.parent), "model.pt", str(tiny_lm_data),
        gpt2_encoder_json=str(bpe / "encoder.json"), gpt2_vocab_bpe=str(bpe / "vocab.bpe"))


# row 2: fairseq-validate of a masked LM on longer blocks


@pytest.mark.slow
def test_documented_validate_recipe_scores_every_block(tiny_lm_data, alibi_user_dir, tmp_path):
    """Stock fairseq-validate rounds batches to --required-batch-size-multiple (8): blocks are
    dropped, or nothing is scored. The documented recipe scores them all, and its last line
    says how many (bsz: blocks, wpb: tokens, summed over the split by fairseq-validate)."""
    import re

    recipe = (REPO / "docs" / "encoders.md").read_text()
    command = next(b for b in re.findall(r"```bash\n(.*?)```", recipe, re.S)
                   if "fairseq-validate" in b)
    assert "--required-batch-size-multiple 1" in command
    checkpoint = saved_in_process(tmp_path / "model.pt", tiny_lm_data, *MODELS["encoder"])
    common = [tiny_lm_data, "--user-dir", alibi_user_dir, "--path", checkpoint, "--cpu",
              "--task", "masked_lm", "--valid-subset", "valid", "--batch-size", 8,
              "--model-overrides", "{'tokens_per_sample': 256}"]
    out = run_cli("fairseq-validate", *common, "--required-batch-size-multiple", 1)
    blocks = int(re.search(r"loaded (\d+) blocks from", out).group(1))
    assert 1 < blocks < 8  # fewer than one stock batch: the case that divided by zero
    scored = re.search(r"valid on 'valid' subset \|.*\| bsz (\d+)", out)
    assert scored, out[-2000:]
    assert int(scored.group(1)) == blocks
    stock = run_cli("fairseq-validate", *common, expect_ok=False)  # what the issue hit
    assert "ZeroDivisionError" in stock


# row 3: a stock RoBERTa checkpoint, and row 12: the message fits how the run was started


def test_stock_roberta_checkpoint_names_the_none_variant(tiny_lm_data):
    cfg, task = setup_from_command_line(tiny_lm_data, "--cpu", *STOCK["encoder"])
    stock = task.build_model(cfg.model)
    ours, _ = build_model("encoder", tiny_lm_data)  # --alibi-variant offset
    with pytest.raises(ValueError) as error:
        ours.load_state_dict(stock.state_dict())
    message = str(error.value)
    assert "--alibi-variant none --mlm-head roberta" in message and "convert" not in message
    none, _ = build_model("encoder", tiny_lm_data, "--alibi-variant", "none")
    none.load_state_dict(stock.state_dict())  # what the message says works


def _as_hydra_built(model_flags, data):
    """The model as fairseq-hydra-train builds it: its options are an OmegaConf config."""
    from fairseq import options, tasks
    from omegaconf import OmegaConf

    argv = [str(a) for a in [data, *MODELS["encoder"], "--cpu", *model_flags]]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    task = tasks.setup_task(args)
    cfg = OmegaConf.create({k: v for k, v in vars(args).items()
                            if v is None or isinstance(v, (bool, int, float, str, list))})
    return task.build_model(cfg)


@pytest.mark.parametrize("started,expected", [
    ("cli", "the flags `--alibi-variant offset --mlm-head clap --zero-mask-embedding`"),
    ("hydra", "the override `variant=zero_clap`"),
])
def test_kind_mismatch_message_fits_how_the_run_was_started(started, expected, tiny_lm_data):
    zero_clap = ["--alibi-variant", "offset", "--mlm-head", "clap", "--zero-mask-embedding"]
    trained, _ = build_model("encoder", tiny_lm_data, *zero_clap)
    if started == "cli":
        fresh, _ = build_model("encoder", tiny_lm_data)  # the default: offset, roberta head
    else:
        fresh = _as_hydra_built([], tiny_lm_data)  # a GLUE config without variant=
    with pytest.raises(ValueError, match="trained as `--alibi-variant offset --mlm-head clap"
                                         " --zero-mask-embedding`") as error:
        fresh.load_state_dict(trained.state_dict())
    assert str(error.value).endswith(expected)


@pytest.mark.slow
def test_hydra_glue_config_without_variant_names_the_override(alibi_user_dir, tmp_path):
    """The shipped GLUE config (default variant=alibi) on a zero-clap checkpoint, through the
    real fairseq-hydra-train: the hint names `variant=zero_clap`, printed before hydra's report."""
    from fairseq_alibi.preprocess import glue
    from fairseq_alibi.preprocess.encoders import Gpt2BpeEncoder
    from tests.helpers import write_glue

    write_glue(tmp_path / "glue_data", rows=16)
    bpe = Gpt2BpeEncoder.from_dir(write_tiny_bpe(tmp_path / "bpe"))
    glue.prepare(tmp_path / "glue_data", tmp_path / "glue", ["RTE"], bpe)
    data = tmp_path / "glue" / "RTE-bin"
    sizes = {"encoder_layers": 1, "encoder_embed_dim": 16, "encoder_ffn_embed_dim": 32,
             "encoder_attention_heads": 2}
    checkpoint = saved_in_process(
        tmp_path / "zero_clap" / "model.pt", data / "input0", "--task", "masked_lm",
        "--criterion", "masked_lm", "--arch", "alibi_roberta_base", "--alibi-variant", "offset",
        "--mlm-head", "clap", "--zero-mask-embedding", "--tokens-per-sample", 64,
        *[a for k, v in sizes.items() for a in (f"--{k.replace('_', '-')}", v)])
    out = run_cli(
        "fairseq-hydra-train", "--config-dir", f"{alibi_user_dir}/config/glue",
        "--config-name", "rte", f"task.data={data}", f"checkpoint.restore_file={checkpoint}",
        *[f"++model.{k}={v}" for k, v in sizes.items()], "++model.max_positions=64",
        "task.max_positions=64", "common.cpu=true", "common.fp16=false",
        "dataset.num_workers=0", "distributed_training.distributed_world_size=1",
        "dataset.batch_size=4", "dataset.max_tokens=null", "optimization.max_update=2",
        f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, expect_ok=False)
    lines = out.strip().splitlines()
    hint = next(i for i, l in enumerate(lines) if l.startswith("fairseq_alibi: ValueError:"))
    assert lines[hint].endswith("build it as the checkpoint was: the override `variant=zero_clap`")
    assert "trained as `--alibi-variant offset --mlm-head clap --zero-mask-embedding`" in lines[hint]
    assert hint < next(i for i, l in enumerate(lines) if "Error executing job" in l)


# row 4: a stock checkpoint through --restore-file / --finetune-from-model


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--restore-file", "--finetune-from-model"])
def test_stock_checkpoint_restored_shows_the_plugin_message_last(flag, tiny_lm_data,
                                                                 alibi_user_dir, tmp_path):
    stock = saved_in_process(tmp_path / "stock" / "model.pt", tiny_lm_data, *STOCK["lm"])
    out = train("lm", tiny_lm_data, alibi_user_dir, tmp_path / "save", "--max-update", 2,
                flag, stock, expect_ok=False)
    assert "please ensure that the architectures match" in out  # fairseq's, above ours
    assert last_line(out).startswith(
        "fairseq_alibi: ValueError: this checkpoint has no ALiBi slopes (decoder.alibi.slopes)")
    assert "convert" in last_line(out)


# row 5: from_pretrained on a stock checkpoint

HUB_CASES = {  # model -> (hub class, the stock class the checkpoint builds)
    "lm": ("alibi_transformer_lm.AlibiTransformerLanguageModel", "TransformerLanguageModel"),
    "encoder": ("alibi_roberta.AlibiRobertaModel", "RobertaModel"),
    "translation": ("alibi_transformer.AlibiTransformerModel", "TransformerModel"),
}


def stock_hub_checkpoint(model, tiny_lm_data, folder):
    """``(checkpoint, data dir)``: an untrained stock model of the kind, beside BPE files."""
    data = tiny_lm_data
    flags = STOCK.get(model)
    if model == "translation":  # the translation task only reads the two dictionaries here
        data = folder / "data"
        data.mkdir(parents=True)
        for side in ("src", "tgt"):
            shutil.copy(tiny_lm_data / "dict.txt", data / f"dict.{side}.txt")
        flags = ["--task", "translation", "--source-lang", "src", "--target-lang", "tgt",
                 "--arch", "transformer", "--encoder-layers", 1, "--decoder-layers", 1,
                 "--encoder-embed-dim", 16, "--decoder-embed-dim", 16,
                 "--encoder-ffn-embed-dim", 32, "--decoder-ffn-embed-dim", 32,
                 "--encoder-attention-heads", 2, "--decoder-attention-heads", 2]
    checkpoint = saved_in_process(folder / "ckpt" / "model.pt", data, *flags)
    write_tiny_bpe(checkpoint.parent)
    return checkpoint, data


@pytest.mark.parametrize("model", list(HUB_CASES))
def test_from_pretrained_refuses_a_stock_checkpoint(model, tiny_lm_data, tmp_path, no_network):
    import importlib

    from fairseq_alibi.hub import WrongCheckpointError

    checkpoint, data = stock_hub_checkpoint(model, tiny_lm_data, tmp_path)
    module, hub_name = HUB_CASES[model][0].rsplit(".", 1)
    hub_class = getattr(importlib.import_module(f"fairseq_alibi.models.{module}"), hub_name)
    built = HUB_CASES[model][1]
    with pytest.raises(WrongCheckpointError, match=rf"holds a {built}, not an alibi_\w+ model "
                                                   rf".*load it with {built}.from_pretrained"):
        hub_class.from_pretrained(str(checkpoint.parent), checkpoint.name, str(data))


def test_an_uncaught_refusal_is_printed_as_one_line(capsys):
    """The package's excepthook (and IPython's ``_render_traceback_``) show the message alone."""
    import sys

    from fairseq_alibi.hub import WrongCheckpointError

    try:
        raise WrongCheckpointError("x.pt holds a TransformerModel, not ...: load it with ...")
    except WrongCheckpointError as refused:
        sys.excepthook(type(refused), refused, refused.__traceback__)
        rendered = refused._render_traceback_()
    expected = "WrongCheckpointError: x.pt holds a TransformerModel, not ...: load it with ..."
    assert capsys.readouterr().err == expected + "\n"
    assert rendered == [expected]


@pytest.mark.slow
@pytest.mark.parametrize("model", list(HUB_CASES))
def test_from_pretrained_stock_checkpoint_error_is_one_line(model, tiny_lm_data, tmp_path):
    """What a user sees running a script: the fix as one line, no traceback."""
    import subprocess
    import sys

    checkpoint, data = stock_hub_checkpoint(model, tiny_lm_data, tmp_path)
    module, hub_name = HUB_CASES[model][0].rsplit(".", 1)
    code = (f"from fairseq_alibi.models.{module} import {hub_name}\n"
            f"{hub_name}.from_pretrained({str(checkpoint.parent)!r}, 'model.pt', {str(data)!r})")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=str(REPO))
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert last_line(proc.stderr).startswith(
        f"WrongCheckpointError: {checkpoint} holds a {HUB_CASES[model][1]}, not an alibi_")


# row 6: position-embedding flags


def test_position_embedding_flag_is_refused(tiny_lm_data, capsys):
    with pytest.raises(SystemExit):
        build_model("lm", tiny_lm_data, "--decoder-learned-pos")
    error = last_line(capsys.readouterr().err)
    assert error.endswith("error: argument --decoder-learned-pos: alibi_transformer_lm has no "
                          "position embeddings (the ALiBi bias replaces them); drop "
                          "--decoder-learned-pos, or train a stock model for learned positions")


def test_saved_learned_pos_field_still_loads(tiny_lm_data, tmp_path):
    """Only the command line is refused: a saved config with decoder_learned_pos (the stock
    gpt3 architectures set it, converted checkpoints keep it) loads as before."""
    from fairseq import checkpoint_utils

    path = saved_in_process(tmp_path / "model.pt", tiny_lm_data, *MODELS["lm"])
    state = torch.load(path, weights_only=False)
    state["cfg"]["model"]["decoder_learned_pos"] = True
    torch.save(state, path)
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(path)])
    assert models[0].decoder.embed_positions is None


# row 7: scoring any length through the hub


def test_hub_scores_3000_words_with_the_training_max_tokens(tiny_lm_data, tmp_path):
    """The checkpoint's --max-tokens is 128; the stock hub asserted on anything longer."""
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel

    checkpoint = saved_in_process(tmp_path / "model.pt", tiny_lm_data, *MODELS["lm"])
    lm = AlibiTransformerLanguageModel.from_pretrained(str(tmp_path), checkpoint.name,
                                                       data_name_or_path=str(tiny_lm_data))
    assert lm.cfg.dataset.max_tokens == 128
    words = " ".join(f"w{(7 * i) % 60}" for i in range(3000))
    long, short = lm.score([words, "w1 w2 w3"])
    assert long["positional_scores"].numel() == 3000
    assert short["positional_scores"].numel() == 3
    assert torch.isfinite(long["positional_scores"]).all()
    assert lm.cfg.dataset.max_tokens == 128  # the setting is left as it was


# row 8: documented hydra commands work from any folder


def test_documented_config_dirs_work_from_any_folder():
    """Every ``--config-dir`` in the docs points into the installed package, and the config it
    names is there."""
    import re

    from fairseq_alibi.paths import config_dir

    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "examples").glob("*/README.md"))]
    found = 0
    for page in pages:
        text = page.read_text()
        for match in re.finditer(
                r'--config-dir\s+("[^"]*"|\S+)\s+(?:\\\s+)?--config-name\s+(\w+)', text):
            folder, name = match.groups()
            if folder == "DIR":  # "your own folder" in prose
                continue
            found += 1
            family = re.fullmatch(
                r'"?\$\(python -m fairseq_alibi --user-dir\)/config/(\w+)"?', folder)
            assert family, f"{page.name}: --config-dir {folder} only works from the repo root"
            assert (Path(config_dir(family.group(1))) / f"{name}.yaml").is_file(), match.group(0)
    assert found >= 6


# row 9: checkpoints check/repair before the first save


@pytest.mark.parametrize("fresh", ["empty folder", "no folder yet"])
def test_repair_and_check_before_the_first_save(fresh, tmp_path, capsys):
    from fairseq_alibi.cli.checkpoints import main

    save_dir = tmp_path / "checkpoints"
    if fresh == "empty folder":
        save_dir.mkdir()
    assert main(["repair", str(save_dir)]) == 0
    assert capsys.readouterr().out.strip() == f"nothing to repair: no checkpoint in {save_dir} yet"
    assert main(["check", str(save_dir)]) == 0
    out = capsys.readouterr().out.strip()
    assert out == f"no checkpoint yet in {save_dir}" and "DAMAGED" not in out
    assert not save_dir.exists() or not any(save_dir.iterdir())  # nothing written


# row 10: a 0-byte checkpoint


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["fairseq-eval-lm", "fairseq-train"])
def test_zero_byte_checkpoint_is_named_with_the_fix(tool, tiny_lm_data, alibi_user_dir, tmp_path):
    save = tmp_path / "save"
    save.mkdir()
    (save / "checkpoint_last.pt").write_bytes(b"")
    if tool == "fairseq-train":  # resuming
        out = train("lm", tiny_lm_data, alibi_user_dir, save, "--max-update", 2, expect_ok=False)
    else:
        out = run_cli(tool, tiny_lm_data, "--user-dir", alibi_user_dir, "--path",
                      save / "checkpoint_last.pt", "--cpu", "--tokens-per-sample", 16,
                      expect_ok=False)
    assert last_line(out) == (
        f"fairseq_alibi: checkpoint {save / 'checkpoint_last.pt'} is empty (0 bytes), as an "
        f"interrupted save leaves it; `python -m fairseq_alibi.checkpoints repair {save}` "
        f"restores checkpoint_last.pt from the newest intact checkpoint (`... check {save}` "
        f"lists them)")


def test_check_reports_a_zero_byte_checkpoint(tmp_path, capsys):
    from fairseq_alibi.cli.checkpoints import main

    (tmp_path / "checkpoint_last.pt").write_bytes(b"")
    assert main(["check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "checkpoint_last.pt: DAMAGED (empty file, 0 bytes)" in out
    assert f"python -m fairseq_alibi.checkpoints repair {tmp_path}" in out


# row 11: bad lengths


@pytest.mark.parametrize("lengths,reason", [
    ("64,abc", "expected comma-separated whole numbers of tokens"),
    ("0", "every evaluation length must be at least 2 tokens"),
    ("", "every evaluation length must be at least 2 tokens"),
])
def test_sweep_bad_lengths_are_argparse_errors(lengths, reason, tmp_path, capsys):
    from fairseq_alibi.cli.sweep import main

    with pytest.raises(SystemExit) as exit_:
        main(["--path", str(tmp_path / "x.pt"), "--data", str(tmp_path), "--out",
              str(tmp_path / "out"), "--lengths", lengths])
    assert exit_.value.code == 2
    error = last_line(capsys.readouterr().err)
    assert error.startswith("python -m fairseq_alibi.sweep: error: argument --lengths: " + reason)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("model", ["lm", "encoder"])
def test_zero_tokens_per_sample_is_a_clear_error(model, tiny_lm_data):
    with pytest.raises(ValueError, match=r"^--tokens-per-sample must be at least 1 .* got 0;"):
        build_model(model, tiny_lm_data, "--tokens-per-sample", 0)


@pytest.mark.slow
def test_zero_tokens_per_sample_in_eval_lm_is_named(tiny_lm_data, alibi_user_dir, tmp_path):
    """eval-lm builds the model from the checkpoint, which never sees the flag: fairseq divides
    by zero splitting the data, and the last line names the flag."""
    checkpoint = saved_in_process(tmp_path / "model.pt", tiny_lm_data, *MODELS["lm"])
    out = run_cli("fairseq-eval-lm", tiny_lm_data, "--user-dir", alibi_user_dir, "--path",
                  checkpoint, "--cpu", "--tokens-per-sample", 0, expect_ok=False)
    assert "ZeroDivisionError" in out
    assert last_line(out).startswith(
        "fairseq_alibi: --tokens-per-sample must be at least 1 (the tokens of one block), got 0")


# row 13: the quickstart's time


def test_quickstart_header_gives_the_measured_time():
    header = "".join(l for l in (REPO / "examples" / "quickstart.sh").read_text().splitlines(True)
                     if l.startswith("#"))
    measured = (REPO / "docs" / "quickstart.md").read_text()
    for figure in ("3 min 35 s", "443 CPU-seconds"):
        assert figure in " ".join(header.split()) and figure in measured
    assert "About 10 minutes" not in header


# row 14: the Pile pipeline's JSON errors


@pytest.mark.parametrize("line,reason", [
    ('{"text": "a\tb"}', "Invalid control character at column 12"),
    ('{"text": "ab', "Unterminated string at column 10"),
    ("{not json", "Expecting property name enclosed in double quotes at column 2"),
])
def test_pile_json_error_reads_once(line, reason):
    from fairseq_alibi.preprocess.pile import DataError, parse_document

    with pytest.raises(DataError) as error:
        parse_document("shard.jsonl", 3, line)
    assert str(error.value) == f"shard.jsonl:3: not valid JSON ({reason})"
    assert " at at " not in str(error.value)
