#!/usr/bin/env bash
# WikiText-103 for config/lm (word level, as the ALiBi paper) and, when GPT2_BPE names fairseq's
# GPT-2 BPE folder (encoder.json, vocab.bpe, dict.txt), for config/mlm (GPT-2 BPE on the raw
# text, as fairseq's RoBERTa pretraining tutorial).
#
#   bash examples/wikitext103/prepare.sh [OUT]                      downloads into OUT (data)
#   WIKITEXT=DIR bash examples/wikitext103/prepare.sh [OUT]         DIR/wiki.{train,valid,test}.tokens
#   GPT2_BPE=DIR [WIKITEXT_RAW=DIR] bash examples/wikitext103/prepare.sh [OUT]
#
# Writes OUT/data-bin/wikitext-103 and, with GPT2_BPE, OUT/data-bin/wikitext-103-bpe.
# A re-run builds what is missing (e.g. the BPE data, GPT2_BPE now set) and leaves an output
# that exists as it is, saying so; OVERWRITE=1 rebuilds them (the tools' --overwrite).
# PYTHON (default python) is the environment with fairseq-alibi; WORKERS the processes.
# Full reference: docs/configs_and_data.md
set -euo pipefail
# settings are environment variables: a flag here would be taken for OUT, or silently dropped
if [ $# -gt 1 ] || [[ "${1:-}" == -* ]]; then
  echo "usage: [WIKITEXT=DIR] [GPT2_BPE=DIR] [OVERWRITE=1] bash $0 [OUT] (settings are environment variables)" >&2
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

"$PY" -m fairseq_alibi.preprocess.wikitext --download --text-dir "${WIKITEXT:-$OUT/wikitext-103}" \
  --destdir "$OUT/data-bin/wikitext-103" --workers "$WORKERS" "${EXISTING[@]}"

if [ -n "${GPT2_BPE:-}" ]; then
  "$PY" -m fairseq_alibi.preprocess.wikitext --download --raw \
    --text-dir "${WIKITEXT_RAW:-$OUT/wikitext-103-raw}" --gpt2-bpe "$GPT2_BPE" \
    --destdir "$OUT/data-bin/wikitext-103-bpe" --workers "$WORKERS" "${EXISTING[@]}"
fi
