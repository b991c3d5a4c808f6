"""Document masks (``--alibi-document-mask``) against the float64 definition: every document of a
packed row attended as its own sequence. Every backend that serves the call (split into
documents by the dispatch, or masked in the call: ``sdpa``, ``naive``, ``flex``), every variant,
with and without slope windows (and their attention sinks: each document's first positions)
and key padding, forward and backward (the slopes' gradient
through learned scales); the plan of the split; a batch with no boundary runs the plain call."""

import pytest
import torch

from fairseq_alibi.alibi import document_ids, document_starts
from fairseq_alibi.modules.attention import attend, dispatch, documents, tuning
from fairseq_alibi.modules.attention.dispatch import CachedDocuments
from fairseq_alibi.modules.bias import AlibiBias
from tests.helpers.documents import CUTOFF, EOS, LENGTHS, packed_tokens
from tests.helpers.references import reference_document_attention

H, D = 4, 8


def inputs(B, L, seed=0, grad=False):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=generator, dtype=torch.float64)
               for _ in range(3))
    return [x.float().requires_grad_(grad) for x in (q, k, v)]


def call_bias(variant, tokens, cutoff=0.0, key_padding_mask=None, mode="eos", **options):
    bias = AlibiBias(H, variant=variant, window_cutoff=cutoff, document_mask=mode, **options)
    bias.read_tokens(tokens, EOS)
    B, L = tokens.shape
    return bias, bias.layer(0).for_call(key_padding_mask, B, L, L, False)


VARIANTS = ["causal", "symmetric", "one_sided", "offset", "asymmetric"]
BACKENDS = ["auto", "fold", "windowed", "sdpa", "naive"]
#: (cutoff, attention sinks: each document's first positions, test_document_sinks.py)
WINDOWS = [(0.0, 0), (CUTOFF, 0), (CUTOFF, 2)]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("cutoff,sinks", WINDOWS)
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("name", BACKENDS)
def test_every_backend_attends_each_document_as_its_own_sequence(variant, cutoff, sinks, padded,
                                                                 name):
    tokens = packed_tokens(LENGTHS)
    B, L = tokens.shape
    pad = None
    if padded:  # the second row ends in padding (part of its last document)
        pad = torch.zeros(B, L, dtype=torch.bool)
        pad[1, -7:] = True
    bias, call = call_bias(variant, tokens, cutoff, pad, learned_scales="per_head",
                           window_sinks=sinks)
    q, k, v = inputs(B, L, grad=True)
    slopes, future = call.head_slopes()
    ids = call.documents.ids
    expected = reference_document_attention(q, k, v, ids, variant, slopes.double(),
                                            None if future is None else future.double(),
                                            cutoff, pad, sinks)
    if name != "auto" and not dispatch.serves(name, dispatch.call_of(q, k, v, call.base, pad)):
        with pytest.raises(ValueError, match=f"--alibi-attention {name} cannot serve"):
            attend(name, q, k, v, call, pad)  # each document is a call it refuses (windows)
        return
    out = attend(name, q, k, v, call, pad)
    real = torch.ones(B, L, dtype=torch.bool) if pad is None else ~pad
    torch.testing.assert_close(out.double()[real.nonzero(as_tuple=True)[0], :,
                                            real.nonzero(as_tuple=True)[1]],
                               expected[real.nonzero(as_tuple=True)[0], :,
                                        real.nonzero(as_tuple=True)[1]],
                               rtol=1e-4, atol=1e-5)
    weights = torch.randn(B, H, L, D, dtype=torch.float64) * real[:, None, :, None]
    grads = torch.autograd.grad((out.double() * weights).sum(), [q, k, v, bias.scales])
    wanted = torch.autograd.grad((expected * weights).sum(), [q, k, v, bias.scales])
    for got, want in zip(grads, wanted):
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("variant", ["causal", "symmetric", "one_sided"])
@pytest.mark.parametrize("cutoff,sinks", WINDOWS)
def test_flex_masks_the_documents_itself_on_the_cpu(variant, cutoff, sinks):
    pytest.importorskip("torch.nn.attention.flex_attention")
    tokens = packed_tokens(LENGTHS)
    B, L = tokens.shape
    _, call = call_bias(variant, tokens, cutoff, window_sinks=sinks)
    q, k, v = inputs(B, L)
    slopes, future = call.head_slopes()
    expected = reference_document_attention(q, k, v, call.documents.ids, variant,
                                            slopes.double(), future, cutoff, sinks=sinks)
    with torch.no_grad():
        out = attend("flex", q, k, v, call)
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant", ["causal", "symmetric"])
@pytest.mark.parametrize("cutoff,sinks", WINDOWS)
def test_flex_skips_the_blocks_of_other_documents_exactly(variant, cutoff, sinks):
    """Rows of several blocks of 128 (documents of 30-200 tokens; a row of one document): the
    block plan skips whole blocks of other documents, and the output is the definition's."""
    from fairseq_alibi.modules.attention import blocks

    pytest.importorskip("torch.nn.attention.flex_attention")
    tokens = packed_tokens([[130, 40, 200, 30], [400]])
    B, L = tokens.shape
    _, call = call_bias(variant, tokens, cutoff, window_sinks=sinks)
    q, k, v = inputs(B, L)
    slopes, future = call.head_slopes()
    ids = call.documents.ids
    expected = reference_document_attention(q, k, v, ids, variant, slopes.double(), future,
                                            cutoff, sinks=sinks)
    with torch.no_grad():
        out = attend("flex", q, k, v, call)
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)
    reach = ([None] * H, [None] * H)
    plan = blocks.plan(reach, L, L, documents=ids, variant=variant)
    assert plan.read[0].sum() < plan.read[1].sum() == plan.read[1].numel()


