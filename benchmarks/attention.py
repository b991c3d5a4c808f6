"""Benchmark 2: causal ALiBi attention, forward and forward+backward, against its peers.

Given ``(B, H, L, D)`` float32 queries, keys and values (the attention alone, as the figures of
the issue; projections would add the same time to every row):

* ``no bias``: ``scaled_dot_product_attention(is_causal=True)`` — the limit;
* ``fold``: the bias folded into the fused kernel, no bias tensor — what ``auto`` runs on the
  CPU from ``tuning.FOLD_MIN_LENGTH`` keys on (below, ``sdpa``);
* ``sdpa``: the same kernel reading the ``(H, L, L)`` float mask that a model builds once per
  batch and shares between its layers;
* ``original (B·H,L,L) mask``: Press et al.'s code, whose decoder keeps a materialised
  ``(B·H, L, L)`` causal + ALiBi mask (built once, sliced per batch) and hands it to fairseq's
  attention (which runs it through ``scaled_dot_product_attention`` as a float mask);
* ``BLOOM baddbmm``: HuggingFace BLOOM's ``alibi.baddbmm(q, kᵀ)`` with a ``(B·H, 1, L)`` bias,
  ``masked_fill`` of the causal mask, float32 softmax, ``bmm``;
* ``naive``: this package's explicit reference;
* ``flex (compiled)``: forward only (PyTorch has no CPU backward for flex_attention); the
  ``flex`` backend itself runs eager on the CPU (tests/attention/test_attention.py says why),
  this row times the compiled kernel.

Memory: the peak of tensor bytes during one forward+backward (see ``timing.peak_bytes``), and
the bias a method keeps between calls (the original's mask buffer).
"""

import math

import torch
import torch.nn.functional as F

from benchmarks.cases import compiled_flex
from benchmarks.tables import table
from benchmarks.timing import Rounds, backward_call, forward_call, mib, peak_bytes
from fairseq_alibi.modules.attention import dense as dense_backends
from fairseq_alibi.modules.attention.fold import folded_attention
from fairseq_alibi.modules.bias import AlibiBias

FORWARD_ONLY = {"flex (compiled)"}


def bloom_alibi(slopes, batch, length):
    """BLOOM's ``build_alibi_tensor`` without padding: ``(B·H, 1, L)`` = ``m_h·j``."""
    positions = torch.arange(length, dtype=torch.float32)
    alibi = slopes[:, None] * positions[None, :]
    return alibi[None].expand(batch, -1, -1).reshape(batch * len(slopes), 1, length)


def bloom_attention(q, k, v, alibi, causal_mask, scale):
    """BLOOM's attention core (modeling_bloom.BloomAttention.forward, no cache, no dropout)."""
    B, H, L, D = q.shape
    scores = alibi.baddbmm(
        batch1=q.reshape(B * H, L, D), batch2=k.reshape(B * H, L, D).transpose(1, 2),
        beta=1.0, alpha=scale,
    ).view(B, H, L, L)
    scores = torch.masked_fill(scores, causal_mask, torch.finfo(scores.dtype).min)
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.bmm(probs.view(B * H, L, L), v.reshape(B * H, L, D)).view(B, H, L, D)


def original_mask(slopes, batch, length):
    """The original code's buffer: ``triu(-inf) + m·j``, repeated to ``(B·H, L, L)``."""
    future = torch.triu(torch.full((length, length), float("-inf")), 1)
    alibi = slopes[:, None, None] * torch.arange(length, dtype=torch.float32)[None, None, :]
    return (future[None] + alibi).repeat(batch, 1, 1)


def methods(B, H, L, D, with_flex):
    """name -> (function of (q, k, v), bytes of bias it keeps between calls)."""
    scale = 1 / math.sqrt(D)
    alibi = AlibiBias(H, variant="causal")
    slopes, _ = alibi.slopes_of()
    original = original_mask(slopes, B, L)  # kept by the model, like the original's buffer
    bloom_bias = bloom_alibi(slopes, B, L)
    causal_mask = torch.ones(L, L, dtype=torch.bool).triu(1)

    # built once and shared by every layer in a model (AlibiBias memoises it)
    dense = alibi(L, L)[None]
    dense_bytes = dense.numel() * dense.element_size()

    found = {
        "no bias": (lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scale), 0),
        "fold": (lambda q, k, v: folded_attention(
            q, k, v, slopes, None, "causal", scale), 0),
        "sdpa": (lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, attn_mask=dense, scale=scale), dense_bytes),
        "original (B·H,L,L) mask": (lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, attn_mask=original.view(B, H, L, L), scale=scale),
            original.numel() * original.element_size()),
        "BLOOM baddbmm": (lambda q, k, v: bloom_attention(
            q, k, v, bloom_bias, causal_mask, scale), bloom_bias.numel() * 4),
        "naive": (lambda q, k, v: dense_backends.naive(
            q, k, v, alibi.layer(0), None, None, 0.0, scale), dense_bytes),
    }
    if with_flex:
        found["flex (compiled)"] = (lambda q, k, v: compiled_flex(q, k, v, alibi, scale), 0)
    return found


