"""Convert checkpoints into this plugin's models: stock ``transformer_lm`` ones, and the ALiBi forks'.

::

    fairseq-alibi convert --input X.pt --output Y.pt [--from press|eify|stock] [--dict D]
        [--overwrite]

**Forks** (:mod:`fairseq_alibi.cli.forks`, docs/migrating.md): Press's language models
(``--from press``: their weights are those of a stock sinusoidal checkpoint; one marked as
Press's by the ``max_tokens`` key of its model config is refused without it), EIFY's
``transformer_lm_alibi``, RoBERTa and translation models (detected from their options). Every
weight is kept bit for bit, the ALiBi slopes are added as a buffer, the fork's options become
this plugin's, stored by name; the converted model computes what the fork computed, and the
optimizer state is kept when it indexes the same parameters (training resumes).

**Stock** ``transformer_lm``: every weight is kept, bit for bit, under its own name; the
position embeddings are dropped (learned: ``decoder.embed_positions.weight``; sinusoidal ones
are computed, not stored, apart from the ``_float_tensor`` placeholder of older checkpoints),
and the ALiBi slopes of the model's head count (``decoder.alibi.slopes``) are added. The model
configuration is the original one with the architecture renamed (``transformer_lm_gpt`` becomes
``alibi_transformer_lm_gpt``), the ALiBi options at their defaults, and keys that are not model
options (the ``max_tokens`` of 2021-era configs) dropped. The dictionary is not part of a
fairseq checkpoint: the converted model uses the same data directory (or ``dict.txt``) as the
original. The optimizer state is left out (it belongs to the original parameter list); an EMA
copy of the weights, if any, is converted like the weights.

An existing ``--output`` (or the ``dict.txt`` written beside it) is replaced only with
``--overwrite`` (the package's rule for what its tools write); a missing folder is created, and
said. Before writing (atomically), the converted weights are loaded (``strict=True``) into the
model built from the converted configuration, so a checkpoint that does not fit is refused
here, not at fine-tuning time. Anything else the converter cannot turn into an ALiBi model
(another model type, character embeddings, a fork option with no equivalent, an already
converted checkpoint, an empty or truncated file) is a one-line error.

A converted stock model has never seen the bias: its perplexity right after conversion is worse
than the original's (how much depends on how much the model leaned on positions). Fine-tune it
(``fairseq-train --finetune-from-model alibi.pt``), or distil it from the original with the
``lm_distillation`` criterion (:mod:`fairseq_alibi.criterions.lm_distillation`).
"""

import argparse
import os
import sys
from pathlib import Path
from typing import Optional

import torch

from fairseq_alibi import options
from fairseq_alibi.cli import forks
from fairseq_alibi.cli.checkpoint_io import (  # noqa: F401  (ConversionError: the tools' error)
    ConversionError,
    PlaceholderTask,
    build_model,
    model_config,
    placeholder_dictionary,
    read_checkpoint,
    write_atomically,
)
from fairseq_alibi.config_access import architecture_of, cfg_get, cfg_set, plain_cfg
from fairseq_alibi.models import checks
from fairseq_alibi.models.checks import vocabulary_size

POSITION_PREFIX = "decoder.embed_positions."
#: what older sinusoidal checkpoints store of their positions: a buffer, no parameter
PLACEHOLDER = POSITION_PREFIX + "_float_tensor"
ALIBI_PREFIX = "decoder.alibi."
ALIBI_MODEL = "alibi_transformer_lm"
STOCK_MODEL = "transformer_lm"


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
    target = forks.EIFY_ARCHITECTURES.get(source_arch, f"alibi_{source_arch}")
    if target not in alibi_archs:  # a stock arch registered after the ALiBi mirrors were made
        raise ConversionError(
            f"no ALiBi architecture mirrors {source_arch!r}; pass one with --arch "
            f"(e.g. --arch {ALIBI_MODEL})"
        )
    return target


def refuse_converted_lm(model_cfg):
    """Raise :class:`ConversionError` for an ALiBi language model (converted or trained here),
    whatever ``--from`` says it is."""
    from fairseq.models import ARCH_MODEL_INV_REGISTRY

    import fairseq_alibi  # noqa: F401

    arch = architecture_of(model_cfg)
    if arch in set(ARCH_MODEL_INV_REGISTRY[ALIBI_MODEL]) | {ALIBI_MODEL}:
        raise ConversionError(
            f"this is already an ALiBi language model ({arch}): nothing to convert; load it as it is"
        )


