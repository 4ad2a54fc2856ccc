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
for dev in PYTHON CPU; do
    stage "conformance suite, $dev" "${PYTEST[@]}" -p no:xdist --pyargs ember.testing --device=$dev
done
# PoCL builds each kernel slowly: fewer random graphs there
stage "conformance suite, CL" "${PYTEST[@]}" -p no:xdist --pyargs ember.testing --device=CL --fuzz-graphs 40
stage "conformance suite (casts), CPU with clang" \
    env CC=clang "${PYTEST[@]}" -p no:xdist --pyargs ember.testing.test_casts --device=CPU
# the CPU device on hardware command queues (ember.device.hcq): the conformance suite and the JIT tests
hcq_tests=$(ls tests/backend/test_jit.py 2>/dev/null)
stage "conformance suite${hcq_tests:+ and JIT tests}, CPU on HCQ (CPU_HCQ=1)" \
    env CPU_HCQ=1 DEV=CPU "${PYTEST[@]}" -p no:xdist --pyargs ember.testing --device=CPU $hcq_tests
# the AMD device against the mock KFD: queues, packets, signals and memory as the runtime drives them, each
# dispatch run by the same kernel built for the CPU with PoCL (this checks ember's side, not AMD's instructions)
if [ -d plugins/runtime_amd_hcq ]; then
    stage "conformance suite, AMD on the mock KFD (AMD_MOCK=1)" \
        env AMD_MOCK=1 "${PYTEST[@]}" -p no:xdist --pyargs ember.testing --device=AMD --fuzz-graphs 40
fi
if "$PY" -m pytest --collect-only -q -m corpus $PLUGIN_TESTS >/dev/null 2>&1; then
    stage "compile checks of the kernel corpus (targets without hardware here)" \
        env KERNEL_CORPUS="$KERNEL_CORPUS_DIR" "${PYTEST[@]}" -n 2 -m corpus $PLUGIN_TESTS
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
