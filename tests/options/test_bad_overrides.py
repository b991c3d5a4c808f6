"""Misspelt ALiBi options at load time: fairseq drops an unknown
``--model-overrides`` key (a hydra-era checkpoint of a dataclass model) or sets it where nothing
reads it (an argparse-era checkpoint, a legacy model's Namespace), and the run would report
figures as if the option were on. A key that starts like one of the package's options but names
none of the checkpoint model's is a one-line error listing the valid names
(fairseq_alibi.models.override_keys, fairseq_alibi.options.check_override_keys); every other key
loads as stock. A value an option cannot take (a misspelt choice, a wrong type, one its rule
refuses) is one line naming the flag too, before fairseq merges it into the model's config
(options.check_override_values), and so is a combination the model refuses when it is built
(options.OptionError). Also a hydra config's ``model:`` section (the shipped configs'
callback)."""

import dataclasses
from pathlib import Path

import pytest
import torch
from fairseq import checkpoint_utils

from fairseq_alibi import options
from fairseq_alibi.error_hints import OneLineError
from fairseq_alibi.hydra_support import RegisterFairseqAlibi
from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModelConfig
from fairseq_alibi.models.override_keys import check_model_config_keys
from tests.fixtures.saved_models.make import MODELS
from tests.helpers.building import training_config
from tests.helpers.cli import REPO, run_cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "saved_models"
LM = FIXTURES / "lm_fixed_slopes" / "checkpoint.pt"  # a hydra-era checkpoint (state["cfg"])
ROBERTA = FIXTURES / "roberta_one_sided_head" / "checkpoint.pt"  # its model: a Namespace
TRANSLATION = FIXTURES / "translation_pointer" / "checkpoint.pt"
LM_OPTIONS = ("alibi_learned_scales, alibi_scale_init, alibi_heads, alibi_window_cutoff, "
              "alibi_window_sinks, "
              "alibi_document_mask, alibi_attention, alibi_slope_scale")


def load(path, **overrides):
    """``(model, its config)`` as fairseq-eval-lm loads a checkpoint (``--model-overrides``)."""
    models, cfg, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides={"data": str(FIXTURES), **overrides})
    return models[0].eval(), cfg.model


def refusal(path, **overrides) -> str:
    with pytest.raises(OneLineError) as refused:
        load(path, **overrides)
    message = str(refused.value)
    assert "\n" not in message
    return message


@pytest.fixture(scope="module")
def argparse_era_lm(tmp_path_factory):
    """lm_fixed_slopes saved as an argparse-era checkpoint: its options as fairseq-train's
    parser gives them, in ``state["args"]`` (no ``cfg``)."""
    from fairseq import options as fairseq_options

    parsed = fairseq_options.parse_args_and_arch(
        fairseq_options.get_training_parser(),
        [str(FIXTURES)] + [str(a) for a in MODELS["lm_fixed_slopes"]])
    state = torch.load(LM, map_location="cpu", weights_only=False)
    state["args"], state["cfg"] = parsed, None
    path = tmp_path_factory.mktemp("argparse_era") / "checkpoint.pt"
    torch.save(state, path)
    return path


def lm_output(model):
    tokens = torch.tensor([[2] + list(range(4, 28))])
    with torch.no_grad():
        return model(tokens)[0]


def test_the_valid_names_are_the_declared_ones():
    declared = tuple(f.name for f in dataclasses.fields(AlibiTransformerLanguageModelConfig)
                     if f.name.startswith("alibi_"))
    assert sorted(options.family_option_names("alibi_transformer_lm")) == sorted(declared)
    assert ", ".join(options.family_option_names("alibi_transformer_lm")) == LM_OPTIONS
    assert options._our_prefixes() == ("alibi_", "cross_alibi", "decoder_alibi_",
                                       "encoder_alibi_")


@pytest.mark.parametrize("era", ["hydra", "argparse"])
def test_a_misspelt_override_is_one_line_with_the_suggestion(era, argparse_era_lm):
    path = LM if era == "hydra" else argparse_era_lm
    assert refusal(path, alibi_slope_scal=0.5) == (
        "unknown ALiBi option 'alibi_slope_scal' in --model-overrides (did you mean "
        f"'alibi_slope_scale'?); valid for alibi_transformer_lm: {LM_OPTIONS}")
    assert refusal(path, alibi_window_cutof=8) == (
        "unknown ALiBi option 'alibi_window_cutof' in --model-overrides (did you mean "
        f"'alibi_window_cutoff'?); valid for alibi_transformer_lm: {LM_OPTIONS}")


