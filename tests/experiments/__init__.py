"""The experiments' bookkeeping in process and their --smoke runs (the translation experiments:
tests/translation)."""
