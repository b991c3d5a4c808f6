"""``python -m fairseq_alibi.glue``: the command-line tool :mod:`fairseq_alibi.cli.glue`."""

import sys

from fairseq_alibi.cli.glue import main

if __name__ == "__main__":
    sys.exit(main())
