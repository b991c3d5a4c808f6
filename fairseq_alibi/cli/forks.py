"""The checkpoints of the two fairseq ALiBi forks, and how they become this plugin's models.

Two forks trained the ALiBi models people have (see docs/migrating.md):

* **Press** (``ofirpress/attention_with_linear_biases``, fairseq 1.0.0a0): the paper's
  WikiText-103 language models. ALiBi is hard-coded in ``TransformerDecoder``: the bias
  ``m_h·j`` is added to the causal mask, which gives the same softmax as ``-m_h·(i-j)``;
  sinusoidal positions are built but never added. Nothing in the checkpoint says so: its
  configuration and weights are those of a stock sinusoidal ``transformer_lm``, hence
  ``--from press``.
* **EIFY** (``EIFY/fairseq``, fairseq 0.12.2): ``transformer_lm_alibi`` LMs, RoBERTa with
  ``encoder_alibi`` (symmetric ``-m|i-j|``, or ``encoder_alibi_asymmetrical``: future keys
  ``-m(j-i-0.5)``, our ``offset``), the CLAP head (``contrastive_pretraining``), zero masking
  and the task's ``omit_mask``, and translation ``transformer``s with encoder and decoder ALiBi.
  Its options are extra keys of the model configuration, so it is recognised.

Both use Press's slope rule (:func:`fairseq_alibi.alibi.get_slopes`, power of two or not);
the converted checkpoint stores the slopes in its ``alibi.slopes`` buffer, which loading keeps.
Every weight is kept bit for bit under its own name. This module knows the forks' formats; the
conversion of stock ``transformer_lm`` checkpoints and the command line are in
:mod:`fairseq_alibi.cli.convert_checkpoints`.
"""

import argparse
from pathlib import Path
from typing import Optional, Sequence

import torch

from fairseq_alibi.cli.checkpoint_io import (
    PlaceholderTask,
    build_model,
    ConversionError,
    placeholder_dictionary,
)
from fairseq_alibi.config_access import architecture_of, cfg_get, cfg_set, plain_cfg
from fairseq_alibi.models.checks import FORK_ARCHITECTURES, FORK_TASK_OPTIONS, is_refused_flag
from fairseq_alibi.options import default_of, model_wide_defaults

SOURCES = ("stock", "press", "eify")

#: model options only EIFY's fork writes (the LM, RoBERTa and translation models)
EIFY_MODEL_KEYS = (
    "encoder_alibi", "encoder_alibi_asymmetrical", "decoder_alibi", "decoder_alibi_asymmetrical",
    "contrastive_pretraining", "initial_beta", "zero_masking", "mask_prob", "l2norm_embedding",
)
#: the keys that mark a checkpoint as EIFY's: not ``mask_prob``, which is also stock masked_lm's
#: task option (a stock RoBERTa's argparse-era config holds every option, the task's included)
EIFY_MARKER_KEYS = tuple(k for k in EIFY_MODEL_KEYS if k != "mask_prob")
#: task options only EIFY's fork writes
EIFY_TASK_KEYS = FORK_TASK_OPTIONS
#: EIFY architectures that stock fairseq does not have, and what they become
EIFY_ARCHITECTURES = {arch: target for arch, (_, target) in FORK_ARCHITECTURES.items()}
#: RoBERTa architectures and their ALiBi counterparts (the sizes are in the saved config anyway)
ROBERTA_ARCHITECTURES = {
    "roberta": "alibi_roberta", "roberta_base": "alibi_roberta_base",
    "roberta_large": "alibi_roberta_large", "roberta_prenorm": "alibi_roberta",
}
#: keys that 2021-era fairseq copied into the model config from other groups (not options)
FOREIGN_CONFIG_KEYS = ("max_tokens", "tpu")


def detect_fork(state) -> Optional[str]:
    """``"eify"`` when the checkpoint holds options only EIFY's fork writes, else ``None``.

    Press's are not detected here: their weights are those of a stock sinusoidal model and only
    the ``max_tokens`` key of their model config marks them, which ``convert`` checks against
    ``--from`` (:func:`fairseq_alibi.models.checks.is_unconverted_press_config`).
    """
    cfg = state.get("cfg") or {}
    model_cfg, task_cfg = cfg.get("model"), cfg.get("task")
    if any(cfg_get(model_cfg, k) is not None for k in EIFY_MARKER_KEYS):
        return "eify"
    if any(cfg_get(task_cfg, k) is not None for k in EIFY_TASK_KEYS):
        return "eify"
    if architecture_of(model_cfg) in EIFY_ARCHITECTURES:
        return "eify"
    return None


