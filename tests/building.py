"""Models built in-process exactly as fairseq-train builds them from its command line."""

from pathlib import Path


def write_dictionary(folder: Path, vocab: int) -> Path:
    """A fairseq ``dict.txt`` of ``vocab`` words (fairseq adds its 4 specials)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "dict.txt", "w") as f:
        for i in range(vocab):
            f.write(f"w{i} {vocab - i}\n")
    return folder


def setup_from_command_line(data, *args):
    """``(cfg, task)`` for fairseq-train arguments (after the data folder)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import fairseq_alibi  # noqa: F401  (registers the models and criteria)

    parser = options.get_training_parser()
    parsed = options.parse_args_and_arch(parser, [str(data), *[str(a) for a in args]])
    cfg = convert_namespace_to_omegaconf(parsed)
    return cfg, tasks.setup_task(cfg.task)


def build_from_command_line(data, *args):
    """``(model, task)`` for fairseq-train arguments (after the data folder)."""
    cfg, task = setup_from_command_line(data, *args)
    return task.build_model(cfg.model), task
