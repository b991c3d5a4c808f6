"""The cross-attention position options of alibi_transformer in process: the pointer, ratio and
length-scale formulas against a float64 reference on unpadded sentences (left-padded batches,
both dense backends), cached decoding with a beam reorder against teacher forcing, the EOS guard,
SHAPE (--position-shift), clear errors for every nonsense combination, and checkpoints written
before these options existed."""

import argparse
import math

import pytest
import torch
import torch.nn.functional as F

from fairseq_alibi.alibi import mask_value
from fairseq_alibi.modules.cross_position import CrossPositionAttention
from fairseq_alibi.modules.position_shift import ShiftedPositions
from tests.helpers.building import setup_from_command_line
from tests.helpers.translation import (
    TINY_TRANSLATION, TRANSLATION_HEADS, assert_cached_decoding_matches_the_full_forward,
    build_translation, reference_attention, reference_translation_logits, token_sentences,
    translation_batch, write_translation_dictionaries,
)

POINTER = ["--cross-alibi", "pointer"]
RATIO = ["--cross-alibi", "ratio", "--cross-alibi-ratio", 0.7]
SCALE = ["--cross-attention-length-scale", 6]
OPTIONS = {"pointer": POINTER, "ratio": RATIO, "length_scale": SCALE,
           "pointer_scaled": POINTER + SCALE + ["--cross-alibi-heads", 3],
           "ratio_one_head": RATIO + ["--cross-alibi-heads", 1],
           "pointer_steep": POINTER + ["--cross-alibi-slope-scale", 16],
           # outside training (these models are in eval mode) the slopes of scale 48
           "pointer_sharp": POINTER + ["--cross-alibi-slope-scale", 16,
                                       "--cross-alibi-inference-slope-scale", 48],
           "ratio_sharp": RATIO + ["--cross-alibi-inference-slope-scale", 3],
           # the slopes of scale 48 only for sources of more than 10 tokens, per row
           "pointer_sharp_long": POINTER + ["--cross-alibi-slope-scale", 16,
                                            "--cross-alibi-inference-slope-scale", 48,
                                            "--cross-alibi-inference-longer-than", 10]}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_translation_dictionaries(tmp_path_factory.mktemp("cross_dicts"))


def build_cross(data, *flags, **kwargs):
    """``build``, with the pointer's step depending on the state (its weight starts at 0)."""
    model, task = build_translation(data, *flags, **kwargs)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("pointer_step.weight"):
                p.copy_(torch.randn_like(p) * 0.3)
    return model, task


# ---------------------------------------------------------------- the float64 reference


def press_slopes(k):
    """2^(-8i/k), i = 1..k (k a power of two), else Press's interleaving, written out."""
    if math.log2(k).is_integer():
        return [2.0 ** (-8.0 * i / k) for i in range(1, k + 1)]
    closest = 2 ** math.floor(math.log2(k))
    return press_slopes(closest) + press_slopes(2 * closest)[0::2][: k - closest]


