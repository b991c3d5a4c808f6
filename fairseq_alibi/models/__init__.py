from fairseq_alibi.models import alibi_transformer_lm  # noqa: F401
from fairseq_alibi.models import alibi_roberta  # noqa: F401
