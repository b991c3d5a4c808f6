#!/usr/bin/env bash
# Makes a GPU machine's own Python run `python -m benchmarks.gpu`, offline.
#
# That machine has torch with CUDA, triton, numpy, pytest, pytest-xdist and sacrebleu, but no
# fairseq, hydra-core, omegaconf, bitarray, and no network. `.gpu/wheels` (not in git: carried
# beside the working tree) holds their wheels for CPython 3.12 on x86-64 Linux; this installs
# them with --no-deps --no-index into that Python (not a venv: its torch and numpy stay as they
# are), plus the few pure dependencies it may lack (PyYAML, tqdm, ...) only where they are
# missing, makes this repository importable, prints the versions, and fails with one clear line
# if `import fairseq, fairseq_alibi` does not work.
#
#   bash benchmarks/gpu_setup.sh               # on the GPU machine
#   bash benchmarks/gpu_setup.sh --download    # beforehand, where the package index is reachable
#
# PYTHON (default python3) is the interpreter to set up; GPU_WHEELS (default .gpu/wheels) the
# folder; PY_VERSION (default 3.12) the Python the download is for.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELS="${GPU_WHEELS:-$ROOT/.gpu/wheels}"
PYTHON="${PYTHON:-python3}"
# always installed (the machine has none of them); antlr4-python3-runtime 4.9.3 exists only as a
# source distribution, so --download builds its (pure Python) wheel
REQUIRED="fairseq-fixed==0.12.3.1 bitarray hydra-core==1.3.2 omegaconf==2.3.0"
ANTLR="antlr4-python3-runtime==4.9.3"
# installed only where `import MODULE` fails: what fairseq, hydra and omegaconf import that the
# machine may lack (module:distribution)
IF_MISSING="yaml:PyYAML tqdm:tqdm packaging:packaging regex:regex"

fail() { echo "gpu_setup: $*" >&2; exit 1; }

if [[ "${1:-}" == "--download" ]]; then
  version="${PY_VERSION:-3.12}"
  mkdir -p "$WHEELS"
  platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
             --platform manylinux2014_x86_64 --platform any)
  # shellcheck disable=SC2086
  pip download --quiet --no-deps --only-binary=:all: --python-version "$version" \
      --implementation cp --abi "cp${version/./}" "${platforms[@]}" -d "$WHEELS" $REQUIRED \
      $(for pair in $IF_MISSING; do echo "${pair#*:}"; done) \
    || fail "pip download failed (is the package index reachable?)"
  pip wheel --quiet --no-deps -w "$WHEELS" "$ANTLR" || fail "could not build the $ANTLR wheel"
  ls -l "$WHEELS"
  du -sh "$WHEELS"
  exit 0
fi

command -v "$PYTHON" >/dev/null || fail "no $PYTHON here (set PYTHON=/path/to/python)"
[[ -d "$WHEELS" ]] || fail "no $WHEELS: run 'bash benchmarks/gpu_setup.sh --download' where the \
package index is reachable, and carry .gpu with the working tree"
pyver="$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
ls "$WHEELS"/fairseq_fixed-*-"$pyver"-*.whl >/dev/null 2>&1 \
  || fail "$WHEELS has no fairseq-fixed wheel for $pyver ($PYTHON): download it with \
PY_VERSION=${pyver:2:1}.${pyver:3} bash benchmarks/gpu_setup.sh --download"

wheel_of() {  # the wheel in $WHEELS of distribution $1 for this Python
  local name="${1//-/_}"
  find "$WHEELS" -maxdepth 1 -iname "${name}-*.whl" \( -name "*-${pyver}-*" \
      -o -name "*-none-any.whl" -o -name "*-abi3-*" \) | sort | tail -n 1
}
install=()
for dist in $REQUIRED $ANTLR; do
  dist="${dist%%==*}"
  found="$(wheel_of "$dist")"
  [[ -n "$found" ]] || fail "no $dist wheel in $WHEELS (run --download again)"
  install+=("$found")
