"""The hub (``from_pretrained``) given what it cannot use as is (docs/reliability.md, catalogue of
bad inputs): no local GPT-2 BPE files offline, a stock checkpoint, a text longer than the
training run's ``--max-tokens``.

``# row N`` marks a row of issue 12 (what an experienced fairseq user hit on first contact).
Tests that run a separate Python process are marked ``slow``.
"""

import re
import shutil

import numpy
import pytest
import torch

from fairseq_alibi.error_hints import OneLineError
from tests.helpers.checkpoints import saved_in_process
from tests.helpers.cli import REPO, SHARED_DATA, last_line
from tests.helpers.corpora import write_tiny_bpe
from tests.helpers.training import MODELS, STOCK


@pytest.fixture
def no_network(monkeypatch):
    """Fail the test if fairseq tries to download anything (its GPT-2 BPE defaults are URLs)."""
    from fairseq import file_utils

    def refuse(url, *args, **kwargs):
        raise AssertionError(f"tried to download {url}")

    monkeypatch.setattr(file_utils, "get_from_cache", refuse)
    monkeypatch.setattr(file_utils, "cached_path_from_pm", refuse)


# row 1: hub, offline GPT-2 BPE


@pytest.mark.parametrize("where", ["checkpoint folder", "data folder", "shared gpt2_bpe"])
def test_hub_finds_the_gpt2_bpe_files_offline(where, tiny_lm_data, tmp_path, no_network):
    """The stock idiom, no BPE arguments: encoder.json + vocab.bpe beside the checkpoint or in
    the data folder are used, and nothing is downloaded."""
    from fairseq_alibi.models.alibi_roberta import AlibiRobertaModel

    checkpoint = saved_in_process(tmp_path / "ckpt" / "model.pt", tiny_lm_data,
                                  *MODELS["encoder"])
    data = tmp_path / "data"
    shutil.copytree(tiny_lm_data, data)
    if where == "shared gpt2_bpe":
        source = SHARED_DATA / "gpt2_bpe"
        if not (source / "encoder.json").is_file():
            pytest.skip("no shared GPT-2 BPE files (../shared/data/gpt2_bpe)")
        for name in ("encoder.json", "vocab.bpe"):
            shutil.copy(source / name, checkpoint.parent / name)
    else:
        write_tiny_bpe(checkpoint.parent if where == "checkpoint folder" else data)
    roberta = AlibiRobertaModel.from_pretrained(str(checkpoint.parent), "model.pt", str(data))
    assert roberta.cfg.bpe._name == "gpt2"
    assert roberta.cfg.bpe.gpt2_encoder_json.endswith("encoder.json")
    assert not roberta.cfg.bpe.gpt2_encoder_json.startswith("http")
    tokens = roberta.encode("the cat sat")
    assert tokens[0].item() == 0 and tokens[-1].item() == 2 and len(tokens) > 2
    assert roberta.extract_features(tokens).shape[:2] == (1, len(tokens))


def test_hub_without_gpt2_bpe_files_is_a_one_line_error(tiny_lm_data, tmp_path, no_network):
    from fairseq_alibi.models.alibi_roberta import AlibiRobertaModel

    checkpoint = saved_in_process(tmp_path / "ckpt" / "model.pt", tiny_lm_data,
                                  *MODELS["encoder"])
    with pytest.raises(ValueError) as error:
        AlibiRobertaModel.from_pretrained(str(checkpoint.parent), "model.pt", str(tiny_lm_data))
    message = str(error.value)
    assert "\n" not in message
    for needed in ("encoder.json", "vocab.bpe", "gpt2_encoder_json=", "gpt2_vocab_bpe=",
                   str(checkpoint.parent)):
        assert needed in message
    bpe = write_tiny_bpe(tmp_path / "elsewhere")  # the arguments the message names work
    AlibiRobertaModel.from_pretrained(
        str(checkpoint.parent), "model.pt", str(tiny_lm_data),
        gpt2_encoder_json=str(bpe / "encoder.json"), gpt2_vocab_bpe=str(bpe / "vocab.bpe"))