@pytest.mark.parametrize("era", ["hydra", "argparse"])
def test_a_correct_override_still_changes_the_output(era, argparse_era_lm):
    path = LM if era == "hydra" else argparse_era_lm
    model, cfg = load(path)
    scaled, scaled_cfg = load(path, alibi_slope_scale=0.5, dropout=0.0)
    assert scaled_cfg.alibi_slope_scale == 0.5 and cfg.alibi_slope_scale == 1.0
    assert not torch.allclose(lm_output(model), lm_output(scaled), atol=1e-4)


def test_other_keys_pass_untouched(caplog):
    _, cfg = load(LM, dropout=0.25)
    assert cfg.dropout == 0.25
    _, cfg = load(LM, not_an_option_of_anyone=1)  # stock: dropped, no error
    assert "not_an_option_of_anyone" not in cfg
    assert "no option of this checkpoint's config" not in caplog.text  # nothing close to it
    _, cfg = load(LM, dropuot=0.5)  # misspelt: dropped too, but said
    assert cfg.dropout != 0.5 and "'dropuot' in --model-overrides is no option of this " \
        "checkpoint's config: fairseq ignores it (did you mean 'dropout'?)" in caplog.text
    _, cfg = load(ROBERTA, load_checkpoint_heads=True, pooler_dropout=0.5)
    assert cfg.pooler_dropout == 0.5


def test_a_legacy_models_namespace_refuses_a_misspelt_key_too():
    message = refusal(ROBERTA, load_checkpoint_heads=True, alibi_variantt="offset")
    assert message.startswith("unknown ALiBi option 'alibi_variantt' in --model-overrides (did "
                              "you mean 'alibi_variant'?); valid for alibi_roberta: alibi_variant,")
    assert "mlm_head" in message and "encoder_alibi_variant" not in message
    assert refusal(TRANSLATION, cross_alibi_head=1).startswith(
        "unknown ALiBi option 'cross_alibi_head' in --model-overrides (did you mean "
        "'cross_alibi_heads'?); valid for alibi_transformer: encoder_alibi_variant,")


def test_an_override_turning_an_option_off_resets_what_needs_it(tmp_path, caplog):
    # a model saved with windows and sinks, evaluated dense: one key, not one per dependent
    state = torch.load(LM, map_location="cpu", weights_only=False)
    state["cfg"]["model"].update(alibi_window_cutoff=8.0, alibi_window_sinks=4)
    path = tmp_path / "windowed.pt"
    torch.save(state, path)
    dense, _ = load(LM)
    with caplog.at_level("WARNING", logger="fairseq_alibi.models.override_keys"):
        model, cfg = load(path, alibi_window_cutoff=0)
    assert (cfg.alibi_window_cutoff, cfg.alibi_window_sinks) == (0, 0)
    assert "alibi_window_sinks is reset to its default, 0" in caplog.text
    assert torch.equal(lm_output(model), lm_output(dense))
    _, cfg = load(path, alibi_window_cutoff=16)  # still on: the saved sinks stay
    assert (cfg.alibi_window_cutoff, cfg.alibi_window_sinks) == (16, 4)


def test_an_override_of_what_the_checkpoint_learned_is_refused():
    # before: silently ignored, the learned ratios (scales) loading over the initial value
    ratios = FIXTURES / "roberta_asymmetric_learnable" / "checkpoint.pt"
    assert refusal(ratios, alibi_future_slope_ratio=2.0).startswith(
        "alibi_future_slope_ratio=2.0 in --model-overrides changes nothing: the checkpoint "
        "learned it (alibi_learnable_future_slopes=True)")
    scales = FIXTURES / "lm_learned_per_layer_head" / "checkpoint.pt"
    assert refusal(scales, alibi_scale_init=0.5).startswith(
        "alibi_scale_init=0.5 in --model-overrides changes nothing")
    # fixed slopes: scale_init is the multiplier the weights were trained with (it was taken,
    # changing the model silently); alibi_slope_scale is the load-time knob
    assert refusal(LM, alibi_scale_init=0.5) == (
        "this checkpoint was trained with --alibi-scale-init 1.0; alibi_scale_init in "
        "--model-overrides builds --alibi-scale-init 0.5: drop it from --model-overrides (the "
        "weights learned what it was trained with; alibi_slope_scale scales every slope at "
        "load time)")
    _, cfg = load(LM, alibi_scale_init=1.0, alibi_slope_scale=0.5)
    assert (cfg.alibi_scale_init, cfg.alibi_slope_scale) == (1.0, 0.5)


