"""One-way slope windows as the ``fold``'s fused kernel over blocks: no bias tensor.

A head group that looks one way (``causal``; ``one_sided``'s two halves) with window ``W`` keeps
the keys at distances ``0 <= d = i - j <= W`` (looking ahead: ``0 <= j - i <= W``). Cut the
sequence into ``n`` blocks of ``c`` positions; query ``i = k·c + a`` and key ``j = (k - p)·c + b``
(block offset ``p``) are at ``d = p·c + a - b``, so offset ``p`` holds the distances
``p·c - c + 1 … p·c + c - 1``. The window is one *pass* per offset it reaches,
``0 … ceil((W + c - 1) / c)``: offset 0 is the kernel's causal mask, an offset whose distances
all lie inside the window reads its key block whole, one on the window's edge reads it through
a ``(c, c)`` mask shared by every block and head. Looking ahead, the offsets are negative and
offset 0 is masked too.

A pass runs the kernel once over every query block that has such a key block, blocks as batch
entries ``(B·n', H_g, c, D + columns)``: views of one copy of the queries and one of the keys,
each with the slopes as :func:`~.fold.alibi_fold` columns of its absolute position
(``-m·(i - j)``; looking ahead the columns of ``-m``, i.e. ``-m·(j - i)``). The passes are
merged by their log-sum-exps, as :mod:`.fold` merges its two halves: each query reads about
``W + c`` keys, the kernel skips the upper half of the causal pass, and no ``(H, T, S)`` bias
exists. A window over the whole sequence is one block looking back, the fold itself (looking
ahead: the same on the reversed sequence). Padding past the last block is hidden by a key
column where a look-ahead pass could read it. Backward as the fold's: the kernel's own backward
per pass with the merged output and log-sum-exp. :func:`banded_forward` and
:func:`banded_backward` expose it, to merge more keys (attention sinks) into that softmax.

Two-way windows (the bidirectional variants) stay on :mod:`.windowed`'s chunks: as passes here
they were slower (every pass is a merge, and both directions' own block is masked).
"""

import functools
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq_alibi.alibi import mask_value
from fairseq_alibi.modules.attention import fold, tuning


@dataclass(frozen=True)
class _Pass:
    """The query blocks ``k`` against the key blocks ``k - offset``: every key of the pair, the
    kernel's causal mask, or the mask keeping the distances ``keep = (lo, hi)``."""

    offset: int
    causal: bool = False
    keep: Optional[Tuple[int, int]] = None