# row 5: from_pretrained on a stock checkpoint


HUB_CASES = {  # model -> (hub class, the stock class the checkpoint builds)
    "lm": ("alibi_transformer_lm.AlibiTransformerLanguageModel", "TransformerLanguageModel"),
    "encoder": ("alibi_roberta.AlibiRobertaModel", "RobertaModel"),
    "translation": ("alibi_transformer.AlibiTransformerModel", "TransformerModel"),
}


def stock_hub_checkpoint(model, tiny_lm_data, folder):
    """``(checkpoint, data dir)``: an untrained stock model of the kind, beside BPE files."""
    data = tiny_lm_data
    flags = STOCK.get(model)
    if model == "translation":  # the translation task only reads the two dictionaries here
        data = folder / "data"
        data.mkdir(parents=True)
        for side in ("src", "tgt"):
            shutil.copy(tiny_lm_data / "dict.txt", data / f"dict.{side}.txt")
        flags = ["--task", "translation", "--source-lang", "src", "--target-lang", "tgt",
                 "--arch", "transformer", "--encoder-layers", 1, "--decoder-layers", 1,
                 "--encoder-embed-dim", 16, "--decoder-embed-dim", 16,
                 "--encoder-ffn-embed-dim", 32, "--decoder-ffn-embed-dim", 32,
                 "--encoder-attention-heads", 2, "--decoder-attention-heads", 2]
    checkpoint = saved_in_process(folder / "ckpt" / "model.pt", data, *flags)
    write_tiny_bpe(checkpoint.parent)
    return checkpoint, data


@pytest.mark.parametrize("model", list(HUB_CASES))
def test_from_pretrained_refuses_a_stock_checkpoint(model, tiny_lm_data, tmp_path, no_network):
    import importlib

    from fairseq_alibi.hub import WrongCheckpointError

    checkpoint, data = stock_hub_checkpoint(model, tiny_lm_data, tmp_path)
    module, hub_name = HUB_CASES[model][0].rsplit(".", 1)
    hub_class = getattr(importlib.import_module(f"fairseq_alibi.models.{module}"), hub_name)
    built = HUB_CASES[model][1]
    with pytest.raises(WrongCheckpointError, match=rf"holds a {built}, not an alibi_\w+ model "
                                                   rf".*load it with {built}.from_pretrained"):
        hub_class.from_pretrained(str(checkpoint.parent), checkpoint.name, str(data))


def test_an_uncaught_refusal_is_printed_as_one_line(capsys):
    """The package's excepthook (and IPython's ``_render_traceback_``) show the message alone."""
    import sys

    from fairseq_alibi.hub import WrongCheckpointError

    try:
        raise WrongCheckpointError("x.pt holds a TransformerModel, not ...: load it with ...")
    except WrongCheckpointError as refused:
        sys.excepthook(type(refused), refused, refused.__traceback__)
        rendered = refused._render_traceback_()
    expected = "WrongCheckpointError: x.pt holds a TransformerModel, not ...: load it with ..."
    assert capsys.readouterr().err == expected + "\n"
    assert rendered == [expected]


@pytest.mark.slow
@pytest.mark.parametrize("model", list(HUB_CASES))
def test_from_pretrained_stock_checkpoint_error_is_one_line(model, tiny_lm_data, tmp_path):
    """What a user sees running a script: the fix as one line, no traceback."""
    import subprocess
    import sys

    checkpoint, data = stock_hub_checkpoint(model, tiny_lm_data, tmp_path)
    module, hub_name = HUB_CASES[model][0].rsplit(".", 1)
    code = (f"from fairseq_alibi.models.{module} import {hub_name}\n"
            f"{hub_name}.from_pretrained({str(checkpoint.parent)!r}, 'model.pt', {str(data)!r})")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=str(REPO))
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert last_line(proc.stderr).startswith(
        f"WrongCheckpointError: {checkpoint} holds a {HUB_CASES[model][1]}, not an alibi_")


# row 7: scoring any length through the hub


