"""Position-embedding options that contradict ALiBi, in a hydra config: refused before the job
starts by the shipped configs' callback, as the command line refuses the flags
(fairseq_alibi.models.checks.POSITION_EMBEDDING_OPTIONS); the configs it lets through build the
positions they ask for (at test sizes, from the composed config, as the job would)."""

import pytest
from fairseq.models.transformer_lm import TransformerLanguageModel
from fairseq.modules import LearnedPositionalEmbedding, SinusoidalPositionalEmbedding

from fairseq_alibi.hydra_support import RegisterFairseqAlibi, hydra_names
from fairseq_alibi.models.alibi_transformer import AlibiTransformerModel
from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel
from fairseq_alibi.modules.stacks import UNBOUNDED_POSITIONS
from tests.helpers.building import compose, setup_from_command_line, write_dictionary
from tests.helpers.cli import REPO, run_cli
from tests.helpers.translation import write_translation_dictionaries

CONFIG = REPO / "config"
LM_ERROR = ("error: model.decoder_learned_pos=true: alibi_transformer_lm has no position "
            "embeddings (the ALiBi bias replaces them); drop decoder_learned_pos from the model "
            "config, or train a stock model for learned positions")
#: the shipped architectures at test sizes (2 heads); the adaptive input/softmax cutoffs of the
#: wiki103 architecture within the test dictionary (40 words + 4 specials)
LM_TEST_SIZES = ["++model.decoder_layers=1", "++model.decoder_embed_dim=16",
                 "++model.decoder_input_dim=16", "++model.decoder_output_dim=16",
                 "++model.decoder_ffn_embed_dim=32", "++model.decoder_attention_heads=2",
                 '++model.adaptive_input_cutoff="11,22"', '++model.adaptive_softmax_cutoff="11,22"']
TRANSLATION_TEST_SIZES = [f"++model.{side}_{k}={v}" for side in ("encoder", "decoder")
                          for k, v in (("layers", 1), ("embed_dim", 16), ("ffn_embed_dim", 32),
                                       ("attention_heads", 2))]
PRESS_SLOPES_2_HEADS = [2.0 ** -4, 2.0 ** -8]


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    return write_dictionary(tmp_path_factory.mktemp("hydra_lm_dict"), 40)


@pytest.fixture(scope="module")
def translation_data(tmp_path_factory):
    return write_translation_dictionaries(tmp_path_factory.mktemp("hydra_translation_dicts"))


