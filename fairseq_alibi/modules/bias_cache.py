"""The model's shared ALiBi bias, memoised: what the models build (one per layer stack).

The layers of one forward pass ask for the same bias: the last one built is kept and handed to
each of them (never a bias sized by a maximum length), and a decoding step's row is a view of
one table. The values are exactly :func:`fairseq_alibi.alibi.alibi_bias`'s.
"""

from typing import Optional

import torch

from fairseq_alibi.modules.learned_scales import LearnedScalesAlibi


class CachedAlibiBias(LearnedScalesAlibi):
    """:class:`~fairseq_alibi.modules.learned_scales.LearnedScalesAlibi` (same arguments,
    same values) that memoises the last bias it built.

    A bias that carries a gradient (learned scales or forward slopes, while autograd records)
    is built per call and never kept: a kept one would hold a graph that a backward frees. The
    layers that share a scale row (``shared``, ``per_head``) share one bias; per-layer scales
    never keep one bias per layer alive.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # the last bias and the decoding rows' table: a dict, as nn.Module.__setattr__ is slow
        self._cache = {}
        # a decoding step's row is a view of one table (_last_query_row) unless the scales are
        # per layer or one_sided's heads look ahead
        self._steps_from_rows = self.scales is None and self.variant != "one_sided"

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self._cache.clear()
        return out

    def forward(self, query_len: int, key_len: int, dtype: torch.dtype = torch.float32,
                layer: Optional[int] = None):
        if query_len == 1 and self._steps_from_rows:  # a decoding step, first: its hot path
            return self._last_query_row(key_len, dtype)
        scales, ratio, versions = self.scales, self.future_slope_ratio, ()
        if scales is not None or isinstance(ratio, torch.nn.Parameter):  # (a decoding step's
            learned = [p for p in (scales, ratio) if isinstance(p, torch.nn.Parameter)]  # speed)
            if torch.is_grad_enabled() and any(p.requires_grad for p in learned):
                return self._build(query_len, key_len, dtype, layer)
            versions = tuple(p._version for p in learned)
        row = None if scales is None else self.scale_row(layer)
        key = (row, query_len, key_len, dtype, self.slopes.device, self.slope_scale, versions)
        cache = self._cache
        if cache.get("key") != key:
            cache["bias"] = None  # freed before the next one is built
            cache["bias"] = self._build(query_len, key_len, dtype, layer)
            cache["key"] = key
        return cache["bias"]

    def _build(self, query_len, key_len, dtype, layer):
        if query_len == 1 and self._steps_from_rows:
            return self._last_query_row(key_len, dtype)
        return super().forward(query_len, key_len, dtype, layer)

    def _last_query_row(self, key_len, dtype):
        """``(H, 1, k)``: a decoding step's row ``-m·(k-1-j)``, a view of a cached table.

        The query sits at the last position, every key behind it: the look-back bias for every
        variant but ``one_sided``. It is the last ``k`` columns of ``-m·(N-1-j)``, ``N >= k``, so
        one ``(H, N)`` table (grown by doubling) serves every step.
        """
        rows, scale = self._cache.get("rows"), self._cache.get("rows_scale")
        stale = rows is None or (rows.dtype, scale) != (dtype, self.slope_scale)
        if stale or rows.size(1) < key_len:
            size = 1 << max(10, (key_len - 1).bit_length())
            distances = torch.arange(size - 1, -1, -1, dtype=torch.float32,
                                     device=self.slopes.device)
            # float32, then cast: exactly the values of alibi_bias (a fixed scale_init included)
            rows = ((-self.head_slopes()[0])[:, None] * distances).to(dtype)
            self._cache["rows"], self._cache["rows_scale"] = rows, self.slope_scale
        return rows[:, None, rows.size(1) - key_len:]
