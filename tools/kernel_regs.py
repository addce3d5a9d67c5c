#!/usr/bin/env python3
"""Registers and spills of every kernel in CUDA sources, as ptxas reports them.

usage: tools/kernel_regs.py [--build DIR] [FILE.cu ...]   (default: kernels/cuda/*.cu)

Compiles each file with the flags of DIR/compile_commands.json (default: build) plus
`-Xptxas -v`, into a scratch directory, and prints one line per kernel: registers, spill stores
and loads, name, and ptxas's note where it serialized the kernel's wgmmas (C75xx: every wgmma
then waits for the one before; the build only mentions it as an info line). Run it before and
after a change to a kernel and diff the two: a change meant to leave the code as it was must
leave this list as it was: one that was believed to, and did not, once cost the YOLO-like
model 1.2% at batch 16 (git history of docs/perf-history.md, 2026-12-02).
"""
import argparse
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build", help="build directory (default: build)")
    ap.add_argument("files", nargs="*", help="CUDA sources (default: kernels/cuda/*.cu)")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    db = os.path.join(args.build, "compile_commands.json")
    try:
        entries = json.load(open(db))
    except (OSError, ValueError) as e:
        sys.exit(f"kernel_regs.py: cannot read {db}: {e} (configure with cmake first)")
    files = args.files or sorted(glob.glob(os.path.join(root, "kernels/cuda/*.cu")))
    for f in files:
        path = os.path.abspath(f)
        entry = next((e for e in entries if os.path.abspath(e["file"]) == path), None)
        if entry is None:
            sys.exit(f"kernel_regs.py: {f} is not in {db}")
        cmd = entry.get("arguments") or shlex.split(entry["command"])
        with tempfile.TemporaryDirectory() as tmp:
            out = cmd.index("-o")
            cmd = cmd[:out + 1] + [os.path.join(tmp, "k.o")] + cmd[out + 2:] + ["-Xptxas", "-v"]
            r = subprocess.run(cmd, cwd=entry["directory"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"kernel_regs.py: compiling {f} failed:\n{r.stderr}")
        report(os.path.relpath(path, root), r.stderr)


def report(name, log):
    kernel, spills = None, ("0", "0")
    rows = []
    serialized = {}  # mangled name -> ptxas's note number
    for line in log.splitlines():
        m = re.search(r"\((C75\d\d)\) Potential Performance Loss: wgmma.mma_async instructions are "
                      r"serialized.* (?:in|for) the function '(\w+)'", line)
        if m:
            serialized[m.group(2)] = m.group(1)
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            kernel, spills = m.group(1), ("0", "0")
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and kernel:
            spills = m.groups()
        m = re.search(r"Used (\d+) registers", line)
        if m and kernel:
            rows.append((kernel, m.group(1), spills))
            kernel = None
    names = subprocess.run(["c++filt"], input="\n".join(k for k, _, _ in rows),
                           capture_output=True, text=True).stdout.splitlines()
    print(f"== {name}: {len(rows)} kernels (registers, spill stores, spill loads)")
    names = [re.sub(r"^void |epilog::cuda::(\(anonymous namespace\)::|\w+_detail::)?", "", n)
             for n in names]
    for (k, regs, (st, ld)), n in sorted(zip(rows, names), key=lambda x: x[1]):
        note = f"  [wgmma serialized, {serialized[k]}]" if k in serialized else ""
        print(f"{regs:>4} {st:>4} {ld:>4}  {n}{note}")


if __name__ == "__main__":
    main()
