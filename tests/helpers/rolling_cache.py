"""What the tests of the rolling KV cache share (tests/attention/test_rolling_cache.py,
tests/attention/test_window_sinks.py): a float64 layer with slope windows, the full forward of
the definition, the cache's bound, and cached decoding that records the cache."""

import torch

from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention
from fairseq_alibi.modules.bias import AlibiBias
from tests.helpers.references import reference_module_attention, reference_windowed_bias

HEADS, DIM = 4, 32
#: 4 heads, slopes 1/4 … 1/256: windows 1, 4, 16, 64 keys; 300 positions roll a buffer of
#: about 2·64 positions several times
CUTOFF, LENGTH = 0.25, 300

#: float64 throughout, but the bias is ``-m·d`` of float32 slopes (learned scales' products
#: round), and ``naive``'s softmax is float32 (fairseq's attention weights); a key dropped or
#: kept wrongly moves an output by far more (the windows' weights are ``e^-0.25`` and up)
TOL = dict(atol=1e-7, rtol=1e-6)
NAIVE_TOL = dict(atol=1e-5, rtol=1e-5)


def attention(backend, cutoff=CUTOFF, variant="causal", **options):
    """``(attn, alibi)``: float64 layer 1 of a 2-layer stack with the cutoff."""
    alibi = AlibiBias(HEADS, variant=variant, window_cutoff=cutoff, num_layers=2, **options)
    if alibi.scales is not None:
        with torch.no_grad():
            torch.manual_seed(7)
            alibi.scales.uniform_(0.5, 2.0)
    torch.manual_seed(0)
    attn = AlibiMultiheadAttention(DIM, HEADS, alibi.layer(1), attention=backend)
    for p in attn.parameters():  # every term away from zero
        torch.nn.init.normal_(p, std=0.3)
    return attn.double().eval(), alibi


def full(attn, alibi, x, kpm=None, cutoff=CUTOFF):
    """The float64 reference of the whole sequence with the same cutoff (and sinks)."""
    slopes, _ = alibi.slopes_of(1)
    bias = reference_windowed_bias(alibi.variant, slopes.detach().tolist(), None, x.size(0),
                                   cutoff, alibi.global_tokens, alibi.sinks)
    return reference_module_attention(attn, x, bias, kpm)


def bound(alibi):
    """``max_h W_h`` of layer 1, or None when some head's window is unbounded."""
    back = alibi.windows_of(1)[0]
    return None if None in back else max(back)


class Decoder:
    """Cached decoding of one layer in calls of ``sizes`` queries, recording the cache after
    each call: its length, its buffer's size."""

    def __init__(self, attn):
        self.attn, self.state, self.lengths, self.rooms = attn, {}, [], []

    def run(self, x, start, stop, kpm=None, step=1):
        outs = []
        for t in range(start, stop, step):
            chunk = x[t:min(stop, t + step)]
            pad = None if kpm is None else kpm[:, t:t + chunk.size(0)]
            outs.append(self.attn(chunk, chunk, chunk, key_padding_mask=pad,
                                  incremental_state=self.state, need_weights=False)[0])
            saved = self.attn._get_input_buffer(self.state)
            self.lengths.append(saved["prev_key"].size(2))
            room = saved.get("key_room")
            self.rooms.append(None if room is None else room.size(2))
        return torch.cat(outs)

    def reorder(self, order):
        self.attn.reorder_incremental_state(self.state, order)
