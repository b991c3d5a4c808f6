"""alibi_transformer (translation) in process at test dimensions, and its float64 reference."""

import math

import torch
import torch.nn.functional as F

from tests.helpers.building import setup_from_command_line
from tests.helpers.references import naive_bias, naive_slopes


TRANSLATION_DIM, TRANSLATION_HEADS = 32, 4


SRC_WORDS, TGT_WORDS = 20, 24


TINY_TRANSLATION = [
    "--encoder-layers", 2, "--decoder-layers", 2, "--encoder-embed-dim", TRANSLATION_DIM,
    "--decoder-embed-dim", TRANSLATION_DIM, "--encoder-ffn-embed-dim", 64,
    "--decoder-ffn-embed-dim", 64, "--encoder-attention-heads", TRANSLATION_HEADS,
    "--decoder-attention-heads", TRANSLATION_HEADS]


def write_translation_dictionaries(folder, src_words=SRC_WORDS, tgt_words=TGT_WORDS):
    """``dict.src.txt`` and ``dict.tgt.txt``: all the translation task reads to build a model."""
    folder.mkdir(parents=True, exist_ok=True)
    for lang, words in (("src", src_words), ("tgt", tgt_words)):
        (folder / f"dict.{lang}.txt").write_text(
            "".join(f"{lang}{i} {100 - i}\n" for i in range(words)))
    return folder


def build_translation(data, *extra, arch="alibi_transformer", perturb=True, seed=0):
    """``(model in eval mode, task)``: the TINY_TRANSLATION model of ``arch`` with ``extra``
    flags; ``perturb`` moves its biases and layer-norm affines away from their init."""
    cfg, task = setup_from_command_line(
        data, "--task", "translation", "--source-lang", "src", "--target-lang", "tgt",
        "--arch", arch, *TINY_TRANSLATION, *extra)
    torch.manual_seed(seed)
    model = task.build_model(cfg.model)
    if perturb:  # non-zero biases and layer-norm affines, so that every term counts
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(".bias") or "layer_norm" in name:
                    p.add_(torch.randn_like(p) * 0.1)
    return model.eval(), task


def token_sentences(task, lengths, side="src", seed=0):
    """Random sentences of the given lengths (token tensors, ``</s>`` appended)."""
    d = task.source_dictionary if side == "src" else task.target_dictionary
    g = torch.Generator().manual_seed(seed)
    return [torch.cat([torch.randint(d.nspecial, len(d), (n,), generator=g),
                       torch.tensor([d.eos()])]) for n in lengths]


def translation_batch(task, sources, targets):
    """fairseq's translation batch: sources padded on the left, targets on the right."""
    from fairseq.data import data_utils

    pad, eos = task.source_dictionary.pad(), task.source_dictionary.eos()
    src = data_utils.collate_tokens(sources, pad, eos, left_pad=True)
    prev = data_utils.collate_tokens(targets, pad, eos, left_pad=False,
                                     move_eos_to_beginning=True)
    lengths = torch.tensor([len(s) for s in sources])
    return src, lengths, prev


def reference_attention(x, keys, w, prefix, bias):
    """Multi-head attention in float64; ``bias`` (H, T, S) with -inf for hidden keys."""
    T, S = x.size(0), keys.size(0)
    H, D = TRANSLATION_HEADS, TRANSLATION_DIM // TRANSLATION_HEADS
    q = (x @ w[f"{prefix}.q_proj.weight"].T + w[f"{prefix}.q_proj.bias"]).view(T, H, D)
    k = (keys @ w[f"{prefix}.k_proj.weight"].T + w[f"{prefix}.k_proj.bias"]).view(S, H, D)
    v = (keys @ w[f"{prefix}.v_proj.weight"].T + w[f"{prefix}.v_proj.bias"]).view(S, H, D)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(D) + bias
    out = torch.einsum("hts,shd->thd", torch.softmax(scores, dim=-1), v).reshape(T, H * D)
    return out @ w[f"{prefix}.out_proj.weight"].T + w[f"{prefix}.out_proj.bias"]


def _layer_norm(x, w, name):
    return F.layer_norm(x, (TRANSLATION_DIM,), w[f"{name}.weight"], w[f"{name}.bias"])


