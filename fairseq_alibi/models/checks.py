"""Checks the ALiBi models run on the checkpoints they are given, shared by every model family.

fairseq checkpoints hold no dictionary and no record of the model class beyond its name, so a
checkpoint of the wrong kind only shows as missing or extra tensors deep inside
``load_state_dict``. These checks look first and say what to do instead; a checkpoint whose
options differ from the model's is refused in one style, naming the flag to fix
(:func:`check_saved_stacks`, :func:`~fairseq_alibi.modules.checkpoint_match.mismatch`). The option checks
(position-embedding flags, ``--tokens-per-sample``) are here too, for every model family.
"""

import argparse
import functools
import logging

import torch
from fairseq.utils import safe_getattr

from fairseq_alibi.config_access import (architecture_of, cfg_get, criterion_name, flag_of_key,
                                         task_name)
from fairseq_alibi.error_hints import CheckpointMismatchError, OneLineError
from fairseq_alibi.modules.checkpoint_match import check_stack, mismatch
from fairseq_alibi.options import OptionError

logger = logging.getLogger(__name__)


def reject_position_embeddings(state_dict, prefix, model_name, fix=None):
    """A clear error for checkpoints of models with position embeddings; ``fix`` says what to do
    (default: load it with its own architecture, or convert it)."""
    stale = [k for k in state_dict if k.startswith(f"{prefix}.embed_positions.")]
    if stale:
        fix = fix or ("Load it with its own architecture, or convert it with "
                      "`fairseq-alibi convert` before fine-tuning it as an ALiBi model")
        if stale == [f"{prefix}.embed_positions._float_tensor"] and fix.endswith("ALiBi model"):
            # sinusoidal: the weights of Press's ALiBi fork look exactly like this
            fix += " (a checkpoint of Press's ALiBi fork: convert it with --from press)"
        raise CheckpointMismatchError(
            f"this checkpoint has position embeddings ({stale[0]}): it was trained by a stock "
            f"model, not {model_name}. {fix}"
        )


def only_filler_symbols(symbols) -> bool:
    """Whether ``symbols`` are all fairseq's filler entries (``madeupword0000``...), which pad a
    dictionary to a multiple of 8 and never occur in text."""
    return all(symbol.startswith("madeupword") for symbol in symbols)


def reject_other_dictionary(state_dict, key, dictionary, omits_mask=False,
                            file_name="dict.txt", preprocess_flag="--srcdict"):
    """A clear error for a checkpoint trained with a dictionary of another size.

    fairseq checkpoints hold no dictionary: the task reads ``dict.txt`` from the data directory
    it is given, and a different one only shows as a size mismatch of the embedding
    ``state_dict[key]`` (``(symbols, dim)``). A dictionary of the *same* size cannot be told
    apart from the right one. ``omits_mask``: the model has no row for ``<mask>``, the last
    symbol (``--embedding-omits-mask``, EIFY's zero-clap checkpoints). ``file_name``,
    ``preprocess_flag``: the dictionary's file and fairseq-preprocess's flag for it (a
    translation side's: ``dict.<source-lang>.txt``, ``--srcdict``).
    """
    weight = state_dict.get(key)
    if dictionary is None or weight is None or weight.dim() != 2:
        return  # adaptive or character input: no single table to compare
    expected = len(dictionary) - 1 if omits_mask else len(dictionary)
    if weight.size(0) == expected:
        return
    mask_is_last = len(dictionary) > 0 and dictionary[len(dictionary) - 1] == "<mask>"
    if not omits_mask and mask_is_last and weight.size(0) == len(dictionary) - 1:
        raise CheckpointMismatchError(
            f"this checkpoint's embedding has no row for <mask> ({weight.size(0)} rows, the "
            f"dictionary {len(dictionary)} symbols with <mask> last): it is a zero-clap model "
            f"(EIFY's omit_mask); add --zero-mask-embedding --embedding-omits-mask"
        )
    mask_note = " (the task's <mask> not counted)" if omits_mask else ""
    surplus = [dictionary[i] for i in range(weight.size(0) + (0 if omits_mask else 1),
                                            len(dictionary)) if dictionary[i] != "<mask>"]
    if surplus and only_filler_symbols(surplus):
        raise CheckpointMismatchError(
            f"this checkpoint was trained without the last {len(surplus)} entries of the data "
            f"directory's dict.txt ({', '.join(surplus)}; EIFY's zero-clap Pile models): write the "
            f"matching dict.txt with `fairseq-alibi convert ... --dict DICT.txt` and "
            f"binarize with it (fairseq-preprocess --srcdict)"
        )
    raise CheckpointMismatchError(
        f"this checkpoint was trained with a dictionary of {weight.size(0)} symbols, but the "
        f"data directory's {file_name} has {expected}{mask_note}: give the data directory the "
        f"model was trained with (or one binarized with its {file_name}, fairseq-preprocess "
        f"{preprocess_flag})"
    )


