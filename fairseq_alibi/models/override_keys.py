"""Load-time overrides (``--model-overrides``, the hub's ``from_pretrained(**kwargs)``) whose key
starts like one of the package's options but names none of the checkpoint's model: a one-line
error instead of fairseq's silence.

Every fairseq loader of a model for evaluation (``fairseq-eval-lm``, ``-generate``,
``-interactive``, ``-validate``, ``hub_utils.from_pretrained``) goes through
``checkpoint_utils.load_checkpoint_to_cpu(path, arg_overrides)``, the one place that sees the
overrides and the checkpoint's model together, in both checkpoint eras:

* hydra era (``state["cfg"]``): ``overwrite_args_by_name`` sets only the keys that a
  dataclass model's config already holds, so ``alibi_slope_scal`` is dropped (a legacy model's
  ``Namespace`` gets every key, where nothing reads the misspelt one);
* argparse era (``state["args"]``): every key is set on the ``Namespace``, read by no one.

:func:`guard_override_keys` wraps that function (in fairseq's module, where
``load_model_ensemble_and_task`` looks it up): it loads as stock, then hands the overrides' keys
(and those of a nested ``{'model': {...}}``) with the model's name to
:func:`~fairseq_alibi.options.check_override_keys`, which refuses only keys of the package's
prefixes (``alibi_``, ``encoder_alibi_``, ``decoder_alibi_``, ``cross_alibi``) or names; every
other key, and every stock model, keeps fairseq's behaviour. It then gives a valid option that
the checkpoint's hydra-era model config lacks (a checkpoint written before the option existed,
such as ``alibi_window_cutoff``) the override's value (:func:`add_missing_options`), which
``overwrite_args_by_name`` would drop: an option of today is a load-time override of any
trained model, as the options it had then are. Before that, each such option's value is
checked against its declaration (:func:`~fairseq_alibi.options.check_override_values`: its
choices, type and rule), which fairseq would otherwise merge into the model's config, where a
misspelt choice fails deep inside omegaconf.

A hydra config's ``model:`` section is checked by the shipped configs' callback
(:mod:`fairseq_alibi.hydra_support`, :func:`check_model_config_keys`): hydra's structured config
already refuses an unknown key of a dataclass model (``alibi_transformer_lm``), but the legacy
models' section (``alibi_roberta``, ``alibi_transformer``) takes any key.
"""

import contextlib
import contextvars
import difflib
from collections.abc import Mapping
import functools
import logging

from fairseq_alibi import options
from fairseq_alibi.config_access import cfg_get, cfg_set, flag_of_key
from fairseq_alibi.error_hints import OneLineError, overrides_not_a_dict
from fairseq_alibi.models.checks import FORK_FLAGS
from fairseq_alibi.safe_loading import read_mapped
from fairseq_alibi.modules.checkpoint_match import loading_with_overrides

logger = logging.getLogger(__name__)


