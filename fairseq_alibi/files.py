"""Writing a folder so that nothing half-written is ever left where the result belongs: the one
implementation, used by every tool that writes a folder (the data pipelines, export-hf,
import-hf)."""

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


def refuse_taken(dest, overwrite: bool = False, not_empty=None) -> Path:
    """``dest`` (absolute) if :func:`atomic_directory` may write it: it does not exist, is an
    empty folder, or ``overwrite`` is set; else ``not_empty(dest)`` (default: a
    ``FileExistsError``), as it raises it. A tool writing several folders checks each first."""
    dest = Path(dest).absolute()
    if dest.exists() and not dest.is_dir():
        raise FileExistsError(f"{dest} exists and is not a folder")
    if dest.exists() and any(dest.iterdir()) and not overwrite:
        raise (not_empty(dest) if not_empty else
               FileExistsError(f"{dest} already exists and is not empty"))
    return dest


@contextlib.contextmanager
def atomic_directory(dest, overwrite: bool = False, not_empty=None):
    """Yield an empty temporary folder beside ``dest`` that becomes ``dest`` on success.

    ``dest`` must not exist, be empty, or ``overwrite`` must be set (then the old folder is
    replaced only once the new one is complete); otherwise the exception ``not_empty(dest)``
    (default: a ``FileExistsError``) is raised. On any exception, including
    ``KeyboardInterrupt`` and ``SystemExit``, the temporary folder is removed.
    """
    dest = refuse_taken(dest, overwrite, not_empty)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    try:
        yield partial
        umask = os.umask(0)
        os.umask(umask)
        partial.chmod(0o777 & ~umask)  # mkdtemp makes it private; give it a normal folder's mode
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
            dest.rename(old / dest.name)
            partial.rename(dest)
            shutil.rmtree(old)
        else:
            partial.rename(dest)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
