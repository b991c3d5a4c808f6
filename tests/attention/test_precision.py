"""Half precision at long lengths: no NaN/inf, and an exact bias next to the diagonal.

* The bias each attention layer adds, built in bf16/fp16 for 8192 keys, equals the float32
  bias near the diagonal, and neighbouring keys differ by exactly the slope at position 8000
  (the "row trick" ``m·j`` would be off by up to ``ulp(m·8000)``), for every variant.
* One ALiBi attention layer at 8192 tokens, forward and backward, for every variant, in bf16
  (what fairseq's ``bf16`` does: the model cast to bfloat16), close to float32; and under
  CPU autocast (2048 tokens: autocast is not a fairseq option on the CPU).
* Both models cast to bf16, forward and backward past their training length, and a real
  bf16 training run through ``fairseq-hydra-train`` (``fairseq-train --bf16`` implies
  ``--tpu`` and cannot run on a CPU; docs/reliability.md).

fp16 kernels are a GPU matter; here the fp16 *bias* is checked, and fp16 training is left to
a machine with a GPU.
"""

import pytest
import torch

from fairseq_alibi.alibi import mask_value
from fairseq_alibi.modules.bias import AlibiBias
from fairseq_alibi.modules.alibi_multihead_attention import AlibiMultiheadAttention
from tests.helpers.building import build_model
from tests.helpers.checkpoints import load
from tests.helpers.cli import run_cli

VARIANTS = ["causal", "symmetric", "one_sided", "offset", "asymmetric"]
LONG = 8192
AT = 8000  # the query position whose neighbours are compared
HEADS = 8  # slopes 1/2 ... 1/256, exact in every float format


