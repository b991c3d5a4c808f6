"""Exact moves to and from Hugging Face (docs/huggingface.md): fairseq ALiBi LMs <-> BLOOM / MPT.

Fast tests run in this process on tiny float32 models (several head counts, powers of two and
not); the fairseq command lines (eval-lm, train --finetune-from-model, interactive) are slow.
Real text: ``../shared/data`` (WikiText-2 and the GPT-2 BPE files), skipped when absent.
"""

import json
import math
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

from tests.helpers.building import setup_from_command_line
from tests.helpers.cli import BIN, SHARED_DATA, child_env, run_cli

from fairseq_alibi.cli import hf_export_import as hf  # noqa: E402

try:  # the [hf] extra (the README's test set-up installs it)
    hf.import_transformers()
    import safetensors  # noqa: F401
    import tokenizers  # noqa: F401
except (hf.ConversionError, ImportError):
    pytest.skip("needs the [hf] extra: transformers, tokenizers, safetensors",
                allow_module_level=True)

GPT2 = SHARED_DATA / "gpt2_bpe"
WIKITEXT = SHARED_DATA / "wikitext-2" / "wiki.valid.tokens"
needs_shared = pytest.mark.skipif(not (GPT2 / "dict.txt").is_file() or not WIKITEXT.is_file(),
                                  reason="needs ../shared/data (GPT-2 BPE, WikiText-2)")
HEADS = [4, 6, 12]  # head_dim 6, 4, 2; 6 and 12 are not powers of two
TRAIN_LENGTH = 16


def transformers():
    return hf.import_transformers()