def check_saved_stacks(state_dict, stacks, model_name, stock_flag=None):
    """The one check of a checkpoint's ALiBi stacks against the model being built, every family.

    ``stacks``: the state-dict prefix of each stack (``decoder``, ``encoder``) -> ``(alibi,
    flag, heads_flag)``: the built stack's bias module (``None``: the model builds stock
    positions there), the stack's flag prefix (``--alibi``, ``--encoder-alibi``: its
    ``Side.flag``) and the flag of its attention heads. ``stock_flag``: the flag that gives a
    side stock positions (``--{side}-alibi-variant none``), else the advice for a stock
    checkpoint is to convert it. Errors (:func:`~fairseq_alibi.modules.checkpoint_match.mismatch`):

    * stacks whose slopes the checkpoint lacks (a stock checkpoint lacks every side's): one error
      naming them all (learned positions get :func:`reject_position_embeddings`'s);
    * slopes saved for a side the model builds with stock positions;
    * a saved stack that differs from the built one in what its tensors show
      (:func:`~fairseq_alibi.modules.checkpoint_match.check_stack`: heads, ``--*-alibi-heads``,
      the variant, learned scales).
    """
    missing = [prefix for prefix, (alibi, _, _) in stacks.items()
               if alibi is not None and f"{prefix}.alibi.slopes" not in state_dict]
    if missing:
        for prefix in missing:
            reject_position_embeddings(state_dict, prefix, model_name)
        keys = ", ".join(f"{prefix}.alibi.slopes" for prefix in missing)
        names = [prefix.rsplit(".", 1)[-1] for prefix in missing]
        if stock_flag is None:
            fix = ("the architecture it was trained with, or convert it with "
                   "`fairseq-alibi convert`")
        else:
            flags = " ".join(stock_flag.format(side=name) for name in names)
            fix = (f"`{flags}` if {'those sides' if len(names) > 1 else 'that side'} used stock "
                   "positions, or the architecture it was trained with")
        raise mismatch(f"no ALiBi on the {' and '.join(names)} (no {keys}: a stock checkpoint, "
                       "with position embeddings?)", f"{model_name} with ALiBi there", fix)
    for prefix, (alibi, flag, heads_flag) in stacks.items():
        slopes = state_dict.get(f"{prefix}.alibi.slopes")
        if alibi is None and slopes is not None:
            raise mismatch(
                f"ALiBi on the {prefix.rsplit('.', 1)[-1]} ({prefix}.alibi.slopes, "
                f"{slopes.numel()} heads)", f"stock positions there ({flag}-variant none)",
                f"the {flag}-variant it was trained with (drop `{flag}-variant none`)")
        if alibi is not None:
            check_stack(state_dict, f"{prefix}.alibi.", alibi, flag, heads_flag)


#: a layer stack's size options, each read from one of its tensors: (option suffix, tensor
#: under the stack, dimension); the layers are counted
_SIZE_TENSORS = (("embed_dim", "layers.0.self_attn.q_proj.weight", 0),
                 ("ffn_embed_dim", "layers.0.fc1.weight", 0),
                 ("attention_heads", "alibi.slopes", 0))


