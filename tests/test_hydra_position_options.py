"""Position-embedding options that contradict ALiBi, in a hydra config: refused before the job
starts by the shipped configs' callback, as the command line refuses the flags
(fairseq_alibi.models.checks.POSITION_EMBEDDING_OPTIONS)."""

import pytest

from fairseq_alibi.hydra_support import RegisterFairseqAlibi
from tests.helpers import REPO, run_cli
from tests.test_configs import compose

CONFIG = REPO / "config"
LM_ERROR = ("error: model.decoder_learned_pos=true: alibi_transformer_lm has no position "
            "embeddings (the ALiBi bias replaces them); drop decoder_learned_pos from the model "
            "config, or train a stock model for learned positions")


def start_job(family, name, *overrides):
    """What hydra does before running the job: the callback's on_job_start on the composed
    config (fairseq's dataclass defaults are only filled in later, by the job)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from fairseq.dataclass.initialize import hydra_init

    hydra_init(name)
    with initialize_config_dir(config_dir=str(CONFIG / family), version_base="1.1"):
        cfg = hydra_compose(config_name=name, overrides=list(overrides))
    RegisterFairseqAlibi().on_job_start(config=cfg, task_function=None)


def test_lm_config_with_learned_positions_is_refused():
    with pytest.raises(SystemExit) as refused:
        start_job("lm", "wikitext103_alibi", "++model.decoder_learned_pos=true")
    message = str(refused.value.code)
    assert message.endswith(LM_ERROR) and "\n" not in message


@pytest.mark.parametrize("name", ["wikitext103_alibi", "pile_alibi_gpt2_small",
                                  "wikitext103_sinusoidal"])
def test_shipped_lm_configs_pass(name):
    start_job("lm", name)


def test_stock_model_config_may_learn_positions():
    """The sinusoidal baseline is a stock transformer_lm: learned positions are its own business."""
    start_job("lm", "wikitext103_sinusoidal", "++model.decoder_learned_pos=true")


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_translation_side_with_alibi_refuses_learned_positions(side):
    with pytest.raises(SystemExit) as refused:
        start_job("translation", "iwslt14_de_en_alibi", f"++model.{side}_learned_pos=true")
    assert str(refused.value.code).endswith(
        f"error: model.{side}_learned_pos=true asks for learned position embeddings, which "
        f"ALiBi replaces on alibi_transformer's {side}: drop {side}_learned_pos from the model "
        f"config, or set model.{side}_alibi_variant=none for stock positions")
    # a side built with stock positions may learn them
    start_job("translation", "iwslt14_de_en_alibi", f"++model.{side}_learned_pos=true",
              f"++model.{side}_alibi_variant=none")


def test_gpt3_architecture_sets_no_learned_positions_in_hydra():
    """The gpt3 architecture functions set decoder_learned_pos (which the ALiBi model ignores);
    fairseq-hydra-train fills the model's dataclass defaults (false) before them, so only a
    config that asks for it has it true, and an architecture alone passes."""
    gpt3 = "model._name=alibi_transformer_lm_gpt3_small"
    assert compose(CONFIG / "lm", "wikitext103_alibi", [gpt3]).model.decoder_learned_pos is False
    start_job("lm", "wikitext103_alibi", gpt3)


@pytest.mark.slow
def test_fairseq_hydra_train_refuses_learned_positions_in_one_line(tmp_path):
    out = run_cli("fairseq-hydra-train", "--config-dir", CONFIG / "lm", "--config-name",
                  "wikitext103_alibi", f"task.data={tmp_path / 'no-data'}",
                  "++model.decoder_learned_pos=true", "common.cpu=true",
                  f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, expect_ok=False)
    assert out.strip().splitlines()[-1] == "fairseq-hydra-train: " + LM_ERROR
    assert "Traceback" not in out
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_translation_config_exposes_the_cross_attention_options(tmp_path):
    """The shipped translation config lists the cross-attention options with their defaults
    (stock cross-attention), and an override reaches the built model."""
    from fairseq_alibi.modules.cross_position import CrossPositionAttention
    from tests.test_translation_model import write_dictionaries
    from tests.helpers import setup_from_command_line

    defaults = compose(CONFIG / "translation", "iwslt14_de_en_alibi").model
    assert (defaults.cross_alibi, defaults.cross_alibi_heads, defaults.cross_alibi_ratio,
            defaults.cross_alibi_slope_scale, defaults.cross_attention_length_scale,
            defaults.cross_alibi_eos_guard, defaults.cross_alibi_eos_guard_layer,
            defaults.position_shift) == ("none", None, None, 1, 0, -1, "last", 0)
    sizes = [f"model.{k}={v}" for k, v in dict(
        encoder_layers=1, decoder_layers=1, encoder_embed_dim=32, decoder_embed_dim=32,
        encoder_ffn_embed_dim=64, decoder_ffn_embed_dim=64, encoder_attention_heads=4,
        decoder_attention_heads=4).items()]
    cfg = compose(CONFIG / "translation", "iwslt14_de_en_alibi",
                  ["model.cross_alibi=pointer", "model.cross_alibi_eos_guard=2",
                   "model.cross_attention_length_scale=8", "model.cross_alibi_slope_scale=16",
                   "model.cross_alibi_eos_guard_layer=min",
                   *[f"+{s}" for s in sizes]])
    _, task = setup_from_command_line(write_dictionaries(tmp_path), "--task", "translation",
                                      "--source-lang", "src", "--target-lang", "tgt",
                                      "--arch", "alibi_transformer")
    model = task.build_model(cfg.model)
    cross = [m for m in model.modules() if isinstance(m, CrossPositionAttention)]
    assert len(cross) == 1 and cross[0].mode == "pointer" and cross[0].length_reference == 8
    assert cross[0].slopes.tolist() == [1.0, 1 / 16, 0.0, 0.0]  # 16 x Press's 2 heads
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
    """The shipped recipe of docs/translation.md's measured recommendation: the pointer with
    16 x Press's slopes on half the heads and the EOS guard, on the IWSLT recipe."""
    from fairseq_alibi.modules.cross_position import CrossPositionAttention
    from tests.test_translation_model import write_dictionaries
    from tests.helpers import setup_from_command_line

    cfg = compose(CONFIG / "translation", "iwslt14_de_en_alibi_pointer")
    assert cfg.model._name == "alibi_transformer_iwslt_de_en"
    assert cfg.lr_scheduler.warmup_updates == 4000 and cfg.task.source_lang == "de"
    _, task = setup_from_command_line(write_dictionaries(tmp_path), "--task", "translation",
                                      "--source-lang", "src", "--target-lang", "tgt",
                                      "--arch", "alibi_transformer")
    model = task.build_model(cfg.model)
    cross = [m for m in model.modules() if isinstance(m, CrossPositionAttention)]
    assert len(cross) == 6 and {m.mode for m in cross} == {"pointer"}
    assert cross[0].slopes.tolist() == [1.0, 1 / 16, 0.0, 0.0]
    assert model.decoder.cross_alibi_eos_guard == 2

