"""Slope windows on the CPU: ALiBi attention that skips the keys beyond each head's window
instead of masking them.

With a cutoff ``T`` head ``h`` keeps the keys at ``i - j <= back_h`` and ``j - i <= ahead_h``
(:func:`~fairseq_alibi.alibi.variant_windows`); the result is
``softmax(q·kᵀ·scale + windowed_alibi_bias) v``
(:func:`~fairseq_alibi.alibi.windowed_alibi_bias`, the dense definition). :func:`plan` says
how, per group of heads with the same windows (:class:`Group`; ``dispatch.windowed_cost``
prices the same plan for ``auto``):

* ``fold``: a window that drops no key of a whole sequence runs as the fold backend
  (:func:`.fold.folded_attention`, no bias tensor);
* ``chunks`` (``whole``: one chunk of every query): chunk ``k`` of ``c`` queries, ``s … s+c-1``,
  reads the ``R = back + c + ahead`` keys ``s-back … s+c-1+ahead``, a strided view of the keys
  laid out once per group and pass with a column that hides a key (out of the sequence,
  padding, a global token: :class:`_Chunks`); one fused kernel call per sequence
  (:func:`.fold.kernel_forward`) with one ``(H_g, c, R)`` bias shared by every chunk (only
  ``i - j`` counts: :func:`_chunk_bias`). The work is ``T·R`` per head instead of ``T·S`` and
  no ``(H, T, S)`` tensor exists.

The *prefix*, the first ``max(N, S)`` keys of ``N`` global tokens (bias 0, for every query)
and ``S`` attention sinks (``--alibi-window-sinks``: their true bias ``-m·(i - j)``, for the
queries whose window they are beyond), is one small pass of every head, merged with the
windows by the log-sum-exps (:class:`_Merged`). The queries among the first ``max(N, S)``
positions are one dense call of their own where they need it (:func:`dense_queries`).

Backward: the kernel's own from the merged output and log-sum-exp, a key block of every chunk
at a time (:meth:`_Chunks.backward`), the prefix's by hand; learned slopes get theirs from the
shared bias's (``Σ dS`` over the chunks) and the prefix's.

Queries are aligned to the end of the keys (a KV cache), as everywhere. An all-padding row
stays finite (an output nothing reads), as with the other backends. Float32 and float64.
"""

import functools
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq_alibi.alibi import (ONE_WAY_VARIANTS, alibi_bias_between, mask_value, masked_with,
                                 variant_windows)
from fairseq_alibi.modules.attention import dense, fold, tuning
from fairseq_alibi.modules.attention.capabilities import Capabilities

#: what :func:`run` serves: the slopes' bias (with windows or without: every window unbounded)
#: on the CPU in float32/64, whole sequences or a KV cache (one that kept its attention sinks
#: too), key padding, global tokens, attention sinks, the learned scales' gradient; no
#: attention dropout, no extra attn_mask
CAPABILITIES = Capabilities(
    kinds=("distance",), devices=("cpu",), dtypes=fold.FOLD_DTYPES, dropout=False,
    attn_mask=False, windows=True, sinks=True, sink_cache=True,
    missing=fold.CAPABILITIES.missing)


def chunk_size(back: int, ahead: int) -> int:
    """Queries per chunk for a window ``back + ahead``: ``1 /`` :data:`.tuning.CHUNK_FRACTION`
    of it (rounded up to a power of two first), within :data:`.tuning.MIN_CHUNK` …
    :data:`.tuning.MAX_CHUNK`."""
    span = max(1, back + ahead)
    part = (1 << (span - 1).bit_length()) // tuning.CHUNK_FRACTION
    return max(tuning.MIN_CHUNK, min(tuning.MAX_CHUNK, part))


def decoding_reach(bias) -> Optional[int]:
    """How many of the latest keys a KV cache must keep after a call with ``bias`` (a
    :class:`~.dispatch.CallBias`): ``max_h back_h``, or ``None`` (every key) unless every
    later query's keys are bounded so.

    The next query, at position ``S``, reads the keys ``S - back_h … S`` of head ``h``
    (:func:`~fairseq_alibi.alibi.variant_windows`): the last ``max_h back_h`` cached ones and
    its own. A bound holds for a ``"distance"`` bias (``-m_h·f(i - j)``: the same for a cache
    that starts later, since queries are aligned to the end of the keys) with slope windows, of
    the ``causal`` variant (looks back only), with every head windowed (``--alibi-heads``'
    unbiased heads have ``None``: unbounded) and no global tokens (the first keys stay visible
    to every query). Attention sinks (``bias.sinks``) are kept besides: the cache keeps its
    first ``sinks`` keys and these (``AlibiMultiheadAttention``). A ``"rows"`` bias
    (``--alibi-length-scale``'s per-sequence slopes, which depend on the sequence's real length)
    gets no bound.
    """
    if (bias.kind != "distance" or not bias.windowed or bias.variant != "causal"
            or bias.global_tokens):
        return None
    windows = bias.windows()
    if windows is None or any(w is None for w in windows[0]):
        return None
    return max(windows[0])


