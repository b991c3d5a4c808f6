"""The shipped hydra configs (config/lm, config/mlm, config/glue) with stock fairseq-hydra-train.

Every primary config trains 2 updates at tiny dimensions on data made by our pipelines from
tiny inputs; the only overrides are sizes, data paths and device (:data:`TINY`, :data:`DEVICE`).
The trainings run through fairseq-hydra-train's own entry point in this process (one process
for ~30 configs), and once per family as a real ``fairseq-hydra-train`` subprocess started from
a temporary folder with no path to the plugin anywhere. Composition checks compare the configs
with what they claim to be: the architecture functions (``--arch``), fairseq's RoBERTa
pretraining and GLUE fine-tuning yamls, and the numbers of the two papers.
"""

import os
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from fairseq_alibi.__main__ import user_dir
from fairseq_alibi.preprocess import glue, pile, wikitext
from fairseq_alibi.preprocess.encoders import Gpt2BpeEncoder
from tests.helpers import corpora
from tests.helpers.building import compose
from tests.helpers.cli import REPO, run_cli

#: end to end through fairseq's real command lines
pytestmark = pytest.mark.slow

CONFIG = REPO / "config"
FAIRSEQ_ROBERTA = Path(__import__("fairseq").__file__).parent / "examples" / "roberta" / "config"

#: the study's configurations (alibi_variant, mlm_head, zero_mask_embedding)
STUDY = {
    "baseline": ("none", "roberta", False),
    "learned_clap": ("none", "clap", False),
    "alibi": ("offset", "roberta", False),
    "alibi_symmetric": ("symmetric", "roberta", False),
    "alibi_one_sided": ("one_sided", "roberta", False),
    "zero_clap": ("offset", "clap", True),
}
GLUE_TASKS = {"cola": "CoLA", "mnli": "MNLI", "mrpc": "MRPC", "qnli": "QNLI", "qqp": "QQP",
              "rte": "RTE", "sst_2": "SST-2", "sts_b": "STS-B"}

DEVICE = ["common.cpu=true", "common.fp16=false", "dataset.num_workers=0",
          "distributed_training.distributed_world_size=1"]
DECODER = ["model.decoder_layers=1", "model.decoder_embed_dim=16", "model.decoder_input_dim=16",
           "model.decoder_output_dim=16", "model.decoder_ffn_embed_dim=32",
           "model.decoder_attention_heads=2"]
# `++`: alibi_roberta takes its sizes from the architecture (model._name), not from the yaml
ENCODER = ["++model.encoder_layers=1", "++model.encoder_embed_dim=16",
           "++model.encoder_ffn_embed_dim=32", "++model.encoder_attention_heads=2"]
L_MLM = 256  # tokens per masked-LM sample, and the GLUE models' learned positions
STEPS = ["optimization.max_update=2", "optimization.update_freq=[1]"]


