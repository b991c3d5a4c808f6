#!/usr/bin/env bash
# Train short, test long, in one command: an ALiBi and a sinusoidal transformer LM trained at
# L=64 tokens on a corpus built from Python's own documentation (no download), evaluated at
# L, 2L, 4L and 8L. About 10 minutes on 2 CPU cores; sets up ./.venv first if needed.
#
#   bash examples/quickstart.sh                      # the default experiment
#   bash examples/quickstart.sh --smoke              # every step in about a minute
#   bash examples/quickstart.sh --out DIR --L 128 --max-update 2000 --seed 2
#   bash examples/quickstart.sh --data data-bin/wikitext-103 --size small --L 512
#   bash examples/quickstart.sh --help
source "$(dirname "$0")/env.sh"
exec python -m fairseq_alibi.quickstart "$@"
