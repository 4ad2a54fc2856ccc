#!/usr/bin/env bash
# `make test`: every test stage runs, each is reported, and the run fails at the end if any failed
# (pytest's exit 5, "no tests collected", is a failure too: every stage must collect tests).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY=${PY:-.venv/bin/python}
PYTEST=("$PY" -m pytest -q -p no:cacheprovider)
# every kernel the main suite lowers is recorded here; the compile-only checks of targets without
# hardware here (plugins' corpus tests) render and compile all of them
own_corpus=0
if [ -z "${KERNEL_CORPUS_DIR:-}" ]; then KERNEL_CORPUS_DIR=$(mktemp -d -t ember-corpus-XXXXXX); own_corpus=1; fi
PLUGIN_TESTS=$(ls -d plugins/*/tests 2>/dev/null | tr '\n' ' ')

names=()
codes=()
times=()
stage() {
    local name=$1
    shift
    echo
    echo "=== ${name}: $*"
    local start=$SECONDS
    "$@"
    local rc=$?
    names+=("$name")
    codes+=("$rc")
    times+=("$((SECONDS - start))")
}

stage "lint (ruff, mypy)" bash -c "\"$PY\" -m ruff check . && \"$PY\" -m mypy"
stage "main suite (CPU with the default compiler, PYTHON)" \
    env KERNEL_CORPUS="$KERNEL_CORPUS_DIR" "${PYTEST[@]}" -n 2 -m "not corpus" tests $PLUGIN_TESTS
# the parts of the backend suite where the C compiler matters (every dtype and cast, float16 through the
# emulated path clang 14 needs, math, reductions and matmul through OpenMP), and the CPU plugin's own tests
CLANG_TESTS="tests/backend/test_dtypes_basic.py tests/backend/test_dtypes_full.py tests/backend/test_elementwise.py
    tests/backend/test_transcendental.py tests/backend/test_reductions.py tests/backend/test_reduce_matmul.py
    tests/backend/test_ops_basic.py tests/backend/test_opts.py tests/backend/test_jit.py plugins/runtime_cpu/tests"
stage "backend suite (compiler-sensitive part), CPU with clang" \
    env CC=clang DEV=CPU "${PYTEST[@]}" -n 2 $CLANG_TESTS
stage "backend suite, CL (PoCL)" \
    env DEV=CL "${PYTEST[@]}" -n 2 tests/backend
# The conformance stages run in one process each: three lanes at a time keep both cores busy. A lane's
# output is printed when it ends; the summary gives each stage's own time.
lane_pids=()
lane_logs=()
lane() {  # lane STAGE-ARGS... separated by ";;" : the stages of one lane, in order, in the background
    local log
    log=$(mktemp -t ember-lane-XXXXXX)
    (
        names=(); codes=(); times=()
        cmd=()
        for arg in "$@" ";;"; do
            if [ "$arg" = ";;" ]; then stage "${cmd[@]}"; cmd=(); else cmd+=("$arg"); fi
        done
        for i in "${!names[@]}"; do printf '%s\t%s\t%s\n' "${names[$i]}" "${codes[$i]}" "${times[$i]}"; done \
            > "$log.summary"
    ) > "$log" 2>&1 &
    lane_pids+=($!)
    lane_logs+=("$log")
}
hcq_tests=$(ls tests/backend/test_jit.py 2>/dev/null)
# the random graphs start at a new seed each run (printed in the header: --fuzz-seed=N replays a failure)
CONF=("${PYTEST[@]}" -p no:xdist --pyargs ember.testing --fuzz-seed=random)
lane "conformance suite, PYTHON" "${CONF[@]}" --device=PYTHON ";;" \
    "conformance suite, CPU" "${CONF[@]}" --device=CPU ";;" \
    "conformance suite (casts), CPU with clang" env CC=clang "${PYTEST[@]}" -p no:xdist \
        --pyargs ember.testing.test_casts --device=CPU ";;" \
    "conformance suite${hcq_tests:+ and JIT tests}, CPU on HCQ (CPU_HCQ=1)" \
        env CPU_HCQ=1 DEV=CPU "${CONF[@]}" --device=CPU $hcq_tests
# PoCL builds each kernel slowly: fewer random graphs there
lane "conformance suite, CL" "${CONF[@]}" --device=CL --fuzz-graphs 40
# the AMD device against the mock KFD: queues, packets, signals and memory as the runtime drives them, each
# dispatch run by the same kernel built for the CPU with PoCL (this checks ember's side, not AMD's instructions)
if [ -d plugins/runtime_amd_hcq ]; then
    lane "conformance suite, AMD on the mock KFD (AMD_MOCK=1)" env AMD_MOCK=1 "${CONF[@]}" --device=AMD \
        --fuzz-graphs 20
fi
for i in "${!lane_pids[@]}"; do
    wait "${lane_pids[$i]}"
    cat "${lane_logs[$i]}"
    if [ -s "${lane_logs[$i]}.summary" ]; then
        while IFS=$'\t' read -r n c t; do names+=("$n"); codes+=("$c"); times+=("$t"); done < "${lane_logs[$i]}.summary"
    else  # the lane died before it could report: count it as failed
        names+=("conformance lane $((i + 1)) (did not report)"); codes+=(1); times+=(0)
    fi
    rm -f "${lane_logs[$i]}" "${lane_logs[$i]}.summary"
done
# the recorded corpus (~5,600 kernels) costs 75-100 s of compiler time per target: Ampere and RDNA3 build
# all of it; Turing, Hopper and CDNA3 build the representative kernels (every dtype, TC, local memory, variables)
if "$PY" -m pytest --collect-only -q -m corpus $PLUGIN_TESTS >/dev/null 2>&1; then
    stage "compile checks of the kernel corpus (targets without hardware here)" \
        env KERNEL_CORPUS="$KERNEL_CORPUS_DIR" KERNEL_CORPUS_ARCHS="sm_80 gfx1100" "${PYTEST[@]}" -n 2 -m corpus \
            $PLUGIN_TESTS
fi

echo
echo "=== summary"
failed=0
for i in "${!names[@]}"; do
    if [ "${codes[$i]}" -eq 0 ]; then verdict=passed; else verdict="FAILED (exit ${codes[$i]})"; failed=1; fi
    printf '  %-70s %5ss  %s\n' "${names[$i]}" "${times[$i]}" "$verdict"
done
[ $own_corpus -eq 1 ] && rm -rf "$KERNEL_CORPUS_DIR"
exit $failed
