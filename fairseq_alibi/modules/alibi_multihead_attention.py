"""fairseq's MultiheadAttention with an ALiBi bias, computed by one of the attention backends.

fairseq's own attention only adds a 3-D float mask on its fast path and encoder layers
``masked_fill`` any float mask away, so the bias cannot be passed through ``attn_mask``: this
module owns the attention computation and hands it, with its layer's view of the stack's
bias (:meth:`fairseq_alibi.modules.bias.AlibiBias.layer`), to the backend it is configured with
(``attention``: ``--alibi-attention``, see :mod:`fairseq_alibi.modules.attention`). It reads
the bias through :class:`~fairseq_alibi.modules.attention.dispatch.AttentionBias` only: one
``for_call`` per call, whose answer goes to the backend.
Projections, parameter names, the incremental-state layout (``prev_key``/``prev_value`` as
``(B, H, T, D)``) and beam reordering are the parent's, so checkpoints and fairseq's
generators work unchanged.
"""

from typing import Callable, Dict, Optional, Tuple

import torch
from fairseq.modules import MultiheadAttention
from torch import Tensor

from fairseq_alibi.modules.attention import attend, check_attention_backend, dense
from fairseq_alibi.modules.attention.dispatch import (AttentionBias, CachedDocuments, CallBias,
                                                      attend_sinks_apart, attend_sinks_first,
                                                      check_training)
from fairseq_alibi.modules.attention.windowed import decoding_reach