def test_hub_scores_3000_words_with_the_training_max_tokens(tiny_lm_data, tmp_path):
    """The checkpoint's --max-tokens is 128; the stock hub asserted on anything longer."""
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel

    checkpoint = saved_in_process(tmp_path / "model.pt", tiny_lm_data, *MODELS["lm"])
    lm = AlibiTransformerLanguageModel.from_pretrained(str(tmp_path), checkpoint.name,
                                                       data_name_or_path=str(tiny_lm_data))
    assert lm.cfg.dataset.max_tokens == 128
    words = " ".join(f"w{(7 * i) % 60}" for i in range(3000))
    long, short = lm.score([words, "w1 w2 w3"])
    assert long["positional_scores"].numel() == 3000
    assert short["positional_scores"].numel() == 3
    assert torch.isfinite(long["positional_scores"]).all()
    assert lm.cfg.dataset.max_tokens == 128  # the setting is left as it was


def test_a_missing_checkpoint_and_model_overrides(tiny_lm_data, tmp_path, no_network):
    """A checkpoint or data folder that is not there is one line naming it (fairseq's loader
    had failed with a TypeError); ``model_overrides``, as the command lines take it, overrides the options (it
    had been taken for an option of that name and ignored: a dense model came back)."""
    from fairseq_alibi.hub import HubArgumentError
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel as LM

    checkpoint = saved_in_process(tmp_path / "ckpt" / "model.pt", tiny_lm_data, *MODELS["lm"])
    for folder, name, said in ((tmp_path / "nowhere", "model.pt", "(no folder "),
                               (checkpoint.parent, "model.pt:other.pt", "other.pt:")):
        with pytest.raises(HubArgumentError, match=r"no checkpoint at .*" + re.escape(said)):
            LM.from_pretrained(str(folder), name, str(tiny_lm_data))
    with pytest.raises(HubArgumentError, match=r"no data folder .*nodata: from_pretrained's "
                       "third argument"):
        LM.from_pretrained(str(checkpoint.parent), "model.pt", str(tmp_path / "nodata"))
    # an empty, truncated or text file: the line the command lines print, raised (a notebook's
    # try/except saw a bare EOFError, torch's zip error or KeyError)
    (checkpoint.parent / "empty.pt").write_bytes(b"")
    (checkpoint.parent / "cut.pt").write_bytes(checkpoint.read_bytes()[:3000])
    (checkpoint.parent / "text.pt").write_text("hello\n")
    for name, said in (("empty.pt", "is empty (0 bytes)"), ("cut.pt", "truncated or corrupt"),
                       ("text.pt", "it is a text file, not a torch file")):
        with pytest.raises(HubArgumentError, match=re.escape(said)):
            LM.from_pretrained(str(checkpoint.parent), name, str(tiny_lm_data))
    for given in ("{'alibi_window_cutoff': 8}", {"alibi_window_cutoff": 8}):
        lm = LM.from_pretrained(str(checkpoint.parent), "model.pt", str(tiny_lm_data),
                                model_overrides=given)
        assert lm.models[0].decoder.layers[0].self_attn.alibi.stack.window_cutoff == 8
    for given, said in (("alibi_window_cutoff=8", "is not a dict of option names"),
                        ("{'alibi_window_cutoff': 8}", "given twice with different values")):
        with pytest.raises(HubArgumentError, match=said):
            LM.from_pretrained(str(checkpoint.parent), "model.pt", str(tiny_lm_data),
                               model_overrides=given, alibi_window_cutoff=6)
    # a misspelt keyword is named as what it was given as
    with pytest.raises(OneLineError, match="unknown ALiBi option 'alibi_window_cutof' in "
                       "from_pretrained's keyword arguments \\(did you mean"):
        LM.from_pretrained(str(checkpoint.parent), "model.pt", str(tiny_lm_data),
                           alibi_window_cutof=6)
    with pytest.raises(OneLineError, match="unknown ALiBi option 'alibi_window_cutof' in "
                       "from_pretrained's keyword arguments or model_overrides"):
        LM.from_pretrained(str(checkpoint.parent), "model.pt", str(tiny_lm_data),
                           model_overrides="{'alibi_window_cutof': 6}")


