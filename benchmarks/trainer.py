"""fairseq's own ``Trainer`` built in the benchmark's process, as ``fairseq-train`` builds it, and
random batches for it: what the Trainer-step benchmarks (``train``, ``encoder``, ``eval_lm``,
``translation``, the GPU run's ``memory`` and ``train``) measure."""

import os

import torch


def write_dictionary(folder, vocab):
    """``folder/dict.txt`` of ``vocab`` made-up words (``w0`` ...): what random batches draw
    from."""
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
