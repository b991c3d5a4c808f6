"""The ALiBi math (fairseq_alibi/alibi.py): slopes and bias matrices against the paper's code and
literal values."""
