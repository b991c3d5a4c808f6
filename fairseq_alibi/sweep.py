"""``python -m fairseq_alibi.sweep``: the command-line tool :mod:`fairseq_alibi.cli.sweep`."""

import sys

from fairseq_alibi.cli.sweep import main

if __name__ == "__main__":
    sys.exit(main())
