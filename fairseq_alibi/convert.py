"""Turn a stock fairseq ``transformer_lm`` checkpoint into an ``alibi_transformer_lm`` one.

::

    python -m fairseq_alibi.convert --input stock.pt --output alibi.pt [--arch alibi_...]

Every weight is kept, bit for bit, under its own name; the position embeddings are dropped
(learned: ``decoder.embed_positions.weight``; sinusoidal ones are computed, not stored, apart
from the ``_float_tensor`` placeholder of older checkpoints), and the ALiBi slopes of the
model's head count (``decoder.alibi.slopes``) are added. The model
configuration is the original one with the architecture renamed (``transformer_lm_gpt`` becomes
``alibi_transformer_lm_gpt``) and the ALiBi options at their defaults. The dictionary is not
part of a fairseq checkpoint: the converted model uses the same data directory (or
``dict.txt``) as the original. The optimizer state is left out (it belongs to the original
parameter list); an EMA copy of the weights, if any, is converted like the weights.

Before writing, the converted weights are loaded (``strict=True``) into the ALiBi model built
from the converted configuration, so a checkpoint that does not fit is refused here, not at
fine-tuning time. Anything else the converter cannot turn into an ALiBi language model
(another model type, character embeddings, an ALiBi checkpoint already) is a clear error.

The converted model has never seen the bias: its perplexity right after conversion is worse
than the original's (how much depends on how much the model leaned on positions). Fine-tune it (``fairseq-train --finetune-from-model alibi.pt``),
or distil it from the original with the ``lm_distillation`` criterion
(:mod:`fairseq_alibi.criterions.lm_distillation`).
"""

import argparse
import os
import sys
from pathlib import Path
from typing import Optional

import torch

POSITION_PREFIX = "decoder.embed_positions."
ALIBI_PREFIX = "decoder.alibi."
ALIBI_MODEL = "alibi_transformer_lm"
STOCK_MODEL = "transformer_lm"


class ConversionError(ValueError):
    """The checkpoint cannot be converted; the message says why and what to do."""


def _model_cfg_get(model_cfg, key, default=None):
    if isinstance(model_cfg, argparse.Namespace):
        return getattr(model_cfg, key, default)
    return model_cfg.get(key, default) if hasattr(model_cfg, "get") else default


def _model_cfg_set(model_cfg, key, value):
    from omegaconf import OmegaConf, open_dict

    if isinstance(model_cfg, argparse.Namespace):
        setattr(model_cfg, key, value)
    elif OmegaConf.is_config(model_cfg):
        with open_dict(model_cfg):  # configs converted from argparse checkpoints are "struct"
            model_cfg[key] = value
    else:
        model_cfg[key] = value


def architecture_of(model_cfg) -> Optional[str]:
    """The architecture a checkpoint's model config names (``_name``, or ``arch`` for argparse)."""
    return _model_cfg_get(model_cfg, "_name") or _model_cfg_get(model_cfg, "arch")


def target_architecture(source_arch: str, requested: Optional[str] = None) -> str:
    """``alibi_<stock arch>`` (or ``requested``, which must be an ALiBi LM architecture)."""
    from fairseq.models import ARCH_MODEL_INV_REGISTRY

    import fairseq_alibi  # noqa: F401  (registers the ALiBi architectures)

    alibi_archs = set(ARCH_MODEL_INV_REGISTRY[ALIBI_MODEL]) | {ALIBI_MODEL}
    if requested is not None:
        if requested not in alibi_archs:
            raise ConversionError(
                f"--arch {requested!r} is not an ALiBi language model architecture; choose one "
                f"of: {', '.join(sorted(alibi_archs))}"
            )
        return requested
    target = f"alibi_{source_arch}"
    if target not in alibi_archs:  # a stock arch registered after the ALiBi mirrors were made
        raise ConversionError(
            f"no ALiBi architecture mirrors {source_arch!r}; pass one with --arch "
            f"(e.g. --arch {ALIBI_MODEL})"
        )
    return target