done
for pair in $IF_MISSING; do
  if ! "$PYTHON" -c "import ${pair%%:*}" 2>/dev/null; then
    found="$(wheel_of "${pair#*:}")"
    [[ -n "$found" ]] || fail "$PYTHON lacks ${pair#*:} and $WHEELS has no wheel of it"
    install+=("$found")
  fi
done
# PIP_BREAK_SYSTEM_PACKAGES: a distribution's Python may refuse pip installs (PEP 668) otherwise
PIP_BREAK_SYSTEM_PACKAGES=1 "$PYTHON" -m pip install --quiet --no-deps --no-index \
    --disable-pip-version-check "${install[@]}" \
  || fail "pip install of the wheels in $WHEELS failed (see above)"

site="$("$PYTHON" -c 'import site; print((site.getsitepackages() or [site.getusersitepackages()])[0])')"
# this repository: an editable install where pip can make one offline, else a .pth file
if ! PIP_BREAK_SYSTEM_PACKAGES=1 "$PYTHON" -m pip install --quiet --no-deps --no-index \
    --no-build-isolation --disable-pip-version-check -e "$ROOT" 2>/dev/null; then
  echo "$ROOT" > "$site/fairseq_alibi_repo.pth" \
    || fail "could not make $ROOT importable ($site is not writable)"
fi

# fairseq-fixed imports scikit-learn and scipy when it is imported (its GLUE criterion's
# f1_score, matthews_corrcoef, pearsonr, spearmanr; the audio classification task), though
# nothing run here calls them; their wheels (about 50 MB) would not fit the carried folder. Where
# the machine lacks them, stand-ins that raise if called are put on the path, after everything
# else (.pth), so that `import fairseq` works
SHIMS="$ROOT/.gpu/shims"
rm -rf "$SHIMS"
shim() {  # shim PACKAGE DISTRIBUTION MODULE NAME...: PACKAGE.MODULE whose NAMEs raise
  local package="$1" dist="$2" module="$3"; shift 3
  mkdir -p "$SHIMS/$package"
  echo '"""Stand-in written by benchmarks/gpu_setup.sh (the real package is not installed)."""' \
    > "$SHIMS/$package/__init__.py"
  cat > "$SHIMS/$package/$module.py" <<SHIM
"""Stand-in written by benchmarks/gpu_setup.sh: $dist is not installed on this machine."""


def _missing(*args, **kwargs):
    raise RuntimeError("$dist is not installed here (benchmarks/gpu_setup.sh put this "
                       "stand-in on the path so that fairseq imports): install $dist")


$(for name in "$@"; do echo "$name = _missing"; done)
SHIM
}
if ! "$PYTHON" -c "import sklearn.metrics" 2>/dev/null; then
  shim sklearn scikit-learn metrics f1_score matthews_corrcoef
  echo "gpu_setup: no scikit-learn here: a stand-in (fairseq imports it, nothing here uses it)"
fi
if ! "$PYTHON" -c "import scipy.stats" 2>/dev/null; then
  shim scipy scipy stats pearsonr spearmanr
  echo "gpu_setup: no scipy here: a stand-in (fairseq imports it, nothing here uses it)"
fi
if [[ -d "$SHIMS" ]]; then
  echo "$SHIMS" > "$site/zz_fairseq_alibi_gpu_shims.pth" \
    || fail "could not put $SHIMS on the path ($site is not writable)"
fi

cd /
"$PYTHON" - <<'EOF' || fail "import fairseq, fairseq_alibi failed with $PYTHON (the traceback is above)"
import importlib.metadata as md
import sys

import numpy
import torch

import fairseq
import fairseq_alibi

try:
    import triton
    triton_version = triton.__version__
except ImportError:
    triton_version = "none"
cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
print(f"gpu_setup: {sys.executable}: Python {sys.version.split()[0]}, torch {torch.__version__} (CUDA "
      f"{torch.version.cuda}, {cuda}), triton {triton_version}, numpy {numpy.__version__}, "
      f"fairseq {fairseq.__version__} ({md.version('fairseq-fixed')}), hydra-core "
      f"{md.version('hydra-core')}, omegaconf {md.version('omegaconf')}, fairseq_alibi from "
      f"{fairseq_alibi.__file__}")
EOF
