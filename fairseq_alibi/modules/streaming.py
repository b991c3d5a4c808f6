"""Streaming a causal ALiBi language model: consecutive ordinary forward calls continue one text.

Scoring a long text with a stride-1 sliding window (the ALiBi paper's evaluation,
``fairseq-eval-lm --context-window L-1``) runs one forward pass of ``L`` tokens per scored token.
Streaming scores each token once: the text goes through the model in chunks
``x[0:c], x[c:2c], ...`` and every ALiBi self-attention keeps the keys and values of the chunks
before (a KV cache, as in cached decoding), so the queries of chunk ``n`` see every earlier key
the cache holds. For a causal stack this is the model's own definition: the ALiBi bias depends
on ``i - j`` only and is aligned to the end of the keys, so query ``i`` of the chunk attends
with ``-m_h·(i - j)`` to each cached key ``j``, exactly as in one forward pass over the whole
text (with ``--alibi-window-cutoff``, the keys beyond each head's window are dropped either way,
so a cache that keeps only the last ``max_h W_h`` keys gives the same result; with attention
sinks, ``--alibi-window-sinks S``, it keeps the first ``S`` keys too, at their positions).

:func:`stream_states` does it for any model holding
:class:`~fairseq_alibi.modules.alibi_multihead_attention.AlibiMultiheadAttention` layers,
without changing the model: a forward pre-hook on each such attention hands it one fairseq
incremental state (the layout fairseq's generators use, so the cache is the module's own),
while the model's forward runs unchanged (no ``prev_output_tokens[:, -1:]`` slicing, which
stock incremental decoding does). The decoder's ``(c, c)`` future mask of the chunk is dropped
on the way: the chunk's keys are the cache plus the chunk, and the causal bias itself masks
every key after its query (:func:`fairseq_alibi.alibi.alibi_bias`).
"""

import contextlib
from typing import Dict, Iterator, List, Optional

import torch
from torch import Tensor

from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention

#: the one variant whose queries look back only: streaming is its definition
STREAMABLE_VARIANT = "causal"

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]


def streamed_attentions(model: torch.nn.Module) -> List[AlibiMultiheadAttention]:
    """The ALiBi self-attention layers of ``model``, checked to be streamable: at least one, all
    ``causal``. Raises ``ValueError`` naming what the model is otherwise (a stock model, an
    encoder with a bidirectional bias)."""
    attentions = [m for m in model.modules() if isinstance(m, AlibiMultiheadAttention)]
    if not attentions:
        raise ValueError(
            f"{type(model).__name__} has no ALiBi self-attention: streaming needs a causal "
            "ALiBi language model (alibi_transformer_lm or an alibi_<arch> mirror)")
    variants = sorted({m.alibi.variant for m in attentions} - {STREAMABLE_VARIANT})
    if variants:
        raise ValueError(
            f"{type(model).__name__}'s ALiBi attention is {', '.join(variants)} (queries see "
            "later keys): streaming scores causal ALiBi language models only")
    return attentions


@contextlib.contextmanager
def stream_states(model: torch.nn.Module,
                  state: Optional[IncrementalState] = None) -> Iterator[IncrementalState]:
    """Within this context every ordinary forward call of ``model`` continues the text of the
    calls before: each ALiBi self-attention appends the call's keys and values to its cache and
    the call's queries see them (see the module's docstring). Yields the incremental state that
    holds the caches (``state``, or a new dict): leave the context and enter again with a new
    one to start another text. A call that passes its own ``incremental_state`` (a generator's
    step) is left alone. The hooks are removed on exit, even on an error.

    Only causal stacks (:func:`streamed_attentions`); the cache's length is whatever the
    attention keeps (every key seen, or a rolling window with a cutoff), never read here.
    """
    attentions = streamed_attentions(model)
    state = {} if state is None else state

    def continue_the_stream(module, args, kwargs):
        if len(args) > 4:
            raise TypeError("stream_states needs the attention's incremental_state passed by "
                            "keyword, as fairseq's decoder layers pass it")
        if kwargs.get("incremental_state") is not None:
            return None
        kwargs["incremental_state"] = state
        kwargs["attn_mask"] = None  # the chunk's (c, c) future mask: the causal bias masks it
        return args, kwargs

    handles = [m.register_forward_pre_hook(continue_the_stream, with_kwargs=True)
               for m in attentions]
    try:
        yield state
    finally:
        for handle in handles:
            handle.remove()


def stream_log_probs(model, tokens: Tensor, chunk: int) -> Tensor:
    """``(B, N, V)`` log-probabilities of ``model`` (a fairseq language model) for ``tokens``
    ``(B, N)``, streamed ``chunk`` tokens per forward call under :func:`stream_states`: row ``t``
    is ``log p(x_{t+1} | x_0 … x_t)``, what one forward pass over all ``N`` tokens gives."""
    if chunk < 1:
        raise ValueError(f"the stream's chunk must be at least 1 token, got {chunk}")
    pieces = []
    with stream_states(model):
        for start in range(0, tokens.size(1), chunk):
            out = model(tokens[:, start:start + chunk])
            pieces.append(model.get_normalized_probs(out, log_probs=True))
    return torch.cat(pieces, dim=1)
