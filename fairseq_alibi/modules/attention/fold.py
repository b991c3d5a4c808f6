"""``fold``: ALiBi inside PyTorch's fused CPU attention kernel, with no bias tensor.

The look-back bias ``-m·(i - j)`` has rank 2 on the causal triangle, so :func:`alibi_fold`
writes it as 4 extra query/key columns and the kernel runs with its built-in causal mask (it
skips the blocks above the diagonal) instead of reading a dense ``(H, L, L)`` float mask::

    scale · ([cols_q(i), q_i, 0…] · [cols_k(j), k_j, 0…]) = scale·q_i·k_j - m·(i - j)   (j <= i)

(the columns are built from ``m / scale``). The head size grows from ``D`` to ``D + 4``
(``+ 5`` with a key-padding column holding ``0`` or :func:`~fairseq_alibi.alibi.mask_value`),
rounded up to a multiple of 4. Every variant is one or two such causal passes:

==============  =================================================================
``causal``      look-back pass, all heads
``one_sided``   look-back pass for heads ``< H/2``, look-ahead pass (the same on
                time-reversed sequences) for the others: half the work of a
                bidirectional attention, like ``causal``
``symmetric``   look-back pass ``j <= i`` + look-ahead pass ``j > i``, merged by their
``offset``      log-sum-exps; ``offset`` adds ``0.5·m`` to the look-ahead log-sum-exp,
``asymmetric``  ``asymmetric`` uses the future slopes in the look-ahead pass
==============  =================================================================

Merging two softmaxes over disjoint key sets is exact: with ``l = logaddexp(l₁, l₂)`` the
output is ``e^(l₁-l)·o₁ + e^(l₂-l)·o₂``. The backward pass calls the kernel's own backward on
each pass with the *merged* output and log-sum-exp, which gives exactly that pass's share of
the full softmax gradient. Only ``q``, ``k``, ``v``, the output and the log-sum-exp are saved
(the augmented copies are rebuilt), so training holds no more than the unbiased attention, and
long sequences are processed a few heads at a time (:data:`.tuning.CHUNK_BYTES`) so that the
copies stay near the size of ``q``. Where ``auto`` takes it: :func:`~.dispatch.auto_backend`.

The kernel is ``aten::_scaled_dot_product_flash_attention_for_cpu`` (what
``scaled_dot_product_attention`` runs on the CPU); :data:`CAPABILITIES` says which calls it
serves (no attention dropout, KV cache, extra ``attn_mask``, half precision, non-CPU tensors
or global tokens).
"""

from dataclasses import dataclass
from typing import List, Optional

import torch
from torch import Tensor

from fairseq_alibi.alibi import ONE_WAY_VARIANTS, VARIANTS, mask_value
from fairseq_alibi.modules.attention import tuning
from fairseq_alibi.modules.attention.capabilities import Capabilities

_FORWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)

#: extra query/key columns of :func:`alibi_fold` (one past the last is free for a padding column)
FOLD_COLUMNS = 4


def split_slopes(slopes: torch.Tensor, max_abs_position: int):
    """``m = m_hi + m_lo`` with ``m_hi·p`` exact in float32 for every ``|p| <= max_abs_position``.

    ``m_hi`` keeps the top ``24 - bits(max_abs_position)`` significant bits of ``m`` (at least
    one); ``m_lo = m - m_hi`` is exact too (the bits that remain). Only ``m_lo`` carries the
    gradient of ``m`` (straight through), which is the whole gradient: see :func:`alibi_fold`.
    """
    slopes = slopes.float()
    keep = max(1, 24 - int(max_abs_position).bit_length())
    mantissa, exponent = torch.frexp(slopes.detach().double())
    hi = torch.ldexp(torch.round(torch.ldexp(mantissa, torch.tensor(keep))), exponent - keep)
    hi = hi.float()
    return hi, slopes - hi


