#!/usr/bin/env python3
"""Where one kernel's warps stall, instruction by instruction (Nsight Compute's stall sampling).

usage: tools/stall_sampling.py --shape NAME --kernel REGEX [--bin DIR] [--shapes FILE]
                               [--skip N] [--top N] [--save FILE]
       tools/stall_sampling.py --csv FILE [--top N]

Runs `ncu` (SourceCounters and WarpStateStats) on one launch of the first kernel whose name
matches REGEX while `conv_bench --only NAME` runs (after --skip launches of it, default 2: past
conv_bench's check), then reads the SASS source page of the report; or reads such a page saved
earlier (--csv; `ncu -i REPORT --page source --csv --print-source sass` writes it). Prints:
  - the waits, summed: each mbarrier's (by its shared-memory offset: a pipeline's "full" and
    "empty" barriers are apart), the wgmmas' (WARPGROUP.DEPBAR), the block barriers' (BAR);
  - the instructions holding the most samples, each with its top stall reasons.
An mbarrier wait is a try-wait and a branch back to it; the samples land mostly on the branch,
so a branch's samples count for the try-wait shortly before it.
"""
import argparse
import csv
import os
import re
import shutil
import subprocess
import sys
import tempfile

SAMPLES = "Warp Stall Sampling (All Samples)"


def fail(msg):
    sys.exit(f"stall_sampling.py: {msg}")


def read_page(text):
    """(kernel name, rows): rows of (sass, samples, {reason: samples}) in address order."""
    lines = list(csv.reader(text.splitlines()))
    start = next((i for i, r in enumerate(lines) if r and r[0] == "Address"), None)
    if start is None or SAMPLES not in lines[start]:
        fail(f"no source page with a '{SAMPLES}' column (was SourceCounters collected?)")
    kernel = next((r[1] for r in lines[:start] if len(r) > 1 and r[0] == "Kernel Name"), "?")
    head = lines[start]
    i_src, i_all = head.index("Source"), head.index(SAMPLES)
    reasons = [(i, h) for i, h in enumerate(head) if h.startswith("stall_") and "(" not in h]
    rows = []
    for r in lines[start + 1 :]:
        if len(r) <= i_all or not r[i_all].isdigit():
            continue
        why = {h[len("stall_") :]: int(r[i]) for i, h in reasons if r[i].isdigit() and r[i] != "0"}
        rows.append((r[i_src].strip(), int(r[i_all]), why))
    if not rows:
        fail("the source page has no instructions")
    return kernel, rows


def wait_of(rows, k):
    """The wait instruction k belongs to: its kind and, for an mbarrier, its offset."""
    sass = rows[k][0]
    if "WARPGROUP.DEPBAR" in sass:
        return "wgmma wait (WARPGROUP.DEPBAR)"
    if re.search(r"\bBAR\.(SYNC|RED|ARV)", sass):
        return "block barrier (BAR)"
    if "TRYWAIT" in sass or re.search(r"\bBRA\b", sass):
        for j in range(k, max(k - 16, -1), -1):
            m = re.search(r"TRYWAIT[^\[]*\[([^\]]+)\]", rows[j][0])
            if m:
                off = re.search(r"(0x[0-9a-f]+)\s*$", m.group(1))
                return f"mbarrier wait at {off.group(1) if off else m.group(1)}"
            if j < k and re.search(r"\bBRA\b", rows[j][0]):
                break
    return None


def report(kernel, rows, top):
    total = sum(s for _, s, _ in rows)
    if total == 0:
        fail("no stall samples (was the kernel too short to sample?)")
    print(f"{kernel}\n{total} samples over {len(rows)} instructions\n\nwaits:")
    waits = {}
    for k in range(len(rows)):
        w = wait_of(rows, k)
        if w:
            waits[w] = waits.get(w, 0) + rows[k][1]
    for w, s in sorted(((w, s) for w, s in waits.items() if s), key=lambda x: -x[1]):
        print(f"  {100 * s / total:5.1f}%  {w}")
    rest = total - sum(waits.values())
    print(f"  {100 * rest / total:5.1f}%  everything else\n\ninstructions:")
    for k in sorted(range(len(rows)), key=lambda k: -rows[k][1])[:top]:
        sass, s, why = rows[k]
        top_why = sorted(why.items(), key=lambda x: -x[1])[:2]
        reasons = ", ".join(f"{r} {100 * n / s:.0f}%" for r, n in top_why if 100 * n >= s)
        print(f"  {100 * s / total:5.1f}%  #{k:<5} {sass[:56]:<56} {reasons}")


def profile(args):
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    bench = os.path.join(args.bin, "conv_bench")
    if not os.access(bench, os.X_OK):
        fail(f"{bench} is not an executable (--bin)")
    with tempfile.TemporaryDirectory() as tmp:
        rep = os.path.join(tmp, "stalls")
        cmd = [ncu, "--clock-control", "none", "-k", f"regex:{args.kernel}", "--launch-skip",
               str(args.skip), "--launch-count", "1", "--section", "SourceCounters", "--section",
               "WarpStateStats", "-o", rep, bench, "--shapes", args.shapes, "--only", args.shape]
        print(f"profiling {args.shape} ({args.kernel}) with {ncu} ...", file=sys.stderr)
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0 or not os.path.exists(rep + ".ncu-rep"):
            fail(f"ncu failed (status {run.returncode}):\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
        page = subprocess.run([ncu, "-i", rep + ".ncu-rep", "--page", "source", "--csv",
                               "--print-source", "sass"], capture_output=True, text=True)
        if page.returncode != 0:
            fail(f"ncu could not print the source page:\n{page.stderr[-2000:]}")
        return page.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", help="read this saved source page instead of running ncu")
    ap.add_argument("--shape", help="conv_bench shape name (--only)")
    ap.add_argument("--kernel", help="regex of the kernel's name, as ncu -k takes it")
    ap.add_argument("--bin", default="build/bin", help="folder of conv_bench (default build/bin)")
    ap.add_argument("--shapes", default="tools/conv_shapes.json", help="conv_bench shape file")
    ap.add_argument("--skip", type=int, default=2, help="launches of the kernel to skip first")
    ap.add_argument("--top", type=int, default=15, help="instructions to list (default 15)")
    ap.add_argument("--save", help="also write the source page to this file")
    args = ap.parse_args()
    if args.csv:
        try:
            with open(args.csv, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            fail(f"{args.csv}: {e.strerror}")
    else:
        if not args.shape or not args.kernel:
            fail("--shape and --kernel are required without --csv (see --help)")
        text = profile(args)
    if args.save:
        with open(args.save, "w", encoding="utf-8") as f:
            f.write(text)
    report(*read_page(text), args.top)


if __name__ == "__main__":
    main()