class AlibiMultiheadAttention(MultiheadAttention):
    """Self-attention ``softmax(QKᵀ/√d + ALiBi + masks) V``.

    ``alibi`` is the layer's view of its stack's bias (an :class:`AttentionBias`: held by
    reference, so that the stack's slopes are saved once, with the layer's own slope scales
    if any); ``attention`` the backend name (``auto``, ``fold``, ``sdpa``, ``flex``, ``flash``,
    ``naive``). ``attn_mask`` and ``key_padding_mask`` keep their
    fairseq meaning and are added on top of the bias. The attention weights (``need_weights``)
    and the raw scores (``before_softmax``) are computed explicitly, whatever the backend.
    """

    def __init__(self, embed_dim, num_heads, alibi: AttentionBias, attention="auto", **kwargs):
        if kwargs.get("add_bias_kv") or kwargs.get("add_zero_attn"):
            raise ValueError(
                "ALiBi attention does not support add_bias_kv/add_zero_attn (the extra key has "
                "no position); turn those options off"
            )
        if alibi.num_heads != num_heads:
            raise ValueError(f"ALiBi bias has {alibi.num_heads} heads, attention {num_heads}")
        super().__init__(embed_dim, num_heads, self_attention=True, **kwargs)
        object.__setattr__(self, "alibi", alibi)
        self.attention_backend = check_attention_backend(attention)
        self._scratch: Dict[str, Tensor] = {}  # the sinks joined to the window (_joined)

    def extra_repr(self):
        return f"attention_backend={self.attention_backend}, variant={self.alibi.variant}"

    def train(self, mode: bool = True):
        """A named backend that cannot train this layer is refused here, before the first
        training step (:func:`.dispatch.check_training`), not inside it."""
        if mode:
            on_cpu = self.q_proj.weight.device.type == "cpu"
            final = on_cpu and not torch.cuda.is_available()  # nowhere else to move to
            self.check_trainable("cpu" if final else None)
        return super().train(mode)

    def check_trainable(self, device: Optional[str] = None):
        """Refuse a named backend that cannot train this layer (on ``device``, where that is
        the device it trains on): :func:`.dispatch.check_training`."""
        check_training(self.attention_backend, self.alibi, self.dropout_module.p, device)

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        if static_kv:
            raise ValueError("ALiBi attention is self-attention only (static_kv=True given)")
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, embed_dim = query.size()
        H, D = self.num_heads, self.head_dim

        def heads(x):  # (T, B, C) -> (B, H, T, D)
            return x.contiguous().view(x.size(0), bsz, H, D).permute(1, 2, 0, 3)

        q, k, v = heads(self.q_proj(query)), heads(self.k_proj(query)), heads(self.v_proj(query))

        reach, keys, values, sinks, sinks_last = None, k, v, None, None
        if incremental_state is not None:
            saved = self._get_input_buffer(incremental_state)
            # attention sinks kept apart from the rolling window once keys between were dropped
            sink_keys, dropped = saved.get("sink_key"), 0
            cached = 0 if saved.get("prev_key") is None else saved["prev_key"].size(2)
            if sink_keys is not None:
                cached += sink_keys.size(2)
                # a document's sinks apart (keep_document_sinks) have no dropped positions
                dropped = (sink_keys.size(2) if saved.get("sink_dropped") is None
                           else int(saved["sink_dropped"]))
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask,
                prev_key_padding_mask=saved.get("prev_key_padding_mask"),
                batch_size=bsz,
                src_len=cached + tgt_len,
                static_kv=False,
            )
            if key_padding_mask is not None and key_padding_mask.dim() == 0:
                key_padding_mask = None
            documents = saved.get("prev_document_ids")  # the cached keys' documents, if any
            if documents is not None:
                documents = CachedDocuments(documents, saved["prev_document_eos"],
                                            saved.get("prev_document_offsets"))
            call_bias = self.alibi.for_call(
                key_padding_mask, bsz, tgt_len, cached + tgt_len, True,
                **({} if documents is None else {"cached_documents": documents}),
                **({"dropped": dropped} if dropped else {}))
            reach = decoding_reach(call_bias)
            after = sinks_room(saved, call_bias, reach, cached + tgt_len)
            if saved.get("prev_key") is not None:
                k = append_to_cache(saved, "key", k, reach, after)
                v = append_to_cache(saved, "value", v, reach, after)
            saved["prev_key"], saved["prev_value"] = keys, values = k, v
            if sink_keys is not None:
                sinks = (sink_keys, saved["sink_value"])
            sinks_last = sinks_reader(saved, sinks, after) if after else None
            saved["prev_key_padding_mask"] = key_padding_mask
            documents = getattr(call_bias, "documents", None)
            if documents is not None:  # trimmed with the keys below
                saved["prev_document_ids"] = documents.ids
                saved["prev_document_eos"] = documents.last_eos
                if documents.offsets is not None:  # attention sinks: each document's first
                    saved["prev_document_offsets"] = documents.offsets
        else:
            if key_padding_mask is not None and key_padding_mask.dim() == 0:
                key_padding_mask = None
            call_bias = self.alibi.for_call(key_padding_mask, bsz, tgt_len, tgt_len, False)
        out = self._attend(q, keys, values, sinks, call_bias, key_padding_mask, attn_mask,
                           need_weights, need_head_weights, before_softmax, sinks_last)
        if incremental_state is not None:
            if reach is not None:  # keep only the keys a later query can reach
                keep_reachable(saved, reach, getattr(call_bias, "sinks", 0), key_padding_mask)
            self._set_input_buffer(incremental_state, saved)
        return out

    def _attend(self, q, k, v, sinks, call_bias, key_padding_mask, attn_mask, need_weights,
                need_head_weights, before_softmax, sinks_last=None):
        """:func:`attend_call_and_project` of this call; with a cache's attention sinks kept
        apart (``sinks``: their keys and values, ``k``/``v`` the window's), read apart where
        the backend can (:func:`.dispatch.attend_sinks_apart`: ``sdpa``, ``windowed``), else
        joined (:meth:`_joined`). ``sinks_last()``: the window with the sinks after it in one
        buffer (:func:`sinks_reader`), which those backends read as one view; before the cache
        drops a key, the backends that would copy the sinks to each head group's window read
        that instead (:func:`.dispatch.attend_sinks_first`)."""
        out = None
        if not (need_weights or before_softmax) and attn_mask is None and not dropout_of(self):
            if sinks is not None:
                out = attend_sinks_apart(self.attention_backend, q, sinks, k, v, call_bias,
                                         key_padding_mask, self.scaling, sinks_last)
            elif sinks_last is not None:
                out = attend_sinks_first(self.attention_backend, q, k, v, call_bias,
                                         key_padding_mask, self.scaling, sinks_last)
        if out is not None:
            B, H, T, D = q.shape
            return self.out_proj(out.permute(2, 0, 1, 3).reshape(T, B, H * D)), None
        if sinks is not None:
            k, v = self._joined("key", sinks[0], k), self._joined("value", sinks[1], v)
        return attend_call_and_project(self, self.attention_backend, q, k, v, call_bias,
                                       key_padding_mask, attn_mask, need_weights,
                                       need_head_weights, before_softmax)

    def _joined(self, name: str, sinks: Tensor, window: Tensor) -> Tensor:
        """``cat([sinks, window], dim=2)``: a cache's attention sinks and its window, the keys
        (values) of this call. Without autograd, written into a scratch buffer of this layer
        that the next call of the same shape reuses: a new tensor of the whole cache every
        step made the allocator fault its pages in again (the step took up to twice as long,
        docs/decoding.md). Read by this call only, so every cache of the layer can share it."""
        if torch.is_grad_enabled() and (sinks.requires_grad or window.requires_grad):
            return torch.cat([sinks, window], dim=2)
        shape = window.shape[:2] + (sinks.size(2) + window.size(2), window.size(3))
        scratch = self._scratch.get(name)
        if (scratch is None or scratch.shape != shape or scratch.dtype != window.dtype
                or scratch.device != window.device):
            scratch = self._scratch[name] = window.new_empty(shape)
        return torch.cat([sinks, window], dim=2, out=scratch)

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        """Beam search's reordering of the cache: the parent's ``index_select`` of every entry,
        applied to the cache's spare-room buffers (:func:`append_to_cache`) instead of their
        views, and skipped when the order is the identity (greedy or sampling decoding, a beam
        where nothing finished), where the parent copies the whole cache for nothing."""
        saved = self._get_input_buffer(incremental_state)
        if not saved:
            return incremental_state
        batch = next((t.size(0) for t in saved.values() if t is not None and t.dim()), None)
        if batch == new_order.numel() and torch.equal(
                new_order, torch.arange(batch, device=new_order.device)):
            return incremental_state
        for name in ("key", "value"):
            view, room = saved.get(f"prev_{name}"), _own_room(saved, name)
            if room is not None:  # reorder the buffer, keep its spare room
                end = room._alibi_filled
                _set_room(saved, name, room.index_select(0, new_order), end - view.size(2), end)
            elif view is not None:
                saved[f"prev_{name}"] = view.index_select(0, new_order)
        for entry, tensor in saved.items():
            if tensor is not None and entry not in _CACHE_ENTRIES + _SHARED_ENTRIES:
                saved[entry] = tensor.index_select(0, new_order)
        return self._set_input_buffer(incremental_state, saved)