def test_a_dictionary_of_sentencepiece_pieces_without_a_bpe_is_warned(tiny_lm_data, tmp_path,
                                                                     caplog):
    """The pipelines binarize with sentencepiece themselves, so such a checkpoint names no BPE:
    from_pretrained without one read text word by word, nearly all <unk>, without a word."""
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel as LM

    data = tmp_path / "pieces"
    data.mkdir()
    words = [w for w in (tiny_lm_data / "dict.txt").read_text().split() if not w.isdigit()]
    (data / "dict.txt").write_text("".join(f"\u2581{w} 1\n" for w in words))
    checkpoint = saved_in_process(tmp_path / "ckpt" / "model.pt", data, *MODELS["lm"])
    with caplog.at_level("WARNING", logger="fairseq_alibi.hub"):
        LM.from_pretrained(str(checkpoint.parent), "model.pt", str(data))
    assert "pass bpe='sentencepiece', sentencepiece_model=" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="fairseq_alibi.hub"):  # words: nothing to say
        LM.from_pretrained(str(checkpoint.parent), "model.pt", str(tiny_lm_data))
    assert "sentencepiece" not in caplog.text


def test_a_length_limit_that_leaves_no_room_after_the_prompt(tiny_lm_data, tmp_path):
    """For a language model max_len_b counts the prompt: stock fairseq returned the prompt cut
    to max_len_b tokens, generating nothing; one line saying so, and max_len_b = P + N
    generates N tokens."""
    from fairseq_alibi.hub import HubArgumentError
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel as LM

    checkpoint = saved_in_process(tmp_path / "ckpt" / "model.pt", tiny_lm_data, *MODELS["lm"])
    lm = LM.from_pretrained(str(checkpoint.parent), "model.pt", str(tiny_lm_data)).eval()
    prompt = torch.randint(4, 20, (12,))
    with pytest.raises(HubArgumentError, match="max_len_b=10 leaves no room after the 12-token "
                       "prompt.*give max_len_b=12 \\+ N"):
        lm.generate([prompt, prompt[:5]], beam=1, max_len_b=10)
    out = lm.generate(prompt, beam=1, max_len_b=12 + 3, min_len=15)
    assert len(out[0]["tokens"]) == 12 + 3 + 1  # the prompt, 3 tokens and </s>


def test_an_empty_sentence_is_refused_by_score(tiny_lm_data, tmp_path):
    """``score("")`` has no token to score: stock fairseq returned a NaN mean; one line naming
    the sentence instead, and the others still score."""
    from fairseq_alibi.hub import HubArgumentError
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel as LM

    checkpoint = saved_in_process(tmp_path / "ckpt" / "model.pt", tiny_lm_data, *MODELS["lm"])
    lm = LM.from_pretrained(str(checkpoint.parent), "model.pt", str(tiny_lm_data)).eval()
    word = lm.src_dict[5]
    with pytest.raises(HubArgumentError, match="sentence 1 is empty: it has no token to score"):
        lm.score([word, " "])
    scored = lm.score(f"{word} {word}")
    assert len(scored["positional_scores"]) == 2 and torch.isfinite(scored["score"])


@pytest.mark.parametrize("beam", [0, -1, 2.5])
def test_a_beam_below_one_is_refused(beam, tiny_lm_data, tmp_path):
    """Stock fairseq failed with a reshape error deep in the search (``beam=0``)."""
    from fairseq_alibi.hub import HubArgumentError
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel as LM

    checkpoint = saved_in_process(tmp_path / "ckpt" / "model.pt", tiny_lm_data, *MODELS["lm"])
    lm = LM.from_pretrained(str(checkpoint.parent), "model.pt", str(tiny_lm_data)).eval()
    with pytest.raises(HubArgumentError, match=f"beam={beam}: .* at least 1"):
        lm.sample(lm.src_dict[5], beam=beam, max_len_b=4)
    assert lm.generate(torch.tensor([5, 6]), numpy.int64(2), max_len_b=4)[0]["tokens"].numel()


