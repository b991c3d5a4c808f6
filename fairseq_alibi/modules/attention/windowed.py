"""Slope windows on the CPU: banded ALiBi attention that skips the keys beyond each head's
window instead of masking them.

With a cutoff ``T`` head ``h`` keeps the keys at ``i - j <= back_h`` and ``j - i <= ahead_h``
(:func:`~fairseq_alibi.alibi.variant_windows`); the result is
``softmax(q·kᵀ·scale + windowed_alibi_bias) v``
(:func:`~fairseq_alibi.alibi.windowed_alibi_bias`, the dense definition). Computed as:

* heads with the same windows form a group (windows that reach past every key count as
  unbounded: such heads share one); a group that looks one way (``causal``, ``one_sided``)
  over a whole sequence with no global tokens, with a window of half the sequence or more (or
  of :data:`.tuning.BANDED_MIN_WINDOW` keys or more), runs as the fold's kernel over blocks
  (:mod:`.band_fold`: no bias tensor; a window over the whole sequence is the fold itself);
* any other group whose window (plus a chunk) covers the keys anyway runs as one chunk of
  ``T`` queries over the keys from the first query's reach on (every key of a whole
  sequence; with a KV cache, e.g. a decoding step of ``T = 1``, only the ``back + T`` keys
  ``S - T - back … S - 1``), or, if its window drops no key at all, as the ``fold`` backend
  where that serves the call;
* the others split their ``T`` queries into ``n`` chunks of ``c`` (:func:`chunk_size`); chunk
  ``k``, queries ``s … s+c-1``, reads only the ``R = back + c + ahead`` keys
  ``s-back … s+c-1+ahead``. The chunks are the batch of one fused kernel call (the fold's,
  :func:`.fold.kernel_forward`), ``(B·n, H_g, c, D)`` against ``(B·n, H_g, R, D)`` keys, with
  one ``(H_g, c, R)`` bias shared by every chunk (the bias depends on ``i - j`` only; made once
  per group and shape while the slopes need no gradient: :func:`_chunk_bias`): the work is
  ``T·R`` per head instead of ``T·S``, and no ``(H, T, S)`` bias exists. Backward, the
  kernel's own (:class:`_Merged`, :func:`_chunks_backward`: only ``q``, ``k``, ``v``, the
  output and the log-sum-exp are kept); with learned slopes (the chunk bias carries their
  gradient, which the kernel does not return) ``scaled_dot_product_attention`` and autograd;
* keys outside the sequence (before position 0, past the end), padding keys and, with global
  tokens, window keys that are global tokens are hidden by one more query/key column
  (``1`` on every query, :func:`~fairseq_alibi.alibi.mask_value` on such a key), as
  :func:`.dense.padding_column` does for padding: the bias stays one tensor for the batch
  (the chunks that read only real keys of a batch with no padding and no global tokens need
  no column: :func:`_interior`);
* attention sinks (``sinks`` ``S``, ``--alibi-window-sinks``): each group's window runs as
  without them (``blocks``, ``chunks``, ``whole``; by the fused kernel, which gives its rows'
  log-sum-exps), the sinks beyond each query's window (``i - j > back``: those inside it are the
  window's) as one small pass of ``S`` keys for every head with sinks, their true bias
  ``-m·(i - j)``, and the two softmaxes are merged by their log-sum-exps
  (:class:`_Merged`: backward, each part's share from the merged output and log-sum-exp, the
  window's by the kernel's own backward). A group whose window drops no key, or that looks
  ahead only (``one_sided``'s second half: no sink is ahead of a query past the prefix), has no
  sinks of its own. With learned slopes (their gradient) ``chunks`` and ``whole`` groups, and
  with global tokens every group, prepend the sinks to every chunk instead, as global tokens;
* global tokens (``global_tokens`` ``N``), and sinks as above: the first ``max(N, S)`` keys, the
  *prefix*, are prepended to every chunk (the window's copies of them hidden by the column): a
  global key with bias 0, a sink with its true bias, as the chunk's shared bias ``-m·r``
  (``r``: the query's row in its chunk) plus ``-m·(s - j)`` in the hiding column of chunk
  ``s … s+c-1`` (a sink is behind every query past the prefix, whatever the variant). The
  queries among the first ``max(N, S)`` positions (exempt from the bias, or in front of some
  sink) are computed as one dense call of their own.

Which group runs how is one function's answer, :func:`plan` (a list of :class:`Group`), which
``dispatch.windowed_cost`` prices for ``auto``: the executor and the policy read the same plan.

Queries are aligned to the end of the keys (a KV cache), as everywhere. An all-padding row
stays finite (an output nothing reads), as with the other backends. Autograd runs through the
fused kernel (float32, float64).
"""

