#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (JSON model, safetensors, .npy, and ONNX when
# libonnx-dev is installed) with ASan and UBSan, seeds their corpora and runs them all at once
# for SECONDS each (default 60).
#
#   tools/fuzz.sh [SECONDS]        env: CXX (default clang++), FUZZ_DIR (default build-fuzz)
#
# Exits non-zero when a target found a crash; the input that crashed it is in
# $FUZZ_DIR/crashes/ and replays with `$FUZZ_DIR/bin/fuzz_<target> <file>`. Corpora are kept in
# $FUZZ_DIR/corpus/ between runs, so that each run starts where the last one stopped.
set -euo pipefail

seconds=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
out=${FUZZ_DIR:-$root/build-fuzz}
cxx=${CXX:-clang++}
targets=(json_model safetensors npy)
libs=(-lfmt)
# The ONNX importer builds with Debian's libonnx-dev and libprotobuf-dev (as in CMakeLists.txt).
if [[ -f /usr/include/onnx/onnx_pb.h ]]; then
  targets+=(onnx)
  libs+=(-lonnx_proto -lprotobuf)
fi

mkdir -p "$out"/{obj,bin,crashes,logs,seeds,tmp}
for t in "${targets[@]}"; do mkdir -p "$out/corpus/$t" "$out/seeds/$t"; done
# The targets write their scratch files under TMPDIR.
export TMPDIR=$out/tmp

# -- build --
# The I/O layer and what it stands on: the graph, tensors and common code. Sources that reach
# into the runtime (kernels, CUDA) are left out; the loaders do not need them.
flags=(-std=c++17 -O1 -g -fno-omit-frame-pointer -fno-sanitize-recover=all -I"$root/include"
  -I"$root/internal")
