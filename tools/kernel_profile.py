#!/usr/bin/env python3
"""Where a model's GPU time goes: each kernel of one run under Nsight Compute, against its floor.

usage: tools/kernel_profile.py [--bin DIR] [--model FILE] [--batch N] [--csv FILE] [--save FILE]
                               [--copy-gbps X] [--tf32-tflops X]

Runs `ncu` on one iteration of `epilog bench MODEL --device cuda` (each kernel timed alone, the
caches flushed between kernels, clocks not locked) or reads the CSV such a run wrote (--csv), and
matches the kernels in launch order to the nodes `epilog explain` lists that launch one (not the
in-place ones or views). Prints a line per node - time, DRAM bytes, floor, grid, registers,
kernel - and the totals by kind of node (docs/perf.md, "Where the model's time goes").

Floor of a node, as for the conv suite: max(bytes / copy rate, flops / TF32 rate), bytes = its
inputs and output once (a residual included), flops = 2 x outputs x reduction for a conv, 0
otherwise; a conv pair (a conv with the one before it folded in) reads that one's input and does
both convs' flops, a conv chain (a conv with the 1x1 after it folded in) both convs' flops. Pass the rates measured in the same call (conv_bench prints them); the defaults are
conv_bench's.
"""
import argparse
import csv
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys

METRICS = [
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "launch__grid_size",
    "launch__registers_per_thread",
]


def fail(msg):
    sys.exit(f"kernel_profile.py: {msg}")