def test_an_override_the_checkpoints_weights_contradict_is_named_to_drop():
    """The mismatch an override causes names the override, not the training flag that builds
    the model (which fairseq-eval-lm or the hub do not take)."""
    assert refusal(LM, alibi_heads=2) == (
        "this checkpoint was trained with a bias on every head (no --alibi-heads) "
        "(decoder.alibi.slopes); alibi_heads in --model-overrides builds --alibi-heads 2: drop "
        "it from --model-overrides (the checkpoint's weights hold what it was trained with)")


@pytest.mark.parametrize("path, extra, key, saved, given", [
    # no tensor records global tokens (saved before the option existed: its default, 0)
    (ROBERTA, {"load_checkpoint_heads": True}, "alibi_global_tokens", 0, 1),
    # offset and symmetric share Press's slopes: the encoder side loaded the other, silently
    (TRANSLATION, {}, "encoder_alibi_variant", "offset", "symmetric"),
    (TRANSLATION, {}, "decoder_alibi_variant", "causal", "none"),
    # scales of 1.0 on fixed slopes: the same function, but no model that was trained
    (LM, {}, "alibi_learned_scales", "none", "per_head"),
])
def test_an_override_of_what_the_weights_learned_with_is_refused(path, extra, key, saved,
                                                                 given):
    """Another value at load computed what the weights never learned; the saved one loads."""
    flag = "--" + key.replace("_", "-")
    assert refusal(path, **extra, **{key: given}) == (
        f"this checkpoint was trained with {flag} {saved}; {key} in --model-overrides builds "
        f"{flag} {given}: drop it from --model-overrides (the weights learned what it was "
        "trained with)")
    _, cfg = load(path, **extra, **{key: saved})
    assert str(getattr(cfg, key)) == str(saved)


def test_overrides_of_any_mapping_load():
    """A script's OmegaConf node of overrides is a mapping as a dict is (the refusal of a value
    that is no dict, e.g. "[1, 2]", is for other Python values only)."""
    from omegaconf import OmegaConf

    models, cfg, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(LM)], arg_overrides=OmegaConf.create({"data": str(FIXTURES),
                                                   "alibi_window_cutoff": 8.0}))
    assert cfg.model.alibi_window_cutoff == 8.0


def test_another_familys_option_is_refused():
    assert refusal(LM, encoder_alibi_heads=2) == (
        "ALiBi option 'encoder_alibi_heads' in --model-overrides is alibi_transformer's, not "
        f"one of alibi_transformer_lm's; valid for alibi_transformer_lm: {LM_OPTIONS}")
    assert refusal(LM, alibi_variant="causal").startswith(  # an LM's variant is no option
        "ALiBi option 'alibi_variant' in --model-overrides is alibi_roberta's, not one of "
        "alibi_transformer_lm's")
    assert refusal(TRANSLATION, mlm_head="clap").startswith(
        "ALiBi option 'mlm_head' in --model-overrides is alibi_roberta's, not one of "
        "alibi_transformer's")
    assert refusal(ROBERTA, load_checkpoint_heads=True, position_shift=2).startswith(
        "ALiBi option 'position_shift' in --model-overrides is alibi_transformer's")