[[ ${targets[*]} == *onnx* ]] && flags+=(-DEPILOG_HAVE_ONNX=1 -DONNX_NAMESPACE=onnx -DONNX_ML=1)
sources=("$root"/graph/*.cpp "$root/src/common.cpp" "$root/src/tensor.cpp")
for f in "$root"/src/io/*.cpp; do
  grep -qE '#include .*(runtime|kernels|cuda)' "$f" || sources+=("$f")
done
objects=()
for f in "${sources[@]}"; do
  o=$out/obj/$(basename "$(dirname "$f")")_$(basename "${f%.cpp}").o
  if [[ ! -f $o || $f -nt $o ||
    -n $(find "$root/include" "$root/internal" -newer "$o" -name '*.h*' -print -quit) ]]; then
    echo "compiling ${f#"$root"/}"
    "$cxx" "${flags[@]}" -fsanitize=fuzzer-no-link,address,undefined -c "$f" -o "$o"
  fi
  objects+=("$o")
done
# An archive, so that each target links only the objects it reaches (not the pass pipeline).
rm -f "$out/libepilog_fuzz.a"
ar rcs "$out/libepilog_fuzz.a" "${objects[@]}"
for t in "${targets[@]}"; do
  echo "linking fuzz_$t"
  "$cxx" "${flags[@]}" -fsanitize=fuzzer,address,undefined "$root/tests/fuzz/fuzz_$t.cpp" \
    "$out/libepilog_fuzz.a" "${libs[@]}" -o "$out/bin/fuzz_$t"
done

# -- seeds --
le64() {  # the 8 little-endian bytes of $1
  local n=$1 i
  for i in 0 1 2 3 4 5 6 7; do printf "\\x$(printf %02x $(((n >> (8 * i)) & 255)))"; done
}
safetensors() {  # safetensors FILE HEADER DATA-AS-PRINTF-ESCAPES
  { le64 ${#2}; printf '%s' "$2"; printf "$3"; } >"$1"
}
npy() {  # npy FILE DICT DATA-AS-PRINTF-ESCAPES: version 1.0, header padded to 64 bytes
  local h=$2
  while (((10 + ${#h} + 1) % 64)); do h+=' '; done
  { printf '\x93NUMPY\x01\x00'; printf "\\x$(printf %02x $(((${#h} + 1) & 255)))\\x$(printf %02x $(((${#h} + 1) >> 8)))";
    printf '%s\n' "$h"; printf "$3"; } >"$1"
}

s=$out/seeds/safetensors
safetensors "$s/f32.st" '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' '\x00\x00\x80\x3f\x00\x00\x00\xc0'
safetensors "$s/mixed.st" '{"__metadata__":{"format":"pt"},"h":{"dtype":"F16","shape":[2,1],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[],"data_offsets":[4,6]},"e":{"dtype":"F32","shape":[0,3],"data_offsets":[6,6]}}' '\x00\x3c\x01\x80\x80\x3f'
safetensors "$s/hole.st" '{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}  ' '\x01\x02\x03\x04\x00\x00\x80\x3f'

s=$out/seeds/npy
npy "$s/vec.npy" "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }" '\x00\x00\x80\x3f\x00\x00\x00\xc0'
npy "$s/scalar.npy" "{'descr': '<f4', 'fortran_order': False, 'shape': (), }" '\x00\x00\x80\x3f'
npy "$s/nchw.npy" "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 2), }" '\x00\x00\x80\x3f\x00\x00\x00\xc0'
npy "$s/py2.npy" "{'descr': '<f4', 'fortran_order': False, 'shape': (1L, 0L), }" ''

s=$out/seeds/json_model
shopt -s nullglob
models=("$root"/models/*.json)
for m in "${models[@]}"; do cp "$m" "$s/"; done
# Small models of every op, so that the fuzzer starts from loadable text; "fuzz.safetensors" is
# the file the target writes next to the models it loads (tensors w [4,3,3,3] and b [4]).
cat >"$s/conv_bn_silu.json" <<'EOF'
{"format": "epilog", "version": 1,
 "inputs": [{"name": "x", "shape": [1, 3, 8, 8]}],
 "outputs": [{"name": "act", "shape": [1, 4, 8, 8]}],
 "weights": {"conv.weight": {"shape": [4, 3, 3, 3], "init": {"seed": 7}},
             "bn.weight": {"shape": [4], "data": [1, 1.5, 2, 2.5]},
             "bn.bias": {"shape": [4], "data": [0, 0.25, -1, 3]},
             "bn.running_mean": {"shape": [4], "init": {"seed": 7}},
             "bn.running_var": {"shape": [4], "init": {"seed": 7}}},
 "nodes": [{"name": "conv", "op": "conv2d", "inputs": ["x", "conv.weight"], "outputs": ["conv"],
            "attrs": {"stride": 1, "padding": [1, 1, 1, 1], "dilation": 1, "groups": 1}},
           {"name": "bn", "op": "batchnorm", "outputs": ["bn"], "attrs": {"eps": 0.001},
            "inputs": ["conv", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"]},
           {"name": "act", "op": "silu", "inputs": ["bn"], "outputs": ["act"]}]}
EOF
cat >"$s/file_weights.json" <<'EOF'
{"format": "epilog", "version": 1, "weights_file": "fuzz.safetensors",
 "inputs": [{"name": "x", "shape": [2, 3, 5, 5]}],
 "outputs": [{"name": "y"}],
 "weights": {"w": {"shape": [4, 3, 3, 3]}, "b": {"shape": [4]},
             "s": {"shape": [4], "data": [1, 2, 3, 4]}, "t": {"shape": [4], "init": {"seed": 1}}},
 "nodes": [{"name": "f", "op": "fused_conv2d", "inputs": ["x", "w", "s", "t"], "outputs": ["f"],
            "attrs": {"activation": "silu", "stride": [2, 1], "padding": [1, 0, 1, 0]}},
           {"name": "y", "op": "relu", "inputs": ["f"], "outputs": ["y"]}]}
EOF
cat >"$s/ops.json" <<'EOF'
{"format": "epilog", "version": 1,
 "inputs": [{"name": "x", "shape": [1, 4, 8, 8]}, {"name": "v", "shape": [2, 6]}],
 "outputs": [{"name": "out"}, {"name": "fc", "shape": [2, 3]}, {"name": "gap"}],
 "weights": {"fc.weight": {"shape": [3, 6], "init": {"seed": 2}}, "fc.bias": {"shape": [3], "data": [0, 1, 2]}},
 "nodes": [{"name": "out", "op": "add", "inputs": ["up", "sig"], "outputs": ["out"]},
           {"name": "sp", "op": "split", "inputs": ["x"], "outputs": ["sp.0", "sp.1"],
            "attrs": {"axis": 1, "sizes": [1, 3]}},
           {"name": "cat", "op": "concat", "inputs": ["sp.1", "sp.0"], "outputs": ["cat"], "attrs": {"axis": -3}},
           {"name": "mp", "op": "maxpool2d", "inputs": ["cat"], "outputs": ["mp"],
            "attrs": {"kernel": 3, "stride": 2, "padding": 1, "ceil_mode": 1}},
           {"name": "ap", "op": "avgpool2d", "inputs": ["mp"], "outputs": ["ap"],
            "attrs": {"kernel": [2, 2], "stride": 2, "count_include_pad": 1}},
           {"name": "up", "op": "upsample_nearest", "inputs": ["ap"], "outputs": ["up"], "attrs": {"scale": 4}},
           {"name": "sig", "op": "sigmoid", "inputs": ["x"], "outputs": ["sig"]},
           {"name": "m", "op": "mul", "inputs": ["x", "sig"], "outputs": ["m"]},
           {"name": "gap", "op": "global_avgpool", "inputs": ["m"], "outputs": ["gap"]},
           {"name": "fl", "op": "flatten", "inputs": ["gap"], "outputs": ["fl"], "attrs": {"axis": 1}},
           {"name": "fc", "op": "linear", "inputs": ["v", "fc.weight", "fc.bias"], "outputs": ["fc"]}]}
EOF

# Small models of the ONNX test data: the ops and attribute forms the importer reads.
s=$out/seeds/onnx
data=${ONNX_TESTDATA:-/usr/share/libonnx-testdata/data}
for c in node/test_conv_with_strides_padding node/test_conv_with_autopad_same \
  node/test_batchnorm_example node/test_split_equal_parts_2d node/test_concat_2d_axis_0 \
  node/test_maxpool_2d_pads node/test_averagepool_2d_pads_count_include_pad \
  node/test_resize_upsample_scales_nearest node/test_upsample_nearest node/test_gemm_transposeB \
  node/test_flatten_axis1 node/test_slice node/test_reshape_reduced_dims node/test_identity \
  node/test_constant node/test_cast_FLOAT16_to_FLOAT pytorch-operator/test_operator_chunk \
  pytorch-operator/test_operator_view pytorch-converted/test_Linear_no_bias \
  pytorch-converted/test_GLU pytorch-converted/test_BatchNorm2d_eval \
  node/test_reduce_mean_keepdims_example node/test_dropout_default \
  node/test_castlike_FLOAT16_to_FLOAT; do
  if [[ -d $s && -f $data/$c/model.onnx ]]; then cp "$data/$c/model.onnx" "$s/${c##*/}.onnx"; fi
