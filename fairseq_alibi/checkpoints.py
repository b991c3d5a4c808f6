"""``python -m fairseq_alibi.checkpoints``: the command-line tool :mod:`fairseq_alibi.cli.checkpoints`."""

import sys

from fairseq_alibi.cli.checkpoints import main

if __name__ == "__main__":
    sys.exit(main())
