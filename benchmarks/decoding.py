"""Benchmark 5: cached (incremental) decoding, ``alibi_transformer_lm`` vs stock ``transformer_lm``.

The time of one decoding step with ``S`` tokens already in the KV cache, per model: both
decoders get the same weights (the stock one its sinusoidal positions, which have none), their
caches are filled with the same random keys/values of ``S`` tokens (exactly what ``S`` earlier
steps leave there), then ``steps`` tokens are decoded one at a time, as ``fairseq-generate`` and
``hub.generate`` do (``decoder(tokens, incremental_state=...)``). Each of ``rounds`` rounds is
:data:`PAIRS_PER_ROUND` pairs of :data:`STEPS` steps per model, the two models in alternating
order (short pairs: load from other processes hits both sides of a pair alike); the figure is
the median over all pairs of the paired ratio ALiBi step ÷ stock step.
"""

import argparse
import statistics
import time

import torch

from benchmarks.common import table

ARCHS = ("transformer_lm", "alibi_transformer_lm")
STEPS = 8
PAIRS_PER_ROUND = 4

NOTES = (
    "A step: the decoder's forward for one new token per sequence (embedding, both layers with "
    "the cached keys/values, output layer). The stock model adds its sinusoidal position "
    "embedding; ALiBi slices its bias row from a cached table (see above: decoding steps) and "
    "runs `sdpa` with it."
)


def build(arch, dims, vocab=1000):
    """A decoder of ``arch`` with ``dims = (layers, embed, heads)``, eval mode, random weights."""
    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.models import build_model

    import fairseq_alibi  # noqa: F401  (registers the ALiBi models)

    layers, embed, heads = dims
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        "/dev/null", "--task", "language_modeling", "--arch", arch,
        "--decoder-layers", str(layers), "--decoder-embed-dim", str(embed),
        "--decoder-ffn-embed-dim", str(4 * embed), "--decoder-attention-heads", str(heads),
        "--decoder-input-dim", str(embed), "--decoder-output-dim", str(embed),
        "--tokens-per-sample", "8192", "--max-target-positions", "8192", "--cpu",
    ])
    dictionary = Dictionary()
    for i in range(vocab - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    task = argparse.Namespace(source_dictionary=dictionary, target_dictionary=dictionary)
    cfg = convert_namespace_to_omegaconf(args)
    return build_model(cfg.model, task).decoder.eval()


def filled_cache(decoder, batch, cached, keys):
    """An incremental state holding ``cached`` tokens of keys/values ``keys[layer]``."""
    state = {}
    for layer, (k, v) in zip(decoder.layers, keys):
        layer.self_attn._set_input_buffer(state, {
            "prev_key": k[:batch, :, :cached], "prev_value": v[:batch, :, :cached],
            "prev_key_padding_mask": None,
        })
    return state


def decode(decoder, tokens, cached, steps, keys):
    """``steps`` decoding steps after ``cached`` cached tokens; returns seconds per step."""
    batch = tokens.size(0)
    state = filled_cache(decoder, batch, cached, keys)
    start = time.perf_counter()
    with torch.no_grad():
        for t in range(steps):
            decoder(tokens[:, : cached + t + 1], incremental_state=state)
    return (time.perf_counter() - start) / steps


def run(quick=False, rounds=5, log=print, cached=(256, 1024, 4096), batches=(1, 4)):
    """Returns ``(shape, table)``: per-step times and the ALiBi ÷ stock ratio per cache size."""
    torch.manual_seed(0)
    dims = (2, 64, 4) if quick else (2, 256, 8)
    steps = 4 if quick else STEPS
    cached = (16, 64) if quick else cached
    batches = (1, 2) if quick else batches
    rounds = 1 if quick else rounds
    decoders = {arch: build(arch, dims) for arch in ARCHS}
    decoders["alibi_transformer_lm"].load_state_dict(
        decoders["transformer_lm"].state_dict(), strict=False)  # same weights; positions differ
    layers, embed, heads = dims
    head_dim = embed // heads
    rows = []
    for batch in batches:
        for S in cached:
            tokens = torch.randint(4, 1000, (batch, S + steps))
            keys = [(torch.randn(batch, heads, S, head_dim), torch.randn(batch, heads, S, head_dim))
                     for _ in range(layers)]
            times = {arch: [] for arch in ARCHS}
            for arch in ARCHS:  # warm-up
                decode(decoders[arch], tokens, S, steps, keys)
            for r in range(rounds * PAIRS_PER_ROUND):
                order = ARCHS if r % 2 == 0 else ARCHS[::-1]  # alternating order
                for arch in order:
                    times[arch].append(decode(decoders[arch], tokens, S, steps, keys))
            stock, alibi = times["transformer_lm"], times["alibi_transformer_lm"]
            ratio = statistics.median(a / s for a, s in zip(alibi, stock))
            rows.append([batch, S, f"{statistics.median(stock) * 1e3:.3f}",
                         f"{statistics.median(alibi) * 1e3:.3f}", f"{ratio:.2f}"])
            log(f"[decoding] batch {batch}, {S} cached: stock {statistics.median(stock)*1e3:.3f} "
                f"ms, alibi {statistics.median(alibi)*1e3:.3f} ms per step, ratio {ratio:.2f}")
    shape = (f"{layers} layers, {embed} dims, {heads} heads, float32, {rounds} round(s) of "
             f"{PAIRS_PER_ROUND} pairs of {steps} steps per model after the cached tokens, "
             f"alternating order, median of paired ratios")
    return shape, table(["sequences", "cached tokens", "stock ms/step", "ALiBi ms/step",
                         "ALiBi ÷ stock"], rows)