@pytest.mark.parametrize("era", ["hydra", "argparse"])
def test_a_bad_override_value_is_one_line_naming_the_flag(era, argparse_era_lm):
    path = LM if era == "hydra" else argparse_era_lm
    cases = [
        ({"alibi_document_mask": "docs"}, "unknown --alibi-document-mask 'docs'; choose one "
         "of: none, eos, doc (in --model-overrides)"),
        ({"model": {"alibi_attention": "flesh"}}, "unknown --alibi-attention 'flesh'; choose "
         "one of: auto, fold, sdpa, flex, flash, naive, windowed (in --model-overrides)"),
        ({"alibi_window_cutoff": "abc"}, "--alibi-window-cutoff in --model-overrides takes a "
         "number, got 'abc'"),
        # OmegaConf refuses these deep in a traceback; an argparse-era config took int(2.5)
        ({"alibi_window_sinks": 2.5}, "--alibi-window-sinks in --model-overrides takes an "
         "integer, got 2.5"),
        ({"alibi_window_cutoff": True}, "--alibi-window-cutoff in --model-overrides takes a "
         "number, got True"),
        ({"alibi_document_mask": 1}, "unknown --alibi-document-mask '1'; choose one of: none, "
         "eos, doc (in --model-overrides)"),

        ({"alibi_window_sinks": -2}, "--alibi-window-sinks must be >= 0, got -2 (in "
         "--model-overrides)"),
        ({"alibi_slope_scale": float("inf")}, "--alibi-slope-scale must be a positive finite "
         "number, got inf (in --model-overrides)"),
        # valid alone, refused with the model's other options when it is built
        ({"alibi_window_sinks": 4}, "--alibi-window-sinks needs --alibi-window-cutoff: sinks "
         "are the keys kept beyond the slope windows"),
    ]
    for overrides, message in cases:
        with pytest.raises(options.OptionError) as refused:
            load(path, **overrides)
        assert str(refused.value) == message, overrides
    # a value of the option's type, as a string: taken as that value
    as_text, _ = load(path, alibi_window_cutoff="2")
    as_number, _ = load(path, alibi_window_cutoff=2.0)
    dense, _ = load(path)
    assert torch.equal(lm_output(as_text), lm_output(as_number))
    assert not torch.allclose(lm_output(as_text), lm_output(dense), atol=1e-5)


def test_a_legacy_models_bad_override_values_are_one_line():
    assert refusal(ROBERTA, load_checkpoint_heads=True, alibi_variant="causal") == (
        "unknown --alibi-variant 'causal'; choose one of: symmetric, one_sided, offset, "
        "asymmetric, none (in --model-overrides)")
    # its config is a Namespace: it took int(2.5) and bool('no') silently
    assert refusal(ROBERTA, load_checkpoint_heads=True, alibi_global_tokens=1.5) == (
        "--alibi-global-tokens in --model-overrides takes an integer, got 1.5")
    assert refusal(ROBERTA, load_checkpoint_heads=True, alibi_learnable_future_slopes="maybe") == (
        "--alibi-learnable-future-slopes in --model-overrides takes true or false, got 'maybe'")
    assert refusal(TRANSLATION, cross_alibi="pointerr").startswith(
        "unknown --cross-alibi 'pointerr'; choose one of:")


def test_a_nested_model_override_is_checked():
    assert "'alibi_slope_scal'" in refusal(LM, model={"alibi_slope_scal": 0.5})


def test_the_hubs_keyword_arguments_are_checked():
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel

    with pytest.raises(OneLineError) as refused:
        AlibiTransformerLanguageModel.from_pretrained(
            str(LM.parent), LM.name, str(FIXTURES), alibi_slope_scal=0.5)
    assert type(refused.value) is OneLineError
    assert str(refused.value).startswith("unknown ALiBi option 'alibi_slope_scal'")
    # a refusal phrased for the command line names the keyword argument, as it was given
    with pytest.raises(options.OptionError) as refused:
        AlibiTransformerLanguageModel.from_pretrained(
            str(LM.parent), LM.name, str(FIXTURES), alibi_window_sinks=4)
    assert str(refused.value) == ("alibi_window_sinks needs alibi_window_cutoff: sinks are the "
                                  "keys kept beyond the slope windows")


def test_a_stock_model_refuses_the_packages_keys_it_would_ignore():
    with pytest.raises(ValueError) as refused:
        options.check_override_keys(["max_target_positions", "alibi_document_mask"],
                                    "transformer_lm")
    assert str(refused.value).startswith("ALiBi option 'alibi_document_mask' in "
                                         "--model-overrides does nothing to transformer_lm")
    options.check_override_keys(["max_target_positions"], "transformer_lm")  # stock: untouched
    options.check_override_keys(["alibi_slope_scal"], None)  # names no model: not checked


def test_a_stock_checkpoint_refuses_a_document_mask_override(tmp_path):
    """What fairseq-eval-lm and the hub load: a stock transformer_lm given
    {'alibi_document_mask': 'eos'} would run without it, as if masked."""
    from tests.helpers.checkpoints import saved_in_process
    from tests.helpers.training import STOCK

    stock = saved_in_process(tmp_path / "stock.pt", FIXTURES, *STOCK["lm"])
    assert "'alibi_document_mask' in --model-overrides does nothing to transformer_lm" in \
        refusal(stock, alibi_document_mask="eos")
    assert load(stock, max_target_positions=64) is not None


