"""alibi_roberta, exactly: literal bias matrices, the whole encoder against a float64 reference,
padding invariance, no NaN, the CLAP head formula, gradients, and clear errors."""

import argparse
import math

import pytest
import torch
import torch.nn.functional as F
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.models.roberta import RobertaModel

import fairseq_alibi  # noqa: F401  (registers alibi_roberta)
from fairseq_alibi.alibi import alibi_bias, mask_value, variant_slopes
from fairseq_alibi.modules.bias import AlibiBias
from fairseq_alibi.modules.stacks import UNBOUNDED_POSITIONS
from tests.helpers.references import naive_bias, naive_slopes

ALIBI_VARIANTS = ["symmetric", "one_sided", "offset", "asymmetric"]
ALL_VARIANTS = ALIBI_VARIANTS + ["none"]
M = None  # a masked entry of a literal matrix

# --alibi-variant offset, 5 positions, m = 1: the matrix of the issue, literally
OFFSET_5 = [
    [0, -0.5, -1.5, -2.5, -3.5],
    [-1, 0, -0.5, -1.5, -2.5],
    [-2, -1, 0, -0.5, -1.5],
    [-3, -2, -1, 0, -0.5],
    [-4, -3, -2, -1, 0],
]
SYMMETRIC_4 = [[0, -1, -2, -3], [-1, 0, -1, -2], [-2, -1, 0, -1], [-3, -2, -1, 0]]
# backward slope 1, forward slope 0.5
ASYMMETRIC_4 = [[0, -0.5, -1, -1.5], [-1, 0, -0.5, -1], [-2, -1, 0, -0.5], [-3, -2, -1, 0]]
ONE_SIDED_BACK_4 = [[0, M, M, M], [-1, 0, M, M], [-2, -1, 0, M], [-3, -2, -1, 0]]
ONE_SIDED_AHEAD_4 = [[0, -1, -2, -3], [M, 0, -1, -2], [M, M, 0, -1], [M, M, M, 0]]


def literal(rows, dtype=torch.float32):
    return torch.tensor([[mask_value(dtype) if v is M else v for v in r] for r in rows])


# ---------------------------------------------------------------- bias matrices, literally


def test_offset_bias_is_the_matrix_of_the_issue():
    got = alibi_bias(torch.tensor([1.0]), 5, 5, "offset")
    assert torch.equal(got[0], literal(OFFSET_5))


@pytest.mark.parametrize(
    "variant,future,want",
    [
        ("symmetric", None, [SYMMETRIC_4, SYMMETRIC_4]),
        ("asymmetric", torch.tensor([0.5, 0.5]), [ASYMMETRIC_4, ASYMMETRIC_4]),
        ("one_sided", None, [ONE_SIDED_BACK_4, ONE_SIDED_AHEAD_4]),
    ],
)
def test_encoder_bias_matrices_literally(variant, future, want):
    got = alibi_bias(torch.tensor([1.0, 1.0]), 4, 4, variant, future_slopes=future)
    assert torch.equal(got, torch.stack([literal(w) for w in want]))


@pytest.mark.parametrize("variant", ALIBI_VARIANTS)
def test_model_bias_is_slope_times_unit_matrix(variant):
    """The model's shared bias for head h is m_h times the m = 1 matrix of its variant."""
    model = build(variant, heads=4)
    alibi = model.encoder.sentence_encoder.alibi
    got = alibi(5, 5)
    unit = alibi_bias(torch.ones(4), 5, 5, variant, future_slopes=torch.ones(4))
    slopes = variant_slopes(4, variant)
    visible = unit > mask_value(torch.float32)
    assert torch.equal(got[visible], (slopes[:, None, None] * unit)[visible])
    assert (got[~visible] == mask_value(torch.float32)).all()


def test_one_sided_each_half_has_the_full_slope_range_of_half_the_heads():
    quarter_range = [1 / 4, 1 / 16, 1 / 64, 1 / 256]
    assert torch.equal(variant_slopes(8, "one_sided"), torch.tensor(quarter_range * 2))
    assert torch.equal(variant_slopes(8, "offset"), torch.tensor([2.0**-k for k in range(1, 9)]))