def model_family(model_cfg) -> Optional[str]:
    """``transformer_lm``, ``roberta``, ``transformer`` (translation) or the registered model."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    arch = architecture_of(model_cfg)
    if arch in EIFY_ARCHITECTURES:
        return "transformer_lm"
    return ARCH_MODEL_NAME_REGISTRY.get(arch)


def uses_fork_math(state) -> bool:
    """Whether an EIFY checkpoint has one of the fork's options switched on (ALiBi, CLAP, zero
    masking, omit_mask); with all of them off it is a stock model in the fork's format."""
    from fairseq_alibi.models.checks import FORK_MODEL_OPTIONS

    cfg = state.get("cfg") or {}
    model_cfg, task_cfg = cfg.get("model"), cfg.get("task")
    return (any(cfg_get(model_cfg, k) for k in FORK_MODEL_OPTIONS)
            or bool(cfg_get(task_cfg, "omit_mask")))


def unsupported(key, value, why: str) -> ConversionError:
    return ConversionError(
        f"the fork option {key}={value!r} is not supported by fairseq-alibi ({why}); this "
        f"checkpoint cannot be converted"
    )


def _lm_config_fields():
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModelConfig

    return set(AlibiTransformerLanguageModelConfig.__dataclass_fields__) | {"_name"}


def clean_lm_config(model_cfg, source: str) -> list:
    """Drop what the ALiBi LM's configuration has no field for; return the dropped keys.

    2021-era checkpoints (Press's and stock ones) carry dataset keys such as ``max_tokens`` in
    their model config, which fairseq 0.12's dataclass refuses (``ConfigKeyError``); EIFY's LM
    adds ``decoder_alibi``. A key that changes what the model computes and that this plugin
    has no equivalent for is refused by name instead.
    """
    if source == "eify":
        if cfg_get(model_cfg, "decoder_alibi") is False:
            raise ConversionError(
                "this EIFY-fork language model was trained without ALiBi (decoder_alibi=False): "
                "it is a stock transformer_lm; convert it with --from stock"
            )
    known = _lm_config_fields()
    dropped = []
    plain = plain_cfg(model_cfg, resolve=False)
    for key, value in plain.items():
        if key in known:
            continue
        if key in FOREIGN_CONFIG_KEYS or key in ("decoder_alibi", "decoder_alibi_asymmetrical"):
            dropped.append(key)  # the causal mask hides the keys an asymmetric bias changes
        elif value in (None, False, 0, 0.0, "", -1):
            dropped.append(key)
        else:
            raise unsupported(key, value, "the ALiBi language model has no such option")
    for key in dropped:
        _delete(model_cfg, key)
    return dropped


def _delete(cfg, key):
    from omegaconf import OmegaConf, open_dict

    if isinstance(cfg, argparse.Namespace):
        delattr(cfg, key)
    elif OmegaConf.is_config(cfg):
        with open_dict(cfg):
            del cfg[key]
    else:
        del cfg[key]


# ----------------------------------------------------------------------------- RoBERTa (EIFY)

def _unused_by_forks(prefix: str) -> dict:
    """The declared defaults of the options a fork has no counterpart of: the asymmetric
    variant's future slopes (a fork's variant is never asymmetric) and the model-wide ones."""
    return {**{prefix + name: default_of(name)
               for name in ("future_slope_ratio", "learnable_future_slopes")},
            **model_wide_defaults()}


