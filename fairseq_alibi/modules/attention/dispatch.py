"""One table of attention backends, one ``auto`` policy, one validation of the name, one refusal.

Every backend has the same signature, ``run(q, k, v, bias, key_padding_mask, attn_mask,
dropout_p, scale) -> out`` for ``(B, H, T, D)`` queries and ``(B, H, S, D)`` keys/values
(queries aligned to the end of the keys, as in a KV cache), where ``bias`` is one call's
:class:`CallBias`, and declares once, beside it, the calls it serves (``CAPABILITIES``, a
:class:`~.capabilities.Capabilities`):

============  ================================================================================
``fold``      the bias folded into PyTorch's fused CPU kernel, no bias tensor (:mod:`.fold`)
``sdpa``      ``scaled_dot_product_attention`` with the dense float bias (:mod:`.dense`)
``flex``      ``flex_attention`` with an ALiBi ``score_mod`` (:mod:`.flex`)
``flash``     ``flash_attn``'s ``alibi_slopes``, CUDA fp16/bf16, causal/symmetric (:mod:`.flash`)
``naive``     the explicit reference (:mod:`.dense`)
``windowed``  slope windows on the CPU: only the keys in each head's window (:mod:`.windowed`)
============  ================================================================================

Document masks (``--alibi-document-mask``): a whole sequence is split into its documents, each
attended as its own sequence by the backend (:mod:`.documents`, :func:`splits_documents`);
``sdpa``, ``naive`` and ``flex`` can also mask them in the call itself.

``auto`` is :func:`auto_backend`; a backend chosen by name that cannot serve a call is the one
error of :func:`resolve`, which says why and which backends can. (fairseq's ``need_weights``/
``before_softmax`` are served by the attention module with the explicit computation, whatever
the backend.)

What an attention module holds is an :class:`AttentionBias`; for each call it asks it for that
call's :class:`CallBias` (:meth:`AttentionBias.for_call`) and never looks behind either.
"""

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional, Protocol, Tuple

import torch
from torch import Tensor

from fairseq_alibi.alibi import ONE_WAY_VARIANTS, sinks_to_end
from fairseq_alibi.error_hints import OneLineError
from fairseq_alibi.modules.attention import (dense, documents, flash, flex, fold, tuning,
                                             windowed)
from fairseq_alibi.modules.attention.capabilities import Capabilities


class CallBias(Protocol):
    """One attention call's bias: what the dispatch and the backends read.

    ``kind`` says which backends may read it (``Capabilities.kinds``): ``"distance"``, the
    ALiBi bias of a variant, ``-m_h·f(i - j)`` from the slopes, which every backend computes its
    own way (a :class:`DistanceBias`: :class:`~fairseq_alibi.modules.bias.LayerBias`); or
    ``"rows"``, a dense bias of its own per batch row, ``(B, H, T, S)``, which only the dense
    backends (``sdpa``, ``naive``) take (the cross-attention's
    :class:`~fairseq_alibi.modules.cross_position.RowBias`, ``--alibi-length-scale``'s
    :class:`~fairseq_alibi.modules.bias.LengthScaledBias`).
    """

    kind: str
    variant: Optional[str]  # the ALiBi variant; None: a "rows" bias of no variant
    num_heads: int
    global_tokens: int  # the first positions exempt from the bias (0: none)
    windowed: bool  # slope windows (--alibi-window-cutoff): keys beyond them are dropped
    # optional (absent: 0): attention sinks (--alibi-window-sinks), the first keys kept beyond
    # the windows; a KV cache's positions dropped after its sinks (0: keys at 0 … S-1)
    sinks: int
    dropped: int
    # optional (absent: False): a dense bias of this layer's own (learned scales with a row
    # per layer), built per layer call where the layers of a pass otherwise share one
    per_layer: bool
    # --alibi-document-mask: ``ids`` (B, S) per key, ``crossing``, ``layout()`` (the split's
    # .documents.Layout, once per forward pass); None without (modules/bias.py's Documents)
    documents: Optional[object]

    @property
    def scales_need_grad(self) -> bool:
        """Whether learned slope scales need their gradient now (``Call.scale_grad``)."""

    def dense(self, query_len: int, key_len: int, dtype: torch.dtype) -> Tensor:
        """The bias as a tensor: ``(H, T, S)`` ("distance"), ``(B, H, T, S)`` ("rows")."""


