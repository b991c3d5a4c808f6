"""Exact moves between fairseq ALiBi language models and Hugging Face's BLOOM and MPT.

::

    fairseq-alibi export-hf CKPT --dict D [--bpe gpt2 --gpt2-encoder-json J --gpt2-vocab-bpe B
                                           | --bpe sentencepiece --sentencepiece-model M
                                           | --bpe hf_tokenizer [--hf-tokenizer T]
                                           | --bpe none] --out DIR
    fairseq-alibi import-hf DIR --out CKPT_DIR

``BloomForCausalLM`` is ``alibi_transformer_lm`` with the options of :func:`bloom_options` (the
``alibi_bloom`` architectures); ``MptForCausalLM`` is the same model with erf GELU, no embedding
layer norm and every bias zero. :func:`layout` is the one table of which tensor goes where, read
in both directions. docs/huggingface.md has the mapping, the measured equalities and the way out
for models that do not map (distillation into ``alibi_bloom``).

Rows: an exported model's row ``i`` is fairseq's index ``i`` (the tokenizer is remapped to the
dictionary); an imported model's rows are permuted so that fairseq's ``<s> <pad> </s> <unk>`` are
rows 0-3 (a bijection, so the softmax is the same), and the permutation is kept in the
checkpoint, so exporting an import gives back the original rows bit for bit.

transformers, tokenizers and safetensors are imported here only (``pip install
'fairseq-alibi[hf]'``).
"""

import argparse
import json
import logging
import math
import shutil
import sys
import warnings
from pathlib import Path
from typing import Optional

import torch

from fairseq_alibi.cli.checkpoint_io import (
    ConversionError,
    atomic_folder,
    model_config,
    read_checkpoint,
    write_atomically,
)
from fairseq_alibi.config_access import architecture_of, cfg_get, flag_of_key

FAMILIES = ("bloom", "mpt")
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # fairseq's rows 0-3
EXTRA_KEY = "huggingface"  # extra_state entry of an imported checkpoint
LAYOUT_FILE = "huggingface.json"  # the same, beside an import's tokenizer.json


def import_transformers():
    """transformers, imported on first use, or a one-line error naming the extra."""
    if "torchaudio" not in sys.modules:
        # fairseq pulls in a torchaudio that may be built for another torch; transformers
        # imports it whenever it is installed, so a broken one is hidden from it
        try:
            import torchaudio  # noqa: F401
        except Exception:  # noqa: BLE001 - any failure means "not usable"
            sys.modules["torchaudio"] = None
    try:
        import transformers
    except ImportError as e:
        raise ConversionError("Hugging Face export/import needs transformers: "
                              "pip install 'fairseq-alibi[hf]'") from e
    if sys.modules.get("torchaudio", False) is None:  # transformers imported before us
        from transformers.utils import import_utils

        for check in (import_utils.is_torchaudio_available, import_utils._is_package_available):
            getattr(check, "cache_clear", lambda: None)()
    transformers.logging.set_verbosity_error()
    return transformers


# ---------------------------------------------------------------------------------------------
# the weights: one table, read both ways


def layout(family: str, layers: int):
    """``[(hf_name, fairseq_names, how)]``: ``how`` is ``copy`` (one tensor), ``bloom_qkv``
    (BLOOM's fused projection, per head ``[q, k, v]``) or ``mpt_qkv`` (MPT's, ``[q; k; v]``)."""
    if family == "bloom":
        top, block = "transformer.", "transformer.h.{}."
        names = {"embed": "word_embeddings", "final": "ln_f", "ln1": "input_layernorm",
                 "qkv": "self_attention.query_key_value", "out": "self_attention.dense",
                 "ln2": "post_attention_layernorm", "fc1": "mlp.dense_h_to_4h",
                 "fc2": "mlp.dense_4h_to_h"}
    else:
        top, block = "transformer.", "transformer.blocks.{}."
        names = {"embed": "wte", "final": "norm_f", "ln1": "norm_1", "qkv": "attn.Wqkv",
                 "out": "attn.out_proj", "ln2": "norm_2", "fc1": "ffn.up_proj",
                 "fc2": "ffn.down_proj"}
    params = ("weight", "bias") if family == "bloom" else ("weight",)
    rows = [(top + names["embed"] + ".weight", ["decoder.embed_tokens.weight"], "copy")]
    if family == "bloom":
        rows += [(f"{top}word_embeddings_layernorm.{p}", [f"decoder.layernorm_embedding.{p}"],
                  "copy") for p in params]
    for i in range(layers):
        hf, fs = block.format(i), f"decoder.layers.{i}."
        for p in params:
            rows += [
                (hf + names["ln1"] + f".{p}", [fs + f"self_attn_layer_norm.{p}"], "copy"),
                (hf + names["qkv"] + f".{p}", [fs + f"self_attn.{x}_proj.{p}" for x in "qkv"],
                 f"{family}_qkv"),
                (hf + names["out"] + f".{p}", [fs + f"self_attn.out_proj.{p}"], "copy"),
                (hf + names["ln2"] + f".{p}", [fs + f"final_layer_norm.{p}"], "copy"),
                (hf + names["fc1"] + f".{p}", [fs + f"fc1.{p}"], "copy"),
                (hf + names["fc2"] + f".{p}", [fs + f"fc2.{p}"], "copy"),
            ]
    rows += [(f"{top}{names['final']}.{p}", [f"decoder.layer_norm.{p}"], "copy") for p in params]
    return rows


def fuse(parts, how, heads):
    if how == "copy":
        return parts[0]
    if how == "mpt_qkv":
        return torch.cat(parts, 0)
    q = parts[0]  # bloom_qkv: (H, 3, head_dim, ...) flattened
    return torch.stack([p.reshape(heads, -1, *q.shape[1:]) for p in parts], 1).reshape(
        3 * q.shape[0], *q.shape[1:])


