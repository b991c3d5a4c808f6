"""``python -m fairseq_alibi.convert``: the command-line tool :mod:`fairseq_alibi.cli.convert`."""

import sys

from fairseq_alibi.cli.convert import main

if __name__ == "__main__":
    sys.exit(main())
