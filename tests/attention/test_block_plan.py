"""The block plan (``blocks.plan``) against the blocks of the element-wise mask it replaces:
``flex``'s own ``create_block_mask`` of the same ``mask_mod`` (every (query, key) pair
evaluated). Equal for windows, sinks and the variants' directions; with documents never
skipping a visible key."""

import pytest
import torch

from fairseq_alibi.alibi import VARIANTS, get_slopes, variant_windows
from fairseq_alibi.modules.attention import blocks, flex

pytestmark = pytest.mark.skipif(not flex.available(), reason="this torch has no flex_attention")

HEADS, BLOCK = 8, 16
#: whole sequences (a multiple of the block and not), a KV cache's few queries, one query
LENGTHS = [(96, 96), (100, 100), (20, 100), (1, 77)]


def _dense(num, indices, shape):
    """A BlockMask's ``(num, indices)`` as ``(B, H, nQ, nK)`` bools."""
    chosen = torch.arange(indices.size(-1)) < num[..., None].long()
    dense = torch.zeros(shape, dtype=torch.bool)
    return dense.scatter_(-1, indices.long(), chosen)


def _element_blocks(mask_mod, batch, query_len, key_len):
    from torch.nn.attention.flex_attention import create_block_mask

    ref = create_block_mask(mask_mod, batch, HEADS, query_len, key_len, device="cpu",
                            BLOCK_SIZE=BLOCK)
    shape = (batch or 1, HEADS, -(-query_len // BLOCK), -(-key_len // BLOCK))
    partial = _dense(ref.kv_num_blocks, ref.kv_indices, shape)
    whole = _dense(ref.full_kv_num_blocks, ref.full_kv_indices, shape)
    return partial | whole, whole


def _reach(variant, cutoff):
    if cutoff is None:
        return blocks.direction(variant, HEADS)
    slopes = get_slopes(HEADS)
    return variant_windows(slopes, cutoff, variant,
                           slopes / 2 if variant == "asymmetric" else None)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("cutoff,sinks", [(None, 0), (2.0, 0), (8.0, 0), (2.0, 4), (3.5, 6), (8.0, 40)])
def test_the_plan_reads_the_blocks_an_element_mask_would(variant, cutoff, sinks):
    reach = _reach(variant, cutoff)
    if reach is None:
        pytest.skip(f"{variant} hides no key without windows")
    for query_len, key_len in LENGTHS:
        first = key_len - query_len
        mask_mod = (flex.alibi_mask_mod(variant, HEADS, first) if cutoff is None
                    else flex.window_mask_mod(reach, first, None, sinks, variant))
        read, whole = _element_blocks(mask_mod, None, query_len, key_len)
        plan = blocks.plan(reach, query_len, key_len, BLOCK, sinks, variant)
        assert torch.equal(plan.read, read), (query_len, key_len)
        assert torch.equal(plan.whole, whole), (query_len, key_len)
        if cutoff is not None and key_len == 100:
            assert read.sum() < read.numel()  # the windows skip something here


@pytest.mark.parametrize("variant", ["causal", "symmetric", "one_sided"])
@pytest.mark.parametrize("cutoff,sinks", [(None, 0), (4.0, 0), (4.0, 3)])
def test_with_documents_the_plan_never_skips_a_visible_key(variant, cutoff, sinks):
    """Rows of several documents (one of a single document); whole blocks only where every
    element is visible. Without sinks the plan is exact."""
    torch.manual_seed(0)
    B, S = 3, 300
    starts = torch.rand(B, S) < 0.015
    starts[:, 0] = True
    starts[1, 1:] = False
    ids = starts.long().cumsum(dim=1)
    steps = torch.arange(S).expand(B, S)
    offsets = steps - torch.where(starts, steps, torch.zeros_like(steps)).cummax(dim=1).values
    reach = _reach(variant, cutoff) or ([None] * HEADS,) * 2
    for query_len in (S, 40):
        first = S - query_len
        inner = (flex.alibi_mask_mod(variant, HEADS, first) if cutoff is None
                 else flex.window_mask_mod(reach, first, None, sinks, variant, offsets))
        read, whole = _element_blocks(flex.document_mask_mod(ids, inner, first), B,
                                      query_len, S)
        plan = blocks.plan(reach, query_len, S, BLOCK, sinks, variant, ids, offsets)
        assert not (read & ~plan.read).any() and not (plan.whole & ~whole).any()
        if not sinks:
            assert torch.equal(plan.read, read) and torch.equal(plan.whole, whole)
        assert plan.read[1].sum() > plan.read[0].sum()  # one document: more blocks read


def test_the_plan_of_long_windows_is_small():
    """At 65,536 keys, 8 heads: a (1, 8, 512, 512) plan, the first head (T = 8: 16 keys back)
    reading 2 key blocks per query block, where the element mask would hold 32 Gi booleans."""
    reach = _reach("causal", 8.0)
    plan = blocks.plan(reach, 65536, 65536, 128)
    assert plan.read.shape == (1, HEADS, 512, 512)
    counts = plan.read.sum(dim=-1)
    assert counts[0, 0].max() == 2 and counts[0, 0, 0] == 1
    assert not (plan.read & plan.read.new_ones(512, 512).triu(1)).any()  # causal


def test_sinks_with_documents_need_the_offsets():
    ids = torch.zeros(1, 64, dtype=torch.long)
    with pytest.raises(ValueError, match="sinks with documents need the keys' offsets"):
        blocks.plan(_reach("causal", 8.0), 64, 64, BLOCK, 4, "causal", ids)
