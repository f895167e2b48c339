#!/usr/bin/env bash
# Runs a pretraining command on every host of a Cloud TPU VM pod slice.
#
#   tpu/run_pod.sh TPU_NAME ZONE gin/meta.gin gs://bucket/runs/meta_base \
#       --gin.VOCAB_PATH="'gs://bucket/spm/xlmeta.model'" \
#       --gin.ENGLISH_FILES="['gs://bucket/english/*.txt']" --gin.CC100_DIR="'gs://bucket/cc100'"
#
# Every host runs the same command; jax.distributed.initialize() finds the other hosts on
# TPU VMs by itself, each host reads its share of the data and Orbax writes one checkpoint.
# Rerun the same line after a preemption: the run resumes from MODEL_DIR.
set -euo pipefail
if [[ $# -lt 4 ]]; then
  echo "usage: $0 TPU_NAME ZONE GIN_FILE MODEL_DIR [--gin.X=Y ...]" >&2
  exit 2
fi
TPU_NAME=$1; ZONE=$2; GIN_FILE=$3; MODEL_DIR=$4; shift 4
REPO_URL=${REPO_URL:-}       # optional: git URL to clone on the hosts
WORKDIR=${WORKDIR:-xlmeta_jax}
EXTRA=$(printf " %q" "$@")

SETUP="set -e; cd ~;"
if [[ -n "$REPO_URL" ]]; then
  SETUP+=" [ -d $WORKDIR ] || git clone $REPO_URL $WORKDIR;"
fi
SETUP+=" cd $WORKDIR; python3 -m venv .venv; .venv/bin/pip install -q -e '.[tpu]';"
RUN=".venv/bin/python -m xlmeta_jax.train --gin_file=$GIN_FILE --gin.MODEL_DIR=\"'$MODEL_DIR'\"$EXTRA"

gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all \
  --command="$SETUP $RUN 2>&1 | tee -a ~/xlmeta_train.log"