def split(tensor, how, heads):
    if how == "copy":
        return [tensor]
    if how == "mpt_qkv":
        return list(tensor.chunk(3, 0))
    d = tensor.shape[0] // 3
    per_head = tensor.reshape(heads, 3, d // heads, *tensor.shape[1:])
    return [per_head[:, j].reshape(d, *tensor.shape[1:]) for j in range(3)]


def zero_biases(family, layers):
    """The fairseq biases MPT does not have (they must be zero to export, are zero on import)."""
    if family != "mpt":
        return []
    names = ["decoder.layer_norm.bias"]
    for i in range(layers):
        names += [f"decoder.layers.{i}.{m}.bias" for m in (
            "self_attn_layer_norm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
            "self_attn.out_proj", "final_layer_norm", "fc1", "fc2")]
    return names


# ---------------------------------------------------------------------------------------------
# which fairseq configurations are BLOOM or MPT


def _default(key: str):
    """The declared default of the LM option ``alibi_<name>`` (``key``): what a configuration
    that lacks it means, and the value that leaves a run-time option off."""
    from fairseq_alibi import options

    return options.default_of(key[len("alibi_"):], options.LM)


def _option(model_cfg, key):
    """``key`` as saved; an ALiBi option the checkpoint lacks (saved before it existed, or by
    ``fairseq-alibi convert``) as its declared default, which is how the model loads it."""
    value = cfg_get(model_cfg, key)
    if value is None and key.startswith("alibi_"):
        value = _default(key)
    return str(value) if hasattr(value, "name") else value  # enums saved by hydra


def blocking_options(model_cfg, family: str) -> list:
    """``["--flag value (needs X)", ...]``: what keeps this configuration from being ``family``."""
    from fairseq_alibi.models.alibi_transformer_lm import bloom_options

    dim = cfg_get(model_cfg, "decoder_embed_dim")
    wanted = bloom_options(dim)
    wanted.pop("no_scale_embedding")  # a scale is folded into the weights (tied: exact)
    if family == "mpt":
        wanted.update(layernorm_embedding=False, activation_fn="gelu")
    wanted.update(alibi_slope_scale=1.0, decoder_layers_to_keep=None)
    if _option(model_cfg, "alibi_heads") == cfg_get(model_cfg, "decoder_attention_heads"):
        wanted.pop("alibi_heads")  # every head named: the same as none named
    blocked = []
    for key, value in wanted.items():
        given = _option(model_cfg, key)
        if key in ("decoder_input_dim", "decoder_output_dim") and given is None:
            continue
        if given != value and str(given) != str(value) and not (given in (None, False, 0, "none")
                                                                and value in (None, False, 0)):
            needs = f"it dropped: {DROPPED.get(key, 'BLOOM and MPT have no such option')}" \
                if value is None else value
            blocked.append(f"{flag_of_key(key)} {given} (needs {needs})")
    return blocked


#: why an option the export needs dropped cannot be given (what the other layout lacks)
DROPPED = {
    "alibi_heads": "every head has a slope there",
    "adaptive_softmax_cutoff": "one output layer over the whole vocabulary there",
    "decoder_layers_to_keep": "every layer is exported",
}


def refuse_unless_alibi_lm(state):
    model_cfg = model_config(state)
    arch = architecture_of(model_cfg)
    from fairseq.models import ARCH_MODEL_REGISTRY

    import fairseq_alibi  # noqa: F401  (the architectures)

    model = ARCH_MODEL_REGISTRY.get(arch)
    name = getattr(model, "__name__", str(arch))
    if name != "AlibiTransformerLanguageModel":
        what = {"AlibiRobertaModel": "an ALiBi encoder",
                "AlibiTransformerModel": "an ALiBi encoder-decoder (translation) model"}.get(
            name, f"{arch!r}, not an ALiBi language model")
        raise ConversionError(
            f"cannot export {what}: no core transformers class holds it (only causal ALiBi "
            "language models map, to BLOOM or MPT, without remote code)")
    return model_cfg


def export_family(model_cfg, weights) -> str:
    """``bloom`` or ``mpt``, or one line naming every option that blocks both."""
    bloom = blocking_options(model_cfg, "bloom")
    if not bloom:
        return "bloom"
    mpt = blocking_options(model_cfg, "mpt")
    layers = cfg_get(model_cfg, "decoder_layers")
    if not mpt:
        nonzero = [k for k in zero_biases("mpt", layers) if weights[k].abs().max() != 0]
        if not nonzero:
            return "mpt"
        mpt = [f"non-zero biases ({nonzero[0]}, ...)"]
    if str(architecture_of(model_cfg) or "").startswith("alibi_bloom"):
        fix = "train it with --arch alibi_bloom without them (at --alibi-slope-scale 1)"
    else:
        fix = ("distil it into --arch alibi_bloom with --criterion lm_distillation "
               "(docs/huggingface.md), then export the student")
    raise ConversionError(
        "this model is not BLOOM (" + "; ".join(bloom) + ") nor MPT (" + "; ".join(mpt) + "): "
        + fix)


# ---------------------------------------------------------------------------------------------
# export

#: the run-time options (of the LM's stack) BLOOM and MPT have no counterpart of
RUN_TIME_ONLY = ("document_mask", "window_cutoff", "window_sinks")


def run_time_only(model_cfg) -> dict:
    """The options of ``model_cfg`` that are on and that the exported model cannot carry
    (:data:`RUN_TIME_ONLY`): ``{key: value}``."""
    found = {}
    for key in (f"alibi_{name}" for name in RUN_TIME_ONLY):
        value, off = _option(model_cfg, key), _default(key)
        if value is not None and value != off and str(value) != str(off):
            found[key] = value
    return found


#: the key of an exported ``config.json`` that records the run-time options the export left
#: out (:func:`run_time_only`, ``{key: value}``), which an import of the folder names
RUN_TIME_KEY = "fairseq_alibi_run_time_options"


def recorded_run_time_options(found: dict) -> dict:
    """``found`` (:func:`run_time_only`) as JSON values: numbers as they are, others as
    their names (a document mask's)."""
    return {k: v if isinstance(v, (bool, int, float)) else str(v) for k, v in found.items()}


def run_time_note(found: dict) -> str:
    """The line that says what the export of a model with ``found`` (:func:`run_time_only`)
    computes: the model with them off, which ``--model-overrides`` gives here too."""
    flags = ", ".join(f"{flag_of_key(k)} {v}" for k, v in found.items())
    off = ", ".join(f"'{k}': {_default(k)!r}" for k in found)
    return (f"note: BLOOM and MPT have no {flags}: the export computes this model without "
            f"{'it' if len(found) == 1 else 'them'} (every key of the input, across documents), "
            f"as it computes here loaded with --model-overrides \"{{{off}}}\" (they are "
            "load-time options: the weights are the same)")


def hf_config(family, model_cfg, vocab_size, dictionary):
    transformers = import_transformers()
    dim = cfg_get(model_cfg, "decoder_embed_dim")
    heads = cfg_get(model_cfg, "decoder_attention_heads")
    layers = cfg_get(model_cfg, "decoder_layers")
    ids = dict(bos_token_id=dictionary.bos(), eos_token_id=dictionary.eos(),
               pad_token_id=dictionary.pad())
    if family == "bloom":
        return transformers.BloomConfig(
            vocab_size=vocab_size, hidden_size=dim, n_layer=layers, n_head=heads,
            layer_norm_epsilon=1e-5, hidden_dropout=float(cfg_get(model_cfg, "dropout", 0)),
            attention_dropout=float(cfg_get(model_cfg, "attention_dropout", 0)),
            tie_word_embeddings=True, **ids)
    return transformers.MptConfig(
        vocab_size=vocab_size, d_model=dim, n_layers=layers, n_heads=heads, expansion_ratio=4,
        max_seq_len=int(cfg_get(model_cfg, "tokens_per_sample", 2048) or 2048),
        layer_norm_epsilon=1e-5, no_bias=True, tie_word_embeddings=True,
        attn_config={"alibi": True, "alibi_bias_max": 8}, **ids)


def exported_weights(family, weights, layers, heads, rows=None, embed_scale=1.0):
    """HF state dict from fairseq weights; ``rows``: HF row of each fairseq row (imports)."""
    out = {}
    for hf_name, fs_names, how in layout(family, layers):
        out[hf_name] = fuse([weights[n] for n in fs_names], how, heads).contiguous()
    embed = next(n for n, f, _ in layout(family, layers) if f == ["decoder.embed_tokens.weight"])
    if rows is not None:
        table = torch.empty_like(out[embed])
        table[torch.as_tensor(rows)] = out[embed]
        out[embed] = table
    if embed_scale != 1.0:  # fold sqrt(d): the tied output layer sees E·s, so ln_f is divided by s
        out[embed] = out[embed] * embed_scale
        for name in [n for n, f, _ in layout(family, layers)
                     if f[0].startswith("decoder.layer_norm")]:
            out[name] = out[name] / embed_scale
    return out


def export_checkpoint(ckpt, dict_path, out, bpe="gpt2", bpe_files=None):
    """Write ``config.json``, ``model.safetensors`` and the tokenizer of a fairseq ALiBi LM to
    ``out`` (atomically); return a summary."""
    from safetensors.torch import save_file

    state = read_checkpoint(ckpt)
    model_cfg = refuse_unless_alibi_lm(state)
    weights = state["model"]
    family = export_family(model_cfg, weights)
    layers = cfg_get(model_cfg, "decoder_layers")
    heads = cfg_get(model_cfg, "decoder_attention_heads")
    dim = cfg_get(model_cfg, "decoder_embed_dim")
    dictionary = load_dictionary(dict_path)
    vocab = weights["decoder.embed_tokens.weight"].shape[0]
    if len(dictionary) != vocab:
        raise ConversionError(f"{dict_path} has {len(dictionary)} symbols with fairseq's "
                              f"specials, the model {vocab} rows: give the training dict.txt")
    check_press_slopes(weights, heads)
    files, ckpt_dir = bpe_files or {}, Path(ckpt).parent
    imported = imported_layout(state, bpe, files, ckpt_dir)
    if imported:
        check_import_files(imported, dictionary, dict_path, hf_tokenizer_path(files, ckpt_dir),
                           ckpt_dir, EXTRA_KEY not in (state.get("extra_state") or {}))
    rows = imported["rows"] if imported else None
    scale = 1.0 if cfg_get(model_cfg, "no_scale_embedding", False) else math.sqrt(dim)
    hf_weights = exported_weights(family, weights, layers, heads, rows, scale)
    transformers = import_transformers()
    if imported:
        config = getattr(transformers, imported["config_class"]).from_dict(imported["config"])
    else:
        config = hf_config(family, model_cfg, vocab, dictionary)
    tokenizer = export_tokenizer(bpe, files, dictionary, ckpt_dir)
    found = run_time_only(model_cfg)
    if found:  # transformers keeps a key it does not know, and writes it back
        setattr(config, RUN_TIME_KEY, recorded_run_time_options(found))
    elif hasattr(config, RUN_TIME_KEY):  # an earlier export's record, of options now off
        delattr(config, RUN_TIME_KEY)
    with atomic_folder(out) as tmp:
        config.architectures = [type_name(family)]
        config.save_pretrained(tmp)
        save_file(hf_weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        write_tokenizer(tmp, tokenizer, dictionary if not imported else None)
    return {"family": family, "tensors": len(hf_weights), "vocab": vocab, "layers": layers,
            "heads": heads, "out": str(out), "run_time_only": found}


def imported_layout(state, bpe, files, ckpt_dir):
    """The rows and config of an imported model: in its checkpoint, or (a model fine-tuned from
    the import, whose checkpoint fairseq-train wrote) beside the imported tokenizer.json."""
    found = (state.get("extra_state") or {}).get(EXTRA_KEY)
    if found is None and bpe == "hf_tokenizer":
        tokenizer = hf_tokenizer_path(files, ckpt_dir)
        found = import_record(tokenizer.parent, f"import the model again to rewrite {LAYOUT_FILE}")
        if found is None:  # without the row order, the rows would not be the tokenizer's ids
            raise ConversionError(
                f"no {LAYOUT_FILE} beside --hf-tokenizer {tokenizer}: --bpe hf_tokenizer exports "
                "a model import-hf wrote (or one fine-tuned from it); give the tokenizer.json "
                f"import-hf wrote, with its {LAYOUT_FILE}")
    if found is not None and bpe != "hf_tokenizer":
        raise ConversionError("this model was imported from Hugging Face: export it with its own "
                              "tokenizer, --bpe hf_tokenizer")
    return found


def hf_tokenizer_path(files, ckpt_dir) -> Path:
    return Path(files.get("hf_tokenizer") or Path(ckpt_dir) / "tokenizer.json")


def check_import_files(record, dictionary, dict_path, tokenizer_path, ckpt_dir, beside):
    """--dict and --hf-tokenizer are those import-hf wrote for the model: only they map row i
    to HF id rows[i] (sizes prove nothing: imports of the same vocabulary size share them)."""
    from fairseq_alibi.hf_tokenizer import tokenizer_fingerprint

    rows, source = record["rows"], record.get("source")
    wrong = next((i for i in range(4, len(rows)) if dictionary[i] != str(rows[i])), None)
    if wrong is not None:
        raise ConversionError(
            f"--dict {dict_path} is not this model's dictionary (its symbol {wrong} is "
            f"{dictionary[wrong]!r}, the model's row {wrong} is Hugging Face id {rows[wrong]}): "
            + (f"give the dict.txt and tokenizer.json of one import (the {LAYOUT_FILE} beside "
               f"--hf-tokenizer is {source}'s)" if beside else
               "give the dict.txt import-hf wrote beside the imported checkpoint"))
    fix = "give the tokenizer.json import-hf wrote beside the imported checkpoint"
    tokenizer = read_tokenizer(require_file(tokenizer_path, "--hf-tokenizer"), fix)
    check_tokenizer_fits(tokenizer, len(rows), f"--hf-tokenizer {tokenizer_path}", fix)
    theirs = import_record(tokenizer_path.parent, fix)
    if theirs is not None and not same_import(theirs, record):
        raise ConversionError(f"--hf-tokenizer {tokenizer_path} belongs to another import (of "
                              f"{theirs.get('source')}; this model is {source}'s): {fix}")
    fingerprint, own = record.get("tokenizer_sha256"), Path(ckpt_dir) / "tokenizer.json"
    if fingerprint is None and own.is_file() and same_import(import_record(ckpt_dir, fix), record):
        # imported before the fingerprint was recorded: the tokenizer import-hf copied beside it
        fingerprint = tokenizer_fingerprint(read_tokenizer(own, fix))
    if fingerprint not in (None, tokenizer_fingerprint(tokenizer)) or (
            row_order(record["config"], tokenizer, len(rows)) != rows):
        raise ConversionError(f"--hf-tokenizer {tokenizer_path} is not the tokenizer this model "
                              f"was imported with (from {source}): {fix}")


def import_record(folder, fix):  # the record import-hf wrote in folder, or None
    path = Path(folder) / LAYOUT_FILE
    return read_json(path, fix) if path.is_file() else None


def same_import(one, other) -> bool:
    return one is not None and all(json.dumps(one.get(k), sort_keys=True) == json.dumps(
        other.get(k), sort_keys=True) for k in ("family", "source", "rows", "config"))


def type_name(family):
    return {"bloom": "BloomForCausalLM", "mpt": "MptForCausalLM"}[family]


def load_dictionary(path):
    from fairseq.data import Dictionary

    if not Path(path).is_file():
        raise ConversionError(f"no dictionary at {path}: give the model's dict.txt with --dict")
    return Dictionary.load(str(path))


def check_press_slopes(weights, heads):
    from fairseq_alibi.alibi import get_slopes

    saved = weights.get("decoder.alibi.slopes")
    if saved is not None and not torch.equal(saved.float().flatten(),
                                             get_slopes(heads).float()):
        raise ConversionError("this model's ALiBi slopes are not Press's (BLOOM and MPT compute "
                              "Press's): nothing to export")


# ---------------------------------------------------------------------------------------------
# tokenizers: fairseq's BPE + dictionary as one tokenizer.json (ids = dictionary indices)


def export_tokenizer(bpe, files, dictionary, ckpt_dir):
    """A ``tokenizers.Tokenizer`` whose ids are ``dictionary``'s indices, ``</s>`` prepended."""
    if bpe == "hf_tokenizer":
        path = Path(files.get("hf_tokenizer") or ckpt_dir / "tokenizer.json")
        return {"copy": require_file(path, "--hf-tokenizer")}
    if bpe == "gpt2":
        word_level = "; a word-level model, trained on text without BPE: --bpe none"
        return gpt2_tokenizer(
            require_file(files.get("gpt2_encoder_json"), "--gpt2-encoder-json", word_level),
            require_file(files.get("gpt2_vocab_bpe"), "--gpt2-vocab-bpe", word_level),
            dictionary)
    if bpe == "sentencepiece":
        return sentencepiece_tokenizer(
            require_file(files.get("sentencepiece_model"), "--sentencepiece-model"), dictionary)
    if bpe == "none":
        return word_tokenizer(dictionary)
    raise ConversionError(f"unknown --bpe {bpe!r}; choose gpt2, sentencepiece, hf_tokenizer or "
                          "none")


def require_file(path, flag, other=""):
    if not path or not Path(path).is_file():
        raise ConversionError(f"tokenizer file missing: {flag} {path or ''}".rstrip()
                              + f" (give the file the model was trained with{other})")
    return Path(path)


def remapped_vocab(symbols, dictionary):
    """Each piece's dictionary index (``<unk>`` where the dictionary lacks it)."""
    return {piece: dictionary.index(symbol) for piece, symbol in symbols}


def gpt2_tokenizer(encoder_json, vocab_bpe, dictionary):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    encoder = json.loads(encoder_json.read_text(encoding="utf-8"))
    merges = [tuple(line.split()) for line in vocab_bpe.read_text(encoding="utf-8").splitlines()[1:]
              if line and not line.startswith("#version")]
    vocab = remapped_vocab(((piece, str(i)) for piece, i in encoder.items()), dictionary)
    check_every_piece_known(vocab, dictionary, "GPT-2 BPE")
    vocab.update({s: dictionary.index(s) for s in SPECIALS})
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def word_tokenizer(dictionary):
    """fairseq's tokenization without BPE (``fairseq-preprocess`` of whitespace-split text, as
    WikiText-103's word-level models): each word's dictionary index, ``<unk>`` for the others;
    decoded by joining the words with spaces (the default of a tokenizer without a decoder)."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

    words = [dictionary[i] for i in range(dictionary.nspecial, len(dictionary))]
    # a BPE model's dictionary under --bpe none would give <unk> for every word, silently
    for looks, bpe in ((str.isdigit, "gpt2 (its symbols are GPT-2 BPE ids)"),
                       (lambda w: w.startswith("\u2581"), "sentencepiece (its symbols are "
                                                           "sentencepiece pieces)")):
        if words and sum(map(looks, words)) > len(words) / 2:
            raise ConversionError(f"--bpe none exports a word-level model, and this dictionary "
                                  f"is a BPE one: give --bpe {bpe}")
    tokenizer = Tokenizer(models.WordLevel(dict(dictionary.indices), unk_token="<unk>"))
    # fairseq splits on Python's whitespace, which holds U+001C-U+001F too; Unicode's does not
    tokenizer.normalizer = normalizers.Replace(Regex("[\\x1c-\\x1f]"), " ")
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def check_every_piece_known(vocab, dictionary, what):
    """A tokenizer.json maps each piece to one id and BPE merges by id, so a piece the
    dictionary lacks cannot share ``<unk>``'s id there: the dictionary must hold every piece."""
    lacking = [piece for piece, index in vocab.items() if index == dictionary.unk()]
    if lacking:
        raise ConversionError(
            f"the dictionary lacks {len(lacking)} of the {what}'s pieces (e.g. {lacking[0]!r}), "
            "which a Hugging Face tokenizer cannot send to <unk>: train with a dictionary of "
            "every piece (fairseq's gpt2 dict.txt; for sentencepiece, its vocabulary)")


def sentencepiece_tokenizer(model_path, dictionary):
    """transformers' own sentencepiece conversion (normalizer, pre-tokenizer, decoder), with the
    unigram's pieces in the dictionary's order and ``<unk>`` at fairseq's index."""
    import_transformers()
    from tokenizers import Regex, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import SpmConverter, import_protobuf

    proto = import_protobuf().ModelProto()
    try:
        proto.ParseFromString(Path(model_path).read_bytes())
    except Exception as e:  # noqa: BLE001 - a damaged or foreign file
        raise ConversionError(f"cannot read {model_path} as a sentencepiece model: {e}") from e
    if proto.trainer_spec.model_type != 1:
        raise ConversionError("only unigram sentencepiece models are exported (this one is "
                              f"type {proto.trainer_spec.model_type})")
    normal = {p.piece: p.score for p in proto.pieces if p.type in (1, 4)}  # normal, user-defined
    check_every_piece_known({p: dictionary.index(p) for p in normal}, dictionary,
                            "sentencepiece model")
    # the dictionary's own symbols (specials, madeupwords) never win against real pieces
    vocab = [(dictionary[i], normal.get(dictionary[i], -1e9)) for i in range(len(dictionary))]
    tokenizer = SpmConverter.build_tokenizer_from_spm_proto(proto, vocab, legacy=True)
    tokenizer.model = models.Unigram(vocab, unk_id=dictionary.unk(), byte_fallback=False)
    if not any(c in piece for piece in normal for c in "<>"):
        # the unigram would match fairseq's "<unk>", "</s>" in the text as those pieces, which
        # sentencepiece never does: "<" and ">" (unknown to it) are cut off on their own
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [tokenizer.pre_tokenizer, pre_tokenizers.Split(Regex("[<>]+"), "isolated")])
    return tokenizer


def write_tokenizer(folder, tokenizer, dictionary):
    """``tokenizer.json`` (``</s>`` prepended, as fairseq's LM task does) and its config."""
    from tokenizers import processors

    if isinstance(tokenizer, dict):  # an imported model's own tokenizer, as it came
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            source = tokenizer["copy"].parent / name
            if source.is_file():
                shutil.copy(source, folder / name)
        return
    if any(tokenizer.token_to_id(s) != dictionary.index(s) for s in SPECIALS):
        raise ConversionError("the dictionary's specials are not fairseq's <s> <pad> </s> <unk>")
    # "<unk>" written in the text (WikiText has it) is text to fairseq's BPE, not the special
    tokenizer.encode_special_tokens = True
    tokenizer.post_processor = processors.TemplateProcessing(
        single="</s> $A", pair="</s> $A $B", special_tokens=[("</s>", dictionary.eos())])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": "<pad>", "padding_side": "left",
        "model_max_length": 1000000000, "clean_up_tokenization_spaces": False,
        "split_special_tokens": True,
    }, indent=2))