def check_convertible(model_cfg):
    """Raise :class:`ConversionError` unless this is a stock ``transformer_lm`` we can convert."""
    from fairseq.models import ARCH_MODEL_INV_REGISTRY, ARCH_MODEL_REGISTRY

    import fairseq_alibi  # noqa: F401

    arch = architecture_of(model_cfg)
    alibi_archs = set(ARCH_MODEL_INV_REGISTRY[ALIBI_MODEL]) | {ALIBI_MODEL}
    if arch in alibi_archs:
        raise ConversionError(
            f"this is already an ALiBi language model ({arch}): nothing to convert; load it as it is"
        )
    stock_archs = set(ARCH_MODEL_INV_REGISTRY[STOCK_MODEL]) | {STOCK_MODEL}
    if arch not in stock_archs:
        kind = ARCH_MODEL_REGISTRY[arch].__name__ if arch in ARCH_MODEL_REGISTRY else "unknown"
        raise ConversionError(
            f"only fairseq transformer_lm checkpoints (causal language models with learned or "
            f"sinusoidal positions) can be converted; this one is {arch!r} ({kind}). RoBERTa "
            f"and translation models are not converted: train alibi_roberta / an ALiBi LM instead"
        )
    if _model_cfg_get(model_cfg, "character_embeddings", False):
        raise ConversionError(
            "character-level input embeddings (--character-embeddings) are not supported by the "
            "converter; convert a model with token (or adaptive) input embeddings"
        )
    if _model_cfg_get(model_cfg, "cross_self_attention", False):
        raise ConversionError(
            "--cross-self-attention models cannot use ALiBi self-attention; nothing to convert"
        )
    return arch


def position_kind(model_cfg) -> str:
    """``learned``, ``sinusoidal`` or ``none``: the position embeddings the stock model had."""
    if _model_cfg_get(model_cfg, "no_token_positional_embeddings", False):
        return "none"
    return "learned" if _model_cfg_get(model_cfg, "decoder_learned_pos", False) else "sinusoidal"


def alibi_state(num_heads: int) -> dict:
    """The state-dict entries of the ALiBi bias module of a ``num_heads``-head decoder."""
    from fairseq_alibi.alibi import AlibiPositionalBias

    module = AlibiPositionalBias(num_heads, "causal")
    return {ALIBI_PREFIX + k: v for k, v in module.state_dict().items()}


def convert_weights(weights: dict, num_heads: int):
    """``(converted, dropped)``: the same tensors minus position embeddings, plus the slopes."""
    if any(k.startswith(ALIBI_PREFIX) for k in weights):
        raise ConversionError("these weights already hold ALiBi slopes (decoder.alibi.*)")
    dropped = [k for k in weights if k.startswith(POSITION_PREFIX)]
    converted = {k: v for k, v in weights.items() if not k.startswith(POSITION_PREFIX)}
    converted.update(alibi_state(num_heads))
    return converted, dropped


def vocabulary_size(weights: dict) -> int:
    """Rows of the input embedding (summed over the bands of an adaptive input)."""
    if "decoder.embed_tokens.weight" in weights:
        return int(weights["decoder.embed_tokens.weight"].shape[0])
    bands = [v for k, v in weights.items()
             if k.startswith("decoder.embed_tokens.embeddings.") and k.endswith(".0.weight")]
    if bands:
        return int(sum(v.shape[0] for v in bands))
    raise ConversionError(
        "no input embedding found (decoder.embed_tokens.*): is this a transformer_lm checkpoint?"
    )


def placeholder_dictionary(size: int):
    """A fairseq Dictionary of ``size`` symbols (only its size matters to build the model)."""
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    while len(dictionary) < size:
        dictionary.add_symbol(f"<placeholder_{len(dictionary)}>")
    if len(dictionary) != size:
        raise ConversionError(f"the embedding has {size} rows, fewer than fairseq's specials")
    return dictionary


def build_alibi_model(model_cfg, vocab_size: int):
    """The ALiBi model a converted configuration describes (placeholder dictionary)."""
    import copy

    from fairseq import models

    class _Task:  # build_model only reads the dictionaries
        source_dictionary = target_dictionary = placeholder_dictionary(vocab_size)

    return models.build_model(copy.deepcopy(model_cfg), _Task())


