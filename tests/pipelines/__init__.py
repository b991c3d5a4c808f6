"""The data pipelines (WikiText, the Pile, GLUE, gettext, the embedded corpus) on tiny inputs
written in the real formats."""