def _stack_sizes(state, prefix: str) -> dict:
    layers = {key[len(prefix) + 8:].split(".", 1)[0] for key in state
              if key.startswith(f"{prefix}.layers.")}
    sizes = {"layers": len(layers)} if layers else {}
    for name, key, dim in _SIZE_TENSORS:
        tensor = state.get(f"{prefix}.{key}")
        if tensor is not None and tensor.dim() > dim:
            sizes[name] = tensor.shape[dim]
    return sizes


def started_by_hydra() -> bool:
    """Whether this run was started by ``fairseq-hydra-train``, whose options are overrides
    (``++model.decoder_layers=2``), not flags: hydra's record of its job, which
    ``fairseq-train``'s conversion of its flags to a config does not make (both build the
    models of dataclass-registered families from an OmegaConf config)."""
    try:
        from hydra.core.hydra_config import HydraConfig
    except ImportError:
        return False
    return HydraConfig.initialized()


def _spelled(key: str, value, hydra: bool) -> str:
    """Option ``key`` set to ``value`` as the run was started: ``++model.key=value`` or the
    flag (``--key value``; a switch alone: ``--key``, or ``no --key``)."""
    if hydra:
        return f"++model.{key}={str(value).lower() if isinstance(value, bool) else value}"
    if isinstance(value, bool):
        return flag_of_key(key) if value else f"no {flag_of_key(key)}"
    return f"{flag_of_key(key)} {value}"


def check_shared_layers(state_dict, stack: str, layers, key: str, hydra: bool = None):
    """A model whose ``layers`` share the first one's parameters (option ``key``, e.g.
    ``share_decoder_layers``) loading a checkpoint whose layers have their own: each layer's
    copy would land in the one shared tensor, the last one kept, silently. One line instead
    (a shared checkpoint loads into an unshared model as it is: its layers are equal).
    ``hydra``: named as overrides (default: :func:`started_by_hydra`)."""
    if len(layers) < 2 or next(layers[1].parameters(), None) is not next(
            layers[0].parameters(), None):
        return
    hydra = started_by_hydra() if hydra is None else hydra
    first = f"{stack}.layers.0."
    for name, value in state_dict.items():
        layer, _, rest = name[len(f"{stack}.layers."):].partition(".")
        if not name.startswith(f"{stack}.layers.") or layer == "0":
            continue
        twin = state_dict.get(first + rest)
        if twin is not None and twin.shape == value.shape and not torch.equal(twin, value):
            raise mismatch(
                f"layers of their own ({name} differs from layer 0's)",
                f"{_spelled(key, True, hydra)} (one layer's parameters for every layer: only "
                "the last layer's would be kept)", _spelled(key, False, hydra))


def check_saved_sizes(state_dict, built_state, stacks, hydra: bool = None):
    """:func:`~fairseq_alibi.modules.checkpoint_match.mismatch` naming every size option
    (layers, widths, heads) in which the checkpoint's stacks differ from the model being
    built, read from their tensors: ``stacks`` maps a saved prefix (``decoder``) to ``(the
    built model's prefix, side)`` (``side``: ``encoder`` or ``decoder``, the options' first
    word). Otherwise the first differing tensor alone would be named, one size per retry.
    ``hydra``: named as ``fairseq-hydra-train`` overrides (``++model.encoder_layers=2``;
    default: :func:`started_by_hydra`)."""
    differ = []
    for saved_prefix, (built_prefix, side) in stacks.items():
        saved, built = _stack_sizes(state_dict, saved_prefix), _stack_sizes(built_state,
                                                                           built_prefix)
        if saved.get("layers", 0) > built.get("layers", 0):
            # fairseq prunes --*-layers-to-keep after this hook: fewer layers built is no
            # mismatch yet (a real one fails in load_state_dict's unexpected keys)
            saved.pop("layers")
        differ += [(f"{side}_{name}", value, built[name]) for name, value in saved.items()
                   if name in built and built[name] != value]
    if not differ:
        return
    hydra = started_by_hydra() if hydra is None else hydra
    raise mismatch(", ".join(_spelled(k, s, hydra) for k, s, _ in differ),
                   ", ".join(_spelled(k, b, hydra) for k, _, b in differ),
                   " ".join(_spelled(k, s, hydra) for k, s, _ in differ))