def reference_cross_attention(flags):
    """The cross-attention of the options ``flags`` written out for one unpadded sentence."""
    options = dict(zip(flags[::2], flags[1::2]))
    mode = options.get("--cross-alibi", "none")
    k = int(options.get("--cross-alibi-heads", TRANSLATION_HEADS // 2))
    reference = float(options.get("--cross-attention-length-scale", 0))

    def cross(layer, y, x, w, prefix):
        T, S = len(y), len(x)
        bias = torch.zeros(TRANSLATION_HEADS, T, S, dtype=torch.float64)
        if mode != "none":
            if mode == "pointer":
                weight, step_bias = w[f"{prefix}.pointer_step.weight"][0], \
                    w[f"{prefix}.pointer_step.bias"][0]
                anchors, p = [], 0.0
                for t in range(T):
                    if t > 0:
                        p += math.log1p(math.exp(float(y[t] @ weight + step_bias)))
                    anchors.append(p)
            else:
                anchors = [float(options["--cross-alibi-ratio"]) * t for t in range(T)]
            # the models are in eval mode: the inference scale, for sources longer than L
            scale = float(options.get("--cross-alibi-slope-scale", 1))
            if S > int(options.get("--cross-alibi-inference-longer-than", 0)):
                scale = float(options.get("--cross-alibi-inference-slope-scale", 0)) or scale
            slopes = [scale * m for m in press_slopes(k)]
            for h in range(k):
                for t in range(T):
                    for j in range(S):
                        bias[h, t, j] = -slopes[h] * abs(j - anchors[t])
        if reference:  # log S / log N times the content logits: the queries scaled
            factor = math.log(S) / math.log(reference)
            w = dict(w)
            for name in ("weight", "bias"):
                w[f"{prefix}.q_proj.{name}"] = w[f"{prefix}.q_proj.{name}"] * factor
        return reference_attention(y, x, w, prefix, bias)

    return cross


@pytest.mark.parametrize("backend", ["naive", "sdpa", "fold"])
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_left_padded_batch_matches_the_float64_reference(data, option, backend):
    """Every backend of the self-attention; the cross-attention runs the dense ``naive`` with
    ``naive`` and ``sdpa`` otherwise (it has no other kernel)."""
    flags = [str(f) for f in OPTIONS[option]]
    model, task = build_cross(data, *flags, "--alibi-attention", backend)
    cross = [m for m in model.modules() if isinstance(m, CrossPositionAttention)]
    assert len(cross) == 2 and {m.attention_backend for m in cross} == {backend}
    sources = token_sentences(task, [11, 7, 2])  # left padding of 0, 4 and 9 tokens
    targets = token_sentences(task, [5, 9, 3], side="tgt", seed=1)
    src, lengths, prev = translation_batch(task, sources, targets)
    with torch.no_grad():
        got = model(src, lengths, prev)[0]
    for b, (source, target) in enumerate(zip(sources, targets)):
        prev_b = torch.cat([target[-1:], target[:-1]])
        want = reference_translation_logits(model, source, prev_b, "offset",
                                cross_attention=reference_cross_attention(flags))
        assert torch.allclose(got[b, : len(target)].double(), want, atol=1e-5, rtol=0), b


@pytest.mark.parametrize("option", ["pointer", "ratio"])
def test_a_float64_model_computes_what_its_float32_one_does(data, option):
    """The source padding merged into the bias is made in the attention's dtype: made in
    float32, float64's mask value overflowed to -inf and 0 · -inf made every output NaN."""
    model, task = build_cross(data, *[str(f) for f in OPTIONS[option]])
    sources = token_sentences(task, [11, 7, 2])
    targets = token_sentences(task, [5, 9, 3], side="tgt", seed=1)
    src, lengths, prev = translation_batch(task, sources, targets)
    with torch.no_grad():
        single = model(src, lengths, prev)[0]
        double = model.double()(src, lengths, prev)[0]
    assert double.dtype == torch.float64 and torch.isfinite(double).all()
    torch.testing.assert_close(double.float(), single, atol=1e-4, rtol=0)


def test_the_bias_formula_with_and_without_padding_keys():
    """``cross_alibi_bias`` against the formula in float64, for several heads and queries, with
    no padding (``None``: a batch whose sources all have the same length) and with padding."""
    from fairseq_alibi.cross_alibi import cross_alibi_bias, source_positions

    slopes = torch.tensor([1.0, 0.0625, 0.0, 0.0])
    anchors = torch.tensor([[0.0, 1.5, 3.2], [0.0, 0.7, 9.0]])
    for padding_mask in (None, torch.tensor([[False] * 6, [True, True] + [False] * 4])):
        positions, _ = source_positions(padding_mask, 2, 6, "cpu")
        padding = None if padding_mask is None else padding_mask.float() * -1e4
        got = cross_alibi_bias(slopes, anchors, positions, padding)
        want = torch.zeros(2, 4, 3, 6, dtype=torch.float64)
        for b, h, t, j in torch.cartesian_prod(*map(torch.arange, want.shape)).tolist():
            first = 0 if padding_mask is None else int(padding_mask[b].sum())
            want[b, h, t, j] = -float(slopes[h]) * abs(j - first - float(anchors[b, t])) + (
                -1e4 if padding_mask is not None and padding_mask[b, j] else 0.0)
        assert got.shape == (2, 4, 3, 6) and torch.allclose(got.double(), want, atol=1e-5)


@pytest.mark.parametrize("option", ["pointer", "ratio"])
def test_the_bias_moves_the_attention(data, option):
    """Not a no-op: the same weights without the bias give other logits."""
    model, task = build_cross(data, *OPTIONS[option])
    plain, _ = build_translation(data)
    plain.load_state_dict({k: v for k, v in model.state_dict().items()
                           if "pointer_step" not in k and "longest_training" not in k},
                          strict=True)
    src, lengths, prev = translation_batch(task, token_sentences(task, [9, 4]),
                                           token_sentences(task, [6, 3], side="tgt"))
    with torch.no_grad():
        assert not torch.allclose(model(src, lengths, prev)[0], plain(src, lengths, prev)[0],
                                  atol=1e-3)


def test_a_left_padded_row_equals_the_same_row_alone(data):
    model, task = build_cross(data, *POINTER, *SCALE)
    sources = token_sentences(task, [13, 5])
    targets = token_sentences(task, [7, 7], side="tgt")
    src, lengths, prev = translation_batch(task, sources, targets)
    alone_src, alone_lengths, alone_prev = translation_batch(task, sources[1:], targets[1:])
    with torch.no_grad():
        padded = model(src, lengths, prev)[0][1]
        alone = model(alone_src, alone_lengths, alone_prev)[0][0]
    assert src[1, 0] == task.source_dictionary.pad()
    assert torch.allclose(padded, alone, atol=1e-5, rtol=0)


# ---------------------------------------------------------------- cached decoding


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_cached_decoding_with_beam_reorder_equals_teacher_forcing(data, option):
    model, task = build_cross(data, *OPTIONS[option])
    assert_cached_decoding_matches_the_full_forward(model, task)


def test_cached_decoding_on_the_stock_decoder(data):
    model, task = build_cross(data, *POINTER, "--decoder-alibi-variant", "none")
    assert_cached_decoding_matches_the_full_forward(model, task)


def test_the_pointer_is_carried_and_reordered_with_the_beam(data):
    model, task = build_cross(data, *POINTER)
    src, lengths, prev = translation_batch(task, token_sentences(task, [12, 12]),
                                           token_sentences(task, [6, 6], "tgt"))
    attn = model.decoder.layers[1].encoder_attn
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        state = {}
        for t in range(4):
            model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
        offsets = attn.position_state(state)["offsets"][:, 0].clone()  # j - p_t, (B, 1, S)
        pointer = torch.arange(float(offsets.size(1))) - offsets  # unpadded: j counts from 0
        assert (pointer > 0).all() and not torch.equal(pointer[0], pointer[1])
        assert torch.allclose(pointer, pointer[:, :1].expand_as(pointer))  # one p_t a row
        model.decoder.reorder_incremental_state_scripting(state, torch.tensor([1, 1]))
        assert torch.equal(attn.position_state(state)["offsets"][:, 0], offsets[[1, 1]])


# ---------------------------------------------------------------- the EOS guard


def guarded(data, step_bias, distance=2):
    model, task = build_cross(data, *POINTER, "--cross-alibi-eos-guard", distance)
    with torch.no_grad():  # the pointer's step: softplus(step_bias), whatever the state
        for layer in model.decoder.layers:
            layer.encoder_attn.pointer_step.weight.zero_()
            layer.encoder_attn.pointer_step.bias.fill_(step_bias)
    return model, task


def step_logits(model, src, lengths, prev, steps):
    with torch.no_grad():
        encoder_out, state = model.encoder(src, src_lengths=lengths), {}
        return [model.decoder(prev[:, : t + 1], encoder_out=encoder_out,
                              incremental_state=state)[0][:, -1] for t in range(steps)]


def test_eos_guard_forbids_eos_before_the_end_and_allows_it_at_the_end(data):
    model, task = guarded(data, step_bias=math.log(math.e - 1))  # one source token per step
    eos = task.target_dictionary.eos()
    src, lengths, prev = translation_batch(task, token_sentences(task, [7, 2]),
                                           token_sentences(task, [9, 9], "tgt"))
    # real source lengths 8 and 3 (eos included): last real tokens at 7 and 2, pointer p_t = t
    guarded_steps = step_logits(model, src, lengths, prev, 8)
    model.decoder.cross_alibi_eos_guard = -1.0
    free_steps = step_logits(model, src, lengths, prev, 8)
    for t, (g, f) in enumerate(zip(guarded_steps, free_steps)):
        for row, last in enumerate((7, 2)):
            others = torch.arange(g.size(1)) != eos
            assert torch.equal(g[row, others], f[row, others])
            if last - t > 2:  # more than D = 2 source tokens left: forbidden
                assert g[row, eos] < -1e30
                assert torch.log_softmax(g[row], -1)[eos] < -1e30
            else:
                assert g[row, eos] == f[row, eos], (t, row)


def hand_pointers(model, src, lengths, prev):
    """Each decoder layer's pointer ``p_t`` (L, B, T), teacher-forced, summed step by step in
    float64 from the layer's own cross-attention input (read by a hook)."""
    inputs = []
    hooks = [layer.encoder_attn.register_forward_hook(
        lambda module, args, kwargs, out: inputs.append(
            (module, kwargs["query"] if "query" in kwargs else args[0])),
        with_kwargs=True) for layer in model.decoder.layers]
    try:
        with torch.no_grad():
            model(src, lengths, prev)
    finally:
        for hook in hooks:
            hook.remove()
    pointers = []
    for module, query in inputs:  # (T, B, C)
        w = module.pointer_step.weight.double()
        b = module.pointer_step.bias.double()
        p, rows = torch.zeros(query.size(1), dtype=torch.float64), []
        for t in range(query.size(0)):
            if t:  # p_0 = 0, p_t = p_(t-1) + softplus(w.x_t + b)
                p = p + F.softplus(query[t].double() @ w.t() + b).squeeze(-1)
            rows.append(p)
        pointers.append(torch.stack(rows, -1))
    return torch.stack(pointers)


@pytest.mark.parametrize("layer,source_padding", [
    ("last", "left"), ("first", "left"), ("min", "left"), ("min", "right")])
def test_eos_guard_reads_the_chosen_layers_pointer(data, layer, source_padding):
    """--cross-alibi-eos-guard-layer: decoding with each choice floors EOS exactly where the
    guard computed by hand from the teacher-forced pointers of the layers says (last, first,
    or the pointer furthest behind), and changes no other logit; with sources padded on the
    left (fairseq's default) and on the right (``--left-pad-source False``)."""
    D, steps = 2.0, 9
    model, task = build_cross(data, *POINTER, "--cross-alibi-eos-guard", D,
                              "--cross-alibi-eos-guard-layer", layer)
    assert model.decoder.cross_alibi_eos_guard_layer == layer
    with torch.no_grad():  # layer 0's pointer fast, layer 1's slow: the choice matters
        for bias, decoder_layer in zip((1.2, -0.4), model.decoder.layers):
            decoder_layer.encoder_attn.pointer_step.bias.fill_(bias)
    eos = task.target_dictionary.eos()
    sources = token_sentences(task, [11, 6, 15])
    src, lengths, prev = translation_batch(task, sources,
                                           token_sentences(task, [steps, steps, steps], "tgt"))
    if source_padding == "right":
        from fairseq.data import data_utils

        d = task.source_dictionary
        src = data_utils.collate_tokens(sources, d.pad(), d.eos(), left_pad=False)
        assert src[1, -1] == d.pad()
    guarded_steps = step_logits(model, src, lengths, prev, steps)
    model.decoder.cross_alibi_eos_guard = -1.0
    free_steps = step_logits(model, src, lengths, prev, steps)
    left = (lengths.double() - 1)[None, :, None] - hand_pointers(model, src, lengths, prev)
    read = {"last": left[-1], "first": left[0], "min": left.amax(0)}[layer]  # (B, T)
    assert (read - D).abs().min() > 1e-4  # no step at the threshold: the test is exact
    forbidden = read > D
    # the choices disagree somewhere, and the guard both forbids and allows in this batch
    assert not torch.equal(left[0] > D, left[-1] > D) and forbidden.any() and (~forbidden).any()
    others = torch.arange(free_steps[0].size(1)) != eos
    for t, (g, f) in enumerate(zip(guarded_steps, free_steps)):
        assert torch.equal(g[:, others], f[:, others])
        for row in range(g.size(0)):
            if forbidden[row, t]:
                assert g[row, eos] == mask_value(g.dtype), (t, row)
            else:
                assert g[row, eos] == f[row, eos], (t, row)


def test_eos_guard_is_off_in_teacher_forcing_and_training(data):
    model, task = guarded(data, step_bias=-20.0)
    src, lengths, prev = translation_batch(task, token_sentences(task, [20]),
                                           token_sentences(task, [5], "tgt"))
    with torch.no_grad():
        full = model(src, lengths, prev)[0]
    assert full[..., task.target_dictionary.eos()].abs().max() < 1e3


def test_beam_search_still_ends_when_the_pointer_never_reaches_the_end(data):
    """A pointer that does not move forbids EOS at every step: the generator's max length still
    ends every hypothesis (fairseq leaves only EOS open there), with a finite score."""
    model, task = guarded(data, step_bias=-30.0)  # step ~ 1e-13
    src, lengths, _ = translation_batch(task, token_sentences(task, [30, 12]),
                                        token_sentences(task, [1, 1], "tgt"))
    generator = task.build_generator([model], argparse.Namespace(beam=3, max_len_a=0,
                                                                 max_len_b=6))
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}, "id": torch.arange(2)}
    with torch.no_grad():
        hypos = task.inference_step(generator, [model], sample)
    eos = task.target_dictionary.eos()
    for sentence in hypos:
        assert len(sentence) == 3
        for h in sentence:
            assert len(h["tokens"]) == 7 and h["tokens"][-1] == eos
            assert (h["tokens"][:-1] != eos).all() and torch.isfinite(h["score"])


