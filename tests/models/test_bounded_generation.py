"""Generation in bounded memory through the language model: with slope windows
(``--alibi-window-cutoff``, or the load-time override of a trained model) every layer's KV
cache stays at its bound while the decoder generates far past the training length, and the
outputs are those of the full forward with the same cutoff: step by step, through fairseq's
beam search (which reorders the cache every step), and through the real tools
(``fairseq-interactive`` and the hub's ``sample`` of a trained model: the generated tokens are
the greedy choices of one full forward over them)."""

import re
import subprocess
import sys

import pytest
import torch

from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention
from tests.helpers.cli import BIN, child_env
from tests.helpers.building import build_model

#: 4 heads, slopes 1/4 … 1/256: windows 2, 8, 32, 128 keys; 500 tokens roll every layer's
#: buffer (about 2·128 positions) several times
CUTOFF, LENGTH, REACH = 0.5, 500, 128


@pytest.fixture(scope="module")
def windowed_lm(tiny_lm_data):
    torch.manual_seed(0)
    model, task = build_model("lm", tiny_lm_data, "--alibi-window-cutoff", str(CUTOFF))
    return model.eval(), task


def caches(model, state):
    """Every ALiBi layer's cached keys ``(B, H, S, D)`` in ``state``."""
    return [m._get_input_buffer(state)["prev_key"] for m in model.modules()
            if isinstance(m, AlibiMultiheadAttention)]


def test_token_by_token_decoding_stays_bounded_and_equals_the_full_forward(windowed_lm):
    model, task = windowed_lm
    torch.manual_seed(1)
    tokens = torch.randint(4, len(task.dictionary), (2, LENGTH))  # 31x the training length
    state, steps, longest = {}, [], 0
    with torch.no_grad():
        full = model(tokens)[0]
        for t in range(LENGTH):
            steps.append(model.decoder(tokens[:, :t + 1], incremental_state=state)[0][:, -1])
            longest = max([longest] + [k.size(2) for k in caches(model, state)])
    assert longest == REACH
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=0)


def generate(model, task, monkeypatch=None, beam=4, length=300):
    """fairseq's beam search from the start of a document, ``length`` tokens (no early EOS)."""
    from argparse import Namespace

    generator = task.build_generator([model], Namespace(beam=beam, max_len_b=length,
                                                        min_len=length))
    start = torch.full((2, 1), task.dictionary.eos())
    sample = {"net_input": {"src_tokens": start, "src_lengths": torch.ones(2)}}
    with torch.no_grad():
        return [[(h["tokens"], h["score"]) for h in sentence]
                for sentence in generator.generate([model], sample)]


def test_beam_search_with_the_rolling_cache_equals_it_with_the_whole_cache(windowed_lm,
                                                                          monkeypatch):
    """fairseq's SequenceGenerator reorders the cache every step; trimming the cache to its
    bound changes no hypothesis and no score (the whole cache with the same cutoff is the full
    forward: test_token_by_token_decoding_...)."""
    model, task = windowed_lm
    bounded = generate(model, task)
    import fairseq_alibi.modules.alibi_multihead_attention as module
    monkeypatch.setattr(module, "decoding_reach", lambda bias: None)
    whole = generate(model, task)
    for ours, theirs in zip(bounded, whole):
        assert len(ours) == len(theirs) == 4
        for (tokens, score), (want_tokens, want_score) in zip(ours, theirs):
            assert torch.equal(tokens, want_tokens)
            assert abs(float(score) - float(want_score)) < 1e-5
    assert len(bounded[0][0][0]) == 301  # 300 tokens and the EOS


def greedy_disagreements(model, dictionary, tokens, first, last):
    """The positions ``p`` in ``first … last - 1`` whose generated token ``tokens[p + 1]`` is
    not the greedy choice of one full forward over ``tokens`` (a causal model: its output at
    ``p`` is that of the full forward of ``tokens[:p + 1]``, as repeated full forwards would
    decode), with the generator's rules (no pad, no EOS before ``min_len``), and the margin of
    the top two choices there (float rounding may decide a near-tie)."""
    with torch.no_grad():
        logits = model(tokens[None])[0][0].double()
    logits[:, dictionary.pad()] = float("-inf")
    logits[:, dictionary.eos()] = float("-inf")
    found = []
    for p in range(first, last):
        top = logits[p].topk(2)
        if int(top.indices[0]) != int(tokens[p + 1]):
            found.append((p, float(top.values[0] - top.values[1])))
    return found


@pytest.mark.slow
def test_interactive_and_the_hub_generate_far_past_the_training_length_in_bounded_memory(
        trained_lm_checkpoint, tiny_lm_data, alibi_user_dir):
    """A trained tiny LM (L = 16) with ``--model-overrides "{'alibi_window_cutoff': 4}"``
    (windows 16 … 1024: every layer's cache rolls at about 2048 positions) generates 3000
    tokens greedily through fairseq-interactive; the hub's ``sample`` gives the same text, and
    every generated token is the greedy choice of the full forward with the same cutoff."""
    from fairseq_alibi.models.alibi_transformer_lm import AlibiTransformerLanguageModel

    length, prompt = 3000, "w3 w5 w7"
    save = trained_lm_checkpoint.parent
    proc = subprocess.run(
        [str(BIN / "fairseq-interactive"), str(tiny_lm_data), "--user-dir", alibi_user_dir,
         "--task", "language_modeling", "--path", str(trained_lm_checkpoint), "--cpu",
         "--beam", "1", "--max-len-b", str(length), "--min-len", str(length),
         "--model-overrides", "{'alibi_window_cutoff': 4}"],
        input=prompt + "\n", capture_output=True, text=True, timeout=600, env=child_env())
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    text = re.search(r"^H-0\t\S+\t(.*)$", proc.stdout, re.M).group(1)

    hub = AlibiTransformerLanguageModel.from_pretrained(
        str(save), trained_lm_checkpoint.name, data_name_or_path=str(tiny_lm_data),
        alibi_window_cutoff=4)
    model = hub.models[0]  # in eval mode (the hub prepared it for inference)
    assert model.decoder.alibi.window_cutoff == 4
    assert hub.sample(prompt, beam=1, max_len_b=length, min_len=length) == text
    assert max(model.decoder.alibi.windows_of(layer)[0][-1] for layer in range(2)) == 1024

    dictionary = hub.task.source_dictionary
    words = text.split()
    assert len(words) == length and words[:3] == prompt.split()
    tokens = torch.tensor([dictionary.eos()] + [dictionary.index(w) for w in words])
    disagree = greedy_disagreements(model, dictionary, tokens, 3, length)
    assert all(margin < 1e-4 for _, margin in disagree), disagree[:5]
    assert len(disagree) <= length // 100  # near-ties only, and few
    # the check sees the windows: the dense full forward (no cutoff) disagrees beyond ties
    model.decoder.alibi.window_cutoff = 0.0
    model.decoder.alibi.cache.clear()
    dense = greedy_disagreements(model, dictionary, tokens, 3, length)
    assert any(margin > 1e-3 for _, margin in dense), dense