def vocabulary_size(weights: dict) -> int:
    """Rows of the input embedding (summed over the bands of an adaptive input)."""
    if "decoder.embed_tokens.weight" in weights:
        return int(weights["decoder.embed_tokens.weight"].shape[0])
    bands = [v for k, v in weights.items()
             if k.startswith("decoder.embed_tokens.embeddings.") and k.endswith(".0.weight")]
    if bands:
        return int(sum(v.shape[0] for v in bands))
    raise ValueError(
        "no input embedding found (decoder.embed_tokens.*): is this a transformer_lm checkpoint?"
    )


class _RefusedFlag(argparse.Action):
    """A command-line flag that cannot work with this model: using it is a one-line error."""

    def __init__(self, option_strings, dest, reason, **kwargs):
        kwargs.update(nargs=0, default=argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.reason = reason

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"argument {option_string}: {self.reason}")


def is_refused_flag(action: argparse.Action) -> bool:
    """Whether a parser's ``action`` is a refusal (:class:`_RefusedFlag`), no option of the
    model: what reads a model's flags from its parser skips it."""
    return isinstance(action, _RefusedFlag)


#: the stock options asking for position embeddings, by the ALiBi model that builds none:
#: option -> the option choosing that side's variant (None: that side is always ALiBi; the
#: variant's ``none`` builds stock positions). Refused where a run is started: the command line
#: (argparse, :func:`refuse_position_embedding_flags`, or the model's option checks) and a hydra
#: training config (:func:`refuse_position_embedding_options`). A *saved* configuration with
#: such a field still loads (the stock ``transformer_lm_gpt3_*`` architectures set
#: ``decoder_learned_pos``, converted checkpoints keep it): the ALiBi model never reads it.
POSITION_EMBEDDING_OPTIONS = {
    "alibi_transformer_lm": {"decoder_learned_pos": None},
    "alibi_transformer": {"encoder_learned_pos": "encoder_alibi_variant",
                          "decoder_learned_pos": "decoder_alibi_variant"},
}


def refuse_position_embedding_flags(parser, model_name, flags=None):
    """Make the stock flags that ask for position embeddings an error on ``model_name``'s parser
    (default: those of :data:`POSITION_EMBEDDING_OPTIONS`).

    The ALiBi models build no position embeddings, so fairseq would accept and ignore them. Only
    the command line is refused here (see :data:`POSITION_EMBEDDING_OPTIONS` for saved ones).
    """
    if flags is None:
        flags = tuple(flag_of_key(option) for option in POSITION_EMBEDDING_OPTIONS[model_name])
    for action in list(parser._actions):
        given = [flag for flag in flags if flag in action.option_strings]
        if not given:
            continue
        options = list(action.option_strings)  # the next line empties the action's list
        parser._handle_conflict_resolve(None, [(flag, action) for flag in options])
        parser.add_argument(
            *options, dest=action.dest, action=_RefusedFlag, help=argparse.SUPPRESS,
            reason=f"{model_name} has no position embeddings (the ALiBi bias replaces them); "
                   f"drop {given[0]}, or train a stock model for learned positions",
        )


#: EIFY's fork's options (as flags), by the model that replaces the fork's, and their
#: counterparts here (docs/migrating.md): each is refused in one line naming it, as a flag
#: (:func:`refuse_fork_flags`), a config's key or a load-time override
#: (``override_keys.refuse_fork_keys``)
FORK_FLAGS = {
    "alibi_transformer_lm": {"--decoder-alibi": "none: alibi_transformer_lm is ALiBi already"},
    "alibi_roberta": {
        "--encoder-alibi": "--alibi-variant symmetric (with the fork's "
                           "--encoder-alibi-asymmetrical: --alibi-variant offset)",
        "--encoder-alibi-asymmetrical": "--alibi-variant offset",
        "--contrastive-pretraining": "--mlm-head clap",
        "--initial-beta": "--clap-initial-beta",
        "--l2norm-embedding": "--clap-no-normalize where the fork's is false",
        "--zero-masking": "--zero-mask-embedding (with the fork's --omit-mask: "
                          "--embedding-omits-mask too)",
        "--omit-mask": "--embedding-omits-mask, with --zero-mask-embedding",
    },
    "alibi_transformer": {
        "--encoder-alibi": "--encoder-alibi-variant symmetric (with the fork's "
                           "--encoder-alibi-asymmetrical: --encoder-alibi-variant offset)",
        "--encoder-alibi-asymmetrical": "--encoder-alibi-variant offset",
        "--decoder-alibi": "--decoder-alibi-variant causal",
    },
}