def test_one_sided_per_head_visibility_in_the_encoder():
    """Heads 0, 1 attend to keys j <= i only, heads 2, 3 to j >= i only; each sees itself."""
    model = build("one_sided", heads=4).eval()
    attn = model.encoder.sentence_encoder.layers[0].self_attn
    x = torch.randn(6, 2, 32)
    _, probs = attn(x, x, x, need_head_weights=True)  # (H, B, T, S)
    i = torch.arange(6)[:, None]
    j = torch.arange(6)[None, :]
    for h in range(4):
        hidden = j > i if h < 2 else j < i
        assert (probs[h][:, hidden] == 0).all(), h
        assert (probs[h][:, ~hidden] > 0).all(), h
        assert (probs[h].diagonal(dim1=-2, dim2=-1) > 0).all()


# ---------------------------------------------------------------- the model, small

DIM, VOCAB_WORDS = 32, 20


def dictionary():
    d = Dictionary()
    for i in range(VOCAB_WORDS):
        d.add_symbol(f"w{i}")
    d.add_symbol("<mask>")  # as masked_lm / sentence_prediction do
    return d


class TinyTask:
    """What RobertaModel.build_model asks of a task."""

    def __init__(self, limit=64):
        self.source_dictionary = dictionary()
        self.limit = limit

    def max_positions(self):
        return self.limit


def build(variant="offset", heads=4, arch="alibi_roberta_base", task=None, max_positions=64,
          **options):
    args = argparse.Namespace(
        arch=arch, encoder_layers=2, encoder_embed_dim=DIM, encoder_ffn_embed_dim=64,
        encoder_attention_heads=heads, alibi_variant=variant, max_positions=max_positions,
        **options
    )
    ARCH_CONFIG_REGISTRY[arch](args)
    torch.manual_seed(0)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, task or TinyTask())
    with torch.no_grad():  # non-zero biases and layer-norm affines, so every term counts
        for name, p in model.named_parameters():
            if name.endswith(".bias") or "layer_norm" in name or "layernorm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def tokens(batch=3, length=10, seed=0, mask_at=None):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(4, 4 + VOCAB_WORDS, (batch, length), generator=g)
    t[:, 0] = 0  # <s>
    if mask_at is not None:
        t[:, mask_at] = dictionary().index("<mask>")
    return t


