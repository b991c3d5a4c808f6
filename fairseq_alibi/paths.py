"""Where the installed package lives: what fairseq's ``--user-dir`` and hydra's ``--config-dir`` take."""

import os


def user_dir() -> str:
    """The folder to pass to fairseq's ``--user-dir``: this package."""
    return os.path.dirname(os.path.abspath(__file__))


def config_dir(*parts: str) -> str:
    """The shipped hydra configs (``config_dir("lm")`` for ``--config-dir``), inside the package."""
    return os.path.join(user_dir(), "config", *parts)
