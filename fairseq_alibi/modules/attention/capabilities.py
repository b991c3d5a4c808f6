"""What an attention backend serves, declared once beside it, and the one check of a call.

Each backend module declares ``CAPABILITIES``, a :class:`Capabilities` (the way llm-foundry's
registry entries carry what each implementation supports); :meth:`Capabilities.refusal` is the
one place that compares a call (``dispatch.Call``) with such a declaration and says why a
backend cannot serve it. ``auto`` never picks a backend that refuses, and a backend named by
``--alibi-attention`` that refuses is the dispatch's one error (``dispatch.resolve``).

A new limit of a backend is a field here (its default: served), its value in that backend's
declaration, and, if a call must carry something new to be judged, a field of ``dispatch.Call``.
"""

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch

#: what a bias of each ``AttentionBias`` kind is, in a refusal
KIND_NAMES = {
    "distance": "ALiBi bias of slopes",
    "rows": "dense bias of its own per batch row (what --alibi-length-scale's per-sequence "
            "slopes make, or a translation decoder's --cross-alibi position bias)",
}


def _nothing_missing() -> Optional[str]:
    return None


def _names(values, joiner=" and ") -> str:
    return joiner.join(str(v).replace("torch.", "") for v in values)


@dataclass(frozen=True)
class Capabilities:
    """What one backend serves; ``None`` for a tuple means "any".

    ``kinds``: the ``AttentionBias`` kinds it reads (``distance``: the slopes; ``rows``: a
    dense per-row bias); ``variants``, ``devices``, ``dtypes``; ``kv_cache``: fewer queries
    than keys (a decoding step); ``padded_kv_cache``: key padding together with a KV cache;
    ``dropout``: attention dropout; ``attn_mask``: fairseq's extra ``(T, S)`` mask;
    ``global_tokens``: ``--alibi-global-tokens``; ``scale_grad``: the gradient of learned slope
    scales; ``no_backward_on``: devices where it runs forward only; ``missing``: why it cannot
    run in this installation (``None``: it can), asked at each check (so a test can pretend),
    after the call's own limits; ``windows``: slope windows (``--alibi-window-cutoff``: the keys
    beyond each head's window dropped). ``windows`` alone defaults to *not* served: a backend
    that computes the plain bias from the slopes would silently ignore the windows, so only one
    that drops those keys declares it (``sdpa``/``naive``'s dense bias, ``windowed``, ``flex``'s
    per-head block mask). ``sinks``, likewise: attention sinks under the windows
    (``--alibi-window-sinks``: the first keys kept beyond them), which a backend that knows
    only the windows would drop; ``sink_cache``: a KV cache that kept its sinks and dropped
    the keys after them (the keys' positions are not ``0 … S-1``). ``documents``, likewise not served by default: the backend masks the
    keys of other documents itself (``--alibi-document-mask``); for the others the dispatch
    splits a whole sequence into its documents, so only calls against a KV cache reach it.
    """

    kinds: Tuple[str, ...] = ("distance",)
    variants: Optional[Tuple[str, ...]] = None
    devices: Optional[Tuple[str, ...]] = None
    dtypes: Optional[Tuple[torch.dtype, ...]] = None
    kv_cache: bool = True
    padded_kv_cache: bool = True
    dropout: bool = True
    attn_mask: bool = True
    global_tokens: bool = True
    scale_grad: bool = True
    no_backward_on: Tuple[str, ...] = ()
    windows: bool = False
    sinks: bool = False
    sink_cache: bool = False
    documents: bool = False
    missing: Callable[[], Optional[str]] = _nothing_missing

    def limit(self, call) -> Optional[str]:
        """The first field whose limit ``call`` meets (in the order above, ``missing`` last), or
        ``None`` if it is served. Cheap, builds nothing: ``auto`` asks it at every call."""
        if call.kind not in self.kinds:
            return "kinds"
        if call.windowed and not self.windows:
            return "windows"
        if call.sinks and not self.sinks:
            return "sinks"
        if call.sink_cache and not self.sink_cache:
            return "sink_cache"
        if call.documents and not self.documents:
            return "documents"
        if call.global_tokens and not self.global_tokens:
            return "global_tokens"
        if self.devices is not None and call.device not in self.devices:
            return "devices"
        if self.variants is not None and call.variant not in self.variants:
            return "variants"
        if self.dtypes is not None and call.dtype not in self.dtypes:
            return "dtypes"
        if call.query_len != call.key_len:
            if not self.kv_cache:
                return "kv_cache"
            if call.padded and not self.padded_kv_cache:
                return "padded_kv_cache"
        if call.dropout_p > 0 and not self.dropout:
            return "dropout"
        if call.attn_mask and not self.attn_mask:
            return "attn_mask"
        if call.scale_grad and not self.scale_grad:
            return "scale_grad"
        if call.grad and call.device in self.no_backward_on:
            return "no_backward_on"
        if self.missing() is not None:  # last: the call's own limits are cheaper to read
            return "missing"
        return None

    def refusal(self, name: str, call) -> Optional[str]:
        """``None`` if backend ``name`` with these capabilities serves ``call``, else why not."""
        field = self.limit(call)
        return None if field is None else _REFUSALS[field](name, call, self)


#: why a backend refuses a call, by the field of :class:`Capabilities` that limits it
_REFUSALS = {
    "kinds": lambda name, call, caps: f"{name} takes no {KIND_NAMES.get(call.kind, call.kind)}",
    "windows": lambda name, call, caps: (
        f"{name} computes the whole ALiBi bias: it cannot drop the keys beyond the slope "
        "windows (--alibi-window-cutoff)"),
    "sinks": lambda name, call, caps: (
        f"{name} cannot keep the attention sinks (--alibi-window-sinks) beyond the slope "
        "windows"),
    "sink_cache": lambda name, call, caps: (
        f"{name} cannot read a KV cache that kept its attention sinks (--alibi-window-sinks) "
        "and dropped the keys after them"),
    "documents": lambda name, call, caps: (
        f"{name} cannot mask the keys of other documents (--alibi-document-mask) in this call "
        "(a KV cache or an extra attn_mask: only whole sequences are split into documents)"),
    "global_tokens": lambda name, call, caps: (
        f"global tokens (--alibi-global-tokens) are not part of {name}'s bias"),
    "devices": lambda name, call, caps: (
        f"{name} runs on {_names(d.upper() for d in caps.devices)} only"),
    "missing": lambda name, call, caps: caps.missing(),
    "variants": lambda name, call, caps: (
        f"{name} implements {_names(caps.variants)} only, not {call.variant}"),
    "dtypes": lambda name, call, caps: (
        f"{name} needs {_names(caps.dtypes, ' or ')} inputs, got {call.dtype}"),
    "kv_cache": lambda name, call, caps: (
        f"{name} serves no KV cache (a decoding step: fewer queries than keys)"),
    "padded_kv_cache": lambda name, call, caps: (
        f"{name} serves no key padding with a KV cache (fewer queries than keys)"),
    "dropout": lambda name, call, caps: f"{name} has no attention dropout",
    "attn_mask": lambda name, call, caps: f"{name} takes no extra attn_mask",
    "scale_grad": lambda name, call, caps: (
        f"{name} gives the slopes no gradient, so learned slope scales "
        "(--alibi-learned-scales) cannot train with it"),
    "no_backward_on": lambda name, call, caps: (
        f"{name} has no {call.device.upper()} backward in torch {torch.__version__}: train "
        f"with another backend, and pick {name} at load time for inference if it suits you"),
}