class DistanceBias(CallBias, Protocol):
    """A :class:`CallBias` of kind ``"distance"``: also its slopes, which ``fold``, ``flex`` and
    ``flash`` read instead of the dense tensor."""

    def head_slopes(self) -> Tuple[Tensor, Optional[Tensor]]:
        """``(slopes, future_slopes)``, float32 ``(H,)`` (``future_slopes``: ``asymmetric``)."""

    def windows(self):
        """``(back, ahead)`` per head (:func:`~fairseq_alibi.alibi.variant_windows` of the
        detached slopes, ``None`` = unbounded), or ``None`` when the call has no windows."""


class CachedDocuments(NamedTuple):
    """The documents of a KV cache's keys (``--alibi-document-mask``), as the attention module
    keeps them beside the keys (trimmed and reordered with them) and hands them to
    :meth:`AttentionBias.for_call`: ``ids`` ``(B, S)``, ``last_eos`` ``(B, 1)`` (whether the
    last cached position holds ``</s>``) and, with attention sinks, ``offsets`` ``(B, S)``."""

    ids: Tensor
    last_eos: Tensor
    offsets: Optional[Tensor] = None


class AttentionBias(Protocol):
    """What an attention module holds: the source of each call's :class:`CallBias`.

    :meth:`for_call` is everything a layer's attention asks of its bias for one call (the
    dense rows, the head slopes, slopes per sequence from ``key_padding_mask``, and whatever a
    future option makes depend on the call): the module hands the answer to the dispatch and
    never looks behind it. A bias that is the same for every call answers itself.
    """

    num_heads: int
    variant: Optional[str]

    def for_call(self, key_padding_mask: Optional[Tensor], batch: int, query_len: int,
                 key_len: int, incremental: bool) -> CallBias:
        """This call's bias: ``key_padding_mask`` ``(B, S)`` or ``None``; ``incremental``: a
        decoding step with a KV cache (``query_len < key_len`` then). A bias with a document
        mask or attention sinks also takes the cache's ``cached_documents``
        (:class:`CachedDocuments`) and ``dropped`` (positions dropped after its sinks)."""


@dataclass(frozen=True)
class Backend:
    """One row of the table: the function and what it serves."""

    name: str
    run: Callable  # (q, k, v, bias, key_padding_mask, attn_mask, dropout_p, scale) -> out
    capabilities: Capabilities

    def unsupported(self, call: "Call") -> Optional[str]:
        """``None`` if this backend serves ``call``, else why not."""
        return self.capabilities.refusal(self.name, call)


#: the attention implementations by name (``--alibi-attention``, besides ``auto``)
REGISTRY = {backend.name: backend for backend in (
    Backend("fold", fold.attention, fold.CAPABILITIES),
    Backend("sdpa", dense.sdpa, dense.CAPABILITIES),
    Backend("flex", flex.attention, flex.CAPABILITIES),
    Backend("flash", flash.attention, flash.CAPABILITIES),
    Backend("naive", dense.naive, dense.CAPABILITIES),
    Backend("windowed", windowed.run, windowed.CAPABILITIES),
)}


def unsupported(name: str, call: "Call") -> Optional[str]:
    """``None`` if backend ``name`` serves ``call``, else why not (its declared capabilities)."""
    return REGISTRY[name].unsupported(call)


def serves(name: str, call: "Call") -> bool:
    """Whether backend ``name`` serves ``call`` (:func:`unsupported` without the text)."""
    return REGISTRY[name].capabilities.limit(call) is None


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
    kind: str = "distance"  # the bias's CallBias.kind
    global_tokens: int = 0  # CallBias.global_tokens
    windowed: bool = False  # CallBias.windowed: slope windows
    windows: Optional[tuple] = None  # DistanceBias.windows(): (back, ahead) per head, or None
    sinks: int = 0  # CallBias.sinks, with windows
    sink_cache: bool = False  # CallBias.dropped: a KV cache that dropped keys after its sinks
    documents: bool = False  # CallBias.documents cross: keys of other documents are masked
    head_dim: int = 64  # D, the size of a head's queries and keys
    per_layer: bool = False  # CallBias.per_layer: a dense bias is built per layer call


