#!/usr/bin/env bash
# The CUDA machine's check: build, GPU and CPU tests, then compute-sanitizer on the GPU tests.
set -uo pipefail

usage() {
  cat <<'EOF'
usage: tools/gpu-check.sh [options]

On a machine with a CUDA device, from any directory of the repository:
  1. configure and build (cmake -B build-gpu -G Ninja, Release)      [skipped with --prebuilt]
  2. the GPU tests, then the CPU tests (ctest; the binaries directly with --prebuilt), then
     the ONNX conformance cases on the GPU
  3. compute-sanitizer --tool memcheck on the GPU tests
Logs go to ${OUT:-build-gpu/logs} (one file per step). Exits non-zero if any step fails,
including when no CUDA device is visible (the GPU tests would only report themselves skipped).

options:
  --prebuilt DIR         skip the build; run DIR/epilog_gpu_tests and DIR/epilog_tests (built
                         elsewhere; DIR and DIR/lib are put on LD_LIBRARY_PATH for carried
                         shared libraries such as libfmt)
  --build-dir DIR        build directory (default build-gpu)
  --sanitize-filter SPEC Catch test spec for the compute-sanitizer run
                         (default: "[ops],[memory],[wgmma],[scalar],[upsample],[pool],[pair],
                         [persistent],[chain],[prologue],gpu models: yolo_like with the kernels
                         the selector picks")
  --sanitize-all         run every GPU test under compute-sanitizer (slow)
  --racecheck            also run racecheck and synccheck (shared-memory kernels) on the
                         sanitizer filter
  --no-sanitizer         skip compute-sanitizer
  -h, --help             this text
EOF
}

prebuilt=""
build_dir="build-gpu"
san_filter='[ops],[memory],[wgmma],[scalar],[upsample],[pool],[pair],[persistent],[chain],[prologue],gpu models: yolo_like with the kernels the selector picks'
sanitize=1
racecheck=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --prebuilt) prebuilt="${2:?--prebuilt needs a directory}"; shift 2 ;;
    --build-dir) build_dir="${2:?--build-dir needs a directory}"; shift 2 ;;
    --sanitize-filter) san_filter="${2:?--sanitize-filter needs a test spec}"; shift 2 ;;
    --sanitize-all) san_filter=""; shift ;;
    --racecheck) racecheck=1; shift ;;
    --no-sanitizer) sanitize=0; shift ;;
    *) echo "gpu-check: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root" || exit 2
if [[ -n "$prebuilt" ]]; then
  prebuilt="$(cd "$prebuilt" 2>/dev/null && pwd)" || { echo "gpu-check: no directory '$prebuilt'" >&2; exit 2; }
fi
logs="${OUT:-$build_dir/logs}"
mkdir -p "$logs" || exit 2
logs="$(cd "$logs" && pwd)"
# The tests find models/*.json here even when the binaries were built in another tree.
export EPILOG_SOURCE_DIR="$root"

failed=()
# step NAME COMMAND...: runs COMMAND with its output in $logs/NAME.log.
step() {
  local name="$1"; shift
  local log="$logs/$name.log"
  echo "== $name: $*"
  local start=$SECONDS
  "$@" >"$log" 2>&1
  local rc=$?
  if [[ $rc -eq 0 ]]; then
    echo "   ok ($((SECONDS - start)) s)"
  else
    echo "   FAILED with exit code $rc ($((SECONDS - start)) s); last lines of $log:"
    tail -n 40 "$log" | sed 's/^/   | /'
    failed+=("$name")
  fi
  return $rc
}

