"""The model families, one registered model per file (importing this registers them)."""

from fairseq_alibi.models import alibi_transformer_lm  # noqa: F401
from fairseq_alibi.models import alibi_roberta  # noqa: F401
from fairseq_alibi.models import alibi_transformer  # noqa: F401