def run(quick=False, rounds=5, lengths=None, max_dense_length=2048, log=print):
    """Returns Markdown tables (forward; forward+backward and memory)."""
    torch.manual_seed(0)
    B, H, D = (2, 4, 16) if quick else (4, 8, 64)
    lengths = lengths or ((64,) if quick else (512, 1024, 2048, 4096))
    rounds = 1 if quick else rounds
    fwd_rows, fb_rows = [], []
    for L in lengths:
        q, k, v = (torch.randn(B, H, L, D) for _ in range(3))
        grad = torch.randn(B, H, L, D)
        found = methods(B, H, L, D, with_flex=True)
        if L > max_dense_length:  # the (B,H,L,L) scores of these need several GiB
            for name in ("original (B·H,L,L) mask", "BLOOM baddbmm", "naive"):
                found.pop(name)
        log(f"[attention] L={L}: {', '.join(found)}")

        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        fwd = Rounds({n: forward_call(f, q, k, v) for n, (f, _) in found.items()}, rounds)
        trainable = {n: f for n, (f, _) in found.items() if n not in FORWARD_ONLY}
        fb = Rounds({n: backward_call(f, leaves, grad) for n, f in trainable.items()}, rounds)
        for name, (fn, kept) in found.items():
            fwd_rows.append([L, name, f"{fwd.median(name):.3f}", f"{fwd.ratio(name, 'no bias'):.2f}"])
            if name in trainable:
                peak = peak_bytes(backward_call(fn, leaves, grad))
                fb_rows.append([L, name, f"{fb.median(name):.3f}", f"{fb.ratio(name, 'no bias'):.2f}",
                                mib(peak), mib(kept)])
            else:
                fb_rows.append([L, name, "no CPU backward", "–", "–", "–"])
            log(f"[attention] L={L} {name}: fwd {fwd.median(name):.3f}s "
                f"({fwd.ratio(name, 'no bias'):.2f}x)")
    shape = f"B={B}, H={H}, D={D}, float32, causal, {rounds} interleaved round(s), median"
    forward_table = table(["L", "method", "forward s", "× no bias"], fwd_rows)
    fb_table = table(
        ["L", "method", "fwd+bwd s", "× no bias", "peak MiB (fwd+bwd)", "bias kept MiB"], fb_rows
    )
    return shape, forward_table, fb_table


def run_modules(quick=False, rounds=5, lengths=None, log=print):
    """The same comparison through fairseq's attention modules (projections included).

    ``stock fairseq``: ``MultiheadAttention`` with the ``(L, L)`` float causal mask that stock
    ``transformer_lm`` passes; ``original``: the same module given the ``(B·H, L, L)`` causal +
    ALiBi mask, as Press et al.'s decoder does; ``alibi (auto)``: ``AlibiMultiheadAttention``.
    """
    from fairseq.modules import MultiheadAttention

    from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention

    torch.manual_seed(0)
    B, H, D = (2, 4, 16) if quick else (4, 8, 64)
    C = H * D
    lengths = lengths or ((64,) if quick else (1024, 2048))
    rounds = 1 if quick else rounds
    stock = MultiheadAttention(C, H, self_attention=True)
    alibi = AlibiBias(H, variant="causal")  # as a model builds it
    ours = AlibiMultiheadAttention(C, H, alibi.layer(0))
    ours.load_state_dict(stock.state_dict())
    rows = []
    for L in lengths:
        x = torch.randn(L, B, C)
        grad = torch.randn(L, B, C)
        causal = torch.triu(torch.full((L, L), float("-inf")), 1)
        slopes, _ = alibi.slopes_of()
        original = original_mask(slopes, B, L)
        cases = {
            "stock fairseq (no bias)":
                lambda x: stock(x, x, x, attn_mask=causal, need_weights=False)[0],
            "original (B·H,L,L) mask":
                lambda x: stock(x, x, x, attn_mask=original, need_weights=False)[0],
            "alibi (auto)": lambda x: ours(x, x, x, need_weights=False)[0],
        }
        log(f"[attention modules] L={L}")
        leaves = [x.clone().requires_grad_()]
        tf = Rounds({n: forward_call(f, x) for n, f in cases.items()}, rounds)
        params = {"alibi (auto)": list(ours.parameters())}

        def fb(name):  # the projections' weight gradients are part of the module's backward
            return backward_call(cases[name], leaves, grad, params.get(name, stock.parameters()))

        tb = Rounds({n: fb(n) for n in cases}, rounds)
        base = "stock fairseq (no bias)"
        kept = {"stock fairseq (no bias)": causal, "original (B·H,L,L) mask": original}
        for name in cases:
            mask = kept.get(name)
            rows.append([L, name, f"{tf.median(name):.3f}", f"{tf.ratio(name, base):.2f}",
                         f"{tb.median(name):.3f}", f"{tb.ratio(name, base):.2f}",
                         mib(peak_bytes(fb(name))),
                         mib(0 if mask is None else mask.numel() * mask.element_size())])
    shape = f"B={B}, H={H}, D={D} (embed {C}), float32, {rounds} interleaved round(s), median"
    return shape, table(["L", "module", "forward s", "× stock", "fwd+bwd s", "× stock",
                         "peak MiB (fwd+bwd)", "mask kept MiB"], rows)
