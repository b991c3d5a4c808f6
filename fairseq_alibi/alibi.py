"""The ALiBi math, in one place (Press, Smith & Lewis, "Train Short, Test Long", ICLR 2022).

Every attention logit gets a bias linear in the distance between query ``i`` and key ``j``, with
one fixed slope ``m_h`` per head ``h``: ``softmax(q_i · k_j / sqrt(d) + bias_h(i, j))``.

==============  ==========================================  ===========================================
variant         past keys (j <= i)                          future keys (j > i)
==============  ==========================================  ===========================================
``causal``      ``-m·(i-j)``                                masked (decoder / causal LM)
``symmetric``   ``-m·(i-j)``                                ``-m·(j-i)``
``one_sided``   heads ``h < H/2``: ``-m·(i-j)``             heads ``h < H/2``: masked
                heads ``h >= H/2``: masked (``j < i``)      heads ``h >= H/2``: ``-m·(j-i)``
``offset``      ``-m·(i-j)``                                ``-m·(j-i-0.5)``
``asymmetric``  ``-m·(i-j)``                                ``-m_f·(j-i)``, ``m_f = ratio·m`` per head
==============  ==========================================  ===========================================

The bias is computed from ``i - j``, never as ``m·j`` (the "row trick" loses all precision in
fp16/bf16 at long lengths). Queries are aligned to the *end* of the keys (a KV cache: query ``t``
of ``q`` sits at ``i = k - q + t``). Masked keys hold a *finite* negative (:func:`mask_value`):
an all-padding row gives a uniform softmax, not NaN.

Slope scales (data2vec 2.0's ``learned_alibi_scale``; :data:`SCALE_MODES`): layer ``l`` may
use the slopes ``s[l, h]·m_h`` (``s[l, h]·m_f,h`` for ``asymmetric``'s look-ahead keys), i.e.
``bias_{l,h}(i, j) = s[l, h] · bias_h(i, j)``, masked keys staying masked. The run-time
``slope_scale`` (slope interpolation) multiplies on top: ``slope_scale · s[l, h] · m_h``.

Partial heads (x-transformers' ``alibi_num_heads``, data2vec 2.0's ``num_alibi_heads``;
``--alibi-heads K``): only heads ``h < K`` carry the bias, with Press's slopes of ``K`` heads;
``m_h = 0`` for the others (no distance bias; a variant's masks still apply).

Global tokens (``--alibi-global-tokens N``, data2vec 2.0's extra tokens; for encoders, whose
first token ``<s>`` is read by the classification head): the first ``N`` positions are exempt
from the bias as queries and as keys, ``bias_h(i, j) = 0`` if ``i < N`` or ``j < N``, and from
``one_sided``'s direction masks too (every head sees them, they see every key); ``causal``
stays causal.

Length scale (``--alibi-length-scale N``, evaluation of bidirectional encoders beyond their
training length ``N``): a sequence of ``n > N`` real tokens uses the slopes ``f(n)·m_h`` with
``f(n) = log n / log N`` (:func:`length_factors`; ``f = 1`` up to ``N``), each sequence its own
``n``: a longer input gets steeper slopes, so that each head's attention does not spread over
the keys a longer input adds (the masked-LM perplexity measured in docs/encoders.md).

The models' bias module (the slopes as a buffer, the scales, a cache) is
:class:`fairseq_alibi.modules.bias.AlibiBias`; it calls these functions.
"""

import math
from typing import Optional

import torch

#: the variants of :func:`alibi_bias`; ``none`` (learned positions, no bias) is a model option
VARIANTS = ("causal", "symmetric", "one_sided", "offset", "asymmetric")

#: the variants each of whose heads reads one direction only (``causal``: back; ``one_sided``:
#: half of the heads back, half ahead); the others read both
ONE_WAY_VARIANTS = ("causal", "one_sided")

#: the variants an encoder may use (``none`` = stock learned position embeddings, no ALiBi)
ENCODER_VARIANTS = ("symmetric", "one_sided", "offset", "asymmetric", "none")