def test_a_translation_source_longer_than_max_len_b_is_translated():
    """The limit counts a translation's target tokens only: the LM's refusal above must not
    reach the translation hub (the same interface class), whatever the source's length."""
    from fairseq_alibi.models.alibi_transformer import AlibiTransformerModel

    saved = REPO / "tests" / "fixtures" / "saved_models"
    hub = AlibiTransformerModel.from_pretrained(str(saved / "translation_pointer"),
                                                "checkpoint.pt", str(saved)).eval()
    source = torch.tensor([hub.src_dict.index(f"w{i % 28}") for i in range(40)] + [2])
    out = hub.generate(source, beam=1, max_len_a=0, max_len_b=5)
    assert 1 <= len(out[0]["tokens"]) <= 6


def test_a_prompt_with_an_inner_boundary_is_refused(tiny_lm_data, tmp_path):
    """fairseq's generator ends a hypothesis at a </s> of its prompt: the hub returned the text
    before it and read nothing after it. One line instead; with a document mask, the last
    document alone is what generates the same; </s> at a prompt's ends is stripped as before."""
    from fairseq_alibi.hub import HubArgumentError
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel as LM

    checkpoint = saved_in_process(tmp_path / "ckpt" / "model.pt", tiny_lm_data, *MODELS["lm"],
                                  "--alibi-document-mask", "doc")
    lm = LM.from_pretrained(str(checkpoint.parent), "model.pt", str(tiny_lm_data)).eval()
    eos = lm.src_dict.eos()
    words = torch.randint(4, 20, (6,))
    boundary = torch.cat([words[:3], torch.tensor([eos, eos]), words[3:], torch.tensor([eos])])
    with pytest.raises(HubArgumentError, match="prompt 1 holds </s> between its tokens.*give "
                                               "the last document alone"):
        lm.generate([words, boundary], beam=1, max_len_b=20)
    line = torch.cat([words[:3], torch.tensor([eos]), words[3:]])  # one line end: no boundary
    with pytest.raises(HubArgumentError, match="give text without </s> \\(one line\\)"):
        lm.generate(line, beam=1, max_len_b=20)
    ends = torch.cat([torch.tensor([eos]), words, torch.tensor([eos, eos])])
    out = lm.generate(ends, beam=1, max_len_b=12, min_len=12)[0]["tokens"]
    assert torch.equal(out[:6], words) and len(out) > 7  # the words, then generated tokens


def test_a_checkpoint_whose_task_reads_other_files_is_named(tmp_path):
    """fairseq's loader fails on the files the checkpoint's task reads (a language model's
    dict.txt in a translation folder): the one line says what the checkpoint holds, or which
    of its task's files the data folder lacks (before: a bare FileNotFoundError)."""
    from fairseq_alibi.hub import HubArgumentError, WrongCheckpointError
    from fairseq_alibi.models.alibi_transformer import AlibiTransformerModel
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel

    saved = REPO / "tests" / "fixtures" / "saved_models"
    pairs = tmp_path / "pairs"  # a translation folder: no dict.txt
    pairs.mkdir()
    for side in ("src", "tgt"):
        shutil.copy(saved / f"dict.{side}.txt", pairs)
    lm = saved / "lm_fixed_slopes"
    with pytest.raises(WrongCheckpointError, match=r"holds an AlibiTransformerLanguageModel "
                       r"\(alibi_transformer_lm\), not an alibi_transformer model"):
        AlibiTransformerModel.from_pretrained(str(lm), "checkpoint.pt", str(pairs),
                                              source_lang="src", target_lang="tgt")
    with pytest.raises(HubArgumentError, match=r"trained with the task language_modeling, "
                       r"which reads .*dict.txt, not in .*pairs: give data_name_or_path"):
        AlibiTransformerLanguageModel.from_pretrained(str(lm), "checkpoint.pt", str(pairs))
