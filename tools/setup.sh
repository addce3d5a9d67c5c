#!/usr/bin/env bash
# Sets up a Debian 12 machine for epilog (installs only what is missing), builds, then runs
# either the demo or the whole test suite. Safe to run again: a second run only rebuilds what
# changed.
#
#   tools/setup.sh demo   build, then run the demo model (dumps before/after fusion, kernels,
#                         outputs, time) on the GPU if there is one, else on the CPU
#   tools/setup.sh test   build, then run every test: the CPU and GPU suites (GPU tests show as
#                         skipped without a device), the unit tests of tools/zoo.py and
#                         op_bench.py, examples/hello against the installed package, the
#                         ASan+UBSan CPU suite, a ThreadSanitizer build without ONNX import
#                         and a fuzz smoke run
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
case "$mode" in
  demo | test) ;;
  -h | --help)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "usage: tools/setup.sh demo|test (see --help)" >&2
    exit 2
    ;;
esac

jobs=$(nproc)
step() { printf '\n== %s\n' "$*"; }

packages=(build-essential cmake ninja-build pkg-config libfmt-dev nlohmann-json3-dev catch2
  libonnx-dev libprotobuf-dev protobuf-compiler libonnx-testdata graphviz clang
  libclang-rt-14-dev python3)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  step "installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The CUDA toolkit is not a Debian package here; use it when it is installed.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

configure() {  # dir, extra cmake args...
  local dir=$1
  shift
  if [ ! -f "$dir/build.ninja" ]; then
    cmake -S . -B "$dir" -G Ninja -DEPILOG_WERROR=ON "$@" >"$dir.configure.log" 2>&1 ||
      { cat "$dir.configure.log"; exit 1; }
  fi
}

step "building (build/)"
start=$SECONDS
configure build
cmake --build build -j "$jobs"
echo "built in $((SECONDS - start)) s"

if [ "$mode" = demo ]; then
  step "demo: models/demo_conv_bn_silu.json"
  build/bin/epilog run models/demo_conv_bn_silu.json --show-graphs
  exit 0
fi

step "tests (build/)"
ctest --test-dir build --output-on-failure -j "$jobs"

step "tools: the zoo, op_bench and plan_diff tools' own tests (no PyTorch needed)"
python3 tools/test_zoo.py
python3 tools/test_op_bench.py
python3 tools/test_plan_diff.py

step "installed package: examples/hello built against it with find_package(epilog)"
start=$SECONDS
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install build --prefix "$prefix" >/dev/null
# Only the API is installed: no kernel header nor any other of internal/, and every epilog header
# an installed one includes is installed too.
leaked=$(
  find "$prefix/include" -path '*/kernels/*'
  (cd internal && find epilog -type f) | while read -r h; do
    [ ! -e "$prefix/include/$h" ] || echo "$h (internal, installed)"
  done
  grep -rhoE '#include "epilog/[^"]+"' "$prefix/include" | cut -d'"' -f2 | sort -u |
    while read -r h; do [ -e "$prefix/include/$h" ] || echo "$h (included, not installed)"; done
)
if [ -n "$leaked" ]; then
  printf 'the installed headers are more or less than the API:\n%s\n' "$leaked" >&2
  exit 1
fi
cmake -S examples/hello -B "$prefix/build-hello" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/build-hello"
"$prefix/build-hello/hello" models/demo_conv_bn_silu.json cpu
echo "installed, built and ran in $((SECONDS - start)) s"

step "ASan + UBSan build of the CPU suite (build-asan/)"
start=$SECONDS
configure build-asan -DEPILOG_SANITIZE=ON -DEPILOG_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build-asan -j "$jobs" --target epilog_tests
echo "built in $((SECONDS - start)) s"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -E '\(slow\)'

# Built without the ONNX importer too (as on a machine without libonnx-dev): that build must
# compile, and its loaders' cases pass.
step "ThreadSanitizer build of the CPU suite without ONNX (build-tsan/): threaded and io cases"
start=$SECONDS
configure build-tsan -DEPILOG_TSAN=ON -DEPILOG_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_DISABLE_FIND_PACKAGE_ONNX=ON
cmake --build build-tsan -j "$jobs" --target epilog_tests
echo "built in $((SECONDS - start)) s"
TSAN_OPTIONS=halt_on_error=1 build-tsan/bin/epilog_tests "[threads],[io]"

if [ -x tools/fuzz.sh ]; then
  step "fuzz smoke run"
  tools/fuzz.sh 10
fi
echo
echo "all tests passed"