def attend_and_project(module: MultiheadAttention, backend: str, q, k, v,
                       alibi: AttentionBias, key_padding_mask=None, attn_mask=None,
                       need_weights=False, need_head_weights=False, before_softmax=False,
                       incremental=False):
    """``(out_proj(attention), weights)`` of ``(B, H, T, D)`` queries and ``(B, H, S, D)``
    keys/values, with fairseq's protocols: ``weights`` (``need_weights``: averaged over the heads
    unless ``need_head_weights``) and the raw scores (``before_softmax``) computed explicitly,
    otherwise backend ``backend`` of the dispatch; the module's dropout while training.
    ``alibi`` gives this call's bias (:meth:`AttentionBias.for_call`; ``incremental``: a
    decoding step with a KV cache), which is all this module reads of it."""
    call_bias = alibi.for_call(key_padding_mask, q.size(0), q.size(2), k.size(2), incremental)
    return attend_call_and_project(module, backend, q, k, v, call_bias, key_padding_mask,
                                   attn_mask, need_weights, need_head_weights, before_softmax)


def dropout_of(module: MultiheadAttention) -> float:
    """The attention dropout ``module`` applies now: its ``p`` while training (or where it
    applies during inference), else 0."""
    if module.training or module.dropout_module.apply_during_inference:
        return module.dropout_module.p
    return 0.0