def convert_checkpoint(state: dict, arch: Optional[str] = None, check: bool = True) -> dict:
    """Convert a loaded checkpoint (``checkpoint_utils.load_checkpoint_to_cpu``) in place.

    Returns a summary dict (source/target architecture, kept/dropped keys, heads).
    """
    if not isinstance(state, dict) or "model" not in state:
        raise ConversionError("not a fairseq checkpoint (no 'model' weights in it)")
    cfg = state.get("cfg")
    if cfg is None or cfg.get("model") is None:
        raise ConversionError(
            "this checkpoint has no model configuration ('cfg' or 'args'), so the architecture "
            "cannot be known; it was not written by fairseq-train"
        )
    model_cfg = cfg["model"]
    source_arch = check_convertible(model_cfg)
    target_arch = target_architecture(source_arch, arch)
    heads = _model_cfg_get(model_cfg, "decoder_attention_heads")
    if not isinstance(heads, int) or heads < 1:
        raise ConversionError(f"the model configuration has no head count ({heads!r})")

    positions = position_kind(model_cfg)
    weights, dropped = convert_weights(state["model"], heads)
    dropped_parameters = sum(state["model"][k].numel() for k in dropped)
    for key, value in (("_name", target_arch), ("arch", target_arch),
                       ("alibi_attention", "auto"), ("alibi_slope_scale", 1.0),
                       ("share_decoder_layers", False)):
        if key == "arch" and not isinstance(model_cfg, argparse.Namespace):
            continue  # hydra configs name the architecture in _name only
        _model_cfg_set(model_cfg, key, value)

    if check:
        model = build_alibi_model(model_cfg, vocabulary_size(weights))
        try:
            model.load_state_dict(dict(weights), strict=True, model_cfg=model_cfg)
        except Exception as e:  # noqa: BLE001 - reported with what to do
            raise ConversionError(
                f"the converted weights do not fit {target_arch} built from the checkpoint's "
                f"configuration: {e}"
            ) from e

    state["model"] = weights
    state["args"] = None  # the configuration lives in cfg (converted above)
    state["last_optimizer_state"] = None  # it indexed the original parameter list
    extra = state.get("extra_state") or {}
    if isinstance(extra.get("ema"), dict):
        extra["ema"], _ = convert_weights(extra["ema"], heads)
    if isinstance(extra.get("ema_fp32_params"), dict):
        extra["ema_fp32_params"] = {k: v for k, v in extra["ema_fp32_params"].items()
                                    if not k.startswith(POSITION_PREFIX)}
    return {
        "source_arch": source_arch,
        "positions": positions,
        "target_arch": target_arch,
        "heads": heads,
        "kept": len(weights) - len(alibi_state(heads)),
        "dropped": dropped,
        "dropped_parameters": dropped_parameters,
    }


def _plain_cfg(cfg):
    from omegaconf import OmegaConf

    if OmegaConf.is_config(cfg):
        return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    return cfg


def convert_file(input_path, output_path, arch: Optional[str] = None, check: bool = True) -> dict:
    """Read ``input_path``, convert it, write ``output_path`` atomically; return the summary."""
    from fairseq import checkpoint_utils

    import fairseq_alibi  # noqa: F401  (models; torch >= 2.6 loading of fairseq checkpoints)

    source, target = Path(input_path), Path(output_path)
    if not source.is_file():
        raise ConversionError(f"no checkpoint at {source}")
    if target.resolve() == source.resolve():
        raise ConversionError("--output must differ from --input (the original is kept)")
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(str(source))
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same advice
        raise ConversionError(f"cannot read {source} as a fairseq checkpoint: {e}") from e
    with torch.no_grad():
        summary = convert_checkpoint(state, arch, check)
    state["cfg"] = _plain_cfg(state["cfg"])
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        torch.save(state, str(tmp))
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_alibi.convert",
        description="Convert a stock fairseq transformer_lm checkpoint (learned or sinusoidal "
        "positions) into an alibi_transformer_lm checkpoint: every weight kept, the position "
        "embeddings dropped, ALiBi slopes added; the dictionary (data directory) stays the same.",
    )
    parser.add_argument("--input", required=True, help="the stock checkpoint (.pt)")
    parser.add_argument("--output", required=True, help="where to write the ALiBi checkpoint")
    parser.add_argument("--arch", default=None,
                        help="ALiBi architecture to record (default: alibi_<original arch>)")
    parser.add_argument("--no-check", action="store_true",
                        help="skip loading the converted weights into the ALiBi model")
    args = parser.parse_args(argv)
    try:
        summary = convert_file(args.input, args.output, args.arch, check=not args.no_check)
    except ConversionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    dropped = ", ".join(summary["dropped"]) or "no tensor (they were computed, not stored)"
    if summary["positions"] == "none":
        dropped = "nothing (the model had no position embeddings)"
    print(f"converted {summary['source_arch']} -> {summary['target_arch']}: {args.output}")
    print(f"  kept     {summary['kept']} tensors, unchanged")
    print(f"  dropped  {summary['positions']} positions: {dropped} "
          f"({summary['dropped_parameters']:,} parameters)")
    heads = summary["heads"]
    print(f"  added    decoder.alibi.slopes ({heads} head{'s' if heads != 1 else ''})")
    print("  the dictionary is unchanged: use the original data directory with the new model")
    print("next: fine-tune or distil it (it has never seen the bias): "
          "fairseq-train DATA --user-dir $(python -m fairseq_alibi --user-dir) "
          f"--arch {summary['target_arch']} [the original's size options] "
          f"--finetune-from-model {args.output} --criterion lm_distillation "
          f"--teacher-path {args.input} ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
