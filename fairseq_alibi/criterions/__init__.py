"""Criteria registered with fairseq when the package is imported (or given to ``--user-dir``)."""

from fairseq_alibi.criterions import lm_distillation, masked_lm_documents  # noqa: F401