def primary_configs():
    """(family, name) of every config meant for --config-name (top level of each family)."""
    for family in ("lm", "mlm", "glue"):
        for path in sorted((CONFIG / family).glob("*.yaml")):
            if path.name != "fairseq_alibi.yaml":  # the plugin block every config includes
                yield family, path.stem


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The tiny datasets, made by the pipelines: word-level WikiText, GPT-2-BPE WikiText and
    Pile shards, GLUE; all BPE data share one dictionary, as pretraining and fine-tuning must."""
    root = tmp_path_factory.mktemp("config_data")
    bpe = Gpt2BpeEncoder.from_dir(corpora.write_tiny_bpe(root / "bpe"))
    # a valid split of at least 8 samples of 128 tokens: on fewer (required_batch_size_multiple)
    # fairseq's trainer finds no validation batch
    text = corpora.write_wikitext(root / "wikitext", paragraphs=(60, 80, 12))
    wikitext.prepare(text, root / "wiki_words")
    wikitext.prepare(text, root / "wiki_bpe", encoder=bpe)
    shards = [corpora.write_pile_shard(root / f"{i:02d}.jsonl.zst",
                                       corpora.pile_documents(40, seed=i))
              for i in range(2)]
    valid = corpora.write_pile_shard(root / "val.jsonl", corpora.pile_documents(10, seed=9))
    pile.prepare(root / "pile", shards, [valid], encoder=bpe, tokens_per_sample=L_MLM,
                 long_docs="truncate")
    corpora.write_glue(root / "glue_data", rows=16)
    glue.prepare(root / "glue_data", root / "glue", ["ALL"], bpe)
    words = len((root / "wiki_words" / "dict.txt").read_text().splitlines()) + 4
    return {"root": root, "words": words}


def tiny_overrides(family, name, data):
    """Sizes, data paths and device for one config."""
    root = data["root"]
    if family == "lm" and name.startswith("wikitext103"):
        cutoffs = f'"{data["words"] // 4},{data["words"] // 2}"'  # adaptive input/softmax
        return [f"task.data={root / 'wiki_words'}", *DECODER, "task.tokens_per_sample=16",
                "dataset.max_tokens=64", f"model.adaptive_input_cutoff={cutoffs}",
                f"model.adaptive_softmax_cutoff={cutoffs}"]
    if family == "lm":  # the Pile's LM, and train_short (already small)
        sizes = [] if name == "train_short" else DECODER
        return [f"task.data={root / 'pile'}", *sizes, "task.tokens_per_sample=16",
                "dataset.max_tokens=64"]
    if family == "mlm":
        data_dir = root / ("pile" if name.startswith("pile") else "wiki_bpe")
        return [f"task.data={data_dir}", *ENCODER, f"task.tokens_per_sample={L_MLM}",
                "dataset.batch_size=4"]
    return [f"task.data={root / 'glue' / (GLUE_TASKS[name] + '-bin')}", *ENCODER,
            f"++model.max_positions={L_MLM}", f"task.max_positions={L_MLM}",
            "dataset.batch_size=4", "dataset.max_tokens=null"]


def in_process_hydra_train(argv):
    """fairseq-hydra-train's entry point (fairseq_cli.hydra_train.cli_main) in this process."""
    from fairseq_cli import hydra_train

    saved = sys.argv
    sys.argv = ["fairseq-hydra-train", *map(str, argv)]
    os.environ["HYDRA_FULL_ERROR"] = "1"  # raise the real error rather than exit(1)
    try:
        hydra_train.cli_main()
    finally:
        sys.argv = saved
        os.environ.pop("HYDRA_FULL_ERROR")


_RUNS = {}


def train(family, name, data, tmp_root, extra=()):
    """Train a config 2 updates (once per family/name/extra); returns its last checkpoint."""
    key = (family, name, tuple(extra))
    if key not in _RUNS:
        run_dir = tmp_root / "runs" / f"{family}-{name}-{len(_RUNS)}"
        overrides = tiny_overrides(family, name, data) + DEVICE + STEPS + list(extra)
        if family == "glue":
            variant = next((e.split("=")[1] for e in extra if e.startswith("variant=")),
                           "zero_clap")
            restore = train("mlm", f"wikitext103_{variant}", data, tmp_root)
            overrides.append(f"checkpoint.restore_file={restore}")
        in_process_hydra_train(["--config-dir", CONFIG / family, "--config-name", name,
                                f"hydra.run.dir={run_dir}", *overrides])
        _RUNS[key] = run_dir / "checkpoints" / "checkpoint_last.pt"
    return _RUNS[key]


def load_state(path):
    state = torch.load(path, map_location="cpu", weights_only=False)
    state["cfg"] = OmegaConf.create(state["cfg"])  # saved as a plain dict
    return state


def known_model_options(model_cfg):
    """Every option the model of this config understands (dataclass fields or argparse)."""
    import argparse

    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, MODEL_DATACLASS_REGISTRY, MODEL_REGISTRY

    model = ARCH_MODEL_NAME_REGISTRY.get(model_cfg._name, model_cfg._name)
    if model in MODEL_DATACLASS_REGISTRY:
        return set(MODEL_DATACLASS_REGISTRY[model].__dataclass_fields__)
    parser = argparse.ArgumentParser()
    MODEL_REGISTRY[model].add_args(parser)
    return {a.dest for a in parser._actions}


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    return tmp_path_factory.mktemp("config_runs")


@pytest.mark.parametrize("family,name", list(primary_configs()))
def test_config_trains_two_updates(family, name, data, runs_root):
    state = load_state(train(family, name, data, runs_root))
    cfg = state["cfg"]
    assert state["optimizer_history"][-1]["num_updates"] == 2
    assert cfg.common.user_dir == user_dir()  # found with no path in the config
    assert cfg.dataset.update_epoch_batch_itr  # a resume in a later epoch is exact
    # every model option of the yaml is one the model has (a typo would be silently kept)
    yaml_model = OmegaConf.load(CONFIG / family / f"{name}.yaml").get("model") or {}
    unknown = set(yaml_model) - known_model_options(cfg.model) - {"_name"}
    assert not unknown, f"options the model does not have: {unknown}"
    if family in ("mlm", "glue"):  # the study configuration it is named for (GLUE: zero_clap)
        variant = "zero_clap" if family == "glue" else max(
            (v for v in STUDY if name.endswith(v)), key=len)
        m = cfg.model
        assert (m.alibi_variant, m.mlm_head, bool(m.zero_mask_embedding)) == STUDY[variant]
        assert m._name == ("alibi_roberta_large" if "_large_" in name else "alibi_roberta_base")


