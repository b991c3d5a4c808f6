"""Benchmark 5: cached (incremental) decoding, ALiBi vs stock decoders, per step.

Two pairs: ``alibi_transformer_lm`` vs ``transformer_lm`` (language models) and the decoder of
``alibi_transformer`` vs that of ``transformer`` (translation: the step also runs the stock
cross-attention over a source of :data:`SOURCE_LENGTH` tokens, encoded once beforehand by each
model's own encoder).

The time of one decoding step with ``S`` tokens already in the KV cache, per model: both
decoders read the same weight tensors (:func:`benchmarks.cases.share_weights`; the stock one
adds its sinusoidal positions, which have none), their caches are filled with the same random
keys/values of ``S`` tokens (exactly what ``S`` earlier steps leave there), then ``steps``
tokens are decoded one at a time, as ``fairseq-generate`` and ``hub.generate`` do
(``decoder(tokens, incremental_state=...)``). Each of ``rounds`` rounds is
:data:`benchmarks.cases.PAIRS_PER_ROUND` pairs of :data:`STEPS` steps per model, the two models
in alternating order (short pairs: load from other processes hits both sides of a pair alike);
the figure is the median over all pairs of the paired ratio ALiBi step ÷ stock step.

The cross-attention options' table (:func:`run_cross`) reads each pair's steps apart as well:
the first step of a pair is a sentence's first (it projects the source's keys/values and sets
up the options' per-sentence state), the later ones are what each further token costs.
"""

import argparse
import statistics
import time

import torch

from benchmarks.cases import CROSS, PAIRS_PER_ROUND, SAME, share_weights
from benchmarks.tables import table

#: per model family, (stock, ALiBi) architectures
FAMILIES = {"language model": ("transformer_lm", "alibi_transformer_lm"),
            "translation decoder": ("transformer", "alibi_transformer")}
SOURCE_LENGTH = 64
STEPS = 8

NOTES = (
    "A step: the decoder's forward for one new token per sequence (embedding, both layers with "
    "the cached keys/values, output layer). The stock model adds its sinusoidal position "
    "embedding; ALiBi slices its bias row from a cached table (see above: decoding steps), "
    "runs `sdpa` with it and writes the step's keys/values into its cache in place (a buffer "
    "with spare room) where stock fairseq concatenates the whole cache. Each pair starts from "
    "a cache filled from outside, so its first step copies the cache once, as stock's does. "
    "Translation: the decoder of a 2+2-layer model, the step's cross-attention (stock in "
    "both) over a 64-token source."
)


def build(arch, dims, vocab=1000, extra=()):
    """The decoder of ``arch`` (with the model flags ``extra``) with ``dims = (layers, embed,
    heads)``, eval mode, random weights, and a function ``step(tokens, state)`` running it on
    one new token per sequence."""
    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.models import build_model

    import fairseq_alibi  # noqa: F401  (registers the ALiBi models)

    layers, embed, heads = dims
    lm = arch.endswith("_lm")
    sides = ["decoder"] if lm else ["encoder", "decoder"]
    flags = [f"--{side}-{name}" for side in sides for name in (
        "layers", "embed-dim", "ffn-embed-dim", "attention-heads")]
    values = [str(v) for side in sides for v in (layers, embed, 4 * embed, heads)]
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        "/dev/null", "--task", "language_modeling" if lm else "translation", "--arch", arch,
        *[x for pair in zip(flags, values) for x in pair], "--cpu",
        *(["--decoder-input-dim", str(embed), "--decoder-output-dim", str(embed),
           "--tokens-per-sample", "8192", "--max-target-positions", "8192"] if lm else
          ["--max-source-positions", "8192", "--max-target-positions", "8192",
           "--share-all-embeddings"]), *extra,
    ])
    dictionary = Dictionary()
    for i in range(vocab - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    task = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary,
                              max_positions=lambda: (8192, 8192))
    model = build_model(convert_namespace_to_omegaconf(args).model, task).eval()
    if lm:
        return model.decoder, lambda tokens, state: model.decoder(
            tokens, incremental_state=state)
    generator = torch.Generator().manual_seed(0)
    source = torch.randint(4, vocab, (8, SOURCE_LENGTH), generator=generator)
    with torch.no_grad():
        memory = model.encoder(source, src_lengths=torch.full((8,), SOURCE_LENGTH))

    def step(tokens, state):
        encoder_out = model.encoder.reorder_encoder_out(
            memory, torch.arange(tokens.size(0)))  # the first B sources
        return model.decoder(tokens, encoder_out=encoder_out, incremental_state=state)
    return model.decoder, step


