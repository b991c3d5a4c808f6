"""The ALiBi bias of one layer stack: what the models build, and what each layer's attention reads.

:class:`AlibiBias` is a stack's one bias module (saved once per stack: ``<stack>.alibi.slopes``,
``.future_slope_ratio`` for ``asymmetric``, ``.scales`` for learned slope scales). Its members
are the learned scales ``s`` (:mod:`fairseq_alibi.modules.learned_scales`) and a
:class:`BiasCache`; the values are :func:`fairseq_alibi.alibi.alibi_bias`'s. A layer reads it
through its view, :meth:`AlibiBias.layer` (a :class:`LayerBias`), which is what the attention
backends are handed: an :class:`~fairseq_alibi.modules.attention.dispatch.AttentionBias`.
"""

import dataclasses
import itertools
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from fairseq_alibi.alibi import (VARIANTS, alibi_bias, distance_bias, document_alibi_bias,
                                 document_ids, document_offsets, document_starts,
                                 length_factors, sinks_to_end, variant_slopes,
                                 variant_windows, windowed_alibi_bias)
from fairseq_alibi.modules.attention import documents as documents_split
from fairseq_alibi.modules.attention.dispatch import CachedDocuments
from fairseq_alibi.modules.checkpoint_match import check_stack
from fairseq_alibi.modules.learned_scales import fixed_scale, load_scales, make_scales, scale_row
from fairseq_alibi.options import Side, StackOptions

#: how a bias built without the model's own options (a test, a benchmark) names them
_ANY_STACK = Side("alibi_", VARIANTS, "causal")


class BiasCache:
    """What a stack's layers share between calls: the last bias built (the layers of one
    forward pass ask for the same one; never one sized by a maximum length) and the table that
    a decoding step's row is a view of. A plain object: ``nn.Module.__setattr__`` is slow."""

    def __init__(self):
        self.factors_serial = 0  # never reset: a number no earlier factors had
        # the values of a stack's learned parameters as its last forward pass read them (None:
        # not yet read in this pass): an optimizer changes them between passes without a
        # version (fairseq's steps write p.data)
        self.learned_values = ()
        self.clear()

    def clear(self):
        self.key, self.bias, self.rows, self.rows_key = None, None, None, None
        self.row_slopes = None  # the table's float32 slopes, as Python numbers
        self.lengths_key, self.factors = None, None
        self.windows_key, self.windows = None, {}
        self.eos, self.documents_key, self.documents = None, None, None

    def windows_of(self, key, row, compute):
        """The slope windows of scale row ``row``, computed once while ``key`` (what every
        row's windows depend on: slope scale, cutoff, the learned parameters' state) holds:
        once per forward pass, not per layer call."""
        if self.windows_key != key:
            self.windows_key, self.windows = key, {}
        found = self.windows.get(row)
        if found is None:
            found = self.windows[row] = compute()
        return found

    def length_factors(self, key_padding_mask, batch: int, key_len: int, compute):
        """``(factors, serial)``: the sequences' length-scale factors, computed once per
        forward pass (the layers of one pass hand the same mask, kept here so its identity
        cannot be another's), and a number that names them in the bias cache's keys."""
        version = None if key_padding_mask is None else key_padding_mask._version
        key = self.lengths_key
        if key is None or key[0] is not key_padding_mask or key[1:] != (version, batch, key_len):
            self.factors = None  # freed before the next one is computed
            self.factors = compute()
            self.factors_serial += 1
            self.lengths_key = (key_padding_mask, version, batch, key_len)
        return self.factors, self.factors_serial

    def get(self, key, build):
        if self.key != key:
            self.bias = None  # freed before the next one is built
            self.bias = build()
            self.key = key
        return self.bias

    def last_query_row(self, key_len: int, dtype, slope_scale: float, slopes,
                       back=None) -> Tensor:
        """``(H, 1, k)``: a decoding step's row ``-m·(k-1-j)``, a view of a cached table.

        The query sits at the last position, every key behind it: the look-back bias of every
        variant but ``one_sided``. It is the last ``k`` columns of ``-m·(N-1-j)``, ``N >= k``, so
        one ``(H, N)`` table (grown by doubling) serves every step. ``slopes``: a function
        giving the float32 slopes when the table is (re)built; ``back``: the slope windows'
        look-back per head (a tuple, ``None`` = unbounded), or ``None`` without windows: a
        distance beyond its head's window holds :func:`~fairseq_alibi.alibi.mask_value` (a
        function of the distance, as the bias: still the last ``k`` columns).
        """
        rows, key = self.rows, (dtype, slope_scale, back)
        if rows is None or self.rows_key != key or rows.size(1) < key_len:
            m = slopes()
            size = 1 << max(10, (key_len - 1).bit_length())
            distances = torch.arange(size - 1, -1, -1, device=m.device)
            rows = distance_bias(m, distances, dtype, back)
            self.rows, self.rows_key, self.row_slopes = rows, key, m.tolist()
        return rows[:, None, rows.size(1) - key_len:]