def test_glue_fine_tunes_every_study_variant(data, runs_root):
    """variant= picks the pretrained model's kind (zero_clap: every GLUE config above; baseline:
    the subprocess test below); the model refuses a checkpoint of another kind."""
    for variant in ("learned_clap", "alibi_symmetric", "alibi_one_sided", "alibi"):
        state = load_state(train("glue", "rte", data, runs_root, [f"variant={variant}"]))
        m = state["cfg"].model
        assert (m.alibi_variant, m.mlm_head, bool(m.zero_mask_embedding)) == STUDY[variant]
    with pytest.raises(Exception) as failure:
        in_process_hydra_train([
            "--config-dir", CONFIG / "glue", "--config-name", "rte", "variant=alibi_symmetric",
            f"hydra.run.dir={runs_root / 'mismatch'}", *tiny_overrides("glue", "rte", data),
            *DEVICE, *STEPS,
            f"checkpoint.restore_file={train('mlm', 'wikitext103_zero_clap', data, runs_root)}",
        ])
    assert any("this checkpoint was trained with `" in c for c in causes_of(failure.value))


def causes_of(error):
    """The messages of ``error`` and its causes: fairseq's trainer re-raises the model's error
    as its context."""
    from fairseq_alibi.error_hints import _chain

    return [str(e) for e in _chain(error)]


def test_a_restored_lm_of_other_sizes_is_named_by_overrides(data, runs_root):
    """Under fairseq-hydra-train a checkpoint of other sizes names the overrides that build it
    (``++model.decoder_layers=1``), not flags (an LM's options are an OmegaConf config under
    fairseq-train's flags too)."""
    restore = train("lm", "wikitext103_alibi", data, runs_root)
    with pytest.raises(Exception) as failure:
        in_process_hydra_train([
            "--config-dir", CONFIG / "lm", "--config-name", "wikitext103_alibi",
            f"hydra.run.dir={runs_root / 'sizes'}", *DEVICE, *STEPS, "model.decoder_layers=2",
            *[o for o in tiny_overrides("lm", "wikitext103_alibi", data)
              if not o.startswith("model.decoder_layers=")],
            f"checkpoint.restore_file={restore}"])
    assert any(c.startswith("this checkpoint was trained with ++model.decoder_layers=1; ")
               and c.endswith("build it with ++model.decoder_layers=1")
               for c in causes_of(failure.value)), causes_of(failure.value)


def test_train_length_family_as_one_multirun(data, runs_root):
    """-m train_length=L64,L128: one run per length, each with its own checkpoints."""
    sweep = runs_root / "sweep"
    in_process_hydra_train([
        "-m", "--config-dir", CONFIG / "lm", "--config-name", "wikitext103_alibi",
        "train_length=L64,L128", f"hydra.sweep.dir={sweep}",
        "hydra.sweep.subdir=${hydra.runtime.choices.train_length}",
        *[o for o in tiny_overrides("lm", "wikitext103_alibi", data)
          if not o.startswith(("task.tokens_per_sample", "dataset.max_tokens"))],
        *DEVICE, "optimization.max_update=2",
    ])
    for length in ("L64", "L128"):
        state = load_state(sweep / length / "checkpoints" / "checkpoint_last.pt")
        assert state["cfg"].task.tokens_per_sample == int(length[1:])
        assert state["optimizer_history"][-1]["num_updates"] == 2


# --- the real command, from a folder that knows nothing of the plugin -------------------------