def refuse_fork_flags(parser, model_name):
    """Make the EIFY fork's flags (:data:`FORK_FLAGS`) a one-line error naming their
    counterparts on ``model_name``'s parser, where argparse would only say "unrecognized
    arguments" (a flag another part of fairseq declared first is left to it, and so is the
    fork's task flag where a registered task declares it: tasks add their flags after the
    model's, and a second declaration would be argparse's conflict)."""
    taken = {flag for action in parser._actions for flag in action.option_strings}
    for flag, counterpart in FORK_FLAGS.get(model_name, {}).items():
        option = flag[2:].replace("-", "_")
        if flag not in taken and not (option in FORK_TASK_OPTIONS and _task_declares(option)):
            parser.add_argument(flag, action=_RefusedFlag, help=argparse.SUPPRESS,
                                reason=f"a flag of EIFY's ALiBi fork; here: {counterpart} "
                                       "(docs/migrating.md)")


@functools.lru_cache(maxsize=None)
def _task_declares(option: str) -> bool:
    """Whether a registered task (stock or a ``--user-dir``'s) declares ``option``: a field of
    its dataclass, or a flag its legacy ``add_args`` adds to a scratch parser."""
    from fairseq.tasks import TASK_DATACLASS_REGISTRY, TASK_REGISTRY

    if any(option in getattr(dc, "__dataclass_fields__", {})
           for dc in TASK_DATACLASS_REGISTRY.values()):
        return True
    flag = flag_of_key(option)
    for name, task in TASK_REGISTRY.items():
        if name in TASK_DATACLASS_REGISTRY:
            continue
        scratch = argparse.ArgumentParser(add_help=False, conflict_handler="resolve")
        try:
            task.add_args(scratch)
        except Exception:  # a task whose flags cannot be read here: assume it might declare it
            return True
        if flag in scratch._option_string_actions:
            return True
    return False


def refuse_position_embedding_options(model_cfg):
    """The hydra counterpart of :func:`refuse_position_embedding_flags`: a one-line error when
    the model config of a training run (``model:`` of a ``fairseq-hydra-train`` config, with its
    overrides) asks an ALiBi model for position embeddings; configs of other models pass.

    fairseq-hydra-train fills the model's defaults from its dataclass, so the architecture
    functions that set ``decoder_learned_pos`` (``*_gpt3_*``) never do there: a true value was
    asked for. Called by the shipped configs' hydra callback (:mod:`fairseq_alibi.hydra_support`)
    before the job starts, never on a checkpoint's saved configuration.
    """
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    arch = architecture_of(model_cfg)
    model = ARCH_MODEL_NAME_REGISTRY.get(arch, arch) if isinstance(arch, str) else None
    for option, variant_option in POSITION_EMBEDDING_OPTIONS.get(model, {}).items():
        value = cfg_get(model_cfg, option)
        if not value:
            continue
        value = "true" if value is True else value  # as a hydra config spells it
        if variant_option is None:
            raise ValueError(
                f"model.{option}={value}: {model} has no position embeddings (the ALiBi bias "
                f"replaces them); drop {option} from the model config, or train a stock model "
                f"for learned positions"
            )
        if cfg_get(model_cfg, variant_option) != "none":  # absent: the default, ALiBi
            side = option.split("_")[0]
            raise ValueError(
                f"model.{option}={value} asks for learned position embeddings, which ALiBi "
                f"replaces on {model}'s {side}: drop {option} from the model config, or set "
                f"model.{variant_option}=none for stock positions"
            )


#: fairseq's tasks whose sample is one example, its sentences joined by ``</s>`` (``<s> A </s>
#: </s> B </s>``), read by a classification head at ``<s>``: not packed text
EXAMPLE_TASKS = ("sentence_prediction", "sentence_ranking", "sentence_prediction_adapters")