class AlibiBias(torch.nn.Module):
    """One stack's ALiBi bias: its variant's slopes (a float32 buffer), for any length.

    ``options`` (:class:`~fairseq_alibi.options.StackOptions`, keyword ``values`` replacing its
    fields) give the variant, the asymmetric forward slopes, the learned or fixed slope scales
    ``s`` of ``num_layers`` layers, the heads that carry a bias, the global tokens and the
    run-time ``slope_scale`` (not saved). Layer ``l``'s slopes are ``slope_scale·s[l, h]·m_h``
    (:meth:`slopes_of`). ``window_cutoff`` ``T`` (0 = off): head ``h`` drops the keys beyond
    its window ``W_h = ceil(T / m_h)`` of those slopes, read detached (:meth:`windows_of`;
    the dense bias is :func:`~fairseq_alibi.alibi.windowed_alibi_bias`).
    """

    kind = "distance"

    def __init__(self, num_heads: int, options: Optional[StackOptions] = None,
                 num_layers: int = 1, **values):
        super().__init__()
        options = dataclasses.replace(options or StackOptions(), **values)
        options.check_values(_ANY_STACK, num_heads)  # combinations: the model's options check
        options.check_model_wide()
        self.options, self.variant, self.num_heads = options, options.variant, num_heads
        self.slope_scale = float(options.slope_scale)
        self.length_scale = int(options.length_scale)
        self.global_tokens = int(options.global_tokens)
        self.window_cutoff = float(options.window_cutoff)
        # attention sinks: the first keys kept beyond the windows (nothing without windows)
        self.window_sinks = int(options.window_sinks)
        options.check_documents()
        self.document_mask = str(options.document_mask)
        self.register_buffer("slopes", variant_slopes(num_heads, self.variant, options.heads))
        ratio = None
        if self.variant == "asymmetric":
            ratio = torch.full((num_heads,), float(options.future_slope_ratio))
        if ratio is not None and options.learnable_future_slopes:
            self.future_slope_ratio = torch.nn.Parameter(ratio)
        else:
            self.register_buffer("future_slope_ratio", ratio)
        self.learned_scales = str(options.learned_scales)
        self.scales = make_scales(self.learned_scales, options.scale_init, num_layers, num_heads)
        self.fixed_scale = fixed_scale(options.scale_init) if self.scales is None else None
        self._register_load_state_dict_pre_hook(_check_saved_stack, with_module=True)
        self._register_load_state_dict_pre_hook(load_scales, with_module=True)
        self.cache = BiasCache()
        self._views: Dict[int, "LayerBias"] = {}
        # a decoding step's row is a view of one table unless the scales are learned (per
        # layer, with a gradient), one_sided's heads look ahead or the first keys are global
        # (with attention sinks, :attr:`sinks`, a copy of it with the sinks' true bias)
        self._steps_from_rows = (self.scales is None and self.variant != "one_sided"
                                 and not self.global_tokens)

    @property
    def sinks(self) -> int:
        """The attention sinks kept beyond the slope windows: ``window_sinks``, 0 without a
        cutoff (nothing to keep them beyond)."""
        return self.window_sinks if self.window_cutoff else 0

    def extra_repr(self):
        return (f"variant={self.variant}, num_heads={self.num_heads}, "
                f"learned_scales={self.learned_scales}, slope_scale={self.slope_scale}, "
                f"length_scale={self.length_scale}, global_tokens={self.global_tokens}, "
                f"window_cutoff={self.window_cutoff}, window_sinks={self.window_sinks}, "
                f"document_mask={self.document_mask}")

    def read_tokens(self, tokens: Tensor, eos: int):
        """Before a forward pass of the stack: where its ``tokens`` ``(B, N)`` hold ``</s>``
        (``eos``), from which each call's documents are found (:meth:`documents_of`); nothing
        without a document mask."""
        if self._learned():  # read when first asked this pass (:meth:`_learned_state`)
            self.cache.learned_values = None
        if self.document_mask != "none":
            self.cache.eos = tokens.eq(eos)

    def documents_of(self, batch: int, query_len: int, key_len: int,
                     cached: Optional["CachedDocuments"] = None) -> "Documents":
        """The :class:`Documents` of a call whose queries are the last ``query_len`` tokens
        the stack read (:meth:`read_tokens`), after ``key_len - query_len`` cached keys whose
        documents are ``cached`` (a KV cache's :class:`CachedDocuments`), numbered on from the
        cache's last document
        (:func:`~fairseq_alibi.alibi.document_ids`); with attention sinks (:attr:`sinks`) each
        key's place in its document too (:func:`~fairseq_alibi.alibi.document_offsets`)."""
        eos = self.cache.eos
        if eos is None or eos.size(0) != batch or eos.size(1) < query_len:
            raise ValueError(
                "--alibi-document-mask finds documents in the tokens of the stack's forward "
                "pass: run the model's encoder or decoder, not one of its layers on its own")
        eos = eos[:, eos.size(1) - query_len:]
        cached_len = 0 if cached is None else cached.ids.size(1)
        if cached_len != key_len - query_len:
            raise ValueError(f"the KV cache holds {key_len - query_len} keys but the documents "
                             f"of {cached_len}: a cache must be trimmed with its documents")
        # once per forward pass, not per layer: kept with its tokens (every layer's KV cache
        # holds the same keys' documents: the same tokens, trimmed and reordered alike)
        key = (self.cache.eos, query_len, cached_len)
        memo = self.cache.documents_key
        if memo is None or memo[0] is not key[0] or memo[1:] != key[1:]:
            if cached is None:
                ids = document_ids(eos, self.document_mask)
                offsets = None
                if self.sinks:
                    offsets = document_offsets(document_starts(eos, self.document_mask))
            else:
                ids = torch.cat([cached.ids, document_ids(
                    eos, self.document_mask, cached.last_eos, cached.ids[:, -1:])], dim=1)
                offsets = None
                if self.sinks:
                    starts = document_starts(eos, self.document_mask, cached.last_eos)
                    offsets = torch.cat([cached.offsets, document_offsets(
                        starts, cached.offsets[:, -1:])], dim=1)
            found = Documents(ids, eos[:, -1:], offsets)
            self.cache.documents, self.cache.documents_key = found, key
        return self.cache.documents

    def _apply(self, fn, *args, **kwargs):
        # model.half() / .bfloat16() must not round the slopes: the bias is built in float32
        exact = self.slopes.float()
        out = super()._apply(fn, *args, **kwargs)
        self.slopes = exact.to(self.slopes.device)
        self.cache.clear()
        return out

    def layer(self, index: int) -> "LayerBias":
        """Layer ``index``'s view of this bias (what its attention hands the backends)."""
        view = self._views.get(index)
        if view is None:
            view = self._views[index] = LayerBias(self, index)
        return view

    @property
    def scales_need_grad(self) -> bool:
        """Whether the learned slope scales need their gradient now."""
        return torch.is_grad_enabled() and self.scales is not None and self.scales.requires_grad

    def _learned(self):
        return [p for p in (self.scales, self.future_slope_ratio)
                if isinstance(p, torch.nn.Parameter)]

    def _learned_state(self) -> tuple:
        """What says the learned parameters are unchanged: their versions (an in-place
        change through autograd) and their values, read once per forward pass where first
        asked (:meth:`read_tokens`: an optimizer step writes ``p.data``, which no version
        counts). Values, not the pass: a scoring run's passes share what they memoise."""
        learned = self._learned()
        if not learned:
            return (), ()
        if self.cache.learned_values is None:  # a few numbers; a GPU syncs once, where asked
            self.cache.learned_values = tuple(
                torch.cat([p.detach().reshape(-1) for p in learned]).tolist())
        return tuple(p._version for p in learned), self.cache.learned_values

    def slopes_of(self, layer: Optional[int] = None) -> Tuple[Tensor, Optional[Tensor]]:
        """``(slopes, future_slopes)``, float32 ``(H,)``: ``slope_scale·s[layer]·m`` and
        ``ratio·`` that (``None`` but for ``asymmetric``), with the gradients of ``s``/ratio."""
        slopes = self.slopes.float() * self.slope_scale
        if self.scales is not None:
            slopes = slopes * self.scales[scale_row(self.scales, layer)].float()
        elif self.fixed_scale is not None:
            slopes = slopes * self.fixed_scale
        ratio = self.future_slope_ratio
        return slopes, None if ratio is None else slopes * ratio.float()

    def bias(self, query_len: int, key_len: int, dtype=torch.float32,
             layer: Optional[int] = None, dropped: int = 0, sinks_last: bool = False) -> Tensor:
        """The ``(H, query_len, key_len)`` bias of layer ``layer`` (queries aligned to the end of
        the keys; ``dropped``: the positions a KV cache dropped after its sinks; ``sinks_last``:
        its keys in the order the cache reads them in one buffer, the window's, then the
        sinks', :func:`~fairseq_alibi.alibi.sinks_to_end`), memoised: the layers that share a
        scale row share one tensor. A bias that carries a gradient is built per call and never
        kept (a kept one would hold a graph that a backward frees)."""
        if query_len == 1 and self._steps_from_rows:  # hot path: a view of one table
            back = tuple(self.windows_of()[0]) if self.window_cutoff else None
            row = self.cache.last_query_row(key_len, dtype, self.slope_scale,
                                            lambda: self.slopes_of()[0], back)
            if not self.sinks:
                return row
            # the sinks' copy once per step, shared by the layers; no learned parameters
            # here, so the table's own key says what the slopes are
            key = ("sinks", dropped, sinks_last, key_len, self.cache.rows_key, self.sinks)
            return self.cache.get(key, lambda: self._sinks_kept(row, dropped, sinks_last))

        def build():
            built = self._build(query_len, key_len, dtype, layer, dropped)
            return sinks_to_end(built, self.sinks) if sinks_last else built

        tag = ("dropped", dropped, sinks_last) if dropped or sinks_last else None
        return self.memoised(tag, query_len, key_len, dtype, layer, build)

    def _sinks_kept(self, row: Tensor, dropped: int, last: bool = False) -> Tensor:
        """A decoding step's ``row`` ``(H, 1, k)`` (every key beyond its head's window masked)
        with its first :attr:`sinks` keys at their true bias ``-m·(k - 1 + dropped - j)``
        (:func:`~fairseq_alibi.alibi.kept_positions`: the keys after them lie ``dropped``
        positions further on), as :func:`~fairseq_alibi.alibi.windowed_alibi_bias` gives them:
        a copy, unless no key was dropped and every sink is within every window. ``last``: the
        sinks' bias after the window's (:func:`~fairseq_alibi.alibi.sinks_to_end`), in one
        copy."""
        key_len = row.size(-1)
        sinks = min(self.sinks, key_len)
        if not last and not dropped:
            bounded = [w for w in self.windows_of()[0] if w is not None]  # None: unbiased
            if not bounded or key_len - 1 <= min(bounded):
                return row
        top = key_len - 1 + dropped
        if row.device.type == "cpu":
            # distance_bias's float32 -m·d in Python, a few numbers, where a step's torch calls
            # cost more than its extra keys: m·d is exact in a double, so its rounding to
            # float32 is the float32 product's for every d that float32 holds (d <= 2^24)
            held = torch.tensor([[m * (j - top) for j in range(sinks)]
                                 for m in self.cache.row_slopes], dtype=torch.float32)
        else:  # on the device: a tensor of host numbers would wait for the queued work
            m = self.slopes_of()[0]
            held = distance_bias(m, torch.arange(top, top - sinks, -1, device=m.device))
        held = held.to(row.dtype)[:, None]
        if last:
            return torch.cat([row[..., sinks:], held], dim=-1)
        row = row.clone()
        row[..., :sinks] = held
        return row

    def memoised(self, tag, query_len: int, key_len: int, dtype, layer: Optional[int], build):
        """``build()``, kept in the cache under ``tag`` and what the bias of ``layer`` depends
        on (its scale row, the sizes, dtype, device, slope scale, the learned parameters'
        state, :meth:`_learned_state`), so that the layers of one pass that share a scale row
        build it once; with a gradient to carry, built per call and never kept."""
        learned = self._learned()
        if torch.is_grad_enabled() and any(p.requires_grad for p in learned):
            return build()
        row = None if self.scales is None else scale_row(self.scales, layer)
        key = (tag, row, query_len, key_len, dtype, self.slopes.device, self.slope_scale,
               self.window_cutoff, self.window_sinks, self._learned_state())
        return self.cache.get(key, build)

    def windows_of(self, layer: Optional[int] = None):
        """``(back, ahead)``: the slope windows of layer ``layer``
        (:func:`~fairseq_alibi.alibi.variant_windows` of its detached slopes and
        ``window_cutoff``), computed once per scale row while the slopes stay the same (the
        learned parameters' state is in the key, :meth:`_learned_state`); ``None`` when the
        cutoff is off."""
        if not self.window_cutoff:
            return None
        row = None if self.scales is None else scale_row(self.scales, layer)
        key = (self.slope_scale, self.window_cutoff, self.slopes.device, self._learned_state())

        def compute():
            with torch.no_grad():
                slopes, future = self.slopes_of(layer)
            return variant_windows(slopes, self.window_cutoff, self.variant, future)

        return self.cache.windows_of(key, row, compute)

    def _build(self, query_len, key_len, dtype, layer, dropped=0):
        return self.bias_of(self.slopes_of(layer), query_len, key_len, dtype, dropped)

    def bias_of(self, slopes, query_len, key_len, dtype, dropped=0):
        """The dense ``(H, query_len, key_len)`` bias of ``slopes`` ``(slopes, future_slopes)``:
        :func:`~fairseq_alibi.alibi.alibi_bias`, or with a cutoff
        :func:`~fairseq_alibi.alibi.windowed_alibi_bias` (windows of these slopes, the sinks;
        ``dropped``: the positions a KV cache dropped after its sinks)."""
        slopes, future = slopes
        if self.window_cutoff:
            return windowed_alibi_bias(slopes, query_len, key_len, self.variant, future, dtype,
                                       self.global_tokens, self.window_cutoff, self.sinks,
                                       dropped)
        return alibi_bias(slopes, query_len, key_len, self.variant, future, dtype,
                          self.global_tokens)

    def forward(self, query_len: int, key_len: int, dtype=torch.float32,
                layer: Optional[int] = None) -> Tensor:
        return self.bias(query_len, key_len, dtype, layer)


