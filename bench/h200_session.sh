#!/usr/bin/env bash
# The device runs the open issues wait for, in priority order, for one H200 session (30 minutes of
# device time, 10 per command): run several STEPs per call, e.g.
#     bash bench/h200_session.sh smoke engine decode-b8      # then: tune microbench, prefill moe ...
# polymorph is installed once per call (non-editable: see README, 'On the GPU machine'); each step
# writes its results and log under $OUT. All steps share one deadline (DEADLINE seconds, default 580,
# under the 10-minute limit per command): a step's own limit is cut to what is left. A failed `smoke`
# (the tiny models against the reference) ends the call at once, so no device time goes on a broken
# build.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
STEPS=("$@")
[ ${#STEPS[@]} -gt 0 ] || { echo "usage: bench/h200_session.sh STEP... (smoke tests microbench engine decode-b1 decode decode-b8 variants prefill moe tune tp)" >&2; exit 2; }
DEADLINE=${DEADLINE:-580}
python -m pip install --quiet --no-deps --no-build-isolation . >"$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 1; }
ROOT=$PWD
run() {  # name, limit in seconds, command...; returns the command's exit status
  local name=$1 limit=$2 left=$((DEADLINE - SECONDS - 5)) rc
  shift 2
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 20 ]; then echo "== $name: skipped, ${left}s left of the call's deadline"; return 124; fi
  echo "== $name (limit ${limit}s, at ${SECONDS}s): $*"
  (cd /tmp && timeout "$limit" "$@") >"$OUT/$name.log" 2>&1
  rc=$?
  echo "   exit $rc at ${SECONDS}s; tail:"
  tail -25 "$OUT/$name.log"
  return $rc
}
step() {
case "$1" in
  smoke)  # the tiny models and two full-shape Llama layers against the reference; fail fast
    run smoke 180 python -m pytest "$ROOT/tests/backends/cuda/test_cuda_models.py" -m cuda -q \
      -p no:cacheprovider -x --durations=5 || { echo "smoke failed: stopping this call"; exit 1; } ;;
  tests)  # every device test: kernels at full shapes, whole models, the GPU microbench smoke test
    run tests-cuda 560 python -m pytest "$ROOT/tests" -m cuda -q -p no:cacheprovider -x ;;
  microbench)  # issue 7: calibrate, then predicted against measured per kernel and per step
    run microbench 240 python -m polymorph.cli microbench --backend cuda --target h200 --out "$OUT/calib"
    run costmodel 300 python "$ROOT/bench/costmodel_check.py" --calibration "$OUT/calib" --batch 1 32 \
      --out "$OUT/costmodel.json" ;;
  engine)  # issue 5: cold start against hot swap of one Triton kernel, every gate included
    run engine-swap 240 python "$ROOT/bench/engine_swap.py" --model llama-3.2-1b --backend cuda \
      --target h200 --dtype bf16 --ctx 1024 --group layers.0.mlp.down+residual \
      --kernel triton/linear_residual.py --candidates 8 --out "$OUT/engine-swap.json" ;;
  decode-b1)  # issue 20: batch 1 at 1k first, with every kernel's bandwidth (split-K attention, PDL)
    run decode-b1 300 python "$ROOT/bench/decode.py" --batch 1 --ctx 1024 --peers reduce-overhead \
      --kernels --steps 100 --out "$OUT/decode-b1.json" ;;
  variants)  # issue 20: the kernel variants of bench/h200_variants.py (config keys per kernel file), each
    # checked against the peer and float32 and timed, alternated, against torch.compile at 1x1k, 32x8k,
    # 8x1k, 64x1k, 1x8k (in that order, under the call's deadline)
    run variants 560 python "$ROOT/bench/h200_variants.py" --deadline $((DEADLINE - SECONDS - 45)) \
      --out "$OUT/variants.json"
    sed -n '/^copy bandwidth .* at the start/,$p' "$OUT/variants.log" ;;  # the whole table, past the tail
  decode)  # issue 3: every decode point of the table (reduce-overhead, the best mode at batch 1 and 32)
    run decode 560 python "$ROOT/bench/decode.py" --batch 1 8 32 64 --ctx 1024 8192 --peers reduce-overhead \
      --steps 100 --out "$OUT/decode.json" ;;
  decode-b8)  # issue 3: the points that were slower than torch.compile, with every config of layer 0
    run decode-b8 560 python "$ROOT/bench/decode.py" --batch 8 32 --ctx 1024 --peers reduce-overhead \
      --kernels --sweep --steps 100 --out "$OUT/decode-b8.json" ;;
  prefill)  # issue 3: the 2k prefill, unmeasured since the norm runs unfused above 64 rows (8f25429)
    run prefill 560 python "$ROOT/bench/decode.py" --batch 1 --ctx 1024 --peers reduce-overhead \
      --prefill 2048 --kernels --steps 100 --out "$OUT/prefill.json" ;;
  moe)  # issue 3: the Mixtral-style MoE points, with every kernel timed alone (batch 32 was slower)
    run moe 560 python "$ROOT/bench/decode.py" --model mixtral-8x7b --layers 4 --batch 1 32 --ctx 1024 \
      --peers eager reduce-overhead --kernels --out "$OUT/moe.json" ;;
  tune)  # issue 6: the 6-minute tune of Llama-3.2-1B at batch 1 (engine start and A/B included)
    run tune 420 python -m polymorph.cli tune llama-3.2-1b --backend cuda --target h200 --batch 1 --ctx 1024 \
      --budget 6m --workers 1 --out /tmp/tuned --registry /tmp/tuned-registry.sqlite
    cp /tmp/tuned/tune-report.json "$OUT/" ;;
  tp)  # issue 7, on the device kind nvidia-h200-x2: TP=2 against one GPU, measured and predicted
    # With `microbench` first in the same call, the prediction uses its all-reduce latency.
    calib=(); [ -f "$OUT/calib/h200.toml" ] && calib=(--calibration "$OUT/calib")
    run tp 560 python "$ROOT/bench/tp_check.py" --batch 1 --ctx 1024 --timeout $((DEADLINE - SECONDS - 30)) \
      "${calib[@]}" --out "$OUT/tp.json" ;;
  *) echo "unknown step $1" >&2; exit 2 ;;
esac
}
pack() {  # $OUT brings back 8 files at most: everything goes back as one archive
  tar czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
}
trap pack EXIT
for s in "${STEPS[@]}"; do step "$s"; done
