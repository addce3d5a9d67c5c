#!/usr/bin/env python3
"""Memory and batch-size targets of the runtime, against PyTorch on the same GPU.

For each model (default: resnet50 and the YOLO-like model) and batch size:
  - PyTorch's inference peak: torch.cuda.max_memory_allocated() during one eager forward under
    torch.no_grad(), minus the memory held before it (weights and input). It includes the
    outputs and cuDNN's workspace.
  - epilog's, from `epilog bench MODEL --device cuda --batch N,M,...` (one model, a cached plan
    per batch size): peak activations + workspace + outputs (inputs and outputs less the
    input), and images/s end to end.
  - Cached-plan latency at --latency-batch N: one Model at N, then at another batch, then at N
    again (`epilog bench --batch N,M,N`): its first plan at N and that plan cached, seen before,
    against a fresh single-batch executor (`epilog bench --batch N`), end to end, taking turns
    for --rounds rounds in the same call: one round cannot tell a difference of a few percent
    from the card's drift. The first plan tells the Model's path apart from the cache, and the
    plan cached with no other batch run in between (`--batch N,N`) the cache apart from what
    running another batch size does to the process.

Writes batch_bench.md and batch_bench.jsonl under --out. Needs a CUDA machine with PyTorch
(and torchvision for resnet50). The YOLO-like model runs from models/yolo_like.json in epilog
and tools/torch/torch_yolo_like.py in PyTorch: the same layers, different random weights, which
memory and time do not depend on.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MIB = float(1 << 20)

SWEEP_LINE = re.compile(
    r"batch (\d+)\s+median\s+([\d.]+) ms.*?([\d.]+) images/s\s+activations ([\d.]+) MiB\s+"
    r"workspace ([\d.]+) MiB\s+inputs and outputs ([\d.]+) MiB")
SINGLE_LINE = re.compile(r"end to end: median ([\d.]+) ms")


def parse_sweep(text):
    """`epilog bench --batch N,M` output -> {batch: {ms, images_s, activations, workspace, io}}."""
    rows = {}
    for m in SWEEP_LINE.finditer(text):
        b = int(m.group(1))
        rows[b] = {"ms": float(m.group(2)), "images_s": float(m.group(3)),
                   "activations_mib": float(m.group(4)), "workspace_mib": float(m.group(5)),
                   "io_mib": float(m.group(6))}
    return rows


def sweep_times(text, batch):
    """`epilog bench --batch N,M,...` output -> the medians at `batch`, in the order run."""
    return [float(m.group(2)) for m in SWEEP_LINE.finditer(text) if int(m.group(1)) == batch]


def parse_single(text):
    m = SINGLE_LINE.search(text)
    return float(m.group(1)) if m else None


def torch_model(name):
    """name -> (PyTorch model on the CPU in eval mode, input (C, H, W)). Anything else than
    yolo_like is a tools/zoo.py model spec (torchvision name or timm:NAME)."""
    if name == "yolo_like":
        sys.path.insert(0, os.path.join(HERE, "torch"))
        from torch_yolo_like import YoloLike
        return YoloLike().eval(), (3, 640, 640)
    import zoo
    model, size = zoo.build_model(name, 0)
    return model, (3, *size)


def torch_peak_mib(model, chw, batch):
    """PyTorch's eager inference peak above weights and input, in MiB; None when out of memory."""
    import torch
    torch.cuda.empty_cache()
    x = torch.randn(batch, *chw, device="cuda")
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    try:
        with torch.no_grad():
            y = model(x)
        torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError:
        return None
    peak = torch.cuda.max_memory_allocated() - held
    del x, y
    return peak / MIB


def epilog_file(name, model, chw, work):
    """The model file epilog loads: the YOLO-like JSON, or a legacy ONNX export (made once)."""
    if name == "yolo_like":
        return os.path.join(ROOT, "models", "yolo_like.json")
    path = os.path.join(work, name.replace(":", "_") + ".onnx")
    if not os.path.exists(path):
        import torch
        import zoo
        zoo.export(model, torch.randn(1, *chw), "legacy", path)
    return path