def _check_saved_stack(module, state_dict, prefix, *args):
    """A load hook: the checkpoint's stack must be this module's in what its tensors show
    (heads, heads with a bias, one_sided's or asymmetric's slopes, learned scales' shape:
    :func:`~fairseq_alibi.modules.checkpoint_match.check_stack`). The values of the slopes are
    the checkpoint's (a saved buffer, so slopes set by hand stay as saved). Models check first,
    naming their own flags (:func:`fairseq_alibi.models.checks.check_saved_stacks`): this catches
    the bias loaded on its own."""
    check_stack(state_dict, prefix, module)


class LayerBias:
    """Layer ``index``'s view of its stack's :class:`AlibiBias`: what its attention holds (an
    :class:`~fairseq_alibi.modules.attention.dispatch.AttentionBias`) and, for every call but
    the length-scaled ones, the call's bias itself (a
    :class:`~fairseq_alibi.modules.attention.dispatch.DistanceBias`, with that layer's slopes).
    Not a module: the state stays in the stack's bias."""

    kind = "distance"
    documents = None  # a call with a document mask is a DocumentBias
    dropped = 0  # a KV cache's call after it dropped keys is a SinkCacheBias

    def __init__(self, stack: AlibiBias, index: int):
        self.stack, self.index = stack, index
        self.variant, self.num_heads = stack.variant, stack.num_heads
        self.global_tokens = stack.global_tokens
        self.length_scale = stack.length_scale

    @property
    def windowed(self) -> bool:
        return bool(self.stack.window_cutoff)

    @property
    def sinks(self) -> int:
        return self.stack.sinks

    def windows(self):
        return self.stack.windows_of(self.index)

    @property
    def scales_need_grad(self) -> bool:
        return self.stack.scales_need_grad

    @property
    def per_layer(self) -> bool:
        """Whether this layer's slopes are its own (learned scales with a row per layer)."""
        scales = self.stack.scales
        return scales is not None and scales.size(0) > 1

    def head_slopes(self) -> Tuple[Tensor, Optional[Tensor]]:
        return self.stack.slopes_of(self.index)

    def dense(self, query_len: int, key_len: int, dtype=torch.float32) -> Tensor:
        return self.stack.bias(query_len, key_len, dtype, self.index)

    def with_sinks_last(self) -> "SinkCacheBias":
        """This bias for a KV cache's keys read as one buffer, the keys after the attention
        sinks before the sinks' (:func:`~fairseq_alibi.alibi.sinks_to_end`), before the cache
        drops any key."""
        return SinkCacheBias(self, 0, True)

    def for_call(self, key_padding_mask: Optional[Tensor], batch: int, query_len: int,
                 key_len: int, incremental: bool,
                 cached_documents: Optional["CachedDocuments"] = None, dropped: int = 0):
        """This call's bias: this view, or, with the stack's ``length_scale`` N and a whole
        sequence (not ``incremental``) of more than N real tokens, a :class:`LengthScaledBias`
        (each sequence's slopes times :func:`~fairseq_alibi.alibi.length_factors` of its real
        length, which ``key_padding_mask`` gives); with a document mask, that bias and the
        call's documents (a :class:`DocumentBias`; ``cached_documents``: a KV cache's,
        :class:`CachedDocuments`; ``dropped``:
        the cache holds its document's sinks apart); a KV cache that kept its attention sinks
        and dropped ``dropped`` positions after them, a :class:`SinkCacheBias`."""
        if self.stack.document_mask != "none":  # (never with a length scale: options check)
            return DocumentBias(self, self.stack.documents_of(batch, query_len, key_len,
                                                              cached_documents), dropped)
        if dropped:  # (never with a length scale: options check)
            return SinkCacheBias(self, dropped)
        reference = self.length_scale
        if incremental or not reference or key_len <= reference:  # the hot path: no work
            return self

        def compute():
            if key_padding_mask is None:
                lengths = torch.full((batch,), key_len, device=self.stack.slopes.device)
            else:
                lengths = key_len - key_padding_mask.to(torch.bool).sum(dim=1)
            factors = length_factors(lengths, reference)
            return None if bool((factors == 1).all()) else factors

        factors, serial = self.stack.cache.length_factors(key_padding_mask, batch, key_len,
                                                          compute)
        return self if factors is None else LengthScaledBias(self, factors, serial)