def test_flex_builds_a_passs_document_block_mask_once():
    """The layers of one forward pass share their documents: flex's block mask is built for
    the first and kept for the others; the next pass's documents get their own."""
    from fairseq_alibi.modules.attention import flex

    pytest.importorskip("torch.nn.attention.flex_attention")
    tokens = packed_tokens([[130, 40, 200, 30], [400]])
    B, L = tokens.shape
    bias, call = call_bias("causal", tokens, CUTOFF)
    q, k, v = inputs(B, L)
    with torch.no_grad():
        attend("flex", q, k, v, call)
        first = list(flex._DOCUMENT_MASKS.values())
        attend("flex", q, k, v, bias.layer(1).for_call(None, B, L, L, False))
        assert list(flex._DOCUMENT_MASKS.values()) == first and len(first) == 1
        bias.read_tokens(tokens, EOS)  # the next pass
        attend("flex", q, k, v, bias.layer(0).for_call(None, B, L, L, False))
    assert len(flex._DOCUMENT_MASKS) == 1
    assert list(flex._DOCUMENT_MASKS.values())[0] is not first[0]


@pytest.mark.parametrize("sinks", [0, 2])
def test_a_batch_without_a_boundary_is_the_plain_call_bit_for_bit(sinks):
    tokens = packed_tokens([[40], [40]])
    B, L = tokens.shape
    _, with_mask = call_bias("causal", tokens, CUTOFF, window_sinks=sinks)
    plain = AlibiBias(H, variant="causal", window_cutoff=CUTOFF, window_sinks=sinks).layer(
        0).for_call(None, B, L, L, False)
    assert not with_mask.documents.crossing
    q, k, v = inputs(B, L)
    for name in ("auto", "windowed", "sdpa", "naive"):
        assert torch.equal(attend(name, q, k, v, with_mask), attend(name, q, k, v, plain)), name


def test_document_ids_follow_each_mode_and_number_on_from_a_cache():
    eos = torch.tensor([[0, 1, 0, 1, 1, 0, 0, 1]], dtype=torch.bool)
    assert document_ids(eos, "eos").tolist() == [[0, 1, 1, 2, 3, 3, 3, 4]]
    # doc: only an </s> right after an </s> (the empty line) opens a document
    assert document_ids(eos, "doc").tolist() == [[0, 0, 0, 0, 1, 1, 1, 1]]
    # split after position 3: the second part numbers on from the first's last id and token
    first, rest = eos[:, :4], eos[:, 4:]
    head = document_ids(first, "doc")
    tail = document_ids(rest, "doc", first[:, -1:], head[:, -1:])
    assert torch.cat([head, tail], 1).tolist() == document_ids(eos, "doc").tolist()
    assert document_starts(rest, "doc", first[:, -1:]).tolist() == [[1, 0, 0, 0]]
    with pytest.raises(ValueError, match="--alibi-document-mask"):
        document_starts(eos, "lines")


def test_the_plan_covers_every_position_once_in_few_buckets():
    lengths = [[3, 70, 1, 900, 50], [1024], [600, 424]]
    tokens = packed_tokens(lengths)
    ids = document_ids(tokens.eq(EOS), "eos")
    buckets = documents.plan(ids)
    seen = torch.zeros(tokens.shape, dtype=torch.int64)
    for bucket in buckets:
        assert bucket.positions.shape[1] == bucket.length
        for row, positions, slots in zip(bucket.rows, bucket.positions, bucket.slots):
            seen[row, positions[slots]] += 1
            # a bucket is at most 1/8 longer than its document (or the granule)
            real = int(slots.sum())
            assert 0 <= bucket.length - real < max(real // 8 + 1, tuning.MIN_GRANULE)
    assert bool((seen == 1).all())
    assert len(buckets) < sum(len(row) for row in lengths)  # fewer calls than documents


def test_a_call_against_a_cache_goes_to_a_backend_that_masks_documents():
    tokens = packed_tokens([[6, 10]])
    bias = AlibiBias(H, variant="causal", document_mask="eos")
    bias.read_tokens(tokens[:, :15], EOS)  # a prompt of 15 tokens, then a step
    first = bias.documents_of(1, 15, 15)
    bias.read_tokens(tokens, EOS)
    step = bias.layer(0).for_call(None, 1, 1, 16, True,
                                  cached_documents=CachedDocuments(first.ids, first.last_eos))
    q = torch.randn(1, H, 1, D)
    k, v = torch.randn(1, H, 16, D), torch.randn(1, H, 16, D)
    call = dispatch.call_of(q, k, v, step)
    assert call.documents and dispatch.auto_backend(call) == "sdpa"
    with pytest.raises(ValueError, match="other documents"):
        attend("windowed", q, k, v, step)
    # the step reads its own document's keys only: the 6 of the first one weigh nothing
    moved = k.clone()
    moved[:, :, :6] += 100.0
    torch.testing.assert_close(attend("auto", q, moved, v, step), attend("auto", q, k, v, step))


def test_options_that_read_the_row_as_one_sequence_refuse_a_document_mask():
    with pytest.raises(ValueError, match="--alibi-document-mask eos cannot be combined with "
                                         "--alibi-global-tokens 1: .* drop one of them \\(a "
                                         "model saved with the mask: --model-overrides "
                                         "\"\\{'alibi_document_mask': 'none'\\}\" drops "
                                         "it at load\\)"):
        AlibiBias(H, variant="symmetric", global_tokens=1, document_mask="eos")
    bias = AlibiBias(H, variant="causal", document_mask="doc")
    with pytest.raises(ValueError, match="run the model's encoder or decoder"):
        bias.layer(0).for_call(None, 1, 4, 4, False)