def roberta_options(model_cfg, task_cfg) -> dict:
    """This plugin's ``alibi_roberta`` options for an EIFY RoBERTa configuration (by name)."""
    get = lambda k, d=None: cfg_get(model_cfg, k, d)  # noqa: E731
    alibi, asym = bool(get("encoder_alibi", False)), bool(get("encoder_alibi_asymmetrical", False))
    clap, zero = bool(get("contrastive_pretraining", False)), bool(get("zero_masking", False))
    l2norm = bool(get("l2norm_embedding", True))
    omit_mask = bool(cfg_get(task_cfg, "omit_mask", False))
    if zero and get("mask_prob", 0.0):
        raise unsupported("mask_prob", get("mask_prob"),
                          "zero masking of random tokens at every forward, inference included")
    if omit_mask and not zero:
        raise unsupported("omit_mask", True, "without zero_masking the fork itself cannot embed "
                          "the mask id, which lies outside its embedding")
    if alibi and not get("no_token_positional_embeddings", False):
        raise unsupported("encoder_alibi", True, "combined with position embeddings")
    if asym and not alibi:
        raise unsupported("encoder_alibi_asymmetrical", True, "without encoder_alibi")
    return dict(
        alibi_variant=("offset" if asym else "symmetric") if alibi else "none",
        **_unused_by_forks("alibi_"),
        mlm_head="clap" if clap else "roberta",
        clap_initial_beta=float(get("initial_beta", 1.0)) if clap else 1.0,
        clap_no_normalize=clap and not l2norm,
        # the fork zeroes ids >= len(dictionary): only omit_mask puts <mask> there
        zero_mask_embedding=zero and omit_mask,
        embedding_omits_mask=omit_mask,
        # the fork builds the embedding without padding index with CLAP or zero masking
        embedding_padding_idx="none" if (clap or zero) else "pad",
        share_encoder_layers=False,
        encoder_input_dim=None,
    )


