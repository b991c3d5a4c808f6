"""What lets the shipped hydra configs find this plugin without a hard-coded path.

``fairseq-hydra-train`` imports a ``--user-dir`` only from ``common.user_dir``, after the config
is resolved. Every shipped config therefore holds::

    common:
      user_dir: ${fairseq_alibi.user_dir:}
    hydra:
      callbacks:
        fairseq_alibi:
          _target_: fairseq_alibi.hydra_support.RegisterFairseqAlibi

Hydra instantiates its callbacks right after composing the config and before the job runs, by
importing this module through its dotted name, which works for any installation of the package
(editable or not). Importing it registers the models (``import fairseq_alibi``) and the OmegaConf
resolver ``fairseq_alibi.user_dir``, which resolves to the package directory (what
``python -m fairseq_alibi --user-dir`` prints). fairseq resolves the config before it imports
the user dir, so ``common.user_dir`` holds the absolute path of *this* installation: it is what
spawned distributed workers import, and what checkpoints record.

The callback also refuses, before the job starts, a model config that asks an ALiBi model for
position embeddings (``decoder_learned_pos: true`` on ``alibi_transformer_lm``, ...), as the
command line does (:data:`fairseq_alibi.models.checks.POSITION_EMBEDDING_OPTIONS`). A config of
your own that does not include ``fairseq_alibi.yaml`` (or this callback) skips that check. It
refuses as well a ``model:`` key that starts like an ALiBi option but names none of the model's
(``alibi_variantt``; :mod:`fairseq_alibi.models.override_keys`): hydra's structured config
refuses it for ``alibi_transformer_lm``, but the legacy models' section takes any key; and a
value an ALiBi option cannot take (``alibi_document_mask: docs``), which omegaconf would refuse
with a traceback inside the job. An option combination the model refuses when it is built
(sinks without windows) ends a single run as that one line too. The refusals are phrased for
the command line; the callback names each flag as the config key it is (``--alibi-heads`` is
``model.alibi_heads``: :func:`hydra_names`).

Composing a config without running hydra's callbacks (``hydra.compose`` in a notebook, say)
needs ``import fairseq_alibi.hydra_support`` first, or an explicit
``common.user_dir=$(python -m fairseq_alibi --user-dir)``.
"""

import dataclasses
import os
import sys

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

import fairseq_alibi  # noqa: F401  (registers the models, so fairseq fills their defaults)
from fairseq_alibi import error_hints, options
from fairseq_alibi.models.checks import refuse_position_embedding_options
from fairseq_alibi.models.override_keys import (check_model_config_keys, model_name_of_config,
                                                refuse_fork_keys)
from fairseq_alibi.paths import user_dir

#: the resolver the shipped configs use for ``common.user_dir``
USER_DIR_RESOLVER = "fairseq_alibi.user_dir"

OmegaConf.register_new_resolver(USER_DIR_RESOLVER, user_dir, replace=True)


class RegisterFairseqAlibi(Callback):
    """Hydra callback: gets this module imported before the job starts, refuses a model config
    that contradicts ALiBi (``decoder_learned_pos: true``, ...) as the command line does, and
    when the job fails, prints the plugin's one-line hint (:mod:`fairseq_alibi.error_hints`)
    before hydra's report."""

    def on_job_start(self, config, **kwargs):
        """Refuse a model config asking an ALiBi model for position embeddings (what the command
        line refuses with argparse), or with a misspelt ALiBi key, before anything is built: one
        line on stderr, exit status 1.

        ``SystemExit`` because hydra turns any ``Exception`` raised by a callback into a warning
        and runs the job anyway.
        """
        model_cfg = config.get("model") if hasattr(config, "get") else None
        try:
            check_restore_file(config)
            if model_cfg is None:
                return
            refuse_position_embedding_options(model_cfg)
            check_model_config_keys(model_cfg, "the config's model")
            task_cfg = config.get("task")  # the fork's omit_mask is a task key
            refuse_fork_keys(list(task_cfg.keys()) if hasattr(task_cfg, "keys") else [],
                             model_name_of_config(model_cfg), "the config's task")
            check_model_config_values(model_cfg, "the config's model")
        except ValueError as e:
            raise SystemExit(_error_line(e, config)) from None

    def on_job_end(self, config, job_return, **kwargs):
        """When the job failed: the package's refusal of bad input (an option combination the
        model refuses when built) ends a single run as its one line, where hydra would print a
        traceback; another failure with a hint ends it with the traceback and then the hint,
        the last line as on the command line; a job of a sweep (``-m``, whose other jobs must
        run), or a run with ``HYDRA_FULL_ERROR=1`` (hydra then raises the error itself), gets
        the hint before hydra's report."""
        import traceback

        from hydra.core.hydra_config import HydraConfig
        from hydra.core.utils import JobStatus
        from hydra.types import RunMode

        if job_return.status != JobStatus.FAILED:
            return
        # the exception itself: reading ``return_value`` would print hydra's report twice
        failure = getattr(job_return, "_return_value", None)
        full = os.environ.get("HYDRA_FULL_ERROR") == "1"  # asked for: hydra raises the error
        if HydraConfig.get().mode != RunMode.RUN or failure is None or full:
            error_hints.report(failure)
            return
        if isinstance(failure, error_hints.OneLineError):
            raise SystemExit(_error_line(failure, config))
        hint = error_hints.hint_line(failure)
        if hint:
            traceback.print_exception(failure)
            raise SystemExit(hint)