def naive_encoder(model, src, variant, ratio=1.0):
    """The whole RoBERTa encoder (post-norm, GELU) written out in float64."""
    enc = model.encoder.sentence_encoder
    w = {n: p.detach().double() for n, p in enc.named_parameters()}
    B, T = src.shape
    H, D = enc.layers[0].self_attn.num_heads, DIM // enc.layers[0].self_attn.num_heads
    pad = src.eq(enc.padding_idx)
    x = w["embed_tokens.weight"][src]
    if enc.embed_positions is not None:  # fairseq's positions: 2, 3, ... for real tokens only
        positions = (torch.cumsum(~pad, dim=1) * ~pad) + enc.padding_idx
        x = x + w["embed_positions.weight"][positions]
    x = F.layer_norm(x, (DIM,), w["layernorm_embedding.weight"], w["layernorm_embedding.bias"])
    x = x.masked_fill(pad[..., None], 0.0)
    bias = torch.zeros(H, T, T, dtype=torch.float64)
    if variant != "none":
        slopes = naive_slopes(variant, H)
        for h in range(H):
            for i in range(T):
                for j in range(T):
                    b = naive_bias(variant, h, H, i, j, slopes[h], ratio)
                    bias[h, i, j] = float("-inf") if b is None else b
    for n in range(len(enc.layers)):
        p = lambda name: w[f"layers.{n}.{name}"]  # noqa: E731
        q, k, v = ((x @ p(f"self_attn.{s}_proj.weight").T + p(f"self_attn.{s}_proj.bias"))
                   .view(B, T, H, D).transpose(1, 2) for s in "qkv")
        scores = q @ k.transpose(-1, -2) / math.sqrt(D) + bias
        scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
        # a padding query of a one-sided head may see no key at all: its row is irrelevant,
        # but must not carry NaN into the real rows (0 · NaN) of the next layer
        attn = torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v
        attn = attn.transpose(1, 2).reshape(B, T, DIM) @ p("self_attn.out_proj.weight").T
        x = x + attn + p("self_attn.out_proj.bias")
        x = F.layer_norm(
            x, (DIM,), p("self_attn_layer_norm.weight"), p("self_attn_layer_norm.bias")
        )
        ffn = F.gelu(x @ p("fc1.weight").T + p("fc1.bias")) @ p("fc2.weight").T + p("fc2.bias")
        x = F.layer_norm(x + ffn, (DIM,), p("final_layer_norm.weight"), p("final_layer_norm.bias"))
    return x


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_encoder_matches_float64_reference(variant):
    ratio = 0.25 if variant == "asymmetric" else 1.0
    extra = {"alibi_future_slope_ratio": ratio} if variant == "asymmetric" else {}
    model = build(variant, **extra).eval()
    src = tokens(3, 9)
    src[1, 6:] = 1  # right padding
    src[2, 3:] = 1
    got, _ = model(src, features_only=True)
    want = naive_encoder(model, src, variant, ratio)
    real = src.ne(1)
    assert torch.allclose(got.double()[real], want[real], atol=1e-5, rtol=0)


# ---------------------------------------------------------------- padding and NaN

HEADS = [("roberta", {}), ("clap", {"mlm_head": "clap", "zero_mask_embedding": True})]


@pytest.mark.parametrize("variant", ALL_VARIANTS)
@pytest.mark.parametrize("head", [h for h, _ in HEADS])
def test_appended_padding_changes_no_real_output(variant, head):
    model = build(variant, **dict(HEADS)[head]).eval()
    src = tokens(2, 10, mask_at=4)
    features, _ = model(src, features_only=True)
    logits, _ = model(src)
    for extra in (1, 7):
        padded = torch.cat([src, torch.ones(2, extra, dtype=torch.long)], dim=1)
        f, _ = model(padded, features_only=True)
        lg, _ = model(padded)
        assert torch.allclose(f[:, :10], features, atol=1e-5, rtol=0)
        assert torch.allclose(lg[:, :10], logits, atol=1e-5, rtol=0)
    # a shorter neighbour in the batch pads this row: its outputs do not move either
    batch = torch.cat([src, torch.cat([src[:1, :4], torch.ones(1, 6, dtype=torch.long)], 1)])
    f, _ = model(batch, features_only=True)
    assert torch.allclose(f[:2], features, atol=1e-5, rtol=0)
    assert torch.allclose(f[2, :4], model(src[:1, :4], features_only=True)[0][0], atol=1e-5)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_nan_for_any_padding_pattern(variant, dtype):
    model = build(variant, mlm_head="clap").to(dtype).train()  # dropout on, as in training
    src = tokens(5, 8)
    src[0, 5:] = 1  # right padding
    src[1, :3] = 1  # left padding
    src[2, 2:5] = 1  # a hole in the middle
    src[3, :] = 1  # a row of padding only
    logits, _ = model(src)
    assert torch.isfinite(logits.float()).all()
    logits.float().sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad.float()).all(), name