def _ffn(x, w, p):
    return torch.relu(x @ w[f"{p}.fc1.weight"].T + w[f"{p}.fc1.bias"]) @ w[f"{p}.fc2.weight"].T \
        + w[f"{p}.fc2.bias"]


def translation_bias_matrix(variant, n_queries, n_keys, ratio=1.0):
    """The ALiBi bias from its definition, on positions 0..n-1 of an *unpadded* sentence."""
    heads = TRANSLATION_HEADS
    bias = torch.zeros(heads, n_queries, n_keys, dtype=torch.float64)
    slopes = naive_slopes("causal" if variant == "causal" else variant, heads)
    for h in range(heads):
        for i in range(n_queries):
            for j in range(n_keys):
                if variant == "causal":
                    b = -slopes[h] * (i - j) if j <= i else None
                else:
                    b = naive_bias(variant, h, heads, i, j, slopes[h], ratio)
                bias[h, i, j] = float("-inf") if b is None else b
    return bias


def stock_cross_attention(layer, y, x, w, prefix):
    """The stock cross-attention of the reference: no position bias."""
    return reference_attention(
        y, x, w, prefix, torch.zeros(TRANSLATION_HEADS, len(y), len(x), dtype=torch.float64))


def reference_translation_logits(model, source, prev_output, variant, ratio=1.0,
                                 cross_attention=stock_cross_attention):
    """Post-norm transformer (ReLU, scaled embeddings) written out in float64 for ONE sentence
    pair, no padding anywhere: (target length, vocabulary) logits. ``cross_attention(layer,
    y, x, w, prefix)``: decoder layer ``layer``'s attention of states ``y`` to the source ``x``."""
    w = {n: p.detach().double() for n, p in model.named_parameters()}
    w.update({n: b.double() for n, b in model.named_buffers()})
    x = math.sqrt(TRANSLATION_DIM) * w["encoder.embed_tokens.weight"][source]
    enc_bias = translation_bias_matrix(variant, len(source), len(source), ratio)
    for n in range(2):
        p = f"encoder.layers.{n}"
        x = _layer_norm(x + reference_attention(x, x, w, f"{p}.self_attn", enc_bias), w,
                        f"{p}.self_attn_layer_norm")
        x = _layer_norm(x + _ffn(x, w, p), w, f"{p}.final_layer_norm")
    y = math.sqrt(TRANSLATION_DIM) * w["decoder.embed_tokens.weight"][prev_output]
    dec_bias = translation_bias_matrix("causal", len(prev_output), len(prev_output))
    for n in range(2):
        p = f"decoder.layers.{n}"
        y = _layer_norm(y + reference_attention(y, y, w, f"{p}.self_attn", dec_bias), w,
                        f"{p}.self_attn_layer_norm")
        y = _layer_norm(y + cross_attention(n, y, x, w, f"{p}.encoder_attn"), w,
                        f"{p}.encoder_attn_layer_norm")
        y = _layer_norm(y + _ffn(y, w, p), w, f"{p}.final_layer_norm")
    return y @ w["decoder.output_projection.weight"].T


def assert_cached_decoding_matches_the_full_forward(model, task):
    """Decode 48 target tokens step by step (two sources of 30 and 12 tokens, a beam of 2 each,
    reordered at step 20) and compare every step's logits with the teacher-forced forward."""
    first, second = token_sentences(task, [30, 12])
    sources = [first, first, second, second]  # two sentences, a beam of 2 each
    targets = token_sentences(task, [47, 47, 47, 47], side="tgt", seed=2)
    src, lengths, prev = translation_batch(task, sources, targets)
    # beam search reorders within each sentence's beam, and may copy a hypothesis into two slots
    order = torch.tensor([1, 1, 3, 2])
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        state, steps = {}, []
        for t in range(prev.size(1)):
            if t == 20:
                model.decoder.reorder_incremental_state_scripting(state, order)
                encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
                prev = prev[order]
                steps = [s[order] for s in steps]
            steps.append(model.decoder(prev[:, : t + 1], encoder_out=encoder_out,
                                       incremental_state=state)[0][:, -1])
        full = model(src[order], lengths[order], prev)[0]
    assert torch.allclose(torch.stack(steps, 1), full, atol=1e-5, rtol=0)