def _groups(windows: Tuple[Sequence[Optional[int]], Sequence[Optional[int]]]):
    """``{(back, ahead): [heads]}``: heads with the same windows, in head order."""
    found = {}
    for h, key in enumerate(zip(*windows)):
        found.setdefault(key, []).append(h)
    return found


def _within(windows, T, S):
    """``windows`` with every reach that no key of the call exceeds (``back >= S - 1``,
    ``ahead >= T - 1``) unbounded: heads whose windows drop no key share a group."""
    def capped(reach, most):
        return None if reach is not None and reach >= most else reach
    return ([capped(b, S - 1) for b in windows[0]], [capped(a, T - 1) for a in windows[1]])


@dataclass(frozen=True)
class Group:
    """How one head group of a call is computed (:func:`plan`): ``kind``

    * ``fold``: the fold backend, the window drops no key (``looks_ahead``: a ``one_sided``
      head looking ahead, folded on the reversed sequence);
    * ``whole``: one chunk of every query, reading the ``back`` keys before the first and every
      later one (a ``(T, back + T)`` bias);
    * ``chunks``: chunks of ``size`` queries, each reading ``back`` keys before its first query
      and ``ahead`` after its last.

    ``sinks``: the attention sinks its queries read besides (0 where the window drops no key
    or looks ahead only).
    """

    heads: Tuple[int, ...]
    window: Tuple[Optional[int], Optional[int]]
    kind: str
    back: int = 0
    ahead: int = 0
    size: int = 0
    sinks: int = 0
    looks_ahead: bool = False

    def keys(self, variant: str, length: int) -> float:
        """About how many keys each query reads, on average over a sequence of ``length``."""
        if self.kind == "fold":
            return length / 2 if variant in ONE_WAY_VARIANTS else length
        return self.back + self.size + self.ahead + self.sinks


def plan(windows, variant: str, query_len: int, key_len: int, global_tokens: int = 0,
         itemsize: int = 4, chunk: Optional[int] = None, sinks: int = 0) -> List[Group]:
    """The head groups of a call with ``windows`` ``(back, ahead)`` per head and how each is
    computed (a :class:`Group`): heads with the same windows (those that reach past every key:
    unbounded) form a group;

    * one whose window drops no key of a whole sequence with no global tokens runs as the
      ``fold``;
    * one whose chunk would hold every query, or whose chunks would read about every key
      anyway while its one-chunk bias stays within :data:`.tuning.ONE_CHUNK_BYTES`
      (``itemsize`` bytes an element) or its window drops no key, runs ``whole``;
    * the others run as ``chunks`` of :func:`chunk_size` queries (``chunk``: a size asked for).

    ``sinks``, the call's attention sinks, are a group's if its window looks back and drops
    keys. :func:`attention` computes this plan and ``dispatch.windowed_cost`` prices it.
    """
    T, S = query_len, key_len
    first = S - T
    found = []
    for window, heads in _groups(_within(windows, T, S)).items():
        heads = tuple(heads)
        # one_sided's halves: the variant hides one side, the window bounds the other
        looks_ahead = variant == "one_sided" and window[0] == 0 and window[1] != 0
        hides_ahead = variant == "causal" or (variant == "one_sided" and not looks_ahead)
        drops_none = ((window[0] is None or looks_ahead)
                      and (window[1] is None or hides_ahead))
        own = min(sinks, S) if window[0] not in (None, 0) else 0
        if drops_none and T == S and not global_tokens and chunk is None:
            found.append(Group(heads, window, "fold", looks_ahead=looks_ahead))
            continue
        # the reach the sequence allows: past keys down to 0, future ones up to S - 1
        back = first + T - 1 if window[0] is None else min(window[0], first + T - 1)
        ahead = T - 1 if window[1] is None else min(window[1], T - 1)
        size = chunk or chunk_size(back, ahead)
        # one chunk of every query where a chunk would hold them all, or where the chunks
        # would read about every key anyway and the one chunk's (H_g, T, reach) bias is small
        # (a large one held several times the memory of dense attention)
        whole = len(heads) * T * (min(back, first) + T) * itemsize
        if size >= T or (back + size + ahead >= S
                         and (drops_none or whole <= tuning.ONE_CHUNK_BYTES)):
            found.append(Group(heads, window, "whole", back=min(back, first), size=T,
                               sinks=own))
        else:
            found.append(Group(heads, window, "chunks", back=back, ahead=ahead, size=size,
                               sinks=own))
    return found


