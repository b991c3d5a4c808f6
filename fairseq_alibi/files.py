"""Writing a folder so that nothing half-written is ever left where the result belongs: the one
implementation, used by every tool that writes a folder (the data pipelines, export-hf,
import-hf)."""

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


def _forms(path):
    """``path`` as given (made absolute) and with its links resolved: a link to an input is
    that input, and replacing a folder of links loses them too."""
    return {Path(os.path.abspath(path)), Path(os.path.realpath(path))}


def clash_with_inputs(dest, inputs=()):
    """Why writing (or, with ``--overwrite``, replacing) ``dest`` would destroy or cannot
    coexist with one of ``inputs`` (the files or folders a run reads), in words, or None: it
    is one, holds one, or lies inside a file of them."""
    for given in inputs:
        for target in _forms(dest):
            for source in _forms(given):
                if target == source:
                    return f"is the input {given}"
                if target in source.parents:
                    return f"holds the input {given}"
                if source in target.parents and not source.is_dir():
                    return f"lies inside the input file {given}"
    return None


def refuse_taken(dest, overwrite: bool = False, not_empty=None, inputs=(),
                 error=FileExistsError) -> Path:
    """``dest`` (absolute) if :func:`atomic_directory` may write it: it does not exist, is an
    empty folder, or ``overwrite`` is set; else ``not_empty(dest)`` (default: a
    ``FileExistsError``), as it raises it. ``error(message)`` is raised instead for a ``dest``
    that is a file or lies inside one, or that is, holds or lies inside a file of ``inputs``
    (what the run reads: ``overwrite`` would delete them). A tool writing several folders
    checks each first, so that a refused run writes nothing."""
    dest = Path(dest).absolute()
    clash = clash_with_inputs(dest, inputs)
    if clash:
        raise error(f"the destination {dest} {clash}: write the output somewhere else (a new "
                    "or empty folder outside the inputs)")
    blocking = next((p for p in (dest, *dest.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        where = "" if blocking == dest else f" (under {dest})"
        raise error(f"{blocking} exists and is not a folder{where}: give the destination a new "
                    "or empty folder")
    if dest.exists() and any(dest.iterdir()) and not overwrite:
        raise (not_empty(dest) if not_empty else
               FileExistsError(f"{dest} already exists and is not empty"))
    return dest


@contextlib.contextmanager
def atomic_directory(dest, overwrite: bool = False, not_empty=None, inputs=(),
                     error=FileExistsError):
    """Yield an empty temporary folder beside ``dest`` that becomes ``dest`` on success.

    ``dest`` must not exist, be empty, or ``overwrite`` must be set (then the old folder is
    replaced only once the new one is complete); otherwise the exception ``not_empty(dest)``
    (default: a ``FileExistsError``) is raised; ``inputs`` and ``error`` as in
    :func:`refuse_taken`. On any exception, including ``KeyboardInterrupt`` and
    ``SystemExit``, the temporary folder is removed.
    """
    dest = refuse_taken(dest, overwrite, not_empty, inputs, error)
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