def near_diagonal(variant, dtype, window=64):
    """Rows of query ``AT`` of the bias for ``LONG`` keys, in ``dtype`` and in float32."""
    alibi = AlibiBias(HEADS, variant=variant, future_slope_ratio=0.5)
    query_len = LONG - AT  # queries are aligned to the end of the keys: the first one is AT
    keys = slice(AT - window, AT + window + 1)
    half = alibi(query_len, LONG, dtype)[:, 0, keys]
    full = alibi(query_len, LONG, torch.float32)[:, 0, keys]
    return alibi, half, full


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_bias_next_to_the_diagonal_is_exact_at_position_8000(variant, dtype):
    alibi, half, full = near_diagonal(variant, dtype)
    centre = half.shape[1] // 2  # key AT
    visible = full > mask_value(torch.float32)
    assert torch.equal(half.float()[visible], full[visible])  # exactly the float32 values
    assert (half[~visible] == mask_value(dtype)).all() and torch.isfinite(half).all()

    slopes, future = alibi.slopes_of()
    future = slopes if future is None else future
    past_step = half[:, centre - 1].float() - half[:, centre - 2].float()  # keys AT-1, AT-2
    ahead_step = half[:, centre + 1].float() - half[:, centre + 2].float()  # keys AT+1, AT+2
    looks_back = torch.ones(HEADS, dtype=torch.bool)
    looks_ahead = torch.full((HEADS,), variant != "causal")
    if variant == "one_sided":  # the first half of the heads looks back, the second ahead
        looks_back[HEADS // 2:] = False
        looks_ahead[: HEADS // 2] = False
    assert torch.equal(past_step[looks_back], slopes[looks_back])
    assert torch.equal(ahead_step[looks_ahead], future[looks_ahead])
    assert (half[:, centre] == 0).all()
    if variant == "offset":  # the first key ahead is half a step away
        assert torch.equal(half[:, centre + 1].float(), -0.5 * slopes)


def attention_layer(variant, heads=2, dim=16):
    torch.manual_seed(0)
    alibi = AlibiBias(heads, variant=variant, future_slope_ratio=0.5)
    return AlibiMultiheadAttention(dim, heads, alibi.layer(0))


def forward_backward(attn, x):
    x = x.detach().requires_grad_(True)
    out, _ = attn(x, x, x, need_weights=False)
    out.float().square().mean().backward()
    return out, x.grad, [p.grad for p in attn.parameters()]


def all_finite(*tensors):
    flat = [t for group in tensors for t in (group if isinstance(group, list) else [group])]
    return all(torch.isfinite(t).all() for t in flat)


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_one_layer_at_8192_tokens_in_bf16(variant):
    attn = attention_layer(variant)
    x = torch.randn(LONG, 1, 16)
    with torch.no_grad():
        reference, _ = attn(x, x, x, need_weights=False)
    attn.to(torch.bfloat16)
    out, dx, dw = forward_backward(attn, x.bfloat16())
    assert out.dtype == torch.bfloat16 and all_finite(out, dx, dw)
    assert torch.allclose(out.float(), reference, atol=0.05, rtol=0.05)
    assert attn.alibi.stack.slopes.dtype == torch.float32  # the cast never rounds the slopes


@pytest.mark.parametrize("variant", VARIANTS)
def test_one_layer_under_cpu_autocast(variant):
    attn = attention_layer(variant)
    x = torch.randn(LONG // 4, 1, 16)
    with torch.no_grad():
        reference, _ = attn(x, x, x, need_weights=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, dx, dw = forward_backward(attn, x)
    assert out.dtype == torch.bfloat16 and all_finite(out, dx, dw)
    assert torch.allclose(out.float(), reference, atol=0.05, rtol=0.05)


#: the LM, and the encoder with each of its ALiBi variants
MODELS = {"lm": ("lm",), **{f"encoder-{v}": ("encoder", "--alibi-variant", v)
                            for v in ["symmetric", "one_sided", "offset", "asymmetric"]}}


@pytest.mark.parametrize("name", list(MODELS))
def test_whole_model_in_bf16_beyond_training_length(name, tiny_lm_data):
    kind, *extra = MODELS[name]
    model, task = build_model(kind, tiny_lm_data, *extra)
    model = model.to(torch.bfloat16).train()
    torch.manual_seed(0)
    tokens = torch.randint(4, len(task.source_dictionary), (2, 1024))  # 64x the training length
    tokens[1, 700:] = task.source_dictionary.pad()  # a padded row too
    logits = model(tokens)[0]
    loss = logits.float().log_softmax(-1).mean()
    loss.backward()
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.slow
def test_bf16_training_through_fairseq_hydra_train(tmp_path, tiny_lm_data, alibi_user_dir):
    (tmp_path / "bf16.yaml").write_text(f"""
common: {{user_dir: {alibi_user_dir}, cpu: true, bf16: true, seed: 1, log_format: json,
          log_interval: 1}}
task: {{_name: language_modeling, data: {tiny_lm_data}, tokens_per_sample: 16,
        sample_break_mode: none}}
model: {{_name: alibi_transformer_lm, decoder_layers: 2, decoder_embed_dim: 32,
         decoder_input_dim: 32, decoder_output_dim: 32, decoder_ffn_embed_dim: 64,
         decoder_attention_heads: 4}}
criterion: cross_entropy
optimizer: {{_name: adam}}
lr_scheduler: fixed
optimization: {{max_update: 4, lr: [0.003]}}
dataset: {{max_tokens: 128, num_workers: 0, disable_validation: true}}
checkpoint: {{save_dir: {tmp_path / 'ck'}}}
""")
    out = run_cli("fairseq-hydra-train", "--config-dir", tmp_path, "--config-name", "bf16",
                  f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert "'bf16': True" in out and '"num_updates": "4"' in out
    state = load(tmp_path / "ck" / "checkpoint_last.pt")
    assert state["cfg"]["common"]["bf16"] and state["optimizer_history"][-1]["num_updates"] == 4
    assert torch.equal(state["model"]["decoder.alibi.slopes"], AlibiBias(4).slopes)
    assert all(torch.isfinite(w).all() for w in state["model"].values())