def alibi_fold(slopes: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor):
    """The look-back bias ``-m·(i - j)`` as a dot product of 4 extra query and key columns.

    Returns ``q_cols`` ``(H, Lq, 4)`` and ``k_cols`` ``(Lk, 4)``, float32, with
    ``q_cols[h, t] · k_cols[s] = -m_h·(i_t - j_s)`` for every query position ``i_t`` and key
    position ``j_s``. With ``c`` the centre of the positions and ``m = m_hi + m_lo``
    (:func:`split_slopes`)::

        q_cols[h, t] = [ m_hi,  -m_hi·(i_t - c),  m_lo,  -m_lo·(i_t - c) ]
        k_cols[s]    = [ j_s - c,        1,       j_s - c,        1      ]

    Appended *before* the scaled query and the key, these columns let an attention kernel
    with a plain causal mask compute ``q·k/√d - m·(i - j)`` with no bias tensor at all: the
    bias has rank 2 on the visible triangle. Summed in column order, the two ``m_hi`` products
    are exact and cancel exactly, so the logit is as accurate as with a stored bias even far
    from position 0 (a single ``m·j`` column, the "row trick", is not: it loses
    ``ulp(m·L)``). The look-ahead half of the bidirectional variants uses the same columns on
    time-reversed positions. The gradient of ``m`` flows through the ``m_lo`` columns and is
    exact: ``d/dm`` of the dot product is ``(j - c) - (i - c) = -(i - j)``.
    """
    query_positions = query_positions.float()
    key_positions = key_positions.float()
    span = torch.cat([query_positions, key_positions])
    if span.numel() == 0:
        centre = 0.0
    else:
        centre = float(torch.floor((span.min() + span.max()) / 2))
    q_rel = query_positions - centre
    k_rel = key_positions - centre
    hi, lo = split_slopes(slopes, int(span.sub(centre).abs().max()) if span.numel() else 0)
    hi, lo = hi[:, None], lo[:, None]
    q_cols = torch.stack(
        [hi.expand(-1, q_rel.numel()), -hi * q_rel, lo.expand(-1, q_rel.numel()), -lo * q_rel],
        dim=-1,
    )
    ones = torch.ones_like(k_rel)
    k_cols = torch.stack([k_rel, ones, k_rel, ones], dim=-1)
    return q_cols, k_cols


#: dtypes whose float32-exact fold columns the kernel reads as they are
FOLD_DTYPES = (torch.float32, torch.float64)


#: the variants computed as two merged passes over every head (about twice a causal call)
MERGED_VARIANTS = tuple(v for v in VARIANTS if v not in ONE_WAY_VARIANTS)


def available() -> bool:
    return _FORWARD is not None and _BACKWARD is not None


def kernel_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool,
                   attn_mask: Optional[Tensor] = None, scale: Optional[float] = None):
    """``(out, lse)`` of the fused CPU kernel (no dropout): ``q`` ``(B, H, T, D)`` against
    ``k``/``v`` ``(B, H, S, D)``, with its own causal mask if ``causal`` and an additive
    ``attn_mask``; ``lse`` ``(B, H, T)`` the rows' log-sum-exps. Only where :func:`available`."""
    return _FORWARD(q, k, v, 0.0, causal, attn_mask=attn_mask, scale=scale)


def kernel_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                    lse: Tensor, causal: bool, attn_mask: Optional[Tensor] = None,
                    scale: Optional[float] = None):
    """``(grad_q, grad_k, grad_v)`` of :func:`kernel_forward`'s call, from its ``out`` and
    ``lse`` (or, for one pass of several, the merged output and log-sum-exp: that pass's share
    of the whole softmax's gradient)."""
    return _BACKWARD(grad_out, q, k, v, out, lse, 0.0, causal, attn_mask=attn_mask, scale=scale)


def _missing() -> Optional[str]:
    if available():
        return None
    return f"this torch ({torch.__version__}) has no fused CPU kernel with a log-sum-exp"


#: what :func:`attention` serves: the slopes of every variant, CPU, float32/64, whole sequences
#: (a decoding step's bias is not a causal fold), no dropout or extra mask in the kernel
CAPABILITIES = Capabilities(
    kinds=("distance",), devices=("cpu",), dtypes=FOLD_DTYPES, kv_cache=False, dropout=False,
    attn_mask=False, global_tokens=False, missing=_missing)


@dataclass(frozen=True)
class _Pass:
    """One causal kernel call: which heads, and whether it is the look-ahead half."""

    heads: slice
    ahead: bool = False  # run on time-reversed sequences: sees j >= i instead of j <= i
    strict: bool = False  # leave out the diagonal (the look-back pass has it)
    future_slopes: bool = False  # asymmetric: the look-ahead slopes
    lse_shift: float = 0.0  # times m, added to this pass's logits (offset: +0.5)


def _groups(variant: str, num_heads: int, chunk: int) -> List[List[_Pass]]:
    """The kernel calls, ``chunk`` heads at a time; the passes of a group are merged."""

    def split(first, stop):
        return [slice(h, min(h + chunk, stop)) for h in range(first, stop, chunk)]

    if variant == "causal":
        return [[_Pass(h)] for h in split(0, num_heads)]
    if variant == "one_sided":
        half = num_heads // 2
        return [[_Pass(h)] for h in split(0, half)] + [
            [_Pass(h, ahead=True)] for h in split(half, num_heads)
        ]
    return [
        [_Pass(h), _Pass(h, ahead=True, strict=True, future_slopes=variant == "asymmetric",
                         lse_shift=0.5 if variant == "offset" else 0.0)]
        for h in split(0, num_heads)
    ]