@pytest.mark.parametrize("topk,topp", [(-1, -1.0), (4, -1.0), (-1, 0.9)],
                         ids=["plain", "topk", "topp"])
def test_sampling_still_ends_when_the_pointer_never_reaches_the_end(data, topk, topp):
    """At max_len only EOS is open, at the guard's floor (its exp is 0 in float32): sampling
    (fairseq's Sampling search) still ends there, with no EOS before and a finite score."""
    torch.manual_seed(0)
    model, task = guarded(data, step_bias=-30.0)
    src, lengths, _ = translation_batch(task, token_sentences(task, [30, 12]),
                                        token_sentences(task, [1, 1], "tgt"))
    generator = task.build_generator([model], argparse.Namespace(
        beam=2, nbest=2, max_len_a=0, max_len_b=6, sampling=True, sampling_topk=topk,
        sampling_topp=topp))
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}, "id": torch.arange(2)}
    with torch.no_grad():
        hypos = task.inference_step(generator, [model], sample)
    eos = task.target_dictionary.eos()
    for sentence in hypos:
        for h in sentence:
            assert len(h["tokens"]) == 7 and h["tokens"][-1] == eos
            assert (h["tokens"][:-1] != eos).all() and torch.isfinite(h["score"])


# ---------------------------------------------------------------- the inference slope scale