# The variants whose windows look one way (alibi.ONE_WAY_VARIANTS): ``windowed`` runs each of
# their head groups as the fold (a window that drops no key) or as chunks, never slower than
# ``sdpa`` or the fold over every key from tuning.ONE_WAY_WINDOWED_MIN_LENGTH keys on, so
# ``auto`` takes it there (below, ``sdpa``'s memoised windowed bias, which costs what its dense
# one does): docs/benchmarks.md, "auto's choice with windows"


def windowed_keys(windows, variant: str, length: int, itemsize: int = 4,
                  global_tokens: int = 0, sinks: int = 0) -> Tuple[float, float, float]:
    """The keys :func:`.windowed.attention`'s plan for a whole sequence of ``S = length`` keys
    reads (:func:`.windowed.plan`, on the CPU in ``itemsize`` bytes an element), per query and
    head (÷ ``H·S``), by kind of group: ``(one-way, two-way, whole)``. One-way: ``fold`` and
    the ``chunks`` of a window on one side; two-way: chunks that hide keys at both ends; whole:
    one chunk of every query with its ``(T, S)`` bias. A group's keys are
    :meth:`.windowed.Group.keys` times its heads; attention sinks ``sinks`` count as keys every
    query reads."""
    S, found = length, [0.0, 0.0, 0.0]
    for group in windowed.plan(windows, variant, S, S, global_tokens, itemsize, sinks=sinks):
        kind = (2 if group.kind == "whole" else
                1 if group.kind == "chunks" and group.back and group.ahead else 0)
        found[kind] += group.keys(variant, S) * len(group.heads)
    per_query = len(windows[0]) * S
    return found[0] / per_query, found[1] / per_query, found[2] / per_query


def windowed_cost(windows, variant: str, length: int, itemsize: int = 4,
                  global_tokens: int = 0, sinks: int = 0) -> float:
    """The predicted time of :func:`.windowed.attention` ÷ ``sdpa``'s dense windowed bias for a
    whole sequence of ``S = length`` keys, ``H`` heads with ``windows`` ``(back, ahead)``
    (``None`` = unbounded): the price of the call's own plan, from the keys it reads
    (:func:`windowed_keys`: ``k₁, k₂, k₃`` one-way, two-way, whole, per query and head):

        α₁ · k₁ + α₂ · k₂ + α₃ · k₃ + β · 1000 / S

    ``β/S``: the chunks' fixed costs. ``auto`` consults it for the calls it does not send to
    ``windowed`` by length (:data:`~fairseq_alibi.alibi.ONE_WAY_VARIANTS`): the bidirectional
    variants, and global tokens. Constants :data:`.tuning.WINDOWED_COST` (re-fitted from
    timings by ``python -m benchmarks.windows --fit``)."""
    *per_key, fixed = tuning.WINDOWED_COST
    keys = windowed_keys(windows, variant, length, itemsize, global_tokens, sinks)
    return sum(a * k for a, k in zip(per_key, keys)) + fixed * 1000 / length


def step_skipped_keys(call: Call) -> int:
    """The keys a call of a few queries against a KV cache skips over the batch when each head
    group reads only its window (:func:`.windowed.few_queries`: from its first query's reach
    ``S - T - back`` on, and the cache's sinks before it); 0 for a call that does not say its
    windows."""
    if call.windows is None:
        return 0
    first, skipped = call.key_len - call.query_len, 0
    for back in call.windows[0]:
        lo = 0 if back is None else first - min(back, first)
        skipped += lo - min(call.sinks, lo)
    return call.batch * skipped


def _dense_mask_bytes(call: Call) -> int:
    """The bytes of ``sdpa``'s one ``(H, T, S)`` bias for the batch, padded or not
    (:func:`.dense.padding_column`)."""
    return call.heads * call.query_len * call.key_len * call.dtype.itemsize


def _flex_min_length(call: Call) -> Optional[int]:
    """From how many keys ``auto`` runs compiled ``flex`` (the lengths measured faster):
    ``causal`` with document masks :data:`.tuning.FLEX_DOCUMENTS_MIN_LENGTH`, with slope
    windows :data:`.tuning.FLEX_MASKS_MIN_LENGTH`, with neither
    :data:`.tuning.FLEX_MIN_LENGTH`; the other variants with windows or documents
    :data:`.tuning.FLEX_MASKS_OTHERS_MIN_LENGTH`, and without them never (``None``)."""
    if call.variant == "causal":
        return (tuning.FLEX_DOCUMENTS_MIN_LENGTH if call.documents
                else tuning.FLEX_MASKS_MIN_LENGTH if call.windowed else tuning.FLEX_MIN_LENGTH)
    return tuning.FLEX_MASKS_OTHERS_MIN_LENGTH if call.windowed or call.documents else None


