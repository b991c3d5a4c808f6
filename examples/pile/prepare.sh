#!/usr/bin/env bash
# The Pile for config/mlm (pile_*: samples of 2048 tokens; longer documents dropped, as the
# ALiBi/CLAP RoBERTa study did) and config/lm (pile_alibi_gpt2_small: every document).
#
#   PILE=DIR GPT2_BPE=DIR bash examples/pile/prepare.sh [OUT]
#
# PILE holds the Pile's own layout: train/*.jsonl.zst, val.jsonl.zst, test.jsonl.zst.
# GPT2_BPE holds encoder.json, vocab.bpe and fairseq's dict.txt. Optional:
#   SUBSETS="Pile-CC,Wikipedia (en)"   keep only these pile_set_name values (comma-separated)
#   LONG_DOCS=truncate                 cut long documents to fit instead of dropping them
#   ONLY=mlm | ONLY=lm                 write one of the two datasets
# Writes OUT/data-bin/pile-mlm and OUT/data-bin/pile-lm (default OUT: data). A re-run builds
# what is missing (e.g. pile-lm after ONLY=mlm) and leaves an output that exists as it is,
# saying so; OVERWRITE=1 rebuilds them (the tools' --overwrite).
# PYTHON (default python) is the environment with fairseq-alibi; WORKERS the processes.
# Full reference: docs/configs_and_data.md
set -euo pipefail
# settings are environment variables: a flag here would be taken for OUT, or silently dropped
if [ $# -gt 1 ] || [[ "${1:-}" == -* ]]; then
  echo "usage: PILE=DIR GPT2_BPE=DIR [ONLY=mlm|lm] [OVERWRITE=1] bash $0 [OUT] (settings are environment variables)" >&2
  exit 2
fi
OUT="${1:-data}"
PY="${PYTHON:-python}"
WORKERS="${WORKERS:-$(nproc)}"
case "${OVERWRITE:-0}" in
  0) EXISTING=(--skip-existing) ;;
  1) EXISTING=(--overwrite) ;;
  *) echo "OVERWRITE=$OVERWRITE: set OVERWRITE=1 to rebuild existing outputs, or leave it unset" >&2; exit 2 ;;
esac
case "${ONLY:-}" in
  ""|mlm|lm) ;;
  *) echo "ONLY=$ONLY: set ONLY=mlm or ONLY=lm to write one of the two datasets, or leave it unset for both" >&2; exit 2 ;;
esac
: "${PILE:?set PILE to the folder with train/*.jsonl.zst, val.jsonl.zst, test.jsonl.zst}"
: "${GPT2_BPE:?set GPT2_BPE to the folder with encoder.json, vocab.bpe and dict.txt}"

shopt -s nullglob
TRAIN=("$PILE"/train/*.jsonl.zst "$PILE"/train/*.jsonl)
[ ${#TRAIN[@]} -gt 0 ] || { echo "no $PILE/train/*.jsonl.zst" >&2; exit 1; }
ARGS=(--train "${TRAIN[@]}" --gpt2-bpe "$GPT2_BPE" --workers "$WORKERS" "${EXISTING[@]}")
for split in valid test; do
  name=$([ "$split" = valid ] && echo val || echo test)
  for f in "$PILE/$name.jsonl.zst" "$PILE/$name.jsonl"; do
    if [ -f "$f" ]; then ARGS+=(--"$split" "$f"); break; fi
  done
done
if [ -n "${SUBSETS:-}" ]; then
  IFS=, read -ra NAMES <<< "$SUBSETS"
  ARGS+=(--subsets "${NAMES[@]}")
fi

if [ "${ONLY:-mlm}" = mlm ]; then
  "$PY" -m fairseq_alibi.preprocess.pile "${ARGS[@]}" --destdir "$OUT/data-bin/pile-mlm" \
    --tokens-per-sample 2048 --long-docs "${LONG_DOCS:-drop}"
fi
if [ "${ONLY:-lm}" = lm ]; then
  "$PY" -m fairseq_alibi.preprocess.pile "${ARGS[@]}" --destdir "$OUT/data-bin/pile-lm"
fi