def model_name_of_config(model_cfg) -> str:
    """The registered model name of a model config (``_name`` or ``arch``: an architecture's
    model), ``None`` if it names none."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    name = cfg_get(model_cfg, "_name", None) or cfg_get(model_cfg, "arch", None)
    return ARCH_MODEL_NAME_REGISTRY.get(name, name)


def model_name_of(state) -> str:
    """The registered model name of a loaded checkpoint (``None`` if it names none)."""
    model_cfg = saved_model_config(state)
    return None if model_cfg is None else model_name_of_config(model_cfg)


def refuse_fork_keys(keys, model_name, where: str):
    """A key of EIFY's fork among ``keys`` (``where``: the overrides, or a config's section),
    which the model ``model_name`` would ignore, refused naming its counterpart here
    (:data:`~fairseq_alibi.models.checks.FORK_FLAGS`)."""
    counterparts = FORK_FLAGS.get(model_name, {})
    for key in keys:
        counterpart = counterparts.get(flag_of_key(str(key)))
        if counterpart is not None:
            raise OneLineError(f"{key} in {where} is an option of EIFY's ALiBi fork, which this "
                               f"model would ignore: drop it (here: {counterpart}; "
                               "docs/migrating.md)")


def check_keys(keys, model_name, where: str = "--model-overrides"):
    """:func:`~fairseq_alibi.options.check_override_keys`, refusing as a :class:`OneLineError`
    (printed as its one line, without the traceback), and :func:`refuse_fork_keys`."""
    refuse_fork_keys(keys, model_name, where)
    try:
        options.check_override_keys(keys, model_name, where)
    except ValueError as e:
        raise OneLineError(str(e)) from None


def check_model_config_keys(model_cfg, where: str):
    """The same check for every key of a model config (a hydra config's ``model:``, where a
    legacy model's section takes any key)."""
    keys = list(vars(model_cfg)) if not hasattr(model_cfg, "keys") else list(model_cfg.keys())
    check_keys(keys, model_name_of_config(model_cfg), where)


def override_keys(arg_overrides) -> list:
    """The keys of ``arg_overrides``, and of its ``model`` group if it holds one as a dict."""
    keys = [k for k in arg_overrides if k != "model" or not isinstance(arg_overrides[k], dict)]
    if isinstance(arg_overrides.get("model"), dict):
        keys += list(arg_overrides["model"])
    return keys


def given_overrides(arg_overrides) -> dict:
    """``arg_overrides`` with its ``model`` group's keys (if it holds one as a dict) among its
    own."""
    nested = arg_overrides.get("model")
    return {**arg_overrides, **(nested if isinstance(nested, dict) else {})}


def warn_unknown_keys(state, arg_overrides, where: str) -> None:
    """Warn of an override key that names no option of any section of a checkpoint's config
    but is close to one (``dropuot``: ``dropout``): fairseq drops it without a word. Only a
    warning: a key of no section may still be a loader's own (the hub's). An argparse-era
    checkpoint's model ``Namespace`` takes every key while it loads, so its keys are found
    there and nothing is said."""
    cfg = state.get("cfg")
    if cfg is None or not hasattr(cfg, "keys"):
        return
    known = set(cfg.keys())
    for group in cfg.keys():
        section = cfg_get(cfg, group, None)
        if hasattr(section, "keys"):
            known.update(section.keys())
    for key in override_keys(arg_overrides):
        if not isinstance(key, str) or key in known or options.is_our_key(key):
            continue
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.8)
        if close:
            logger.warning(f"{key!r} in {where} is no option of this checkpoint's config: "
                           f"fairseq ignores it (did you mean {close[0]!r}?)")


def add_missing_options(state, arg_overrides, model_name):
    """Set each of the family's options given in ``arg_overrides`` (or its ``model`` group)
    that the checkpoint's model config (``state["cfg"].model``) does not hold; the keys it holds
    fairseq has overridden already, and an argparse-era ``Namespace`` got every key."""
    model_cfg = cfg_get(state.get("cfg") or {}, "model", None)
    if model_cfg is None or not hasattr(model_cfg, "keys"):
        return
    given = given_overrides(arg_overrides)
    for key in options.family_option_names(model_name):
        if key in given and key not in model_cfg.keys():
            cfg_set(model_cfg, key, given[key])


def saved_model_config(state):
    """A loaded checkpoint's model config: ``cfg.model``, or an argparse-era ``args``."""
    model_cfg = cfg_get(state.get("cfg") or {}, "model", None)
    return state.get("args") if model_cfg is None else model_cfg


def refuse_learned_over(state, arg_overrides, model_name, where):
    """:func:`~fairseq_alibi.options.learned_over` on the checkpoint's saved options."""
    model_cfg = saved_model_config(state)
    if model_cfg is not None:
        options.learned_over(given_overrides(arg_overrides),
                             lambda name: cfg_get(model_cfg, name, None), model_name, where)