#: (mode, --sample-break-mode) whose samples hold no boundary of the mode: why
NOTHING_TO_MASK = {
    ("eos", "eos"): "every sample is one line, so one document",
    ("doc", "eos"): "every sample is one line, so one document",
    ("doc", "complete_doc"): "complete_doc never puts two documents in one sample, so doc "
                             "finds no boundary (eos would keep each line of a sample apart)",
}


#: tasks whose samples are one pair of lines, each side's with one ``</s>``
PAIR_TASKS = ("translation",)


def _has_empty_line(task_cfg) -> bool:
    """Whether the train split of the task's data (its first shard) holds an empty line, the
    boundary of ``doc``: a line of ``</s>`` alone, read from the index's sizes (no token is
    read); True where there is no such split to read (an evaluation folder, other data)."""
    import os

    from fairseq.data import data_utils

    data = cfg_get(task_cfg, "data", None)
    if not isinstance(data, str) or not data:
        return True
    try:
        split = data_utils.load_indexed_dataset(
            os.path.join(data.split(os.pathsep)[0], "train"), None)
    except Exception:  # noqa: BLE001 - a note must never stop a run
        return True
    return split is None or len(split.sizes) == 0 or bool((split.sizes == 1).any())


def check_document_mask(stack, task, flag="--alibi-document-mask"):
    """A one-line error where a document mask (``stack``: the side's ``StackOptions``) would cut
    one example apart (:data:`EXAMPLE_TASKS`: both modes split ``</s> </s>``, so ``<s>`` would
    never see the second sentence); a log line where it changes nothing
    (:data:`NOTHING_TO_MASK`: with ``--sample-break-mode eos`` each sample is one line, and
    ``complete_doc`` never joins two documents, and a translation pair's lines hold one ``</s>``
    each; a note, not an error: the samples are already documents). And on ``masked_lm``: the
    boundaries are read from the masked input, so a ``</s>`` that the masking replaced hides
    its boundary unless the criterion is ``masked_lm_documents``, which puts it back (the model
    is built before the criterion: the run's config names it, :func:`criterion_name`)."""
    mode = str(getattr(stack, "document_mask", "none"))
    task_cfg = getattr(task, "cfg", None) or getattr(task, "args", None)
    name = task_name(task)
    if mode != "none" and name in EXAMPLE_TASKS:
        raise OptionError(
            f"{flag} {mode} with --task {name}: a sample is one example whose sentences are "
            "joined by </s>, so the mask would hide the second sentence from the classification "
            f"token; fine-tune without it (drop {flag}: --restore-file reads the pretrained "
            "weights only); a model saved with it loads with --model-overrides "
            "\"{'alibi_document_mask': 'none'}\"")
    if mode != "none" and name in PAIR_TASKS:
        logger.warning(f"{flag} {mode} with --task {name}: each side of a pair is one line "
                       "with one </s>, so one document; the mask changes nothing unless a "
                       "line joins documents with </s> (doc: two in a row)")
    breaks = str(cfg_get(task_cfg, "sample_break_mode", ""))
    if (mode, breaks) in NOTHING_TO_MASK:
        logger.warning(f"{flag} {mode} with --sample-break-mode {breaks}: "
                       f"{NOTHING_TO_MASK[mode, breaks]}; the mask changes nothing (packed "
                       "batches: --sample-break-mode none or complete)")
    elif mode == "doc" and name not in PAIR_TASKS and not _has_empty_line(task_cfg):
        logger.warning(f"{flag} doc: the train split of {cfg_get(task_cfg, 'data')} holds no "
                       "empty line (an </s> right after an </s>), so no document boundary: the "
                       "mask changes nothing; write the data with an empty line between "
                       "documents (fairseq-alibi corpus, the wikitext and pile pipelines: "
                       "--document-breaks), or give eos to split at every line end")
    criterion = criterion_name(task)
    if mode != "none" and cfg_get(task_cfg, "mask_prob", None) and \
            criterion != "masked_lm_documents":
        logger.warning(f"{flag} {mode} on a masked LM: the documents are found in the model's "
                       f"input, where --criterion {criterion or 'masked_lm'} leaves a </s> "
                       "replaced by the masking (--mask-prob), so attention crosses that "
                       "boundary; --criterion masked_lm_documents keeps every </s> in the input "
                       "(and out of the targets)")


