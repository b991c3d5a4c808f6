"""Benchmark 4: what the bidirectional variants cost (does ``one_sided`` waste half its work?).

Attention level (``B=4, H=8, D=64``, float32): every encoder variant with the ``fold`` backend
(the bias folded into the fused kernel) and the ``sdpa`` backend (the kernel reading the
``(H, L, L)`` float mask, built once, as a model shares it between its layers), forward and
forward+backward, against the stock encoder's unbiased bidirectional attention (the limit) and
the unbiased causal one (half the work); forward only, ``flex (compiled)`` too. Rows are named
``variant, backend``. ``auto`` picks ``fold`` for ``one_sided`` from
``tuning.FOLD_MIN_LENGTH`` keys on, ``sdpa`` for the others while the mask fits
``tuning.DENSE_MASK_BUDGET``.

Model level: ``alibi_roberta`` training steps (``masked_lm`` criterion, Adam, fairseq's
Trainer) per ``--alibi-variant``, against ``--alibi-variant none`` — stock RoBERTa attention
with learned position embeddings — with the GPT-2 vocabulary (50,265 symbols, as RoBERTa's
dictionary): a toy vocabulary hides what the output layer costs.

Masked-LM heads: the same training step with the CLAP head (``--mlm-head clap``, with and
without ALiBi) against the stock RoBERTa head, paired per round, at the GPT-2 vocabulary size,
and, as the reference of what it cost before, the CLAP head computed as it used to be
(``normalize(W)`` materialised at every step).
"""

import math
import os

import torch
import torch.nn.functional as F

from benchmarks.cases import compiled_flex as _compiled_flex
from benchmarks.tables import table
from benchmarks.timing import Rounds, backward_call, forward_call
from benchmarks.trainer import trainer_from_flags, write_dictionary
from fairseq_alibi.modules.bias import AlibiBias
from fairseq_alibi.modules.attention.fold import folded_attention

ENCODER_VARIANTS = ("symmetric", "one_sided", "offset", "asymmetric")
#: RoBERTa's dictionary: the 50,257 GPT-2 BPE ids, 4 specials, 3 filler words and <mask>
GPT2_VOCAB = 50265


def attention_table(quick, rounds, log):
    torch.manual_seed(0)
    B, H, D = (2, 4, 16) if quick else (4, 8, 64)
    lengths = (64,) if quick else (512, 1024, 2048)
    scale = 1 / math.sqrt(D)
    rows = []
    for L in lengths:
        q, k, v = (torch.randn(B, H, L, D) for _ in range(3))
        grad = torch.randn(B, H, L, D)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        cases = {
            "no bias, bidirectional": lambda q, k, v: F.scaled_dot_product_attention(
                q, k, v, scale=scale),
            "no bias, causal": lambda q, k, v: F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=scale),
        }
        flex = {}
        for variant in ENCODER_VARIANTS:
            ratio = 0.5 if variant == "asymmetric" else 1.0
            alibi = AlibiBias(H, variant=variant, future_slope_ratio=ratio)

            slopes, future = alibi.slopes_of()
            dense = alibi(L, L)[None]  # built once per batch, shared by a model's layers

            def folded(q, k, v, variant=variant, slopes=slopes, future=future):
                return folded_attention(q, k, v, slopes, future, variant, scale)

            def masked(q, k, v, dense=dense):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=scale)

            def compiled_flex(q, k, v, alibi=alibi):
                return _compiled_flex(q, k, v, alibi, scale)

            cases[f"{variant}, fold"] = folded
            cases[f"{variant}, sdpa"] = masked
            if not quick:
                flex[f"{variant}, flex (compiled)"] = compiled_flex
        log(f"[encoder] L={L}")

        tf = Rounds({n: forward_call(f, q, k, v) for n, f in {**cases, **flex}.items()}, rounds)
        tb = Rounds({n: backward_call(f, leaves, grad) for n, f in cases.items()}, rounds)
        base = "no bias, bidirectional"
        for name in {**cases, **flex}:
            backward = [f"{tb.median(name):.3f}", f"{tb.ratio(name, base):.2f}"] if name in cases \
                else ["no CPU backward", "–"]
            rows.append([L, name, f"{tf.median(name):.3f}", f"{tf.ratio(name, base):.2f}",
                         *backward])
    shape = f"B={B}, H={H}, D={D}, float32, {rounds} interleaved round(s), median"
    return shape, table(["L", "attention", "forward s", "× bidirectional", "fwd+bwd s",
                         "× bidirectional"], rows)