@pytest.mark.parametrize("family,name,extra", [
    ("lm", "wikitext103_alibi", []),
    ("mlm", "pile_base_zero_clap", []),
    ("glue", "sts_b", ["variant=baseline"]),
])
def test_fairseq_hydra_train_from_any_folder(family, name, extra, data, runs_root, tmp_path):
    """The GLUE run takes its config from the installed package (<user dir>/config)."""
    config_dir = (Path(user_dir()) / "config" if family == "glue" else CONFIG) / family
    overrides = tiny_overrides(family, name, data) + DEVICE + STEPS + extra
    if family == "glue":
        overrides.append(f"checkpoint.restore_file={train('mlm', 'wikitext103_baseline', data, runs_root)}")
    env = {"PYTHONPATH": "", "HYDRA_FULL_ERROR": "1"}
    run_cli("fairseq-hydra-train", "--config-dir", config_dir, "--config-name", name,
            *overrides, cwd=tmp_path, env=env)
    runs = list((tmp_path / "outputs" / name).glob("*/checkpoints/checkpoint_last.pt"))
    assert len(runs) == 1, list(tmp_path.rglob("*"))
    state = load_state(runs[0])
    assert state["optimizer_history"][-1]["num_updates"] == 2
    assert state["cfg"].common.user_dir == user_dir()


# --- what the configs claim to be ------------------------------------------------------------


