"""ALiBi (Attention with Linear Biases) for stock fairseq.

Importing the package registers its models with fairseq; fairseq does the same when given
``--user-dir "$(python -m fairseq_alibi --user-dir)"``.
"""

from fairseq_alibi import safe_loading  # noqa: F401  (torch >= 2.6 checkpoint loading)
from fairseq_alibi import exit_cleanup  # noqa: F401  (fairseq's prefetch thread at exit)
from fairseq_alibi import error_hints  # noqa: F401  (the fix as the last line of a failed run)
from fairseq_alibi.alibi import AlibiPositionalBias, alibi_bias, get_slopes  # noqa: F401
from fairseq_alibi.version import __version__  # noqa: F401
from fairseq_alibi import models  # noqa: F401  (registers the models)
from fairseq_alibi import criterions  # noqa: F401  (registers lm_distillation)
from fairseq_alibi import hf_tokenizer  # noqa: F401  (registers --bpe hf_tokenizer)
