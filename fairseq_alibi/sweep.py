"""``python -m fairseq_alibi.sweep``: ``fairseq-alibi sweep`` (fairseq_alibi/__main__.py's TOOLS)."""

from fairseq_alibi.__main__ import run_alias

run_alias(__name__, __spec__)
