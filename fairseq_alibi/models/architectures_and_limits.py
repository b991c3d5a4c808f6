"""What the model families share beyond the stacks: stock architectures mirrored under
``alibi_<arch>``, and the task's length limit lifted for an ALiBi side."""

import logging

from fairseq.models import (
    ARCH_CONFIG_REGISTRY,
    ARCH_MODEL_INV_REGISTRY,
    register_model_architecture,
)
from fairseq.utils import safe_getattr

from fairseq_alibi.modules.stacks import UNBOUNDED_POSITIONS

logger = logging.getLogger(__name__)


def mirror_stock_architectures(stock_model: str, model_name: str, defaults=None):
    """Register ``alibi_<arch>`` on ``model_name`` for every architecture of ``stock_model``
    (``alibi_transformer_lm_wiki103``, ``alibi_transformer_iwslt_de_en``, ...): the stock
    sizes, after ``defaults(args)`` (the ALiBi options' defaults) when given."""
    for arch in sorted(ARCH_MODEL_INV_REGISTRY[stock_model]):
        if arch == stock_model:  # registered with the model itself
            continue
        stock = ARCH_CONFIG_REGISTRY[arch]
        if defaults is None:
            mirrored = stock
        else:
            def mirrored(args, stock=stock):
                defaults(args)
                stock(args)

            mirrored.__doc__ = f"Stock ``{arch}`` sizes with ALiBi."
        register_model_architecture(model_name, f"alibi_{arch}")(mirrored)


def lift_task_length_limit(task, lift):
    """Let the task keep inputs of any length where the model has no maximum.

    fairseq drops (train) or refuses (valid, generate) samples longer than
    ``min(task.max_positions(), model.max_positions())``; the tasks' limits
    (``--tokens-per-sample``, ``--max-positions``, ``--max-source-positions`` /
    ``--max-target-positions``) only exist because position embeddings stop there. ``lift``:
    ``True`` for a task with one limit, ``(source, target)`` for a translation task. When
    ``--shorten-method`` asks to shorten the inputs to the limit instead, the task is left as
    configured. Only this task object changes, never its saved options.
    """
    limit = task.max_positions() if task is not None else None
    if str(safe_getattr(getattr(task, "cfg", None), "shorten_method", "none")) != "none":
        return
    if isinstance(limit, tuple) and len(limit) == 2 and isinstance(lift, tuple):
        lifted = tuple(UNBOUNDED_POSITIONS if side else value for side, value in zip(lift, limit))
    elif isinstance(limit, int) and not isinstance(limit, bool) and lift is True:
        lifted = UNBOUNDED_POSITIONS
    else:
        return  # no limit, or one of another shape: leave the task as configured
    if lifted == limit:
        return
    task.max_positions = lambda: lifted
    logger.info(f"ALiBi: the task's length limit is lifted ({limit} -> {lifted}), longer inputs "
                "are kept")