def test_the_inference_slope_scale_acts_outside_training_only(data):
    """``--cross-alibi-inference-slope-scale 48`` on a model trained at 16: in training it is
    the model at 16 (the same dropout), outside training the model at 48 (teacher forcing and
    cached decoding alike), and a cast keeps its slopes exact."""
    flags = [*POINTER, "--cross-alibi-slope-scale"]
    sharp, task = build_cross(data, *flags, 16, "--cross-alibi-inference-slope-scale", 48)
    at_16, _ = build_cross(data, *flags, 16)
    at_48, _ = build_cross(data, *flags, 48)
    for other in (at_16, at_48):
        other.load_state_dict(sharp.state_dict())
    src, lengths, prev = translation_batch(task, token_sentences(task, [14, 9]),
                                           token_sentences(task, [6, 8], "tgt"))
    with torch.no_grad():
        assert torch.equal(sharp(src, lengths, prev)[0], at_48(src, lengths, prev)[0])
        assert not torch.allclose(sharp(src, lengths, prev)[0], at_16(src, lengths, prev)[0])
        trained = []
        for model in (sharp.train(), at_16.train()):
            torch.manual_seed(3)
            trained.append(model(src, lengths, prev)[0])
        assert torch.equal(*trained)
    sharp.eval()
    assert_cached_decoding_matches_the_full_forward(sharp, task)
    cross = next(m for m in sharp.modules() if isinstance(m, CrossPositionAttention))
    sharp.half().float()
    assert cross.inference_slopes.dtype == torch.float32
    assert cross.inference_slopes.view(-1).tolist() == [48 * m for m in press_slopes(2)] + [0, 0]
    assert cross.slopes.tolist() == [16 * m for m in press_slopes(2)] + [0, 0]


