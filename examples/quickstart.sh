#!/usr/bin/env bash
# Train short, test long, in one command: an ALiBi and a sinusoidal transformer LM trained at
# L=64 tokens on a corpus built from Python's own documentation (no download), evaluated at
# L, 2L, 4L and 8L. Sets up ./.venv first if needed. Measured from a fresh clone (2026-11-24,
# 2 idle AMD EPYC cores, .venv already set up): 3 min 35 s wall, 443 CPU-seconds; longer on a
# busy machine (docs/quickstart.md#time-and-determinism).
#
#   bash examples/quickstart.sh                      # the default experiment
#   bash examples/quickstart.sh --smoke              # every step in about a minute
#   bash examples/quickstart.sh --window-cutoff 8    # + ALiBi rows with slope windows, T = 8
#   bash examples/quickstart.sh --out DIR --L 128 --max-update 2000 --seed 2
#   bash examples/quickstart.sh --data data-bin/wikitext-103 --size small --L 512
#   bash examples/quickstart.sh --help
source "$(dirname "$0")/env.sh"
exec python -m fairseq_alibi quickstart "$@"
