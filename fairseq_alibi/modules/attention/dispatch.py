"""One table of attention backends, one ``auto`` policy, one validation of the name.

Every backend has the same signature, ``run(q, k, v, alibi, key_padding_mask, attn_mask,
dropout_p, scale) -> out`` for ``(B, H, T, D)`` queries and ``(B, H, S, D)`` keys/values
(queries aligned to the end of the keys, as in a KV cache), where ``alibi`` is an
:class:`AttentionBias` (a layer's view of its stack's bias, or the cross-attention's per-row
bias), and one ``unsupported(call) -> reason or None``:

=========  ===================================================================================
``fold``   the bias folded into PyTorch's fused CPU kernel, no bias tensor (:mod:`.fold`)
``sdpa``   ``scaled_dot_product_attention`` with the dense float bias (:mod:`.dense`)
``flex``   ``flex_attention`` with an ALiBi ``score_mod`` (:mod:`.flex`)
``flash``  ``flash_attn``'s ``alibi_slopes``, CUDA fp16/bf16, causal/symmetric (:mod:`.flash`)
``naive``  the explicit reference (:mod:`.dense`)
=========  ===================================================================================

``auto`` is :func:`auto_backend`; a backend chosen by name that cannot serve a call is an error
that says why and what to use. (fairseq's ``need_weights``/``before_softmax`` are served by
the attention module with the explicit computation, whatever the backend.)
"""

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional, Protocol, Tuple

import torch
from torch import Tensor

from fairseq_alibi.modules.attention import dense, flash, flex, fold


class AttentionBias(Protocol):
    """What the backends read of a bias.

    ``kind``: ``"distance"``, the ALiBi bias of a variant, ``-m_h·f(i - j)`` from the slopes
    (:class:`~fairseq_alibi.modules.bias.LayerBias`), which every backend computes its own way;
    or ``"rows"``, a dense bias of its own per batch row, ``(B, H, T, S)`` (the cross-attention
    position bias: :class:`~fairseq_alibi.modules.cross_position.RowBias`), which only the
    dense backends (``sdpa``, ``naive``) take.
    """

    kind: str
    variant: Optional[str]  # the ALiBi variant ("distance"), None for "rows"
    num_heads: int
    global_tokens: int  # the first positions exempt from the bias ("distance"), 0 for "rows"

    @property
    def scales_need_grad(self) -> bool:
        """Whether learned slope scales need their gradient now (``Call.scale_grad``)."""

    def head_slopes(self) -> Tuple[Tensor, Optional[Tensor]]:
        """``(slopes, future_slopes)``, float32 ``(H,)`` ("distance" only)."""

    def dense(self, query_len: int, key_len: int, dtype: torch.dtype) -> Tensor:
        """The bias as a tensor: ``(H, T, S)`` ("distance"), ``(B, H, T, S)`` ("rows")."""


@dataclass(frozen=True)
class Backend:
    run: Callable  # (q, k, v, alibi, key_padding_mask, attn_mask, dropout_p, scale) -> out
    unsupported: Callable  # (Call) -> None, or why this backend cannot serve it


#: the attention implementations by name (``--alibi-attention``, besides ``auto``)
REGISTRY = {
    "fold": Backend(fold.attention, fold.unsupported),
    "sdpa": Backend(dense.sdpa, dense.unsupported),
    "flex": Backend(flex.attention, flex.unsupported),
    "flash": Backend(flash.attention, flash.unsupported),
    "naive": Backend(dense.naive, dense.unsupported),
}

#: every value of ``--alibi-attention``
ATTENTION_BACKENDS = ("auto",) + tuple(REGISTRY)


def check_attention_backend(name: str) -> str:
    """Validate an ``--alibi-attention`` value; return it.

    Checkpoints written before ``fold`` was a backend of its own saved ``sdpa`` for "fold where
    measured faster, dense float mask otherwise". They load as today's ``sdpa`` (the dense float
    mask): both compute the same function (tests/attention/test_dispatch.py checks the outputs of
    such a checkpoint), and a checkpoint holds no version that could tell an old ``sdpa`` from a
    new, deliberate one, so rewriting it to ``auto`` would silently override the new choice. The
    speed and memory of the fold at long lengths are one load-time override away:
    ``--model-overrides "{'alibi_attention': 'auto'}"``.
    """
    if name not in ATTENTION_BACKENDS:
        raise ValueError(
            f"unknown ALiBi attention backend {name!r} (--alibi-attention); choose one of: "
            f"{', '.join(ATTENTION_BACKENDS)}"
        )
    return name


class Call(NamedTuple):
    """What one attention call asks of a backend: what limits the backends and guides ``auto``.

    (A named tuple: built once per layer call, which a decoding step makes many of.)
    """

    device: str  # "cpu", "cuda", ...
    dtype: torch.dtype
    variant: str
    query_len: int
    key_len: int  # > query_len: a KV cache (incremental decoding)
    batch: int = 1
    heads: int = 1
    padded: bool = False  # a key_padding_mask is given
    attn_mask: bool = False  # an extra (T, S) attn_mask is given
    dropout_p: float = 0.0
    grad: bool = False  # autograd will need its backward
    scale_grad: bool = False  # learned slope scales (--alibi-learned-scales) need their gradient
    kind: str = "distance"  # the bias's AttentionBias.kind
    global_tokens: int = 0  # AttentionBias.global_tokens


