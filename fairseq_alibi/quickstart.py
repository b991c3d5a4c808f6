"""``python -m fairseq_alibi.quickstart``: the command-line tool :mod:`fairseq_alibi.cli.quickstart`."""

import sys

from fairseq_alibi.cli.quickstart import main

if __name__ == "__main__":
    sys.exit(main())