def run(cmd, timeout):
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    print(f"  $ {' '.join(cmd)}  ({time.time() - t0:.0f} s, rc {r.returncode})", flush=True)
    if r.returncode != 0:
        print(r.stderr.strip()[-2000:], flush=True)
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog="See the header of this file for what is measured.")
    p.add_argument("models", nargs="*", default=["resnet50", "yolo_like"],
                   help="yolo_like, or torchvision / timm:NAME as tools/zoo.py takes them "
                   "(default: resnet50 yolo_like)")
    p.add_argument("--epilog", default="build/bin/epilog", help="the epilog CLI")
    p.add_argument("--batches", default="1,16,64", help="sweep (default: %(default)s)")
    p.add_argument("--big", default="", help="extra sweep batch sizes for epilog only, e.g. 256")
    p.add_argument("--latency-batch", type=int, default=16,
                   help="batch of the cached-plan vs fresh-executor comparison")
    p.add_argument("--rounds", type=int, default=3,
                   help="cached-plan and fresh-executor runs, taking turns (default: 3)")
    p.add_argument("--iters", type=int, default=50, help="epilog bench --iters")
    p.add_argument("--work", default="/tmp/batch_bench", help="folder for exported ONNX files")
    p.add_argument("--out", required=True, help="folder for batch_bench.md and .jsonl")
    p.add_argument("--timeout", type=float, default=300, help="seconds per epilog command")
    a = p.parse_args()
    batches = [int(b) for b in a.batches.split(",") if b]
    big = [int(b) for b in a.big.split(",") if b]
    os.makedirs(a.work, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    import torch
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    card = torch.cuda.get_device_name()
    results = []
    for name in a.models:
        print(f"== {name}", flush=True)
        model, chw = torch_model(name)
        path = epilog_file(name, model, chw, a.work)
        model = model.cuda()
        weights_mib = sum(t.numel() * t.element_size() for t in model.state_dict().values()) / MIB
        torch_peaks = {b: torch_peak_mib(model, chw, b) for b in batches + big}
        del model
        torch.cuda.empty_cache()
        sizes = ",".join(str(b) for b in batches + big)
        sweep = run([a.epilog, "bench", path, "--device", "cuda", "--batch", sizes, "--iters",
                     str(a.iters)], a.timeout)
        rows = parse_sweep(sweep.stdout)
        lb = a.latency_batch
        first = next((b for b in batches + big if b != lb), lb + 1)
        model_first, cached, alone, fresh = [], [], [], []
        for _ in range(a.rounds):
            c = run([a.epilog, "bench", path, "--device", "cuda", "--batch", f"{lb},{first},{lb}",
                     "--iters", str(a.iters)], a.timeout)
            s = run([a.epilog, "bench", path, "--device", "cuda", "--batch", f"{lb},{lb}",
                     "--iters", str(a.iters)], a.timeout)
            f = run([a.epilog, "bench", path, "--device", "cuda", "--batch", str(lb), "--iters",
                     str(a.iters)], a.timeout)
            at_lb = sweep_times(c.stdout, lb)
            model_first.append(at_lb[0] if at_lb else None)
            cached.append(at_lb[1] if len(at_lb) > 1 else None)
            at_lb = sweep_times(s.stdout, lb)
            alone.append(at_lb[1] if len(at_lb) > 1 else None)
            fresh.append(parse_single(f.stdout))
        for b in batches + big:
            e = rows.get(b)
            results.append({
                "model": name, "batch": b, "card": card, "torch_weights_mib": weights_mib,
                "torch_peak_mib": torch_peaks.get(b),
                "epilog": e,
                # Inputs are left out on both sides, outputs counted on both.
                "epilog_peak_mib": None if e is None else
                e["activations_mib"] + e["workspace_mib"] + e["io_mib"] -
                b * chw[0] * chw[1] * chw[2] * 4 / MIB,
                "model_first_ms": model_first if b == lb else None,
                "cached_ms": cached if b == lb else None,
                "cached_alone_ms": alone if b == lb else None,
                "fresh_ms": fresh if b == lb else None,
                "error": None if e else (sweep.stderr.strip().splitlines() or ["no output"])[-1],
            })
    with open(os.path.join(a.out, "batch_bench.jsonl"), "a") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    lines = [f"card: {card}, PyTorch {torch.__version__}", "",
             "| model | batch | PyTorch peak (MiB) | epilog peak (MiB) | epilog images/s | "
             "epilog ms | Model's first plan / cached after another batch / cached alone / "
             "fresh executor ms, by round |",
             "|---|---|---|---|---|---|---|"]
    fmt = lambda v, f="{:.1f}": "-" if v is None else f.format(v)
    pairs = lambda r: "-" if not r["fresh_ms"] else ", ".join(
        " / ".join(fmt(v, "{:.3f}") for v in t)
        for t in zip(r["model_first_ms"], r["cached_ms"], r["cached_alone_ms"], r["fresh_ms"]))
    for r in results:
        e = r["epilog"] or {}
        lines.append(f"| {r['model']} | {r['batch']} | {fmt(r['torch_peak_mib'])} | "
                     f"{fmt(r['epilog_peak_mib'])} | {fmt(e.get('images_s'))} | "
                     f"{fmt(e.get('ms'), '{:.3f}')} | {pairs(r)} |"
                     + (f" {r['error']}" if r["error"] else ""))
    text = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "batch_bench.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
