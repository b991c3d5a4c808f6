#!/usr/bin/env bash
# The whole test suite, from a fresh clone: sets up ./.venv if needed, then runs pytest.
# Extra arguments go to pytest (e.g. `bash tests/run.sh -k decoding -x`; `-n 0`: one process).
# One worker per core (pytest-xdist), a test file's tests on one worker (they share its fixtures),
# the files in the order tests/conftest.py gives (the longest first; xdist would put the files
# with the most tests first).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/examples/env.sh"
cd "$ROOT"
exec python -m pytest tests -q -p no:cacheprovider -n auto --dist loadfile --no-loadscope-reorder "$@"