def refuse_trained_over(path, arg_overrides, model_name, where):
    """:func:`~fairseq_alibi.options.trained_over` on the checkpoint's options as saved (fairseq
    has merged the overrides into the loaded config), read again from the file, memory-mapped,
    only where such an option is overridden (a file the safe loader cannot read: unchecked)."""
    given = given_overrides(arg_overrides)
    if not options.trained_only_names(model_name) & set(given):
        return
    state = read_mapped(path)
    if state is not None:
        saved = saved_model_config(state)
        options.trained_over(given, lambda name: cfg_get(saved, name, None), model_name, where)


def reset_unmet_needs(state, arg_overrides, model_name):
    """Reset to its default each option saved on whose need an override takes away
    (:func:`~fairseq_alibi.options.needs_undone`), with a warning naming it: turning a saved
    option off is one key, not one per option that depends on it."""
    model_cfg = saved_model_config(state)
    if model_cfg is None:
        return
    given = given_overrides(arg_overrides)
    undone = options.needs_undone(given, lambda name: cfg_get(model_cfg, name, None),
                                  model_name)
    for name, (default, other) in undone.items():
        logger.warning("the override %s=%r (%s) takes away what the checkpoint's %s=%r needs: "
                       "%s is reset to its default, %r", other, given[other], _NAMED.get(), name,
                       cfg_get(model_cfg, name, None), name, default)
        cfg_set(model_cfg, name, default)


#: what the load-time overrides are called in a refusal: the command lines' flag, or what the
#: caller gave them as (:func:`overrides_named`)
_NAMED = contextvars.ContextVar("overrides_named", default="--model-overrides")


@contextlib.contextmanager
def overrides_named(where: str):
    """Within this context the overrides checked at load are named ``where`` in a refusal
    (the hub: ``from_pretrained``'s keyword arguments)."""
    token = _NAMED.set(where)
    try:
        yield
    finally:
        _NAMED.reset(token)


def guard_override_keys():
    """Wrap ``fairseq.checkpoint_utils.load_checkpoint_to_cpu`` (idempotent)."""
    from fairseq import checkpoint_utils

    stock = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(stock, "_checks_override_keys", False):
        return

    @functools.wraps(stock)
    def load_checkpoint_to_cpu(path, arg_overrides=None, *args, **kwargs):
        where = _NAMED.get()
        try:
            state = stock(path, arg_overrides, *args, **kwargs)
        except Exception:
            # an argparse-era checkpoint's overrides are merged into its config while it is
            # read: a bad value fails there, before the model is known
            if arg_overrides:
                options.check_override_values(given_overrides(arg_overrides), where=where)
            raise
        if arg_overrides:
            model_name = model_name_of(state)
            check_keys(override_keys(arg_overrides), model_name, where)
            warn_unknown_keys(state, arg_overrides, where)
            options.check_override_values(given_overrides(arg_overrides), model_name, where)
            add_missing_options(state, arg_overrides, model_name)
            refuse_learned_over(state, arg_overrides, model_name, where)
            refuse_trained_over(path, arg_overrides, model_name, where)
            reset_unmet_needs(state, arg_overrides, model_name)
        return state

    load_checkpoint_to_cpu._checks_override_keys = True
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu
    ensemble = checkpoint_utils.load_model_ensemble_and_task

    @functools.wraps(ensemble)
    def load_model_ensemble_and_task(filenames, arg_overrides=None, *args, **kwargs):
        if arg_overrides is not None and not isinstance(arg_overrides, Mapping):
            raise OneLineError(overrides_not_a_dict(arg_overrides, _NAMED.get()))
        # the build that follows the load: a mismatch an override causes names the override
        with loading_with_overrides(override_keys(arg_overrides or {}), _NAMED.get()):
            return ensemble(filenames, arg_overrides, *args, **kwargs)

    checkpoint_utils.load_model_ensemble_and_task = load_model_ensemble_and_task
