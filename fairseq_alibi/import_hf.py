"""``python -m fairseq_alibi.import_hf``: ``fairseq-alibi import-hf``, in :mod:`fairseq_alibi.cli.huggingface`."""

import sys

from fairseq_alibi.cli.huggingface import import_main as main

if __name__ == "__main__":
    sys.exit(main())