class LengthScaledBias:
    """A layer's bias with slopes of its own per sequence (``--alibi-length-scale``): a
    :class:`~fairseq_alibi.modules.attention.dispatch.CallBias` of kind ``rows``, a
    ``(B, H, T, S)`` tensor, which the dense backends (``sdpa``, ``naive``) take. Built from
    :func:`~fairseq_alibi.alibi.alibi_bias` with each distinct factor's slopes (masked keys stay
    masked; with a cutoff, the windows of those scaled slopes: the dense windowed rows), once
    per forward pass for the layers that share a scale row (:meth:`AlibiBias.memoised`, keyed
    on the factors' ``serial``)."""

    kind = "rows"
    documents = None
    dropped = 0

    def __init__(self, layer: LayerBias, factors: Tensor, serial: int):
        self.stack, self.index = layer.stack, layer.index
        self.variant, self.num_heads = layer.variant, layer.num_heads
        self.global_tokens = layer.global_tokens
        self.sinks = layer.sinks
        self.factors, self.serial = factors, serial

    @property
    def scales_need_grad(self) -> bool:
        return self.stack.scales_need_grad

    @property
    def windowed(self) -> bool:
        return bool(self.stack.window_cutoff)

    def dense(self, query_len: int, key_len: int, dtype=torch.float32) -> Tensor:
        return self.stack.memoised(("lengths", self.serial), query_len, key_len, dtype,
                                   self.index, lambda: self._build(query_len, key_len, dtype))

    def _build(self, query_len, key_len, dtype):
        slopes, future = self.stack.slopes_of(self.index)
        distinct, row_of = torch.unique(self.factors, return_inverse=True)
        tables = torch.stack([
            self.stack.bias_of((slopes * f, None if future is None else future * f), query_len,
                               key_len, dtype)
            for f in distinct.tolist()])
        return tables.index_select(0, row_of)