#: from this many keys on, causal and one_sided attention is faster folded than with the dense
#: mask on the CPU (the fused kernel only skips masked blocks of long sequences); the
#: bidirectional variants, folded as two merged passes, were slower than the mask at every
#: length measured (docs/benchmarks.md, "Attention forward")
FOLD_MIN_LENGTH = 640

#: on CUDA, from this many keys on, causal attention over whole sequences in fp16/bf16 is faster
#: with compiled ``flex`` than with ``sdpa``'s dense float bias (H100, bf16, forward+backward:
#: flex ÷ sdpa 1.19-1.31 at D=64 and 1.24-1.38 at D=128 for 4096-8192 keys, 1.01-1.08 / 0.70 at
#: 1024-2048; fairseq training of a 6-layer LM at 8192 tokens: 1.17× stock vs sdpa's 0.99×):
#: docs/benchmarks.md, "GPU (H100)". Bidirectional variants were measured at 1024 keys only
#: (flex slower there): they stay on sdpa
FLEX_MIN_LENGTH = 4096

#: the most memory ``sdpa``'s dense float bias may take (one per batch, shared by the layers,
#: key padding or not): beyond it ``auto`` folds every variant
DENSE_MASK_BUDGET = 64 * 2**20


def auto_backend(call: Call) -> str:
    """``auto``'s choice: the fastest backend measured that can serve ``call``.

    1. CUDA: ``flash`` where flash_attn is installed and serves the call (not measured: no
       flash_attn wheel for torch 2.11 + CUDA 13; it is the fused kernel that needs no bias
       tensor); compiled ``flex`` for ``causal`` training and scoring of whole sequences in
       fp16/bf16 from :data:`FLEX_MIN_LENGTH` keys on (no padding, dropout, extra mask or
       learned-scale gradient: what was measured) where triton can compile it.
    2. ``fold`` where it serves (CPU, float32/64, no KV cache, no dropout, no extra attn_mask)
       and either the variant is ``causal``/``one_sided`` with :data:`FOLD_MIN_LENGTH` keys or
       more, or the dense mask would exceed :data:`DENSE_MASK_BUDGET`, or learned slope scales
       need their gradient (a dense mask that needs a gradient makes ``sdpa`` keep a
       ``(B, H, T, S)`` tensor per layer: docs/learned_scales.md).
    3. ``sdpa`` otherwise (it serves every call: decoding steps, dropout, half precision, ...).

    On the CPU ``flex`` is never chosen: it was slower than these in every case measured but
    one_sided inference (up to 10 %), has no CPU backward and compiles per shape.
    """
    if call.device == "cuda":
        if flash.unsupported(call) is None:
            return "flash"
        if (call.variant == "causal" and call.query_len == call.key_len >= FLEX_MIN_LENGTH
                and call.dtype in (torch.float16, torch.bfloat16) and not call.padded
                and not call.attn_mask and not call.scale_grad
                and flex.unsupported(call) is None and flex.compilable()):
            return "flex"
    if fold.unsupported(call) is None:
        # one (H, T, S) bias for the batch, padded or not (sdpa: dense.padding_column)
        mask_bytes = call.heads * call.query_len * call.key_len * call.dtype.itemsize
        if mask_bytes > DENSE_MASK_BUDGET or call.scale_grad:
            return "fold"
        if call.variant not in fold.MERGED_VARIANTS and call.key_len >= FOLD_MIN_LENGTH:
            return "fold"
    return "sdpa"


def resolve(name: str, call: Call) -> str:
    """The backend to run: ``name`` itself, or ``auto``'s choice for ``call``."""
    if name == "auto":
        return auto_backend(call)
    reason = REGISTRY[check_attention_backend(name)].unsupported(call)
    if reason is not None:
        raise ValueError(
            f"--alibi-attention {name} cannot serve this call: {reason}. Use "
            "--alibi-attention auto (or another backend), e.g. at load time with "
            "--model-overrides \"{'alibi_attention': 'auto'}\""
        )
    return name


def attend(name, q, k, v, alibi, key_padding_mask=None, attn_mask=None, dropout_p=0.0,
           scale=None):
    """ALiBi attention of ``(B, H, T, D)`` tensors with backend ``name`` (or ``auto``);
    ``alibi`` an :class:`AttentionBias`."""
    B, H, T, D = q.shape
    scale = D**-0.5 if scale is None else scale
    call = Call(
        q.device.type, q.dtype, alibi.variant, T, k.size(2), B, H,
        padded=key_padding_mask is not None, attn_mask=attn_mask is not None,
        dropout_p=dropout_p,
        grad=torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad),
        scale_grad=alibi.scales_need_grad, kind=alibi.kind, global_tokens=alibi.global_tokens,
    )
    return REGISTRY[resolve(name, call)].run(q, k, v, alibi, key_padding_mask, attn_mask,
                                             dropout_p, scale)