# ---------------------------------------------------------------- CLAP head and embeddings


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("untie", [False, True])
def test_clap_head_is_the_formula(normalize, untie):
    model = build("offset", mlm_head="clap", clap_initial_beta=2.5,
                  clap_no_normalize=not normalize, untie_weights_roberta=untie).eval()
    head = model.encoder.lm_head
    assert {n for n, _ in head.named_parameters()} == {"weight", "beta"}  # no dense, LN, bias
    assert (head.weight is model.encoder.sentence_encoder.embed_tokens.weight) == (not untie)
    src = tokens(2, 7)
    masked = torch.zeros_like(src, dtype=torch.bool)
    masked[0, 2] = masked[1, 5] = True
    features, _ = model(src, features_only=True)
    got = model.encoder.output_layer(features, masked_tokens=masked)
    W = head.weight.detach().double()
    if normalize:
        W = W / W.norm(dim=-1, keepdim=True).clamp(min=1e-12)  # the padding row is 0
    want = 2.5 * features.detach().double()[masked] @ W.T
    assert got.shape == (2, len(model.encoder.dictionary))  # only the masked positions
    assert torch.allclose(got.double(), want, atol=1e-5, rtol=0)


def clap_reference(features, weight, beta):
    """CLAP in float64 as the formula reads: ``β · x · normalize(W)ᵀ`` (zero rows stay 0)."""
    norm = weight.norm(dim=-1, keepdim=True)
    unit = torch.where(norm > 0, weight / torch.where(norm > 0, norm, 1.0), 0.0)
    return beta * features @ unit.T


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 2e-5), (torch.bfloat16, 5e-2)])
def test_clap_head_outputs_and_gradients_equal_the_float64_formula(dtype, tolerance):
    """The head scales ``x·Wᵀ`` by the rows' inverse norms instead of normalising ``W``:
    logits and the gradients of the features, ``W`` and ``β`` are those of the formula,
    the zero (padding) row included (logit 0, no gradient)."""
    from fairseq_alibi.modules.clap_head import ClapHead

    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 12, generator=gen) * torch.rand(40, 1, generator=gen) * 3
    weight[1] = 0  # a tied embedding's padding row
    head = ClapHead(12, 40, torch.nn.Parameter(weight.to(dtype)), initial_beta=1.7)
    head.beta.data = head.beta.data.to(dtype)
    features = torch.randn(3, 5, 12, generator=gen)
    masked = torch.rand(3, 5, generator=gen) < 0.5
    grad = torch.randn(int(masked.sum()), 40, generator=gen)
    x = features.to(dtype).clone().requires_grad_()
    logits = head(x, masked_tokens=masked)
    logits.backward(grad.to(dtype))

    x64, w64 = x.detach().double().requires_grad_(), head.weight.detach().double().requires_grad_()
    b64 = head.beta.detach().double().requires_grad_()
    want = clap_reference(x64[masked], w64, b64)
    want.backward(grad.double())
    scale = lambda t: t.abs().max().item()  # noqa: E731
    for got, ref in [(logits, want), (x.grad, x64.grad), (head.weight.grad, w64.grad),
                     (head.beta.grad, b64.grad)]:
        assert got.dtype == dtype and got.shape == ref.shape
        assert (got.double() - ref).abs().max() <= tolerance * max(1.0, scale(ref))
    assert (logits[:, 1] == 0).all() and (head.weight.grad[1] == 0).all()

    # every position (no masked_tokens, as the hub's fill_mask and evaluation call it)
    head.weight.grad = head.beta.grad = None
    x = features.to(dtype).clone().requires_grad_()
    every = torch.randn(3, 5, 40, generator=gen)
    head(x).backward(every.to(dtype))
    x64 = x.detach().double().requires_grad_()
    w64, b64 = w64.detach().requires_grad_(), b64.detach().requires_grad_()
    clap_reference(x64, w64, b64).backward(every.double())
    for got, ref in [(x.grad, x64.grad), (head.weight.grad, w64.grad), (head.beta.grad, b64.grad)]:
        assert got.shape == ref.shape
        assert (got.double() - ref).abs().max() <= tolerance * max(1.0, scale(ref))


def test_clap_head_never_builds_the_normalised_matrix(monkeypatch):
    """What makes it as fast as the stock head: no ``V × d`` normalised copy of ``W``."""
    import fairseq_alibi.modules.clap_head as clap_head

    def refuse(weight):
        raise AssertionError("normalize_rows called on the whole output matrix")

    monkeypatch.setattr(clap_head, "normalize_rows", refuse)
    head = clap_head.ClapHead(8, 30, torch.nn.Parameter(torch.randn(30, 8)))
    head(torch.randn(4, 8, requires_grad=True)).sum().backward()
    assert head.weight.grad is not None