#: which scales ``s`` are learned, of shape (layers if ``per_layer*`` else 1, heads if
#: ``*per_head`` else 1); ``none``: ``s`` is a fixed number (at 1.0 nothing is multiplied)
SCALE_MODES = ("none", "shared", "per_head", "per_layer", "per_layer_head")


def _slopes_list(n: int):
    if math.log2(n).is_integer():  # start = ratio = 2^(-8/n), slopes start·ratio^i
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]
    # not a power of two: the closest lower power of two, then every other slope of twice that
    closest = 2 ** math.floor(math.log2(n))
    return _slopes_list(closest) + _slopes_list(2 * closest)[0::2][: n - closest]


def get_slopes(num_heads: int) -> torch.Tensor:
    """Press et al.'s geometric head slopes, float32, shape ``(num_heads,)``.

    For ``H`` a power of two: ``2^(-8/H), 2^(-16/H), ..., 2^(-8)`` (8 heads: 1/2 ... 1/256);
    otherwise those of the closest lower power of two ``P``, then every other slope of ``2P``
    heads, up to ``H`` — exactly the reference code of the paper.
    """
    if not isinstance(num_heads, int) or isinstance(num_heads, bool) or num_heads < 1:
        raise ValueError(f"ALiBi needs a positive whole number of attention heads, got {num_heads!r}")
    return torch.tensor(_slopes_list(num_heads), dtype=torch.float64).float()


def check_variant(variant: str, num_heads: Optional[int] = None, allowed=VARIANTS) -> str:
    """Validate a variant name (and, for ``one_sided``, the head count); return it."""
    if variant not in allowed:
        raise ValueError(f"unknown ALiBi variant {variant!r}; choose one of: {', '.join(allowed)}")
    if variant == "one_sided" and num_heads is not None and num_heads % 2 != 0:
        raise ValueError(f"one_sided ALiBi needs an even number of attention heads (half look "
                         f"back, half ahead), got {num_heads}; use an even head count or another "
                         "variant (symmetric, offset)")
    return variant


