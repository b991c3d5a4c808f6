#!/usr/bin/env bash
# GLUE for config/glue, offline, as fairseq's examples/roberta/preprocess_GLUE_tasks.sh does.
#
#   GLUE=DIR GPT2_BPE=DIR bash examples/glue/prepare.sh [OUT] [TASK ...]
#   GLUE=DIR SENTENCEPIECE=spm.model DICT=dict.txt bash examples/glue/prepare.sh [OUT] [TASK ...]
#
# GLUE holds one folder per task as the GLUE download script writes them (CoLA, MNLI, MRPC,
# QNLI, QQP, RTE, SST-2, STS-B). Encode with what the pretraining data used: GPT2_BPE (with
# fairseq's dict.txt), or the sentencepiece model and dict.txt of the Pile pipeline's output.
# Writes OUT/data-bin/glue/<TASK>-bin (default OUT: data; default tasks: all). A re-run builds
# the tasks that are missing (a task added) and leaves a <TASK>-bin that exists as it is,
# saying so; OVERWRITE=1 rebuilds them (the tools' --overwrite).
# PYTHON (default python) is the environment with fairseq-alibi; WORKERS the processes.
# Full reference: docs/configs_and_data.md
set -euo pipefail
# settings are environment variables: a flag here would be taken for OUT or a task
for arg in "$@"; do
  if [[ "$arg" == -* ]]; then
    echo "usage: GLUE=DIR GPT2_BPE=DIR [OVERWRITE=1] bash $0 [OUT] [TASK ...] ($arg is no task: settings are environment variables)" >&2
    exit 2
  fi
done
OUT="${1:-data}"
shift || true
PY="${PYTHON:-python}"
WORKERS="${WORKERS:-$(nproc)}"
case "${OVERWRITE:-0}" in
  0) EXISTING=(--skip-existing) ;;
  1) EXISTING=(--overwrite) ;;
  *) echo "OVERWRITE=$OVERWRITE: set OVERWRITE=1 to rebuild existing outputs, or leave it unset" >&2; exit 2 ;;
esac
: "${GLUE:?set GLUE to the folder with one folder per GLUE task}"

if [ -n "${GPT2_BPE:-}" ]; then
  ENCODER=(--gpt2-bpe "$GPT2_BPE")
elif [ -n "${SENTENCEPIECE:-}" ]; then
  ENCODER=(--sentencepiece "$SENTENCEPIECE" --dict "${DICT:?set DICT to the dict.txt of the pretraining data}")
else
  echo "set GPT2_BPE, or SENTENCEPIECE and DICT" >&2
  exit 1
fi
"$PY" -m fairseq_alibi.preprocess.glue --glue-dir "$GLUE" --destdir "$OUT/data-bin/glue" \
  --tasks "${@:-ALL}" "${ENCODER[@]}" --workers "$WORKERS" "${EXISTING[@]}"