def _error_line(refusal: Exception, config) -> str:
    return f"{os.path.basename(sys.argv[0])}: error: {hydra_names(str(refusal), config)}"


#: the config groups of training a flag's name is looked up in, in this order (the model's
#: first: most refusals name its options); not the evaluation tools' (``--model-overrides`` in a
#: hint is a flag of fairseq-eval-lm, which hydra does not run)
_GROUPS = ("model", "task", "criterion", "dataset", "optimization", "checkpoint", "common",
           "distributed_training", "optimizer", "lr_scheduler")


def hydra_names(message: str, config) -> str:
    """``message`` with each command-line flag that is a key of the run's config written as that
    key (``--alibi-heads`` → ``model.alibi_heads``): the refusals are phrased for the command
    line, and a hydra user sets keys, not flags. A flag of no group (``--model-overrides`` in a
    hint) stays as it is."""
    def key(name):
        group = next((g for g in _GROUPS if name in _group_keys(config, g)), None)
        return None if group is None else f"{group}.{name}"
    return options.renamed_flags(message, key)


def _group_keys(config, group: str) -> set:
    """The keys group ``group`` of ``config`` may hold: those it holds, its dataclass's fields
    (fairseq's fixed groups; a model's, task's or criterion's registered one, by ``_name``),
    and for the model the package's options (a legacy model's section has no dataclass)."""
    from fairseq.criterions import CRITERION_DATACLASS_REGISTRY
    from fairseq.dataclass.configs import FairseqConfig
    from fairseq.models import MODEL_DATACLASS_REGISTRY
    from fairseq.tasks import TASK_DATACLASS_REGISTRY

    node = config.get(group) if hasattr(config, "get") else None
    if not hasattr(node, "keys"):
        return set()
    registry = {"model": MODEL_DATACLASS_REGISTRY, "task": TASK_DATACLASS_REGISTRY,
                "criterion": CRITERION_DATACLASS_REGISTRY}.get(group)
    cls = (registry.get(node.get("_name")) if registry is not None
           else {f.name: f.type for f in dataclasses.fields(FairseqConfig)}.get(group))
    keys = set(node.keys())
    if dataclasses.is_dataclass(cls):
        keys |= {f.name for f in dataclasses.fields(cls)}
    if group == "model":
        keys |= set(options.family_option_names(model_name_of_config(node)))
    return keys


def check_restore_file(config):
    """Refuse a ``checkpoint.restore_file`` that names no file before the job starts
    (:mod:`fairseq_alibi.train_guards`)."""
    from fairseq_alibi.train_guards import restore_file_refusal

    checkpoint = config.get("checkpoint") if hasattr(config, "get") else None
    if checkpoint is None or OmegaConf.is_missing(checkpoint, "restore_file"):
        return  # hydra refuses a missing mandatory value itself
    refusal = restore_file_refusal(checkpoint.get("restore_file"),
                                   checkpoint.get("checkpoint_suffix") or "",
                                   named="checkpoint.restore_file=")
    if refusal is not None:
        raise ValueError(refusal)


def check_model_config_values(model_cfg, where: str):
    """Each of the package's options in a model config, checked against its declaration (its
    choices, type, rule) as a load-time override is: fairseq would merge a misspelt choice
    (``alibi_document_mask: docs``) into the model's dataclass inside the job, where omegaconf
    fails with a traceback."""
    ours = {key: model_cfg.get(key) for key in model_cfg.keys() if options.is_our_key(key)}
    options.check_override_values(ours, model_name_of_config(model_cfg), where)