def timed_training_steps(models, batch, length, rounds, quick):
    """:class:`Rounds` of one training step of each ``{name: (trainer, task)}``, interleaved,
    each on its own fixed masked batch."""
    samples = {n: masked_batch(task, batch, length, seed=0) for n, (_, task) in models.items()}

    def step(name):
        def call():
            models[name][0].train_step([samples[name]])
        return call

    return Rounds({n: step(n) for n in models}, rounds, warmup=1 if quick else 2)


def build_masked_lm(data, variant, length, dims, extra=()):
    return trainer_from_flags([
        data, "--task", "masked_lm", "--arch", "alibi_roberta", "--alibi-variant", variant,
        "--cpu", "--tokens-per-sample", str(length), "--criterion", "masked_lm",
        "--optimizer", "adam", "--lr", "1e-4", "--clip-norm", "1.0", "--seed", "1", *dims,
        *extra,
    ])


def dictionary_folder(work, vocab):
    """A dictionary of ``vocab`` symbols in all (the task adds 4 specials and ``<mask>``)."""
    return write_dictionary(os.path.join(work, f"encoder-dict-{vocab}"), vocab - 5)


def masked_batch(task, batch, length, seed, ratio=0.15):
    gen = torch.Generator().manual_seed(seed)
    d = task.source_dictionary
    tokens = torch.randint(d.nspecial, len(d) - 1, (batch, length), generator=gen)
    masked = torch.rand(batch, length, generator=gen) < ratio
    masked[:, 0] = True  # at least one target per row
    return {
        "id": torch.arange(batch),
        "nsentences": batch,
        "ntokens": batch * length,
        "net_input": {"src_tokens": tokens.masked_fill(masked, task.mask_idx),
                      "src_lengths": torch.full((batch,), length)},
        "target": tokens.masked_fill(~masked, d.pad()),
    }