def check_convertible(model_cfg):
    """Raise :class:`ConversionError` unless this is a stock ``transformer_lm`` we can convert."""
    from fairseq.models import ARCH_MODEL_INV_REGISTRY, ARCH_MODEL_REGISTRY

    refuse_converted_lm(model_cfg)
    arch = architecture_of(model_cfg)
    stock_archs = (set(ARCH_MODEL_INV_REGISTRY[STOCK_MODEL]) | {STOCK_MODEL}
                   | set(forks.EIFY_ARCHITECTURES))
    if arch not in stock_archs:
        kind = ARCH_MODEL_REGISTRY[arch].__name__ if arch in ARCH_MODEL_REGISTRY else "unknown"
        raise ConversionError(
            f"only fairseq transformer_lm checkpoints (causal language models with learned or "
            f"sinusoidal positions) can be converted; this one is {arch!r} ({kind}). RoBERTa "
            f"and translation models are converted only from EIFY's ALiBi fork "
            f"(docs/migrating.md)"
        )
    if cfg_get(model_cfg, "character_embeddings", False):
        raise ConversionError(
            "character-level input embeddings (--character-embeddings) are not supported by the "
            "converter; convert a model with token (or adaptive) input embeddings"
        )
    if cfg_get(model_cfg, "cross_self_attention", False):
        raise ConversionError(
            "--cross-self-attention models cannot use ALiBi self-attention; nothing to convert"
        )
    return arch


def position_kind(model_cfg) -> str:
    """``learned``, ``sinusoidal`` or ``none``: the position embeddings the stock model had."""
    if cfg_get(model_cfg, "no_token_positional_embeddings", False):
        return "none"
    return "learned" if cfg_get(model_cfg, "decoder_learned_pos", False) else "sinusoidal"


def alibi_state(num_heads: int) -> dict:
    """The state-dict entries of the ALiBi bias module of a ``num_heads``-head decoder."""
    from fairseq_alibi.modules.bias import AlibiBias

    module = AlibiBias(num_heads, variant="causal")
    return {ALIBI_PREFIX + k: v for k, v in module.state_dict().items()}


def convert_weights(weights: dict, num_heads: int):
    """``(converted, dropped)``: the same tensors minus position embeddings, plus the slopes."""
    if any(k.startswith(ALIBI_PREFIX) for k in weights):
        raise ConversionError("these weights already hold ALiBi slopes (decoder.alibi.*)")
    dropped = [k for k in weights if k.startswith(POSITION_PREFIX)]
    converted = {k: v for k, v in weights.items() if not k.startswith(POSITION_PREFIX)}
    converted.update(alibi_state(num_heads))
    return converted, dropped


def build_alibi_model(model_cfg, vocab_size: int):
    """The ALiBi model a converted configuration describes (placeholder dictionary)."""
    return build_model(model_cfg, PlaceholderTask(placeholder_dictionary(vocab_size)))


def checked_model(weights: dict, model_cfg, target_arch: str, requested: Optional[str],
                  source_arch: str):
    """The model the converted configuration builds, with ``weights`` loaded (``strict``); a
    failure with ``--arch`` given is blamed on it (its defaults fill what the saved config
    leaves unset: an adaptive softmax, other sizes), not on the checkpoint."""
    try:
        vocab = vocabulary_size(weights)
    except ValueError as e:
        raise ConversionError(str(e)) from e
    try:
        model = build_alibi_model(model_cfg, vocab)
        model.load_state_dict(dict(weights), strict=True, model_cfg=model_cfg)
    except Exception as e:  # noqa: BLE001 - reported with what to do
        reason = " ".join(str(e).split()) or type(e).__name__
        if requested is not None:  # the fix is the checkpoint's own architecture, not the option
            raise ConversionError(
                f"--arch {requested} does not fit this {source_arch} checkpoint (its defaults "
                f"over the checkpoint's configuration: {reason.split(': give ')[0]}); drop "
                f"--arch (the default, {target_architecture(source_arch)}, builds the "
                f"checkpoint's own model)") from None
        raise ConversionError(f"the converted weights do not fit {target_arch} built from the "
                              f"checkpoint's configuration: {reason}") from None
    return model