def arch_model_config(arch, task="language_modeling"):
    """What `fairseq-train --arch ARCH` builds the model from."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["data", "--task", task, "--arch", arch,
                                                "--user-dir", user_dir()])
    return convert_namespace_to_omegaconf(args).model


@pytest.mark.parametrize("name,arch,deliberate", [
    ("wikitext103_alibi", "alibi_transformer_lm_wiki103", {}),
    ("wikitext103_sinusoidal", "transformer_lm_wiki103", {}),
    # the Pile recipe's choices on top of the architecture (recipe/pile.yaml says why)
    ("pile_alibi_gpt2_small", "alibi_transformer_lm_gpt",
     {"dropout": 0.0, "attention_dropout": 0.0, "share_decoder_input_output_embed": True}),
])
def test_lm_architecture_is_the_named_one(name, arch, deliberate):
    """fairseq fills a hydra model config from the dataclass before an architecture function
    could: the yaml spells the architecture out, and must equal `--arch`."""
    ours = compose(CONFIG / "lm", name).model
    reference = arch_model_config(arch)
    assert ours._name == reference._name == arch
    for key in reference:
        if key in ("_name", "tokens_per_sample", "max_target_positions"):  # task-dependent
            continue
        want = deliberate.get(key, reference[key])
        assert ours[key] == want, f"{name}: model.{key} is {ours[key]}, {arch} has {want}"


def test_wikitext103_lm_recipe_is_the_papers():
    cfg = compose(CONFIG / "lm", "wikitext103_alibi")
    assert cfg.task.tokens_per_sample == 512 and cfg.task.sample_break_mode == "none"
    assert (cfg.dataset.max_tokens, cfg.optimization.update_freq) == (9216, [1])
    assert cfg.optimizer._name == "nag" and cfg.optimization.lr == [1.0]
    s = cfg.lr_scheduler
    assert (s._name, s.t_mult, s.lr_period_updates, s.lr_shrink) == ("cosine", 2, 270000, 0.75)
    assert (s.warmup_updates, s.warmup_init_lr, s.min_lr) == (16000, 1e-07, 1e-4)
    assert cfg.optimization.stop_min_lr == 1e-09 and cfg.optimization.clip_norm == 0.1
    assert cfg.criterion._name == "adaptive_loss" and cfg.optimization.max_update == 286000
    assert cfg.common.fp16 and cfg.common.seed == 1
    baseline = compose(CONFIG / "lm", "wikitext103_sinusoidal")
    assert OmegaConf.to_container(baseline.optimization) == OmegaConf.to_container(cfg.optimization)
    assert not baseline.model.no_token_positional_embeddings  # sinusoidal positions
    # 3072: the paper's 3072-token batch accumulated over 3 steps (the same 9216 per update)
    c = compose(CONFIG / "lm", "wikitext103_alibi", ["train_length=L3072"])
    assert (c.task.tokens_per_sample, c.dataset.max_tokens, c.optimization.update_freq) == (
        3072, 3072, [3])
    # the train-length family: each length sets L alone
    lengths = sorted(p.stem for p in (CONFIG / "lm" / "train_length").glob("*.yaml"))
    assert lengths == sorted(f"L{n}" for n in (64, 128, 256, 512, 1024, 1536, 2048, 3072))
    for length in lengths:
        group = OmegaConf.load(CONFIG / "lm" / "train_length" / f"{length}.yaml")
        assert group.task == {"tokens_per_sample": int(length[1:])}
        assert set(group) == ({"task", "dataset", "optimization"} if length == "L3072" else {"task"})


def test_pile_mlm_recipes_are_the_studys():
    for size, lr, min_lr, batch, update_freq, arch in (
        ("base", 6e-4, 6e-5, 4, 16, "alibi_roberta_base"),
        ("large", 4e-4, 4e-5, 2, 32, "alibi_roberta_large"),
    ):
        cfg = compose(CONFIG / "mlm", f"pile_{size}_alibi")
        assert cfg.task.tokens_per_sample == 2048 and cfg.task.sample_break_mode == "complete"
        assert cfg.optimization.max_update == 133082
        s = cfg.lr_scheduler
        assert (s._name, s.lr_period_updates, s.warmup_updates, s.lr_shrink) == (
            "cosine", 146390, 10000, 1.0)
        assert s.lr_period_updates == round(1.1 * cfg.optimization.max_update)
        assert (cfg.optimization.lr, s.min_lr) == ([lr], min_lr)
        assert (cfg.dataset.batch_size, cfg.optimization.update_freq) == (batch, [update_freq])
        assert cfg.distributed_training.distributed_world_size == 8
        o = cfg.optimizer
        assert (o._name, o.adam_betas, o.adam_eps, o.weight_decay) == (
            "adam", "(0.9,0.98)", 1e-06, 0.01)
        assert cfg.common.fp16 and cfg.model._name == arch


def comparable(cfg, skip_model=True):
    """A composed config as plain data, without what ours adds on purpose (the plugin block,
    where checkpoints go, each epoch's own batches) and, unless asked, the model."""
    plain = OmegaConf.to_container(cfg, resolve=False)
    plain["common"].pop("user_dir")
    plain["checkpoint"].pop("save_dir")
    plain["dataset"].pop("update_epoch_batch_itr")
    if skip_model:
        plain.pop("model")
    return plain


def test_wikitext103_mlm_mirrors_fairseq_roberta_base_yaml():
    if not (FAIRSEQ_ROBERTA / "pretraining" / "base.yaml").is_file():
        pytest.skip("this fairseq has no examples/roberta/config")
    theirs = comparable(compose(FAIRSEQ_ROBERTA / "pretraining", "base"))
    ours = comparable(compose(CONFIG / "mlm", "wikitext103_alibi"))  # variants: model only
    assert ours["dataset"].pop("skip_invalid_size_inputs_valid_test") is True  # added
    theirs["dataset"].pop("skip_invalid_size_inputs_valid_test", None)
    assert ours == theirs


@pytest.mark.parametrize("family,name", [c for c in primary_configs() if c[0] != "glue"])
def test_the_criterion_can_be_switched_by_an_override(family, name):
    """``criterion._name=masked_lm_documents`` (the document masks' criterion), as the model's
    and task's keys are switched; a plain ``criterion: masked_lm`` could not be overridden."""
    switched = "masked_lm_documents" if family == "mlm" else "cross_entropy"
    cfg = compose(CONFIG / family, name, [f"criterion._name={switched}"])
    assert cfg.criterion._name == switched


def test_glue_configs_are_fairseqs_finetuning_yamls():
    """Every task's yaml holds fairseq's values; composed (STS-B: regression), they survive."""
    if not (FAIRSEQ_ROBERTA / "finetuning").is_dir():
        pytest.skip("this fairseq has no examples/roberta/config")
    for name in GLUE_TASKS:
        ours = OmegaConf.load(CONFIG / "glue" / f"{name}.yaml")
        theirs = OmegaConf.load(FAIRSEQ_ROBERTA / "finetuning" / f"{name}.yaml")
        assert ours.task.pop("shorten_method") == "truncate"  # added: the same inputs for all
        assert set(ours) - {"defaults"} == set(theirs)
        for section in theirs:
            if section != "model":
                assert ours[section] == theirs[section], (name, section)
        assert {k: v for k, v in ours.model.items() if k != "_name"} == {
            k: v for k, v in theirs.model.items() if k != "_name"}
    composed = comparable(compose(CONFIG / "glue", "sts_b"))
    theirs = comparable(compose(FAIRSEQ_ROBERTA / "finetuning", "sts_b"))
    assert composed["task"]["shorten_method"] == "truncate"  # theirs: the default, none
    composed["task"]["shorten_method"] = theirs["task"]["shorten_method"]
    assert composed == theirs
    composed = compose(CONFIG / "glue", "sts_b")
    assert composed.model._name == "alibi_roberta_base"