# ---------------------------------------------------------------------------------------------
# import


def read_hf_folder(folder):
    """``(config dict, weights)`` of a local Hugging Face folder (safetensors or bin, weights
    only), or a one-line error."""
    folder = Path(folder)
    config_path = folder / "config.json"
    if not folder.is_dir():  # a typo, or a file of the folder given in its place
        raise ConversionError(
            f"{folder} is a file: give the folder that holds it (the model's config.json, "
            "weights and tokenizer.json)" if folder.exists() else
            f"no folder {folder}: give the local folder of a Hugging Face BLOOM or MPT model "
            "(config.json, weights, tokenizer.json; a hub model is downloaded first)")
    if not config_path.is_file():
        raise ConversionError(f"no config.json in {folder}: not a Hugging Face model folder")
    config = read_json(config_path, "download the model's config.json again")
    kind = config.get("model_type")
    if kind == "falcon" or kind == "RefinedWeb":
        raise ConversionError(
            "Falcon's ALiBi divides the bias by sqrt(head_dim) and builds it in bfloat16: not "
            "the same model as Press's ALiBi; only BLOOM and MPT are imported")
    if kind not in FAMILIES:
        raise ConversionError(f"model_type {kind!r} is not an ALiBi model that transformers "
                              "holds natively: only BLOOM and MPT are imported")
    return config, read_weights(folder)