class Documents:
    """One call's documents (``--alibi-document-mask``): ``ids`` ``(B, S)``, the document of
    each key (the queries are the last ``T`` keys), ``last_eos`` ``(B, 1)``, whether the
    last position holds ``</s>`` (what a KV cache's next call continues from), and, with
    attention sinks, ``offsets`` ``(B, S)``, each key's place in its document
    (:func:`~fairseq_alibi.alibi.document_offsets`; else ``None``). ``crossing``: whether the
    call is not the plain one: some row holds more than one document, or (with offsets) a
    row's keys are not its document's positions ``0 … S-1`` (the plain sinks are a row's
    first keys)."""

    __slots__ = ("ids", "last_eos", "offsets", "crossing", "serial", "_layout")

    #: numbers the calls' documents (a memoised bias's key: never an earlier call's)
    _serials = itertools.count(1)

    def __init__(self, ids: Tensor, last_eos: Tensor, offsets: Optional[Tensor] = None):
        self.ids, self.last_eos, self.offsets = ids, last_eos, offsets
        self.crossing = bool((ids[:, 0] != ids[:, -1]).any()) if ids.numel() else False
        if offsets is not None and not self.crossing and ids.numel():
            in_order = torch.arange(ids.size(1), device=offsets.device)
            self.crossing = bool((offsets != in_order).any())
        self.serial = next(Documents._serials)
        self._layout = None

    def layout(self) -> documents_split.Layout:
        """How a whole sequence of these documents is cut into them
        (:func:`~fairseq_alibi.modules.attention.documents.layout`): computed by the first
        layer that splits them, read by the others (the same object for every layer of a
        pass: :meth:`AlibiBias.documents_of`)."""
        if self._layout is None:
            self._layout = documents_split.layout(self.ids)
        return self._layout


