from fairseq_alibi.models import alibi_transformer_lm  # noqa: F401