def read_weights(folder):
    files = sorted(folder.glob("*.safetensors"))
    weights = {}
    try:
        if files:
            from safetensors.torch import load_file

            for f in files:
                weights.update(load_file(str(f)))
        else:
            files = sorted(folder.glob("pytorch_model*.bin"))
            if not files:
                raise ConversionError(f"no model.safetensors or pytorch_model.bin in {folder}")
            for f in files:
                weights.update(torch.load(str(f), map_location="cpu", weights_only=True))
    except ConversionError:
        raise
    except Exception as e:  # noqa: BLE001 - any unreadable file: the same advice
        raise ConversionError(f"cannot read the weights in {folder} (truncated or damaged? "
                              f"{first_line(e)}): download them again") from e
    return weights


def first_line(error) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def read_json(path, fix) -> dict:
    """The JSON object in ``path``, or one line naming it and ``fix``."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
        raise ConversionError(f"cannot read {path} as JSON (damaged? {first_line(e)}): "
                              f"{fix}") from e
    if not isinstance(value, dict):
        raise ConversionError(f"{path} is JSON but not an object: {fix}")
    return value


def read_tokenizer(path, fix):
    from fairseq_alibi.hf_tokenizer import load_tokenizer

    return load_tokenizer(path, fix, error=ConversionError)


def check_tokenizer_fits(tokenizer, rows, name, fix):
    produced = tokenizer.get_vocab_size(with_added_tokens=True)
    if produced > rows:
        raise ConversionError(f"{name} has {produced} ids, the model {rows} embedding rows: the "
                              f"tokenizer and the model do not match; {fix}")


def import_options(config) -> tuple:
    """``(family, fairseq-train flags)`` for a BLOOM/MPT config, or one line on what differs."""
    kind = config["model_type"]
    eps = config.get("layer_norm_epsilon", 1e-5)
    problems = [] if eps == 1e-5 else [f"layer_norm_epsilon {eps} (fairseq's LayerNorm: 1e-5)"]
    if not config.get("tie_word_embeddings", True):
        problems.append("untied output embeddings")
    if kind == "bloom":
        if config.get("apply_residual_connection_post_layernorm"):
            problems.append("apply_residual_connection_post_layernorm")
        dim, layers, heads = config["hidden_size"], config["n_layer"], config["n_head"]
        flags = ["--arch", "alibi_bloom", "--dropout", config.get("hidden_dropout", 0.0),
                 "--attention-dropout", config.get("attention_dropout", 0.0)]
        length = config.get("seq_length", 2048)
    else:
        attn = config.get("attn_config") or {}
        for key, default in (("alibi", True), ("alibi_bias_max", 8), ("clip_qkv", None),
                             ("qk_ln", False), ("prefix_lm", False),
                             ("attn_type", "multihead_attention")):
            if attn.get(key, default) != default:
                problems.append(f"attn_config.{key} {attn.get(key)}")
        dim, layers, heads = config["d_model"], config["n_layers"], config["n_heads"]
        scale = attn.get("softmax_scale")
        if scale is not None and not math.isclose(scale, (dim // heads) ** -0.5):
            problems.append(f"attn_config.softmax_scale {scale}")
        if config.get("expansion_ratio", 4) != 4:
            problems.append(f"expansion_ratio {config.get('expansion_ratio')}")
        flags = ["--arch", "alibi_transformer_lm", "--activation-fn", "gelu",
                 "--decoder-normalize-before",
                 "--decoder-ffn-embed-dim", 4 * dim, "--no-scale-embedding",
                 "--share-decoder-input-output-embed", "--decoder-input-dim", dim,
                 "--decoder-output-dim", dim, "--dropout", config.get("resid_pdrop", 0.0),
                 "--attention-dropout", attn.get("attn_pdrop", 0.0)]
        length = config.get("max_seq_len", 2048)
    if problems:
        raise ConversionError(f"this {kind} model computes something alibi_transformer_lm "
                              f"does not: {'; '.join(problems)}")
    flags += ["--decoder-embed-dim", dim, "--decoder-layers", layers,
              "--decoder-attention-heads", heads, "--tokens-per-sample", length]
    return kind, layers, heads, flags


def exported_without_note(recorded: dict) -> str:
    """The line that says an imported folder was exported from a fairseq model with
    run-time options BLOOM and MPT have no counterpart of (``recorded``,
    :data:`RUN_TIME_KEY`), and how to load the import as that model."""
    flags = ", ".join(f"{flag_of_key(k)} {v}" for k, v in recorded.items())
    overrides = ", ".join(f"'{k}': {v!r}" for k, v in recorded.items())
    return (f"note: config.json records that this model was exported from one run with {flags}, "
            "which the export computes without (as does this import); to compute that model, "
            f"load the import with --model-overrides \"{{{overrides}}}\" (load-time options: "
            "the weights are the same)")


def import_notes(config) -> list:
    """What an import computes otherwise than the model it came from, one line each: a
    fairseq model's run-time options its export left out (:data:`RUN_TIME_KEY`), and where
    transformers (whose computation the import reproduces) ignores a setting of an MPT."""
    recorded = config.get(RUN_TIME_KEY)  # a mapping, as export-hf writes it
    notes = [exported_without_note(recorded)] if isinstance(recorded, dict) and recorded else []
    if recorded is not None and not isinstance(recorded, dict):
        notes.append(f"note: config.json's {RUN_TIME_KEY} is not a mapping of options "
                     f"({type(recorded).__name__}): the options it was exported without are "
                     "unknown")
    if config["model_type"] != "mpt":
        return notes
    scale = config.get("logit_scale")
    if scale is not None and scale != 1:  # 1: the same logits
        notes.append(f"note: config.json has logit_scale {scale!r}: MPT's own code multiplies "
                     "the logits by it, transformers does not, nor does this import (it "
                     "computes what transformers computes); its probabilities are the "
                     "original's only where that scale is 1")
    if (config.get("attn_config") or {}).get("attn_uses_sequence_id"):
        notes.append("note: this MPT was trained with attn_uses_sequence_id (packed sequences "
                     "attend within themselves); scoring one text is unchanged; to train on "
                     "packed text likewise, add --alibi-document-mask eos (its </s> opens the "
                     "next document, where MPT's ends the one before: docs/documents.md)")
    return notes


def row_order(config, tokenizer, rows: int):
    """The HF row of each fairseq row: fairseq's ``<s> <pad> </s> <unk>`` first (the model's
    bos/pad/eos/unk rows, or rows the tokenizer never produces), then the rest in order."""
    produced = tokenizer.get_vocab_size(with_added_tokens=True)
    wanted = {"</s>": config.get("eos_token_id"), "<s>": config.get("bos_token_id"),
              "<pad>": config.get("pad_token_id"), "<unk>": unk_row(tokenizer)}
    spare = [r for r in range(rows - 1, produced - 1, -1)]
    chosen = {}
    for name in ("</s>", "<s>", "<pad>", "<unk>"):
        row = wanted[name]
        if isinstance(row, list):
            row = row[0]
        if row is None or row in chosen.values() or not 0 <= row < rows:
            if not spare:
                raise ConversionError(no_row_for(name, row, chosen, tokenizer, rows))
            row = spare.pop(0)
        chosen[name] = row
    head = [chosen[s] for s in SPECIALS]
    return head + [r for r in range(rows) if r not in set(head)]


def unk_row(tokenizer) -> Optional[int]:
    """The id the tokenizer gives an unknown piece: its model's ``unk_token`` (BPE, WordPiece,
    WordLevel) or ``unk_id`` (Unigram, a sentencepiece model's); ``None`` without one."""
    model = json.loads(tokenizer.to_str())["model"]
    unk = model.get("unk_token")
    return tokenizer.token_to_id(unk) if unk else model.get("unk_id")


CONFIG_KEYS = {"<s>": "bos_token_id", "<pad>": "pad_token_id", "</s>": "eos_token_id"}
PAD_TOKENS = ("<pad>", "[PAD]", "<|pad|>", "<|padding|>")


def no_row_for(name, row, chosen, tokenizer, rows) -> str:
    """Why fairseq's special ``name`` gets no row (``row``: the one the model names, None, out
    of range or taken by another special; the tokenizer has a token for every row, so none is
    spare), and what to set: a row of a token that text never encodes to."""
    key = CONFIG_KEYS.get(name)
    what = f"config.json's {key}" if key else "the tokenizer's unk_token"
    taken = next((other for other, r in chosen.items() if r == row), None)
    if row is None:
        why = f"config.json sets no {key}" if key else "the tokenizer has no unk_token"
    elif taken:
        why = f"{what} {row} is also fairseq's {taken}"
    else:
        why = f"{what} {row} is not a row of the model's {rows}"
    why += (f", and the tokenizer has a token for every one of the model's {rows} embedding "
            f"rows, leaving none for fairseq's {name}: ")
    if not key:
        return why + ("name a token that text never encodes to (an unused special token) as "
                      "\"unk_token\" of \"model\" in tokenizer.json (its id as \"unk_id\" for "
                      "a Unigram model)")
    pads = [(t, tokenizer.token_to_id(t)) for t in PAD_TOKENS] if name == "<pad>" else []
    pad = next(((t, i) for t, i in pads if i is not None and i not in chosen.values()), None)
    example = f", e.g. the tokenizer's padding token {pad[0]} ({pad[1]})" if pad else ""
    return why + (f"set {key} in config.json to the id of a token that text never encodes "
                  f"to{example}")


def check_tied_head(head: Optional[torch.Tensor], embeddings: torch.Tensor):
    """A saved ``lm_head.weight`` must be the input embeddings (the config ties them: fairseq
    shares one matrix); a folder re-saved with another output layer is refused."""
    if head is not None and (head.shape != embeddings.shape
                             or not torch.equal(head.float(), embeddings)):
        raise ConversionError(
            "lm_head.weight differs from the input embeddings that config.json ties to it "
            "(tie_word_embeddings): the model computes its output with another matrix than "
            "the one imported; untied output embeddings are not imported")


def check_shapes(weights, target, source):
    """Each tensor's shape against the model that config.json builds, naming the first that
    differs by its name in the folder (``source``)."""
    for name, tensor in weights.items():
        if tensor.shape != target[name].shape:
            raise ConversionError(
                f"{source.get(name, name)} has shape {list(tensor.shape)} where config.json's "
                f"sizes give {list(target[name].shape)} (fairseq's {name}): the weights and "
                "config.json are not of one model")


def import_folder(folder, out):
    """Write ``checkpoint.pt``, ``dict.txt`` and ``tokenizer.json`` of a local BLOOM/MPT."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import fairseq_alibi  # noqa: F401  (the models, --bpe hf_tokenizer)
    from fairseq_alibi.hf_tokenizer import tokenizer_fingerprint

    folder, out = Path(folder), Path(out)
    config, hf_weights = read_hf_folder(folder)
    kind, layers, heads, flags = import_options(config)
    tokenizer_file = folder / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ConversionError(f"no tokenizer.json in {folder}: fairseq could not encode text "
                              "for this model; add the model's tokenizer.json")
    fix = f"put the model's own tokenizer.json in {folder}"
    tokenizer = read_tokenizer(tokenizer_file, fix)
    fs_weights, source = {}, {}
    try:
        for hf_name, fs_names, how in layout(kind, layers):
            for name, tensor in zip(fs_names, split(hf_weights.pop(hf_name), how, heads)):
                fs_weights[name], source[name] = tensor.float().clone(), hf_name
    except KeyError as e:
        raise ConversionError(f"the weights lack {e.args[0]}: not a complete {kind} model") from e
    check_tied_head(hf_weights.pop("lm_head.weight", None),
                    fs_weights["decoder.embed_tokens.weight"])
    embed_rows = fs_weights["decoder.embed_tokens.weight"].shape[0]
    check_tokenizer_fits(tokenizer, embed_rows, str(tokenizer_file), fix)
    rows = row_order(config, tokenizer, embed_rows)
    fs_weights["decoder.embed_tokens.weight"] = fs_weights["decoder.embed_tokens.weight"][rows]
    with atomic_folder(out) as tmp:
        with open(tmp / "dict.txt", "w", encoding="utf-8") as f:
            f.writelines(f"{r} 1\n" for r in rows[4:])
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (folder / name).is_file():
                shutil.copy(folder / name, tmp / name)
        argv = [tmp, "--task", "language_modeling", "--sample-break-mode", "none",
                "--bpe", "hf_tokenizer", "--hf-tokenizer", out.resolve() / "tokenizer.json",
                *flags]
        parsed = options.parse_args_and_arch(options.get_training_parser(),
                                             [str(a) for a in argv])
        with warnings.catch_warnings():  # hydra's notes on fairseq's own config: not the user's
            warnings.simplefilter("ignore", UserWarning)
            logging.getLogger("hydra").setLevel(logging.INFO)
            cfg = convert_namespace_to_omegaconf(parsed)
        model = tasks.setup_task(cfg.task).build_model(cfg.model)
        cfg.task.data = str(out.resolve())  # where dict.txt will be
        target = model.state_dict()
        for name in zero_biases(kind, layers):
            fs_weights[name] = torch.zeros_like(target[name])
        fs_weights["decoder.output_projection.weight"] = fs_weights["decoder.embed_tokens.weight"]
        for name in ("decoder.alibi.slopes", "decoder.version"):  # computed, not learned
            fs_weights[name] = target[name]
        missing = set(target) - set(fs_weights)
        if missing or hf_weights:
            raise ConversionError(f"the {kind} weights do not fit (missing {sorted(missing)[:3]}, "
                                  f"left over {sorted(hf_weights)[:3]})")
        check_shapes(fs_weights, target, source)
        model.load_state_dict(fs_weights, strict=True)
        from omegaconf import OmegaConf

        layout_record = {"rows": rows, "family": kind, "source": str(folder.resolve()),
                         "config": config, "config_class":
                             {"bloom": "BloomConfig", "mpt": "MptConfig"}[kind],
                         "tokenizer_sha256": tokenizer_fingerprint(tokenizer)}
        (tmp / LAYOUT_FILE).write_text(json.dumps(layout_record))

        state = {"cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
                 "args": None, "model": model.state_dict(),
                 "optimizer_history": [{"criterion_name": "CrossEntropyCriterion",
                                        "optimizer_name": None, "num_updates": 0,
                                        "lr_scheduler_state": {"best": None}}],
                 "extra_state": {EXTRA_KEY: layout_record}}
        write_atomically(state, tmp / "checkpoint.pt")
    return {"family": kind, "layers": layers, "heads": heads, "rows": len(rows),
            "specials": dict(zip(SPECIALS, rows[:4])), "out": str(out),
            "notes": import_notes(config)}


# ---------------------------------------------------------------------------------------------
# command lines


def export_main(argv=None):
    parser = argparse.ArgumentParser(
        prog="fairseq-alibi export-hf",
        description="Export a fairseq ALiBi language model to a Hugging Face BLOOM (or MPT) folder "
        "that AutoModelForCausalLM and AutoTokenizer load offline.")
    parser.add_argument("checkpoint")
    parser.add_argument("--dict", required=True, help="the model's dict.txt")
    parser.add_argument("--bpe", default="gpt2",
                        choices=("gpt2", "sentencepiece", "hf_tokenizer", "none"),
                        help="how the text was split before the dictionary: gpt2 (default), "
                        "sentencepiece, an imported model's hf_tokenizer, or none (a word-level "
                        "model: fairseq-preprocess of whitespace-split text)")
    parser.add_argument("--gpt2-encoder-json")
    parser.add_argument("--gpt2-vocab-bpe")
    parser.add_argument("--sentencepiece-model")
    parser.add_argument("--hf-tokenizer", help="an imported model's tokenizer.json "
                        "(default: beside the checkpoint)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    files = {k: getattr(args, k) for k in ("gpt2_encoder_json", "gpt2_vocab_bpe",
                                           "sentencepiece_model", "hf_tokenizer")}
    return run_reporting(
        lambda: export_checkpoint(args.checkpoint, args.dict, args.out, args.bpe, files),
        lambda s: (run_time_note(s["run_time_only"]) + "\n" if s["run_time_only"] else "")
        + f"exported {type_name(s['family'])} ({s['layers']} layers, {s['heads']} heads, "
          f"{s['vocab']} rows, {s['tensors']} tensors) to {s['out']}")


def import_main(argv=None):
    parser = argparse.ArgumentParser(
        prog="fairseq-alibi import-hf",
        description="Import a local Hugging Face BLOOM or MPT folder as a fairseq checkpoint "
        "(checkpoint.pt, dict.txt, tokenizer.json for --bpe hf_tokenizer).")
    parser.add_argument("folder")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    return run_reporting(
        lambda: import_folder(args.folder, args.out),
        lambda s: "".join(note + "\n" for note in s["notes"])
        + f"imported {s['family']} ({s['layers']} layers, {s['heads']} heads, "
          f"{s['rows']} rows; fairseq specials from rows {s['specials']}) to {s['out']}")


def run_reporting(convert, summary_line) -> int:
    """Exit status 0 and the summary, or 1 and the one-line error."""
    try:
        with torch.no_grad():
            summary = convert()
    except ConversionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(summary_line(summary))
    return 0