def convert_checkpoint(state: dict, arch: Optional[str] = None, check: bool = True,
                       source: str = "stock") -> dict:
    """Convert a loaded language-model checkpoint (``load_checkpoint_to_cpu``) in place.

    ``source``: ``stock`` (a model with position embeddings: it has never seen the bias),
    ``press`` or ``eify`` (an ALiBi fork's model: the converted one computes the same
    log-probabilities; the fork's optimizer state is kept when it indexes the same parameters,
    so training resumes). Returns a summary dict (source/target architecture, kept/dropped
    keys, heads).
    """
    model_cfg = model_config(state)
    source_arch = check_convertible(model_cfg)
    target_arch = target_architecture(source_arch, arch)
    heads = cfg_get(model_cfg, "decoder_attention_heads")
    if not isinstance(heads, int) or heads < 1:
        raise ConversionError(f"the model configuration has no head count ({heads!r})")

    positions = position_kind(model_cfg)
    dropped_options = forks.clean_lm_config(model_cfg, source)  # e.g. 2021-era max_tokens
    original = state["model"]
    weights, dropped = convert_weights(state["model"], heads)
    # trained parameters only: the sinusoidal placeholder buffer is no position embedding
    dropped_parameters = sum(state["model"][k].numel() for k in dropped if k != PLACEHOLDER)
    for key, value in (("_name", target_arch), ("arch", target_arch),
                       *options.model_wide_defaults().items(), ("share_decoder_layers", False)):
        if key == "arch" and not isinstance(model_cfg, argparse.Namespace):
            continue  # hydra configs name the architecture in _name only
        cfg_set(model_cfg, key, value)

    optimizer = None
    if check:
        model = checked_model(weights, model_cfg, target_arch, arch, source_arch)
        if source != "stock":  # the same model: resuming needs the optimizer state
            optimizer = forks.matching_optimizer_state(
                original, model, state.get("last_optimizer_state"))

    state["model"] = weights
    state["args"] = None  # the configuration lives in cfg (converted above)
    state["last_optimizer_state"] = optimizer  # None: it indexed another parameter list
    extra = state.get("extra_state") or {}
    if isinstance(extra.get("ema"), dict):
        extra["ema"], _ = convert_weights(extra["ema"], heads)
    if isinstance(extra.get("ema_fp32_params"), dict):
        extra["ema_fp32_params"] = {k: v for k, v in extra["ema_fp32_params"].items()
                                    if not k.startswith(POSITION_PREFIX)}
    return {
        "source": source,
        "family": "transformer_lm",
        "dropped_options": dropped_options,
        "optimizer_kept": optimizer is not None,
        "source_arch": source_arch,
        "positions": positions,
        "target_arch": target_arch,
        "heads": heads,
        "kept": len(weights) - len(alibi_state(heads)),
        "dropped": dropped,
        "dropped_parameters": dropped_parameters,
    }