finish() {
  echo
  if [[ ${#failed[@]} -eq 0 ]]; then
    echo "gpu-check: all steps passed; logs in $logs"
    exit 0
  fi
  echo "gpu-check: FAILED: ${failed[*]}; logs in $logs"
  exit 1
}

if command -v nvidia-smi >/dev/null; then
  step device nvidia-smi
else
  echo "== device: nvidia-smi not found"
fi

# -- build --
if [[ -n "$prebuilt" ]]; then
  bin="$prebuilt"
  export LD_LIBRARY_PATH="$prebuilt/lib:$prebuilt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  for b in epilog_gpu_tests epilog_tests; do
    [[ -x "$bin/$b" ]] || { echo "gpu-check: $bin/$b is missing or not executable" >&2; exit 2; }
  done
  echo "== build: skipped, using the binaries in $bin"
else
  step configure cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DEPILOG_CUDA=ON || finish
  step build cmake --build "$build_dir" || finish
  bin="$(cd "$build_dir/bin" && pwd)"
fi

# -- a device at all? Without one every GPU test exits 77 and ctest counts it as skipped. --
probe="gpu memory: host and device copies round trip"
"$bin/epilog_gpu_tests" "$probe" >"$logs/probe.log" 2>&1
case $? in
  0) ;;
  77) echo "gpu-check: no CUDA device is visible; the GPU tests cannot run:"
      sed 's/^/   | /' "$logs/probe.log"
      failed+=("device"); finish ;;
  *) echo "gpu-check: the probe test '$probe' failed:"; tail -n 40 "$logs/probe.log" | sed 's/^/   | /'
     failed+=("probe") ;;
esac

# -- tests --
# Test cases run from a scratch directory, as ctest runs them from the build tree.
work="$logs/work"
mkdir -p "$work"
if [[ -n "$prebuilt" ]]; then
  (cd "$work" && step gpu-tests "$bin/epilog_gpu_tests" --durations yes) || failed+=("gpu-tests")
  (cd "$work" && step cpu-tests "$bin/epilog_tests") || failed+=("cpu-tests")
else
  # GPU test cases are the ones named "gpu ...".
  step gpu-tests ctest --test-dir "$build_dir" --output-on-failure -R '^gpu '
  step cpu-tests ctest --test-dir "$build_dir" --output-on-failure -E '^gpu ' -j "$(nproc)"
fi

# The ONNX conformance cases again, on the GPU. The conv kernels are held to float32 (tiled, and
# scalar where tiled cannot run) so that the cases' 1e-4 tolerance applies; gemm's TF32 has its
# own tolerance in the GPU conv tests.
(cd "$work" && step onnx-gpu env EPILOG_ONNX_DEVICE=cuda EPILOG_FORCE_CONV_KERNEL=tiled \
   "$bin/epilog_tests" "onnx conformance*" -s) || failed+=("onnx-gpu")

# -- compute-sanitizer --
if [[ $sanitize -eq 1 ]]; then
  sanitizer="$(command -v compute-sanitizer || true)"
  for candidate in "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
                   /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [[ -z "$sanitizer" && -x "$candidate" ]] && sanitizer="$candidate"
  done
  if [[ -z "$sanitizer" ]]; then
    echo "gpu-check: compute-sanitizer not found (PATH, \$CUDA_HOME/bin, /usr/local/cuda/bin);" \
         "pass --no-sanitizer to skip it"
    failed+=("memcheck")
  else
    filter_args=()
    if [[ -n "$san_filter" ]]; then
      echo "== sanitizer filter: $san_filter"
      filter_args=("$san_filter")
    else
      echo "== sanitizer filter: none (every GPU test)"
    fi
    # No --leak-check: the caching allocator keeps freed blocks until exit by design.
    (cd "$work" && step memcheck "$sanitizer" --tool memcheck --error-exitcode 99 \
       --print-limit 100 "$bin/epilog_gpu_tests" ${filter_args[@]+"${filter_args[@]}"}) || failed+=("memcheck")
    if [[ $racecheck -eq 1 ]]; then
      for tool in racecheck synccheck; do
        (cd "$work" && step "$tool" "$sanitizer" --tool "$tool" --error-exitcode 99 \
           --print-limit 100 "$bin/epilog_gpu_tests" ${filter_args[@]+"${filter_args[@]}"}) || failed+=("$tool")
      done
    fi
  fi
else
  echo "== compute-sanitizer: skipped (--no-sanitizer)"
fi

finish