def attend_call_and_project(module: MultiheadAttention, backend: str, q, k, v,
                            alibi: CallBias, key_padding_mask=None, attn_mask=None,
                            need_weights=False, need_head_weights=False, before_softmax=False):
    """:func:`attend_and_project` with this call's bias ``alibi`` already asked for."""
    bsz, H, tgt_len, D = q.shape
    src_len = k.size(2)
    dropout_p = dropout_of(module)
    weights = None
    if before_softmax:  # fairseq's raw-scores protocol: (B·H, T, S) scores and values
        scores = dense.scores(q, k, alibi, key_padding_mask, attn_mask, module.scaling)
        return scores.view(bsz * H, tgt_len, src_len), v.reshape(bsz * H, src_len, D)
    if need_weights or need_head_weights:
        out, probs = dense.naive_with_weights(
            q, k, v, alibi, key_padding_mask, attn_mask, dropout_p, module.scaling
        )
        weights = probs.view(bsz, H, tgt_len, src_len).transpose(1, 0)
        if not need_head_weights:
            weights = weights.mean(dim=0)
    else:
        out = attend(backend, q, k, v, alibi, key_padding_mask, attn_mask, dropout_p,
                     module.scaling)
    out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, H * D)
    return module.out_proj(out), weights


#: the entries of the cache that reorder_incremental_state handles itself
_CACHE_ENTRIES = ("prev_key", "prev_value", "key_room", "value_room")
#: the entries of the cache that are the same for every row (never reordered)
_SHARED_ENTRIES = ("sink_dropped",)


def keep_reachable(saved: Dict[str, Optional[Tensor]], reach: int, sinks: int,
                   key_padding_mask: Optional[Tensor]) -> None:
    """After a call whose slope windows let no later query read further back than ``reach``
    keys (:func:`.windowed.decoding_reach`), keep the last ``reach`` keys of the cache
    (:func:`trim_cache`) and its first ``sinks`` (attention sinks, ``--alibi-window-sinks``):
    once keys between them are dropped, the sinks are kept apart (``sink_key``/``sink_value``)
    and ``sink_dropped`` counts the positions dropped after them (what the next call's bias
    reads: :func:`~fairseq_alibi.alibi.kept_positions`). At most ``sinks + reach`` keys.
    With documents, the sinks of the current document (:func:`keep_document_sinks`)."""
    if sinks and saved.get("prev_document_offsets") is not None:
        return keep_document_sinks(saved, reach, sinks, key_padding_mask)
    window = saved["prev_key"].size(2)  # the keys after the sinks once they are apart
    if saved.get("sink_key") is not None:
        excess = window - reach
        if excess > 0:
            saved["sink_dropped"] = saved["sink_dropped"] + excess
    else:
        excess = window - sinks - reach
        if excess > 0 and sinks:
            for name in ("key", "value"):
                saved[f"sink_{name}"] = saved[f"prev_{name}"][:, :, :sinks].clone()
            saved["sink_dropped"] = torch.tensor(excess)
    if excess <= 0:
        return
    for name in ("key", "value"):
        trim_cache(saved, name, reach)
    if key_padding_mask is not None:
        saved["prev_key_padding_mask"] = torch.cat(
            [key_padding_mask[:, :sinks], key_padding_mask[:, -reach:]], dim=1)
    if saved.get("prev_document_ids") is not None:  # (sinks with documents: apart)
        saved["prev_document_ids"] = saved["prev_document_ids"][:, -reach:]


