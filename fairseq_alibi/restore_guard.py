"""A ``--restore-file`` (``checkpoint.restore_file``) that names no file is refused before
training starts: stock fairseq logs "No existing checkpoint found" and trains from a random
initialisation to the end, exit status 0, so a misspelt pre-trained model gives a collapsed
fine-tuning that looks like a result. The default, ``checkpoint_last.pt`` in the save dir, is
a resume that may rightly find nothing, and passes.
"""

import functools
import os
from typing import Optional

#: fairseq's default ``--restore-file``: the save dir's ``checkpoint_last{suffix}.pt``
DEFAULT_RESTORE_FILE = "checkpoint_last.pt"


def restore_file_refusal(restore: Optional[str], suffix: str = "",
                         named: str = "--restore-file ") -> Optional[str]:
    """Why ``restore`` cannot be restored from (``named``: how the user gave it), or None.
    fairseq reads ``restore`` with ``--checkpoint-suffix`` before its ``.pt``."""
    if restore in (None, DEFAULT_RESTORE_FILE):
        return None
    path = restore.replace(".pt", f"{suffix}.pt") if suffix else restore
    if os.path.isfile(path):
        return None
    read = f" (read as {path}, with --checkpoint-suffix {suffix})" if path != restore else ""
    return (f"{named}{restore}: no such file{read} (from {os.getcwd()}); fairseq would train "
            "from a random initialisation. Give the path of the checkpoint to start from")


def guard_restore_file():
    """Wrap ``fairseq.checkpoint_utils.load_checkpoint`` (what ``fairseq-train`` calls to
    resume or start from ``--restore-file``) to refuse a file that is not there (idempotent)."""
    from fairseq import checkpoint_utils

    from fairseq_alibi.error_hints import OneLineError

    stock = checkpoint_utils.load_checkpoint
    if getattr(stock, "_checks_restore_file", False):
        return

    @functools.wraps(stock)
    def load_checkpoint(cfg, trainer, **kwargs):
        refusal = restore_file_refusal(getattr(cfg, "restore_file", None),
                                       getattr(trainer, "checkpoint_suffix", "") or "")
        if refusal is not None:
            raise OneLineError(refusal)
        return stock(cfg, trainer, **kwargs)

    load_checkpoint._checks_restore_file = True
    checkpoint_utils.load_checkpoint = load_checkpoint
