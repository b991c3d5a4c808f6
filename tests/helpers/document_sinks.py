"""What the tests of attention sinks with document masks in a KV cache share
(tests/attention/test_document_sinks.py on the CPU, tests/cuda/test_cuda_decoding.py): a
layer with windows, sinks and ``eos`` document masks, a stream of rows of several documents,
the float64 full forward of the definition, and cached decoding that records the cache."""

import torch

from fairseq_alibi.alibi import document_ids
from tests.helpers.documents import EOS
from tests.helpers.references import reference_document_bias, reference_module_attention
from tests.helpers.rolling_cache import DIM, attention

SINKS = 2


#: a stream of 160 positions: documents long enough to roll a cache of reach 64 past their
#: first keys, and boundaries that open new ones inside the window and beyond it
STREAM = 160


def stream(rows=2, seed=0):
    """``(tokens, x)``: token ids with ``</s>`` at a few places per row (several documents, one
    of them longer than the cache's reach) and the layer's float64 inputs."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, 30, (rows, STREAM), generator=generator)
    for row, cuts in enumerate([(5, 20, 120, 123), (90, 91), (40,)][:rows]):
        tokens[row, list(cuts)] = EOS
    x = torch.randn(STREAM, rows, DIM, generator=generator, dtype=torch.float64)
    return tokens, x


def layer(backend):
    attn, alibi = attention(backend, window_sinks=SINKS, document_mask="eos")
    return attn, alibi


def full(attn, alibi, tokens, x, kpm=None, sinks=SINKS):
    """The float64 reference of the whole rows: each document with its own ``sinks``."""
    slopes, _ = alibi.slopes_of(1)
    ids = document_ids(tokens.eq(EOS), "eos")
    bias = reference_document_bias("causal", slopes.detach().double(), None, ids,
                                   alibi.window_cutoff, sinks)
    return reference_module_attention(attn, x, bias, kpm)


def decode(attn, alibi, tokens, x, state, start, stop, step=1, kpm=None):
    """Cached calls of ``step`` queries over ``start … stop - 1``; returns their outputs and
    the most keys the cache held after a call."""
    outs, most = [], 0
    for t in range(start, stop, step):
        end = min(stop, t + step)
        alibi.read_tokens(tokens[:, :end], EOS)
        chunk = x[t:end]
        outs.append(attn(chunk, chunk, chunk, key_padding_mask=None if kpm is None
                         else kpm[:, t:end], incremental_state=state, need_weights=False)[0])
        saved = attn._get_input_buffer(state)
        apart = saved.get("sink_key")
        most = max(most, saved["prev_key"].size(2) + (0 if apart is None else apart.size(2)))
    return torch.cat(outs), most