def check_tokens_per_sample(args):
    """A clear error for ``--tokens-per-sample`` below 1, which fairseq divides by later."""
    value = safe_getattr(args, "tokens_per_sample", None)
    if isinstance(value, int) and value < 1:
        raise OptionError(  # its one line, without the traceback
            f"--tokens-per-sample must be at least 1 (the tokens in one training block), got "
            f"{value}; ALiBi models train at any length, e.g. --tokens-per-sample 512"
        )


def refuse_translation_task(task, model_name: str, what: str = "a language model: it reads "
                            "no source sentence", use: str = "--task language_modeling"):
    """A language model or an encoder (``what`` it is, and the task to ``use`` it with) built
    for a task of sentence pairs (fairseq-generate or fairseq-interactive of a translation
    folder given its checkpoint): it would translate nothing, silently, or fail on the
    folder's dictionaries: refused."""
    if hasattr(task, "src_dict") and hasattr(task, "tgt_dict"):
        name = getattr(getattr(task, "cfg", None), "_name", None) or type(task).__name__
        raise OptionError(
            f"{model_name} is {what}, and the task {name} reads sentence pairs. Translate with "
            f"an encoder-decoder model (--arch alibi_transformer, or its checkpoint as --path), "
            f"or use the {model_name} model with {use}")


def check_global_tokens(stack, args, task):
    """A clear error for ``--alibi-global-tokens`` covering a whole training block (the model's
    ``--tokens-per-sample``, else the task's longest input: a GLUE task's ``--max-positions``,
    a hydra config's ``task.tokens_per_sample``): every position would be exempt from the
    bias, which would vanish, silently."""
    tokens = safe_getattr(args, "tokens_per_sample", None)
    what = "--tokens-per-sample"
    if not isinstance(tokens, int):
        tokens, what = task.max_positions(), "the task's longest input"
    if stack.uses_alibi and isinstance(tokens, int) and 0 < tokens <= stack.global_tokens:
        raise OptionError(
            f"--alibi-global-tokens {stack.global_tokens} exempts every position of a block of "
            f"{tokens} tokens ({what}) from the bias, which would vanish: give fewer (1: the "
            "<s> that the classification head reads)")


def check_attention_heads(args, *sides: str):
    """Clear errors for a head count the attention cannot split its width into, per layer stack
    ``sides`` (``"encoder"``, ``"decoder"``): below 1 (the slopes are per head) or not dividing
    the stack's embedding width (fairseq asserts it deep in the layer's construction)."""
    for side in sides:
        heads = safe_getattr(args, f"{side}_attention_heads", None)
        width = safe_getattr(args, f"{side}_embed_dim", None)
        flag = f"--{side}-attention-heads"
        if heads is None:
            continue
        if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
            raise OptionError(f"{flag} must be a positive whole number (ALiBi gives each head "
                              f"its slope), got {heads!r}")
        if isinstance(width, int) and width % heads:
            raise OptionError(
                f"--{side}-embed-dim {width} is not divisible by {flag} {heads}: each head gets "
                f"an equal share of the width; choose a head count that divides {width}")


#: options of EIFY's ALiBi fork that change what a model computes, as its configs save them
FORK_MODEL_OPTIONS = ("encoder_alibi", "decoder_alibi", "contrastive_pretraining", "zero_masking")
#: the task option of EIFY's fork that stock tasks lack (a checkpoint saved with it, even with
#: every option above off, fails in fairseq's task setup)
FORK_TASK_OPTIONS = ("omit_mask",)
#: the fork's architecture names that stock fairseq lacks (its causal ALiBi LM): the stock
#: model each is registered under, and the package's architecture it converts to
FORK_ARCHITECTURES = {"transformer_lm_alibi": ("transformer_lm", "alibi_transformer_lm")}