def keep_document_sinks(saved: Dict[str, Optional[Tensor]], reach: int, sinks: int,
                        key_padding_mask: Optional[Tensor]) -> None:
    """:func:`keep_reachable` with documents (``--alibi-document-mask``): the sinks are the
    first ``sinks`` positions of each row's current document (its last key's: every later
    query's, or a later one's), which may lie anywhere in the row. From the first call that
    drops keys, the cache holds ``sinks`` slots apart (``sink_key``/``sink_value``, before the
    window): a key dropped from the window that is its current document's sink at offset
    ``o < sinks`` goes to slot ``o``. Each key keeps its document and offset
    (``prev_document_ids``/``_offsets``: the bias is that of the offsets,
    :func:`~fairseq_alibi.alibi.document_alibi_bias`); a slot not (yet) filled, or of an
    earlier document, is hidden by its document (``-1``: none; an earlier one: not the
    query's). At most ``sinks + reach`` keys."""
    apart = saved.get("sink_key")
    held = 0 if apart is None else apart.size(2)
    excess = saved["prev_key"].size(2) - reach
    if excess <= 0:
        return
    ids, offsets = saved["prev_document_ids"], saved["prev_document_offsets"]
    rows, keys, slots, saved["prev_document_ids"], saved["prev_document_offsets"] = \
        document_slots(ids, offsets, held, excess, reach, sinks)
    if apart is None:  # empty slots: of no document (document_slots), at their offsets
        for name in ("key", "value"):
            prev = saved[f"prev_{name}"]
            saved[f"sink_{name}"] = prev.new_zeros(prev.shape[:2] + (sinks, prev.size(3)))
    for name in ("key", "value"):
        if len(rows):  # a copy: another continuation of the cache may hold these slots
            saved[f"sink_{name}"] = saved[f"sink_{name}"].clone()
            saved[f"sink_{name}"][rows, :, slots] = saved[f"prev_{name}"][rows, :, keys]
        trim_cache(saved, name, reach)
    if key_padding_mask is not None:  # (fairseq's may be float: its dtype kept)
        slot_padding = (key_padding_mask.new_zeros(ids.size(0), sinks) if apart is None
                        else key_padding_mask[:, :held].clone())
        slot_padding[rows, slots] = key_padding_mask[:, held:held + excess][rows, keys]
        saved["prev_key_padding_mask"] = torch.cat([slot_padding, key_padding_mask[:, -reach:]],
                                                   dim=1)


