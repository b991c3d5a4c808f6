#!/usr/bin/env bash
# The whole test suite, from a fresh clone: sets up ./.venv if needed, then runs pytest.
# Extra arguments go to pytest (e.g. `bash tests/run.sh -k decoding -x`; `-n 0`: one process;
# test files or folders: only those, `bash tests/run.sh tests/attention`).
# One worker per core (pytest-xdist), a test file's tests on one worker (they share its fixtures),
# the files in the order tests/conftest.py gives (the longest first; xdist would put the files
# with the most tests first).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/examples/env.sh"
cd "$ROOT"
# test files or folders given: those only; else the whole of tests/
TARGET=tests
for arg in "$@"; do
  case "$arg" in -*) ;; *) if [ -e "${arg%%::*}" ]; then TARGET=; fi ;; esac
done
exec python -m pytest $TARGET -q -p no:cacheprovider -n auto --dist loadfile --no-loadscope-reorder "$@"