def convert_state(state: dict, arch: Optional[str] = None, check: bool = True,
                  source: Optional[str] = None, dict_path=None) -> dict:
    """Convert any supported checkpoint in place: stock or Press/EIFY fork LMs, EIFY RoBERTa
    (and EIFY translation models); ``source`` None: detected where the checkpoint says."""
    model_cfg = model_config(state)
    cfg = state.get("cfg")
    if cfg is not None and not hasattr(cfg.get("task"), "get"):
        # the forks keep options there too (EIFY's omit_mask): a conversion would drop them
        raise ConversionError(
            "the checkpoint's config has no task section (cfg['task']), which fairseq-train "
            "always writes: the file was edited or damaged; give the file fairseq-train wrote")
    detected = forks.detect_fork(state)
    if source is not None and source not in forks.SOURCES:
        raise ConversionError(f"unknown --from {source!r}; choose one of: {', '.join(forks.SOURCES)}")
    if detected == "eify" and source not in (None, "eify") and forks.uses_fork_math(state):
        raise ConversionError(
            f"this checkpoint holds EIFY-fork options (e.g. encoder_alibi, decoder_alibi, "
            f"contrastive_pretraining): it is not a {source} checkpoint; drop --from {source}"
        )
    family = forks.model_family(model_cfg)
    name = architecture_of(model_cfg)
    if family in ("alibi_roberta", "alibi_transformer"):
        raise ConversionError(
            f"this checkpoint is already converted ({name}): load it as it is"
        )
    if arch is not None and family in ("roberta", "transformer"):
        raise ConversionError("--arch is for language models; RoBERTa and translation "
                              "checkpoints keep their architecture's ALiBi counterpart")
    if family == "roberta":
        if detected != "eify":
            raise ConversionError(
                f"this is a stock RoBERTa checkpoint ({name}): nothing to convert; load it "
                "as alibi_roberta --alibi-variant none --mlm-head roberta (learned positions)"
            )
        return forks.convert_eify_roberta(state, dict_path)
    if family == "transformer" and detected == "eify":
        return forks.convert_eify_translation(state)
    if dict_path is not None:
        raise ConversionError("--dict is for RoBERTa checkpoints (the masked-LM dictionary)")
    explicit = source is not None
    if source is None:
        source = detected if detected and forks.uses_fork_math(state) else "stock"
    if source == "eify" and detected != "eify":
        refuse_converted_lm(model_cfg)
        raise ConversionError(
            "--from eify, but this checkpoint holds none of the EIFY fork's options "
            "(decoder_alibi, encoder_alibi, ...): it is a stock or Press model"
        )
    press = checks.is_unconverted_press_config(model_cfg)
    if press and source == "stock":  # as stock: "fine-tune it", a teacher the package refuses
        raise ConversionError(
            f"this checkpoint was trained with Press's ALiBi fork ({checks.PRESS_MODEL_KEY} in "
            f"its model config, which only that fork writes): convert it with --from press"
            f"{' instead of --from stock' if explicit else ''} (it already computes ALiBi)")
    summary = convert_checkpoint(state, arch, check, source)
    summary["press_marker"] = press
    return summary


def refuse_taken_file(path: Path, flag: str, overwrite: bool):
    """The package's rule for what a tool writes (:func:`fairseq_alibi.files.refuse_taken`, for
    a file): an existing one is replaced only with ``--overwrite``; missing folders are made
    (as ``atomic_directory`` makes them), and said."""
    if path.is_dir():
        raise ConversionError(f"{flag} {path} is a folder: give the file to write (e.g. "
                              f"{path / 'model.pt'})")
    if path.exists() and not overwrite:
        raise ConversionError(f"{flag} {path} already exists; pass --overwrite to replace it")