def _compiled_flex(call: Call) -> bool:
    """Whether ``auto`` runs ``call`` on compiled ``flex``: on CUDA, a whole sequence in
    fp16/bf16 from :func:`_flex_min_length` keys on, without padding, an extra mask or a
    learned-scale gradient (what was measured), where triton can compile it; its document
    masks, if any, are then masked in its block plan rather than split."""
    least = _flex_min_length(call)
    return (least is not None and call.device == "cuda"
            and call.query_len == call.key_len >= least
            and call.dtype in (torch.float16, torch.bfloat16) and not call.padded
            and not call.attn_mask and not call.scale_grad and serves("flex", call)
            and flex.compilable())


def _windowed_choice(call: Call) -> str:
    """``auto``'s backend for a call with slope windows (:func:`auto_backend`)."""
    if call.query_len == call.key_len:  # a whole sequence
        if call.windows is None:  # a call that does not say its windows
            return "sdpa"
        if (call.variant in ONE_WAY_VARIANTS and not call.global_tokens
                and call.key_len >= tuning.ONE_WAY_WINDOWED_MIN_LENGTH
                and serves("windowed", call)):
            return "windowed"
        # beyond the dense mask's budget, as without windows: no (H, T, S) bias
        if _dense_mask_bytes(call) > tuning.DENSE_MASK_BUDGET and serves("windowed", call):
            return "windowed"
        if (call.key_len >= tuning.WINDOWED_MIN_LENGTH
                and windowed_cost(call.windows, call.variant, call.key_len,
                                  call.dtype.itemsize, call.global_tokens, call.sinks)
                <= tuning.WINDOWED_MAX_COST
                and serves("windowed", call)):
            return "windowed"
        return "sdpa"
    # a decoding step (fewer queries than keys, a KV cache): each head group reads only its
    # window (.windowed.few_queries) once the keys that skips are worth its per-group calls
    if (call.query_len <= tuning.FEW_QUERIES
            and step_skipped_keys(call) * call.head_dim**0.5 >= tuning.WINDOWED_STEP_MIN_SKIPPED
            and not call.global_tokens and serves("windowed", call)):
        return "windowed"
    return "sdpa"