def start_job(family, name, *overrides):
    """The composed config of a shipped config and the callback's check before the job runs."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from fairseq.dataclass.initialize import hydra_init

    hydra_init(name)
    with initialize_config_dir(config_dir=str(REPO / "config" / family), version_base="1.1"):
        cfg = hydra_compose(config_name=name, overrides=list(overrides))
    RegisterFairseqAlibi().on_job_start(config=cfg, task_function=None)
    return cfg


def test_a_hydra_configs_misspelt_model_key_is_refused():
    from omegaconf.errors import ConfigKeyError

    from tests.helpers.building import compose

    # a dataclass model's section: fairseq's add_defaults would refuse it, deep in the job ...
    with pytest.raises(ConfigKeyError):
        compose(REPO / "config" / "lm", "wikitext103_alibi", ["+model.alibi_slope_scal=2"])
    # ... the callback refuses it first, in one line
    with pytest.raises(SystemExit, match="unknown ALiBi option 'alibi_slope_scal' in the "
                                         "config's model"):
        start_job("lm", "wikitext103_alibi", "+model.alibi_slope_scal=2")
    # a legacy model's section takes any key: the callback refuses it
    with pytest.raises(SystemExit) as refused:
        start_job("mlm", "wikitext103_alibi", "+model.alibi_variantt=offset")
    assert "error: unknown ALiBi option 'alibi_variantt' in the config's model (did you mean " \
           "'alibi_variant'?); valid for alibi_roberta: " in str(refused.value)
    with pytest.raises(SystemExit, match="'decoder_alibi_global_tokens' in the config's model"):
        start_job("translation", "iwslt14_de_en_alibi", "+model.decoder_alibi_global_tokens=1")
    cfg = start_job("mlm", "wikitext103_alibi", "+model.pooler_dropout=0.5")  # not ours: as stock
    assert cfg.model.alibi_variant == "offset"


def test_a_hydra_config_with_the_forks_keys_is_refused_naming_what_replaces_them():
    """A fork user's config: the legacy model's section took EIFY's keys and ignored them, so
    a zero-clap config trained a plain offset encoder with RoBERTa's head, without a word."""
    for family, name, key, fix in (
            ("mlm", "wikitext103_alibi", "+model.contrastive_pretraining=true",
             "model.mlm_head clap"),
            ("mlm", "wikitext103_alibi", "+model.initial_beta=2.0", "model.clap_initial_beta"),
            ("mlm", "wikitext103_alibi", "+task.omit_mask=true",
             "model.embedding_omits_mask, with model.zero_mask_embedding"),
            ("translation", "iwslt14_de_en_alibi", "+model.decoder_alibi=true",
             "model.decoder_alibi_variant causal")):
        with pytest.raises(SystemExit) as refused:
            start_job(family, name, key)
        group, field = key[1:].split("=")[0].split(".")
        assert str(refused.value).endswith(
            f"error: {field} in the config's {group} is an option of EIFY's ALiBi fork, which "
            f"this model would ignore: drop it (here: {fix}; docs/migrating.md)"), \
            str(refused.value)
    # a load-time override alike (the hub, --model-overrides)
    assert refusal(ROBERTA, load_checkpoint_heads=True, zero_masking=True) == (
        "zero_masking in --model-overrides is an option of EIFY's ALiBi fork, which this model "
        "would ignore: drop it (here: --zero-mask-embedding (with the fork's --omit-mask: "
        "--embedding-omits-mask too); docs/migrating.md)")


def test_a_hydra_configs_bad_alibi_value_is_refused_in_one_line():
    # hydra composes these; fairseq would merge them into the model inside the job, where
    # omegaconf (a misspelt choice) or the model's build (a rule) fails with a traceback
    with pytest.raises(SystemExit, match="unknown model.alibi_document_mask 'docs'; choose one "
                                         "of: none, eos, doc \\(in the config's model\\)"):
        start_job("lm", "wikitext103_alibi", "++model.alibi_document_mask=docs")
    with pytest.raises(SystemExit, match="model.alibi_window_cutoff must be a finite number"):
        start_job("lm", "wikitext103_alibi", "++model.alibi_window_cutoff=-1")
    with pytest.raises(SystemExit, match="unknown model.alibi_variant 'offsett'"):
        start_job("mlm", "wikitext103_alibi", "model.alibi_variant=offsett")
    assert start_job("lm", "wikitext103_alibi",
                     "++model.alibi_document_mask=doc").model.alibi_document_mask == "doc"


