"""``python -m fairseq_alibi.export_hf``: ``fairseq-alibi export-hf``, in :mod:`fairseq_alibi.cli.huggingface`."""

import sys

from fairseq_alibi.cli.huggingface import export_main as main

if __name__ == "__main__":
    sys.exit(main())