def test_clap_inputs_are_unit_vectors_and_mask_is_zero():
    model = build("offset", mlm_head="clap", zero_mask_embedding=True)
    embed = model.encoder.sentence_encoder.embed_tokens
    src = tokens(2, 6, mask_at=3)
    src[1, 5] = 1
    norms = embed(src).norm(dim=-1)
    real = src.ne(1) & src.ne(dictionary().index("<mask>"))
    assert torch.allclose(norms[real], torch.ones_like(norms[real]), atol=1e-6)
    assert (norms[~real] == 0).all()  # <mask> and padding embed to exact zeros


@pytest.mark.parametrize("scale", [False, True])
def test_clap_inputs_follow_fairseqs_embedding_scale(scale):
    """RoBERTa does not scale embeddings (no_scale_embedding); without it they get norm √d."""
    model = build("offset", mlm_head="clap", no_scale_embedding=not scale)
    _, embedded = model.encoder.sentence_encoder.forward_embedding(tokens(2, 6))
    want = math.sqrt(DIM) if scale else 1.0
    assert torch.allclose(embedded.norm(dim=-1), torch.full((2, 6), want), atol=1e-5)


def test_zero_mask_embedding_is_fixed_zero_and_gets_no_input_gradient():
    model = build("offset", zero_mask_embedding=True, untie_weights_roberta=True)
    embed = model.encoder.sentence_encoder.embed_tokens
    mask = dictionary().index("<mask>")
    assert embed.weight[mask].abs().sum() > 0  # the row exists but is never used as input
    src = tokens(2, 6, mask_at=2)
    assert (embed(src)[:, 2] == 0).all()
    features, _ = model(src, features_only=True)
    features.sum().backward()
    assert (embed.weight.grad[mask] == 0).all()
    assert embed.weight.grad[src[0, 1]].abs().sum() > 0


def test_gradients_reach_beta_and_training_moves_it():
    model = build("offset", mlm_head="clap", zero_mask_embedding=True).train()
    src = tokens(4, 10, mask_at=3)
    masked = src.eq(dictionary().index("<mask>"))
    target = tokens(4, 10, seed=1)[masked]
    logits, _ = model(src, masked_tokens=masked)
    F.cross_entropy(logits, target).backward()
    beta = model.encoder.lm_head.beta
    assert beta.grad is not None and torch.isfinite(beta.grad) and beta.grad != 0
    before = beta.item()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert beta.item() != before


def test_clap_keeps_the_padding_row_zero_and_gradients_bounded():
    """The tied padding row is zero: it must not get normalize's 1/eps gradient."""
    model = build("offset", mlm_head="clap").train()
    weight = model.encoder.lm_head.weight
    assert weight is model.encoder.sentence_encoder.embed_tokens.weight
    assert (weight[1] == 0).all()  # <pad>
    src = tokens(4, 10)
    src[3, 6:] = 1
    masked = torch.zeros_like(src, dtype=torch.bool)
    masked[:, 3] = True
    logits, _ = model(src, masked_tokens=masked)
    F.cross_entropy(logits, tokens(4, 10, seed=2)[:, 3]).backward()
    assert (weight.grad[1] == 0).all()
    grads = [p.grad.norm() for p in model.parameters() if p.grad is not None]
    gnorm = torch.stack(grads).norm()
    assert gnorm < 100, gnorm


def test_learnable_future_slopes_get_gradients():
    model = build("asymmetric", alibi_future_slope_ratio=0.5,
                  alibi_learnable_future_slopes=True).train()
    ratio = model.encoder.sentence_encoder.alibi.future_slope_ratio
    assert isinstance(ratio, torch.nn.Parameter) and ratio.shape == (4,)
    logits, _ = model(tokens(2, 8))
    logits.sum().backward()
    assert ratio.grad is not None and (ratio.grad != 0).all()


