"""``python -m fairseq_alibi.corpus``: ``fairseq-alibi corpus`` (fairseq_alibi/__main__.py's TOOLS)."""

from fairseq_alibi.__main__ import run_alias

run_alias(__name__, __spec__)
