#!/usr/bin/env bash
# A/B of two builds on one CUDA machine: each build's conv bench over the same shapes and the
# YOLO-like model's graph replay at batch 16 and 1, the two builds taking turns for ROUNDS
# rounds (machines differ more between calls than repeats do within one), then one table of
# the selected kernel per shape and the model, B against A.
#
#   tools/ab.sh --a DIR --b DIR [--shapes FILE]... [--rounds N] [--out DIR] [--sweep]
#     --a, --b    bin folders of the two builds (conv_bench and epilog in each)
#     --shapes    conv_bench shape files (default tools/conv_shapes.json); repeatable
#     --rounds    turns each build takes (default 2)
#     --out       where the JSON lines, logs and ab_table.md go (default build/ab)
#     --sweep     also every built tile combination of B, per shape (slower)
set -euo pipefail
cd "$(dirname "$0")/.."
a="" b="" rounds=2 out=build/ab sweep=0 shapes=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --a) a=$2; shift 2 ;;
    --b) b=$2; shift 2 ;;
    --shapes) shapes+=("$2"); shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --sweep) sweep=1; shift ;;
    -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "ab.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[[ -n "$a" && -n "$b" ]] || { echo "ab.sh: --a and --b are required (see --help)" >&2; exit 2; }
for d in "$a" "$b"; do
  for t in conv_bench epilog; do
    [[ -x "$d/$t" ]] || { echo "ab.sh: $d/$t is not an executable" >&2; exit 2; }
  done
done
[[ ${#shapes[@]} -gt 0 ]] || shapes=(tools/conv_shapes.json)
mkdir -p "$out"
start=$SECONDS failed=0
# A run that fails (a kernel that fails conv_bench's check, say) is reported and the rest go on.
run() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 || { echo "ab.sh: '$*' failed (rc $?), see $log" >&2; failed=1; }
}
for ((r = 1; r <= rounds; ++r)); do
  for v in a b; do
    bin=${!v}
    for s in "${shapes[@]}"; do
      tag=$(basename "$s" .json)
      run "$out/$v$r.$tag.txt" "$bin/conv_bench" --shapes "$s" --json "$out/$v$r.$tag.jsonl"
    done
    for batch in 16 1; do
      run "$out/$v$r.model_b$batch.txt" "$bin/epilog" bench models/yolo_like.json --device cuda \
        --batch "$batch" --iters 100 --warmup 10
    done
    echo "[$((SECONDS - start)) s] round $r, build $v"
  done
done
if ((sweep)); then
  for s in "${shapes[@]}"; do
    tag=$(basename "$s" .json)
    run "$out/sweep_b.$tag.txt" "$b/conv_bench" --shapes "$s" --sweep --json "$out/sweep_b.$tag.jsonl"
  done
  echo "[$((SECONDS - start)) s] sweep of build b"
fi
python3 tools/ab_table.py "$out" | tee "$out/ab_table.md"
exit $failed