def start_job(family, name, *overrides):
    """What hydra does before running the job: the callback's on_job_start on the composed
    config (fairseq's dataclass defaults are only filled in later, by the job); the config."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from fairseq.dataclass.initialize import hydra_init

    hydra_init(name)
    with initialize_config_dir(config_dir=str(CONFIG / family), version_base="1.1"):
        cfg = hydra_compose(config_name=name, overrides=list(overrides))
    RegisterFairseqAlibi().on_job_start(config=cfg, task_function=None)
    return cfg


def build_as_the_job(cfg):
    """``(model, task)`` the job then builds: fairseq's defaults filled in, the task set up from
    ``cfg.task`` and the model from ``cfg.model`` (the architecture function applied)."""
    from fairseq import tasks
    from fairseq.dataclass.initialize import add_defaults

    add_defaults(cfg)
    task = tasks.setup_task(cfg.task)
    return task.build_model(cfg.model), task


def start_lm_job(name, data, *overrides):
    return build_as_the_job(start_job("lm", name, f"task.data={data}", *LM_TEST_SIZES,
                                      *overrides))


def start_translation_job(data, *overrides):
    return build_as_the_job(start_job(
        "translation", "iwslt14_de_en_alibi", f"task.data={data}", "task.source_lang=src",
        "task.target_lang=tgt", *TRANSLATION_TEST_SIZES, *overrides))


def test_lm_config_with_learned_positions_is_refused():
    with pytest.raises(SystemExit) as refused:
        start_job("lm", "wikitext103_alibi", "++model.decoder_learned_pos=true")
    message = str(refused.value.code)
    assert message.endswith(LM_ERROR) and "\n" not in message


@pytest.mark.parametrize("name,tokens_per_sample", [("wikitext103_alibi", 512),
                                                    ("pile_alibi_gpt2_small", 2048)])
def test_shipped_alibi_lm_configs_pass_and_build_no_positions(name, tokens_per_sample, lm_data):
    model, task = start_lm_job(name, lm_data)
    assert type(model) is AlibiTransformerLanguageModel
    assert model.decoder.embed_positions is None
    assert model.decoder.alibi.slopes.tolist() == PRESS_SLOPES_2_HEADS
    assert model.max_positions() == UNBOUNDED_POSITIONS  # no length limit of its own
    assert type(task).__name__ == "LanguageModelingTask"
    assert task.args.tokens_per_sample == tokens_per_sample  # the blocks it will cut


def test_shipped_sinusoidal_config_passes_and_builds_the_stock_model(lm_data):
    model, task = start_lm_job("wikitext103_sinusoidal", lm_data)
    assert type(model) is TransformerLanguageModel and not hasattr(model.decoder, "alibi")
    assert isinstance(model.decoder.embed_positions, SinusoidalPositionalEmbedding)
    assert model.max_positions() == task.args.tokens_per_sample == 512


def test_stock_model_config_may_learn_positions(lm_data):
    """The sinusoidal baseline is a stock transformer_lm: learned positions are its own business."""
    model, _ = start_lm_job("wikitext103_sinusoidal", lm_data, "++model.decoder_learned_pos=true")
    assert type(model) is TransformerLanguageModel
    assert isinstance(model.decoder.embed_positions, LearnedPositionalEmbedding)


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_translation_side_with_alibi_refuses_learned_positions(side, translation_data):
    with pytest.raises(SystemExit) as refused:
        start_job("translation", "iwslt14_de_en_alibi", f"++model.{side}_learned_pos=true")
    assert str(refused.value.code).endswith(
        f"error: model.{side}_learned_pos=true asks for learned position embeddings, which "
        f"ALiBi replaces on alibi_transformer's {side}: drop {side}_learned_pos from the model "
        f"config, or set model.{side}_alibi_variant=none for stock positions")
    # a side built with stock positions may learn them; the other side keeps ALiBi
    model, _ = start_translation_job(translation_data, f"++model.{side}_learned_pos=true",
                                     f"++model.{side}_alibi_variant=none")
    assert type(model) is AlibiTransformerModel
    stock, alibi = (model.encoder, model.decoder) if side == "encoder" else (
        model.decoder, model.encoder)
    assert isinstance(stock.embed_positions, LearnedPositionalEmbedding)
    assert not hasattr(stock, "alibi")
    assert alibi.embed_positions is None and alibi.alibi.slopes.numel() == 2


def test_gpt3_architecture_sets_no_learned_positions_in_hydra(lm_data):
    """The gpt3 architecture functions set decoder_learned_pos (which the ALiBi model ignores);
    fairseq-hydra-train fills the model's dataclass defaults (false) before them, so only a
    config that asks for it has it true, and an architecture alone passes."""
    gpt3 = "model._name=alibi_transformer_lm_gpt3_small"
    assert compose(CONFIG / "lm", "wikitext103_alibi", [gpt3]).model.decoder_learned_pos is False
    model, _ = start_lm_job("wikitext103_alibi", lm_data, gpt3)
    assert type(model) is AlibiTransformerLanguageModel
    assert model.decoder.embed_positions is None


@pytest.mark.slow
def test_fairseq_hydra_train_refuses_learned_positions_in_one_line(tmp_path):
    out = run_cli("fairseq-hydra-train", "--config-dir", CONFIG / "lm", "--config-name",
                  "wikitext103_alibi", f"task.data={tmp_path / 'no-data'}",
                  "++model.decoder_learned_pos=true", "common.cpu=true",
                  f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, expect_ok=False)
    assert out.strip().splitlines()[-1] == "fairseq-hydra-train: " + LM_ERROR
    assert "Traceback" not in out
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_refusals_reach_a_hydra_user_with_the_config_keys(translation_data):
    """A refusal phrased with command-line flags names the config keys a hydra user sets
    (a side's option; fairseq's groups); a flag the run's config has no key for (an
    evaluation tool's, another task's) stays a flag. (Through fairseq-hydra-train:
    test_bad_overrides.py.)"""
    cfg = start_job("translation", "iwslt14_de_en_alibi", f"task.data={translation_data}",
                    "task.source_lang=src", "task.target_lang=tgt", *TRANSLATION_TEST_SIZES,
                    "++model.decoder_alibi_window_sinks=2")
    with pytest.raises(ValueError) as refused:
        build_as_the_job(cfg)
    assert hydra_names(str(refused.value), cfg) == (
        "model.decoder_alibi_window_sinks needs model.decoder_alibi_window_cutoff: sinks are "
        "the keys kept beyond the slope windows")
    assert hydra_names("--max-tokens, --lr, --fp16, --model-overrides, --tokens-per-sample",
                       cfg) == ("dataset.max_tokens, optimization.lr, common.fp16, "
                                "--model-overrides, --tokens-per-sample")


def test_a_restore_file_that_names_no_file_is_refused(tmp_path):
    """fairseq would fine-tune a random initialisation, exit status 0; an existing file and
    the default (a resume that may find nothing) pass."""
    glue = (f"task.data={tmp_path}",)
    with pytest.raises(SystemExit, match=r"error: checkpoint\.restore_file=.*checkpoint_lst\.pt: "
                                         r"no such file .* random initialisation"):
        start_job("glue", "rte", *glue, f"checkpoint.restore_file={tmp_path}/checkpoint_lst.pt")
    (tmp_path / "model.pt").touch()
    start_job("glue", "rte", *glue, f"checkpoint.restore_file={tmp_path}/model.pt")
    start_job("lm", "train_short", *glue)


def test_translation_config_exposes_the_cross_attention_options(tmp_path):
    """The shipped translation config lists the cross-attention options with their defaults
    (stock cross-attention), and an override reaches the built model."""
    from fairseq_alibi.modules.cross_position import CrossPositionAttention

    defaults = compose(CONFIG / "translation", "iwslt14_de_en_alibi").model
    assert (defaults.cross_alibi, defaults.cross_alibi_heads, defaults.cross_alibi_ratio,
            defaults.cross_alibi_slope_scale, defaults.cross_attention_length_scale,
            defaults.cross_alibi_eos_guard, defaults.cross_alibi_eos_guard_layer,
            defaults.position_shift, defaults.cross_alibi_inference_slope_scale,
            defaults.cross_alibi_inference_longer_than) == (
                "none", None, None, 1, 0, -1, "last", 0, 0, None)
    sizes = [f"model.{k}={v}" for k, v in dict(
        encoder_layers=1, decoder_layers=1, encoder_embed_dim=32, decoder_embed_dim=32,
        encoder_ffn_embed_dim=64, decoder_ffn_embed_dim=64, encoder_attention_heads=4,
        decoder_attention_heads=4).items()]
    cfg = compose(CONFIG / "translation", "iwslt14_de_en_alibi",
                  ["model.cross_alibi=pointer", "model.cross_alibi_eos_guard=2",
                   "model.cross_attention_length_scale=8", "model.cross_alibi_slope_scale=16",
                   "model.cross_alibi_eos_guard_layer=min",
                   "model.cross_alibi_inference_slope_scale=32",
                   "model.cross_alibi_inference_longer_than=17",
                   *[f"+{s}" for s in sizes]])
    _, task = setup_from_command_line(write_translation_dictionaries(tmp_path),
                                      "--task", "translation",
                                      "--source-lang", "src", "--target-lang", "tgt",
                                      "--arch", "alibi_transformer")
    model = task.build_model(cfg.model)
    cross = [m for m in model.modules() if isinstance(m, CrossPositionAttention)]
    assert len(cross) == 1 and cross[0].mode == "pointer" and cross[0].length_reference == 8
    assert cross[0].slopes.tolist() == [1.0, 1 / 16, 0.0, 0.0]  # 16 x Press's 2 heads
    assert cross[0].inference_slopes.view(-1).tolist() == [2.0, 2 / 16, 0.0, 0.0]  # 32 x
    assert cross[0].inference_longer_than == 17
    assert model.decoder.cross_alibi_eos_guard == 2
    assert model.decoder.cross_alibi_eos_guard_layer == "min"
    with pytest.raises(ValueError, match="unknown --cross-alibi-eos-guard-layer 'middle'; "
                                         "choose one of: last, first, min"):
        task.build_model(compose(CONFIG / "translation", "iwslt14_de_en_alibi",
                                 ["model.cross_alibi=pointer", "model.cross_alibi_eos_guard=2",
                                  "model.cross_alibi_eos_guard_layer=middle",
                                  *[f"+{s}" for s in sizes]]).model)
    with pytest.raises(ValueError, match="needs --cross-alibi-ratio"):
        task.build_model(compose(CONFIG / "translation", "iwslt14_de_en_alibi",
                                 ["model.cross_alibi=ratio", *[f"+{s}" for s in sizes]]).model)


def test_the_pointer_config_builds_the_recommended_model(tmp_path):
    """The shipped recipe of docs/translation.md's choice on validation: the pointer with
    16 x Press's slopes on 2 heads (48 x outside training) and the EOS guard at 2 on the
    pointer furthest behind (min), on the IWSLT recipe."""
    from fairseq_alibi.modules.cross_position import CrossPositionAttention

    cfg = compose(CONFIG / "translation", "iwslt14_de_en_alibi_pointer")
    assert cfg.model._name == "alibi_transformer_iwslt_de_en"
    assert cfg.lr_scheduler.warmup_updates == 4000 and cfg.task.source_lang == "de"
    _, task = setup_from_command_line(write_translation_dictionaries(tmp_path),
                                      "--task", "translation",
                                      "--source-lang", "src", "--target-lang", "tgt",
                                      "--arch", "alibi_transformer")
    model = task.build_model(cfg.model)
    cross = [m for m in model.modules() if isinstance(m, CrossPositionAttention)]
    assert len(cross) == 6 and {m.mode for m in cross} == {"pointer"}
    assert cross[0].slopes.tolist() == [1.0, 1 / 16, 0.0, 0.0]
    assert cross[0].inference_slopes.view(-1).tolist() == [3.0, 3 / 16, 0.0, 0.0]  # 48 x
    assert model.decoder.cross_alibi_eos_guard == 2  # chosen on the validation buckets
    assert model.decoder.cross_alibi_eos_guard_layer == "min"
    assert len(model.decoder.guard_attentions) == 6  # every layer's pointer is read

