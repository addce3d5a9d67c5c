#!/usr/bin/env bash
# The per-layer benchmark on a CUDA machine with PyTorch: our conv bench and PyTorch's
# reference script in the same run, joined into the table of docs/perf.md.
#
#   tools/perf.sh [--bin DIR] [--out DIR] [--only NAME] [--sweep]
#     --bin DIR   where conv_bench is (default build/bin)
#     --out DIR   where ours.jsonl, torch.jsonl, perf_table.md go (default build/perf)
#     --only NAME only the shapes whose name contains NAME
#     --sweep     conv_bench also times every tile combination (slower)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin out=build/perf only="" sweep=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --sweep) sweep=(--sweep); shift ;;
    -h | --help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "perf.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
shapes=tools/conv_shapes.json
if [[ -n "$only" ]]; then
  python3 -c "import json,sys; d=json.load(open('$shapes')); d['shapes']=[s for s in d['shapes'] if '$only' in s['name']]; json.dump(d, open('$out/shapes.json','w'))"
  shapes=$out/shapes.json
fi
echo "== conv_bench"
"$bin/conv_bench" --shapes "$shapes" --json "$out/ours.jsonl" ${sweep[@]+"${sweep[@]}"} | tee "$out/ours.txt"
echo "== PyTorch (tools/torch/torch_conv_bn_silu.py)"
PYTHONUNBUFFERED=1 python3 tools/torch/torch_conv_bn_silu.py --shapes "$shapes" >"$out/torch.jsonl"
echo "== joined"
python3 tools/perf_table.py "$out/ours.jsonl" "$out/torch.jsonl" | tee "$out/perf_table.md"
