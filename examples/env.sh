#!/usr/bin/env bash
# Sourced by examples/quickstart.sh and tests/run.sh: creates (or reuses) a virtual environment
# with torch 2.13.0, numpy<2, a working fairseq and this package, then activates it.
#
#   FAIRSEQ_ALIBI_VENV=DIR   where the environment lives (default: <repo>/.venv)
#
# torch and numpy are pinned through PIP_CONSTRAINT (an environment variable, because pip does
# not pass -c into the isolated build environment that compiles fairseq's extensions).
# An environment that already imports fairseq keeps it: no second fairseq is installed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FAIRSEQ_ALIBI_VENV:-$ROOT/.venv}"
export PIP_CONSTRAINT="$ROOT/examples/constraints.txt"
export PIP_DISABLE_PIP_VERSION_CHECK=1
READY="$VENV/.fairseq-alibi-ready"

if [ ! -f "$READY" ] || [ "$ROOT/setup.py" -nt "$READY" ] || [ "$ROOT/examples/constraints.txt" -nt "$READY" ]; then
  started=$(date +%s)
  echo "[env] setting up $VENV (once; a few minutes on a fresh machine)" >&2
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  pip_q() { "$VENV/bin/python" -m pip install -q "$@" 2>&1 | grep -v "^WARNING: Location" >&2 || true; }
  pip_q torch==2.13.0 "numpy<2"
  if ! "$VENV/bin/python" -c "import fairseq" >/dev/null 2>&1; then
    echo "[env] installing fairseq-fixed 0.12.3.1 (builds its extensions, ~3 minutes)" >&2
    pip_q fairseq-fixed==0.12.3.1
  fi
  pip_q -e "$ROOT[test,hf]"
  "$VENV/bin/python" -c "import fairseq, fairseq_alibi, torch, numpy; assert numpy.__version__ < '2'" \
    || { echo "[env] the environment in $VENV does not import fairseq_alibi; remove it and retry" >&2; exit 1; }
  touch "$READY"
  echo "[env] ready in $(( $(date +%s) - started )) s" >&2
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