@pytest.mark.slow
def test_fairseq_hydra_train_ends_a_refused_combination_in_one_line(tmp_path):
    # sinks without windows: refused when the model is built, inside the job
    out = run_cli("fairseq-hydra-train", "--config-dir", REPO / "config" / "lm", "--config-name",
                  "train_short", "++model.alibi_window_sinks=4", "common.cpu=true",
                  f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, expect_ok=False)
    assert out.strip().splitlines()[-1] == (
        "fairseq-hydra-train: error: model.alibi_window_sinks needs model.alibi_window_cutoff: "
        "sinks are the keys kept beyond the slope windows"), out[-2000:]
    assert "Traceback" not in out


def test_every_shipped_config_passes_the_check():
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from fairseq.dataclass.initialize import hydra_init

    checked = []
    for family in ("lm", "mlm", "glue", "translation"):
        for path in sorted((REPO / "config" / family).glob("*.yaml")):
            if path.stem == "fairseq_alibi":
                continue
            hydra_init(path.stem)
            with initialize_config_dir(config_dir=str(path.parent), version_base="1.1"):
                cfg = hydra_compose(config_name=path.stem)
            check_model_config_keys(cfg.model, "the config's model")
            checked.append(path.stem)
    assert len(checked) > 20


def test_a_command_lines_unknown_alibi_flag_is_argparses_error():
    with pytest.raises(SystemExit):
        training_config([str(FIXTURES)] + [str(a) for a in MODELS["lm_fixed_slopes"]]
                        + ["--alibi-slope-scal", "2"])


@pytest.mark.slow
def test_fairseq_eval_lm_refuses_a_misspelt_override(trained_lm_checkpoint, tiny_lm_data,
                                                      alibi_user_dir):
    for overrides, last in (
            ("{'alibi_slope_scal': 0.5}",
             "OneLineError: unknown ALiBi option 'alibi_slope_scal' in --model-overrides (did "
             f"you mean 'alibi_slope_scale'?); valid for alibi_transformer_lm: {LM_OPTIONS}"),
            ("{'alibi_document_mask': 'docs'}",
             "OptionError: unknown --alibi-document-mask 'docs'; choose one of: none, eos, doc "
             "(in --model-overrides)"),
            # refused at the first call (the device): its line, not the call's traceback
            ("{'alibi_attention': 'flash'}",
             "OneLineError: --alibi-attention flash cannot serve this call: flash runs on CUDA "
             "only. Use --alibi-attention auto (or fold or sdpa or flex or naive or windowed), "
             "e.g. at load time with --model-overrides \"{'alibi_attention': 'auto'}\" (the "
             "hub: from_pretrained(..., alibi_attention='auto'))"),
            # not a dict: fairseq's eval of the text fails bare; the hint says what it takes
            ("alibi_window_cutoff=8",
             "fairseq_alibi: --model-overrides takes a Python dict of option names, e.g. "
             "\"{'alibi_window_cutoff': 8}\" (quoted for the shell), got alibi_window_cutoff=8"),
            # another Python value: the same, where the package reads it (its one line)
            ("[1, 2]",
             "OneLineError: --model-overrides takes a Python dict of option names, e.g. "
             "\"{'alibi_window_cutoff': 8}\" (quoted for the shell), got [1, 2]")):
        out = run_cli("fairseq-eval-lm", tiny_lm_data, "--user-dir", alibi_user_dir, "--path",
                      trained_lm_checkpoint, "--cpu", "--max-tokens", "4096", "--num-workers",
                      "0", "--model-overrides", overrides, expect_ok=False)
        assert out.strip().splitlines()[-1] == last, out[-2000:]
        if not last.startswith("fairseq_alibi:"):  # the plugin's own refusals: no traceback
            assert "Traceback" not in out


def test_an_option_error_is_its_own_one_line_hint():
    """What the shipped hydra configs' callback prints when a job fails (hydra never reaches
    the excepthook): the refusal's own line and type, not the ValueError it was made from."""
    from fairseq_alibi.error_hints import hint_for

    with pytest.raises(options.OptionError) as refused:
        options.check_stacks({options.LM: (options.StackOptions(variant="causal",
                                                                window_sinks=4), 4)})
    assert hint_for(refused.value) == (
        "OptionError: --alibi-window-sinks needs --alibi-window-cutoff: sinks are the keys kept "
        "beyond the slope windows")
