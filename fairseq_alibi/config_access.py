"""Reading and writing a fairseq configuration of any era: an ``argparse.Namespace`` (fairseq
before hydra, and the forks' checkpoints), an OmegaConf node (hydra, saved ``cfg``) or a plain
dict. The one home of these helpers: the models, the hub and the tools all use them."""

import argparse


def cfg_get(cfg, key, default=None):
    """``cfg[key]`` / ``cfg.key``; ``default`` when absent (or when ``cfg`` is no config)."""
    try:
        if hasattr(cfg, "get") and not isinstance(cfg, argparse.Namespace):
            return cfg.get(key, default)
        return getattr(cfg, key, default)
    except Exception:  # noqa: BLE001 - an unusual config object: treated as not holding it
        return default


def cfg_set(cfg, key, value):
    """``cfg[key] = value`` for a Namespace, an OmegaConf node (struct or not) or a dict."""
    from omegaconf import OmegaConf, open_dict

    if isinstance(cfg, argparse.Namespace):
        setattr(cfg, key, value)
    elif OmegaConf.is_config(cfg):
        with open_dict(cfg):  # configs converted from argparse checkpoints are "struct"
            cfg[key] = value
    else:
        cfg[key] = value


def architecture_of(model_cfg):
    """The architecture a model config names (``_name``, or ``arch`` for argparse)."""
    return cfg_get(model_cfg, "_name") or cfg_get(model_cfg, "arch")


def flag_of_key(key: str) -> str:
    """The command-line flag of the config key ``key``, as fairseq's argparse spells it
    (``alibi_window_cutoff``: ``--alibi-window-cutoff``)."""
    return "--" + key.replace("_", "-")


def task_name(task):
    """The name a task was registered under (its config's ``_name``, or ``task`` for
    argparse)."""
    task_cfg = getattr(task, "cfg", None) or getattr(task, "args", None)
    return cfg_get(task_cfg, "_name") or cfg_get(task_cfg, "task")


def overrides_dict(given):
    """``--model-overrides`` (a dict, or its Python text as the command lines take it, e.g.
    ``"{'alibi_window_cutoff': 8}"``) as a dict of option names; ``None`` when it is not one
    (read as a literal, never run: fairseq's own commands ``eval`` it)."""
    import ast

    try:
        value = ast.literal_eval(given) if isinstance(given, str) else given
    except (ValueError, SyntaxError):
        return None
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return value
    return None


def criterion_name(task):
    """The criterion of the run a task was set up for, or ``None`` where its config does not
    say: an argparse-era ``args`` holds it; a hydra task config is a node of the whole run's
    config (fairseq-train, hydra, a checkpoint's saved ``cfg``), whose ``criterion`` it is."""
    task_cfg = getattr(task, "cfg", None) or getattr(task, "args", None)
    if isinstance(task_cfg, argparse.Namespace):
        return getattr(task_cfg, "criterion", None)
    parent = getattr(task_cfg, "_get_parent", lambda: None)()
    return cfg_get(cfg_get(parent, "criterion"), "_name")


def plain_cfg(cfg, resolve: bool = True) -> dict:
    """A config as a plain dict (enums as strings; ``resolve=False`` keeps interpolations such
    as the forks' ``${task.max_tokens}`` as written); ``{}`` for ``None``."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(cfg):
        return OmegaConf.to_container(cfg, resolve=resolve, enum_to_str=True)
    if isinstance(cfg, argparse.Namespace):
        return dict(vars(cfg))
    return dict(cfg) if cfg is not None else {}