SHARP = [*POINTER, "--cross-alibi-slope-scale", 16, "--cross-alibi-inference-slope-scale", 48]


def decoded_outputs(model, task):
    """Teacher-forced outputs outside training for sources of 12 and 8 tokens (EOS
    included), one batch."""
    src, lengths, prev = translation_batch(task, token_sentences(task, [11, 7]),
                                           token_sentences(task, [6, 8], "tgt"))
    assert lengths.tolist() == [12, 8]
    with torch.no_grad():
        return model.eval()(src, lengths, prev)[0]


def test_the_model_records_its_longest_training_source_and_the_default_follows_it(data):
    """Training forward passes raise ``longest_training_source`` to the longest real source
    (EOS included, padding not); outside training it changes nothing; decoding then gives the
    inference slopes to longer sources only, as ``--cross-alibi-inference-longer-than 10``
    would, and the flag, 0 included, overrides it."""
    model, task = build_cross(data, *SHARP)
    assert int(model.longest_training_source.tokens) == 0  # nothing recorded yet
    model.train()
    for source_lengths in ([4, 9], [6, 2]):  # 10 and 7 tokens with EOS, padded on the left
        src, lengths, prev = translation_batch(task, token_sentences(task, source_lengths),
                                               token_sentences(task, [3, 3], "tgt"))
        model(src, lengths, prev)
    assert int(model.longest_training_source.tokens) == 10
    decoded_outputs(model, task)  # a longer source outside training is not recorded
    assert int(model.longest_training_source.tokens) == 10
    assert all(m.longer_than() == 10 for m in model.modules()
               if isinstance(m, CrossPositionAttention))

    def like(*flags):
        other, _ = build_cross(data, *SHARP, *flags)
        other.load_state_dict(model.state_dict())  # the same weights and record
        return decoded_outputs(other, task)

    got = decoded_outputs(model, task)
    assert torch.equal(got, like("--cross-alibi-inference-longer-than", 10))
    everywhere = like("--cross-alibi-inference-longer-than", 0)  # the flag wins
    assert torch.equal(got[0], everywhere[0]) and not torch.allclose(got[1], everywhere[1])
    assert not torch.equal(like("--cross-alibi-inference-longer-than", 5)[1], got[1])


def test_the_record_is_saved_and_a_checkpoint_without_it_decodes_as_before(data, tmp_path):
    """The record travels in the checkpoint (``longest_training_source.tokens``) and
    ``--model-overrides`` still overrides it; a checkpoint saved before the record existed (no
    key, no option in its config) decodes every source with the inference slopes, as then."""
    from fairseq import checkpoint_utils

    path, model, task = write_checkpoint(data, tmp_path, "--arch", "alibi_transformer", *SHARP)
    model.train()
    src, lengths, prev = translation_batch(task, token_sentences(task, [9, 3]),
                                           token_sentences(task, [3, 3], "tgt"))
    model(src, lengths, prev)
    state = torch.load(path, weights_only=False)
    state["model"] = model.state_dict()
    torch.save(state, path)
    (loaded,), _ = checkpoint_utils.load_model_ensemble([str(path)], task=task)
    assert int(loaded.longest_training_source.tokens) == 10
    assert torch.equal(decoded_outputs(loaded, task), decoded_outputs(model, task))
    (overridden,), _ = checkpoint_utils.load_model_ensemble(
        [str(path)], task=task, arg_overrides={"cross_alibi_inference_longer_than": 0})
    assert all(m.longer_than() == 0 for m in overridden.modules()
               if isinstance(m, CrossPositionAttention))

    del state["model"]["longest_training_source.tokens"]
    del state["cfg"]["model"].cross_alibi_inference_longer_than
    torch.save(state, path)
    (old,), _ = checkpoint_utils.load_model_ensemble([str(path)], task=task)
    assert int(old.longest_training_source.tokens) == 0
    everywhere, _ = build_cross(data, *SHARP, "--cross-alibi-inference-longer-than", 0)
    everywhere.load_state_dict(old.state_dict())
    assert torch.equal(decoded_outputs(old, task), decoded_outputs(everywhere, task))


def test_the_inference_slope_scale_is_a_load_time_override(data, tmp_path):
    """A checkpoint trained without the option, loaded with it: its generation uses the
    sharper slopes (what ``--model-overrides`` gives fairseq-generate)."""
    from fairseq import checkpoint_utils

    path, _, task = write_checkpoint(data, tmp_path, "--arch", "alibi_transformer", *POINTER,
                                     "--cross-alibi-slope-scale", 16)
    (plain,), _ = checkpoint_utils.load_model_ensemble([str(path)], task=task)
    (sharp,), _ = checkpoint_utils.load_model_ensemble(
        [str(path)], task=task, arg_overrides={"cross_alibi_inference_slope_scale": 48.0})
    cross = [m for m in sharp.modules() if isinstance(m, CrossPositionAttention)]
    assert cross and all(m.inference_slope_scale == 48.0 and m.slope_scale == 16.0
                         for m in cross)
    assert all(m.inference_slope_scale == 16.0
               for m in plain.modules() if isinstance(m, CrossPositionAttention))
    (gated,), _ = checkpoint_utils.load_model_ensemble(
        [str(path)], task=task, arg_overrides={"cross_alibi_inference_slope_scale": 48.0,
                                               "cross_alibi_inference_longer_than": 10})
    assert all(m.inference_longer_than == 10
               for m in gated.modules() if isinstance(m, CrossPositionAttention))


