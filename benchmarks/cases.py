"""The measured cases more than one benchmark times: the cross-attention options against today's
``alibi_transformer`` and its noise floor (cached decoding steps in ``decoding``, whole sentences
in ``translation``), models that read the very same weight tensors, and the compiled flex kernel
with the ALiBi score_mod (``attention``, ``encoder``)."""

from fairseq_alibi.modules.attention import flex


#: the cross-attention position options (docs/translation.md) against today's alibi_transformer
CROSS = {"pointer recipe (slope scale 16, 48 outside training beyond 17 source tokens, 2 heads, "
         "EOS guard 2 on the min pointer)": [
    "--cross-alibi", "pointer", "--cross-alibi-slope-scale", "16",
    "--cross-alibi-inference-slope-scale", "48", "--cross-alibi-inference-longer-than", "17",
    "--cross-alibi-heads", "2", "--cross-alibi-eos-guard", "2",
    "--cross-alibi-eos-guard-layer", "min"],
    # what the recipe's guard costs: the same pointer guarded on the last layer's pointer only,
    # and unguarded
    "the same, EOS guard 2 on the last pointer": [
    "--cross-alibi", "pointer", "--cross-alibi-slope-scale", "16", "--cross-alibi-heads", "2",
    "--cross-alibi-eos-guard", "2"],
    "the same, no EOS guard": [
    "--cross-alibi", "pointer", "--cross-alibi-slope-scale", "16", "--cross-alibi-heads", "2"],
    "pointer, length scale 8, EOS guard 2": [
    "--cross-alibi", "pointer", "--cross-attention-length-scale", "8",
    "--cross-alibi-eos-guard", "2"],
    "ratio 1.0": ["--cross-alibi", "ratio", "--cross-alibi-ratio", "1.0"]}


PAIRS_PER_ROUND = 4


def share_weights(src, dst):
    """Give ``dst`` the very parameter tensors of ``src`` that it has under the same names.

    Equal values are not enough for a fair batch-1 comparison: the time of a step of this small
    decoder depends on where in memory its weights happen to lie (four identical models with
    copied weights: 0.99-1.10x of the first; with shared weights: 0.99-1.00x), so two models
    that read the same tensors differ only by what they compute.
    """
    params = dict(src.named_parameters())
    for name, _ in list(dst.named_parameters()):
        if name in params:
            owner, _, leaf = name.rpartition(".")
            (dst.get_submodule(owner) if owner else dst)._parameters[leaf] = params[name]


#: the row that measures the benchmark's own noise: a second decoder with the same weights
SAME = "alibi_transformer again (a second model, the same weights: the noise floor)"


def compiled_flex(q, k, v, alibi, scale):
    """The compiled flex_attention kernel with the ``flex`` backend's score_mod and block mask."""
    B, H, L, D = q.shape
    score_mod = flex.alibi_score_mod(alibi.variant, *alibi.slopes_of())
    block_mask = flex._block_mask(alibi.variant, H, L, L, q.device)
    return flex._compiled_flex()(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                 scale=scale)