def model_table(work, quick, rounds, log):
    from fairseq.models import MODEL_REGISTRY

    import fairseq_alibi  # noqa: F401

    if "alibi_roberta" not in MODEL_REGISTRY:
        return None
    if quick:
        dims = ["--encoder-layers", "1", "--encoder-embed-dim", "32",
                "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2"]
        lengths, tokens_per_batch, vocab = (32,), 128, 100
    else:
        dims = ["--encoder-layers", "2", "--encoder-embed-dim", "256",
                "--encoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4"]
        lengths, tokens_per_batch, vocab = (512, 1024), 4096, GPT2_VOCAB
    data = dictionary_folder(work, vocab)
    rows = []
    for L in lengths:
        batch = max(1, tokens_per_batch // L)
        models = {v: build_masked_lm(data, v, L, dims) for v in ("none",) + ENCODER_VARIANTS}
        log(f"[encoder] alibi_roberta L={L}")
        timed = timed_training_steps(models, batch, L, rounds, quick)
        for v in models:
            name = "none (stock: learned positions)" if v == "none" else v
            rows.append([L, name, f"{batch * L / timed.median(v):,.0f}",
                         f"{1 / timed.ratio(v, 'none'):.2f}"])
    shape = (f"alibi_roberta, {' '.join(dims).replace('--encoder-', '')}, vocab {vocab:,}, "
             f"{tokens_per_batch} tokens/batch, float32, {rounds} interleaved round(s), median")
    return shape, table(["L", "--alibi-variant", "train tokens/s", "throughput × none"], rows)


#: the heads compared: name -> (--alibi-variant, extra flags); the stock head of the same
#: variant is each CLAP row's pair
HEAD_CASES = {
    "none, roberta head": ("none", []),
    "offset, roberta head": ("offset", []),
    "offset, clap + zero mask": ("offset", ["--mlm-head", "clap", "--zero-mask-embedding"]),
    "none, clap": ("none", ["--mlm-head", "clap"]),
    "offset, clap + zero mask, normalize(W) materialised (before)":
        ("offset", ["--mlm-head", "clap", "--zero-mask-embedding"]),
}
HEAD_PAIRS = {"offset, clap + zero mask": "offset, roberta head",
              "none, clap": "none, roberta head",
              "offset, clap + zero mask, normalize(W) materialised (before)":
                  "offset, roberta head"}


def materialise_normalized_weight(head):
    """Make ``head`` compute CLAP as it did before: ``β · linear(x, normalize(W))`` with the
    whole normalised matrix built (forward and backward) at every call; the reference row."""
    from fairseq_alibi.modules.clap_head import normalize_rows

    def forward(features, masked_tokens=None, **kwargs):
        if masked_tokens is not None:
            features = features[masked_tokens, :]
        weight = normalize_rows(head.weight)
        return head.beta.to(features.dtype) * F.linear(features, weight.to(features.dtype))

    head.forward = forward


#: the options of the bias compared with offset alone (the encoder's forward+backward with each)
OPTION_CASES = {
    "offset": ("offset", []),
    "offset, --alibi-global-tokens 1": ("offset", ["--alibi-global-tokens", "1"]),
    "offset, --alibi-heads 2": ("offset", ["--alibi-heads", "2"]),
    "offset, global token + 2 heads": ("offset", ["--alibi-global-tokens", "1",
                                                   "--alibi-heads", "2"]),
}
OPTION_PAIRS = {name: "offset" for name in OPTION_CASES if name != "offset"}


def paired_table(work, quick, rounds, log, cases, pairs, reference, what):
    """Training tokens/s of each case, paired per round with its pair and with ``reference``,
    at the size where a user measured the CLAP head at a third of every step."""
    from fairseq.models import MODEL_REGISTRY

    import fairseq_alibi  # noqa: F401

    if "alibi_roberta" not in MODEL_REGISTRY:
        return None
    if quick:
        dims = ["--encoder-layers", "1", "--encoder-embed-dim", "32",
                "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2"]
        L, batch, vocab = 16, 4, 100
    else:
        dims = ["--encoder-layers", "4", "--encoder-embed-dim", "256",
                "--encoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4"]
        L, batch, vocab = 64, 16, GPT2_VOCAB
    data = dictionary_folder(work, vocab)
    models = {}
    for name, (variant, extra) in cases.items():
        models[name] = build_masked_lm(data, variant, L, dims, extra)
        if "(before)" in name:
            materialise_normalized_weight(models[name][0].model.encoder.lm_head)
    log(f"[encoder] {what}, vocab {vocab}")
    timed = timed_training_steps(models, batch, L, rounds, quick)
    rows = []
    for name in models:
        pair = pairs.get(name)
        rows.append([name, f"{batch * L / timed.median(name):,.0f}",
                     f"{1 / timed.ratio(name, pair):.2f}" if pair else "–",
                     f"{1 / timed.ratio(name, reference):.2f}"])
    shape = (f"alibi_roberta, {' '.join(dims).replace('--encoder-', '')}, L={L}, {batch} "
             f"sequences/batch, vocab {vocab:,}, float32, {rounds} interleaved round(s), median")
    return shape, rows


def head_table(work, quick, rounds, log):
    """Training tokens/s of the CLAP head against the stock head, at the GPT-2 vocabulary."""
    found = paired_table(work, quick, rounds, log, HEAD_CASES, HEAD_PAIRS,
                         "none, roberta head", "masked-LM heads")
    if found is None:
        return None
    shape, rows = found
    return shape, table(["configuration", "train tokens/s", "× the stock head (same variant)",
                         "× none, roberta head"], rows)


def option_table(work, quick, rounds, log):
    """Training tokens/s (forward+backward) with each option of the bias against offset."""
    found = paired_table(work, quick, rounds, log, OPTION_CASES, OPTION_PAIRS, "offset",
                         "bias options")
    if found is None:
        return None
    shape, rows = found
    return shape, table(["configuration", "train tokens/s", "throughput × offset"],
                        [row[:3] for row in rows])


def run(work, quick=False, rounds=5, log=print):
    rounds = 1 if quick else rounds
    out = []
    shape, body = attention_table(quick, rounds, log)
    out.append(("Encoder variants, attention (" + shape + ")", body, ""))
    found = model_table(work, quick, rounds, log)
    if found is not None:
        shape, body = found
        out.append(("Encoder variants, masked-LM training (" + shape + ")", body, ""))
    return out + run_heads(work, quick, rounds, log)


def run_heads(work, quick=False, rounds=5, log=print):
    """The masked-LM heads' table and the bias options' table (``--only heads``)."""
    rounds = 1 if quick else rounds
    out = []
    for title, make in (("Masked-LM heads, training", head_table),
                        ("Encoder bias options, training", option_table)):
        found = make(work, quick, rounds, log)
        if found is not None:
            shape, body = found
            out.append((f"{title} ({shape})", body, ""))
    return out