def randomize(module, seed):
    """Weights far from fairseq's init (peaked distributions: greedy decoding has no near-ties)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3)


def wikitext_lines(n, skip=0):
    lines = [line.strip() for line in WIKITEXT.read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if line and not line.startswith("=")][skip:skip + n]


# ---------------------------------------------------------------------------------------------
# a fairseq alibi_bloom checkpoint written by fairseq's Trainer, with the GPT-2 dictionary


def write_fairseq_checkpoint(folder, heads, arch="alibi_bloom", extra=(), seed=0,
                             dictionary=GPT2 / "dict.txt"):
    from fairseq.trainer import Trainer

    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(dictionary, folder / "dict.txt")
    cfg, task = setup_from_command_line(
        folder, "--task", "language_modeling", "--arch", arch, "--decoder-layers", 2,
        "--decoder-embed-dim", 24, "--decoder-attention-heads", heads,
        "--tokens-per-sample", TRAIN_LENGTH, "--sample-break-mode", "none", "--dropout", 0,
        "--optimizer", "adam", "--lr", 0.001, "--max-tokens", 64, "--cpu", "--save-dir", folder,
        *extra)
    model = task.build_model(cfg.model)
    randomize(model, seed)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    trainer.consolidate_optimizer()
    trainer.save_checkpoint(str(folder / "checkpoint.pt"), {})
    return folder / "checkpoint.pt"


def export(ckpt, out, *extra):
    return hf.export_main([str(ckpt), "--dict", str(ckpt.parent / "dict.txt"),
                           "--gpt2-encoder-json", str(GPT2 / "encoder.json"),
                           "--gpt2-vocab-bpe", str(GPT2 / "vocab.bpe"), "--out", str(out),
                           *extra])


@pytest.fixture(scope="module", params=HEADS)
def exported(request, tmp_path_factory):
    if not (GPT2 / "dict.txt").is_file():
        pytest.skip("needs ../shared/data/gpt2_bpe")
    root = tmp_path_factory.mktemp(f"export{request.param}")
    ckpt = write_fairseq_checkpoint(root / "fairseq", request.param, seed=request.param)
    assert export(ckpt, root / "hf") == 0
    return ckpt, root / "hf"


def fairseq_lm(folder, checkpoint="checkpoint.pt"):
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel

    lm = AlibiTransformerLanguageModel.from_pretrained(str(folder), checkpoint,
                                                       data_name_or_path=str(folder))
    lm.eval()
    return lm


def hf_model(folder):
    model = transformers().AutoModelForCausalLM.from_pretrained(str(folder),
                                                                 dtype=torch.float32)
    model.eval()
    return model


def fairseq_ids(text, dictionary):
    """fairseq's LM-task ids of ``text``: GPT-2 BPE ids looked up in the dictionary, ``</s>``
    first (the previous line's end, or the start of the stream)."""
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    bpe = get_encoder(str(GPT2 / "encoder.json"), str(GPT2 / "vocab.bpe"))
    line = " ".join(map(str, bpe.encode(text)))
    return [dictionary.eos()] + dictionary.encode_line(line, append_eos=False,
                                                       add_if_not_exist=False).tolist()


def token_log_probs(logits, tokens):
    return torch.log_softmax(logits.double(), -1)[:, :-1].gather(
        -1, tokens[:, 1:, None]).squeeze(-1)


# ---------------------------------------------------------------------------------------------
# the facts the mapping rests on, checked against the installed transformers


def test_bloom_and_mpt_slopes_are_press_slopes_for_every_head_count():
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    from fairseq_alibi.alibi import get_slopes

    for heads in range(1, 97):
        press = get_slopes(heads)
        # the same formula, powers taken in float32 there: within 6e-7 relative (a few ulps)
        bloom = _get_alibi_slopes(heads, torch.device("cpu"))
        assert torch.allclose(bloom, press, rtol=1e-6, atol=0), heads
        # MPT's bias row for key j (of 2 keys) is -(1 - j)·m: its slopes are row 0's negation
        mpt = -build_mpt_alibi_tensor(heads, 2)[:, 0, 0]
        assert torch.allclose(mpt, press, rtol=1e-6, atol=0), heads


def test_bloom_gelu_is_fairseq_gelu_accurate():
    from fairseq.modules.gelu import gelu_accurate
    from transformers.models.bloom.modeling_bloom import bloom_gelu_forward

    x = torch.linspace(-8, 8, 10001)
    assert (bloom_gelu_forward(x) - gelu_accurate(x)).abs().max().item() < 1e-6


# ---------------------------------------------------------------------------------------------
# export: weights, log-probabilities, perplexity, generation, tokenizer


@needs_shared
def test_export_then_import_gives_back_every_weight_bit_for_bit(exported, tmp_path):
    ckpt, folder = exported
    assert hf.import_main([str(folder), "--out", str(tmp_path / "back")]) == 0
    original = torch.load(ckpt, weights_only=False)["model"]
    back = torch.load(tmp_path / "back" / "checkpoint.pt", weights_only=False)["model"]
    assert original.keys() == back.keys()
    assert all(torch.equal(original[k], back[k]) for k in original), \
        [k for k in original if not torch.equal(original[k], back[k])]


@needs_shared
def test_a_folder_of_pytorch_model_bin_imports_as_its_safetensors(exported, tmp_path):
    """Older Hugging Face folders hold ``pytorch_model.bin`` (read with torch's safe loader):
    the import equals the one of the same weights as safetensors."""
    import shutil

    from safetensors.torch import load_file

    _, folder = exported
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    weights = {}
    for f in sorted(old.glob("*.safetensors")):
        weights.update(load_file(str(f)))
        f.unlink()
    torch.save(weights, old / "pytorch_model.bin")
    for source, out in ((folder, "new_back"), (old, "old_back")):
        assert hf.import_main([str(source), "--out", str(tmp_path / out)]) == 0
    new, back = (torch.load(tmp_path / out / "checkpoint.pt", weights_only=False)["model"]
                 for out in ("new_back", "old_back"))
    assert new.keys() == back.keys() and all(torch.equal(new[k], back[k]) for k in new)


@needs_shared
def test_a_sentencepiece_export_imports_back_bit_for_bit(tmp_path):
    """A Unigram tokenizer names its unknown piece by id (``unk_id``), not by token: the
    import finds fairseq's <unk> there, and every row stays where it was."""
    pytest.importorskip("sentencepiece")
    from fairseq_alibi.preprocess.encoders import SentencePieceEncoder, train_sentencepiece

    model = train_sentencepiece(wikitext_lines(500), tmp_path / "sp", 300, num_threads=1)
    SentencePieceEncoder(model).dictionary.save(str(tmp_path / "sp.dict.txt"))
    ckpt = write_fairseq_checkpoint(tmp_path / "fs", 4, dictionary=tmp_path / "sp.dict.txt")
    assert hf.export_main([str(ckpt), "--dict", str(ckpt.parent / "dict.txt"), "--bpe",
                           "sentencepiece", "--sentencepiece-model", str(model), "--out",
                           str(tmp_path / "hf")]) == 0
    assert hf.import_main([str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 0
    original = torch.load(ckpt, weights_only=False)["model"]
    back = torch.load(tmp_path / "back" / "checkpoint.pt", weights_only=False)
    assert back["extra_state"]["huggingface"]["rows"] == list(range(len(
        original["decoder.embed_tokens.weight"])))
    assert all(torch.equal(original[k], back["model"][k]) for k in original)


@needs_shared
def test_a_word_level_model_exports_with_bpe_none(tmp_path, capsys):
    """A model of fairseq-preprocess'd whitespace-split text (WikiText-103's word-level kind):
    the exported tokenizer gives fairseq's ids (an unknown word and a literal ``<unk>`` both
    ``<unk>``), the log-probabilities are fairseq's, and it imports back bit for bit."""
    from fairseq.data import Dictionary

    dictionary = Dictionary()
    for line in wikitext_lines(300):
        dictionary.encode_line(line, add_if_not_exist=True, append_eos=False)
    dictionary.finalize(threshold=2)
    dictionary.save(str(tmp_path / "words.txt"))
    ckpt = write_fairseq_checkpoint(tmp_path / "fs", 4, dictionary=tmp_path / "words.txt")
    common = [str(ckpt), "--dict", str(ckpt.parent / "dict.txt"), "--out"]
    assert hf.export_main([*common, str(tmp_path / "no")]) == 1  # --bpe gpt2, the default
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "(give the file the model was trained with; a word-level model, trained on text "
        "without BPE: --bpe none)")
    assert hf.export_main([*common, str(tmp_path / "hf"), "--bpe", "none"]) == 0
    lm, model = fairseq_lm(ckpt.parent), hf_model(tmp_path / "hf")
    tokenizer = transformers().AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    text = " ".join(wikitext_lines(3, skip=300)) + "  zyxwvut <unk>\tthe\x1fend"
    ids = [lm.task.dictionary.eos()] + lm.task.dictionary.encode_line(
        text, append_eos=False, add_if_not_exist=False).tolist()
    assert tokenizer(text)["input_ids"] == ids and ids[-4:-2] == [lm.task.dictionary.unk()] * 2
    tokens = torch.tensor([ids])
    with torch.no_grad():
        ours = token_log_probs(lm.models[0](tokens)[0], tokens)
        theirs = token_log_probs(model(tokens).logits, tokens)
    assert (ours - theirs).abs().max().item() < 1e-5
    assert tokenizer.decode(ids[1:5]) == " ".join(lm.task.dictionary[i] for i in ids[1:5])
    assert hf.import_main([str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 0
    original = torch.load(ckpt, weights_only=False)["model"]
    back = torch.load(tmp_path / "back" / "checkpoint.pt", weights_only=False)["model"]
    assert all(torch.equal(original[k], back[k]) for k in original)
    # a GPT-2 BPE model's dictionary under --bpe none: every word would be <unk>
    bpe = write_fairseq_checkpoint(tmp_path / "bpe", 4)
    assert hf.export_main([str(bpe), "--dict", str(bpe.parent / "dict.txt"), "--bpe", "none",
                           "--out", str(tmp_path / "bpe_hf")]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "--bpe none exports a word-level model, and this dictionary is a BPE one: give --bpe "
        "gpt2 (its symbols are GPT-2 BPE ids)")
    assert not (tmp_path / "bpe_hf").exists()


@needs_shared
def test_a_checkpoint_saved_before_an_option_existed_exports(tmp_path):
    """A checkpoint without the learned scales' keys (saved before them, or converted from a
    fork) loads with their defaults, and exports as such, not refused for a value ``None``."""
    ckpt = write_fairseq_checkpoint(tmp_path / "fs", 4)
    state = torch.load(ckpt, weights_only=False)
    for key in ("alibi_learned_scales", "alibi_scale_init", "alibi_slope_scale"):
        del state["cfg"]["model"][key]
    torch.save(state, ckpt)
    assert export(ckpt, tmp_path / "hf") == 0
    lm, model = fairseq_lm(ckpt.parent), hf_model(tmp_path / "hf")
    tokens = torch.tensor([fairseq_ids(" ".join(wikitext_lines(2)), lm.task.dictionary)])
    with torch.no_grad():
        ours = token_log_probs(lm.models[0](tokens)[0], tokens)
        theirs = token_log_probs(model(tokens).logits, tokens)
    assert (ours - theirs).abs().max().item() < 1e-5


@needs_shared
def test_exported_log_probabilities_equal_fairseq_on_wikitext(exported):
    ckpt, folder = exported
    lm, model = fairseq_lm(ckpt.parent), hf_model(folder)
    tokenizer = transformers().AutoTokenizer.from_pretrained(str(folder))
    texts = [" ".join(wikitext_lines(3, skip=i)) for i in (0, 5)]
    encoded = [tokenizer(t)["input_ids"] for t in texts]
    assert encoded == [fairseq_ids(t, lm.task.dictionary) for t in texts]
    for ids in encoded:  # unpadded, beyond the training length
        tokens = torch.tensor([ids])
        assert tokens.size(1) > 4 * TRAIN_LENGTH
        with torch.no_grad():
            ours = token_log_probs(lm.models[0](tokens)[0], tokens)
            theirs = token_log_probs(model(tokens).logits, tokens)
        assert (ours - theirs).abs().max().item() < 1e-5
    # a left-padded batch of two lengths
    short, long_ = sorted(encoded, key=len)
    short = short[: len(short) // 2]
    width, pad = len(long_), lm.task.dictionary.pad()
    batch = torch.tensor([[pad] * (width - len(short)) + short, long_])
    mask = batch.ne(pad).long()
    with torch.no_grad():
        ours = token_log_probs(lm.models[0](batch)[0], batch)
        theirs = token_log_probs(model(batch, attention_mask=mask).logits, batch)
    real = mask[:, 1:].bool() & mask[:, :-1].bool()
    assert (ours - theirs)[real].abs().max().item() < 1e-5


@needs_shared
def test_a_scaled_embedding_is_folded_into_the_export(tmp_path):
    """Without --no-scale-embedding: the table is multiplied by sqrt(d) and, the output layer
    being tied, ln_f's weight and bias divided by it (exact up to float rounding)."""
    ckpt = write_fairseq_checkpoint(
        tmp_path / "fs", 6, arch="alibi_transformer_lm", extra=[
            "--decoder-normalize-before", "--layernorm-embedding", "--activation-fn",
            "gelu_accurate", "--decoder-ffn-embed-dim", 96, "--share-decoder-input-output-embed",
            "--decoder-input-dim", 24, "--decoder-output-dim", 24])
    assert export(ckpt, tmp_path / "hf") == 0
    lm, model = fairseq_lm(ckpt.parent), hf_model(tmp_path / "hf")
    assert lm.models[0].decoder.embed_scale == math.sqrt(24)
    tokens = torch.tensor([fairseq_ids(" ".join(wikitext_lines(2)), lm.task.dictionary)])
    with torch.no_grad():
        ours = token_log_probs(lm.models[0](tokens)[0], tokens)
        theirs = token_log_probs(model(tokens).logits, tokens)
    assert (ours - theirs).abs().max().item() < 1e-5


@needs_shared
def test_run_time_options_are_noted_and_the_export_is_the_model_without_them(tmp_path, capsys):
    """A model saved with a document mask and slope windows exports (BLOOM has neither), says
    so in a line naming them and the override that gives the same model here, and computes
    exactly that: equal to the checkpoint loaded with them off on a packed input of two
    documents, which the checkpoint as saved scores differently."""
    ckpt = write_fairseq_checkpoint(tmp_path / "fs", 4, extra=[
        "--alibi-document-mask", "doc", "--alibi-window-cutoff", 2, "--alibi-window-sinks", 1])
    capsys.readouterr()
    assert export(ckpt, tmp_path / "hf") == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == (
        "note: BLOOM and MPT have no --alibi-document-mask doc, --alibi-window-cutoff 2.0, "
        "--alibi-window-sinks 1: the export computes this model without them (every key of "
        "the input, across documents), as it computes here loaded with --model-overrides "
        "\"{'alibi_document_mask': 'none', 'alibi_window_cutoff': 0.0, 'alibi_window_sinks': "
        "0}\" (they are load-time options: the weights are the same)")
    assert out[1].startswith("exported BloomForCausalLM"), out
    model = hf_model(tmp_path / "hf")
    saved = fairseq_lm(ckpt.parent)
    dictionary = saved.task.dictionary
    first, second = (fairseq_ids(" ".join(wikitext_lines(2, skip=i)), dictionary) for i in (0, 4))
    tokens = torch.tensor([first + [dictionary.eos()] + second])  # </s> </s>: a document ends
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel

    off = AlibiTransformerLanguageModel.from_pretrained(
        str(ckpt.parent), "checkpoint.pt", data_name_or_path=str(ckpt.parent),
        alibi_document_mask="none", alibi_window_cutoff=0.0, alibi_window_sinks=0).eval()
    with torch.no_grad():
        theirs = token_log_probs(model(tokens).logits, tokens)
        ours_off = token_log_probs(off.models[0](tokens)[0], tokens)
        ours_saved = token_log_probs(saved.models[0](tokens)[0], tokens)
    assert (ours_off - theirs).abs().max().item() < 1e-5
    assert (ours_saved - theirs).abs().max().item() > 1e-3
    # config.json records them; the import says so and names the override that gives them back
    recorded = {"alibi_document_mask": "doc", "alibi_window_cutoff": 2.0,
                "alibi_window_sinks": 1}
    assert json.loads((tmp_path / "hf" / "config.json").read_text())[hf.RUN_TIME_KEY] == recorded
    assert hf.import_main([str(tmp_path / "hf"), "--out", str(tmp_path / "back")]) == 0
    note = capsys.readouterr().out.splitlines()[0]
    assert note.startswith("note: config.json records that this model was exported from one "
                           "run with --alibi-document-mask doc, --alibi-window-cutoff 2.0, "
                           "--alibi-window-sinks 1,"), note
    assert note.endswith(f" --model-overrides \"{recorded}\" (load-time options: the "
                         "weights are the same)"), note
    back = AlibiTransformerLanguageModel.from_pretrained(
        str(tmp_path / "back"), "checkpoint.pt", data_name_or_path=str(tmp_path / "back"),
        **recorded).eval()
    with torch.no_grad():
        ours_back = token_log_probs(back.models[0](tokens)[0], tokens)
    assert (ours_back - ours_saved).abs().max().item() < 1e-5
    # an export of the import with the options off records none
    assert hf.export_main([str(tmp_path / "back" / "checkpoint.pt"), "--dict",
                           str(tmp_path / "back" / "dict.txt"), "--bpe", "hf_tokenizer",
                           "--out", str(tmp_path / "hf2")]) == 0
    assert hf.RUN_TIME_KEY not in json.loads((tmp_path / "hf2" / "config.json").read_text())


@needs_shared
def test_greedy_generation_past_the_training_length_is_the_same(exported):
    ckpt, folder = exported
    lm, model = fairseq_lm(ckpt.parent), hf_model(folder)
    prompt = fairseq_ids(wikitext_lines(1)[0], lm.task.dictionary)[:TRAIN_LENGTH + 4]
    new = 64
    hypo = lm.generate([torch.tensor(prompt[1:])], beam=1, sampling=False,
                       max_len_b=len(prompt) - 1 + new, min_len=len(prompt) - 1 + new)[0][0]
    ours = hypo["tokens"][len(prompt) - 1: len(prompt) - 1 + new].tolist()
    with torch.no_grad():  # fairseq's generator never emits <pad>; nor may HF's, then
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new, min_new_tokens=new,
                             do_sample=False, suppress_tokens=[lm.task.dictionary.pad()],
                             pad_token_id=lm.task.dictionary.pad())
    theirs = out[0, len(prompt):].tolist()
    assert len(ours) == new and ours == theirs


@needs_shared
def test_exported_sentencepiece_tokenizer_gives_the_dictionary_ids_including_unknown_pieces(
        tmp_path):
    """The project's sentencepiece pipeline (preprocess/encoders.py) against the exported
    tokenizer, on WikiText-2 test lines and on characters the model never saw (<unk>)."""
    pytest.importorskip("sentencepiece")
    from fairseq_alibi.preprocess.encoders import SentencePieceEncoder, train_sentencepiece

    model = train_sentencepiece(wikitext_lines(2000), tmp_path / "sp", 600, num_threads=1)
    encoder = SentencePieceEncoder(model)
    dictionary = encoder.dictionary
    tokenizer = hf.sentencepiece_tokenizer(Path(model), dictionary)
    hf.write_tokenizer(tmp_path, tokenizer, dictionary)
    loaded = transformers().AutoTokenizer.from_pretrained(str(tmp_path))
    texts = [line.strip() for line in (SHARED_DATA / "wikitext-2" / "wiki.test.tokens").read_text(
        encoding="utf-8").splitlines() if line.strip()][:300]
    texts += ["Über naïve 猫 cat! ☃☃ zebra", "  two  spaces ", "<unk> and </s> <<x>>"]
    for text in texts:
        expected = [dictionary.eos()] + encoder.encode(text).tolist()[:-1]  # </s> first, not last
        assert loaded(text)["input_ids"] == expected, text
    assert dictionary.unk() in loaded(texts[-3])["input_ids"]


def test_gpt2_export_gives_the_dictionary_ids_and_refuses_a_dictionary_lacking_pieces(tmp_path):
    """A tokenizer.json cannot send a BPE piece to <unk> (it merges by id): the dictionary must
    hold every piece, and one that lacks some is refused, naming the fix."""
    from fairseq.data import Dictionary
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    from tests.helpers.corpora import write_tiny_bpe

    bpe_dir = write_tiny_bpe(tmp_path / "bpe")
    encoder = json.loads((bpe_dir / "encoder.json").read_text())
    dictionary = Dictionary()
    for i in sorted(encoder.values(), reverse=True):  # any order: ids are remapped
        dictionary.add_symbol(str(i))
    tokenizer = hf.gpt2_tokenizer(bpe_dir / "encoder.json", bpe_dir / "vocab.bpe", dictionary)
    hf.write_tokenizer(tmp_path, tokenizer, dictionary)
    loaded = transformers().AutoTokenizer.from_pretrained(str(tmp_path))
    bpe = get_encoder(str(bpe_dir / "encoder.json"), str(bpe_dir / "vocab.bpe"))
    for text in ("the cat sat on the mat", "a <unk> zebra </s>", "Über naïve 猫 cat!"):
        line = " ".join(map(str, bpe.encode(text)))
        expected = [dictionary.eos()] + dictionary.encode_line(line, append_eos=False).tolist()
        assert loaded(text)["input_ids"] == expected
    lacking = Dictionary()
    for i in list(encoder.values())[:-3]:
        lacking.add_symbol(str(i))
    with pytest.raises(hf.ConversionError, match="gpt2 dict.txt"):
        hf.gpt2_tokenizer(bpe_dir / "encoder.json", bpe_dir / "vocab.bpe", lacking)


# ---------------------------------------------------------------------------------------------
# import: BLOOM and MPT made offline


def tiny_hf_folder(folder, family, heads, vocab=48, produced=44, seed=0):
    """A tiny BLOOM/MPT (random weights) with a word-level tokenizer of ``produced`` ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    t = transformers()
    torch.manual_seed(seed)
    if family == "bloom":
        config = t.BloomConfig(vocab_size=vocab, hidden_size=4 * heads, n_layer=2, n_head=heads,
                               bos_token_id=1, eos_token_id=2, pad_token_id=3)
        model = t.BloomForCausalLM(config)
        words = ["<unk>", "<s>", "</s>", "<pad>"] + [f"w{i}" for i in range(4, produced)]
        unk = "<unk>"
    else:
        config = t.MptConfig(vocab_size=vocab, d_model=4 * heads, n_layers=2, n_heads=heads,
                             max_seq_len=256, bos_token_id=0, eos_token_id=0)
        model = t.MptForCausalLM(config)
        words = ["<|endoftext|>"] + [f"w{i}" for i in range(1, produced)]
        unk = None
    randomize(model, seed)
    model.save_pretrained(str(folder))
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)},
                                           unk_token=unk or "<|endoftext|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    return model


@pytest.mark.parametrize("family", hf.FAMILIES)
@pytest.mark.parametrize("heads", HEADS)
def test_import_then_export_gives_back_the_hf_weights_and_logits(family, heads, tmp_path):
    from safetensors.torch import load_file

    model = tiny_hf_folder(tmp_path / "hf", family, heads, seed=heads)
    assert hf.import_main([str(tmp_path / "hf"), "--out", str(tmp_path / "fs")]) == 0
    assert hf.export_main([str(tmp_path / "fs" / "checkpoint.pt"), "--dict",
                           str(tmp_path / "fs" / "dict.txt"), "--bpe", "hf_tokenizer",
                           "--out", str(tmp_path / "back")]) == 0
    original = load_file(str(tmp_path / "hf" / "model.safetensors"))
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert original.keys() == back.keys()
    assert all(torch.equal(original[k], back[k]) for k in original)

    lm = fairseq_lm(tmp_path / "fs")
    rows = torch.load(tmp_path / "fs" / "checkpoint.pt",
                      weights_only=False)["extra_state"]["huggingface"]["rows"]
    # no padding in the input: fairseq masks its <pad> (BLOOM's row 3) wherever it is
    first = 4 if family == "bloom" else 0
    hf_ids = torch.randint(first, 44, (3, 70), generator=torch.Generator().manual_seed(heads))
    fs_ids = torch.tensor(rows).argsort()[hf_ids]  # fairseq row of each HF id
    with torch.no_grad():
        theirs = torch.log_softmax(model(hf_ids).logits.double(), -1)[..., rows]
        ours = torch.log_softmax(lm.models[0](fs_ids)[0].double(), -1)
    assert (ours - theirs).abs().max().item() < 1e-5


def test_imported_specials_land_on_fairseq_rows_0_to_3(tmp_path):
    tiny_hf_folder(tmp_path / "bloom", "bloom", 4)
    tiny_hf_folder(tmp_path / "mpt", "mpt", 4)
    rows = {}
    for family in hf.FAMILIES:
        with warnings.catch_warnings(record=True) as noted:  # not hydra's notes on fairseq's
            warnings.simplefilter("always")
            assert hf.import_main([str(tmp_path / family), "--out",
                                   str(tmp_path / f"{family}_fs")]) == 0
        assert not [w for w in noted if "hydra" in f"{w.filename} {w.message}"]
        rows[family] = torch.load(tmp_path / f"{family}_fs" / "checkpoint.pt",
                                  weights_only=False)["extra_state"]["huggingface"]["rows"]
    assert rows["bloom"][:4] == [1, 3, 2, 0]  # <s> <pad> </s> <unk> of BLOOM's tokenizer
    assert rows["mpt"][0:4] == [47, 46, 0, 45]  # </s> = <|endoftext|>, the rest unused rows
    dict_lines = (tmp_path / "mpt_fs" / "dict.txt").read_text().split("\n")
    assert dict_lines[0] == "1 1" and len(dict_lines) - 1 == 48 - 4


# ---------------------------------------------------------------------------------------------
# bad input: one line, nothing written


def test_mpt_settings_transformers_ignores_are_noted_and_the_import_is_transformers(
        tmp_path, capsys):
    tiny_hf_folder(tmp_path / "plain", "mpt", 4)
    config = json.loads((tmp_path / "plain" / "config.json").read_text())
    config["logit_scale"] = "inv_sqrt_d_model"
    config["attn_config"]["attn_uses_sequence_id"] = True
    (tmp_path / "noted").mkdir()
    for name in ("model.safetensors", "tokenizer.json"):
        (tmp_path / "noted" / name).write_bytes((tmp_path / "plain" / name).read_bytes())
    (tmp_path / "noted" / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    for name in ("plain", "noted"):
        assert hf.import_main([str(tmp_path / name), "--out", str(tmp_path / f"{name}_fs")]) == 0
    out = capsys.readouterr().out.splitlines()
    notes = [line for line in out if line.startswith("note:")]
    assert len(notes) == 2 and "logit_scale 'inv_sqrt_d_model'" in notes[0]
    assert "--alibi-document-mask eos" in notes[1]
    plain, noted = (torch.load(tmp_path / f"{name}_fs" / "checkpoint.pt", weights_only=False)
                    ["model"] for name in ("plain", "noted"))
    assert all(torch.equal(plain[k], noted[k]) for k in plain)  # what transformers computes
    for same in (1, 1.0):  # the same logits: no note
        assert hf.import_notes({"model_type": "mpt", "logit_scale": same}) == []


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    import fairseq_alibi  # noqa: F401

    t = transformers()
    cases = {}
    falcon = tmp_path / "falcon"
    falcon.mkdir()
    (falcon / "config.json").write_text(json.dumps({"model_type": "falcon", "alibi": True}))
    cases["falcon"] = ([str(falcon)], "sqrt(head_dim)")
    gpt2 = tmp_path / "gpt2"
    t.GPT2LMHeadModel(t.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=20)).save_pretrained(
        str(gpt2))
    cases["gpt2"] = ([str(gpt2)], "not an ALiBi model")
    no_tokenizer = tmp_path / "no_tokenizer"
    tiny_hf_folder(no_tokenizer, "bloom", 4)
    (no_tokenizer / "tokenizer.json").unlink()
    cases["no tokenizer"] = ([str(no_tokenizer)], "no tokenizer.json")
    truncated = tmp_path / "truncated"
    tiny_hf_folder(truncated, "mpt", 4)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    cases["truncated"] = ([str(truncated)], "truncated or damaged")
    from safetensors.torch import load_file, save_file

    for name, change, message in (
            ("another head", lambda w: w.update({"lm_head.weight": w["transformer.word_embeddings"
                                                                     ".weight"] + 1}),
             "lm_head.weight differs from the input embeddings"),
            ("a wrong shape", lambda w: w.update({"transformer.h.1.mlp.dense_4h_to_h.weight":
                                                  w["transformer.h.1.mlp.dense_4h_to_h.weight"]
                                                  [:, :8].contiguous()}),
             "transformer.h.1.mlp.dense_4h_to_h.weight has shape [16, 8] where config.json's "
             "sizes give [16, 64]")):
        folder = tmp_path / name.replace(" ", "_")
        tiny_hf_folder(folder, "bloom", 4)
        weights = load_file(str(folder / "model.safetensors"))
        change(weights)
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
        cases[name] = ([str(folder)], message)
    capsys.readouterr()  # what saving the folders printed
    for name, (argv, message) in cases.items():
        out = tmp_path / f"out_{name.replace(' ', '_')}"
        assert hf.import_main([*argv, "--out", str(out)]) == 1, name
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, (name, err)
        assert not out.exists() and not list(tmp_path.glob(f".{out.name}.*")), name


@needs_shared
@pytest.mark.parametrize("flags, blocking", [
    (["--arch", "alibi_transformer_lm", "--decoder-ffn-embed-dim", 96,
      "--decoder-input-dim", 24, "--decoder-output-dim", 24,
      "--share-decoder-input-output-embed"], ["--activation-fn relu", "--layernorm-embedding"]),
    (["--arch", "alibi_transformer_lm", "--alibi-learned-scales", "per_head",
      "--decoder-input-dim", 24, "--decoder-output-dim", 24],
     ["--alibi-learned-scales per_head", "--activation-fn relu"]),
    # each option the export needs dropped says what the layout lacks, not another's reason
    (["--arch", "alibi_transformer_lm", "--decoder-input-dim", 24, "--decoder-output-dim", 24,
      "--adaptive-softmax-cutoff", "20,40", "--criterion", "adaptive_loss", "--ddp-backend",
      "legacy_ddp"],
     ["--adaptive-softmax-cutoff 20,40 (needs it dropped: one output layer over the whole "
      "vocabulary there)"]),
    # alibi_bloom keeps a slope scale (a load-time one is valid), with a warning; the advice
    # is to train without it, not to distil into what the model already is
    (["--arch", "alibi_bloom", "--alibi-slope-scale", 0.5], ["--alibi-slope-scale 0.5"]),
])
def test_export_refuses_what_bloom_does_not_compute_naming_every_option(flags, blocking,
                                                                         tmp_path, capsys):
    ckpt = write_fairseq_checkpoint(tmp_path / "fs", 4, arch=flags[1], extra=flags[2:])
    assert export(ckpt, tmp_path / "out") == 1
    err = capsys.readouterr().err.strip()
    fix = ("train it with --arch alibi_bloom without them" if flags[1] == "alibi_bloom"
           else "lm_distillation")
    assert len(err.splitlines()) == 1 and fix in err, err
    assert all(b in err for b in blocking), err
    assert not (tmp_path / "out").exists()


def test_export_refuses_encoders_and_translation_models(tmp_path, capsys):
    from tests.helpers.building import write_dictionary

    for arch, task, what in (("alibi_roberta_base", "masked_lm", "encoder"),
                             ("alibi_transformer_iwslt_de_en", "translation", "encoder-decoder")):
        state = {"model": {}, "cfg": {"model": {"_name": arch, "arch": arch}},
                 "extra_state": {}, "optimizer_history": [
                     {"criterion_name": "x", "optimizer_name": "x", "num_updates": 0,
                      "lr_scheduler_state": {"best": None}}]}
        path = tmp_path / f"{task}.pt"
        torch.save(state, path)
        write_dictionary(tmp_path, 8)
        assert hf.export_main([str(path), "--dict", str(tmp_path / "dict.txt"),
                               "--out", str(tmp_path / task)]) == 1
        err = capsys.readouterr().err.strip()
        assert what in err and "no core transformers class" in err and len(err.splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# fairseq's command lines on exported and imported models (slow)


def binarize(folder, lines, encode, dict_path):
    """``fairseq-preprocess`` of ``lines`` encoded by ``encode`` (text -> space-separated ids)."""
    raw = folder / "test.bpe"
    raw.write_text("".join(encode(line) + "\n" for line in lines))
    run_cli("fairseq-preprocess", "--only-source", "--srcdict", dict_path, "--testpref", raw,
            "--destdir", folder / "bin", "--workers", 1)
    return folder / "bin"


def eval_lm(data, ckpt, user_dir, length):
    out = run_cli("fairseq-eval-lm", data, "--path", ckpt, "--user-dir", user_dir, "--cpu",
                  "--gen-subset", "test", "--tokens-per-sample", length, "--max-tokens", 4096,
                  "--sample-break-mode", "none", "--num-workers", 0)
    import re

    tokens = int(re.search(r"Evaluated ([\d,]+) tokens", out).group(1).replace(",", ""))
    loss2 = float(re.search(r"Loss \(base 2\): ([\d.]+)", out).group(1))
    return tokens, loss2


def hf_blocks_loss(model, stream, length, eos):
    """fairseq's LM blocks of ``stream`` (each scored alone, input shifted by one, the first
    block's input starting with </s>), scored by the HF model: ``(tokens, base-2 loss)``."""
    total, count = 0.0, 0
    for start in range(0, len(stream), length):
        target = stream[start: start + length]
        source = ([eos] + stream[: len(target) - 1]) if start == 0 else \
            stream[start - 1: start - 1 + len(target)]
        with torch.no_grad():
            logits = model(torch.tensor([source])).logits.double()
        total -= torch.log_softmax(logits, -1)[0].gather(
            -1, torch.tensor(target)[:, None]).sum().item()
        count += len(target)
    return count, total / count / math.log(2)


@pytest.mark.slow
@needs_shared
def test_eval_lm_perplexity_equals_the_exported_models(tmp_path, alibi_user_dir):
    from fairseq.data import Dictionary

    ckpt = write_fairseq_checkpoint(tmp_path / "fs", 6)
    assert export(ckpt, tmp_path / "hf") == 0
    tokenizer = transformers().AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    dictionary = Dictionary.load(str(ckpt.parent / "dict.txt"))
    lines = wikitext_lines(12)
    data = binarize(tmp_path, lines, lambda t: " ".join(
        dictionary[i] for i in tokenizer(t, add_special_tokens=False)["input_ids"]),
        ckpt.parent / "dict.txt")
    length = 4 * TRAIN_LENGTH
    tokens, loss = eval_lm(data, ckpt, alibi_user_dir, length)
    stream = [i for t in lines for i in tokenizer(t, add_special_tokens=False)["input_ids"]
              + [dictionary.eos()]]
    hf_tokens, hf_loss = hf_blocks_loss(hf_model(tmp_path / "hf"), stream, length,
                                        dictionary.eos())
    assert tokens == hf_tokens == len(stream)
    assert abs(loss - hf_loss) < 1e-4  # eval-lm prints 4 decimals


@pytest.mark.slow
@pytest.mark.parametrize("family", hf.FAMILIES)
def test_fairseq_tools_run_on_an_import(family, tmp_path, alibi_user_dir, capsys):
    """eval-lm equals transformers' perplexity (same blocks, same token count); the windows
    check, interactive with its cutoff and train --finetune-from-model run on the imported
    folder as it is, and the fine-tuned BLOOM exports back (a fine-tuned MPT has learned
    biases: refused)."""
    from fairseq.data import Dictionary

    model = tiny_hf_folder(tmp_path / "hf", family, 6)
    fs = tmp_path / "fs"
    assert hf.import_main([str(tmp_path / "hf"), "--out", str(fs)]) == 0
    rng = torch.Generator().manual_seed(0)
    lines = [" ".join(f"w{int(i)}" for i in torch.randint(4, 44, (20,), generator=rng))
             for _ in range(10)]
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(fs / "tokenizer.json"))
    data = binarize(tmp_path, lines, lambda t: " ".join(map(str, tokenizer.encode(t).ids)),
                    fs / "dict.txt")
    shutil.copy(fs / "dict.txt", data / "dict.txt")
    tokens, loss = eval_lm(data, fs / "checkpoint.pt", alibi_user_dir, 64)
    dictionary = Dictionary.load(str(fs / "dict.txt"))
    rows = torch.load(fs / "checkpoint.pt", weights_only=False)["extra_state"]["huggingface"]["rows"]
    eos_hf = rows[dictionary.eos()]
    stream = [i for t in lines for i in tokenizer.encode(t).ids + [eos_hf]]
    hf_tokens, hf_loss = hf_blocks_loss(model, stream, 64, eos_hf)
    assert tokens == hf_tokens and abs(loss - hf_loss) < 1e-4

    # the check before turning windows on reads the import as it is and writes nothing there;
    # generation then runs with the cutoff it recommends, as a load-time override
    from fairseq_alibi.cli.windows_check import main as windows_main

    before = (fs / "checkpoint.pt").read_bytes()
    assert windows_main([str(fs / "checkpoint.pt"), str(data), "--gen-subset", "test", "--cpu",
                         "--out", str(tmp_path / "windows")]) == 0
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert verdict.startswith("recommended: --alibi-window-cutoff "), verdict
    assert (fs / "checkpoint.pt").read_bytes() == before
    cutoff = float(verdict.split()[2])
    interactive = subprocess.run(
        [str(BIN / "fairseq-interactive"), str(data), "--user-dir", alibi_user_dir, "--task",
         "language_modeling", "--path", str(fs / "checkpoint.pt"), "--bpe", "hf_tokenizer",
         "--hf-tokenizer", str(fs / "tokenizer.json"), "--beam", "1", "--max-len-b", "80",
         "--model-overrides", str({"alibi_window_cutoff": cutoff}),
         "--cpu"], input="w5 w6 w7\n", capture_output=True, text=True, timeout=600,
        env=child_env())
    assert interactive.returncode == 0, interactive.stderr[-2000:]
    hypothesis = [line for line in interactive.stdout.splitlines() if line.startswith("D-0")]
    assert hypothesis and hypothesis[0].split("\t")[2].startswith("w5 w6 w7")

    (data / "train.bin").symlink_to(data / "test.bin")
    (data / "train.idx").symlink_to(data / "test.idx")
    out = run_cli("fairseq-train", data, "--user-dir", alibi_user_dir, "--task",
                  "language_modeling", "--arch", "alibi_bloom" if family == "bloom" else
                  "alibi_transformer_lm", "--finetune-from-model", fs / "checkpoint.pt",
                  *hf.import_options(json.loads((tmp_path / "hf" / "config.json").read_text()))[3][2:],
                  "--optimizer", "adam", "--lr", 1e-4, "--max-update", 2, "--max-tokens", 128,
                  "--cpu", "--save-dir", tmp_path / "ft", "--disable-validation",
                  "--no-progress-bar", "--num-workers", 0, "--tokens-per-sample", 32)
    assert (tmp_path / "ft" / "checkpoint_last.pt").is_file(), out[-2000:]
    # the fine-tuned BLOOM exports with the import's tokenizer (rows found beside it); a
    # fine-tuned MPT has learned the biases MPT does not have, and is refused, saying so
    exported_ok = hf.export_main([
        str(tmp_path / "ft" / "checkpoint_last.pt"), "--dict", str(fs / "dict.txt"), "--bpe",
        "hf_tokenizer", "--hf-tokenizer", str(fs / "tokenizer.json"), "--out",
        str(tmp_path / "ft_hf")])
    if family == "mpt":
        assert exported_ok == 1 and not (tmp_path / "ft_hf").exists()
        return
    assert exported_ok == 0
    shutil.copy(fs / "dict.txt", tmp_path / "ft" / "dict.txt")
    tuned = fairseq_lm(tmp_path / "ft", "checkpoint_last.pt")
    exported_tuned = transformers().AutoModelForCausalLM.from_pretrained(str(tmp_path / "ft_hf"))
    exported_tuned.eval()
    hf_ids = torch.tensor([stream[:40]])
    fs_ids = torch.tensor(rows).argsort()[hf_ids]
    with torch.no_grad():
        theirs = torch.log_softmax(exported_tuned(hf_ids).logits.double(), -1)[..., rows]
        ours = torch.log_softmax(tuned.models[0](fs_ids)[0].double(), -1)
    assert (ours - theirs).abs().max().item() < 1e-5


@needs_shared
def test_export_refuses_a_missing_tokenizer_file_or_dictionary(tmp_path, capsys):
    ckpt = write_fairseq_checkpoint(tmp_path / "fs", 4)
    capsys.readouterr()
    assert hf.export_main([str(ckpt), "--dict", str(ckpt.parent / "dict.txt"),
                           "--gpt2-encoder-json", str(tmp_path / "absent.json"),
                           "--gpt2-vocab-bpe", str(GPT2 / "vocab.bpe"),
                           "--out", str(tmp_path / "a")]) == 1
    assert hf.export_main([str(ckpt), "--dict", str(tmp_path / "absent.txt"),
                           "--out", str(tmp_path / "b")]) == 1
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2
    assert "--gpt2-encoder-json" in errors[0] and "dict.txt" in errors[1]
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_export_refuses_a_dict_or_tokenizer_of_another_import(tmp_path, capsys):
    """Two imports of the same vocabulary size: each one's dict.txt and tokenizer fit the other
    by size, but map its rows to other ids. Old imports (no recorded fingerprint) are checked
    against the tokenizer.json import-hf copied beside the checkpoint."""
    for family in hf.FAMILIES:
        tiny_hf_folder(tmp_path / family, family, 4)
        out = tmp_path / f"{family}_fs"
        assert hf.import_main([str(tmp_path / family), "--out", str(out)]) == 0
    fs, other = tmp_path / "mpt_fs", tmp_path / "bloom_fs"

    def export_mpt(dict_path, tokenizer, out):
        return hf.export_main([str(fs / "checkpoint.pt"), "--dict", str(dict_path), "--bpe",
                               "hf_tokenizer", "--hf-tokenizer", str(tokenizer), "--out", str(out)])

    capsys.readouterr()
    cases = {"dict": (other / "dict.txt", fs / "tokenizer.json", "--dict"),
             "import": (fs / "dict.txt", other / "tokenizer.json", "belongs to another import"),
             "hf": (fs / "dict.txt", tmp_path / "bloom" / "tokenizer.json", "not the tokenizer")}
    for name, (dict_path, tokenizer, message) in cases.items():
        assert export_mpt(dict_path, tokenizer, tmp_path / name) == 1, name
        err = capsys.readouterr().err.strip()
        assert message in err and "import-hf wrote" in err and len(err.splitlines()) == 1, err
        assert not (tmp_path / name).exists()
    # the model's own tokenizer, from the folder it was imported from, is the same tokenizer
    assert export_mpt(fs / "dict.txt", tmp_path / "mpt" / "tokenizer.json", tmp_path / "own") == 0

    state = torch.load(fs / "checkpoint.pt", weights_only=False)
    del state["extra_state"]["huggingface"]["tokenizer_sha256"]
    torch.save(state, fs / "checkpoint.pt")
    record = json.loads((fs / "huggingface.json").read_text())
    del record["tokenizer_sha256"]
    (fs / "huggingface.json").write_text(json.dumps(record))
    capsys.readouterr()
    assert export_mpt(fs / "dict.txt", tmp_path / "bloom" / "tokenizer.json", tmp_path / "old") == 1
    assert "not the tokenizer" in capsys.readouterr().err and not (tmp_path / "old").exists()


def test_damaged_files_and_a_file_as_out_are_one_line_and_write_nothing(tmp_path, capsys):
    folder = tmp_path / "hf"
    tiny_hf_folder(folder, "bloom", 4)
    assert hf.import_main([str(folder), "--out", str(tmp_path / "fs")]) == 0
    ckpt = tmp_path / "fs" / "checkpoint.pt"
    before = ckpt.read_bytes()
    damaged = {}
    for name in ("tokenizer.json", "config.json"):
        damaged[name] = tmp_path / f"bad_{name}"
        shutil.copytree(folder, damaged[name])
        (damaged[name] / name).write_text("{not json")
    capsys.readouterr()
    runs = [
        (lambda out: hf.import_main([str(damaged["tokenizer.json"]), "--out", str(out)]),
         "tokenizer.json as a tokenizer.json"),
        (lambda out: hf.import_main([str(damaged["config.json"]), "--out", str(out)]),
         "config.json as JSON"),
        (lambda out: hf.import_main([str(folder), "--out", str(ckpt)]), "is a file"),
        (lambda out: hf.export_main([str(ckpt), "--dict", str(ckpt.parent / "dict.txt"),
                                     "--bpe", "hf_tokenizer", "--out", str(ckpt)]), "is a file"),
    ]
    for i, (run, message) in enumerate(runs):
        out = tmp_path / f"out{i}"
        assert run(out) == 1, message
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
        assert not out.exists() and not list(tmp_path.glob(f".out{i}.*"))
    assert ckpt.read_bytes() == before and not list(ckpt.parent.glob(".checkpoint.pt*"))


def test_import_names_the_fix_for_no_pad_row_and_for_no_such_folder(tmp_path, capsys):
    """BloomConfig() saves "pad_token_id": null; with a tokenizer of every row, fairseq's <pad>
    has no row: the error says which config.json key to set, and to what. A folder that is not
    there is said so (it had been "no config.json in ...")."""
    folder = tmp_path / "hf"
    tiny_hf_folder(folder, "bloom", 4, vocab=48, produced=48)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "pad_token_id": None}))
    capsys.readouterr()
    runs = [(folder, "config.json sets no pad_token_id"),
            (folder, "set pad_token_id in config.json to the id of a token that text never "
                     "encodes to, e.g. the tokenizer's padding token <pad> (3)"),
            (tmp_path / "nofolder", f"no folder {tmp_path / 'nofolder'}: give the local folder"),
            (folder / "config.json", "is a file: give the folder that holds it")]
    for given, message in runs:
        assert hf.import_main([str(given), "--out", str(tmp_path / "fs")]) == 1
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
        assert not (tmp_path / "fs").exists()
    (folder / "config.json").write_text(json.dumps({**config, "pad_token_id": 3}))  # the fix
    assert hf.import_main([str(folder), "--out", str(tmp_path / "fs")]) == 0


def test_import_refuses_a_tokenizer_bigger_than_the_model_naming_both_sizes(tmp_path, capsys):
    tiny_hf_folder(tmp_path / "hf", "mpt", 4, vocab=48, produced=60)
    capsys.readouterr()
    assert hf.import_main([str(tmp_path / "hf"), "--out", str(tmp_path / "fs")]) == 1
    err = capsys.readouterr().err.strip()
    assert "has 60 ids, the model 48 embedding rows" in err and "do not match" in err, err
    assert len(err.splitlines()) == 1 and not (tmp_path / "fs").exists()


def test_a_run_time_record_that_is_not_a_mapping_is_said():
    """A config.json whose record of the options left out is damaged (not a mapping) gets a
    note saying they are unknown, not silence or a traceback."""
    assert hf.import_notes({"model_type": "bloom", hf.RUN_TIME_KEY: ["alibi_window_cutoff"]}) \
        == [f"note: config.json's {hf.RUN_TIME_KEY} is not a mapping of options (list): the "
            "options it was exported without are unknown"]
    assert hf.import_notes({"model_type": "bloom"}) == []
