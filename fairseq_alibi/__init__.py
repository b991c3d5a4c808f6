"""ALiBi (Attention with Linear Biases) for stock fairseq.

Importing the package registers its models with fairseq (and makes the few other process-wide
changes listed in :mod:`fairseq_alibi.registration`); fairseq does the same when given
``--user-dir "$(python -m fairseq_alibi --user-dir)"``.

torch and fairseq are the user's to install (the package never pulls in either). Without them
``fairseq-alibi --user-dir`` and ``--version`` still answer, and everything else says what to
install in one line (:data:`missing_dependency`) rather than a traceback.
"""

from fairseq_alibi.version import __version__  # noqa: F401

try:
    import fairseq  # noqa: F401  (it imports torch)
except ImportError as missing:
    #: why the models cannot be registered (torch or fairseq not installed), or None
    missing_dependency = missing
else:
    missing_dependency = None
    from fairseq_alibi.alibi import alibi_bias, get_slopes  # noqa: F401
    from fairseq_alibi.registration import register

    register()


def install_line() -> str:
    """What to install, in one line, when :data:`missing_dependency` is set."""
    name = getattr(missing_dependency, "name", None) or "fairseq"
    return (f"{name} is not installed ({missing_dependency}): fairseq-alibi needs torch and "
            "fairseq, e.g. PIP_CONSTRAINT=examples/constraints.txt pip install "
            "'fairseq-alibi[fairseq]' from the source checkout (README, \"Installing into an "
            "environment that already has fairseq\")")


def __getattr__(name):
    if missing_dependency is not None and name in ("alibi_bias", "get_slopes"):
        raise ImportError(install_line()) from missing_dependency
    raise AttributeError(f"module 'fairseq_alibi' has no attribute {name!r}")