def test_the_inference_slope_scale_only_beyond_the_given_length(data):
    """``--cross-alibi-inference-longer-than 10``: in one batch, the row of 12 source tokens
    (EOS included) is the model decoded at 48 everywhere, the row of 8 the model at its training
    scale; in training nothing changes."""
    flags = [*POINTER, "--cross-alibi-slope-scale", 16, "--cross-alibi-inference-slope-scale", 48]
    gated, task = build_cross(data, *flags, "--cross-alibi-inference-longer-than", 10)
    everywhere, _ = build_cross(data, *flags)
    trained, _ = build_cross(data, *POINTER, "--cross-alibi-slope-scale", 16)
    for other in (everywhere, trained):
        other.load_state_dict(gated.state_dict())
    src, lengths, prev = translation_batch(task, token_sentences(task, [11, 7]),
                                           token_sentences(task, [6, 8], "tgt"))
    assert lengths.tolist() == [12, 8]  # EOS included
    with torch.no_grad():
        got = gated(src, lengths, prev)[0]
        assert torch.equal(got[0], everywhere(src, lengths, prev)[0][0])
        assert torch.equal(got[1], trained(src, lengths, prev)[0][1])
        assert not torch.allclose(got[1], everywhere(src, lengths, prev)[0][1])
        outputs = []
        for model in (gated.train(), trained.train()):
            torch.manual_seed(3)
            outputs.append(model(src, lengths, prev)[0])
        assert torch.equal(*outputs)


# ---------------------------------------------------------------- SHAPE


SHAPE = ["--encoder-alibi-variant", "none", "--decoder-alibi-variant", "none",
         "--position-shift", 5]


def test_training_offsets_vary_per_sentence_within_the_range(data):
    model, task = build_translation(data, *SHAPE)
    embed = model.encoder.embed_positions
    assert isinstance(embed, ShiftedPositions) and isinstance(model.decoder.embed_positions,
                                                              ShiftedPositions)
    src, _, _ = translation_batch(task, token_sentences(task, [6, 3] * 8),
                                  token_sentences(task, [1] * 16, "tgt"))
    embed.train()
    torch.manual_seed(0)
    shifted = embed(src)
    stock = embed.inner(src)
    pad = task.source_dictionary.pad()
    table = embed.inner.weights
    offsets = set()
    for b in range(src.size(0)):
        real = src[b].ne(pad)
        first = int(torch.nonzero(real)[0])
        # the row's first real position is pad + 1 + k for one k in [0, 5]
        matches = [k for k in range(6) if torch.allclose(shifted[b, first],
                                                         table[pad + 1 + k])]
        assert len(matches) == 1, b
        k = matches[0]
        offsets.add(k)
        assert torch.allclose(shifted[b, real], table[pad + 1 + k: pad + 1 + k + int(real.sum())])
        assert torch.equal(shifted[b, ~real], stock[b, ~real])  # padding keeps its zero row
    assert len(offsets) > 2


def test_inference_offset_is_zero_and_equals_stock(data):
    model, task = build_translation(data, *SHAPE)
    stock, _ = build_translation(data, arch="transformer")
    stock.load_state_dict(model.state_dict(), strict=True)
    src, lengths, prev = translation_batch(task, token_sentences(task, [9, 4]),
                                           token_sentences(task, [6, 3], "tgt"))
    with torch.no_grad():
        assert torch.equal(model(src, lengths, prev)[0], stock(src, lengths, prev)[0])