def filled_cache(decoder, batch, cached, keys):
    """An incremental state holding ``cached`` tokens of keys/values ``keys[layer]``."""
    state = {}
    for layer, (k, v) in zip(decoder.layers, keys):
        layer.self_attn._set_input_buffer(state, {
            "prev_key": k[:batch, :, :cached], "prev_value": v[:batch, :, :cached],
            "prev_key_padding_mask": None,
        })
    return state


def decode(model, tokens, cached, steps, keys):
    """``steps`` decoding steps after ``cached`` cached tokens; returns each step's seconds
    (the first one sets up the sentence's source state: its keys/values, and the options'
    per-sentence state)."""
    decoder, step = model
    batch = tokens.size(0)
    state = filled_cache(decoder, batch, cached, keys)
    times = []
    with torch.no_grad():
        for t in range(steps):
            start = time.perf_counter()
            step(tokens[:, : cached + t + 1], state)
            times.append(time.perf_counter() - start)
    return times


def sizes(quick, rounds, cached, batches):
    """``(dims, steps, cached, batches, rounds)`` of a run (toy ones with ``quick``); seeds
    torch's generator."""
    torch.manual_seed(0)
    if quick:
        return (2, 64, 4), 4, (16, 64), (1, 2), 1
    return (2, 256, 8), STEPS, cached, batches, rounds


