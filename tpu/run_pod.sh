#!/usr/bin/env bash
# Runs a pretraining command on every host of a Cloud TPU VM pod slice, with either trainer:
#
#   # ours (python -m xlmeta_jax.train): both phases in one command
#   tpu/run_pod.sh TPU_NAME ZONE gin/native/meta.gin gs://bucket/runs/meta_base \
#       --gin.VOCAB_PATH="'gs://bucket/spm/xlmeta.model'" \
#       --gin.ENGLISH_FILES="['gs://bucket/english/*.txt']" --gin.CC100_DIR="'gs://bucket/cc100'"
#   # t5x's (python -m t5x.train): one phase per command; then again with --gin.PHASE=2
#   ENTRY=t5x tpu/run_pod.sh TPU_NAME ZONE gin/meta.gin gs://bucket/runs/meta_base ...same flags...
#
# Every host runs the same command; jax.distributed.initialize() finds the other hosts on
# TPU VMs by itself, each host reads its share of the data and Orbax writes one checkpoint.
# Rerun the same line after a preemption: the run resumes from MODEL_DIR. With ENTRY=t5x the
# hosts also install t5x, airio and jestimator (not on the package index) from their git
# repositories at the commits the project is tested with, without their pinned dependencies.
set -euo pipefail
if [[ $# -lt 4 ]]; then
  echo "usage: [ENTRY=native|t5x] $0 TPU_NAME ZONE GIN_FILE MODEL_DIR [--gin.X=Y ...]" >&2
  exit 2
fi
TPU_NAME=$1; ZONE=$2; GIN_FILE=$3; MODEL_DIR=$4; shift 4
ENTRY=${ENTRY:-native}
REPO_URL=${REPO_URL:-}       # optional: git URL to clone on the hosts
WORKDIR=${WORKDIR:-xlmeta_jax}
EXTRA=$(printf " %q" "$@")
T5X_GIT=(
  "git+https://github.com/google-research/t5x@cc342d419ec3e3e9c4bf1df33c82330cafdc1e16"
  "git+https://github.com/google/airio@69897df7d9a427b947a9f7bb4164c7782b43e601"
  "git+https://github.com/google-research/jestimator@326824a477feef6d92e6f44175000907a72899ca"
)

SETUP="set -e; cd ~;"
if [[ -n "$REPO_URL" ]]; then
  SETUP+=" [ -d $WORKDIR ] || git clone $REPO_URL $WORKDIR;"
fi
SETUP+=" cd $WORKDIR; python3 -m venv .venv;"
case "$ENTRY" in
  native)
    SETUP+=" .venv/bin/pip install -q -c constraints.txt -e '.[tpu]';"
    MODULE=xlmeta_jax.train ;;
  t5x)
    SETUP+=" .venv/bin/pip install -q -c constraints.txt -e '.[tpu,t5x]';"
    SETUP+=" .venv/bin/pip install -q --no-deps ${T5X_GIT[*]};"
    MODULE=t5x.train ;;
  *)
    echo "ENTRY=$ENTRY: expected 'native' (python -m xlmeta_jax.train) or 't5x' (python -m t5x.train)" >&2
    exit 2 ;;
esac
RUN=".venv/bin/python -m $MODULE --gin_file=$GIN_FILE --gin.MODEL_DIR=\"'$MODEL_DIR'\"$EXTRA"

gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all \
  --command="$SETUP $RUN 2>&1 | tee -a ~/xlmeta_train.log"
