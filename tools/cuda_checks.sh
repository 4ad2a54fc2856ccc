#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, in one run: the backend suite and the CUDA plugin's tests on CUDA, the
# fuzzer on CUDA against the PYTHON reference, answers past 2**31 elements on real device memory
# (bench/scale_check.py) and the CUDA benchmark against torch. CI has no GPU: run this on a machine with one.
# Each part has its own time limit and log; the logs go to $OUT (default ./cuda-logs).
# Without network: ember and its CPU and CUDA plugins are installed from this checkout with --no-deps, so
# numpy, pluggy, cuda-bindings and NVRTC must be installed already (a CUDA image with PyTorch has them).
set -u
OUT=${OUT:-cuda-logs}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SITE=${EMBER_SITE:-/tmp/ember-site}
JOBS=${JOBS:-6}

if [ ! -d "$SITE/ember" ]; then
    # wheels of what the image lacks (cffi for the CPU plugin, say) may lie in $WHEELS
    extra=$(ls "${WHEELS:-.whl}"/*.whl 2>/dev/null)
    "$PY" -m pip install -q --no-deps --no-build-isolation --no-index --target "$SITE" \
        . plugins/runtime_cpu plugins/runtime_cuda $extra > "$OUT/install.log" 2>&1 || { tail -30 "$OUT/install.log"; exit 1; }
fi
export PYTHONPATH="$SITE" PYTHONUNBUFFERED=1
{ nvidia-smi -L; "$PY" -m pip list 2>/dev/null | grep -i -E "cuda|nvrtc|numpy|pluggy|torch "; "$PY" -m ember.doctor; } \
    > "$OUT/doctor.log" 2>&1

# the suite (the tests, not the installed copy's: PYTHONPATH puts the installed package first, same code)
( DEV=CUDA timeout "${SUITE_S:-420}" "$PY" -m pytest -q -p no:cacheprovider -n "$JOBS" -m "not corpus" \
    tests/backend plugins/runtime_cuda/tests > "$OUT/suite.log" 2>&1; echo "exit $?" >> "$OUT/suite.log" ) &
[ "${FUZZ_N:-1500}" -gt 0 ] && ( timeout "${FUZZ_S:-400}" "$PY" bench/fuzz.py --device CUDA --n "${FUZZ_N:-1500}" --start 300000 --batch 50 \
    --max-report 5 > "$OUT/fuzz.log" 2>&1; echo "exit $?" >> "$OUT/fuzz.log" ) &
( timeout "${SCALE_S:-300}" "$PY" bench/scale_check.py --device CUDA > "$OUT/scale.log" 2>&1; echo "exit $?" >> "$OUT/scale.log"
  [ "${BENCH_S:-150}" -gt 0 ] && timeout "${BENCH_S:-150}" "$PY" bench/bench_cuda.py --quick > "$OUT/bench.log" 2>&1; echo "exit $?" >> "$OUT/bench.log" ) &
# the fuzzer on the CPU device too, spread over the machine's cores (CPU_FUZZ_N graphs in CPU_FUZZ_PROCS processes)
if [ "${CPU_FUZZ_N:-0}" -gt 0 ]; then
    procs=${CPU_FUZZ_PROCS:-4}; per=$(( (CPU_FUZZ_N + procs - 1) / procs ))
    for i in $(seq 0 $((procs - 1))); do
        ( timeout "${FUZZ_S:-400}" "$PY" bench/fuzz.py --device CPU --n "$per" --start $((400000 + i * per)) --batch 50 \
            --max-report 5 > "$OUT/cpufuzz$i.txt" 2>&1; echo "exit $?" >> "$OUT/cpufuzz$i.txt" ) &
    done
fi
wait
tail -n 3 "$OUT"/*.log
[ "${CPU_FUZZ_N:-0}" -gt 0 ] && { tail -q -n 2 "$OUT"/cpufuzz*.txt | grep -v "^exit 0"; cat "$OUT"/cpufuzz*.txt | tr '\r' '\n' \
    | grep -v "^fuzz:" > "$OUT/cpufuzz.log"; rm -f "$OUT"/cpufuzz*.txt; }
true