def block_size(window: int, length: int) -> int:
    """About the window's ``1 / BLOCK_FRACTION`` (at least ``MIN_BLOCK``, at most the sequence;
    both in :mod:`.tuning`): of the sizes from half that up, the one that pads the sequence least
    (the largest on a tie)."""
    most = min(length, max(tuning.MIN_BLOCK, window // tuning.BLOCK_FRACTION))
    return min(range(max(1, most // 2), most + 1), key=lambda c: (-(-length // c) * c, -c))


def plan(window: int, length: int, ahead: bool = False) -> Tuple[int, List[_Pass]]:
    """``(c, passes)`` of a window of ``W`` keys back (``ahead``: forward) over ``length``
    positions; looking back over the whole sequence, one block: the fold."""
    size = length if not ahead and window >= length - 1 else block_size(window, length)
    lo, hi = (-window, 0) if ahead else (0, window)
    passes = []
    for p in range(0, -(-(window + size - 1) // size) + 1):
        p = -p if ahead else p
        first, last = p * size - size + 1, p * size + size - 1  # the pair's distances
        if last < lo or first > hi or abs(p) >= -(-length // size):
            continue
        if not ahead and p == 0 and hi >= size - 1:
            passes.append(_Pass(0, causal=True))  # d >= 0, all of them kept
        elif first >= lo and last <= hi:
            passes.append(_Pass(p))
        else:
            passes.append(_Pass(p, keep=(lo, hi)))
    return size, passes


@functools.lru_cache(maxsize=64)
def _mask(size: int, offset: int, keep: Tuple[int, int], dtype, device) -> Tensor:
    """``(1, 1, c, c)``: 0 where ``lo <= offset·c + a - b <= hi``, a large finite negative
    elsewhere (a row with no kept key stays finite; its pass weighs nothing in the merge)."""
    a = torch.arange(size, device=device)[:, None]
    d = offset * size + a - torch.arange(size, device=device)[None, :]
    hidden = (d < keep[0]) | (d > keep[1])
    return torch.zeros(size, size, dtype=dtype, device=device).masked_fill_(
        hidden, mask_value(dtype) / 2)[None, None]


class _Blocks:
    """The call in blocks ``(B, n, H_g, c, Dp)``: queries ``[fold columns, (1), q, 0…]``, keys
    ``[fold columns, (padding column), k, 0…]``, values ``[v, 0…]``; every pass reads views of
    them."""

    def __init__(self, q, k, v, slopes, window, ahead, scale, key_padding_mask):
        B, H, T, D = q.shape
        self.size, self.passes = plan(window, T, ahead)
        self.blocks = -(-T // self.size)
        n, c = self.blocks, self.size
        self.length, self.scale, self.ahead = T, scale, ahead
        self.source, self.slopes = q, slopes.detach()
        self.positions = torch.arange(n * c, device=q.device)
        # looking ahead, a pass can read the padding past the last block
        hide = key_padding_mask is not None or (ahead and n * c != T)
        self.columns = fold.FOLD_COLUMNS + hide
        self.dim = fold.padded_head_dim(D, self.columns)
        q_cols, k_cols = fold.alibi_fold(self.fold_slopes(slopes), self.positions,
                                         self.positions)
        q_front = [q_cols.view(H, n, c, -1).transpose(0, 1)]  # (n, H, c, 4)
        k_front = [k_cols.view(n, 1, c, -1)]
        if hide:
            col = torch.full((B if key_padding_mask is not None else 1, n * c),
                             mask_value(torch.float32), device=q.device)
            col[:, :T] = 0.0
            if key_padding_mask is not None:
                col[:, :T].masked_fill_(key_padding_mask, mask_value(torch.float32))
            q_front.append(q_cols.new_ones(()).expand(n, H, c, 1))
            k_front.append(col.view(-1, n, 1, c, 1))
        self.q = self.cat(q, q_front)
        self.k = self.cat(k, k_front)
        self.v = self.cat(v, [])

    def fold_slopes(self, slopes: Tensor) -> Tensor:
        """The fold columns' slopes: ``m / scale``, negated looking ahead (``-m·(j - i)``)."""
        return (-slopes if self.ahead else slopes) / self.scale

    def cat(self, x: Tensor, front: List[Tensor]) -> Tensor:
        """``(B, H, T, D)`` -> ``(B, n, H, c, Dp)``: ``[front…, x, 0…]``, one copy."""
        B, H, T, D = x.shape
        n, c = self.blocks, self.size
        if n * c != T:
            x = F.pad(x, (0, 0, 0, n * c - T))
        shape = (B, n, H, c)
        parts = [f.to(x.dtype).expand(*shape, f.shape[-1]) for f in front]
        parts.append(x.view(B, H, n, c, D).transpose(1, 2))
        spare = self.dim - sum(f.shape[-1] for f in front) - D
        if spare:
            parts.append(x.new_zeros(()).expand(*shape, spare))
        return torch.cat(parts, dim=-1)

    def rows(self, p: _Pass) -> slice:
        """The query blocks of pass ``p`` (those with a key block ``k - offset``)."""
        return slice(max(0, p.offset), self.blocks + min(0, p.offset))

    def keys_of(self, p: _Pass) -> slice:
        return slice(max(0, -p.offset), self.blocks - max(0, p.offset))

    def pair(self, x: Tensor, p: _Pass, rows: bool) -> Tensor:
        """Pass ``p``'s blocks of ``x`` ``(B, n, ·)`` (its query blocks if ``rows``, else their
        key blocks) as ``(B·n', ·)``."""
        return x[:, self.rows(p) if rows else self.keys_of(p)].reshape(-1, *x.shape[2:])

    def mask(self, p: _Pass, dtype) -> Optional[Tensor]:
        return None if p.keep is None else _mask(self.size, p.offset, p.keep, dtype,
                                                 self.k.device)

    def unblocked(self, x: Tensor, width: Optional[int] = None) -> Tensor:
        """``(B, n, H, c, ·)`` -> ``(B, H, T, ·)`` (the first ``width`` features)."""
        B, n, H, c = x.shape[:4]
        x = x[..., :width] if width is not None else x
        return x.transpose(1, 2).reshape(B, H, n * c, *x.shape[4:])[:, :, :self.length]


def _forward(blocks: _Blocks, dtype):
    """``(out, lse)`` in block layout ``(B, n, H, c, Dp)`` / ``(B, n, H, c)``: the passes merged
    by their log-sum-exps (:func:`.fold.merge_passes`)."""
    B, n, H, c, Dp = blocks.k.shape
    lse_dtype = torch.promote_types(dtype, torch.float32)
    found = []
    for p in blocks.passes:
        o, l = fold.kernel_forward(blocks.pair(blocks.q, p, True),
                                   blocks.pair(blocks.k, p, False),
                                   blocks.pair(blocks.v, p, False), p.causal,
                                   attn_mask=blocks.mask(p, dtype), scale=blocks.scale)
        rows = blocks.rows(p)
        count = rows.stop - rows.start
        found.append((rows, o.reshape(B, count, H, c, Dp),
                      l.to(lse_dtype).reshape(B, count, H, c)))
    if len(found) == 1:
        return found[0][1].contiguous(), found[0][2]
    return fold.merge_passes(found, (B, n, H, c, Dp), lse_dtype)


class BandedFold(torch.autograd.Function):
    """:func:`banded_attention` with the fold's backward; saves ``q, k, v``, the output and the
    log-sum-exp (the blocks are rebuilt)."""

    @staticmethod
    def forward(ctx, q, k, v, slopes, window, ahead, scale, key_padding_mask):
        blocks = _Blocks(q, k, v, slopes, window, ahead, scale, key_padding_mask)
        out, lse = _forward(blocks, q.dtype)
        ctx.save_for_backward(q, k, v, slopes, key_padding_mask, out, lse)
        ctx.args = (window, ahead, scale)
        return blocks.unblocked(out, q.size(-1))

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, slopes, key_padding_mask, out, lse = ctx.saved_tensors
        window, ahead, scale = ctx.args
        blocks = _Blocks(q, k, v, slopes.detach(), window, ahead, scale, key_padding_mask)
        return _backward(blocks, blocks.cat(grad_out.to(q.dtype), []), out, lse,
                         ctx.needs_input_grad[3]) + (None,) * 4


def _backward(blocks: _Blocks, go, out, lse, slopes_grad: bool):
    """``(grad_q, grad_k, grad_v, grad_slopes)`` from the output's gradient ``go``, the output
    and the log-sum-exp in block layout (those of every key the queries read: with more keys
    than the window's, its share of their softmax's gradient)."""
    q = blocks.source
    B, n, H, c, Dp = blocks.k.shape
    D, cols, scale = q.size(-1), blocks.columns, blocks.scale
    grads = [torch.zeros(B, n, H, c, D, dtype=q.dtype, device=q.device) for _ in range(3)]
    grad_cols = torch.zeros(n, H, c, fold.FOLD_COLUMNS, device=q.device)
    for p in blocks.passes:
        gq, gk, gv = fold.kernel_backward(
            blocks.pair(go, p, True), blocks.pair(blocks.q, p, True),
            blocks.pair(blocks.k, p, False), blocks.pair(blocks.v, p, False),
            blocks.pair(out, p, True), blocks.pair(lse, p, True).contiguous(),
            p.causal, attn_mask=blocks.mask(p, q.dtype), scale=scale)
        rows, keys = blocks.rows(p), blocks.keys_of(p)
        shape = (B, rows.stop - rows.start, H, c, Dp)
        gq, gk, gv = gq.reshape(shape), gk.reshape(shape), gv.reshape(shape)
        grads[0][:, rows] += gq[..., cols:cols + D]
        grads[1][:, keys] += gk[..., cols:cols + D]
        grads[2][:, keys] += gv[..., :D]
        if slopes_grad:
            grad_cols[rows] += gq[..., :fold.FOLD_COLUMNS].float().sum(0)
    grad_m = None
    if slopes_grad:  # through the fold columns
        with torch.enable_grad():
            m = blocks.slopes.float().requires_grad_()
            q_cols, _ = fold.alibi_fold(blocks.fold_slopes(m), blocks.positions,
                                        blocks.positions)
            (grad_m,) = torch.autograd.grad(
                q_cols, m, grad_cols.transpose(0, 1).reshape(q_cols.shape))
    return tuple(blocks.unblocked(g) for g in grads) + (grad_m,)


def banded_forward(q, k, v, slopes, window, scale, key_padding_mask=None):
    """``(out, lse)`` ``(B, H_g, T, D)``, ``(B, H_g, T)``: :func:`banded_attention` looking back,
    with its rows' log-sum-exps (to merge more keys into its softmax: :func:`banded_backward`)."""
    blocks = _Blocks(q, k, v, slopes, window, False, scale, key_padding_mask)
    out, lse = _forward(blocks, q.dtype)
    return blocks.unblocked(out, q.size(-1)), blocks.unblocked(lse[..., None])[..., 0]


def banded_backward(grad_out, q, k, v, slopes, out, lse, slopes_grad, window, scale,
                    key_padding_mask=None):
    """The window's share ``(grad_q, grad_k, grad_v, grad_slopes)`` of the gradient of a softmax
    over its keys and more, from that softmax's ``out`` and ``lse`` (:func:`banded_forward`)."""
    blocks = _Blocks(q, k, v, slopes, window, False, scale, key_padding_mask)
    B, n, H, c, _ = blocks.k.shape
    lse = F.pad(lse, (0, n * c - q.size(2))).view(B, H, n, c).transpose(1, 2)
    return _backward(blocks, blocks.cat(grad_out.to(q.dtype), []), blocks.cat(out, []), lse,
                     slopes_grad)


def banded_attention(q: Tensor, k: Tensor, v: Tensor, slopes: Tensor, window: int,
                     scale: float, key_padding_mask: Optional[Tensor] = None,
                     ahead: bool = False) -> Tensor:
    """``(B, H_g, T, D)``: ALiBi attention of a head group over whole sequences (``T`` queries
    and keys) keeping the keys ``i - W <= j <= i`` with the bias ``-m·(i - j)`` (``ahead``:
    ``i <= j <= i + W``, ``-m·(j - i)``); ``slopes`` ``(H_g,)``, ``key_padding_mask``
    ``(B, T)`` True = padding. Float32 or float64, CPU (:func:`.fold.available`)."""
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.to(torch.bool)
    if ahead and window >= q.size(2) - 1:
        # looking ahead over the whole sequence: the fold's pass on the reversed sequence
        flipped = None if key_padding_mask is None else key_padding_mask.flip(-1)
        return _attention(q.flip(2), k.flip(2), v.flip(2), slopes, window, False, scale,
                          flipped).flip(2)
    return _attention(q, k, v, slopes, window, ahead, scale, key_padding_mask)


def _attention(q, k, v, slopes, window, ahead, scale, key_padding_mask):
    slopes = slopes.to(q.device, torch.float32)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, slopes)):
        return BandedFold.apply(q, k, v, slopes, window, ahead, scale, key_padding_mask)
    blocks = _Blocks(q, k, v, slopes, window, ahead, scale, key_padding_mask)
    return blocks.unblocked(_forward(blocks, q.dtype)[0], q.size(-1))