def document_slots(ids: Tensor, offsets: Tensor, held: int, excess: int, reach: int,
                   sinks: int) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(rows, keys, slots, ids, offsets)`` of :func:`keep_document_sinks` dropping the
    ``excess`` keys after ``held`` slots (0: none yet, ``sinks`` made, of no document): the
    dropped keys that are their row's current document's sinks (``keys``, counted from the
    first dropped) and the slots they go to, and the documents and offsets of the slots and
    the last ``reach`` keys. Every layer of a step trims the same tensors (one for all,
    :meth:`~fairseq_alibi.modules.bias.AlibiBias.documents_of`): the answer is kept on ``ids``
    for the layers after the first (``_alibi_slots``, read while ``offsets`` is the same; the
    cache's document tensors are never written in place, only replaced)."""
    memo = getattr(ids, "_alibi_slots", None)
    if memo is not None and memo[0] is offsets and memo[1] == (held, excess, reach, sinks):
        return memo[2]
    if held:
        slot_ids, slot_offsets = ids[:, :held].clone(), offsets[:, :held]
    else:
        slot_ids = ids.new_full((ids.size(0), sinks), -1)
        slot_offsets = torch.arange(sinks, device=ids.device).expand(ids.size(0), -1)
    gone = slice(held, held + excess)
    rows, keys = ((ids[:, gone] == ids[:, -1:]) & (offsets[:, gone] < sinks)).nonzero(
        as_tuple=True)
    slots = offsets[:, gone][rows, keys]
    if len(rows):
        slot_ids[rows, slots] = ids[:, gone][rows, keys]
    found = (rows, keys, slots, torch.cat([slot_ids, ids[:, -reach:]], dim=1),
             torch.cat([slot_offsets, offsets[:, -reach:]], dim=1))
    ids._alibi_slots = (offsets, (held, excess, reach, sinks), found)
    return found


def _own_room(saved: Dict[str, Optional[Tensor]], name: str) -> Optional[Tensor]:
    """The buffer behind ``saved["prev_<name>"]``, if the cache is a view of its positions
    ``start … filled - 1`` that ends where the buffer was last written; else ``None``.

    The buffer records how far it is filled (its attribute ``_alibi_filled``, seen by every
    copy of the cache that holds this buffer): a cache copied by reference (two continuations
    of one prefix, e.g. a shallow copy of the state) finds the buffer filled beyond its own
    end once the other copy has appended, and takes a buffer of its own instead of
    overwriting the other's. Nothing ever writes below the mark, so a view that ends before
    it still holds what it held.
    """
    view, room = saved.get(f"prev_{name}"), saved.get(f"{name}_room")
    if view is None or room is None or view.stride() != room.stride():
        return None
    start = getattr(room, "_alibi_filled", -1) - view.size(2)
    if start < 0 or view.data_ptr() != room.data_ptr() + start * room.stride(2) * room.itemsize:
        return None
    return room


def _set_room(saved, name, room: Tensor, start: int, end: int) -> Tensor:
    room._alibi_filled = end
    saved[f"{name}_room"] = room
    saved[f"prev_{name}"] = view = room[:, :, start:end]
    return view


def _fresh_room(saved, name, kept: Tensor, spare: int) -> Tensor:
    """A new buffer of ``kept.size(2) + spare`` positions whose first ones are ``kept``."""
    bsz, heads, length, dim = kept.shape
    room = kept.new_empty(bsz, heads, length + spare, dim)
    room[:, :, :length] = kept
    return _set_room(saved, name, room, 0, length)


def append_to_cache(saved: Dict[str, Optional[Tensor]], name: str, new: Tensor,
                    reach: Optional[int] = None, after: int = 0) -> Tensor:
    """``saved["prev_<name>"]`` with ``new`` appended along the time axis (dim 2).

    fairseq's attention concatenates the whole cache with each step's key and value, copying
    ``O(cached tokens)`` per step and layer. Here the cache is a view of a buffer with spare
    room (``saved["<name>_room"]``) and a step writes only its own positions after the view.
    Without a bound (``reach`` ``None``) the view starts at the buffer's front and the buffer
    grows by a quarter (at least 16 positions) when full, so its spare room stays under a
    quarter of the cache; so does a cache below its bound. With a bound
    (:func:`.windowed.decoding_reach`: slope windows keep the cache at its last ``reach``
    positions, :func:`trim_cache`) the view slides along the buffer once it holds ``reach``
    positions; when the buffer's end is reached the view is copied to the front of a new buffer
    of about ``2·reach`` positions: ``reach`` steps of spare room per copy of ``reach``
    positions, amortised ``O(1)`` per step, and bounded memory. (A new buffer, not a move
    within this one: a move would overwrite positions that a copy of the cache sharing the
    buffer still reads.) The layout fairseq reads, ``prev_<name>`` as ``(B, H, T, D)``, is kept
    (a view). A cache that is not such a view (filled by someone else, reordered by code that
    does not know the buffer, or sharing it with another continuation: :func:`_own_room`) is
    copied into a new buffer first. While autograd records, the plain concatenation is used:
    writing in place would overwrite what backward needs. ``after``: positions to leave free
    after the new end (a cache's attention sinks, :func:`sinks_after_window`).
    """
    prev = saved[f"prev_{name}"]
    if torch.is_grad_enabled() and (prev.requires_grad or new.requires_grad):
        return torch.cat([prev, new], dim=2)
    room = _own_room(saved, name)
    length = prev.size(2) + new.size(2)
    if room is None or room._alibi_filled + new.size(2) + after > room.size(2):
        # a bound the cache has not reached grows it as without one: a window of more
        # positions than the generation (a large cutoff, a slope near 0) allocates no more
        spare = max(16, length // 4 if reach is None or length < reach else reach)
        _fresh_room(saved, name, prev, spare + new.size(2) + after)
        room = saved[f"{name}_room"]
    end = room._alibi_filled + new.size(2)
    room[:, :, end - new.size(2):end] = new
    return _set_room(saved, name, room, end - length, end)


def sinks_room(saved: Dict[str, Optional[Tensor]], call_bias, reach: Optional[int],
               length: int) -> int:
    """The positions a KV cache of ``length`` keys leaves free after its end for its attention
    sinks (:func:`sinks_after_window`): ``S`` where the cache keeps them apart from its rolling
    window (:func:`keep_reachable`), or has not dropped a key yet and holds more than them;
    0 without slope windows, sinks or room to save, and for a document's sinks (kept per
    row, :func:`keep_document_sinks`)."""
    held = getattr(call_bias, "sinks", 0)
    if not held or reach is None or getattr(call_bias, "documents", None) is not None:
        return 0
    if saved.get("sink_key") is not None:
        return saved["sink_key"].size(2) if saved.get("sink_dropped") is not None else 0
    return held if length > held else 0


def sinks_reader(saved: Dict[str, Optional[Tensor]], sinks: Optional[Tuple[Tensor, Tensor]],
                 held: int) -> Callable[[], Optional[Tuple[Tensor, Tensor]]]:
    """A function giving the cache's window with its ``held`` attention sinks after it in one
    buffer (:func:`sinks_after_window`), called only where a backend reads them so: the sinks
    kept apart (``sinks``), or, before the cache drops a key, its first ``held`` keys (the
    window then its keys after them)."""
    if sinks is not None:
        return lambda: sinks_after_window(saved, sinks, saved["prev_key"].size(2))

    def first() -> Optional[Tuple[Tensor, Tensor]]:
        key, value = saved["prev_key"], saved["prev_value"]
        return sinks_after_window(saved, (key[:, :, :held], value[:, :, :held]),
                                  key.size(2) - held)
    return first


def sinks_after_window(saved: Dict[str, Optional[Tensor]], sinks: Tuple[Tensor, Tensor],
                       window: int) -> Optional[Tuple[Tensor, Tensor]]:
    """The keys and values of a cache's window (the last ``window`` positions of
    ``prev_key``/``prev_value``) with its attention sinks (``sinks``: kept apart,
    :func:`keep_reachable`, or the cache's first keys) written after it into the free
    positions of the window's buffer (:func:`append_to_cache`'s ``after``): one tensor each,
    which a fused kernel reads in one call without a copy of the window (the keys' order is
    :func:`~fairseq_alibi.alibi.sinks_to_end`'s). Written at every step, above the buffer's
    fill mark, which no other copy of the cache reads (:func:`_own_room`); ``None`` where the
    window is not such a view (while autograd records)."""
    joined = []
    for name, sink in zip(("key", "value"), sinks):
        room, held = _own_room(saved, name), sink.size(2)
        if room is None or room._alibi_filled + held > room.size(2):
            return None
        room.narrow(2, room._alibi_filled, held).copy_(sink)
        joined.append(room.narrow(2, room._alibi_filled - window, window + held))
    return joined[0], joined[1]


def trim_cache(saved: Dict[str, Optional[Tensor]], name: str, reach: int) -> None:
    """Keep only the last ``reach`` positions of ``saved["prev_<name>"]`` (a call's slope
    windows let no later query read further back: :func:`.windowed.decoding_reach`): a
    narrower view of the cache's own buffer, else (a tensor of the call's own: a prompt, a
    concatenation) a copy of those positions into a new buffer with ``reach`` spare ones, so
    that the rest is freed. While autograd records, a slice of the concatenation."""
    view = saved[f"prev_{name}"]
    if view.size(2) <= reach:
        return
    kept = view[:, :, view.size(2) - reach:]
    if _own_room(saved, name) is not None or (torch.is_grad_enabled() and view.requires_grad):
        saved[f"prev_{name}"] = kept
    else:
        _fresh_room(saved, name, kept, max(16, reach))


def set_attention_backend(model: torch.nn.Module, attention: str) -> torch.nn.Module:
    """Switch every ALiBi attention layer of ``model`` to backend ``attention``; returns it.

    The same as building the model with ``--alibi-attention`` (or loading it with
    ``--model-overrides "{'alibi_attention': ...}"``), for a model already in memory.
    """
    check_attention_backend(attention)
    for module in model.modules():
        # the ALiBi self-attention and the cross-attention of modules/cross_position.py
        if isinstance(module, MultiheadAttention) and hasattr(module, "attention_backend"):
            module.attention_backend = attention
    return model