def _heads_per_chunk(q: Tensor, dim: int) -> int:
    """Heads per kernel call: the augmented copies under ``max(tuning.CHUNK_BYTES, q / 8)``."""
    B, H, L, D = q.shape
    budget = max(tuning.CHUNK_BYTES, q.numel() * q.element_size() // 8)
    most = max(1, min(H, budget // max(1, B * L * dim * q.element_size())))
    calls = -(-H // most)
    return -(-H // calls)  # as even as possible


def padded_head_dim(head_dim: int, columns: int) -> int:
    """The head size of ``head_dim`` plus ``columns`` extra columns as the kernel is given it:
    the smallest multiple of 4 that fits (the kernel is slower at other sizes:
    docs/benchmarks.md, "How fold adds ALiBi with no bias tensor")."""
    return -(-(head_dim + columns) // 4) * 4


class _Layout:
    """Rows and fold columns of one pass, in its own time order.

    The kernel multiplies the whole dot product by ``scale``, so the columns are built from
    ``m / scale``: the fold stays exact (:func:`split_slopes` splits the
    rounded ``m / scale``, a relative error of one float32 ulp in the slope, as a stored bias
    has), and the queries are copied as they are, not scaled first.
    """

    def __init__(self, p, length, slopes, scale, key_padding_mask, head_dim):
        self.p = p
        self.length = length
        # the look-ahead pass without its diagonal: reversed queries 1.. see reversed keys ..L-2
        self.q_rows = slice(1, length) if p.strict else slice(0, length)
        self.k_rows = slice(0, length - 1) if p.strict else slice(0, length)
        positions = torch.arange(length, device=slopes.device)
        self.q_cols, self.k_cols = alibi_fold(
            slopes / scale, positions[self.q_rows], positions[self.k_rows]
        )
        self.pad_col = None
        if key_padding_mask is not None:
            pad = self.key_rows(key_padding_mask[:, None, :, None].to(torch.bool))
            self.pad_col = torch.zeros(pad.shape, dtype=torch.float32, device=pad.device)
            self.pad_col.masked_fill_(pad, mask_value(torch.float32))
        self.columns = FOLD_COLUMNS + (self.pad_col is not None)
        self.dim = padded_head_dim(head_dim, self.columns)

    @property
    def empty(self):
        return self.q_rows.stop <= self.q_rows.start

    def orient(self, x: Tensor) -> Tensor:
        """Original time order -> this pass's (dim 2)."""
        return x.flip(2) if self.p.ahead else x

    def query_rows(self, x: Tensor) -> Tensor:
        return self.orient(x)[:, :, self.q_rows]

    def key_rows(self, x: Tensor) -> Tensor:
        return self.orient(x)[:, :, self.k_rows]

    def _cat(self, x: Tensor, front: List[Tensor]) -> Tensor:
        B, H, T, D = x.shape
        parts = [f.to(x.dtype).expand(B, H, T, f.shape[-1]) for f in front] + [x]
        spare = self.dim - self.columns - D
        if spare:
            parts.append(x.new_zeros(()).expand(B, H, T, spare))
        return torch.cat(parts, dim=-1)

    def queries(self, q: Tensor) -> Tensor:
        """``[fold columns, (1), q, 0…]`` for this pass's query rows."""
        front = [self.q_cols]
        if self.pad_col is not None:
            front.append(self.q_cols.new_ones(()).expand(*self.q_cols.shape[:-1], 1))
        return self._cat(self.query_rows(q), front)

    def keys(self, k: Tensor) -> Tensor:
        """``[fold columns, (0 or mask value), k, 0…]`` for this pass's key rows."""
        front = [self.k_cols] + ([self.pad_col] if self.pad_col is not None else [])
        return self._cat(self.key_rows(k), front)

    def values(self, x: Tensor) -> Tensor:
        """``[x, 0…]`` with this pass's head size (values, outputs and their gradients)."""
        B, H, T, D = x.shape
        return torch.cat([x, x.new_zeros(()).expand(B, H, T, self.dim - D)], dim=-1)

    def back(self, x: Tensor, rows: slice, fill: float = 0.0) -> Tensor:
        """This pass's rows ``rows`` -> original time order, missing rows set to ``fill``."""
        if rows.stop - rows.start != self.length:
            full = x.new_full(x.shape[:2] + (self.length,) + x.shape[3:], fill)
            full[:, :, rows] = x
            x = full
        return self.orient(x)


def _lse_shift(p: _Pass, slopes: Tensor) -> Optional[Tensor]:
    return None if not p.lse_shift else (p.lse_shift * slopes)[None, :, None]


def _forward(q, k, v, slopes, future, key_padding_mask, variant, scale):
    """``(out, lse)``; ``out`` has the memory layout of ``q`` (see :class:`FoldedAlibiAttention`)."""
    B, H, L, D = q.shape
    out = torch.empty_like(q)
    # float32, float64 for float64 inputs: the kernel's backward reads it in q's precision
    lse_dtype = torch.promote_types(q.dtype, torch.float32)
    lse = q.new_empty(B, H, L, dtype=lse_dtype)
    chunk = _heads_per_chunk(q, padded_head_dim(D, FOLD_COLUMNS + 1))
    for group in _groups(variant, H, chunk):
        halves = []
        for p in group:
            hs = p.heads
            m = (future if p.future_slopes else slopes)[hs]
            lay = _Layout(p, L, m, scale, key_padding_mask, D)
            if lay.empty:  # a single position has no strict look-ahead keys
                o = q.new_zeros(B, hs.stop - hs.start, 0, D)
                l = q.new_zeros(B, hs.stop - hs.start, 0, dtype=lse_dtype)
            else:
                o, l = kernel_forward(
                    lay.queries(q[:, hs]), lay.keys(k[:, hs]),
                    lay.values(lay.key_rows(v[:, hs])), True, scale=scale,
                )
                o = o[..., :D]
            o = lay.back(o, lay.q_rows)
            l = lay.back(l.to(lse_dtype)[..., None], lay.q_rows, float("-inf"))[..., 0]
            shift = _lse_shift(p, m)
            halves.append((o, l if shift is None else l + shift))
        if len(halves) == 1:
            o, l = halves[0]
        else:
            o, l = merge_passes([(slice(None), o, l) for o, l in halves], halves[0][0].shape,
                                lse_dtype)
        out[:, group[0].heads] = o
        lse[:, group[0].heads] = l
    return out, lse


def merge_passes(parts, shape, lse_dtype):
    """``(out, lse)`` of one softmax over several passes whose key sets partition each query's
    keys, from each pass's ``(rows, out, lse)`` (``rows``: the slice of dim 1 it covers, of
    ``shape``): with ``top`` the largest log-sum-exp, ``out = Σ e^(l_p - top)·out_p / Σ e^(l_p -
    top)``, ``lse = top + log Σ e^(l_p - top)``. Normalised by the weights' sum, not by
    ``exp(l - logaddexp)``: an all-padding row holds the mask value in every pass, where
    logaddexp cannot add log 2 and the weights would sum to 2."""
    top = torch.full(shape[:-1], float("-inf"), dtype=lse_dtype, device=parts[0][1].device)
    for rows, _, l in parts:
        top[:, rows] = torch.maximum(top[:, rows], l)
    weights = [torch.exp(l - top[:, rows]) for rows, _, l in parts]
    total = torch.zeros_like(top)
    for (rows, _, _), w in zip(parts, weights):
        total[:, rows] += w
    # each pass's share (w / total)·out_p, summed: the fold's two halves bit for bit as before
    out = parts[0][1].new_zeros(shape)
    for (rows, o, _), w in zip(parts, weights):
        out[:, rows] += (w / total[:, rows])[..., None].to(o.dtype) * o
    return out, top + torch.log(total)


class FoldedAlibiAttention(torch.autograd.Function):
    """``softmax(QKᵀ·scale + ALiBi + padding) V`` for ``(B, H, L, D)`` tensors; see the module.

    The output has the memory layout of ``q``: for fairseq's ``(T, B, H, D)`` projections the
    ``(T, B, C)`` output is then a view, and the tensor saved here for backward is the very one
    the output projection saves. Saved are ``q, k, v``, the output and the log-sum-exp, as
    for the unbiased kernel; the augmented copies are rebuilt in backward.
    """

    @staticmethod
    def forward(ctx, q, k, v, slopes, future, key_padding_mask, variant, scale):
        out, lse = _forward(q, k, v, slopes, future, key_padding_mask, variant, scale)
        ctx.save_for_backward(q, k, v, slopes, future, key_padding_mask, out, lse)
        ctx.variant, ctx.scale = variant, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, slopes, future, key_padding_mask, out, lse = ctx.saved_tensors
        B, H, L, D = q.shape
        groups = _groups(ctx.variant, H, _heads_per_chunk(q, padded_head_dim(D, FOLD_COLUMNS + 1)))
        whole = len(groups) == 1 and len(groups[0]) == 1  # one call: its gradients as they are
        grads = [None] * 3 if whole else [torch.empty_like(x) for x in (q, k, v)]
        # the slopes' gradients (learned slope scales, a learnable future ratio)
        grad_slopes = torch.zeros_like(slopes) if ctx.needs_input_grad[3] else None
        grad_future = None
        if future is not None and ctx.needs_input_grad[4]:
            grad_future = torch.zeros_like(future)
        grad_out = grad_out.to(q.dtype)
        for first, p in ((n == 0, p) for group in groups for n, p in enumerate(group)):
            hs = p.heads
            m = (future if p.future_slopes else slopes)[hs].detach()
            lay = _Layout(p, L, m, ctx.scale, key_padding_mask, D)
            if lay.empty:  # (never first: the look-back pass of a group is never empty)
                continue
            shift = _lse_shift(p, m)
            pass_lse = lse[:, hs] if shift is None else lse[:, hs] - shift
            gq, gk, gv = kernel_backward(
                lay.values(lay.query_rows(grad_out[:, hs])),
                lay.queries(q[:, hs]),
                lay.keys(k[:, hs]),
                lay.values(lay.key_rows(v[:, hs])),
                lay.values(lay.query_rows(out[:, hs])),
                lay.query_rows(pass_lse[..., None])[..., 0].contiguous(),
                True, scale=ctx.scale,
            )
            c = lay.columns
            found = (
                lay.back(gq[..., c:c + D], lay.q_rows),
                lay.back(gk[..., c:c + D], lay.k_rows),
                lay.back(gv[..., :D], lay.k_rows),
            )
            for n, g in enumerate(found):
                if whole:
                    grads[n] = g
                elif first:  # each head's first pass sets its gradient, a second one adds
                    grads[n][:, hs] = g
                else:
                    grads[n][:, hs] += g
            grad_m = grad_future if p.future_slopes else grad_slopes
            if grad_m is not None:
                grad_m[hs] += _slope_grad(p, lay, m, gq, ctx.scale, L)
        return grads[0], grads[1], grads[2], grad_slopes, grad_future, None, None, None


def _slope_grad(p: _Pass, lay: _Layout, m: Tensor, gq: Tensor, scale: float, length: int):
    """``d loss / d m`` of one pass's heads, from the gradient ``gq`` of its augmented queries.

    Through the fold's own (differentiable) definition: the columns are built from
    ``m / scale`` and the kernel multiplies by ``scale``. ``offset``'s look-ahead pass adds
    ``lse_shift·m`` to all its logits (to its log-sum-exp); that term's gradient is the sum of
    the pass's logit gradients, which is ``gq`` of the query column meeting the keys' constant
    1 (column 1), divided by ``scale``.
    """
    with torch.enable_grad():
        m_leaf = m.detach().requires_grad_()
        positions = torch.arange(length, device=m.device)
        q_cols, _ = alibi_fold(m_leaf / scale, positions[lay.q_rows], positions[lay.k_rows])
        (g,) = torch.autograd.grad(q_cols, m_leaf, gq[..., :FOLD_COLUMNS].float().sum(0))
    if p.lse_shift:
        g = g + p.lse_shift * gq[..., 1].float().sum((0, 2)) / scale
    return g


def folded_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    slopes: Tensor,
    future_slopes: Optional[Tensor],
    variant: str,
    scale: float,
    key_padding_mask: Optional[Tensor] = None,
) -> Tensor:
    """ALiBi attention of ``(B, H, L, D)`` queries/keys/values, no bias tensor; ``(B, H, L, D)``.

    ``slopes``/``future_slopes`` as from ``AttentionBias.head_slopes()``;
    ``key_padding_mask`` ``(B, L)``, True = padding. Only calls :data:`CAPABILITIES` serves.
    """
    slopes = slopes.to(q.device, torch.float32)
    if future_slopes is not None:
        future_slopes = future_slopes.to(q.device, torch.float32)
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.to(torch.bool)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, slopes, future_slopes)
    )
    if not needs_grad:
        return _forward(q, k, v, slopes, future_slopes, key_padding_mask, variant, scale)[0]
    return FoldedAlibiAttention.apply(
        q, k, v, slopes, future_slopes, key_padding_mask, variant, scale
    )


def attention(q, k, v, alibi, key_padding_mask, attn_mask, dropout_p, scale):
    """The ``fold`` backend: :func:`folded_attention` with the slopes of this call."""
    slopes, future = alibi.head_slopes()
    return folded_attention(q, k, v, slopes, future, alibi.variant, scale, key_padding_mask)
