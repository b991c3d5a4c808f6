"""alibi_transformer end to end: the model and its cross-attention options in process, the real
tools, and the translation experiments."""
