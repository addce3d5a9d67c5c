#!/usr/bin/env python3
"""The table of tools/ab.sh: per shape the selected kernel's microseconds of build A and B in
every round and B's median over A's, then the YOLO-like model's graph replay the same way.

usage: ab_table.py OUT_DIR
"""
import glob, json, os, re, statistics, sys


def rounds(out, prefix, suffix):
    """{round: path} of the files out/<prefix><round><suffix>."""
    found = {}
    for p in glob.glob(os.path.join(out, f"{prefix}*{suffix}")):
        m = re.fullmatch(re.escape(prefix) + r"(\d+)" + re.escape(suffix), os.path.basename(p))
        if m:
            found[int(m.group(1))] = p
    return [found[r] for r in sorted(found)]


def shapes_us(paths):
    """{shape: [selected us of each round]}, in the order of the first round."""
    table = {}
    for p in paths:
        with open(p) as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    table.setdefault(row["shape"], []).append(row.get("selected_us"))
    return table


def replay_ms(path):
    with open(path) as f:
        m = re.search(r"graph replay: median ([0-9.]+) ms", f.read())
    return float(m.group(1)) if m else None


def fmt(values, digits):
    return ", ".join("-" if v is None else f"{v:.{digits}f}" for v in values) or "-"


def ratio(a, b):
    a = [v for v in a if v is not None]
    b = [v for v in b if v is not None]
    return f"{statistics.median(b) / statistics.median(a):.3f}" if a and b else "-"


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) == 2 else 2
    out = sys.argv[1]
    tags = sorted({re.sub(r"^a\d+\.|\.jsonl$", "", os.path.basename(p))
                   for p in glob.glob(os.path.join(out, "a*.jsonl"))})
    print("| shape | A (us) | B (us) | B / A |")
    print("|---|---|---|---|")
    for tag in tags:
        a = shapes_us(rounds(out, "a", f".{tag}.jsonl"))
        b = shapes_us(rounds(out, "b", f".{tag}.jsonl"))
        for shape in a:
            print(f"| {shape} | {fmt(a[shape], 1)} | {fmt(b.get(shape, []), 1)} | "
                  f"{ratio(a[shape], b.get(shape, []))} |")
    for batch in (16, 1):
        a = [replay_ms(p) for p in rounds(out, "a", f".model_b{batch}.txt")]
        b = [replay_ms(p) for p in rounds(out, "b", f".model_b{batch}.txt")]
        print(f"| yolo_like batch {batch}, graph replay (ms) | {fmt(a, 3)} | {fmt(b, 3)} | "
              f"{ratio(a, b)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