def _chunk_bias(slopes, future_slopes, variant, heads, window, back, chunk, R, dtype):
    """The ``(H_g, c, R)`` bias of every chunk of a group: queries at ``back … back+c-1`` of
    keys ``0 … R-1`` (only ``i - j`` counts); kept for the next call of the same group and
    shape while the slopes need no gradient (the layers of a model, the batches of a run),
    within :data:`.tuning.CHUNK_BIAS_BYTES` in all."""
    args = (variant, tuple(heads), window, back, chunk, R, dtype)
    if slopes.requires_grad or (future_slopes is not None and future_slopes.requires_grad):
        return _chunk_bias_of(slopes, future_slopes, *args)
    key = (tuple(slopes.tolist()), None if future_slopes is None else
           tuple(future_slopes.tolist()), slopes.device) + args
    found = _CHUNK_BIASES.pop(key, None)
    if found is None:
        found = _chunk_bias_of(slopes, future_slopes, *args)
    size = found.numel() * found.element_size()
    if size <= tuning.CHUNK_BIAS_BYTES:  # the most recent last; the oldest go first
        while sum(b.numel() * b.element_size() for b in _CHUNK_BIASES.values()) + size > \
                tuning.CHUNK_BIAS_BYTES:
            _CHUNK_BIASES.pop(next(iter(_CHUNK_BIASES)))
        _CHUNK_BIASES[key] = found
    return found


#: the chunk biases kept (:func:`_chunk_bias`), least recently used first
_CHUNK_BIASES = {}


def _chunk_bias_of(slopes, future_slopes, variant, heads, window, back, chunk, R, dtype):
    windows = tuple([w] * len(slopes) for w in window)
    return alibi_bias_between(slopes, torch.arange(back, back + chunk), torch.arange(R),
                              variant, future_slopes, dtype, heads=list(heads), windows=windows)


def _laid(x: Tensor, start: int, length: int, dim: int, column=None) -> Tensor:
    """``(B, H, S, D)`` -> ``(B, length, H, dim)``: positions ``start … start+length-1``
    (zeros outside ``0 … S-1``), the features ``[x, column, 0…]``."""
    B, H, S, D = x.shape
    lo, hi = max(0, start), min(S, start + length)
    out = x.new_empty(B, length, H, dim)  # written once: only what x does not fill is zeroed
    out[:, :lo - start].zero_()
    out[:, hi - start:].zero_()
    out[:, lo - start:hi - start, :, :D] = x[:, :, lo:hi].transpose(1, 2)
    out[:, lo - start:hi - start, :, D:].zero_()
    if column is not None:
        out[..., D] = column
    return out


def _windows_of(x: Tensor, b: int, n: int, rows: int, step: int) -> Tensor:
    """Sequence ``b`` of a layout ``(B, L, H, D')`` as ``n`` chunks ``(n, H, rows, D')``, chunk
    ``k`` its rows ``k·step … k·step+rows-1`` (a strided view: overlapping rows shared)."""
    L, H, D = x.shape[1:]
    return x[b].as_strided((n, H, rows, D), (step * H * D, D, H * D, 1))