def model_overrides(model_cfg, target: str, always: Sequence[str] = ()) -> list:
    """``++model.KEY=VALUE`` hydra overrides for every saved model option that differs from what
    the ``target`` architecture sets, and for the options ``always`` whatever their value (what
    a config may set otherwise: the GLUE configs' ``variant`` group sets the variant and the
    head): with them, ``fairseq-hydra-train`` builds exactly the converted model."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    defaults = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[target](defaults)
    defaults = vars(defaults)
    parser = argparse.ArgumentParser(add_help=False)
    ARCH_MODEL_REGISTRY[target].add_args(parser)
    options = set(defaults) | {a.dest for a in parser._actions if not is_refused_flag(a)}
    skip = {"_name", "arch", *model_wide_defaults(), "max_source_positions",
            # training choices, not the model's shape: fine-tuning recipes set their own
            "dropout", "attention_dropout", "activation_dropout", "pooler_dropout",
            "encoder_layerdrop", "no_token_positional_embeddings"}
    overrides = []
    for key, value in plain_cfg(model_cfg, resolve=False).items():
        if key in skip or key not in options or value is None or (
                defaults.get(key) == value and key not in always):
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        overrides.append(f"++model.{key}={text}")
    return overrides


def roberta_task_overrides(model_cfg, options) -> list:
    """The task overrides the GLUE configs need for this model: a learned-position model was
    built for its own ``max_positions``, which ``sentence_prediction`` sizes the model by
    (config/glue/*.yaml: ``task.max_positions: 512``); ALiBi models have no limit to match."""
    max_positions = cfg_get(model_cfg, "max_positions")
    if options["alibi_variant"] != "none" or not max_positions:
        return []
    return [f"task.max_positions={max_positions}"]


def _roberta_dictionary(rows: int, omits_mask: bool):
    """A placeholder dictionary as the masked_lm task builds it: ``<mask>`` last."""
    dictionary = placeholder_dictionary(rows if omits_mask else rows - 1)
    dictionary.add_symbol("<mask>")
    return dictionary


def matching_optimizer_state(source_weights: dict, model, optimizer_state):
    """The fork's optimizer state if it indexes exactly this model's parameters, else ``None``.

    fairseq's optimizer state numbers the parameters in ``model.parameters()`` order. The
    fork's order is the order of its saved parameters (a state dict lists each module's
    parameters in registration order; a tied weight counts once). When the converted model has
    the same parameters, with the same shapes, in the same order, training resumes exactly.
    """
    if not isinstance(optimizer_state, dict):
        return None
    ours = []
    seen = set()
    for name, p in model.named_parameters():  # tied weights are listed once
        if id(p) not in seen:
            seen.add(id(p))
            ours.append((name, tuple(p.shape)))
    names = {n for n, _ in ours}
    theirs = [(k, tuple(v.shape)) for k, v in source_weights.items() if k in names]
    if theirs != ours:
        return None
    state = optimizer_state.get("state", {})
    for index, (_, shape) in enumerate(ours):
        for value in (state.get(index) or {}).values():
            if torch.is_tensor(value) and value.dim() > 0 and tuple(value.shape) != shape:
                return None
    return optimizer_state


def _load_into(model, weights, target, model_cfg, state):
    """Check the converted weights load (``strict``) into ``model``; put them and the fork's
    optimizer state (where it indexes the same parameters) into ``state``."""
    filled = fill_weights(model, weights, target)
    try:
        model.load_state_dict(dict(filled), strict=True, model_cfg=model_cfg)
    except Exception as e:  # noqa: BLE001 - reported with what to do
        raise ConversionError(f"the converted weights do not load into {target}: {e}") from e
    state["model"] = filled
    state["last_optimizer_state"] = matching_optimizer_state(
        weights, model, state.get("last_optimizer_state"))


def fill_weights(model, weights: dict, what: str) -> dict:
    """The model's state dict with the fork's tensors; the model's own buffers where it has no
    counterpart (ALiBi slopes, the model kind). Anything else missing or extra is an error."""
    ours = model.state_dict()
    extra = [k for k in weights if k not in ours]
    if extra:
        raise ConversionError(
            f"the checkpoint's weights do not fit {what}: {len(extra)} unexpected "
            f"tensor(s), e.g. {extra[0]}"
        )
    buffers = {name for name, _ in model.named_buffers()}
    missing = [k for k in ours if k not in weights and k not in buffers]
    if missing:
        raise ConversionError(
            f"the checkpoint's weights do not fit {what}: {len(missing)} missing tensor(s), "
            f"e.g. {missing[0]}"
        )
    filled = {}
    for key, value in ours.items():
        if key in weights:
            if tuple(weights[key].shape) != tuple(value.shape):
                raise ConversionError(
                    f"the checkpoint's {key} has shape {tuple(weights[key].shape)}, {what} built "
                    f"from its configuration needs {tuple(value.shape)}"
                )
            filled[key] = weights[key]
        else:
            filled[key] = value.detach().clone()
    return filled


def convert_eify_roberta(state: dict, dict_path=None) -> dict:
    """Convert a loaded EIFY RoBERTa checkpoint in place; return a summary."""
    from fairseq_alibi.models.alibi_roberta import VARIANT_GROUP_KEYS, roberta_flags

    cfg = state["cfg"]
    model_cfg, task_cfg = cfg["model"], cfg.get("task")
    arch = architecture_of(model_cfg)
    options = roberta_options(model_cfg, task_cfg)
    weights = state["model"]
    key = "encoder.sentence_encoder.embed_tokens.weight"
    if key not in weights:
        raise ConversionError(f"no token embedding ({key}): is this a RoBERTa checkpoint?")
    rows = int(weights[key].shape[0])

    # (an argparse-era config is one Namespace of every argument: the task's keys too)
    for name in (*EIFY_MODEL_KEYS, *EIFY_TASK_KEYS):
        if cfg_get(model_cfg, name) is not None:
            _delete(model_cfg, name)
    for name, value in options.items():
        cfg_set(model_cfg, name, value)
    if options["mlm_head"] == "clap":  # the fork's CLAP head is tied whatever this says
        cfg_set(model_cfg, "untie_weights_roberta", False)
    target = ROBERTA_ARCHITECTURES.get(arch, "alibi_roberta")
    cfg_set(model_cfg, "_name", target)
    if isinstance(model_cfg, argparse.Namespace):
        cfg_set(model_cfg, "arch", target)
    if task_cfg is not None:
        for name in EIFY_TASK_KEYS:
            if cfg_get(task_cfg, name) is not None:
                _delete(task_cfg, name)

    dictionary = _roberta_dictionary(rows, options["embedding_omits_mask"])
    model = build_model(model_cfg, PlaceholderTask(dictionary))
    _load_into(model, weights, target, model_cfg, state)
    dictionary_note = check_roberta_dictionary(dict_path, rows, options["embedding_omits_mask"])
    return {
        "source": "eify", "source_arch": arch, "target_arch": target, "family": "roberta",
        "options": options, "rows": rows,
        "flags": roberta_flags(dict(options, layernorm_embedding=bool(
            cfg_get(model_cfg, "layernorm_embedding", True)))),
        "overrides": model_overrides(model_cfg, target, always=VARIANT_GROUP_KEYS),
        "task_overrides": roberta_task_overrides(model_cfg, options),
        "kept": len(weights), "added": sorted(set(state["model"]) - set(weights)),
        "optimizer_kept": state["last_optimizer_state"] is not None, "dictionary": dictionary_note,
        "beta": float(weights["encoder.lm_head.beta"]) if "encoder.lm_head.beta" in weights
        else None,
    }


def check_roberta_dictionary(dict_path, rows: int, omits_mask: bool) -> dict:
    """How a ``dict.txt`` fits a converted model of ``rows`` embedding rows.

    fairseq's dictionary is the 4 specials, then ``dict.txt``; the masked_lm and
    sentence_prediction tasks append ``<mask>``. So the model needs ``rows`` symbols before
    ``<mask>`` when it omits the mask row, ``rows - 1`` otherwise. The zero-clap Pile models
    were trained without the last two ``madeupword`` entries of GPT-2's ``dict.txt``: when
    only such filler entries are in excess, the matching file is derived (``trimmed``).
    """
    needed = rows - 4 if omits_mask else rows - 5
    result = {"needed_lines": needed, "path": None, "trimmed": None}
    if dict_path is None:
        return result
    lines = [line for line in Path(dict_path).read_text(encoding="utf-8").splitlines()
             if line.strip()]
    result["path"] = str(dict_path)
    if len(lines) == needed:
        return result
    surplus = [line.split(" ", 1)[0] for line in lines[needed:]]
    from fairseq_alibi.models.checks import only_filler_symbols

    if len(lines) > needed and only_filler_symbols(surplus):
        result["trimmed"] = lines[:needed]
        result["dropped_symbols"] = surplus
        return result
    raise ConversionError(
        f"{dict_path} has {len(lines)} entries but the model's embedding needs {needed} "
        f"({rows} rows{', <mask> outside them' if omits_mask else ' including <mask>'}): "
        f"give the dict.txt the model was trained with"
    )


# ------------------------------------------------------------------------ translation (EIFY)

def translation_options(model_cfg) -> dict:
    """``alibi_transformer`` options for an EIFY ``transformer`` configuration (by name)."""
    get = lambda k, d=None: cfg_get(model_cfg, k, d)  # noqa: E731
    encoder, asym = bool(get("encoder_alibi", False)), bool(get("encoder_alibi_asymmetrical", False))
    decoder = bool(get("decoder_alibi", False))
    if not (encoder or decoder):
        raise ConversionError(
            "this EIFY-fork translation model uses no ALiBi (encoder_alibi and decoder_alibi "
            "are False): it is a stock transformer; load it with stock fairseq as it is"
        )
    if asym and not encoder:
        raise unsupported("encoder_alibi_asymmetrical", True, "without encoder_alibi")
    if (encoder or decoder) and not get("no_token_positional_embeddings", False):
        raise unsupported("encoder_alibi" if encoder else "decoder_alibi", True,
                          "combined with position embeddings")
    return dict(
        encoder_alibi_variant=("offset" if asym else "symmetric") if encoder else "none",
        # the fork's decoder bias is -m|i-j| under the causal mask, whatever
        # decoder_alibi_asymmetrical says (it only shifts the masked future keys)
        decoder_alibi_variant="causal" if decoder else "none",
        **_unused_by_forks("encoder_alibi_"),
    )


def convert_eify_translation(state: dict) -> dict:
    """Convert a loaded EIFY translation ``transformer`` checkpoint in place; return a summary."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    model_cfg = state["cfg"]["model"]
    arch = architecture_of(model_cfg)
    options = translation_options(model_cfg)
    weights = state["model"]
    sizes = {}
    for side in ("encoder", "decoder"):
        key = f"{side}.embed_tokens.weight"
        if key not in weights:
            raise ConversionError(f"no token embedding ({key}): is this a translation checkpoint?")
        sizes[side] = int(weights[key].shape[0])
    for name in EIFY_MODEL_KEYS:
        if cfg_get(model_cfg, name) is not None:
            _delete(model_cfg, name)
    for name, value in options.items():
        cfg_set(model_cfg, name, value)
    target = f"alibi_{arch}" if f"alibi_{arch}" in ARCH_MODEL_REGISTRY else "alibi_transformer"
    cfg_set(model_cfg, "_name", target)
    if isinstance(model_cfg, argparse.Namespace) or cfg_get(model_cfg, "arch"):
        cfg_set(model_cfg, "arch", target)

    task = PlaceholderTask(placeholder_dictionary(sizes["encoder"]),
                            placeholder_dictionary(sizes["decoder"]))
    model = build_model(model_cfg, task)
    _load_into(model, weights, target, model_cfg, state)
    return {
        "source": "eify", "source_arch": arch, "target_arch": target, "family": "transformer",
        "options": options, "kept": len(weights), "added": sorted(set(state["model"]) - set(weights)),
        "optimizer_kept": state["last_optimizer_state"] is not None,
    }
