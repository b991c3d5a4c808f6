"""``python -m fairseq_alibi --user-dir`` prints the directory to pass to fairseq's ``--user-dir``."""

import argparse
import sys

from fairseq_alibi.paths import user_dir


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_alibi",
        description="ALiBi for stock fairseq. Use with: fairseq-train --user-dir "
        '"$(python -m fairseq_alibi --user-dir)" --arch alibi_transformer_lm ...',
    )
    parser.add_argument("--user-dir", action="store_true", help="print the --user-dir path")
    parser.add_argument("--version", action="store_true", help="print the package version")
    args = parser.parse_args(argv)
    if args.version:
        from fairseq_alibi.version import __version__

        print(__version__)
    elif args.user_dir:
        print(user_dir())
    else:
        parser.print_help()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
