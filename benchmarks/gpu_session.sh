#!/usr/bin/env bash
# One device session for issue #43 (run from the repository root on the lent GPU machine):
# the CUDA tests, then the harness's gpu study (benchmarks/studies/gpu.py) with its variants and the second model.
# pylance is not in the machine's image and there is no registry there: it travels as
# .whl/lance.tar.xz (the pylance 14.0.2 wheel unpacked and xz-compressed, 48 MB; the wheel itself is
# 85 MB, over the 64 MiB carry limit), carried with `carry: [".whl"]`.
# Writes its logs and the report under $OUT (OUT=/tmp/out when unset, for a dry run).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
STEP_TESTS=${STEP_TESTS:-150}
STEP_BENCH=${STEP_BENCH:-300}
BENCH_ARGS=${BENCH_ARGS:---set variants=cpu=0.5+threads=12+prio,cpu=0.75+threads=12,cpu=0.75+threads=12+prio,cpu=0.9+threads=14+prio,cpu=1.0+threads=14 --set model2=true --set batch2=1024 --set steps2=40}
PY=${PY:-python3}
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/session.log"; }

log "setup"
if [ -f .whl/lance.tar.xz ]; then
  mkdir -p /tmp/site && tar xJf .whl/lance.tar.xz -C /tmp/site || { log "unpacking pylance failed"; exit 3; }
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1
  nproc
  $PY -c "import sys, torch, torchvision, lance, pyarrow, lightning; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torchvision.__version__, 'pylance', lance.__version__, 'pyarrow', pyarrow.__version__, 'lightning', lightning.__version__, 'cuda', torch.cuda.is_available())" 2>&1
  echo "torchcodec: $($PY -c 'import torchcodec, torchcodec.decoders; print(torchcodec.__version__)' 2>&1 | tail -1)"
  $PY -m pip list 2>/dev/null | grep -i -E "codec|nvjpeg|nvimg|^torch " || true
} 2>&1 | tee -a "$OUT/session.log"

log "tests (timeout ${STEP_TESTS}s)"
started=$(date +%s)
timeout "$STEP_TESTS" $PY -m pytest -p no:cacheprovider -q -rs --durations=8 \
  tests/unit/device \
  "tests/unit/callbacks/test_replay.py::test_replay_on_cuda_caches_device_batches_and_restores_the_model" \
  >"$OUT/tests.log" 2>&1
echo "tests rc=$?" | tee -a "$OUT/session.log"
left=$((STEP_TESTS - ($(date +%s) - started)))
if [ "$left" -gt 20 ]; then
  timeout "$left" $PY -m pytest -p no:cacheprovider -q -rs -m cuda tests/unit/produce/test_badrows.py \
    >>"$OUT/tests.log" 2>&1
  echo "badrows cuda tests rc=$?" | tee -a "$OUT/session.log"
fi
grep -E "passed|failed|error|SKIPPED|FAILED|ERROR" "$OUT/tests.log" | tail -30 | tee -a "$OUT/session.log"

log "python -m benchmarks run gpu $BENCH_ARGS (timeout ${STEP_BENCH}s)"
# shellcheck disable=SC2086
timeout "$STEP_BENCH" $PY -m benchmarks run gpu --out "$OUT/gpu.md" --cache-dir /tmp/benchdata $BENCH_ARGS \
  >"$OUT/bench.log" 2>&1
echo "bench rc=$?" | tee -a "$OUT/session.log"
grep -v -i "warning" "$OUT/bench.log" | grep -E "^\[|^  [^ ]+: \{" | tail -40 | tee -a "$OUT/session.log"
log "done"
[ -f "$OUT/gpu.md" ] && cat "$OUT/gpu.md"