import functools
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq_alibi.alibi import alibi_bias_between, mask_value, variant_windows
from fairseq_alibi.modules.attention import band_fold, dense, fold, tuning
from fairseq_alibi.modules.attention.capabilities import Capabilities

#: what :func:`run` serves: the slopes' bias (with windows or without: every window unbounded)
#: on the CPU in float32/64, whole sequences or a KV cache (one that kept its attention sinks
#: too), key padding, global tokens, attention sinks, the learned scales' gradient; no
#: attention dropout, no extra attn_mask
CAPABILITIES = Capabilities(
    kinds=("distance",), devices=("cpu",), dtypes=fold.FOLD_DTYPES, dropout=False,
    attn_mask=False, windows=True, sinks=True, sink_cache=True)

def chunk_size(back: int, ahead: int) -> int:
    """Queries per chunk for a window ``back + ahead``: a quarter of it (rounded up to a power
    of two), within :data:`.tuning.MIN_CHUNK` … :data:`.tuning.MAX_CHUNK`."""
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
    first ``sinks`` keys and these (``AlibiMultiheadAttention``). A ``"rows"`` bias (``--alibi-length-scale``'s per-sequence slopes, which
    depend on the sequence's real length) gets no bound.
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


def _band(*args, rows, hide=True):
    """The output ``(B, len(heads), t1 - t0, D)`` of one head group's queries ``rows``
    ``(t0, t1)``, chunk by chunk (:func:`_band_inputs`)."""
    qa, ka, va, bias = _band_inputs(*args, rows=rows, hide=hide)
    out = F.scaled_dot_product_attention(qa, ka, va, attn_mask=bias, scale=args[-1])
    return _unchunked(out, args[0].size(0), rows[1] - rows[0], args[0].size(-1))


def _chunked(x: Tensor, chunk: int, dim: int) -> Tensor:
    """``(B, H, t, D)`` -> ``(B·n, H, c, dim)``, zeros past the rows and the features."""
    B, H, t, D = x.shape
    n = -(-t // chunk)
    x = F.pad(x, (0, dim - D, 0, n * chunk - t))
    return x.view(B, H, n, chunk, dim).transpose(1, 2).reshape(B * n, H, chunk, dim)


def _unchunked(x: Tensor, B: int, t: int, D: int) -> Tensor:
    """``(B·n, H, c, ·)`` -> ``(B, H, t, D)``: the first ``t`` rows and ``D`` features."""
    n, H, c = x.shape[0] // B, x.shape[1], x.shape[2]
    x = x.reshape(B, n, H, c, -1).transpose(1, 2).reshape(B, H, n * c, -1)
    return x[:, :, :t, :D]


def _band_inputs(q, k, v, visible, slopes, future_slopes, variant, heads, window, back, ahead,
                 chunk, global_tokens, sinks, scale, rows, hide=True, picked=False):
    """The fused call of one head group's queries ``rows`` ``(t0, t1)``, chunk by chunk:
    queries ``(B·n, H_g, c, Dp)``, keys and values ``(B·n, H_g, P + R, Dp)``, the bias
    ``(1, H_g, c, P + R)`` (``picked``: ``q``, ``k``, ``v`` hold the group's heads only).

    ``visible`` ``(B, S)``: keys that are real (not padding); ``window`` the group's
    ``(back, ahead)`` windows (``None`` = unbounded). Each chunk reads the keys ``s - back …
    s + c - 1 + ahead`` (``back``/``ahead``: at least the window's reach), plus the prefix,
    the first ``max(global_tokens, sinks)`` keys (a global one with bias 0, a sink with its
    bias: the module's docstring). ``hide=False``: every chunk's keys are real keys of the
    sequence (no padding, no prefix, none out of range), so no hiding column is needed.
    """
    B, _, T, D = q.shape
    S = k.size(2)
    t0, t1 = rows
    first = S - T + t0  # the position of query t0
    n = -(-(t1 - t0) // chunk)
    R = back + chunk + ahead
    G = global_tokens
    P = max(G, sinks)  # the prefix: global keys, then sinks
    # the hiding column, the head size rounded up as the fold's (the kernel is slower at odd sizes)
    Dp = fold.padded_head_dim(D, 1) if hide else D
    idx = _heads_index(heads, q.device)
    sel = slice(None) if picked else idx
    Hg = len(heads)
    fill = mask_value(q.dtype) / max(scale, 1.0)  # times scale: a huge, finite negative logit

    def widened(x, column):  # (B, n, Hg, rows, D) -> [x, column, 0…] of head size Dp
        if not hide:
            return x
        shape = x.shape[:-1]
        spare = x.new_zeros(()).expand(*shape, Dp - D - 1)
        return torch.cat([x, column.expand(*shape, 1), spare], dim=-1)

    # queries: (B, Hg, n·c, D) -> (B, n, Hg, c, Dp), the hiding column's 1 at D
    qg = F.pad(q[:, sel, t0:t1], (0, 0, 0, n * chunk - (t1 - t0)))
    qa = widened(qg.view(B, Hg, n, chunk, D).transpose(1, 2), q.new_ones(()))

    # the key positions first - back … first + n·c + ahead - 1, out-of-range ones zero
    lo, hi = first - back, first + n * chunk + ahead
    clamp = (max(0, lo), min(S, hi))
    pad = (clamp[0] - lo, hi - clamp[1])

    def windows_of(x):  # (B, H, S, D) -> (B, n, Hg, R, D): chunk k's keys s-back … s+c-1+ahead
        ranged = F.pad(x[:, sel, clamp[0]:clamp[1]], (0, 0) + pad)
        return ranged.unfold(2, R, chunk).permute(0, 2, 1, 4, 3)

    column = None
    if hide:
        positions = torch.arange(lo, hi, device=q.device)
        inside = (positions >= P) & (positions < S)
        keep = inside[None, :] & F.pad(visible[:, clamp[0]:clamp[1]], pad, value=False)
        column = q.new_zeros(keep.shape).masked_fill(~keep, fill)  # (B, L)
        column = column.unfold(1, R, chunk)[:, :, None, :, None]
    ka = widened(windows_of(k), column)
    va = widened(windows_of(v), q.new_zeros(()))
    if P:  # the prefix's keys before every chunk's window
        shape = (B, n, Hg, P, D)
        hidden = q.new_zeros(B, 1, 1, P).masked_fill(~visible[:, None, None, :P], fill)
        if P > G:  # a sink's -m·(s - j) for chunk s … s+c-1 (-m·r is in the shared bias)
            starts = first + torch.arange(n, device=q.device, dtype=q.dtype) * chunk
            m = slopes[idx].to(q.dtype)
            distance = starts[:, None] - torch.arange(G, P, device=q.device, dtype=q.dtype)
            own = (-m[None, :, None] * distance[:, None, :] / scale)[None]  # (1, n, Hg, P-G)
            hidden = torch.cat([hidden[..., :G].expand(B, n, Hg, G),
                                own.masked_fill(~visible[:, None, None, G:P], fill)], dim=-1)
        ka = torch.cat([widened(k[:, sel, None, :P].transpose(1, 2).expand(shape),
                                hidden[..., None]), ka], 3)
        va = torch.cat([widened(v[:, sel, None, :P].transpose(1, 2).expand(shape),
                                q.new_zeros(())), va], 3)

    bias = _chunk_bias(slopes, future_slopes, variant, heads, window, back, chunk, R, G, P,
                       q.dtype)
    return (qa.reshape(B * n, Hg, chunk, Dp), ka.reshape(B * n, Hg, P + R, Dp),
            va.reshape(B * n, Hg, P + R, Dp), bias[None])


def _within(windows, T, S):
    """``windows`` with every reach that no key of the call exceeds (``back >= S - 1``,
    ``ahead >= T - 1``) unbounded: heads whose windows drop no key share a group."""
    def capped(reach, most):
        return None if reach is not None and reach >= most else reach
    return ([capped(b, S - 1) for b in windows[0]], [capped(a, T - 1) for a in windows[1]])


def _chunk_bias(slopes, future_slopes, variant, heads, window, back, chunk, R, G, P, dtype):
    """The ``(H_g, c, P + R)`` bias of every chunk of a group: queries at ``back … back+c-1``
    of keys ``0 … R-1`` (only ``i - j`` counts), after ``G`` global keys of bias 0 and
    ``P - G`` sinks of bias ``-m·r`` (row ``r``; queries past them, the rest of a sink's bias
    is its chunk's: :func:`_band`); kept for the next call of the same group and shape while the slopes need no gradient
    (the layers of a model, the batches of a run), within :data:`.tuning.CHUNK_BIAS_BYTES` in
    all."""
    if slopes.requires_grad or (future_slopes is not None and future_slopes.requires_grad):
        return _chunk_bias_of(slopes, future_slopes, variant, tuple(heads), window, back,
                              chunk, R, G, P, dtype)
    key = (tuple(slopes.tolist()), None if future_slopes is None else
           tuple(future_slopes.tolist()), variant, tuple(heads), window, back, chunk, R, G, P,
           dtype, slopes.device)
    found = _CHUNK_BIASES.pop(key, None)
    if found is None:
        found = _chunk_bias_of(slopes, future_slopes, variant, tuple(heads), window, back,
                               chunk, R, G, P, dtype)
    size = found.numel() * found.element_size()
    if size <= tuning.CHUNK_BIAS_BYTES:  # the most recent last; the oldest go first
        while sum(b.numel() * b.element_size() for b in _CHUNK_BIASES.values()) + size > \
                tuning.CHUNK_BIAS_BYTES:
            _CHUNK_BIASES.pop(next(iter(_CHUNK_BIASES)))
        _CHUNK_BIASES[key] = found
    return found


#: the chunk biases kept (:func:`_chunk_bias`), least recently used first
_CHUNK_BIASES = {}


def _chunk_bias_of(slopes, future_slopes, variant, heads, window, back, chunk, R, G, P, dtype):
    windows = tuple([w] * len(slopes) for w in window)
    bias = alibi_bias_between(slopes, torch.arange(back, back + chunk), torch.arange(R), variant,
                              future_slopes, dtype, heads=list(heads), windows=windows)
    parts = []
    if G:  # the global keys: bias 0 for every query (queries >= G, all of them past)
        parts.append(bias.new_zeros(len(heads), chunk, G))
    if P > G:  # the sinks: -m·r of row r, as keys r behind it (every query is past them)
        parts.append(alibi_bias_between(slopes, torch.arange(chunk), torch.zeros(P - G),
                                        variant, future_slopes, dtype, heads=list(heads)))
    return torch.cat(parts + [bias], dim=-1) if parts else bias


def _interior(T, S, back, ahead, chunk) -> Tuple[int, int]:
    """``(t0, t1)``: the queries whose chunks (of ``chunk``, from query 0) read only keys inside
    ``0 … S-1``; empty (``t0 >= t1``) if none."""
    first = S - T
    k0 = max(0, -(-(back - first) // chunk))  # chunk k starts at first + k·c >= back
    k1 = (S - ahead - first) // chunk  # and ends at first + (k+1)·c - 1 + ahead <= S - 1
    return k0 * chunk, min(T, k1 * chunk)


def _folded(q, k, v, slopes, future_slopes, variant, heads, scale, key_padding_mask):
    """A covering group's output ``(B, len(heads), T, D)`` by :func:`.fold.folded_attention`."""
    idx = torch.as_tensor(heads, device=q.device)
    future = None if future_slopes is None else future_slopes[idx]
    return fold.folded_attention(q[:, idx], k[:, idx], v[:, idx], slopes[idx], future, variant,
                                 scale, key_padding_mask)


@dataclass(frozen=True)
class Group:
    """How one head group of a call is computed (:func:`plan`): ``kind``

    * ``blocks``: the fold's kernel over blocks (:mod:`.band_fold`), a one-way window of
      ``reach`` keys (``looks_ahead``: forward);
    * ``fold``: the ``fold`` backend, the window drops no key;
    * ``whole``: one chunk of every query, reading the ``back`` keys before the first and
      every later one (a ``(T, back + T)`` bias);
    * ``chunks``: chunks of ``size`` queries, each reading ``back`` keys before its first
      query and ``ahead`` after its last.

    ``sinks``: the attention sinks the group's queries read besides (0 where the window drops
    no key or looks ahead only).
    """

    heads: Tuple[int, ...]
    window: Tuple[Optional[int], Optional[int]]
    kind: str
    back: int = 0
    ahead: int = 0
    size: int = 0
    reach: int = 0
    looks_ahead: bool = False
    sinks: int = 0

    def keys(self, variant: str, length: int) -> float:
        """About how many keys each query reads, on average over a sequence of ``length``."""
        if self.kind == "blocks":
            if self.reach >= length - 1:  # the fold itself: half of them
                return length / 2
            return self.reach + band_fold.block_size(self.reach, length) + self.sinks
        if self.kind == "fold":
            return length / 2 if variant == "causal" else length
        return self.back + self.size + self.ahead + self.sinks


def plan(windows, variant: str, query_len: int, key_len: int, global_tokens: int = 0,
         itemsize: int = 4, folds: bool = True, chunk: Optional[int] = None,
         sinks: int = 0) -> List[Group]:
    """The head groups of a call with ``windows`` ``(back, ahead)`` per head and how each is
    computed (a :class:`Group`): heads with the same windows (those that reach past every key:
    unbounded) form a group;

    * a group that looks one way (``causal``, ``one_sided``) over a whole sequence with no
      global tokens (``sinks``, the attention sinks of the call, are a group's if its window
      looks back and drops keys), where the fold serves the call (``folds``: CPU,
      float32/64), with a window of half the sequence or more or of
      :data:`.tuning.BANDED_MIN_WINDOW` keys or more, runs as ``blocks``;
    * one whose chunk would hold every query, or whose chunks would read about every key anyway
      while its one-chunk bias stays within :data:`.tuning.ONE_CHUNK_BYTES` (``itemsize``
      bytes an element) or its window drops no key, runs ``whole``, or as the ``fold`` if its
      window drops no key of a whole sequence with no global tokens where the fold serves the
      call (not ``one_sided``, whose fold splits the heads it is given by direction);
    * the others run as ``chunks`` of :func:`chunk_size` queries (``chunk``: a size asked
      for, which also keeps groups off the blocks).

    :func:`attention` computes this plan and ``dispatch.windowed_cost`` prices it.
    """
    T, S = query_len, key_len
    first = S - T
    found = []
    for window, heads in _groups(_within(windows, T, S)).items():
        heads = tuple(heads)
        back, ahead = window
        looks_ahead = variant == "one_sided" and back == 0 and ahead != 0
        reach = ahead if looks_ahead else back
        reach = S - 1 if reach is None else min(reach, S - 1)
        # sinks are keys beyond a window that looks back
        own = min(sinks, S) if window[0] not in (None, 0) else 0
        if (chunk is None and T == S and not global_tokens and folds
                and variant in ("causal", "one_sided")
                and (reach >= tuning.BANDED_MIN_WINDOW or 2 * reach >= S)):
            found.append(Group(heads, window, "blocks", reach=reach, looks_ahead=looks_ahead,
                               sinks=own))
            continue
        # the reach the sequence allows: past keys down to 0, future ones up to S - 1
        back = first + T - 1 if window[0] is None else min(window[0], first + T - 1)
        ahead = T - 1 if window[1] is None else min(window[1], T - 1)
        size = chunk or chunk_size(back, ahead)
        drops_none = ((window[0] is None or window[0] >= S - 1) and
                      (window[1] is None or window[1] >= T - 1 or variant == "causal"))
        # one chunk of every query where a chunk would hold them all, or where the chunks
        # would read about every key anyway and the one chunk's (H_g, T, reach) bias is small
        # (a large one held several times the memory of dense attention, and, built again
        # whenever it could not be kept, more time than the chunks' small biases)
        whole = len(heads) * T * (min(back, first) + T + max(global_tokens, own)) * itemsize
        if size >= T or (back + size + ahead >= S
                         and (drops_none or whole <= tuning.ONE_CHUNK_BYTES)):
            if (drops_none and folds and T == S and not global_tokens
                    and variant != "one_sided"):
                found.append(Group(heads, window, "fold"))
            else:  # the keys from the first query's reach on
                found.append(Group(heads, window, "whole", back=min(back, first), size=T,
                                   sinks=own))
            continue
        found.append(Group(heads, window, "chunks", back=back, ahead=ahead, size=size,
                           sinks=own))
    return found


def _banded(q, k, v, slopes, group: Group, scale, key_padding_mask):
    """A ``blocks`` group's output ``(B, len(heads), T, D)`` by
    :func:`.band_fold.banded_attention`."""
    idx = _heads_index(list(group.heads), q.device)
    return band_fold.banded_attention(q[:, idx], k[:, idx], v[:, idx], slopes[idx],
                                      group.reach, scale, key_padding_mask, group.looks_ahead)


def _parts(T, S, group: Group, key_padding_mask, global_tokens=0, sinks=None):
    """``[((t0, t1), hide)]``: the rows of a chunk group's :func:`_band` calls: the chunks that
    read only real keys need no hiding column (a smaller head size)."""
    t0, t1 = _interior(T, S, group.back, group.ahead, group.size)
    sinks = group.sinks if sinks is None else sinks
    if key_padding_mask is not None or global_tokens or sinks or t0 >= t1:
        return [((0, T), True)]
    return [(r, h) for r, h in (((0, t0), True), ((t0, t1), False), ((t1, T), True))
            if r[0] < r[1]]


def _sink_logits(q, k, m, sinks, back, visible, scale):
    """``(logits, i - j)``: the logits ``(B, H_g, P, T)`` of the sinks ``j < P`` for a group's
    queries (at the end of the keys) beyond their window (``i - j > back``), with their bias
    ``-m·(i - j)``; the others (the window's, padding, ahead) hidden. Keys first: the
    reductions over ``P`` run along ``T``."""
    T, S = q.size(2), k.size(2)
    rel = (torch.arange(S - T, S, device=q.device)
           - torch.arange(sinks, device=q.device)[:, None]).to(q.dtype)
    logits = torch.matmul(k[:, :, :sinks], q.transpose(-1, -2)).mul_(scale)
    logits -= m.to(q.dtype)[:, None, None] * rel
    hidden = (rel <= back) | ~visible[:, None, :sinks, None]  # back: (H_g, 1, 1)
    return logits.masked_fill_(hidden, mask_value(q.dtype)), rel


def _exp(x: Tensor) -> Tensor:
    """``exp`` of ``x <= 0`` with the values that vanish anyway (``< e^-80``: padding, hidden
    keys) raised to that: the CPU's exp of large negative numbers is ~20× slower."""
    return x.clamp_(min=-80.0).exp_()


def _plus(x: Tensor, weights: Tensor, y: Tensor, alpha: float = 1.0) -> Tensor:
    """``x += alpha·weightsᵀ·y[:, :, :P]`` in place (one pass over ``x``): ``x``
    ``(B, H, T, D)`` contiguous, ``weights`` ``(B, H, P, T)``."""
    B, H, P, T = weights.shape
    x.view(B * H, T, -1).baddbmm_(weights.reshape(B * H, P, T).transpose(1, 2),
                                  y[:, :, :P].reshape(B * H, P, -1), alpha=alpha)
    return x


class _Merged(torch.autograd.Function):
    """Head groups' windows (``windows``: each its heads' rows, its ``(out, lse)``, and the
    backward of its share of a larger softmax) and, unless ``sinks`` is ``None``, their sinks
    beyond them (:func:`_sink_logits`): one softmax, merged by log-sum-exp. Backward: each
    part's share from the merged output and log-sum-exp (without sinks, each window's own
    gradient by its own backward)."""

    @staticmethod
    def forward(ctx, q, k, v, m, windows, sinks, scale):
        found = [forward(q[:, r], k[:, r], v[:, r], m[r]) for r, forward, _ in windows]
        lse = torch.cat([lse for _, lse in found], 1)
        if sinks is None:  # the windows alone
            out = torch.cat([o for o, _ in found], 1) if len(found) > 1 else found[0][0]
        else:
            out = q.new_empty(q.shape[:3] + (v.size(-1),))
            logits, _ = sinks(q, k, m)
            top = torch.maximum(lse, logits.amax(-2))
            probs, share = _exp(logits - top[..., None, :]), _exp(lse - top)
            total = probs.sum(-2) + share
            probs /= total[..., None, :]  # of the merged softmax, as the window's share
            share = (share / total)[..., None]
            for (r, _, _), (window_out, _) in zip(windows, found):  # one pass: no cat
                torch.mul(window_out, share[:, r], out=out[:, r])
            out = _plus(out, probs, v)
            lse = top + torch.log(total)
        ctx.save_for_backward(q, k, v, m, out, lse)
        ctx.windows, ctx.sinks, ctx.scale = windows, sinks, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, m, out, lse = ctx.saved_tensors
        grad = grad.to(q.dtype)
        need = ctx.needs_input_grad[3]
        found = [backward(grad[:, r], q[:, r], k[:, r], v[:, r], m[r], out[:, r], lse[:, r],
                          need) for r, _, backward in ctx.windows]
        gq, gk, gv = (torch.cat(x, 1) if len(x) > 1 else x[0] for x in list(zip(*found))[:3])
        # (windows that carry the slopes' gradient: blocks)
        gm = torch.cat([g[3] for g in found]) if need else None
        if ctx.sinks is None:
            return gq, gk, gv, gm, None, None, None
        logits, rel = ctx.sinks(q, k, m)
        P = logits.size(2)
        probs = _exp(logits - lse[..., None, :])
        d = probs * (torch.matmul(v[:, :, :P], grad.transpose(-1, -2))
                     - (grad * out).sum(-1)[..., None, :])  # (B, H_g, P, T)
        gq = _plus(gq.contiguous(), d, k, ctx.scale)
        gk[:, :, :P] += torch.matmul(d, q) * ctx.scale
        gv[:, :, :P] += torch.matmul(probs, grad)
        if need:
            gm = gm - (d * rel).sum((0, 2, 3)).to(m.dtype)
        return gq, gk, gv, gm, None, None, None


def _by_kernel(q, k, v, visible, slopes, future_slopes, variant, groups: List[Group], scale,
               key_padding_mask, global_tokens=0):
    """The output ``(B, H_g, T, D)`` of ``groups``, their heads in order, by the fused kernel's
    own forward and backward (:class:`_Merged`): each window (``blocks`` by :mod:`.band_fold`,
    else its chunks, the prefix of ``global_tokens`` and their sinks in every chunk); without
    global tokens, groups with sinks (all of them, or none) have them beyond their windows as
    one small pass of every head (``S × T`` logits), merged with the windows."""
    T, S = q.size(2), k.size(2)
    apart = 0 if global_tokens else groups[0].sinks  # the sinks of their own pass
    kpm = None if key_padding_mask is None else key_padding_mask.to(torch.bool)
    windows, start = [], 0
    for g in groups:  # (rows, forward, backward) of each group's window, its heads only
        rows, start = slice(start, start + len(g.heads)), start + len(g.heads)
        if g.kind == "blocks":
            windows.append((rows, functools.partial(
                band_fold.banded_forward, window=g.reach, scale=scale, key_padding_mask=kpm),
                functools.partial(band_fold.banded_backward, window=g.reach, scale=scale,
                                  key_padding_mask=kpm)))
            continue
        own = 0 if apart else g.sinks  # the sinks inside the chunks, with global tokens
        args = (visible, slopes, future_slopes, variant, list(g.heads), g.window, g.back,
                g.ahead, g.size, global_tokens, own, scale)
        parts = _parts(T, S, g, key_padding_mask, global_tokens, sinks=own)
        windows.append((rows, functools.partial(_chunks_forward, args=args, parts=parts),
                        functools.partial(_chunks_backward, args=args, parts=parts)))
    sinks = None
    if apart:
        back = torch.tensor([g.window[0] for g in groups for _ in g.heads], device=q.device)
        sinks = functools.partial(_sink_logits, sinks=apart, back=back[:, None, None],
                                  visible=visible, scale=scale)
    idx = _heads_index([h for g in groups for h in g.heads], q.device)
    return _Merged.apply(q[:, idx], k[:, idx], v[:, idx], slopes[idx], windows, sinks, scale)


def _chunks_forward(q, k, v, m, args, parts):
    """``(out, lse)`` of a chunk group's window (``q``, ``k``, ``v``: its heads) by the kernel."""
    B, _, _, D = q.shape
    found = []
    for (t0, t1), hide in parts:
        qa, ka, va, bias = _band_inputs(q, k, v, *args, rows=(t0, t1), hide=hide, picked=True)
        o, lse = fold.kernel_forward(qa, ka, va, False, attn_mask=bias, scale=args[-1])
        found.append((_unchunked(o, B, t1 - t0, D), _unchunked(lse[..., None], B, t1 - t0, 1)))
    return torch.cat([o for o, _ in found], 2), torch.cat([l for _, l in found], 2)[..., 0]


def _chunks_backward(grad, q, k, v, m, out, lse, slopes_grad, args, parts):
    """The window's share ``(grad_q, grad_k, grad_v)`` of a softmax's gradient (its own, or a
    larger one's with sinks), from that softmax's ``out`` and ``lse``: the kernel's backward
    per call, then the chunks' layout's by autograd (the windows' overlaps summed)."""
    with torch.enable_grad():
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        built, grads = [], []
        for (t0, t1), hide in parts:
            inputs = _band_inputs(*leaves, *args, rows=(t0, t1), hide=hide, picked=True)
            c, Dp = inputs[0].shape[2:]
            rows = [_chunked(x[:, :, t0:t1], c, Dp) for x in (grad, out)]
            grads += fold.kernel_backward(
                rows[0], *inputs[:3], rows[1],
                _chunked(lse[:, :, t0:t1, None], c, 1)[..., 0].contiguous(), False,
                attn_mask=inputs[3], scale=args[-1])
            built += inputs[:3]
        return torch.autograd.grad(built, leaves, grads) + (None,)  # (slopes: not learned)


def _prefix_queries(q, k, v, visible, slopes, future_slopes, variant, windows, global_tokens,
                    sinks, scale):
    """The output ``(B, H, g, D)`` of the queries among the first ``max(global_tokens, sinks)``
    positions: global tokens, exempt from the bias and the windows, read every key; the others
    their windows and the sinks (some of them ahead), by the dense definition (one dense call,
    ``g <= max(N, S)``) over the keys they reach."""
    B, H, T, D = q.shape
    S = k.size(2)
    first = S - T
    g = min(max(global_tokens, sinks), S) - first
    ahead = None if global_tokens or None in windows[1] else max(windows[1])
    S = S if ahead is None else min(S, first + g + ahead)
    bias = alibi_bias_between(slopes, torch.arange(first, first + g), torch.arange(S), variant,
                              future_slopes, q.dtype, global_tokens, windows=windows,
                              sinks=sinks)
    bias = bias[None].masked_fill(~visible[:, None, None, :S], mask_value(q.dtype))
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
    first = S - T
    folds = fold.available() and q.device.type == "cpu" and q.dtype in fold.FOLD_DTYPES
    # learned slopes: the chunks' bias carries their gradient, which the kernel does not return
    learned = torch.is_grad_enabled() and any(
        m is not None and m.requires_grad for m in (slopes, future_slopes))
    outs: List[Tensor] = []
    order: List[int] = []
    sunk: List[Group] = []
    for group in plan(windows, variant, T, S, global_tokens, q.element_size(), folds, chunk,
                      sinks):
        heads = list(group.heads)
        if group.sinks and folds and not global_tokens and (group.kind == "blocks"
                                                             or not learned):
            sunk.append(group)  # the windows, then the sinks: one pass of these heads
            continue
        order += heads
        if group.kind == "fold":
            outs.append(_folded(q, k, v, slopes, future_slopes, variant, heads, scale,
                                key_padding_mask))
            continue
        if group.kind == "blocks":  # no bias tensor: the fold's kernel over blocks
            outs.append(_banded(q, k, v, slopes, group, scale, key_padding_mask))
            continue
        if folds and not learned:  # the chunks by the kernel's own forward and backward
            outs.append(_by_kernel(q, k, v, visible, slopes, future_slopes, variant, [group],
                                   scale, key_padding_mask, global_tokens))
            continue
        args = (q, k, v, visible, slopes, future_slopes, variant, heads, group.window,
                group.back, group.ahead, group.size, global_tokens, group.sinks, scale)
        parts = [_band(*args, rows=rows, hide=hide)
                 for rows, hide in _parts(T, S, group, key_padding_mask, global_tokens)]
        outs.append(torch.cat(parts, dim=2) if len(parts) > 1 else parts[0])
    if sunk:
        outs.append(_by_kernel(q, k, v, visible, slopes, future_slopes, variant, sunk, scale,
                               key_padding_mask))
        order += [h for group in sunk for h in group.heads]
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
    if order != list(range(H)):
        out = out[:, torch.as_tensor(order).argsort()]
    prefix = max(global_tokens, sinks)
    if prefix > first:  # queries that are global tokens or in front of a sink: dense
        exempt = _prefix_queries(q, k, v, visible, slopes, future_slopes, variant, windows,
                                 global_tokens, sinks, scale)
        out = torch.cat([exempt, out[:, :, exempt.size(2):]], dim=2)
    return out


def _heads_index(heads: List[int], device):
    """``heads`` as an index of the head axis: a slice (a view) when they are contiguous."""
    if heads == list(range(heads[0], heads[0] + len(heads))):
        return slice(heads[0], heads[0] + len(heads))
    return torch.as_tensor(heads, device=device)


def few_queries(q, k, v, alibi, windows, key_padding_mask, scale) -> Tensor:
    """A call of a few queries against a KV cache (a decoding step, ``T = 1``; a short chunk),
    ``(B, H, T, D)``: each head group reads only the keys from its first query's reach on,
    ``S - T - back … S - 1``, with its rows of the call's dense bias (``alibi.dense``: memoised
    by the stack, the same tensor for every step of a cache trimmed to its bound), one fused
    kernel call per group, and the cache's attention sinks (``alibi.sinks``, its first keys:
    the dense bias holds their positions). Not with global tokens (the first keys are in every
    window)."""
    B, H, T, D = q.shape
    S = k.size(2)
    first = S - T
    mask = dense.dense_mask(alibi, B, T, S, q.dtype, key_padding_mask, None)
    sinks = min(getattr(alibi, "sinks", 0), S)
    outs: List[Tensor] = []
    order: List[int] = []
    for (back, _), heads in _groups(windows).items():
        lo = 0 if back is None else first - min(back, first)
        idx = _heads_index(heads, q.device)
        if sinks and lo > 0:  # the sinks before the window, then the window
            kept = torch.cat([torch.arange(min(sinks, lo)), torch.arange(lo, S)]).to(q.device)
            parts = (k[:, idx].index_select(2, kept), v[:, idx].index_select(2, kept),
                     mask[:, idx].index_select(3, kept))
        else:
            parts = (k[:, idx, lo:], v[:, idx, lo:], mask[:, idx, :, lo:])
        outs.append(F.scaled_dot_product_attention(q[:, idx], parts[0], parts[1],
                                                   attn_mask=parts[2], scale=scale))
        order += heads
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
    if order != list(range(H)):
        out = out[:, torch.as_tensor(order).argsort()]
    return out


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