done

# A dictionary of the formats' words speeds up finding valid structure.
dict=$out/fuzz.dict
{
  for w in format epilog version inputs outputs weights weights_file nodes name op attrs shape \
    data init seed fuzz.safetensors dtype F32 F16 BF16 F64 data_offsets __metadata__ w b; do
    echo "\"\\\"$w\\\"\""
  done
  sed -n 's/^EPILOG_OP([A-Za-z0-9]*, "\([a-z0-9_]*\)".*/"\\"\1\\""/p' "$root/include/epilog/graph/ops.def"
  grep -o '\(INTS\?\|FLOAT\|STRING\)\(_REQ\)\?("[a-z_]*"' "$root/include/epilog/graph/ops.def" |
    sed 's/.*("\(.*\)"/"\\"\1\\""/' | sort -u
  for w in "'descr'" "'<f4'" "'fortran_order'" "'shape'" True False "\\x93NUMPY" "(1, 3, 4, 4)"; do
    echo "\"$w\""
  done
  for w in Conv BatchNormalization Relu Sigmoid Add Mul Concat Split Slice MaxPool AveragePool \
    GlobalAveragePool Resize Upsample Flatten Gemm MatMul Identity Constant Shape Gather Div \
    Unsqueeze Reshape Cast auto_pad SAME_UPPER pads strides kernel_shape nearest asymmetric \
    ReduceMean keepdims num_outputs Dropout CastLike Einsum equation "ij,jk->ik"; do
    echo "\"$w\""
  done
} >"$dict"

# -- run --
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
pids=()
for t in "${targets[@]}"; do
  "$out/bin/fuzz_$t" -max_total_time="$seconds" -print_final_stats=1 -dict="$dict" \
    -artifact_prefix="$out/crashes/$t-" -max_len=65536 \
    "$out/corpus/$t" "$out/seeds/$t" >"$out/logs/$t.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!targets[@]}"; do
  t=${targets[$i]}
  rc=0
  wait "${pids[$i]}" || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/logs/$t.log" | tail -1)
  corpus=$(find "$out/corpus/$t" -type f | wc -l)
  if ((rc != 0)); then
    status=1
    echo "fuzz_$t: FOUND A CRASH (exit $rc) after ${runs:-?} executions; see $out/logs/$t.log"
    grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error|artifact_prefix|Test unit written)' \
      "$out/logs/$t.log" | head -5 | sed 's/^/  /'
  else
    echo "fuzz_$t: ${runs:-?} executions in ${seconds}s, no crash, corpus $corpus files"
  fi
done
exit $status
