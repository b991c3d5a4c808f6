"""Models built in this process exactly as fairseq-train builds them from its command line, and
hydra configs composed as fairseq-hydra-train composes them."""

import copy
from pathlib import Path

import torch

import fairseq_alibi  # noqa: F401  (registers the models for the in-process builds)
from tests.helpers.training import MODELS


def write_dictionary(folder: Path, vocab: int) -> Path:
    """A fairseq ``dict.txt`` of ``vocab`` words (fairseq adds its 4 specials)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "dict.txt", "w") as f:
        for i in range(vocab):
            f.write(f"w{i} {vocab - i}\n")
    return folder


_COMPOSED = {}  # the parsed options -> fairseq's config (see training_config)


def training_config(argv):
    """fairseq's config for a fairseq-train command line, as fairseq-train builds it: parsed by
    fairseq's parser every call, then composed by hydra (a second or more per call, most of an
    in-process test's time) once per distinct set of parsed options, and copied."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parsed = options.parse_args_and_arch(options.get_training_parser(), [str(a) for a in argv])
    key = repr(sorted(vars(parsed).items()))
    if key not in _COMPOSED:
        _COMPOSED[key] = convert_namespace_to_omegaconf(parsed)
    return copy.deepcopy(_COMPOSED[key])


def setup_from_command_line(data, *args):
    """``(cfg, task)`` for fairseq-train arguments (after the data folder)."""
    from fairseq import tasks

    cfg = training_config([data, *args])
    return cfg, tasks.setup_task(cfg.task)


def build_from_command_line(data, *args):
    """``(model, task)`` for fairseq-train arguments (after the data folder)."""
    cfg, task = setup_from_command_line(data, *args)
    return task.build_model(cfg.model), task


def build_tiny_translation(folder, *flags):
    """An untrained 1-layer ``alibi_transformer`` (dimension 16, 4 heads) built in this process
    from fairseq-train ``flags``, on ``folder``'s ``dict.txt`` as both sides' dictionary."""
    for side in ("src", "tgt"):
        (Path(folder) / f"dict.{side}.txt").write_text((Path(folder) / "dict.txt").read_text())
    cfg, task = setup_from_command_line(
        folder, "--task", "translation", "-s", "src", "-t", "tgt", "--arch", "alibi_transformer",
        "--encoder-layers", 1, "--decoder-layers", 1, "--encoder-embed-dim", 16,
        "--decoder-embed-dim", 16, "--encoder-attention-heads", 4,
        "--decoder-attention-heads", 4, *flags)
    return task.build_model(cfg.model)


def build_model(model, data, *extra):
    """``(model, task)`` of ``model`` ("lm" or "encoder") built in this process, as fairseq-train
    would from the same flags (``extra`` overrides them, e.g. ``--alibi-variant symmetric``)."""
    cfg, task = setup_from_command_line(data, *MODELS[model], "--cpu", *extra)
    return task.build_model(cfg.model), task


def decode_token_by_token(model, tokens):
    """``(B, T, V)``: the decoder's output for ``tokens`` ``(B, T)``, one new token per call
    through fairseq's incremental state (the KV cache), as a generator decodes; equals the full
    forward pass."""
    state = {}
    steps = [model.decoder(tokens[:, : t + 1], incremental_state=state)[0][:, -1]
             for t in range(tokens.size(1))]
    return torch.stack(steps, 1)


def compose(config_dir, name, overrides=()):
    """Compose a config as fairseq-hydra-train does (fairseq's ConfigStore schema, then the
    registered dataclasses' defaults), without running it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import fairseq_alibi.hydra_support  # noqa: F401  (the resolver, as hydra's callback would)
    from fairseq.dataclass.initialize import add_defaults, hydra_init

    hydra_init(name)
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.1"):
        cfg = hydra_compose(config_name=name, overrides=list(overrides))
    add_defaults(cfg)
    return cfg
