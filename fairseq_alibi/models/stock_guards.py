"""Stock models refuse the ALiBi forks' checkpoints with a clear error: a patch of fairseq's
architecture registry, made once by :func:`fairseq_alibi.registration.register`.

Loading a fork checkpoint as it is builds the stock model its config names (``roberta``,
``transformer``, ``transformer_lm``), which ignores the fork's options and then fails deep in
``load_state_dict`` (missing position embeddings) or computes something else. fairseq calls the
architecture function of every argparse-style model on the checkpoint's config first: each
stock one is wrapped here to stop there with what to do (the checks of
:mod:`fairseq_alibi.models.checks`). Configs without the forks' options (everything fairseq and
this plugin write) pass through unchanged.
"""

from fairseq_alibi.config_access import cfg_get
from fairseq_alibi.models.checks import (
    FORK_ARCHITECTURES,
    FORK_MODEL_OPTIONS,
    fork_architecture_error,
    is_unconverted_press_config,
    unconverted_fork_error,
    unconverted_press_error,
)


def _fork_refusal(cfg, arch):
    if any(cfg_get(cfg, k) for k in FORK_MODEL_OPTIONS):
        return unconverted_fork_error(cfg, arch)
    return None


def _press_refusal(cfg, arch):
    return unconverted_press_error(arch) if is_unconverted_press_config(cfg) else None


#: the stock models whose architecture functions are guarded, and what each refuses
GUARDED_MODELS = {"roberta": _fork_refusal, "transformer": _fork_refusal,
                  "transformer_lm": _press_refusal}


def guard_stock_architectures():
    """Wrap the architecture functions of :data:`GUARDED_MODELS` (idempotent), and register
    the forks' own architecture names that stock fairseq lacks (EIFY's ``transformer_lm_alibi``)
    to say the same.

    Press's fork (:func:`~fairseq_alibi.models.checks.is_unconverted_press_config`): fairseq
    calls a ``transformer_lm_*`` function on a checkpoint whose config names one of them
    (``transformer_lm_wiki103``, the paper's models); a config naming ``transformer_lm`` itself
    is built through the model's dataclass, which calls no architecture function and drops
    ``max_tokens`` first: stock ``fairseq-eval-lm`` cannot be stopped there without patching
    fairseq (docs/migrating.md). Call it after the ``alibi_<arch>`` mirrors are registered, so
    that they mirror the stock functions themselves.
    """
    from fairseq.models import (
        ARCH_CONFIG_REGISTRY,
        ARCH_MODEL_INV_REGISTRY,
        register_model_architecture,
    )

    for model, refusal in GUARDED_MODELS.items():
        for arch in ARCH_MODEL_INV_REGISTRY.get(model, ()):
            original = ARCH_CONFIG_REGISTRY[arch]
            if getattr(original, "refuses_unconverted_forks", False):
                continue

            def guarded(cfg, _original=original, _arch=arch, _refusal=refusal):
                error = _refusal(cfg, _arch)
                if error is not None:
                    raise error
                return _original(cfg)

            guarded.refuses_unconverted_forks = True
            guarded.__doc__, guarded.__name__ = original.__doc__, original.__name__
            ARCH_CONFIG_REGISTRY[arch] = guarded
    for arch, (model, _) in FORK_ARCHITECTURES.items():
        if arch in ARCH_CONFIG_REGISTRY:
            continue

        def fork_architecture(cfg, _arch=arch):
            raise fork_architecture_error(cfg, _arch)

        register_model_architecture(model, arch)(fork_architecture)
