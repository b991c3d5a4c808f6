"""Benchmark 1: training throughput and peak memory, alibi_transformer_lm vs stock transformer_lm.

Both models are built by fairseq from the same command line except the architecture (stock
``transformer_lm`` has sinusoidal position embeddings, which have no parameters, so the two
have exactly the same parameters) and trained in this process by fairseq's own ``Trainer``:
the ``cross_entropy`` criterion, Adam, gradient clipping, one ``train_step`` per batch of
``tokens_per_batch`` tokens. Steps of the two models alternate (``timing.Rounds``).

Peak memory is the peak of tensor bytes during one training step (forward, backward, optimizer
update) above what was alive before it — activations, gradients, the bias or mask, temporaries
— measured after warm-up steps, so Adam's state already exists; the parameters and optimizer
state, alive throughout and identical for both models, are reported once.
"""

import os

import torch

from benchmarks.tables import table
from benchmarks.timing import Rounds, mib, peak_bytes
from benchmarks.trainer import build_trainer, random_batch, write_dictionary


def run(work, quick=False, rounds=5, lengths=None, log=print):
    if quick:
        dims = ["--decoder-layers", "1", "--decoder-embed-dim", "32",
                "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "2"]
        lengths, tokens_per_batch, vocab, rounds, warmup = lengths or (32, 64), 128, 100, 1, 1
    else:
        dims = ["--decoder-layers", "2", "--decoder-embed-dim", "256",
                "--decoder-ffn-embed-dim", "1024", "--decoder-attention-heads", "4"]
        lengths, tokens_per_batch, vocab, warmup = lengths or (512, 1024, 2048), 4096, 1000, 2
    data = write_dictionary(os.path.join(work, "train-dict"), vocab)
    rows = []
    state_bytes = None
    for L in lengths:
        batch = max(1, tokens_per_batch // L)
        models = {
            "transformer_lm (sinusoidal)": build_trainer(data, "transformer_lm", L, dims),
            "alibi_transformer_lm": build_trainer(data, "alibi_transformer_lm", L, dims),
        }
        samples = {name: random_batch(task, batch, L, seed=0) for name, (_, task) in models.items()}

        def step(name):
            def call():
                trainer, _ = models[name]
                trainer.train_step([samples[name]])
            return call

        log(f"[train] L={L}, batch {batch} x {L} tokens")
        timed = Rounds({name: step(name) for name in models}, rounds, warmup=warmup)
        base = "transformer_lm (sinusoidal)"
        peaks = {name: peak_bytes(step(name)) for name in models}
        trainer, _ = models[base]
        params = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
        opt_state = sum(
            t.numel() * t.element_size()
            for s in trainer.optimizer.optimizer.state.values() for t in s.values()
            if torch.is_tensor(t)
        )
        state_bytes = params + opt_state
        for name in models:
            tokens_per_s = batch * L / timed.median(name)
            rows.append([
                L, name, f"{tokens_per_s:,.0f}", f"{1 / timed.ratio(name, base):.2f}",
                mib(peaks[name]), f"{peaks[name] / peaks[base]:.2f}",
            ])
            log(f"[train] L={L} {name}: {tokens_per_s:,.0f} tokens/s, peak {mib(peaks[name])} MiB")
    shape = (f"{' '.join(dims).replace('--decoder-', '')}, vocab {vocab}, "
             f"{tokens_per_batch} tokens/batch, float32, {rounds} interleaved round(s), median")
    body = table(["L", "model", "train tokens/s", "throughput × stock", "peak step MiB",
                  "peak × stock"], rows)
    notes = (f"Parameters + Adam state (alive throughout, the same for both): "
             f"{mib(state_bytes)} MiB.")
    return shape, body, notes
