#!/usr/bin/env bash
# System packages the test suite needs beyond Python: clang (the CPU plugin is tested with gcc and
# with clang) and clang's OpenMP runtime (libomp-dev), so both compilers build multithreaded kernels;
# Debian's PoCL (an OpenCL platform for the CPU, LLVM 15), because PyPI's pocl-binary-distribution
# (PoCL 3.0, LLVM 14) cannot build kernels on CPUs newer than LLVM 14 (on AMD Zen 5 it asks for target
# CPU "generic", which LLVM 14 rejects).
# clang 19 with lld and LLVM's tools compiles and disassembles AMD GPU code objects for the AMD plugin's checks.
# Installs only what is missing, and only where it can (root with apt-get); elsewhere it says what to
# install and exits non-zero, so a test run never silently skips the clang stage.
set -uo pipefail

missing=()
command -v clang >/dev/null 2>&1 || missing+=(clang)
if command -v clang >/dev/null 2>&1; then
    echo '#include <omp.h>' | clang -fopenmp -x c -fsyntax-only - >/dev/null 2>&1 || missing+=(libomp-dev)
else
    missing+=(libomp-dev)
fi
[ -e /etc/OpenCL/vendors/pocl.icd ] || missing+=(pocl-opencl-icd ocl-icd-libopencl1)
# the AMD plugin's compile checks: clang 19 knows gfx1100 and gfx942 (PoCL's clang 15 lacks gfx942); lld links
# code objects, llvm-19 brings llvm-objdump for the disassembly checks
command -v clang-19 >/dev/null 2>&1 || missing+=(clang-19)
command -v ld.lld-19 >/dev/null 2>&1 || missing+=(lld-19)
command -v llvm-objdump-19 >/dev/null 2>&1 || missing+=(llvm-19)
# Optional: Chromium and its WebDriver for the browser test of ember.llm's chat page. Best effort: without them
# that one test skips with the reason, so a failed install here does not fail the run.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 \
            && echo "installed: chromium chromium-driver" \
            || echo "note: chromium could not be installed; the chat page's browser test will skip"
    else
        echo "note: no chromium/chromedriver (Debian: apt-get install chromium chromium-driver); the chat page's browser test will skip"
    fi
fi
[ ${#missing[@]} -eq 0 ] && exit 0

echo "system packages missing: ${missing[*]}"
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install them with your package manager (Debian/Ubuntu: sudo apt-get install ${missing[*]})" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${missing[@]}" >/dev/null; } \
    || { echo "apt-get could not install: ${missing[*]}" >&2; exit 1; }
echo "installed: ${missing[*]}"