def auto_backend(call: Call) -> str:
    """``auto``'s choice: the fastest backend measured that can serve ``call``.

    1. CUDA: ``flash`` where flash_attn is installed and serves the call (not measured: no
       flash_attn wheel for torch 2.11 + CUDA 13; it is the fused kernel that needs no bias
       tensor); compiled ``flex`` (:func:`_compiled_flex`) for training and scoring of whole
       sequences in fp16/bf16 (no padding, dropout, extra mask or learned-scale gradient: what
       was measured) where triton can compile it: ``causal`` from
       :data:`.tuning.FLEX_MIN_LENGTH` keys on, and with slope windows or document masks,
       any variant, from 1,024-4,096 keys on (:func:`_flex_min_length`: its block plan skips
       the blocks they hide; the documents are masked there, not split).
    2. ``fold`` where it serves (CPU, float32/64, no KV cache, no dropout, no extra attn_mask)
       and either the variant is ``causal``/``one_sided`` with :data:`.tuning.FOLD_MIN_LENGTH`
       keys or more, or the layer has a bias of its own (``call.per_layer``: ``sdpa`` would
       build its dense mask per layer call) and :data:`.tuning.FOLD_PER_LAYER_MIN_LENGTH` keys
       (:data:`.tuning.FOLD_PER_LAYER_MERGED_MIN_LENGTH` for the bidirectional variants), or
       the dense mask would exceed
       :data:`.tuning.DENSE_MASK_BUDGET`, or learned slope scales need their gradient (a
       dense mask that needs a gradient makes ``sdpa`` keep a ``(B, H, T, S)`` tensor per
       layer: docs/learned_scales.md).
    3. ``sdpa`` otherwise (it serves every call: decoding steps, dropout, half precision, ...).

    With slope windows (``call.windowed``): ``windowed`` for a whole sequence of a one-way
    variant (:data:`~fairseq_alibi.alibi.ONE_WAY_VARIANTS`, no global tokens) from
    :data:`.tuning.ONE_WAY_WINDOWED_MIN_LENGTH` keys on, and of the others from
    :data:`.tuning.WINDOWED_MIN_LENGTH` keys on where
    :func:`windowed_cost` (the call's windows, ``call.windows``) is at most
    :data:`.tuning.WINDOWED_MAX_COST` or the dense mask would exceed
    :data:`.tuning.DENSE_MASK_BUDGET`, where it serves
    (CPU, float32/64, no dropout, no extra mask), else ``sdpa`` with the dense windowed bias
    (``fold`` and ``flash`` refuse windows; ``flex``, with its per-head block mask, as in 1.
    only). Decoding steps (at most :data:`.tuning.FEW_QUERIES` queries
    against a KV cache, no global tokens): ``windowed`` where the keys its windows skip over
    the batch (:func:`step_skipped_keys`) times ``√D`` reach
    :data:`.tuning.WINDOWED_STEP_MIN_SKIPPED`, else ``sdpa``.

    On the CPU ``flex`` is never chosen: it was slower than these in every case measured but
    one_sided inference (docs/benchmarks.md), has no CPU backward and compiles per shape.
    """
    if call.device == "cuda" and serves("flash", call):  # it refuses windows and documents
        return "flash"
    if _compiled_flex(call):
        return "flex"
    if call.windowed:
        return _windowed_choice(call)
    if serves("fold", call):
        if _dense_mask_bytes(call) > tuning.DENSE_MASK_BUDGET or call.scale_grad:
            return "fold"
        merged = call.variant in fold.MERGED_VARIANTS
        if not merged and call.key_len >= tuning.FOLD_MIN_LENGTH:
            return "fold"
        if call.per_layer and call.key_len >= (tuning.FOLD_PER_LAYER_MERGED_MIN_LENGTH if merged
                                               else tuning.FOLD_PER_LAYER_MIN_LENGTH):
            return "fold"
    return "sdpa"


def _refusal(name: str, what: str, reason: str, call: Call,
             at_load: bool = True) -> OneLineError:
    """The one refusal of a named backend: why, and the backends that serve ``call``; a
    :class:`OneLineError` (a ``ValueError``), so that a command ends in its line alone, not in
    the traceback of the call that met it. ``at_load``: the fix can be a load-time override
    (not for a training run)."""
    serving = [other for other in REGISTRY if serves(other, call)]
    where = ("" if not at_load else
             ", e.g. at load time with --model-overrides \"{'alibi_attention': 'auto'}\" (the "
             "hub: from_pretrained(..., alibi_attention='auto'))")
    return OneLineError(
        f"--alibi-attention {name} cannot serve {what}: {reason}. Use --alibi-attention auto "
        f"(or {' or '.join(serving)}){where}")


def resolve(name: str, call: Call) -> str:
    """The backend to run: ``name`` itself, or ``auto``'s choice for ``call``; the one refusal
    of a named backend that cannot serve ``call`` (its reason, and the backends that can)."""
    if name == "auto":
        return auto_backend(call)
    reason = unsupported(check_attention_backend(name), call)
    if reason is not None:
        raise _refusal(name, "this call", reason, call)
    return name


#: the limits a stack's options alone meet, whatever the call (:func:`check_options`)
_OPTION_LIMITS = ("windows", "sinks", "global_tokens", "variants")


def check_options(name: str, variant: str, windowed: bool, sinks: int, global_tokens: int):
    """The refusal of a backend named by ``--alibi-attention`` that a stack's options (its
    variant, slope windows, sinks, global tokens) keep from serving any of its calls, when the
    model is built (a load-time override too) rather than at its first call; what depends on
    the call (device, dtype, a KV cache, ...) is judged per call (:func:`resolve`)."""
    if name == "auto":
        return
    capabilities = REGISTRY[check_attention_backend(name)].capabilities
    call = Call((capabilities.devices or ("cpu",))[0],
                (capabilities.dtypes or (torch.float32,))[0], variant, 1, 1,
                global_tokens=global_tokens, windowed=windowed, sinks=sinks if windowed else 0)
    if capabilities.limit(call) in _OPTION_LIMITS:
        raise _refusal(name, "this model", capabilities.refusal(name, call), call)


