#!/usr/bin/env bash
# Cross-build qlinear for aarch64 and run its tests under qemu-user, once per emulated CPU model.
#
#   tools/test-aarch64.sh [PYTEST ARGS...]      default args: the project's tests/ directory
#   tools/test-aarch64.sh --wheel DIR           build an aarch64 wheel into DIR (see below)
#
# Environment:
#   QEMU_CPUS              CPU models to run the tests on (default "max neoverse-n1 cortex-a72").
#                          What qemu reports through getauxval: max = dotprod+fp16+i8mm(+SVE),
#                          neoverse-n1 = dotprod+fp16, cortex-a72 = plain NEON.
#   QLINEAR_AARCH64_JOBS   how many CPU models' runs go at once (default: nproc; 1 = live output).
#   QLINEAR_AARCH64_CACHE  cache directory (default ~/.cache/qlinear-aarch64): arm64 root
#                          filesystem, build tree, staged package. Delete it to start over.
#   QLINEAR_AARCH64_MIRROR Debian mirror for the root filesystem (default: the one in this
#                          machine's apt sources).
#
# Meant for a Debian bookworm x86-64 machine, as root (or with sudo): it installs what it needs
# with apt (cross g++, qemu-user, qemu-user-binfmt, mmdebstrap, ...), makes an arm64 Debian root
# filesystem with Python, numpy, pytest and hypothesis (mmdebstrap --variant=extract, ~15 s), byte-
# compiles it once under qemu (~50 s, so later runs start fast), cross-compiles the _core target
# with CMake and tools/aarch64-toolchain.cmake (compiler native; only FindPython's queries of the
# arm64 interpreter go through qemu), stages
# STAGE/qlinear = python/qlinear + the .so, and runs `python -m pytest -q -p no:cacheprovider ARGS`
# with the arm64 python under qemu-aarch64 for each CPU model. A run that dies with SIGILL (a
# kernel using an instruction that CPU model lacks) exits 132 and counts as a failure.
#
# binfmt: tests that spawn sys.executable (tests/test_runtime.py) exec the arm64 python directly;
# that works only with qemu registered in binfmt_misc. The script installs qemu-user-binfmt (and
# binfmt-support), mounts binfmt_misc if needed and enables the qemu-aarch64 entry (kernel state,
# lost on reboot, so it is checked on every run). QEMU_LD_PREFIX and QEMU_CPU are passed in the
# environment so that such child processes get the same root filesystem and CPU model.
#
# An aarch64 wheel with `pip install .` / `pip wheel .` under qemu (tested: ~70 s, the wheel
# passes the test suite under qemu):
#   1. register qemu-aarch64 with binfmt_misc (as above; qemu-user-static + binfmt-support works
#      too): pip's build backend runs the arm64 python, CMake and the compiler as subprocesses;
#   2. add python3-venv,python3-pip to the root filesystem's --include list (this script does);
#   3. for `pip install .`, make a venv with the arm64 python (Debian's venv seeds pip from the
#      root filesystem's python3-pip-whl; under qemu that takes ~45 s):
#        QEMU_LD_PREFIX=ROOTFS ROOTFS/usr/bin/python3 -m venv VENV
#   4. run its pip; the compiler is the native cross compiler:
#        QEMU_LD_PREFIX=ROOTFS CC=aarch64-linux-gnu-gcc CXX=aarch64-linux-gnu-g++ \
#        CXXFLAGS="-idirafter ROOTFS/usr/include" VENV/bin/python -m pip install .
#      (`pip wheel . -w DIR` installs nothing, so the root filesystem's own python3 -m pip does
#      without a venv: that is what --wheel DIR runs, with the build tree kept in the cache.)
#   How it fits together: pip and scikit-build-core run emulated; the arm64 python's sysconfig
#   points into ROOTFS (its prefix is ROOTFS/usr), so FindPython gets ROOTFS's headers and the
#   aarch64 SOABI; CMake is the first `cmake` >= 3.18 on PATH (an x86-64 one runs natively;
#   with none, pip fetches the aarch64 cmake wheel from PyPI and it runs emulated). CMake then
#   believes it builds natively (CMAKE_SYSTEM_PROCESSOR=x86_64): CMakeLists.txt detects aarch64
#   from the compiler, which is why that test exists. pip fetches scikit-build-core and pybind11
#   from PyPI for the isolated build environment. The wheel is tagged linux_aarch64, not
#   manylinux: it needs bookworm's glibc (2.36) and libstdc++ or newer.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${QLINEAR_AARCH64_CACHE:-$HOME/.cache/qlinear-aarch64}"
CPUS="${QEMU_CPUS:-max neoverse-n1 cortex-a72}"
SUITE=bookworm
# The root filesystem's content; changing it (or the suite or mirror) rebuilds the root filesystem.
ROOTFS_PACKAGES="python3,python3-dev,python3-numpy,python3-pytest,python3-hypothesis,libstdc++6,python3-venv,python3-pip"