def test_shape_training_differs_from_stock_and_grows_the_table(data):
    model, task = build_translation(data, "--encoder-alibi-variant", "none",
                                    "--position-shift", 3000)
    embed = model.encoder.embed_positions.train()
    src, _, _ = translation_batch(task, token_sentences(task, [1500]),
                                  token_sentences(task, [1], "tgt"))
    out = embed(src)
    assert torch.isfinite(out).all() and embed.inner.weights.size(0) >= 1500 + 3000


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("flags,error", [
    (["--cross-alibi-heads", 2], "--cross-alibi-heads needs --cross-alibi pointer or ratio, "
                                 "not none"),
    (["--cross-alibi", "pointer", "--cross-alibi-heads", 5], "between 1 and the 4 decoder"),
    (["--cross-alibi", "pointer", "--cross-alibi-heads", 0], "--cross-alibi-heads must be >= 1"),
    (["--cross-alibi", "ratio"], "needs --cross-alibi-ratio R"),
    (["--cross-alibi", "pointer", "--cross-alibi-ratio", 1.2],
     "--cross-alibi-ratio needs --cross-alibi ratio, not pointer"),
    (["--cross-alibi", "ratio", "--cross-alibi-ratio", 0], "must be a positive finite number"),
    (["--cross-attention-length-scale", 1], "0 \\(off\\) or a reference source length above 1"),
    (["--cross-attention-length-scale", -3], "0 \\(off\\) or a reference"),
    (["--cross-alibi-eos-guard", 2], "needs --cross-alibi pointer"),
    (["--cross-alibi", "ratio", "--cross-alibi-ratio", 1, "--cross-alibi-eos-guard", 2],
     "needs --cross-alibi pointer"),
    (["--cross-alibi", "pointer", "--cross-alibi-eos-guard", -3], "-1 \\(off\\) or a distance"),
    (["--cross-alibi", "pointer", "--cross-alibi-eos-guard-layer", "min"],
     "--cross-alibi-eos-guard-layer needs --cross-alibi-eos-guard: it chooses"),
    (["--cross-alibi-slope-scale", 16], "needs --cross-alibi pointer or ratio, not none"),
    (["--cross-alibi", "pointer", "--cross-alibi-slope-scale", 0], "must be a positive finite"),
    (["--cross-alibi-inference-slope-scale", 48], "not none: .* outside training"),
    (["--cross-alibi", "pointer", "--cross-alibi-inference-slope-scale", -1],
     "must be 0 \\(off\\) or positive"),
    (["--cross-alibi", "pointer", "--cross-alibi-inference-longer-than", 16],
     "--cross-alibi-inference-longer-than needs --cross-alibi-inference-slope-scale"),
    (["--cross-alibi", "pointer", "--cross-alibi-inference-slope-scale", 48,
      "--cross-alibi-inference-longer-than", -1], "longer-than must be >= 0"),
    (["--position-shift", 4], "both sides use ALiBi"),
    (["--position-shift", -1, "--encoder-alibi-variant", "none"], ">= 0"),
    (["--position-shift", 4, "--encoder-alibi-variant", "none", "--encoder-learned-pos"],
     "--encoder-learned-pos replaces"),
])
def test_nonsense_combinations_are_one_line_errors(data, flags, error):
    with pytest.raises(ValueError, match=error) as raised:
        build_translation(data, *flags)
    assert "\n" not in str(raised.value)


def test_unknown_mode_is_refused(data, capsys):
    with pytest.raises(SystemExit):
        build_translation(data, "--cross-alibi", "diagonal")
    assert "--cross-alibi: invalid choice: 'diagonal'" in capsys.readouterr().err


def test_a_checkpoint_without_the_pointer_is_a_clear_error(data):
    plain, _ = build_translation(data)
    pointer, _ = build_translation(data, *POINTER)
    with pytest.raises(ValueError, match="trained with no --cross-alibi pointer.*has --cross-alibi pointer"):
        pointer.load_state_dict(plain.state_dict(), strict=True)
    with pytest.raises(ValueError, match="trained with --cross-alibi pointer.*build it with --cross-alibi pointer"):
        plain.load_state_dict(pointer.state_dict(), strict=True)


def test_a_stock_checkpoint_names_every_side_in_one_message(data, tmp_path):
    """A stock transformer checkpoint (sinusoidal on both sides), written by fairseq's Trainer,
    into the default model (ALiBi on both sides): one error with both flags."""
    path, _, _ = write_checkpoint(data, tmp_path, "--arch", "transformer")
    model, _ = build_translation(data)
    with pytest.raises(ValueError) as raised:
        model.load_state_dict(torch.load(path, weights_only=False)["model"], strict=True)
    message = str(raised.value)
    assert "--encoder-alibi-variant none --decoder-alibi-variant none" in message
    assert "encoder.alibi.slopes, decoder.alibi.slopes" in message and "\n" not in message


# ---------------------------------------------------------------- checkpoints


NEW_OPTIONS = ("cross_alibi", "cross_alibi_heads", "cross_alibi_ratio", "cross_alibi_slope_scale",
               "cross_alibi_inference_slope_scale", "cross_alibi_inference_longer_than",
               "cross_attention_length_scale", "cross_alibi_eos_guard", "position_shift")


def write_checkpoint(data, save, *flags, strip=()):
    """A checkpoint written by fairseq's Trainer; ``strip``: model options removed from its
    config (what code older than them saved)."""
    from fairseq.trainer import Trainer

    cfg, task = setup_from_command_line(
        data, "--task", "translation", "--source-lang", "src", "--target-lang", "tgt",
        *TINY_TRANSLATION, "--optimizer", "adam", "--lr", 0.001, "--save-dir", save, "--cpu", *flags)
    model = task.build_model(cfg.model)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    trainer.consolidate_optimizer()
    path = save / "checkpoint_last.pt"
    trainer.save_checkpoint(str(path), {})
    if strip:
        state = torch.load(path, weights_only=False)
        model_cfg = state["cfg"]["model"]
        for name in strip:
            if isinstance(model_cfg, argparse.Namespace):
                delattr(model_cfg, name)
            else:
                del model_cfg[name]
        torch.save(state, path)
    return path, model.eval(), task


def test_a_checkpoint_written_before_these_options_loads_and_computes_the_same(data, tmp_path):
    from fairseq import checkpoint_utils

    path, model, task = write_checkpoint(data, tmp_path, "--arch", "alibi_transformer",
                                         strip=NEW_OPTIONS)
    saved = torch.load(path, weights_only=False)["cfg"]["model"]
    assert not any(name in saved for name in NEW_OPTIONS)
    (loaded,), _ = checkpoint_utils.load_model_ensemble([str(path)], task=task)
    loaded.eval()
    assert type(loaded.decoder.layers[0].encoder_attn).__name__ == "MultiheadAttention"
    src, lengths, prev = translation_batch(task, token_sentences(task, [9, 4]),
                                           token_sentences(task, [6, 3], "tgt"))
    with torch.no_grad():
        assert torch.equal(loaded(src, lengths, prev)[0], model(src, lengths, prev)[0])