def inputs(batch, cached, steps, dims):
    """``(tokens, keys)``: the tokens of ``cached + steps`` positions, the cached keys/values
    of every layer."""
    layers, embed, heads = dims
    tokens = torch.randint(4, 1000, (batch, cached + steps))
    keys = [(torch.randn(batch, heads, cached, embed // heads),
             torch.randn(batch, heads, cached, embed // heads)) for _ in range(layers)]
    return tokens, keys


#: which of a pair's steps a figure reads: all of them (a step's mean, the sentence's setup
#: spread over :data:`STEPS` steps), the first one (the sentence's setup), the later ones
PARTS = {"all": slice(None), "first": slice(0, 1), "later": slice(1, None)}


def paired(models, names, cached, steps, rounds, tokens, keys, parts=("all",)):
    """Per part of :data:`PARTS`: ``(base ms, other ms, median paired ratio other ÷ base)``
    per step of the two models ``names``, in alternating order (one tuple for one part)."""
    times = {name: [] for name in names}
    for name in names:  # warm-up
        decode(models[name], tokens, cached, steps, keys)
    for r in range(rounds * PAIRS_PER_ROUND):
        for name in (names if r % 2 == 0 else names[::-1]):  # alternating order
            times[name].append(decode(models[name], tokens, cached, steps, keys))
    figures = []
    for part in parts:
        base, other = ([statistics.mean(t[PARTS[part]]) for t in times[name]]
                       for name in names)
        ratio = statistics.median(a / s for a, s in zip(other, base))
        figures.append((statistics.median(base) * 1e3, statistics.median(other) * 1e3, ratio))
    return figures[0] if len(parts) == 1 else figures


def run_cross(quick=False, rounds=5, log=print, cached=(16, 64, 256), batches=(1, 4)):
    """Returns ``(shape, table)``: per-step times of the translation decoder with each
    cross-attention option ÷ today's ``alibi_transformer`` (same weights; the pointer's step is
    the option's own parameter), over a source of :data:`SOURCE_LENGTH` tokens, and the same
    for a second ``alibi_transformer`` (:data:`benchmarks.cases.SAME`). Each pair's steps are read three ways
    (:data:`PARTS`): the steps after a sentence's first (a token's cost), the first (the
    sentence's setup) and the mean of all of them."""
    dims, steps, cached, batches, rounds = sizes(quick, rounds, cached, batches)
    layers, embed, heads = dims
    base = "alibi_transformer"
    models = {base: build(base, dims)}
    for name, flags in {SAME: [], **CROSS}.items():
        models[name] = build(base, dims, extra=flags)
        share_weights(models[base][0], models[name][0])  # the option's own stay its own
    rows = []
    for name in [SAME, *CROSS]:
        for batch in batches:
            for S in cached:
                later, first, every = paired(models, (base, name), S, steps, rounds,
                                             *inputs(batch, S, steps, dims),
                                             parts=("later", "first", "all"))
                rows.append([name, batch, S, f"{later[0]:.3f}", f"{later[1]:.3f}",
                             f"{later[2]:.2f}", f"{first[2]:.2f}", f"{every[2]:.2f}"])
                log(f"[decoding] {name}, batch {batch}, {S} cached: alibi_transformer "
                    f"{later[0]:.3f} ms, with the option {later[1]:.3f} ms per later step, "
                    f"ratio {later[2]:.2f} (first step {first[2]:.2f}, all {every[2]:.2f})")
    shape = (f"{layers} layers, {embed} dims, {heads} heads, float32, a {SOURCE_LENGTH}-token "
             f"source, {rounds} round(s) of {PAIRS_PER_ROUND} pairs of {steps} steps per model, "
             f"alternating order, median of paired ratios")
    return shape, table(["option", "sequences", "cached tokens",
                         "alibi_transformer ms/step (after the first)",
                         "with the option ms/step (after the first)",
                         "option ÷ alibi_transformer, a step after the first",
                         "the first step (the sentence's setup)",
                         f"all {steps} steps"], rows)


def run_placement(quick=False, rounds=5, log=print, copies=4, cached=256):
    """Returns ``(shape, table)``: why the decoders compared here share their weight tensors.

    ``copies`` identical ``alibi_transformer`` decoders, one sequence, ``cached`` tokens: each
    copy's step ÷ the first copy's, once with the first copy's weights copied into the others
    (``load_state_dict``) and once with the very same tensors (:func:`benchmarks.cases.share_weights`)."""
    dims, steps, _, _, rounds = sizes(quick, rounds, (cached,), (1,))
    layers, embed, heads = dims
    rows = []
    for how in ("copied", "shared"):
        models = {f"copy {i + 1}": build("alibi_transformer", dims) for i in range(copies)}
        first = models["copy 1"][0]
        for name, (decoder, _) in list(models.items())[1:]:
            if how == "copied":
                decoder.load_state_dict(first.state_dict())
            else:
                share_weights(first, decoder)
        for name in list(models)[1:]:
            first_ms, copy_ms, ratio = paired(models, ("copy 1", name), cached, steps, rounds,
                                              *inputs(1, cached, steps, dims))
            rows.append([how, name, f"{first_ms:.3f}", f"{copy_ms:.3f}", f"{ratio:.2f}"])
            log(f"[decoding] weights {how}, {name} ÷ copy 1: {ratio:.2f}")
    shape = (f"alibi_transformer, {layers} layers, {embed} dims, {heads} heads, float32, one "
             f"sequence, {cached} cached tokens, {rounds} round(s) of {PAIRS_PER_ROUND} pairs of "
             f"{steps} steps, median of paired ratios")
    return shape, table(["weights", "decoder", "copy 1 ms/step", "this copy ms/step",
                         "÷ copy 1"], rows)


def run(quick=False, rounds=5, log=print, cached=(256, 1024, 4096), batches=(1, 4)):
    """Returns ``(shape, table)``: per-step times and the ALiBi ÷ stock ratio per model family,
    batch and cache size."""
    dims, steps, cached, batches, rounds = sizes(quick, rounds, cached, batches)
    layers, embed, heads = dims
    rows = []
    for family, archs in FAMILIES.items():
        models = {arch: build(arch, dims) for arch in archs}
        share_weights(models[archs[0]][0], models[archs[1]][0])  # positions differ
        for batch in batches:
            for S in cached:
                stock_ms, alibi_ms, ratio = paired(models, archs, S, steps, rounds,
                                                   *inputs(batch, S, steps, dims))
                rows.append([family, batch, S, f"{stock_ms:.3f}", f"{alibi_ms:.3f}",
                             f"{ratio:.2f}"])
                log(f"[decoding] {family}, batch {batch}, {S} cached: stock {stock_ms:.3f} ms, "
                    f"alibi {alibi_ms:.3f} ms per step, ratio {ratio:.2f}")
    shape = (f"{layers} layers, {embed} dims, {heads} heads, float32, {rounds} round(s) of "
             f"{PAIRS_PER_ROUND} pairs of {steps} steps per model after the cached tokens, "
             f"alternating order, median of paired ratios")
    return shape, table(["decoder", "sequences", "cached tokens", "stock ms/step",
                         "ALiBi ms/step", "ALiBi ÷ stock"], rows)
