#!/usr/bin/env bash
# A parallel corpus given as local text files, binarized for config/translation and
# `fairseq-train --task translation --arch alibi_transformer*`.
#
#   bash examples/translation/prepare.sh TEXT SRC TGT [OUT]
#       TEXT/{train,valid,test}.{SRC,TGT}: one sentence a line, tokenized (words or BPE pieces),
#       line n of one side the translation of line n of the other (e.g. the output of fairseq's
#       examples/translation/prepare-iwslt14.sh: TEXT=iwslt14.tokenized.de-en SRC=de TGT=en)
#   RESTORATION=wiki.train.tokens bash examples/translation/prepare.sh - src tgt [OUT]
#       makes the corpus from monolingual text instead: punctuation-and-case restoration
#       (docs/translation.md)
#
# Writes OUT/data-bin/<name> (name: basename of TEXT, or "restoration", with its text pairs in
# OUT/data-bin/restoration.text); JOINED=1 builds one dictionary for both sides
# (--share-all-embeddings). A re-run leaves an output that exists as it is, saying so;
# OVERWRITE=1 rebuilds it (the tool's --overwrite). A missing side, sides of different line
# counts or an empty line stop it with a one-line error. PYTHON (default python) is the
# environment with fairseq-alibi; WORKERS the processes. Full reference: docs/translation.md
set -euo pipefail
# settings are environment variables: a flag here would be taken for TEXT, SRC, TGT or OUT
flags=0
for arg in "$@"; do [[ "$arg" == -?* ]] && flags=1; done
if [ $# -lt 3 ] || [ $# -gt 4 ] || [ "$flags" = 1 ]; then
  sed -n '2,18p' "$0" >&2
  exit 2
fi
TEXT="$1"; SRC="$2"; TGT="$3"; OUT="${4:-data}"
PY="${PYTHON:-python}"
WORKERS="${WORKERS:-$(nproc)}"
case "${OVERWRITE:-0}" in
  0) EXTRA=(--skip-existing) ;;
  1) EXTRA=(--overwrite) ;;
  *) echo "OVERWRITE=$OVERWRITE: set OVERWRITE=1 to rebuild existing outputs, or leave it unset" >&2; exit 2 ;;
esac
[ "${JOINED:-0}" = "1" ] && EXTRA+=(--joined-dictionary)

if [ -n "${RESTORATION:-}" ]; then
  "$PY" -m fairseq_alibi.preprocess.parallel --restoration-from "$RESTORATION" -s "$SRC" -t "$TGT" \
    --destdir "$OUT/data-bin/restoration" --workers "$WORKERS" "${EXTRA[@]}"
else
  "$PY" -m fairseq_alibi.preprocess.parallel -s "$SRC" -t "$TGT" \
    --trainpref "$TEXT/train" --validpref "$TEXT/valid" --testpref "$TEXT/test" \
    --destdir "$OUT/data-bin/$(basename "$TEXT")" --workers "$WORKERS" "${EXTRA[@]}"
fi