class DocumentBias:
    """A call's bias with its :class:`Documents`: the ``DistanceBias`` ``base`` (every
    attribute read through) and ``documents``, which the backends that read documents mask
    (``Capabilities.documents``) and the dispatch otherwise splits into sequences. With
    attention sinks its dense tensor is :func:`~fairseq_alibi.alibi.document_alibi_bias`
    (each document's first positions kept), ``(B, H, T, S)`` with the documents masked;
    ``dropped``: a KV cache that holds its document's sinks apart from its window (their
    keys are not in order: ``Capabilities.sink_cache``)."""

    def __init__(self, base, documents: Documents, dropped: int = 0):
        self.base, self.documents, self.dropped = base, documents, dropped

    def __getattr__(self, name):
        return getattr(self.base, name)

    @property
    def dense_masks_documents(self) -> bool:
        """Whether :meth:`dense` holds the documents' mask already (with attention sinks, the
        bias of the offsets), which a backend then need not apply again."""
        return self.documents.offsets is not None and self.documents.crossing

    def dense(self, query_len: int, key_len: int, dtype=torch.float32) -> Tensor:
        documents = self.documents
        if documents.offsets is None or not documents.crossing:
            return self.base.dense(query_len, key_len, dtype)
        stack, index = self.base.stack, self.base.index

        def build():
            slopes, future = stack.slopes_of(index)
            return document_alibi_bias(slopes, documents.ids, documents.offsets, query_len,
                                       stack.variant, future, dtype, stack.windows_of(index),
                                       stack.sinks)

        return stack.memoised(("documents", documents.serial), query_len, key_len, dtype,
                              index, build)