#: the limits every training step of a layer meets, whatever its batch (:func:`check_training`;
#: with the device, where it is final)
_TRAINING_LIMITS = ("dropout", "scale_grad")
_DEVICE_LIMITS = ("devices", "no_backward_on")


def check_training(name: str, bias: CallBias, dropout_p: float, device: Optional[str] = None):
    """The refusal of a backend named by ``--alibi-attention`` that cannot train a layer (its
    attention dropout ``dropout_p``, the learned scales' gradient; on ``device``, given where
    the layer cannot move to another: a CPU with no CUDA), asked when the layer is put in
    training mode: fairseq's trainer does that before each step, outside the step's own
    failure handling, which would first write a ``crash.pt`` of the whole model. A device that
    may still change (a model is often put in training mode before it is moved) and what
    depends on the batch are judged per call (:func:`resolve`)."""
    if name == "auto":
        return
    capabilities = REGISTRY[check_attention_backend(name)].capabilities
    limits = _TRAINING_LIMITS + (_DEVICE_LIMITS if device is not None else ())
    device = device or (capabilities.devices or ("cpu",))[0]
    dtype = (capabilities.dtypes or (torch.float32,))[0]
    call = Call(device, dtype, bias.variant, 1, 1, dropout_p=dropout_p, grad=True,
                scale_grad=bias.scales_need_grad, global_tokens=bias.global_tokens,
                windowed=bias.windowed, sinks=bias.sinks if bias.windowed else 0)
    if capabilities.limit(call) in limits:
        raise _refusal(name, "training this model", capabilities.refusal(name, call), call,
                       at_load=False)


#: the backends that read a KV cache's attention sinks apart from its rolling window, two key
#: parts (:func:`attend_sinks_apart`); the others read them joined, which copies the cache
SINKS_APART = {"sdpa": dense.sinks_apart, "windowed": windowed.sinks_apart}
#: the same backends for a cache that holds its window with its sinks after it in one buffer
#: (without gradients): each reads views of the cache, ``(q, k, v, alibi, padding, scale,
#: held)`` with the bias and padding in that order
SINKS_LAST = {"sdpa": dense.sinks_last, "windowed": windowed.sinks_last}
#: the backends that, before a cache drops keys (its sinks its first keys), would join the
#: sinks to each head group's window as a copy (:func:`.windowed.few_queries`); ``sdpa``
#: reads the cache as it is
SINKS_LAST_BEFORE_DROPPING = ("windowed",)


def attend_sinks_apart(name, q, sinks, k, v, alibi, key_padding_mask, scale,
                       sinks_last=None) -> Optional[Tensor]:
    """The attention of a call against a KV cache that keeps its attention sinks apart
    (``sinks``: ``(sink_k, sink_v)``; ``k``, ``v``: its window), no dropout or extra mask,
    where the backend ``name`` (or ``auto``'s choice for the joined keys) reads the two parts
    as they are (:data:`SINKS_APART`); ``None`` where it reads them joined. ``sinks_last()``:
    the keys and values of the window with the sinks after it in one buffer, where the cache
    can hold them so (else ``None``; ``alibi``: a ``SinkCacheBias``), read as they are
    (:data:`SINKS_LAST`), with the bias and padding in that order
    (:func:`~fairseq_alibi.alibi.sinks_to_end`)."""
    if name != "auto" and name not in SINKS_APART:
        return None
    held = sinks[0].size(2)
    call = call_of(q, k, v, alibi, key_padding_mask, key_len=held + k.size(2))
    chosen = resolve(name, call)
    joined = sinks_last() if sinks_last is not None and chosen in SINKS_LAST else None
    if joined is not None:
        return _sinks_last(chosen, q, joined, alibi, key_padding_mask, scale, held)
    run = SINKS_APART.get(chosen)
    return None if run is None else run(q, sinks, k, v, alibi, key_padding_mask, scale)


