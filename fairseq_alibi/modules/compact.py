"""ALBERT-style compact models (Lan et al., ICLR 2020): cross-layer sharing, factorised embeddings.

Cross-layer parameter sharing: all ``N`` layers use the parameters of the first, so a model
holds one layer's parameters instead of ``N`` while still computing ``N`` layers::

    params = embedding + 1 · layer            (instead of embedding + N · layer)

Factorised embedding: tokens are embedded in ``E`` dimensions and projected to the model's
``H`` (``E << H``), and a tied output layer compares ``E``-dimensional features with the same
``V × E`` table::

    embedding params = V·E + E·H              (instead of V·H)

With the GPT-2 vocabulary (V = 50,264), H = 768 and 12 layers, sharing and E = 128 take the
~124 M parameters of a GPT-2-small-sized model to ~13.6 M.
"""

import functools
from typing import Optional

import torch
from fairseq.models.roberta.model import RobertaLMHead
from torch import nn


def share_layer_parameters(layers) -> int:
    """Make every layer of ``layers`` use the very ``Parameter`` objects of the first one.

    The layers stay distinct modules: each keeps its own incremental (KV-cache) state, whose
    key fairseq derives from the module instance, and its own dropout. Returning one module
    ``N`` times instead would make the ``N`` uses of a layer overwrite each other's cached keys
    and values while generating. Shared parameters are yielded once by ``parameters()`` (so
    the optimizer, gradient clipping and fairseq's parameter count see each once), and the
    state dict still holds every ``layers.i.*`` key, the same tensor, which ``torch.save``
    stores once. Returns the number of layers now sharing the first one's parameters.
    """
    # by index: iterating fairseq's LayerDropModuleList in training mode skips layers at random
    layers = [layers[i] for i in range(len(layers))]
    if len(layers) < 2:
        return len(layers)
    source = layers[0]
    if type(source).__name__ == "FullyShardedDataParallel":
        raise ValueError(
            "cross-layer parameter sharing does not work with fully sharded (FSDP) layers; "
            "use another --ddp-backend (legacy_ddp, pytorch_ddp, no_c10d)"
        )
    source_modules = dict(source.named_modules())
    for index, layer in enumerate(layers[1:], start=1):
        if type(layer) is not type(source):
            raise ValueError(
                f"cannot share parameters between layer 0 ({type(source).__name__}) and layer "
                f"{index} ({type(layer).__name__}): all layers must be alike (drop --base-layers)"
            )
        for name, module in layer.named_modules():
            twin = source_modules[name]
            for key, param in list(module._parameters.items()):
                shared = twin._parameters.get(key)
                if (param is None) != (shared is None) or (
                    param is not None and param.shape != shared.shape
                ):
                    raise ValueError(f"layer {index} differs from layer 0 at {name}.{key}")
                module._parameters[key] = shared
    return len(layers)


def own_parameters(module: nn.Module) -> int:
    """Give every submodule of ``module`` that holds a parameter another one holds too (the
    layers of :func:`share_layer_parameters`, a tied output embedding) its own copy, with the
    same values; returns how many were copied. For fairseq's EMA copy of a model
    (:func:`let_ema_follow_shared_parameters`), never for the model that trains."""
    seen, copied = set(), 0
    for sub in module.modules():
        for key, param in list(sub._parameters.items()):
            if param is None:
                continue
            if id(param) in seen:
                sub._parameters[key] = nn.Parameter(param.detach().clone(),
                                                    requires_grad=param.requires_grad)
                copied += 1
            else:
                seen.add(id(param))
    return copied


def let_ema_follow_shared_parameters():
    """Wrap fairseq's ``EMA.__init__`` (``--store-ema``) so that its copy of one of the
    package's models holds a tensor of its own for every state-dict key (:func:`own_parameters`).

    fairseq's EMA step walks the model's state dict and updates each key's EMA tensor in place:
    a tensor that ``N`` keys share (``N`` layers with ``--share-decoder-layers``, or a tied
    output embedding) got its decay ``N`` times per update, ``d^N`` instead of ``d``, without a
    word. Each copy now gets the one update, so the copies stay equal, and the saved ``ema``
    state loads into the shared model as before; the EMA holds ``N`` copies of a shared
    layer. Stock models keep fairseq's behaviour. Idempotent."""
    from fairseq.models.ema.ema import EMA

    stock = EMA.__init__
    if getattr(stock, "_own_parameters", False):
        return

    @functools.wraps(stock)
    def __init__(self, model, config, *args, **kwargs):
        stock(self, model, config, *args, **kwargs)
        ours = type(model).__module__.startswith("fairseq_alibi.")
        if ours and own_parameters(self.model) and self.config.ema_fp32:
            self.fp32_params = {}  # built from the shared tensors: rebuilt from the copies
            self.build_fp32_params()

    __init__._own_parameters = True
    EMA.__init__ = __init__


def parameter_count(module: nn.Module) -> int:
    """Number of parameters, each shared one counted once (as fairseq-train reports it)."""
    return sum(p.numel() for p in module.parameters())


def describe_parameters(model: nn.Module, num_layers: int, shared: bool, embedding_dim: int,
                        model_dim: int) -> str:
    """One line for the training log: parameters, layer sharing, embedding factorisation."""
    text = f"{type(model).__name__}: {parameter_count(model):,} parameters"
    if shared and num_layers > 1:  # (pruned to one layer, nothing is shared)
        text += f", 1 layer's parameters shared by {num_layers} layers"
    if embedding_dim != model_dim:
        text += f", factorised embedding {embedding_dim} -> {model_dim}"
    return text


class FactorizedEmbedding(nn.Module):
    """``x = P · e[t]``: an ``E``-dimensional token embedding projected to the model's ``H``.

    ``weight`` is the ``V × E`` table (what a tied output layer uses); ``embedding_dim`` is
    ``H``, the size of what the encoder receives, so the stock encoder (embedding scale, layer
    norm, learned positions of ``--alibi-variant none``) works unchanged. ``V·E + E·H``
    parameters; the projection has no bias.
    """

    def __init__(self, embedding: nn.Embedding, model_dim: int):
        super().__init__()
        self.embedding = embedding
        self.projection = nn.Linear(embedding.embedding_dim, model_dim, bias=False)
        self.padding_idx = embedding.padding_idx
        self.num_embeddings = embedding.num_embeddings
        self.embedding_dim = model_dim

    @property
    def weight(self) -> torch.Tensor:
        return self.embedding.weight

    def forward(self, tokens):
        return self.projection(self.embedding(tokens))


class FactorizedLMHead(RobertaLMHead):
    """RoBERTa's masked-LM head over a factorised embedding (ALBERT's head).

    ``logits = W · LayerNorm(act(dense(x))) + b`` with ``dense: H → E`` and ``W`` the
    ``V × E`` output embedding (the tied input table, or its own with
    ``--untie-weights-roberta``): the stock head with ``E`` in place of ``H`` after ``dense``.
    """

    def __init__(self, model_dim: int, embedding_dim: int, output_dim: int, activation_fn,
                 weight: Optional[nn.Parameter] = None):
        super().__init__(embedding_dim, output_dim, activation_fn, weight)
        self.dense = nn.Linear(model_dim, embedding_dim)
