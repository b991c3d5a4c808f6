"""SHAPE (Kiyono et al., EMNLP 2021): shifted absolute positions for the stock sinusoidal side.

:class:`ShiftedPositions` wraps a stock side's ``embed_positions`` (a
``SinusoidalPositionalEmbedding``): while training, each sentence's positions are offset by a
random integer ``k_b ∈ [0, K]``, so that the model cannot rely on absolute positions and learns
from their differences; at inference the offset is 0 and the stock module answers (the same
function as without the wrapper). Learned position tables have a fixed size and are refused by
the model options instead.
"""

import torch
from fairseq import utils
from fairseq.modules.sinusoidal_positional_embedding import SinusoidalPositionalEmbedding


class ShiftedPositions(torch.nn.Module):
    """``inner`` (sinusoidal) with positions ``stock + k_b`` in training, ``k_b ~ U{0..K}``."""

    def __init__(self, inner: SinusoidalPositionalEmbedding, max_shift: int):
        super().__init__()
        if not isinstance(inner, SinusoidalPositionalEmbedding):
            raise ValueError("--position-shift shifts sinusoidal positions; learned position "
                             "embeddings have a fixed table: drop --*-learned-pos")
        self.inner, self.max_shift = inner, int(max_shift)
        self.max_positions = inner.max_positions  # what the stock encoder/decoder ask of it

    def extra_repr(self):
        return f"max_shift={self.max_shift}"

    def forward(self, input, incremental_state=None, timestep=None, positions=None):
        if not self.training or self.max_shift == 0 or incremental_state is not None:
            return self.inner(input, incremental_state, timestep, positions)
        table, pad = self.inner, self.inner.padding_idx
        bsz, seq_len = input.shape
        needed = pad + 1 + seq_len + self.max_shift
        if table.weights.size(0) < needed:  # the table the stock module would grow itself
            table.weights = SinusoidalPositionalEmbedding.get_embedding(
                needed, table.embedding_dim, pad).to(table.weights)
        real = input.ne(pad)
        shift = torch.randint(0, self.max_shift + 1, (bsz, 1), device=input.device)
        positions = utils.make_positions(input, pad) + shift * real
        return table.weights.index_select(0, positions.view(-1)).view(bsz, seq_len, -1).detach()