# ---------------------------------------------------------------- lengths and architectures


@pytest.mark.parametrize("variant", ALIBI_VARIANTS)
def test_alibi_variants_have_no_maximum_length(variant):
    task = TinyTask(limit=64)
    model = build(variant, task=task).eval()
    assert model.max_positions() == UNBOUNDED_POSITIONS
    assert task.max_positions() == UNBOUNDED_POSITIONS  # the task keeps longer inputs too
    logits, _ = model(tokens(1, 150))  # beyond max_positions=64
    assert logits.shape == (1, 150, len(dictionary())) and torch.isfinite(logits).all()


def test_learned_positions_keep_their_limit_and_shortening_keeps_the_task_limit():
    task = TinyTask(limit=64)
    assert build("none", task=task).max_positions() == 64 and task.max_positions() == 64
    task = TinyTask(limit=64)
    task.cfg = argparse.Namespace(shorten_method="truncate")
    build("offset", task=task)
    assert task.max_positions() == 64  # the user asked to shorten to the limit: kept


@pytest.mark.parametrize(
    "arch,layers,dim,heads",
    [("alibi_roberta_small", 4, 512, 8), ("alibi_roberta_base", 12, 768, 12),
     ("alibi_roberta_large", 24, 1024, 16), ("alibi_roberta", 12, 768, 12)],
)
def test_architectures(arch, layers, dim, heads):
    args = argparse.Namespace(arch=arch)
    ARCH_CONFIG_REGISTRY[arch](args)
    assert (args.encoder_layers, args.encoder_embed_dim, args.encoder_attention_heads) == (
        layers, dim, heads)
    assert args.alibi_variant == "offset" and args.mlm_head == "roberta"
    assert ARCH_MODEL_REGISTRY[arch].__name__ == "AlibiRobertaModel"


@pytest.mark.parametrize("variant", ALL_VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_agrees_with_float32(variant, dtype):
    model = build(variant, mlm_head="clap").eval()
    src = tokens(2, 12)
    src[1, 7:] = 1
    want, _ = model(src, features_only=True)
    model = model.to(dtype)
    if variant != "none":
        assert model.encoder.sentence_encoder.alibi.slopes.dtype == torch.float32
    got, _ = model(src, features_only=True)
    logits, _ = model(src)
    assert got.dtype == dtype and torch.isfinite(logits.float()).all()
    real = src.ne(1)
    tolerance = 0.02 if dtype == torch.float16 else 0.1  # 10 and 7 mantissa bits
    assert torch.allclose(got.float()[real], want[real], atol=tolerance, rtol=0)


# ---------------------------------------------------------------- clear errors


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match="even number of attention heads"):
        build("one_sided", heads=1)  # odd, and a divisor of the width
    with pytest.raises(ValueError, match="unknown --alibi-variant 'sinusoidal'; choose one of: symmetric"):
        build("sinusoidal")
    with pytest.raises(ValueError, match="--alibi-future-slope-ratio needs --alibi-variant "
                                         "asymmetric, not offset: it sets the forward slopes"):
        build("offset", alibi_future_slope_ratio=0.5)
    with pytest.raises(ValueError, match=">= 0"):
        build("asymmetric", alibi_future_slope_ratio=-1.0)
    with pytest.raises(ValueError, match="--clap-no-normalize needs --mlm-head clap, not roberta"):
        build("offset", clap_no_normalize=True)
    with pytest.raises(ValueError, match="unknown --mlm-head 'bert'"):
        build("offset", mlm_head="bert")