def _write_dictionary(summary: dict, target: Path, overwrite: bool):
    """The trimmed ``dict.txt`` beside ``target``: checked before anything is written, written
    after the checkpoint (atomically too). ``None`` when there is none to write."""
    trimmed = (summary.get("dictionary") or {}).get("trimmed")
    if trimmed is None:
        return None
    dict_out = target.parent / "dict.txt"
    text = "\n".join(trimmed) + "\n"
    if dict_out.exists() and dict_out.resolve() == Path(summary["dictionary"]["path"]).resolve():
        raise ConversionError(
            f"the matching dict.txt would overwrite {dict_out}, the one given to --dict: "
            "write the converted model to another folder"
        )
    if (dict_out.exists() and not overwrite
            and dict_out.read_text(encoding="utf-8", errors="replace") != text):
        raise ConversionError(f"{dict_out} already exists (another dictionary) and the "
                              "converted model's would replace it; pass --overwrite to replace "
                              "it, or write the model to another folder")

    def write():
        tmp = dict_out.with_name(".dict.txt.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, dict_out)
        summary["dictionary"]["written"] = str(dict_out)

    return write


def convert_file(input_path, output_path, arch: Optional[str] = None, check: bool = True,
                 source: Optional[str] = None, dict_path=None, overwrite: bool = False) -> dict:
    """Read ``input_path``, convert it, write ``output_path`` atomically; return the summary.
    An existing ``output_path`` (or ``dict.txt`` beside it) is replaced only with ``overwrite``."""
    source_path, target = Path(input_path), Path(output_path)
    if target.resolve() == source_path.resolve():
        raise ConversionError("--output must differ from --input (the original is kept)")
    refuse_taken_file(target, "--output", overwrite)
    if dict_path is not None and not Path(dict_path).is_file():  # before anything is written
        raise ConversionError(f"--dict {dict_path}: no such file; give the dict.txt of the "
                              "model's data (its fairseq-preprocess folder)")
    state = read_checkpoint(source_path)
    with torch.no_grad():
        summary = convert_state(state, arch, check, source, dict_path)
    state["cfg"] = plain_cfg(state["cfg"])
    extra = state.get("extra_state")
    if isinstance(extra, dict):  # provenance, by name (fairseq ignores unknown keys here)
        extra["fairseq_alibi_conversion"] = {
            "from": summary.get("source", "stock"), "input": str(source_path),
            "source_arch": summary.get("source_arch"), "target_arch": summary.get("target_arch"),
        }
    write_dictionary = _write_dictionary(summary, target, overwrite)
    missing = next((p for p in reversed(target.parents) if not p.exists()), None)
    write_atomically(state, target, "--output")
    summary["created_folder"] = str(missing) if missing is not None else None
    if write_dictionary is not None:
        write_dictionary()
    return summary


def _dropped_positions(summary) -> str:
    """What the conversion dropped of the positions: trained parameters, or (sinusoidal) at
    most the placeholder buffer older checkpoints store."""
    if summary["positions"] == "none":
        return "nothing (the model had no position embeddings)"
    weights = [k for k in summary["dropped"] if k != PLACEHOLDER]
    if weights:
        what = f"{', '.join(weights)} ({summary['dropped_parameters']:,} parameters)"
    elif PLACEHOLDER in summary["dropped"]:
        what = f"no parameter (computed, not stored), only the placeholder buffer {PLACEHOLDER}"
    else:
        what = "no parameter (computed, not stored)"
    fork = ", which the fork built but never added" if summary["source"] != "stock" else ""
    return f"{summary['positions']} positions{fork}: {what}"


def _report_lm(summary, args):
    print(f"converted {summary['source_arch']} -> {summary['target_arch']}: {args.output}")
    print(f"  kept     {summary['kept']} tensors, unchanged")
    print(f"  dropped  {_dropped_positions(summary)}")
    heads = summary["heads"]
    print(f"  added    decoder.alibi.slopes ({heads} head{'s' if heads != 1 else ''})")
    if summary["dropped_options"]:
        print(f"  config   dropped {', '.join(summary['dropped_options'])} (not model options)")
    print("  the dictionary is unchanged: use the original data directory with the new model")
    if summary["source"] == "stock":
        if summary["positions"] == "sinusoidal":
            print("note: a checkpoint of Press's ALiBi fork (the paper's models) looks exactly "
                  "like this stock sinusoidal one; if it is one, pass --from press: the weights "
                  "are converted the same way, and the model already computes what the fork "
                  "did (no fine-tuning needed)")
        print("next: fine-tune or distil it (it has never seen the bias): "
              "fairseq-train DATA --user-dir $(python -m fairseq_alibi --user-dir) "
              f"--arch {summary['target_arch']} [the original's size options] "
              f"--finetune-from-model {args.output} --criterion lm_distillation "
              f"--teacher-path {args.input} ...")
        return
    if summary["source"] == "press" and not summary.get("press_marker"):
        print(f"warning: nothing marks {args.input} as a Press checkpoint (its model config has "
              f"no {checks.PRESS_MODEL_KEY}, which the fork writes): if a stock fairseq model "
              f"wrote it, convert it without --from press and fine-tune it (it has never seen "
              f"the bias)", file=sys.stderr)
    print(f"  {summary['source']} fork: the converted model computes the fork's "
          "log-probabilities; it has no length limit (no --model-overrides) and keeps the bias "
          "when decoding with a cache")
    if summary["optimizer_kept"]:
        print("  optimizer state kept: fairseq-train --restore-file resumes where the fork stopped")
    print("next: fairseq-eval-lm DATA --user-dir $(python -m fairseq_alibi --user-dir) "
          f"--path {args.output} --tokens-per-sample N")


def _report_roberta(summary, args):
    print(f"converted EIFY-fork {summary['source_arch']} -> {summary['target_arch']}: "
          f"{args.output}")
    print(f"  kept     {summary['kept']} tensors, unchanged (trained pad row included)")
    print(f"  added    {', '.join(summary['added'])}")
    if summary["beta"] is not None:
        print(f"  CLAP beta {summary['beta']:.6g} (trained value, kept)")
    print(f"  options  {summary['flags']}")
    dictionary = summary["dictionary"]
    if dictionary.get("written"):
        print(f"  dict.txt {dictionary['written']}: {args.dict} without its last "
              f"{len(dictionary['dropped_symbols'])} entries "
              f"({', '.join(dictionary['dropped_symbols'])}), which the model was trained "
              "without; use this folder as the data directory")
    elif dictionary.get("path"):
        print(f"  dict.txt {dictionary['path']} matches ({dictionary['needed_lines']} entries)")
    else:
        print(f"  the model needs a dict.txt of {dictionary['needed_lines']} entries (pass "
              "--dict to check yours)")
    if summary["optimizer_kept"]:
        print("  optimizer state kept: training with --restore-file and these model options "
              "resumes where the fork stopped")
    print("next: AlibiRobertaModel.from_pretrained(FOLDER, CHECKPOINT, DATA, bpe='gpt2', ...)")
    print("  fine-tune (e.g. GLUE) with fairseq-hydra-train --config-dir "
          "$(python -m fairseq_alibi --user-dir)/config/glue --config-name TASK "
          f"task.data=DATA-bin {''.join(o + ' ' for o in summary.get('task_overrides', []))}"
          f"checkpoint.restore_file={args.output} "
          f"model._name={summary['target_arch']} {' '.join(summary['overrides'])}")
    # the GLUE configs are fairseq's GPU recipes (fp16), which a CPU-only machine refuses
    print("  (without a GPU add common.fp16=false: the GLUE configs train in fp16)")


def main(argv=None):

    parser = argparse.ArgumentParser(
        prog="fairseq-alibi convert",
        description="Convert a checkpoint into this plugin's format: a stock fairseq "
        "transformer_lm (positions dropped, ALiBi added: fine-tune it), or a model of the ALiBi "
        "forks (Press's language models, EIFY's transformer_lm_alibi, RoBERTa and translation "
        "models: every weight kept, the same outputs). The dictionary (data directory) stays "
        "the same. See docs/migrating.md.",
    )
    parser.add_argument("--input", required=True, help="the checkpoint to convert (.pt)")
    parser.add_argument("--output", required=True, help="where to write the converted checkpoint")
    parser.add_argument(
        "--from", dest="source", choices=forks.SOURCES, default=None,
        help="what wrote the checkpoint: EIFY's fork is detected from its options; Press's "
        "fork (the paper's models) must be named: its weights look like a stock sinusoidal "
        "model's, and one whose config marks it (max_tokens) is refused without --from press "
        "(default: detected, else stock)")
    parser.add_argument("--dict", default=None, metavar="DICT_TXT",
                        help="RoBERTa: the dict.txt to use with the model; checked against its "
                        "embedding, and a matching one written beside --output when it only has "
                        "extra madeupword entries (EIFY's zero-clap Pile models)")
    parser.add_argument("--arch", default=None,
                        help="language models: the ALiBi architecture to record "
                        "(default: alibi_<original arch>)")
    parser.add_argument("--no-check", action="store_true",
                        help="language models: skip loading the converted weights into the model")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing --output (and the dict.txt beside it); "
                        "without it, an existing one is refused")
    args = parser.parse_args(argv)
    try:
        summary = convert_file(args.input, args.output, args.arch, check=not args.no_check,
                               source=args.source, dict_path=args.dict,
                               overwrite=args.overwrite)
    except ConversionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if summary.get("created_folder"):  # a mistyped path must not go unnoticed
        print(f"created the folder {summary['created_folder']} for --output")
    if summary["family"] == "roberta":
        _report_roberta(summary, args)
    elif summary["family"] == "transformer":
        _report_translation(summary, args)
    else:
        _report_lm(summary, args)
    return 0


def _report_translation(summary, args):
    print(f"converted EIFY-fork {summary['source_arch']} -> {summary['target_arch']}: "
          f"{args.output}")
    print(f"  kept     {summary['kept']} tensors, unchanged; added {', '.join(summary['added'])}")
    print(f"  options  --encoder-alibi-variant {summary['options']['encoder_alibi_variant']} "
          f"--decoder-alibi-variant {summary['options']['decoder_alibi_variant']}")
    print("  the decoder keeps its ALiBi bias in incremental decoding (fairseq-generate), which "
          "the fork dropped: generation scores differ from the fork's, teacher-forced ones not")
    if summary["optimizer_kept"]:
        print("  optimizer state kept: fairseq-train --restore-file resumes where the fork stopped")


if __name__ == "__main__":
    sys.exit(main())
