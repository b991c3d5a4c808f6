"""ALiBi (Attention with Linear Biases) for stock fairseq.

Importing the package registers its models with fairseq (and makes the few other process-wide
changes listed in :mod:`fairseq_alibi.registration`); fairseq does the same when given
``--user-dir "$(python -m fairseq_alibi --user-dir)"``.
"""

from fairseq_alibi.alibi import alibi_bias, get_slopes  # noqa: F401
from fairseq_alibi.registration import register
from fairseq_alibi.version import __version__  # noqa: F401

register()
