#!/usr/bin/env bash
# The device runs the open issues wait for, in priority order, for one H200 session (30 minutes of
# device time, 10 per command): run one STEP per call, e.g.
#     bash bench/h200_session.sh tests     # then: microbench, engine, decode-b8, prefill, moe, tune
# Each step installs polymorph (non-editable: see README, 'On the GPU machine'), writes its results
# and log under $OUT, and stays under the 10-minute limit.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
STEP=${1:?usage: bench/h200_session.sh tests|microbench|engine|decode-b8|prefill|moe|tune|tp}
python -m pip install --quiet --no-deps --no-build-isolation . >"$OUT/install.log" 2>&1 || { tail "$OUT/install.log"; exit 1; }
ROOT=$PWD
run() {  # name, limit in seconds, command...
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit}s): $*"
  (cd /tmp && timeout "$limit" "$@") >"$OUT/$name.log" 2>&1
  echo "   exit $? ; tail:"
  tail -25 "$OUT/$name.log"
}
case "$STEP" in
  tests)  # every device test: kernels at full shapes, whole models, the GPU microbench smoke test
    run tests-cuda 560 python -m pytest "$ROOT/tests" -m cuda -q -p no:cacheprovider -x ;;
  microbench)  # issue 7: calibrate, then predicted against measured per kernel and per step
    run microbench 240 python -m polymorph.cli microbench --backend cuda --target h200 --out "$OUT/calib"
    run costmodel 300 python "$ROOT/bench/costmodel_check.py" --calibration "$OUT/calib" --batch 1 32 \
      --out "$OUT/costmodel.json" ;;
  engine)  # issue 5: cold start against hot swap of one Triton kernel, every gate included
    run engine-swap 560 python "$ROOT/bench/engine_swap.py" --model llama-3.2-1b --backend cuda \
      --target h200 --dtype bf16 --ctx 1024 --group layers.0.mlp.down+residual \
      --kernel triton/linear_residual.py --candidates 8 --out "$OUT/engine-swap.json" ;;
  decode-b8)  # issue 3: the points that were slower than torch.compile, with every config of layer 0
    run decode-b8 560 python "$ROOT/bench/decode.py" --batch 8 32 --ctx 1024 --peers reduce-overhead \
      --kernels --sweep --steps 100 --out "$OUT/decode-b8.json" ;;
  prefill)  # issue 3: the 2k prefill, unmeasured since the norm runs unfused above 64 rows (8f25429)
    run prefill 560 python "$ROOT/bench/decode.py" --batch 1 --ctx 1024 --peers reduce-overhead \
      --prefill 2048 --kernels --steps 100 --out "$OUT/prefill.json" ;;
  moe)  # issue 3: the Mixtral-style MoE points
    run moe 560 python "$ROOT/bench/decode.py" --model mixtral-8x7b --layers 4 --batch 1 32 --ctx 1024 \
      --peers eager reduce-overhead --out "$OUT/moe.json" ;;
  tune)  # issue 6: the 6-minute tune of Llama-3.2-1B at batch 1 (engine start and A/B included)
    run tune 590 python -m polymorph.cli tune llama-3.2-1b --backend cuda --target h200 --batch 1 --ctx 1024 \
      --budget 6m --workers 1 --out /tmp/tuned --registry /tmp/tuned-registry.sqlite
    cp /tmp/tuned/tune-report.json "$OUT/" ;;  # $OUT brings back 8 files at most
  tp)  # issue 7, on the device kind nvidia-h200-x2: TP=2 against one GPU, measured and predicted
    run tp 560 python "$ROOT/bench/tp_check.py" --batch 1 --ctx 1024 --out "$OUT/tp.json" ;;
  *) echo "unknown step $STEP" >&2; exit 2 ;;
esac
