"""ALiBi attention backends behind ``--alibi-attention`` (see :mod:`.dispatch`)."""

from fairseq_alibi.modules.attention.dispatch import (  # noqa: F401
    ATTENTION_BACKENDS,
    REGISTRY,
    Call,
    attend,
    auto_backend,
    check_attention_backend,
)
