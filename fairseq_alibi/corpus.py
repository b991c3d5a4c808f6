"""``python -m fairseq_alibi.corpus``: the command-line tool :mod:`fairseq_alibi.cli.corpus`."""

import sys

from fairseq_alibi.cli.corpus import main

if __name__ == "__main__":
    sys.exit(main())