@pytest.mark.parametrize(
    "trained,loaded,message",
    [
        ({"variant": "offset"}, {"variant": "symmetric"},
         "--alibi-variant offset --mlm-head roberta"),
        ({"variant": "offset", "mlm_head": "clap"}, {"variant": "offset"}, "--mlm-head clap"),
        ({"variant": "offset", "zero_mask_embedding": True}, {"variant": "offset"},
         "--zero-mask-embedding"),
        ({"variant": "none"}, {"variant": "offset"}, "--alibi-variant none"),
        ({"variant": "offset"}, {"variant": "none"}, "--alibi-variant offset"),
    ],
)
def test_checkpoint_of_another_kind_is_a_clear_error(trained, loaded, message):
    state = build(**trained).state_dict()
    with pytest.raises(ValueError, match=message):
        build(**loaded).load_state_dict(state)


@pytest.mark.parametrize(
    "old_kind,kind",
    [
        # the integer positions checkpoints stored before the names were (variant, head, ...)
        ((2, 0, 0, 0), {"variant": "offset"}),
        ((2, 1, 1, 1), {"variant": "offset", "mlm_head": "clap", "zero_mask_embedding": True}),
        ((1, 0, 0, 0), {"variant": "one_sided"}),
        ((4, 1, 1, 0), {"variant": "none", "mlm_head": "clap"}),
    ],
)
def test_model_kind_is_stored_by_name_and_old_integer_form_still_loads(old_kind, kind):
    from fairseq_alibi.models.alibi_roberta import decode_kind

    model = build(**kind)
    saved = decode_kind(model.encoder.model_kind)
    assert saved["alibi_variant"] == kind["variant"]
    assert saved["mlm_head"] == kind.get("mlm_head", "roberta")
    state = model.state_dict()
    state["encoder.model_kind"] = torch.tensor(old_kind, dtype=torch.long)
    fresh = build(**kind)
    fresh.load_state_dict(state)  # read in the old form, kept in the new one
    assert torch.equal(fresh.encoder.model_kind, model.encoder.model_kind)
    other = "symmetric" if kind["variant"] != "symmetric" else "offset"
    state["encoder.model_kind"] = torch.tensor(old_kind, dtype=torch.long)
    with pytest.raises(ValueError, match=f"--alibi-variant {kind['variant']}"):
        build(**dict(kind, variant=other)).load_state_dict(state)


def test_stock_roberta_weights_load_as_none_only():
    args = argparse.Namespace(arch="roberta_base", encoder_layers=2, encoder_embed_dim=DIM,
                              encoder_ffn_embed_dim=64, encoder_attention_heads=4, max_positions=64)
    ARCH_CONFIG_REGISTRY["roberta_base"](args)
    stock = RobertaModel.build_model(args, TinyTask()).eval()
    src = tokens(2, 9)
    ours = build("none").eval()
    ours.load_state_dict(stock.state_dict())  # a stock RoBERTa is an alibi_roberta `none`
    assert torch.allclose(ours(src)[0], stock(src)[0], atol=1e-6)
    with pytest.raises(ValueError, match="position embeddings"):
        build("offset").load_state_dict(stock.state_dict())
    with pytest.raises(ValueError, match="stock RoBERTa checkpoint"):
        build("none", mlm_head="clap").load_state_dict(stock.state_dict())


def test_learned_positions_of_another_length_are_a_clear_error():
    state = build("none", max_positions=64).state_dict()
    with pytest.raises(ValueError, match="trained with --max-positions 64.*build it with --max-positions 64"):
        build("none", max_positions=128).load_state_dict(state)
    build("offset", max_positions=128).load_state_dict(build("offset").state_dict())


def test_alibi_bias_module_is_shared_and_saved_once():
    model = build("asymmetric", alibi_future_slope_ratio=0.5)
    enc = model.encoder.sentence_encoder
    assert all(layer.self_attn.alibi.stack is enc.alibi for layer in enc.layers)
    assert [layer.self_attn.alibi.index for layer in enc.layers] == list(range(len(enc.layers)))
    keys = [k for k in model.state_dict() if "alibi" in k]
    assert sorted(keys) == ["encoder.sentence_encoder.alibi.future_slope_ratio",
                            "encoder.sentence_encoder.alibi.slopes"]
    assert isinstance(enc.alibi, AlibiBias) and enc.embed_positions is None