def attend_sinks_first(name, q, k, v, alibi, key_padding_mask, scale,
                       sinks_last: Callable) -> Tensor:
    """:func:`attend` of a call against a KV cache that has not dropped a key yet, its first
    ``alibi.sinks`` keys its attention sinks, no dropout, extra mask or documents: where the
    backend (or ``auto``'s choice) would join the sinks to each head group's window as a copy
    (:data:`SINKS_LAST_BEFORE_DROPPING`), the cache's keys and values read from
    ``sinks_last()`` instead, the window with the sinks after it in one buffer, the bias and
    padding in that order, for a few queries (at most :data:`.tuning.FEW_QUERIES`, as
    :func:`.windowed.run` takes them); elsewhere the cache as it is."""
    chosen = resolve(name, call_of(q, k, v, alibi, key_padding_mask))
    few = chosen in SINKS_LAST_BEFORE_DROPPING and q.size(2) <= tuning.FEW_QUERIES
    joined = sinks_last() if few else None
    if joined is not None:
        return _sinks_last(chosen, q, joined, alibi, key_padding_mask, scale, alibi.sinks)
    return REGISTRY[chosen].run(q, k, v, alibi, key_padding_mask, None, 0.0, scale)


def _sinks_last(chosen, q, joined, alibi, key_padding_mask, scale, held):
    """:data:`SINKS_LAST`'s ``chosen`` on ``joined`` (the window's keys and values, then the
    ``held`` sinks'), the bias and padding in that order."""
    padding = None if key_padding_mask is None else sinks_to_end(key_padding_mask, held)
    return SINKS_LAST[chosen](q, *joined, alibi.with_sinks_last(), padding, scale, held)


def splits_documents(name: str, call: Call) -> bool:
    """Whether a call with document masks (``call.documents``) is split into its documents,
    each attended as its own sequence by ``name`` (:mod:`.documents`), rather than run as
    it is: every whole sequence without an extra mask, but where a backend named by the user
    masks the documents itself (``sdpa``, ``naive``, ``flex``: their own mask is what they were
    named for), or where ``auto`` takes ``flex`` (:func:`_compiled_flex`: it skips the other
    documents' blocks itself). Split, the keys of other documents are never read, whatever the
    backend; a call against a KV cache goes to a backend that masks them (``auto``:
    ``sdpa``)."""
    if not call.documents or call.query_len != call.key_len or call.attn_mask:
        return False
    if name == "auto":
        return not _compiled_flex(call)
    return not REGISTRY[name].capabilities.documents


def attend(name, q, k, v, alibi, key_padding_mask=None, attn_mask=None, dropout_p=0.0,
           scale=None):
    """ALiBi attention of ``(B, H, T, D)`` tensors with backend ``name`` (or ``auto``);
    ``alibi`` this call's :class:`CallBias` (:meth:`AttentionBias.for_call`)."""
    scale = q.size(-1)**-0.5 if scale is None else scale
    found = getattr(alibi, "documents", None)
    if found is not None and not found.crossing:  # one document a row: the plain call
        alibi = alibi.base
    call = call_of(q, k, v, alibi, key_padding_mask, attn_mask, dropout_p)
    if splits_documents(check_attention_backend(name), call):
        return documents.attention(
            lambda *part: attend(name, *part, None, dropout_p, scale), q, k, v, alibi.base,
            alibi.documents.layout(), key_padding_mask)
    return REGISTRY[resolve(name, call)].run(q, k, v, alibi, key_padding_mask, attn_mask,
                                             dropout_p, scale)


def call_of(q, k, v, alibi, key_padding_mask=None, attn_mask=None, dropout_p=0.0,
            key_len: Optional[int] = None) -> Call:
    """The :class:`Call` of attending ``(B, H, T, D)`` queries to ``(B, H, S, D)`` keys with
    ``alibi`` (a :class:`CallBias`): what :func:`attend` judges (and a benchmark reports);
    ``key_len``: ``S``, where ``k`` holds only some of the keys."""
    B, H, T, _ = q.shape
    windowed = alibi.windowed
    return Call(
        q.device.type, q.dtype, alibi.variant, T, k.size(2) if key_len is None else key_len, B, H,
        padded=key_padding_mask is not None, attn_mask=attn_mask is not None,
        dropout_p=dropout_p,
        grad=torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad),
        scale_grad=alibi.scales_need_grad, kind=alibi.kind, global_tokens=alibi.global_tokens,
        windowed=windowed,
        windows=alibi.windows() if windowed and alibi.kind == "distance" else None,
        sinks=getattr(alibi, "sinks", 0) if windowed else 0,
        sink_cache=bool(getattr(alibi, "dropped", 0)),
        documents=getattr(alibi, "documents", None) is not None, head_dim=q.size(-1),
        per_layer=getattr(alibi, "per_layer", False),
    )