class SinkCacheBias(LayerBias):
    """A layer's bias for a call against a KV cache that kept its attention sinks
    (``--alibi-window-sinks``) and dropped ``dropped`` positions after them: the keys are at
    :func:`~fairseq_alibi.alibi.kept_positions`, not ``0 … S-1`` (``sinks_last``: read in
    :func:`~fairseq_alibi.alibi.sinks_to_end`'s order, with ``dropped`` 0 too). The
    :class:`LayerBias` ``base`` (its state copied, not read through ``__getattr__``: every
    layer of a decoding step reads a dozen of its attributes) with that bias as its dense
    tensor, which ``sdpa``, ``naive`` and ``windowed`` read (``Capabilities.sink_cache``)."""

    def __init__(self, base: LayerBias, dropped: int, sinks_last: bool = False):
        self.__dict__.update(base.__dict__)
        self.base, self.dropped, self.sinks_last = base, dropped, sinks_last

    def dense(self, query_len: int, key_len: int, dtype=torch.float32) -> Tensor:
        return self.base.stack.bias(query_len, key_len, dtype, self.base.index, self.dropped,
                                    self.sinks_last)

    def with_sinks_last(self) -> "SinkCacheBias":
        """This bias for the cache's keys read as one buffer, the window's before the sinks'
        (:func:`~fairseq_alibi.alibi.sinks_to_end`)."""
        return SinkCacheBias(self.base, self.dropped, True)

