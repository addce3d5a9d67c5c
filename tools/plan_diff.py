#!/usr/bin/env python3
"""Which nodes two builds plan differently, and with --time how fast each runs the models whose
plans differ, the two builds taking turns.

  tools/plan_diff.py --a OLD/bin/epilog --b NEW/bin/epilog MODEL... [--batches 1,16]
                     [--time [--all]] [--rounds 2] [--iters 100] [--work DIR]

MODEL: a model file (JSON or ONNX), or a name tools/zoo.py takes (resnet50, timm:NAME), which
is exported with PyTorch's legacy exporter at batch 1 into --work (where PyTorch is installed).

`epilog explain --device cuda` needs no GPU (without one it plans for the default H200
profile), so the comparison runs anywhere: for each model and batch, the nodes whose explain
line (kernel, tiles, rule) differs between the builds. With --time, on a CUDA machine, each
model and batch that differs is timed by `epilog bench` (the graph replay's median), A then B,
for --rounds rounds; unchanged ones cost no device time. A change to lowering's rules is then
measured where it acts, and nowhere else. --all times every model and batch: a change inside a
kernel leaves the plans as they were.
"""
import argparse
import os
import sys
import time

sys.dont_write_bytecode = True  # no tools/__pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo  # noqa: E402  (its runner, bench parser and exporter; PyTorch only to export)


def plan_lines(explain_text):
    """explain's node table -> {node name: its line}; the lines before the table are left out."""
    lines, table = {}, False
    for line in explain_text.splitlines():
        if line.startswith("node "):
            table = True
        elif table and line.strip():
            lines[line.split()[0]] = line.rstrip()
    return lines


def plan_changes(a_text, b_text):
    """[(node, A's line or None, B's line or None)] for every node planned differently, in B's
    order, then the nodes only A has."""
    a, b = plan_lines(a_text), plan_lines(b_text)
    out = [(n, a.get(n), line) for n, line in b.items() if a.get(n) != line]
    return out + [(n, line, None) for n, line in a.items() if n not in b]


def model_file(model, work):
    """A model file as given, else the ONNX file of the zoo model so named (exported once)."""
    if os.path.isfile(model):
        return model
    try:
        import torch
    except ImportError:
        torch = None
    if not hasattr(torch, "nn"):  # tools/torch, a folder of scripts, is no PyTorch
        raise RuntimeError(f"'{model}' is not a file, and without PyTorch no zoo model can be "
                           "exported")
    path = os.path.join(work, zoo.file_safe(model) + ".onnx")
    if not os.path.isfile(path):
        os.makedirs(work, exist_ok=True)
        net, size = zoo.build_model(model, 0)
        zoo.export(net, zoo.make_input(size, 1, 0), "legacy", path)
    return path


def run(argv, timeout=600):
    rc, out, err = zoo.run_cmd(argv, timeout)
    if rc != 0:
        raise RuntimeError(f"'{' '.join(argv)}': {zoo.command_error(rc, err, timeout)}")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog="See the header of this file for what is compared.")
    p.add_argument("models", nargs="+", help="model files (JSON or ONNX) or zoo names")
    p.add_argument("--a", required=True, help="build A's epilog CLI (the baseline)")
    p.add_argument("--b", required=True, help="build B's epilog CLI")
    p.add_argument("--batches", default="1,16", help="default: %(default)s")
    p.add_argument("--time", action="store_true", help="time the changed ones (CUDA machine)")
    p.add_argument("--all", action="store_true",
                   help="with --time, time the unchanged ones too (kernel changes)")
    p.add_argument("--rounds", type=int, default=2, help="turns each build takes (default 2)")
    p.add_argument("--iters", type=int, default=100, help="epilog bench --iters (default 100)")
    p.add_argument("--work", default="/tmp/plan_diff",
                   help="folder of the exported zoo models (default: %(default)s)")
    a = p.parse_args()
    if a.all and not a.time:
        p.error("--all says what --time times: give --time too")
    batches = [b for b in a.batches.split(",") if b]
    changed, failed, start = [], False, time.time()
    for name in a.models:
        try:
            model = model_file(name, a.work)
        except Exception as e:  # an export that fails is reported; the others go on
            print(f"{name}: {e}", file=sys.stderr)
            failed = True
            continue
        for batch in batches:
            try:
                texts = [run([cli, "explain", model, "--device", "cuda", "--batch", batch])
                         for cli in (a.a, a.b)]
            except RuntimeError as e:
                print(f"{model} batch {batch}: {e}", file=sys.stderr)
                failed = True
                continue
            diff = plan_changes(*texts)
            print(f"{model} batch {batch}: {len(diff)} node(s) planned differently")
            for node, old, new in diff:
                print(f"  A {old or '(none)'}\n  B {new or '(none)'}")
            if diff or a.all:
                changed.append((model, batch))
    if a.time:
        for model, batch in changed:
            times = {"A": [], "B": []}
            for _ in range(a.rounds):
                for tag, cli in (("A", a.a), ("B", a.b)):
                    try:
                        replay, _ = zoo.parse_bench(run(
                            [cli, "bench", model, "--device", "cuda", "--batch", batch, "--iters",
                             str(a.iters), "--warmup", "10"]))
                        times[tag].append(replay)
                    except (RuntimeError, ValueError) as e:
                        print(f"{model} batch {batch}: {e}", file=sys.stderr)
                        failed = True
            ms = {tag: " ".join(f"{v:.3f}" for v in t) or "-" for tag, t in times.items()}
            print(f"time {model} batch {batch}: A {ms['A']} ms, B {ms['B']} ms "
                  f"({time.time() - start:.0f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
