"""Checkpoints: written in this process from fairseq-train flags, loaded, and compared (weights,
the training loss meters they hold)."""

import torch

from tests.helpers.building import setup_from_command_line


def saved_in_process(path, data, *flags):
    """A fairseq checkpoint of a model built in this process from fairseq-train flags
    (untrained: these tests only need files fairseq reads as it reads a trained one)."""
    from omegaconf import OmegaConf

    cfg, task = setup_from_command_line(data, "--cpu", *flags)
    model = task.build_model(cfg.model)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({
        "args": None,
        "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        "model": model.state_dict(),
        "criterion": {},
        "optimizer_history": [{"criterion_name": "CrossEntropyCriterion",
                               "optimizer_name": "Adam", "lr_scheduler_state": {},
                               "num_updates": 0}],
        "task_state": {},
        "extra_state": {},
        "last_optimizer_state": None,
    }, path)
    return path


def saved_by_trainer(model, task, args, path):
    """``path``: ``model`` as fairseq-train saves it (fairseq's ``Trainer``, the options of the
    fairseq-train arguments ``args`` in the checkpoint's config)."""
    from fairseq.trainer import Trainer

    cfg, _ = setup_from_command_line(*args)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    trainer.consolidate_optimizer()
    trainer.save_checkpoint(str(path), {})
    return path


def load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def max_weight_difference(a, b):
    """Largest absolute difference between the weights of two checkpoints (same keys)."""
    assert a["model"].keys() == b["model"].keys()
    return max((a["model"][k].double() - b["model"][k].double()).abs().max().item()
               for k in a["model"] if a["model"][k].numel())


def train_loss(state):
    """The exact training loss meters a checkpoint holds: (last update, epoch average)."""
    meters = {name: meter for _, name, _, meter in dict(state["extra_state"]["metrics"])["train"]}
    loss = meters["loss"]
    return float(loss["val"]), float(loss["sum"]) / float(loss["count"])
