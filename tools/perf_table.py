#!/usr/bin/env python3
"""Joins conv_bench's JSON lines with torch_conv_bn_silu.py's (same run, same card) into the
markdown table of docs/perf.md, and checks the per-layer targets.

usage: perf_table.py OURS.jsonl TORCH.jsonl
"""
import json, math, sys


def load(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def main():
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) == 2 else 2
    ours = {r["shape"]: r for r in load(sys.argv[1])}
    torch_rows = load(sys.argv[2])
    card = torch_rows[0]
    torch = {r["shape"]: r for r in torch_rows[1:]}
    copy_bps = card["copy_GBps"] * 1e9
    tf32 = card["tf32_TFLOPs"] * 1e12
    print(f"Card: {card['device']}, PyTorch {card['torch']}; measured in this run: copy "
          f"{card['copy_GBps']:.0f} GB/s, TF32 matmul {card['tf32_TFLOPs']:.0f} TFLOP/s, "
          f"fp32 {card['fp32_TFLOPs']:.0f} TFLOP/s.\n")
    cols = ["shape", "GFLOP", "floor", "scalar", "tiled", "gemm", "gemm k32", "gemm mma", "selected", "unfused3",
            "cuDNN+ep", "eager3", "folded2", "fp16 cl", "x eager3", "x folded2", "% floor", "pick ok"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    f = lambda v: "-" if v is None else f"{v:.1f}"
    speedups, fails_folded, fails_floor, fails_pick = [], [], [], []
    for name, o in ours.items():
        t = torch.get(name)
        if t is None:
            continue
        floor = max(o["min_mbytes"] * 1e6 / copy_bps, o["gflop"] * 1e9 / tf32) * 1e6
        sel = o.get("selected_us")
        x_e = t["eager3_us"] / sel if sel else None
        x_f = t["folded2_us"] / sel if sel else None
        pct = 100 * floor / sel if sel else None
        if x_e:
            speedups.append(x_e)
        if not x_f or x_f <= 1:
            fails_folded.append(name)
        if name.startswith(("b16", "b32")) and (not sel or sel > 2 * floor):
            fails_floor.append(name)
        if not o["selector_ok"]:
            fails_pick.append(name)
        row = [name, f"{o['gflop']:.2f}", f(floor), f(o.get("scalar_us")), f(o.get("tiled_us")),
               f(o.get("gemm_us")), f(o.get("gemm_k32_us")), f(o.get("gemm_mma_us")), f"{f(sel)} ({o['selected']})", f(o.get("unfused3_us")),
               f(o.get("cudnn+bn_silu_us")), f(t["eager3_us"]), f(t["folded2_us"]),
               f(t["fp16cl_us"]), f"{x_e:.2f}" if x_e else "-", f"{x_f:.2f}" if x_f else "-",
               f"{pct:.0f}" if pct else "-", "yes" if o["selector_ok"] else "NO"]
        print("| " + " | ".join(row) + " |")
    gm = math.exp(sum(map(math.log, speedups)) / len(speedups)) if speedups else 0
    print()
    print(f"- geometric-mean speedup of the selected kernel over eager3 (TF32): **{gm:.2f}x** "
          f"(target >= 2x)")
    print(f"- faster than folded2 on {len(ours) - len(fails_folded)} of {len(ours)} shapes"
          + (f"; not on: {', '.join(fails_folded)}" if fails_folded else ""))
    print(f"- batch-16/32 shapes within 2x of the floor: "
          + ("all" if not fails_floor else f"not {', '.join(fails_floor)}"))
    print(f"- selector within 10% of the fastest fused kernel (gemm k32: the gather kernel on 3x3 "
          f"shapes, where gemm runs the halo kernel): "
          + ("every shape" if not fails_pick else f"not on {', '.join(fails_pick)}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