class _Chunks:
    """A chunk group's call in the kernel's layout: queries ``(B, n·c, H_g, D')`` (``[q, 1,
    0…]``), keys and values ``(B, L, H_g, D')`` from position ``first - back`` (``[k, hiding
    column, 0…]``, ``[v, 0…]``), each chunk's a view of them (:func:`_windows_of`)."""

    def __init__(self, q, k, visible, variant, group: Group, global_tokens, scale):
        B, H, T, D = q.shape
        S = k.size(2)
        self.scale = scale
        self.c, self.back = group.size, group.back
        self.n = -(-T // self.c)
        self.R = group.back + self.c + group.ahead
        self.start = S - T - group.back  # the position of the keys' row 0
        L = (self.n + 1) * self.c + group.back + group.ahead  # (a chunk of spare rows)
        self.dim = fold.padded_head_dim(D, 1)
        # the variant's direction for a group of one_sided heads is its windows'
        self.bias_variant = "symmetric" if variant == "one_sided" else variant
        self.window = group.window
        fill = mask_value(q.dtype) / max(scale, 1.0)  # times scale: a huge, finite negative
        positions = torch.arange(self.start, self.start + L, device=q.device)
        keep = (positions >= global_tokens) & (positions < S)
        keep = keep & visible[:, positions.clamp(0, S - 1)]
        self.column = q.new_zeros(keep.shape).masked_fill(~keep, fill)[..., None]
        self.shape, self.key_len, self.length, self.dtype = (B, H, T, D), S, L, q.dtype
        self.q = self.k = self.v = None

    def lay(self, q, k, v):
        """Lay out ``q``, ``k``, ``v`` (the group's heads) for one pass; :meth:`release` after:
        the copies are made again for the backward rather than kept between the passes."""
        self.q = _laid(q, 0, self.n * self.c, self.dim, 1.0)
        self.k = _laid(k, self.start, self.length, self.dim, self.column)
        self.v = _laid(v, self.start, self.length, self.dim)

    def release(self):
        self.q = self.k = self.v = None

    def bias(self, m, f) -> Tensor:
        """The ``(1, H_g, c, R)`` bias of every chunk, from the group's slopes ``m``, ``f``."""
        return _chunk_bias(m, f, self.bias_variant, range(len(m)), self.window, self.back,
                           self.c, self.R, self.dtype)[None]

    def views(self, b, *xs):
        """Sequence ``b``'s chunks of the queries' layout ``xs`` and of the keys and values."""
        return ([_windows_of(x, b, self.n, self.c, self.c) for x in xs]
                + [_windows_of(x, b, self.n, self.R, self.c) for x in (self.k, self.v)])

    def unlaid(self, x: Tensor, width: int) -> Tensor:
        """The queries' layout ``(B, n·c, H, ·)`` -> ``(B, H, T, width)``."""
        return x[:, :self.shape[2], :, :width].transpose(1, 2)

    def keys_of(self, x: Tensor) -> Tensor:
        """The keys' layout ``(B, L, H, D')`` -> ``(B, H, S, D)`` (zeros before its start)."""
        B, H, _, D = self.shape
        out = x.new_zeros(B, self.key_len, H, D)
        lo = max(0, self.start)
        count = min(self.key_len, self.start + x.size(1)) - lo
        out[:, lo:lo + count] = x[:, lo - self.start:lo - self.start + count, :, :D]
        return out.transpose(1, 2)

    def forward(self, q, k, v, m, f):
        """``(out, lse)`` ``(B, H_g, T, D)``, ``(B, H_g, T)``: each sequence's chunks written
        straight into their place (one copy of the kernel's output, not a stack then a
        reordering copy)."""
        self.lay(q, k, v)
        bias = self.bias(m, f)
        B, H, T, D = self.shape
        n, c = self.n, self.c
        out = lse = None
        for b in range(B):
            o, l = fold.kernel_forward(*self.views(b, self.q), False, attn_mask=bias,
                                       scale=self.scale)  # (n, H, c, D'), (n, H, c)
            if out is None:
                out, lse = o.new_empty(B, H, n * c, D), l.new_empty(B, H, n * c)
            out[b].view(H, n, c, D).copy_(o[..., :D].transpose(0, 1))
            lse[b].view(H, n, c).copy_(l.transpose(0, 1))
        self.release()
        return out[:, :, :T], lse[:, :, :T]

    def backward(self, grad, q, k, v, out, lse, m, f, slopes_grad):
        """This window's share ``(grad_q, grad_k, grad_v, grad_m, grad_f)`` of the gradient of
        a softmax over its keys (and maybe more) from that softmax's ``out`` and ``lse``."""
        self.lay(q, k, v)
        B, H, T, D = self.shape
        c, n, R = self.c, self.n, self.R
        go, oo = (_laid(x, 0, n * c, self.dim) for x in (grad, out))
        ll = _laid(lse[..., None], 0, n * c, 1)
        bias = self.bias(m, f)
        gq = torch.empty_like(self.q)
        gk, gv = torch.zeros_like(self.k), torch.zeros_like(self.v)
        dbias = (torch.zeros(bias.shape[1:], dtype=torch.float32, device=bias.device)
                 if slopes_grad else None)
        # by pieces of c keys of every chunk, each a key block per chunk (the kernel's backward
        # over a chunk's R keys at once was slower: docs/benchmarks.md, "How fold adds ALiBi
        # with no bias tensor"): the pieces' rows do not overlap
        pieces = [(j, bias[..., j:j + c].contiguous()) for j in range(0, R, c)]
        for b in range(B):
            g_, q_, o_, l_, k_, v_ = self.views(b, go, self.q, oo, ll)
            l_ = l_[..., 0].contiguous()
            dq = 0
            for j, part in pieces:
                w = part.size(-1)
                found = fold.kernel_backward(g_, q_, k_[:, :, j:j + w], v_[:, :, j:j + w], o_,
                                             l_, False, attn_mask=part, scale=self.scale)
                dq = dq + found[0]
                for total, d in zip((gk, gv), found[1:]):
                    total[b, j:j + n * c].view(n, c, H, -1)[:, :w] += d.transpose(1, 2)
            gq[b] = dq.transpose(1, 2).reshape(n * c, H, self.dim)
            if slopes_grad:
                dbias += self._bias_grad(g_, q_, o_, l_, k_, v_, bias)
        self.release()
        grads = [self.unlaid(gq, D)] + [self.keys_of(x) for x in (gk, gv)]
        if not slopes_grad:
            return grads + [None, None]
        with torch.enable_grad():
            leaves = [None if x is None else x.detach().requires_grad_() for x in (m, f)]
            wanted = [x for x in leaves if x is not None]
            found = iter(torch.autograd.grad(self.bias(*leaves)[0], wanted, dbias.to(bias.dtype)))
        return grads + [None if x is None else next(found) for x in leaves]

    def _bias_grad(self, g_, q_, o_, l_, k_, v_, bias):
        """``Σ dS`` ``(H_g, c, R)`` over one sequence's chunks (the shared bias's gradient),
        a few chunks at a time."""
        n, H, c, _ = q_.shape
        step = max(1, tuning.CHUNK_BYTES // max(1, H * c * self.R * q_.element_size()))
        total = 0
        for s in range(0, n, step):
            part = slice(s, s + step)
            logits = torch.matmul(q_[part], k_[part].transpose(-1, -2)) * self.scale + bias
            p = torch.exp(logits - l_[part][..., None])
            dp = torch.matmul(g_[part], v_[part].transpose(-1, -2))
            delta = (g_[part] * o_[part]).sum(-1, keepdim=True)
            total = total + (p * (dp - delta)).sum(0)
        return total.float()


def _prefix_logits(q, k, m, prefix, global_tokens, back, visible, scale):
    """``(logits, rel)``: the logits ``(B, H, P, T)`` of the prefix's keys ``j < P`` for queries
    at the end of the keys: a global key (``j < global_tokens``) with bias 0, a sink with
    ``-m·(i - j)`` where it is beyond the query's window (``i - j > back``, ``(H, 1, 1)``);
    hidden otherwise, or as padding. ``rel``: the bias's factor of ``-m`` (0 for a global key).
    Keys first: the reductions over ``P`` run along ``T``."""
    T, S = q.size(2), k.size(2)
    j = torch.arange(prefix, device=q.device)[:, None]
    rel = (torch.arange(S - T, S, device=q.device) - j).to(q.dtype)
    rel = rel.masked_fill(j < global_tokens, 0.0)
    logits = torch.matmul(k[:, :, :prefix], q.transpose(-1, -2)).mul_(scale)
    logits -= m.to(q.dtype)[:, None, None] * rel
    hidden = ((rel <= back) & (j >= global_tokens)) | ~visible[:, None, :prefix, None]
    return logits.masked_fill_(hidden, mask_value(q.dtype)), rel


def _exp(x: Tensor) -> Tensor:
    """``exp`` of ``x <= 0`` with the values that vanish anyway (``< e^-80``: padding, hidden
    keys) raised to that: the CPU's exp of large negative numbers is much slower
    (docs/benchmarks.md, "How fold adds ALiBi with no bias tensor")."""
    return x.clamp_(min=-80.0).exp_()


def _plus(x: Tensor, weights: Tensor, y: Tensor, alpha: float = 1.0) -> Tensor:
    """``x += alpha·weightsᵀ·y[:, :, :P]`` in place (one pass over ``x``): ``x``
    ``(B, H, T, D)`` contiguous, ``weights`` ``(B, H, P, T)``."""
    B, H, P, T = weights.shape
    x.view(B * H, T, -1).baddbmm_(weights.reshape(B * H, P, T).transpose(1, 2),
                                  y[:, :, :P].reshape(B * H, P, -1), alpha=alpha)
    return x


def _cat(parts: List[Tensor], dim: int = 1) -> Tensor:
    return torch.cat(parts, dim) if len(parts) > 1 else parts[0]


def _merge_prefix(out: Tensor, lse: Tensor, logits: Tensor, values: Tensor):
    """``(out, lse, probs)``: the softmax over the windows' keys (their output ``out`` and
    log-sum-exp ``lse``, ``(B, H, T)``) and ``P`` prefix keys besides (``logits`` ``(B, H, P,
    T)``, their values ``values[:, :, :P]``) as one. With ``M = max(lse, max_p logits_p)``,
    ``share = e^(lse - M)`` and ``Z = share + Σ_p e^(logits_p - M)``::

        out' = (share·out + Σ_p e^(logits_p - M)·v_p) / Z,    lse' = M + log Z

    ``probs``: the prefix keys' probabilities of the merged softmax. ``out`` (the caller's
    own) is scaled in place; no autograd (run inside one's forward, or without gradients)."""
    top = torch.maximum(lse, logits.amax(-2))
    probs, share = _exp(logits - top[..., None, :]), _exp(lse - top)
    total = probs.sum(-2) + share
    probs /= total[..., None, :]  # of the merged softmax, as the window's share
    out = _plus(out.contiguous().mul_((share / total)[..., None]), probs, values)
    return out, top + torch.log(total), probs


class _Merged(torch.autograd.Function):
    """Chunk groups (``windows``: each its heads' rows of ``q``, ``k``, ``v``, ``m``, ``f`` and
    its :class:`_Chunks`) and, unless ``prefix`` is ``None``, the prefix's keys beyond them
    (:func:`_prefix_logits`): one softmax, merged by log-sum-exp. Backward: each part's share
    from the merged output and log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, m, f, windows, prefix, scale):
        found = [group.forward(q[:, r], k[:, r], v[:, r], m[r], None if f is None else f[r])
                 for r, group in windows]
        out, lse = _cat([o for o, _ in found]), _cat([l for _, l in found])
        probs = rel = None
        if prefix is not None:
            logits, rel = prefix(q, k, m)
            out, lse, probs = _merge_prefix(out, lse, logits, v)
        # the prefix's probabilities are kept, (B, H, P, T): recomputing them reads all of q
        ctx.save_for_backward(q, k, v, m, f, out, lse, probs, rel)
        ctx.windows, ctx.scale = windows, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, m, f, out, lse, probs, rel = ctx.saved_tensors
        grad = grad.to(q.dtype).contiguous()
        need = ctx.needs_input_grad[3] or ctx.needs_input_grad[4]
        found = [group.backward(grad[:, r], q[:, r], k[:, r], v[:, r], out[:, r], lse[:, r],
                                m[r], None if f is None else f[r], need)
                 for r, group in ctx.windows]
        gq, gk, gv = (_cat(list(x)) for x in list(zip(*found))[:3])
        gm = _cat([g[3] for g in found], 0) if need else None
        gf = _cat([g[4] for g in found], 0) if need and f is not None else None
        if probs is not None:
            P = probs.size(2)
            delta = torch.einsum("bhtd,bhtd->bht", grad, out)  # no (B, H, T, D) product
            d = probs * (torch.matmul(v[:, :, :P], grad.transpose(-1, -2))
                         - delta[..., None, :])  # (B, H, P, T)
            gq = _plus(gq.contiguous(), d, k, ctx.scale)
            gk[:, :, :P] += torch.matmul(d, q) * ctx.scale
            gv[:, :, :P] += torch.matmul(probs, grad)
            if need:
                gm = gm - (d * rel).sum((0, 2, 3)).to(m.dtype)
        return gq, gk, gv, gm, gf, None, None, None


def _folded(q, k, v, slopes, future_slopes, variant, group: Group, scale, key_padding_mask):
    """A ``fold`` group's output ``(B, len(heads), T, D)`` by :func:`.fold.folded_attention`
    (a ``one_sided`` half as ``causal``, looking ahead on the reversed sequence)."""
    idx = _heads_index(list(group.heads), q.device)
    future = None if future_slopes is None else future_slopes[idx]
    args = [q[:, idx], k[:, idx], v[:, idx]]
    if variant == "one_sided":
        variant = "causal"
        if group.looks_ahead:
            args = [x.flip(2) for x in args]
            key_padding_mask = None if key_padding_mask is None else key_padding_mask.flip(-1)
    out = fold.folded_attention(*args, slopes[idx], future, variant, scale, key_padding_mask)
    return out.flip(2) if group.looks_ahead else out


def dense_queries(variant: str, query_len: int, key_len: int, global_tokens: int = 0,
                  sinks: int = 0) -> int:
    """How many of a call's first queries :func:`attention` computes as one dense call
    (:func:`_prefix_queries`): those among the first ``max(global_tokens, sinks)`` positions,
    where a global token reads every key and a sink may lie *ahead* of a query, beyond its
    look-ahead window (the prefix pass merges sinks behind a query only). 0 for ``causal``
    without global tokens: the variant hides every key ahead."""
    if not global_tokens and variant == "causal":
        return 0
    return max(0, min(max(global_tokens, sinks), key_len) - (key_len - query_len))


def _prefix_queries(q, k, v, visible, slopes, future_slopes, variant, windows, global_tokens,
                    sinks, scale, g):
    """The output ``(B, H, g, D)`` of the first ``g`` queries (:func:`dense_queries`): global
    tokens, exempt from the bias and the windows, read every key; the others their windows and
    the sinks (some of them ahead), by the dense definition (one dense call) over the keys they
    reach."""
    B, H, T, D = q.shape
    S = k.size(2)
    first = S - T
    ahead = None if global_tokens or None in windows[1] else max(windows[1])
    S = S if ahead is None else min(S, first + g + ahead)
    bias = alibi_bias_between(slopes, torch.arange(first, first + g), torch.arange(S), variant,
                              future_slopes, q.dtype, global_tokens, windows=windows,
                              sinks=sinks)
    bias = masked_with(bias[None], ~visible[:, None, None, :S], q.dtype)
    return F.scaled_dot_product_attention(q[:, :, :g], k[:, :, :S], v[:, :, :S], attn_mask=bias,
                                          scale=scale)


def attention(q: Tensor, k: Tensor, v: Tensor, slopes: Tensor, future_slopes: Optional[Tensor],
              variant: str, windows, key_padding_mask: Optional[Tensor] = None,
              scale: Optional[float] = None, global_tokens: int = 0,
              chunk: Optional[int] = None, sinks: int = 0) -> Tensor:
    """Windowed ALiBi attention, ``(B, H, T, D)``, skipping the keys beyond the windows.

    ``q`` ``(B, H, T, D)``, ``k``/``v`` ``(B, H, S, D)`` with ``T <= S`` (queries aligned to the
    end of the keys); ``slopes``/``future_slopes`` ``(H,)`` the effective slopes (as
    ``AttentionBias.head_slopes()``); ``windows`` ``(back, ahead)`` per head
    (:func:`~fairseq_alibi.alibi.variant_windows` of those slopes, ``None`` = unbounded);
    ``key_padding_mask`` ``(B, S)``, True = padding; ``scale`` default ``D^-1/2``;
    ``chunk`` queries per chunk (default :func:`chunk_size` of each group's window); ``sinks``
    the attention sinks kept beyond the windows. Equals
    ``softmax(q·kᵀ·scale + windowed_alibi_bias + padding) v``; float32 or float64.
    """
    B, H, T, D = q.shape
    S = k.size(2)
    if T > S:
        raise ValueError(f"query_len ({T}) cannot exceed key_len ({S})")
    scale = D**-0.5 if scale is None else scale
    slopes = slopes.to(q.device, torch.float32)
    if future_slopes is not None:
        future_slopes = future_slopes.to(q.device, torch.float32)
    visible = (torch.ones(B, S, dtype=torch.bool, device=q.device) if key_padding_mask is None
               else ~key_padding_mask.to(q.device, torch.bool))
    outs: List[Tensor] = []
    order: List[int] = []
    chunked: List[Group] = []
    for group in plan(windows, variant, T, S, global_tokens, q.element_size(), chunk, sinks):
        if group.kind == "fold":
            outs.append(_folded(q, k, v, slopes, future_slopes, variant, group, scale,
                                key_padding_mask))
            order += group.heads
        else:
            chunked.append(group)
    if chunked:
        heads = [h for g in chunked for h in g.heads]
        idx = _heads_index(heads, q.device)
        qs, ks, vs, ms = q[:, idx], k[:, idx], v[:, idx], slopes[idx]
        fs = None if future_slopes is None else future_slopes[idx]
        windows_run, start = [], 0
        for g in chunked:
            rows, start = slice(start, start + len(g.heads)), start + len(g.heads)
            windows_run.append((rows, _Chunks(qs[:, rows], ks[:, rows], visible, variant, g,
                                              global_tokens, scale)))
        prefix = None
        P = max(global_tokens, max(g.sinks for g in chunked))
        if P:  # heads without sinks (their window drops none, or looks ahead) see none
            back = torch.tensor([g.window[0] if g.sinks else S for g in chunked
                                 for _ in g.heads], device=q.device)[:, None, None]
            prefix = functools.partial(_prefix_logits, prefix=min(P, S),
                                       global_tokens=global_tokens, back=back,
                                       visible=visible, scale=scale)
        outs.append(_Merged.apply(qs, ks, vs, ms, fs, windows_run, prefix, scale))
        order += heads
    out = _in_head_order(_cat(outs), order)
    g = dense_queries(variant, T, S, global_tokens, sinks)
    if g:
        exempt = _prefix_queries(q, k, v, visible, slopes, future_slopes, variant, windows,
                                 global_tokens, sinks, scale, g)
        if out.requires_grad:
            out = torch.cat([exempt, out[:, :, exempt.size(2):]], dim=2)
        else:  # no graph to keep: over the rows, not a copy of the whole output
            out[:, :, :exempt.size(2)] = exempt
    return out


def _heads_index(heads: List[int], device):
    """``heads`` as an index of the head axis: a slice (a view) when they are contiguous."""
    if heads == list(range(heads[0], heads[0] + len(heads))):
        return slice(heads[0], heads[0] + len(heads))
    return torch.as_tensor(heads, device=device)


def _step_groups(windows, first: int, device):
    """``(lo, index, heads)`` per head group of a call of a few queries: the first key its
    first query's window reaches (``first``: that query's position), its heads as an index."""
    for (back, _), heads in _groups(windows).items():
        yield 0 if back is None else first - min(back, first), _heads_index(heads, device), heads


def _in_head_order(x: Tensor, order: List[int]) -> Tensor:
    """``x`` ``(B, H, ...)`` whose heads are in ``order`` (the groups'), back in head order."""
    return x if order == list(range(x.size(1))) else x[:, torch.as_tensor(order).argsort()]


def few_queries(q, k, v, alibi, windows, key_padding_mask, scale, apart=None,
                last: int = 0) -> Tensor:
    """A call of a few queries against a KV cache (a decoding step; a short chunk), ``(B, H, T,
    D)``: each head group reads the keys from its first query's reach on, ``S - T - back …
    S - 1``, and the cache's attention sinks (``alibi.sinks``, its first keys), with its rows of
    the call's dense bias (``alibi.dense``, memoised by the stack). ``apart``: ``(sink_k,
    sink_v)``, the sinks of a cache that keeps them apart from its window (``k``, ``v``),
    joined to each group's window (while autograd records). ``last``: ``k``, ``v`` hold the
    window with its ``last`` sinks after it in one buffer (the bias and padding in that order,
    :func:`~fairseq_alibi.alibi.sinks_to_end`): each group reads the window's tail it reaches
    and the sinks as one view. Not with global tokens (the first keys are in every window)."""
    B, H, T, D = q.shape
    held = 0 if apart is None else apart[0].size(2)  # the sinks' keys, before k's
    S = held + k.size(2)
    first = S - T
    mask = dense.dense_mask(alibi, B, T, S, q.dtype, key_padding_mask, None)
    sinks = min(getattr(alibi, "sinks", 0), S)
    outs: List[Tensor] = []
    order: List[int] = []
    for lo, idx, heads in _step_groups(windows, first, q.device):
        if held:  # the sinks apart: joined to the group's window only, the keys it reads
            start = max(lo, held)
            rows = mask[:, idx]
            rows = torch.cat([rows[..., :held], rows[..., start:]], -1) if start > held else rows
            parts = tuple(torch.cat([sink[:, idx], window[:, idx, start - held:]], 2)
                          for sink, window in zip(apart, (k, v))) + (rows,)
        elif sinks and lo > 0 and not last:  # the sinks before the window, then the window
            kept = torch.cat([torch.arange(min(sinks, lo)), torch.arange(lo, S)]).to(q.device)
            parts = (k[:, idx].index_select(2, kept), v[:, idx].index_select(2, kept),
                     mask[:, idx].index_select(3, kept))
        else:  # (key lo of the sinks-first order is lo - last of the sinks-last one)
            lo = max(lo - last, 0)
            parts = (k[:, idx, lo:], v[:, idx, lo:], mask[:, idx, :, lo:])
        outs.append(F.scaled_dot_product_attention(q[:, idx], parts[0], parts[1],
                                                   attn_mask=parts[2], scale=scale))
        order += heads
    return _in_head_order(_cat(outs), order)


def sinks_apart(q, sinks, k, v, alibi, key_padding_mask, scale) -> Tensor:
    """The ``windowed`` backend for a call against a KV cache that keeps its attention sinks
    apart from its rolling window (``sinks``: ``(sink_k, sink_v)``; ``k``, ``v``: the window):
    :func:`few_queries`, each head group joining the sinks to its own window's keys only."""
    return few_queries(q, k, v, alibi, alibi.windows(), key_padding_mask, scale, apart=sinks)


def sinks_last(q, k, v, alibi, key_padding_mask, scale, held: int) -> Tensor:
    """The ``windowed`` backend for a step against a KV cache that holds its window with its
    ``held`` attention sinks after it in one buffer (``k``, ``v``; ``alibi`` and the padding
    in that order): :func:`few_queries`, each head group reading one view of the cache."""
    return few_queries(q, k, v, alibi, alibi.windows(), key_padding_mask, scale, last=held)


def run(q, k, v, alibi, key_padding_mask, attn_mask, dropout_p, scale):
    """The ``windowed`` backend (the calls of :data:`CAPABILITIES`): :func:`attention` with the
    call's windows (``alibi.windows()``), or, for a call without a cutoff, the variant's
    unbounded ones (every key its bias reaches); a few queries against a KV cache (a decoding
    step) as :func:`few_queries`, as is any call against a cache that kept its attention sinks
    and dropped the keys after them (its keys are not at ``0 … S-1``)."""
    slopes, future_slopes = alibi.head_slopes()
    windows = alibi.windows() if alibi.windowed else None
    if windows is None:
        windows = variant_windows(slopes, 0.0, alibi.variant, future_slopes)
    T, S = q.size(2), k.size(2)
    if getattr(alibi, "dropped", 0) or (T < S and T <= tuning.FEW_QUERIES
                                        and not alibi.global_tokens):
        return few_queries(q, k, v, alibi, windows, key_padding_mask, scale)
    return attention(q, k, v, slopes, future_slopes, alibi.variant, windows, key_padding_mask,
                     scale, alibi.global_tokens,
                     sinks=getattr(alibi, "sinks", 0) if alibi.windowed else 0)