def run(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        fail(f"cannot run {cmd[0]}: {e}")
    if p.returncode != 0:
        fail(f"'{' '.join(cmd)}' failed (rc {p.returncode}):\n{p.stderr[-2000:]}")
    return p.stdout


def launching_nodes(epilog, model, batch):
    """(name, op, input floats, output shape, outputs) of each node that launches a kernel;
    outputs counts a residual as one more, and the pools a chain's first pool makes."""
    out = run([epilog, "explain", model, "--batch", str(batch), "--device", "cuda"])
    nodes, folded = [], {}
    for line in out.splitlines():
        shapes = re.findall(r"\[([\d,]+)\]", line)
        if len(shapes) < 2 or " in place " in line or " view " in line:
            continue
        name, op = line.split()[:2]
        dims = [[int(d) for d in s.split(",")] for s in shapes[:2]]
        if " folded " in line:
            folded[name] = dims
            continue
        x = math.prod(dims[0])
        # Folded convs whose work this one's kernel does: (name, output shape). A conv pair reads
        # the folded conv's input instead of its output; a conv chain stores the folded 1x1's
        # output (as large as its own) instead of its own.
        extra = []
        pre = re.search(r"also computes (\S+) \(", line)
        if pre:
            x = math.prod(folded[pre.group(1)][0])
            extra.append((pre.group(1), folded[pre.group(1)][1]))
        post = re.search(r"also runs (\S+) \(1x1", line)
        if post:  # listed after this node; its output is as large as this one's
            extra.append((post.group(1), dims[1]))
        # A conv reading through a folded upsampling reads those channels at the source's size.
        up = re.search(r"channels (\d+)\.\.(\d+) read from \S+ upsampled (\d+)x(\d+)", line)
        if up:
            c0, c1, sh, sw = map(int, up.groups())
            x -= (c1 - c0 + 1) * x // dims[0][1] * (sh * sw - 1) // (sh * sw)
        chain = re.search(r"; then (.+?), each pooling the one before", line)
        outputs = 1 + ("+ residual" in line) + (len(chain.group(1).split(", ")) if chain else 0)
        nodes.append((name, op, x, dims[1], outputs, extra))
    if not nodes:
        fail(f"'epilog explain {model}' listed no nodes")
    return nodes


def reductions(epilog, model, batch):
    """Reduction (input channels a group x window) and stride of each conv, from the weights."""
    graph = json.loads(run([epilog, "dump", model, "--stage", "lowered", "--format", "json",
                            "--batch", str(batch), "--device", "cpu"]))
    weights = graph.get("weights", {})
    convs = {}
    for node in graph["nodes"]:
        if node["op"] not in ("conv2d", "fused_conv2d"):
            continue
        w = weights.get(node["inputs"][1], {}).get("shape")
        if not w or len(w) != 4:
            fail(f"node {node['name']}: no 4-d weight shape in the dump")
        convs[node["name"]] = (w[1] * w[2] * w[3], w[2], w[3], node["attrs"]["stride"][0])
    return convs


def read_ncu(text):
    """Per kernel, in launch order: its name and metrics, from ncu's --csv output."""
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        fail("no ncu CSV table found (was ncu run with --csv and these metrics?)")
    kernels = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        k = kernels.setdefault(int(row["ID"]), {"name": row["Kernel Name"]})
        try:
            k[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
        except ValueError:  # "n/a": a metric this kernel does not have
            pass
    for i, k in kernels.items():
        missing = [m for m in METRICS if m not in k]
        if missing:
            fail(f"kernel {i} ({short(k['name'])}) lacks the metrics {', '.join(missing)}")
    return [kernels[i] for i in sorted(kernels)]


def short(name):
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\([^()]*\)$", "", name)
    return re.sub(r"(\(anonymous namespace\)|<?unnamed>|conv_gemm_detail)::", "", name)


def kind(conv, first):
    if conv is None:
        return "max-pools, upsampling and other ops"
    if first:
        return "first layer"
    reduction, kh, kw, stride = conv
    if (kh, kw) == (1, 1):
        return "1x1 convs"
    return f"{kh}x{kw} convs at stride {stride}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/bin", help="folder with epilog (default build/bin)")
    ap.add_argument("--model", default="models/yolo_like.json")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--csv", help="read this ncu CSV instead of running ncu")
    ap.add_argument("--save", help="also write ncu's CSV to this file")
    ap.add_argument("--copy-gbps", type=float, default=4250.0)
    ap.add_argument("--tf32-tflops", type=float, default=358.0)
    args = ap.parse_args()
    epilog = os.path.join(args.bin, "epilog")
    if not os.access(epilog, os.X_OK):
        fail(f"{epilog} is not an executable (build first, or pass --bin)")

    if args.csv:
        try:
            text = open(args.csv).read()
        except OSError as e:
            fail(f"cannot read {args.csv}: {e}")
    else:
        ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
        print(f"profiling {args.model} at batch {args.batch} with {ncu} ...", file=sys.stderr)
        text = run([ncu, "--clock-control", "none", "--metrics", ",".join(METRICS), "--csv",
                    epilog, "bench", args.model, "--device", "cuda", "--batch", str(args.batch),
                    "--iters", "1", "--warmup", "0"])
        if args.save:
            with open(args.save, "w") as f:
                f.write(text)

    nodes = launching_nodes(epilog, args.model, args.batch)
    convs = reductions(epilog, args.model, args.batch)
    kernels = read_ncu(text)
    if len(kernels) < len(nodes):
        fail(f"{len(kernels)} kernels for {len(nodes)} nodes that launch one")
    # The bench runs the model more than once; the first run's kernels come first.
    kernels = kernels[:len(nodes)]
    first = nodes[0][0]  # the first layer

    groups, rows = {}, []
    for (name, op, x, y, outputs, extra), k in zip(nodes, kernels):
        conv = convs.get(name)
        if (conv is not None) != ("conv" in k["name"]):
            fail(f"node {name} ({op}) met kernel {short(k['name'])}: the launch order differs "
                 f"from explain's (a different build, model or batch?)")
        bytes_ = 4 * (x + math.prod(y) * outputs)
        flops = 2 * math.prod(y) * conv[0] if conv else 0
        for other, shape in extra:
            flops += 2 * math.prod(shape) * convs[other][0]
        floor = max(bytes_ / (args.copy_gbps * 1e3), flops / (args.tf32_tflops * 1e6))
        us = k["gpu__time_duration.sum"] / 1e3
        dram = (k["dram__bytes_read.sum"] + k["dram__bytes_write.sum"]) / 1e6
        rows.append((name, us, dram, floor, int(k["launch__grid_size"]),
                     int(k["launch__registers_per_thread"]), short(k["name"])))
        g = groups.setdefault(kind(conv, name == first), [0, 0.0, 0.0])
        g[0] += 1
        g[1] += us
        g[2] += floor

    print(f"{'node':<20} {'us':>7} {'DRAM MB':>8} {'floor':>7} {'x floor':>7} {'grid':>6} "
          f"{'regs':>4}  kernel")
    for name, us, dram, floor, grid, regs, kname in rows:
        print(f"{name:<20} {us:7.1f} {dram:8.1f} {floor:7.1f} {us / floor if floor else 0:7.2f} "
              f"{grid:6d} {regs:4d}  {kname[:70]}")
    total, floor = sum(r[1] for r in rows), sum(r[3] for r in rows)
    print(f"\n{len(rows)} kernels summing {total:.1f} us against a floor of {floor:.1f} us "
          f"(copy {args.copy_gbps:.0f} GB/s, TF32 {args.tf32_tflops:.0f} TFLOP/s)\n")
    print("| kernels | count | us | floor | x floor |\n|---|---|---|---|---|")
    for name, (count, us, fl) in groups.items():
        print(f"| {name} | {count} | {us:.1f} | {fl:.1f} | {us / fl if fl else 0:.2f} |")


if __name__ == "__main__":
    main()