def variant_slopes(num_heads: int, variant: str, biased_heads: Optional[int] = None):
    """The slopes a variant uses: ``one_sided`` gives each half the full range of ``H/2`` heads.

    ``biased_heads`` ``K`` (partial heads): Press's slopes of ``K`` heads, then ``H - K`` zeros
    (``one_sided``, whose heads are split by direction, takes all of them).
    """
    check_variant(variant, num_heads)
    if biased_heads is not None and biased_heads != num_heads:
        # the user-facing checks: --alibi-heads' declaration (fairseq_alibi.options)
        assert variant != "one_sided" and 1 <= biased_heads <= num_heads, (variant, biased_heads)
        return torch.cat([get_slopes(biased_heads), torch.zeros(num_heads - biased_heads)])
    if variant == "one_sided":
        return torch.cat([get_slopes(num_heads // 2)] * 2)
    return get_slopes(num_heads)


def length_factors(lengths: torch.Tensor, reference: int) -> torch.Tensor:
    """``f(n) = max(1, log n / log N)``, float32, for the real lengths ``n`` (``lengths``) and
    the training length ``N`` (``reference`` >= 2): the factor of a sequence's slopes."""
    n = lengths.float().clamp(min=1)
    return (n.log() / math.log(reference)).clamp(min=1.0)


def mask_value(dtype: torch.dtype) -> float:
    """The finite stand-in for ``-inf`` in ``dtype`` (room is left for the logits added to it)."""
    return torch.finfo(dtype).min / 2


def masked_with(bias: torch.Tensor, masked: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``bias`` with :func:`mask_value` of ``dtype`` where ``masked`` (broadcast): one pass
    (``torch.where``), where ``masked_fill`` copies the bias and then fills it."""
    return torch.where(masked, mask_value(dtype), bias)


def window_limits(side, device) -> torch.Tensor:
    """``(H,)`` float32: one side of :func:`variant_windows` (per head, ``None`` = unbounded)
    as numbers, ``inf`` for an unbounded head, to compare distances with."""
    return torch.tensor([math.inf if w is None else w for w in side], dtype=torch.float32,
                        device=device)


def distance_bias(slopes, distances, dtype=torch.float32, back=None) -> torch.Tensor:
    """``(H, len(distances))``: the look-back bias ``-m_h·d`` of keys at distances ``d >= 0``
    behind the query (the row of :func:`alibi_bias` for a query and the keys before it, every
    variant but ``one_sided``'s look-ahead heads), computed in float32 and cast, as
    :func:`alibi_bias`; with ``back`` (per head, ``None`` = unbounded) a distance beyond its
    head's window holds :func:`mask_value`. For a decoding step's row, rebuilt per step where
    :func:`alibi_bias_between` costs several times more."""
    m = slopes.float()
    d = torch.as_tensor(distances, dtype=torch.float32, device=m.device)
    bias = ((-m)[:, None] * d).to(dtype)
    if back is not None:  # masked after the cast, as windowed_alibi_bias does
        reach = window_limits(back, m.device)
        bias = masked_with(bias, d[None, :] > reach[:, None], dtype)
    return bias


def alibi_bias(slopes, query_len, key_len, variant="causal", future_slopes=None,
               dtype=torch.float32, global_tokens: int = 0) -> torch.Tensor:
    """The ALiBi bias, shape ``(H, query_len, key_len)``, to add to the attention logits.

    ``bias[h, t, j]`` for query position ``i = key_len - query_len + t`` and key ``j`` follows
    the module's table. ``slopes`` is ``(H,)`` (see :func:`variant_slopes`); ``future_slopes``
    (``(H,)``) is required by ``asymmetric`` only; ``global_tokens`` ``N``: positions ``< N``
    exempt (the module's docstring). Computed in float32 on ``slopes.device``, returned in
    ``dtype``; masked keys hold :func:`mask_value` of ``dtype``.
    """
    if query_len > key_len:
        raise ValueError(f"query_len ({query_len}) cannot exceed key_len ({key_len})")
    device = slopes.device
    return alibi_bias_between(slopes, torch.arange(key_len - query_len, key_len, device=device),
                              torch.arange(key_len, device=device), variant, future_slopes,
                              dtype, global_tokens)


# ---------------------------------------------------------------- slope windows
#
# Head ``h`` gives a key at distance ``d`` the bias ``-m_h·d``: beyond ``W_h = ceil(T / m_h)``
# the bias is below ``-T`` nats, so the key's softmax weight is at most ``e^-T`` times what it
# would get at distance 0 with the same logit. With a cutoff ``T`` (``--alibi-window-cutoff``,
# nats, ``0`` = off) such keys are dropped, per head and per direction.

#
# Attention sinks (``--alibi-window-sinks S``; StreamingLLM, Xiao et al. 2023): the first ``S``
# positions of a sequence stay visible to every query of every windowed head, with their true
# bias, besides the keys of the window. Head ``h`` keeps key ``j`` of query ``i`` iff
#
#     (i - j <= back_h  and  j - i <= ahead_h)  or  j < S        (the variant's masks apply)
#
# and gives it ``bias_h(i, j)``, the dense model's value; a sink inside the window is one key.
# A windowed model with sinks is the dense model restricted to (window ∪ first S keys). A KV
# cache keeps the ``S`` sinks and the last ``max_h back_h`` keys: the keys between are dropped,
# the positions kept (:func:`kept_positions`).

#: the flag that sets the cutoff ``T`` of :func:`window_lengths` (named in its errors)
WINDOW_CUTOFF_FLAG = "--alibi-window-cutoff"


def check_window_cutoff(cutoff) -> float:
    """Validate a window cutoff ``T`` (nats): a finite number ``>= 0``, ``0`` = off; return it
    as a float."""
    if isinstance(cutoff, bool) or not isinstance(cutoff, (int, float)):
        raise ValueError(f"{WINDOW_CUTOFF_FLAG} must be a number of nats (0 = off), got "
                         f"{cutoff!r}")
    if not math.isfinite(cutoff) or cutoff < 0:
        raise ValueError(f"{WINDOW_CUTOFF_FLAG} must be a finite number of nats >= 0 (0 = off), "
                         f"got {cutoff!r}")
    return float(cutoff)


def window_lengths(slopes, cutoff, shift: float = 0.0):
    """Each head's key window: ``W_h = ceil(T / m_h + shift)``, a list of ``int`` or ``None``.

    ``W_h`` is the first distance whose bias ``-m_h·(d - shift)`` is at or below ``-T``: keys at
    ``d <= W_h`` are kept, every key beyond has a bias below ``-T``. ``shift`` is ``0.5`` for
    ``offset``'s look-ahead keys (bias ``-m·(j-i-0.5)``). ``None`` = unbounded, every key kept:
    a head with no bias (``m_h <= 0``: partial heads' slope 0) or the cutoff off (``T = 0``).
    ``slopes`` are the effective ones (slope scale, learned scales, length factor), read
    detached: the windows are integers.
    """
    cutoff = check_window_cutoff(cutoff)
    found = []
    for m in torch.as_tensor(slopes).detach().double().tolist():
        found.append(None if cutoff == 0 or m <= 0 else math.ceil(cutoff / m + shift))
    return found


def variant_windows(slopes, cutoff, variant="causal", future_slopes=None):
    """``(back, ahead)``: per head, the largest ``i - j`` and ``j - i`` whose keys are kept.

    ``back`` is :func:`window_lengths` of ``slopes``; ``ahead`` is, by variant: ``causal`` 0
    (no future keys); ``symmetric`` the same windows; ``offset`` ``ceil(T/m + 0.5)`` (the bias
    ``-m·(j-i-0.5)``); ``asymmetric`` ``ceil(T / m_f)`` of ``future_slopes``; ``one_sided``
    heads ``h < H/2`` look back (``ahead`` 0), heads ``h >= H/2`` ahead (``back`` 0). A direction
    the variant masks gets 0; ``None`` = unbounded. Global tokens are exempt from the windows
    (:func:`alibi_bias_between`).
    """
    num_heads = torch.as_tensor(slopes).shape[0]
    check_variant(variant, num_heads)
    back = window_lengths(slopes, cutoff)
    if variant == "causal":
        return back, [0] * num_heads
    if variant == "symmetric":
        return back, list(back)
    if variant == "offset":
        return back, window_lengths(slopes, cutoff, shift=0.5)
    if variant == "asymmetric":
        if future_slopes is None:
            raise ValueError("the asymmetric ALiBi variant needs future_slopes")
        return back, window_lengths(future_slopes, cutoff)
    half = num_heads // 2  # one_sided
    return back[:half] + [0] * (num_heads - half), [0] * half + back[half:]


def kept_positions(key_len: int, sinks: int = 0, dropped: int = 0) -> torch.Tensor:
    """The positions of the ``key_len`` keys a KV cache holds: the first ``sinks`` positions,
    then, after ``dropped`` positions no later query reads (between the sinks and the window),
    the rest in order; ``0 … key_len - 1`` when nothing was dropped."""
    positions = torch.arange(key_len)
    if dropped:
        positions[sinks:] += dropped
    return positions


def sinks_to_end(keys: torch.Tensor, sinks: int) -> torch.Tensor:
    """``keys`` (the last dim: a cache's keys, its ``sinks`` attention sinks first) with the
    sinks moved after the others: the order in which a decoding step reads a cache that keeps
    its sinks after its window in one buffer (a padding mask, a bias). Attention does not
    depend on the order of its keys, only on each key's own bias."""
    return torch.cat([keys[..., sinks:], keys[..., :sinks]], dim=-1)


def alibi_bias_between(slopes, query_positions, key_positions, variant="causal",
                       future_slopes=None, dtype=torch.float32, global_tokens: int = 0,
                       heads=None, windows=None, sinks: int = 0) -> torch.Tensor:
    """The bias of :func:`alibi_bias` between any positions, for some heads, with windows.

    Shape ``(len(heads), len(query_positions), len(key_positions))``: ``bias[h, a, b]`` is the
    module table's bias of head ``heads[h]`` (of the ``H = len(slopes)`` heads; ``one_sided``'s
    direction is that index's) for query position ``i = query_positions[a]`` and key
    ``j = key_positions[b]``. ``windows`` ``(back, ahead)`` (:func:`variant_windows`, per head
    of the ``H``, ``None`` = unbounded) masks the keys with ``i - j > back_h`` or
    ``j - i > ahead_h`` unless ``i`` or ``j`` is a global token (``< global_tokens``) or ``j``
    is a sink (``< sinks``: kept with its bias, the variant's masks still apply).
    ``alibi_bias(slopes, T, S, ...)`` is this with queries ``S-T … S-1`` and keys ``0 … S-1``;
    the bias depends on ``i - j`` only (but for global tokens), so shifted positions give the
    same block. Positions of a row each, ``(B, T)`` and ``(B, S)`` (no global tokens), give
    ``(B, len(heads), T, S)`` (:func:`document_alibi_bias`). Masked keys hold
    :func:`mask_value` of ``dtype``.
    """
    num_heads, device = slopes.shape[0], slopes.device
    check_variant(variant, num_heads)
    if variant == "asymmetric" and future_slopes is None:
        raise ValueError("the asymmetric ALiBi variant needs future_slopes")
    heads = torch.arange(num_heads, device=device) if heads is None else torch.as_tensor(
        heads, device=device)
    m = slopes.float()[heads][:, None, None]
    pos_q = torch.as_tensor(query_positions, device=device).float()
    pos_k = torch.as_tensor(key_positions, device=device).float()
    rows = pos_q.dim() == 2  # positions of a row each: (B, 1, T, S), the heads broadcast
    assert not (rows and global_tokens), "global tokens are the first positions of a sequence"
    rel = pos_q[..., :, None] - pos_k[..., None, :]  # i - j, exact in float32 up to 2^24
    if rows:
        rel = rel[:, None]
    past, future = rel.clamp(min=0), (-rel).clamp(min=0)
    masked = None  # nothing masked: no pass of masked_with
    if variant == "causal":
        bias, masked = -m * past, rel < 0
    elif variant == "symmetric":
        bias = -m * rel.abs()
    elif variant == "offset":
        bias = -m * (past + (future - 0.5).clamp(min=0))
    elif variant == "asymmetric":
        bias = -m * past - future_slopes.float()[heads][:, None, None] * future
    else:  # one_sided: heads h >= H/2 look ahead
        bias = -m * rel.abs()
        looks_ahead = (heads >= num_heads // 2)[:, None, None]
        masked = torch.where(looks_ahead, rel > 0, rel < 0)
    exempt = torch.zeros((), dtype=torch.bool, device=device)
    if global_tokens > 0:
        exempt = (pos_q[:, None] < global_tokens) | (pos_k < global_tokens)[None, :]
        bias = bias.masked_fill(exempt, 0.0)
        if masked is not None and variant != "causal":  # causality is not a distance bias
            masked = masked & ~exempt
    if windows is not None:
        back, ahead = (window_limits(side, device)[heads][:, None, None] for side in windows)
        beyond = ((rel > back) | (-rel > ahead)) & ~exempt
        if sinks > 0:
            beyond = beyond & (pos_k >= sinks)[..., None, :].view(rel.shape[:-2] + (1, -1))
        masked = beyond if masked is None else masked | beyond
    bias = bias.expand(rel.shape[:-3] + (len(heads),) + rel.shape[-2:]).to(dtype)
    # filled after the cast: the mask value is the target dtype's
    return bias if masked is None else masked_with(bias, masked, dtype)


def windowed_alibi_bias(slopes, query_len, key_len, variant="causal", future_slopes=None,
                        dtype=torch.float32, global_tokens: int = 0, cutoff=0.0,
                        sinks: int = 0, dropped: int = 0) -> torch.Tensor:
    """The dense definition of slope windows: :func:`alibi_bias` with every key beyond its
    head's window (:func:`variant_windows` of ``cutoff``) masked, global tokens exempt, the
    first ``sinks`` keys kept (attention sinks); ``(H, query_len, key_len)``, queries aligned
    to the end of the keys, whose positions are :func:`kept_positions` (``dropped``: the
    positions a KV cache dropped after its sinks)."""
    if query_len > key_len:
        raise ValueError(f"query_len ({query_len}) cannot exceed key_len ({key_len})")
    windows = variant_windows(slopes, cutoff, variant, future_slopes)
    positions = kept_positions(key_len, sinks, dropped)
    return alibi_bias_between(
        slopes, positions[key_len - query_len:], positions, variant, future_slopes, dtype,
        global_tokens, windows=windows, sinks=sinks,
    )


# ---------------------------------------------------------------- documents
#
# A packed row (fairseq's ``--sample-break-mode none``, masked_lm's ``complete``) holds the end
# of one document and the start of the next. With a document mask (``--alibi-document-mask``)
# no query reads a key of another document: each document is attended as if it were its own
# sequence. The bias depends on ``i - j`` only, so within a document it is the row's bias;
# across documents every key is masked:
#
#     bias_h(i, j) + (mask_value if doc(i) != doc(j) else 0)
#
# The token that marks a boundary opens the next document: it is what predicts that document's
# first token.
#
# Attention sinks with documents (``--alibi-window-sinks S``): the sinks are the first ``S``
# positions of each document. With ``o(j)`` the place of key ``j`` in its document
# (:func:`document_offsets`, 0 at the document's first position), head ``h`` keeps key ``j`` of
# query ``i`` iff
#
#     doc(i) = doc(j)  and  ((i - j <= back_h  and  j - i <= ahead_h)  or  o(j) < S)
#
# with ``bias_h(i, j)``, the variant's masks applying: each document is the windowed model with
# sinks of its own sequence. Within a document ``i - j = o(i) - o(j)``, so the bias is
# :func:`alibi_bias_between` of the offsets (:func:`document_alibi_bias`): a KV cache needs no
# positions, only each key's document and offset.

#: ``--alibi-document-mask``: where documents begin. ``eos``: at every ``</s>``; ``doc``: at an
#: ``</s>`` right after an ``</s>`` (the empty line ``--sample-break-mode complete_doc`` splits
#: on); ``none``: off
DOCUMENT_MASKS = ("none", "eos", "doc")


def document_starts(eos: torch.Tensor, mode: str,
                    previous_eos: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``(B, N)`` bool, True where a position opens a document.

    ``eos`` ``(B, N)`` bool: the positions holding ``</s>``. ``mode`` ``eos``: every such
    position; ``doc``: one whose previous position holds ``</s>`` too (``previous_eos`` ``(B,
    1)``: whether the position before the first is one, e.g. a KV cache's last key; default
    not).
    """
    if mode not in DOCUMENT_MASKS[1:]:
        raise ValueError(f"unknown --alibi-document-mask {mode!r}; choose one of: "
                         f"{', '.join(DOCUMENT_MASKS)}")
    if mode == "eos":
        return eos
    before = torch.zeros_like(eos[:, :1]) if previous_eos is None else previous_eos.to(
        eos.device, torch.bool).view(-1, 1)
    return eos & torch.cat([before, eos[:, :-1]], dim=1)


def document_ids(eos: torch.Tensor, mode: str, previous_eos: Optional[torch.Tensor] = None,
                 previous_id: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``(B, N)`` int64: each position's document, ``previous_id + `` the number of
    :func:`document_starts` at or before it (``previous_id`` ``(B, 1)``: the document of the
    position before the first, e.g. a KV cache's last key; default 0). Equal ids: one
    document."""
    ids = document_starts(eos, mode, previous_eos).long().cumsum(dim=1)
    return ids if previous_id is None else ids + previous_id.to(ids.device).view(-1, 1)


def document_mask(documents: torch.Tensor, query_len: int) -> torch.Tensor:
    """``(B, 1, T, S)`` bool, True where query and key lie in different documents (masked):
    ``documents`` ``(B, S)`` the keys' ids (:func:`document_ids`), the queries the last ``T``
    of them (aligned to the end of the keys, as everywhere)."""
    queries = documents[:, documents.size(1) - query_len:]
    return (queries[:, None, :, None] != documents[:, None, None, :])


def document_offsets(starts: torch.Tensor, previous: Optional[torch.Tensor] = None
                     ) -> torch.Tensor:
    """``(B, N)`` int64: each position's place in its document, 0 where one opens
    (``starts``, :func:`document_starts`), one more than the position before otherwise
    (``previous`` ``(B, 1)``: the offset of the position before the first, e.g. a KV cache's
    last key; default: the first position is a document's first)."""
    if starts.size(1) == 1 and previous is not None:  # a decoding step: the same, in one op
        return torch.where(starts, 0, previous.to(starts.device, torch.long).view(-1, 1) + 1)
    steps = torch.arange(starts.size(1), device=starts.device).expand_as(starts)
    before = (torch.zeros_like(steps[:, :1]) if previous is None
              else -1 - previous.to(starts.device).view(-1, 1))
    opened = torch.where(starts, steps, before.expand_as(steps)).cummax(dim=1).values
    return steps - opened


def document_alibi_bias(slopes, documents: torch.Tensor, offsets: torch.Tensor, query_len: int,
                        variant="causal", future_slopes=None, dtype=torch.float32, windows=None,
                        sinks: int = 0) -> torch.Tensor:
    """The definition of a document mask, ``(B, H, T, S)``: the bias of each document as its
    own sequence, with slope windows ``windows`` (:func:`variant_windows`, ``None``: none) and
    its first ``sinks`` positions kept (the comment above), keys of other documents masked.

    ``documents`` ``(B, S)`` the keys' ids (:func:`document_ids`), ``offsets`` ``(B, S)`` their
    places in their documents (:func:`document_offsets`); the queries are the last ``T``
    keys. A key of another document holds :func:`mask_value` of ``dtype`` (an id no query
    has, e.g. ``-1``, hides a key)."""
    if query_len == 1 and variant == "causal":
        return _document_step_bias(slopes, documents, offsets, dtype, windows, sinks)
    queries = offsets[:, offsets.size(1) - query_len:]
    bias = alibi_bias_between(slopes, queries, offsets, variant, future_slopes, dtype,
                              windows=windows, sinks=sinks)
    return masked_with(bias, document_mask(documents, query_len), dtype)


def _document_step_bias(slopes, documents, offsets, dtype, windows, sinks) -> torch.Tensor:
    """:func:`document_alibi_bias` of one causal query (a decoding step), the same numbers in
    a few operations on ``(B, H, S)``: with ``d = o(i) - o(j)``, ``-m_h·d``, masked where the
    key's document is not the query's, ``d < 0`` (causal), or ``d > back_h`` for a key that is
    not a sink (``o(j) >= S``)."""
    d = (offsets[:, -1:] - offsets).float()[:, None, :]  # (B, 1, S), exact up to 2^24
    masked = (documents != documents[:, -1:])[:, None, :] | (d < 0)
    if windows is not None:
        back = window_limits(windows[0], d.device)[None, :, None]
        beyond = d > back
        if sinks > 0:
            beyond = beyond & (offsets >= sinks)[:, None, :]
        masked = masked | beyond
    bias = (-slopes.float()[None, :, None] * d).to(dtype)
    return masked_with(bias, masked, dtype)[:, :, None, :]