def test_a_pointer_checkpoint_loads_with_its_options(data, tmp_path):
    from fairseq import checkpoint_utils

    path, model, task = write_checkpoint(data, tmp_path, "--arch", "alibi_transformer",
                                         *POINTER, "--cross-alibi-eos-guard", 1)
    (loaded,), _ = checkpoint_utils.load_model_ensemble([str(path)], task=task)
    loaded.eval()
    assert loaded.decoder.cross_alibi_eos_guard == 1.0
    src, lengths, prev = translation_batch(task, token_sentences(task, [9, 4]),
                                           token_sentences(task, [6, 3], "tgt"))
    with torch.no_grad():
        assert torch.equal(loaded(src, lengths, prev)[0], model(src, lengths, prev)[0])


def test_the_cross_alibi_heads_are_checked_against_the_checkpoint(data, tmp_path):
    """The saved slopes tell K: a load-time override (or a resumed run) building another is the
    one mismatch error, not a model that computes something else."""
    from fairseq import checkpoint_utils

    path, _, task = write_checkpoint(data, tmp_path, "--arch", "alibi_transformer", *POINTER,
                                     "--cross-alibi-heads", 2)
    with pytest.raises(ValueError, match="trained with --cross-alibi-heads 2 .*; "
                                         "cross_alibi_heads in --model-overrides builds "
                                         "--cross-alibi-heads 3: drop it from --model-overrides"):
        checkpoint_utils.load_model_ensemble([str(path)], arg_overrides={"cross_alibi_heads": 3},
                                             task=task)


def test_a_pointer_checkpoint_saved_without_its_slopes_loads_as_before(data, tmp_path):
    from fairseq import checkpoint_utils

    path, model, task = write_checkpoint(data, tmp_path, "--arch", "alibi_transformer",
                                         *POINTER)
    state = torch.load(path, weights_only=False)
    assert any(k.endswith("encoder_attn.slopes") for k in state["model"])
    state["model"] = {k: v for k, v in state["model"].items()
                      if not k.endswith("encoder_attn.slopes")}
    torch.save(state, path)
    (loaded,), _ = checkpoint_utils.load_model_ensemble([str(path)], task=task)
    loaded.eval()
    src, lengths, prev = translation_batch(task, token_sentences(task, [9, 4]),
                                           token_sentences(task, [6, 3], "tgt"))
    with torch.no_grad():
        assert torch.equal(loaded(src, lengths, prev)[0], model(src, lengths, prev)[0])


def test_turning_a_saved_guard_off_at_load_is_one_key(data, tmp_path, caplog):
    from fairseq import checkpoint_utils

    path, _, task = write_checkpoint(data, tmp_path, "--arch", "alibi_transformer", *POINTER,
                                     "--cross-alibi-eos-guard", 2,
                                     "--cross-alibi-eos-guard-layer", "min")
    # the guard's layer, saved as min, needs the guard: it goes back to its default, said so
    with caplog.at_level("WARNING", logger="fairseq_alibi.models.override_keys"):
        (loaded,), _ = checkpoint_utils.load_model_ensemble(
            [str(path)], arg_overrides={"cross_alibi_eos_guard": -1}, task=task)
    assert loaded.decoder.cross_alibi_eos_guard == -1.0
    assert loaded.decoder.cross_alibi_eos_guard_layer == "last"
    assert "the override cross_alibi_eos_guard=-1 (--model-overrides) takes away what the " \
           "checkpoint's cross_alibi_eos_guard_layer='min' needs: cross_alibi_eos_guard_layer " \
           "is reset to its default, 'last'" in caplog.text
    # given both, nothing is reset; given a guard, the saved layer stays
    caplog.clear()
    for overrides, layer in (({"cross_alibi_eos_guard": -1,
                               "cross_alibi_eos_guard_layer": "last"}, "last"),
                             ({"cross_alibi_eos_guard": 3}, "min")):
        (loaded,), _ = checkpoint_utils.load_model_ensemble(
            [str(path)], arg_overrides=overrides, task=task)
        assert loaded.decoder.cross_alibi_eos_guard_layer == layer
    assert "is reset" not in caplog.text


# ---------------------------------------------------------------- precision


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_half_precision_keeps_the_slopes_and_stays_close(data, dtype):
    model, task = build_cross(data, *POINTER, "--cross-alibi-heads", 3)
    src, lengths, prev = translation_batch(task, token_sentences(task, [40, 9]),
                                           token_sentences(task, [6, 3], "tgt"))
    with torch.no_grad():
        want = model(src, lengths, prev)[0]
        attn = model.decoder.layers[0].encoder_attn
        model.to(dtype)
        assert attn.slopes.dtype == torch.float32
        got = model(src, lengths, prev)[0]
    assert torch.isfinite(got).all()
    assert (F.softmax(got.float(), -1) - F.softmax(want, -1)).abs().max() < 0.1
