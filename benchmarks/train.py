"""Benchmark 1: training throughput and peak memory, alibi_transformer_lm vs stock transformer_lm.

Both models are built by fairseq from the same command line except the architecture (stock
``transformer_lm`` has sinusoidal position embeddings, which have no parameters, so the two
have exactly the same parameters) and trained in this process by fairseq's own ``Trainer``:
the ``cross_entropy`` criterion, Adam, gradient clipping, one ``train_step`` per batch of
``tokens_per_batch`` tokens. Steps of the two models alternate (``common.Rounds``).

Peak memory is the peak of tensor bytes during one training step (forward, backward, optimizer
update) above what was alive before it — activations, gradients, the bias or mask, temporaries
— measured after warm-up steps, so Adam's state already exists; the parameters and optimizer
state, alive throughout and identical for both models, are reported once.
"""

import os

import torch

from benchmarks.common import Rounds, mib, peak_bytes, table


def write_dictionary(folder, vocab):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "dict.txt")
    with open(path, "w") as f:
        for i in range(vocab):
            f.write(f"w{i} {vocab - i}\n")
    return folder


def trainer_from_flags(flags):
    """``(trainer, task)``: fairseq's own Trainer for a ``fairseq-train`` command line (data
    folder first), built in this process as fairseq-train builds it."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    import fairseq_alibi  # noqa: F401  (registers the models)

    args = options.parse_args_and_arch(options.get_training_parser(), list(flags))
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    return Trainer(cfg, task, model, criterion), task


def build_trainer(data, arch, length, dims, extra=(), device="cpu"):
    """fairseq's Trainer for ``arch`` on the language_modeling task, tokens_per_sample=length
    (on the CPU, or on fairseq's default device: ``device="cuda"``)."""
    return trainer_from_flags([
        data, "--task", "language_modeling", "--arch", arch, *(["--cpu"] if device == "cpu" else []),
        "--tokens-per-sample", str(length), "--criterion", "cross_entropy",
        "--optimizer", "adam", "--lr", "1e-4", "--clip-norm", "1.0",
        "--dropout", "0.1", "--seed", "1", *dims, *extra,
    ])


def random_batch(task, batch, length, seed):
    """A language-modelling sample of ``batch`` full-length rows of random tokens."""
    gen = torch.Generator().manual_seed(seed)
    d = task.dictionary
    tokens = torch.randint(d.nspecial, len(d), (batch, length + 1), generator=gen)
    return {
        "id": torch.arange(batch),
        "nsentences": batch,
        "ntokens": batch * length,
        "net_input": {"src_tokens": tokens[:, :-1].contiguous(),
                      "src_lengths": torch.full((batch,), length)},
        "target": tokens[:, 1:].contiguous(),
    }


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