def unconverted_fork_error(cfg, arch) -> ValueError:
    options = [k for k in FORK_MODEL_OPTIONS if cfg_get(cfg, k)]
    what = ", ".join(f"{k}=True" for k in options) or f"the architecture {arch}"
    return ValueError(
        f"this checkpoint was trained with EIFY's ALiBi fork ({what} in its model config), which "
        f"stock {arch!r} does not compute: convert it first with `fairseq-alibi "
        f"convert --input CHECKPOINT --output CONVERTED.pt` (docs/migrating.md), "
        f"then load the converted file"
    )


def fork_architecture_error(cfg, arch) -> ValueError:
    """The refusal of EIFY's own architecture name: a checkpoint with the fork's options is
    converted first; without them it may as well be a new run given the fork's ``--arch``."""
    if any(cfg_get(cfg, k) for k in FORK_MODEL_OPTIONS):
        return unconverted_fork_error(cfg, arch)
    return OneLineError(
        f"--arch {arch} is the architecture of EIFY's ALiBi fork, which stock fairseq does not "
        f"have: train a new model with --arch {FORK_ARCHITECTURES[arch][1]} (the fork's "
        f"options: docs/migrating.md); a checkpoint of that fork is converted first with "
        f"`fairseq-alibi convert --input CHECKPOINT --output CONVERTED.pt`")


#: what only Press's ALiBi fork writes into a ``transformer_lm`` model config: its decoder sizes
#: the bias by ``max_tokens`` (``alibi.repeat(max_tokens // tokens_per_sample, ...)``), so the
#: fork's ALiBi commit (ofirpress/attention_with_linear_biases 3b7c2ec) added
#: ``max_tokens: int = II("task.max_tokens")`` to ``TransformerLanguageModelConfig``; stock
#: fairseq's config never had that field (its history up to the fork, and 0.12)
PRESS_MODEL_KEY = "max_tokens"
#: the command that turns a Press-fork checkpoint into this plugin's model
PRESS_CONVERT = ("fairseq-alibi convert --from press --input CHECKPOINT "
                 "--output CONVERTED.pt")


def is_unconverted_press_config(model_cfg) -> bool:
    """Whether a checkpoint's saved model config is that of Press's ALiBi fork: a
    ``transformer_lm`` architecture with ``max_tokens`` among its keys.

    Only a saved, structured config counts (a ``dict`` or an OmegaConf node, as fairseq saves
    ``cfg['model']``): an ``argparse.Namespace`` holds every command-line option, the dataset's
    ``--max-tokens`` included, and fairseq turns the ``args`` of older checkpoints into a model
    config of the dataclass's fields only.
    """
    import argparse

    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    if model_cfg is None or isinstance(model_cfg, argparse.Namespace) or not hasattr(
            model_cfg, "keys"):
        return False
    arch = architecture_of(model_cfg)
    try:
        keys = set(model_cfg.keys())
    except Exception:  # noqa: BLE001 - an unusual config object: nothing to check
        return False
    return ARCH_MODEL_NAME_REGISTRY.get(arch) == "transformer_lm" and PRESS_MODEL_KEY in keys


def unconverted_press_error(arch, checkpoint=None) -> ValueError:
    which = f"{checkpoint} was" if checkpoint else "this checkpoint was"
    return ValueError(
        f"{which} trained with Press's ALiBi fork ({PRESS_MODEL_KEY} in its model config, which "
        f"only that fork writes): stock {arch!r} would add sinusoidal positions and no ALiBi "
        f"bias, computing something else. Convert it first with `{PRESS_CONVERT}` "
        f"(docs/migrating.md), then load the converted file"
    )


def refuse_unconverted_press_checkpoint(state, checkpoint=None):
    """The Press-fork error for a loaded checkpoint (``load_checkpoint_to_cpu``) whose saved
    model config is the fork's; anything else passes."""
    cfg = state.get("cfg") if isinstance(state, dict) else None
    model_cfg = cfg_get(cfg, "model") if cfg is not None else None
    if is_unconverted_press_config(model_cfg):
        raise unconverted_press_error(cfg_get(model_cfg, "_name"), checkpoint)