if [[ -t 2 ]]; then log() { printf '\033[1m[test-aarch64 +%ds]\033[0m %s\n' "$SECONDS" "$*" >&2; }
else log() { printf '[test-aarch64 +%ds] %s\n' "$SECONDS" "$*" >&2; }; fi
die() { log "error: $*"; exit 2; }

WHEEL_DIR=""
if [[ "${1:-}" == "--wheel" ]]; then
  [[ $# -eq 2 ]] || die "usage: $0 --wheel DIR"
  mkdir -p "$2"
  WHEEL_DIR="$(cd "$2" && pwd)"
  shift 2
elif [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
fi

# Pytest arguments: anything that names an existing file or directory (optionally with a ::node id)
# is made absolute, since the tests run from the repository root.
PYTEST_ARGS=()
for arg in "$@"; do
  if [[ "$arg" != -* && -e "${arg%%::*}" ]]; then
    path="${arg%%::*}"
    rest="${arg:${#path}}"
    if [[ -d "$path" ]]; then abs="$(cd "$path" && pwd)"; else abs="$(cd "$(dirname "$path")" && pwd)/$(basename "$path")"; fi
    PYTEST_ARGS+=("$abs$rest")
  else
    PYTEST_ARGS+=("$arg")
  fi
done
[[ ${#PYTEST_ARGS[@]} -gt 0 ]] || PYTEST_ARGS=("$REPO/tests")

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || die "not root and no sudo: cannot install packages or register binfmt"
  SUDO=(sudo)
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/lock"
flock 9  # one run at a time per cache directory

# ---------------------------------------------------------------------------------------------
# Host packages (apt-get update only when something is missing, so warm runs touch no network).
# ---------------------------------------------------------------------------------------------
installed() { [[ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" == installed ]]; }
want=(g++-aarch64-linux-gnu qemu-user mmdebstrap)
# qemu-user-binfmt registers qemu-aarch64 with binfmt_misc; it conflicts with qemu-user-static,
# which does the same job, so keep qemu-user-static if it is there.
if ! installed qemu-user-static; then want+=(qemu-user-binfmt binfmt-support); fi
command -v cmake >/dev/null || want+=(cmake)
command -v ninja >/dev/null || command -v make >/dev/null || want+=(ninja-build)
command -v python3 >/dev/null || want+=(python3)
missing=()
for p in "${want[@]}"; do installed "$p" || missing+=("$p"); done
if [[ ${#missing[@]} -gt 0 ]]; then
  log "installing ${missing[*]}"
  "${SUDO[@]}" apt-get update -qq
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# binfmt_misc: mount it if needed and enable qemu-aarch64 unless some handler for aarch64 ELF
# executables is already enabled.
AARCH64_MAGIC=7f454c460201010000000000000000000200b700
binfmt_ok() {
  local f
  for f in /proc/sys/fs/binfmt_misc/*; do
    [[ -f "$f" && "$(basename "$f")" != register && "$(basename "$f")" != status ]] || continue
    grep -qx enabled "$f" 2>/dev/null && grep -q "^magic $AARCH64_MAGIC" "$f" 2>/dev/null && return 0
  done
  return 1
}
if ! binfmt_ok; then
  [[ -e /proc/sys/fs/binfmt_misc/register ]] ||
    "${SUDO[@]}" mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || true
  if command -v update-binfmts >/dev/null; then
    "${SUDO[@]}" update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
  fi
  binfmt_ok || log "warning: could not register qemu-aarch64 with binfmt_misc: tests that run" \
                   "sys.executable in a subprocess will fail (Exec format error)"
fi

# ---------------------------------------------------------------------------------------------
# arm64 root filesystem
# ---------------------------------------------------------------------------------------------
debian_mirror() {
  # The first enabled "deb" source for $SUITE in this machine's apt sources (one-line or deb822).
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "$f" ]] || continue
    awk -v suite="$SUITE" '$1 == "deb" {
        i = 2; if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
        if ($(i + 1) == suite) { print $i; exit } }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    awk -v suite="$SUITE" 'BEGIN { RS = ""; FS = "\n" } {
        types = uris = suites = ""; enabled = 1
        for (j = 1; j <= NF; j++) {
          if ($j ~ /^Types:/) types = $j; else if ($j ~ /^URIs:/) uris = $j
          else if ($j ~ /^Suites:/) suites = $j; else if ($j ~ /^Enabled: *no/) enabled = 0
        }
        if (enabled && types ~ /[: ]deb( |$)/ && (" " suites " ") ~ (" " suite " ")) {
          sub(/^URIs: */, "", uris); split(uris, u, " "); print u[1]; exit } }' "$f"
  done
}
MIRROR="${QLINEAR_AARCH64_MIRROR:-$(debian_mirror | head -n 1)}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"

ROOTFS="$CACHE/rootfs-$SUITE"
ROOTFS_KEY="$SUITE $MIRROR $ROOTFS_PACKAGES"
if [[ ! -f "$ROOTFS/.qlinear-ready" || "$(cat "$ROOTFS/.qlinear-ready")" != "$ROOTFS_KEY" ]]; then
  log "making the arm64 root filesystem ($SUITE from $MIRROR)"
  rm -rf "$ROOTFS" "$ROOTFS.tmp"
  "${SUDO[@]}" mmdebstrap --quiet --variant=extract --arch=arm64 --include="$ROOTFS_PACKAGES" \
    "$SUITE" "$ROOTFS.tmp" "$MIRROR"
  [[ ${#SUDO[@]} -eq 0 ]] || sudo chown -R "$(id -u):$(id -g)" "$ROOTFS.tmp"
  # The extract variant runs no maintainer scripts, so update-alternatives never made these.
  for lib in blas/libblas.so.3 lapack/liblapack.so.3; do
    if [[ -e "$ROOTFS.tmp/usr/lib/aarch64-linux-gnu/$lib" ]]; then
      ln -sfn "$lib" "$ROOTFS.tmp/usr/lib/aarch64-linux-gnu/$(basename "$lib")"
    fi
  done
  log "byte-compiling its Python files under qemu (once)"
  QEMU_LD_PREFIX="$ROOTFS.tmp" qemu-aarch64 "$ROOTFS.tmp/usr/bin/python3" -m compileall -q \
    "$ROOTFS.tmp"/usr/lib/python3* >/dev/null || true   # a few test files do not compile: fine
  printf '%s\n' "$ROOTFS_KEY" >"$ROOTFS.tmp/.qlinear-ready"
  mv "$ROOTFS.tmp" "$ROOTFS"
fi
PY_VER="$(cd "$ROOTFS/usr/include" && ls -d python3.* | sort -V | tail -n 1)"   # e.g. python3.11
EXT_SUFFIX="$(sed -n "s/.*'EXT_SUFFIX': '\([^']*\)'.*/\1/p" "$ROOTFS/usr/lib/$PY_VER"/_sysconfigdata_*aarch64*.py | head -n 1)"
[[ -n "$EXT_SUFFIX" ]] || die "no EXT_SUFFIX in the root filesystem's sysconfigdata"

# Environment for anything run under qemu: the root filesystem's libraries, and nothing from the
# host that would confuse the arm64 loader or Python.
GUEST_ENV=(env -u LD_PRELOAD -u LD_LIBRARY_PATH -u PYTHONHOME -u PYTHONSTARTUP -u VIRTUAL_ENV
           QEMU_LD_PREFIX="$ROOTFS")

# ---------------------------------------------------------------------------------------------
# --wheel DIR: pip wheel . with the arm64 python under qemu, the cross compiler native.
# ---------------------------------------------------------------------------------------------
if [[ -n "$WHEEL_DIR" ]]; then
  binfmt_ok || die "--wheel needs qemu-aarch64 registered with binfmt_misc"
  log "pip wheel $REPO -w $WHEEL_DIR (pip emulated, compiler native)"
  start=$SECONDS
  # `pip wheel` installs nothing, so the root filesystem's own pip does (no venv needed); the
  # build tree is kept in the cache so that a second build is incremental.
  "${GUEST_ENV[@]}" CC=aarch64-linux-gnu-gcc CXX=aarch64-linux-gnu-g++ \
    CFLAGS="-idirafter $ROOTFS/usr/include" CXXFLAGS="-idirafter $ROOTFS/usr/include" \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CACHE_DIR="$CACHE/pip-cache" \
    "$ROOTFS/usr/bin/python3" -m pip wheel --no-deps "$REPO" -w "$WHEEL_DIR" \
    --config-settings=build-dir="$CACHE/wheel-build/{wheel_tag}"
  log "wheel built in $((SECONDS - start)) s: $(cd "$WHEEL_DIR" && ls -t qlinear-*aarch64*.whl | head -n 1)"
  exit 0
fi

# ---------------------------------------------------------------------------------------------
# Cross-build _core
# ---------------------------------------------------------------------------------------------
# pybind11's CMake config from the host (>= 2.12 for cross-compiling support).
pybind11_cmake_dir() {
  local path="${1:-}${PYTHONPATH:-}"
  [[ -z "${1:-}" || -z "${PYTHONPATH:-}" ]] || path="$1:$PYTHONPATH"
  PYTHONPATH="$path" python3 - <<'EOF' 2>/dev/null
import pybind11
if tuple(int(x) for x in pybind11.__version__.split(".")[:2]) >= (2, 12):
    print(pybind11.get_cmake_dir())
EOF
}
PYBIND11_DIR="$(pybind11_cmake_dir || true)"
if [[ -z "$PYBIND11_DIR" ]]; then
  PYBIND11_DIR="$(pybind11_cmake_dir "$CACHE/host-pybind11" || true)"
  if [[ -z "$PYBIND11_DIR" ]]; then
    log "installing pybind11 for the host into $CACHE/host-pybind11"
    python3 -m pip --version >/dev/null 2>&1 || {
      "${SUDO[@]}" apt-get update -qq
      "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
    }
    rm -rf "$CACHE/host-pybind11"
    python3 -m pip install -q --disable-pip-version-check --target "$CACHE/host-pybind11" "pybind11>=2.12"
    PYBIND11_DIR="$(pybind11_cmake_dir "$CACHE/host-pybind11")"
  fi
fi

# FindPython runs the interpreter: give it the arm64 one, through qemu.
mkdir -p "$CACHE/bin"
cat >"$CACHE/bin/python3-aarch64.tmp" <<EOF
#!/bin/sh
QEMU_LD_PREFIX="$ROOTFS" exec qemu-aarch64 "$ROOTFS/usr/bin/python3" "\$@"
EOF
chmod +x "$CACHE/bin/python3-aarch64.tmp"
mv "$CACHE/bin/python3-aarch64.tmp" "$CACHE/bin/python3-aarch64"

BUILD="$CACHE/build"
if command -v ninja >/dev/null; then GENERATOR=Ninja; else GENERATOR="Unix Makefiles"; fi
BUILD_KEY="$REPO|$GENERATOR|$(command -v cmake)|$PYBIND11_DIR|$(cat "$ROOTFS/.qlinear-ready")"
if [[ ! -f "$BUILD/.qlinear-key" || "$(cat "$BUILD/.qlinear-key")" != "$BUILD_KEY" ]]; then
  rm -rf "$BUILD"   # another source tree, generator or root filesystem: start afresh
fi
mkdir -p "$BUILD"
log "cross-building _core (build tree $BUILD)"
cmake -S "$REPO" -B "$BUILD" -G "$GENERATOR" --log-level=WARNING \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$REPO/tools/aarch64-toolchain.cmake" \
  -DQLINEAR_AARCH64_ROOTFS="$ROOTFS" \
  -Dpybind11_DIR="$PYBIND11_DIR" \
  -DPYBIND11_USE_CROSSCOMPILING=ON \
  -DPYTHON_MODULE_EXT_SUFFIX="$EXT_SUFFIX" \
  -DPython_EXECUTABLE="$CACHE/bin/python3-aarch64" \
  -DPython_INCLUDE_DIR="$ROOTFS/usr/include/$PY_VER" >/dev/null
printf '%s\n' "$BUILD_KEY" >"$BUILD/.qlinear-key"
cmake --build "$BUILD" --target _core --parallel "$(nproc)" | { grep -v -E '^\[[0-9]+/[0-9]+\] ' || true; }
SO="$BUILD/_core$EXT_SUFFIX"
[[ -f "$SO" ]] || die "the build made no $SO"

STAGE="$CACHE/stage"
rm -rf "$STAGE"
mkdir -p "$STAGE"
cp -R "$REPO/python/qlinear" "$STAGE/qlinear"
find "$STAGE" -name __pycache__ -prune -exec rm -rf {} + -o -name '*.so' -exec rm -f {} +
cp "$SO" "$STAGE/qlinear/"

# ---------------------------------------------------------------------------------------------
# Tests, once per CPU model
# ---------------------------------------------------------------------------------------------
cd "$REPO"
# One pytest under qemu; its output goes to $2 (and to the terminal when $3 is "live").
run_pytest() {
  local cpu=$1 out=$2 rc start=$SECONDS
  set +e
  if [[ "${3:-}" == live ]]; then
    "${GUEST_ENV[@]}" QEMU_CPU="$cpu" PYTHONPATH="$STAGE" \
      qemu-aarch64 "$ROOTFS/usr/bin/python3" -m pytest -q -p no:cacheprovider "${PYTEST_ARGS[@]}" \
      2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
  else
    "${GUEST_ENV[@]}" QEMU_CPU="$cpu" PYTHONPATH="$STAGE" \
      qemu-aarch64 "$ROOTFS/usr/bin/python3" -m pytest -q -p no:cacheprovider "${PYTEST_ARGS[@]}" \
      >"$out" 2>&1
    rc=$?
  fi
  set -e
  echo "$rc $((SECONDS - start))" >"$out.rc"
}

# CPU models run JOBS at a time (default: one per core; each is one emulated process, mostly
# single-threaded). With JOBS=1 pytest's output is shown live, otherwise each log after its run.
JOBS="${QLINEAR_AARCH64_JOBS:-$(nproc)}"
read -r -a CPU_LIST <<<"$CPUS"
[[ ${#CPU_LIST[@]} -gt 0 ]] || die "QEMU_CPUS is empty"
log "pytest ${PYTEST_ARGS[*]} on ${CPU_LIST[*]} ($JOBS at a time; logs in $CACHE/pytest-MODEL.log)"
for cpu in "${CPU_LIST[@]}"; do rm -f "$CACHE/pytest-$cpu.log" "$CACHE/pytest-$cpu.log.rc"; done
if ((JOBS <= 1 || ${#CPU_LIST[@]} == 1)); then
  for cpu in "${CPU_LIST[@]}"; do
    log "QEMU_CPU=$cpu"
    run_pytest "$cpu" "$CACHE/pytest-$cpu.log" live
  done
else
  running=0
  for cpu in "${CPU_LIST[@]}"; do
    if ((running >= JOBS)); then wait -n || true; running=$((running - 1)); fi
    run_pytest "$cpu" "$CACHE/pytest-$cpu.log" &
    running=$((running + 1))
  done
  wait || true
  for cpu in "${CPU_LIST[@]}"; do
    log "QEMU_CPU=$cpu"
    cat "$CACHE/pytest-$cpu.log"
  done
fi

declare -a SUMMARY=()
status=0
for cpu in "${CPU_LIST[@]}"; do
  out="$CACHE/pytest-$cpu.log"
  read -r rc secs <"$out.rc" || { rc=255; secs=0; }
  line="$(grep -E '\b(passed|failed|errors?|skipped|no tests ran|deselected)\b.* in [0-9.]+s' "$out" \
          | tail -n 1 | sed -E 's/^=+ //; s/ =+$//' || true)"
  case $rc in
    0) verdict=ok ;;
    132) verdict="FAILED: SIGILL (illegal instruction; exit 132)"; line="${line:-killed by SIGILL}" ;;
    *) if ((rc > 128)); then verdict="FAILED: killed by signal $((rc - 128)) (exit $rc)"; else verdict="FAILED (exit $rc)"; fi ;;
  esac
  ((rc == 0)) || status=1
  SUMMARY+=("$(printf '%-12s %-40s %s (%d s)' "$cpu" "$verdict" "${line:-no pytest summary}" "$secs")")
done

log "summary:"
printf '  %s\n' "${SUMMARY[@]}" >&2
exit $status
