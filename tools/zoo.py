"""The model zoo: torchvision and timm CNNs through both ONNX exporters, epilog checked against
PyTorch's float64 outputs and timed against PyTorch on the GPU.

  python3 tools/zoo.py [MODEL ...] --epilog build/bin/epilog --out DIR [--exporters legacy,dynamo]
      [--batches 1,16] [--no-compile] [--no-cpu] [--budget SECONDS] [--commit SHA]
  python3 tools/zoo.py --from-jsonl A.jsonl [B.jsonl ...] --out DIR    (the table again, no run)

MODEL is a torchvision classification or segmentation name, or timm:NAME; DEFAULT_MODELS below
when none is given. Needs a CUDA machine with torch, torchvision, timm, onnx and numpy; no
network (every model is built with random weights). For each model:
  1. Build it (torch.manual_seed(--seed)) in eval mode, with random normalization parameters:
     batchnorm running_mean ~ N(0, 0.1^2), running_var ~ U(0.5, 1.5); every norm layer's affine
     weight ~ U(0.5, 1.5), bias ~ N(0, 0.1^2). A segmentation model returns its 'out' alone.
     Input: 224x224 (segmentation 520x520, inception_v3 299x299; timm: its config's size).
  2. Export it at batch 1 with each exporter: legacy = torch.onnx.export(m, (x,), f,
     opset_version=17, dynamo=False); dynamo = torch.onnx.export(m, (x,), f, dynamo=True),
     PyTorch 2.11's default (opset 18+, weights in f.data).
  3. Per batch (epilog rebinds the batch: --batch N): `epilog run --device cpu|cuda` against
     the model in float64 on the CPU, same input. rel err = max over outputs of
     ||epilog - ref|| / ||ref||; passes at 1e-5 on the CPU and 1e-3 on the GPU (TF32).
  4. Per batch, on the GPU: epilog's graph replay median (`epilog bench --device cuda`), and
     PyTorch with TF32 on and cudnn.benchmark: eager, eager captured in one CUDA graph, float16
     channels-last in a CUDA graph (CUDA events around each call, warm-up, then the median of
     about 0.5 s of calls, no L2 flush), torch.compile(mode="reduce-overhead") in a child
     process bounded by --compile-timeout. epilog's replay is timed on the host (launch and
     synchronize), a few microseconds more than an event pair would see.
Each step is guarded: a failed export, a model epilog refuses (the first line of its stderr),
a timeout (--timeout per command) or a failed PyTorch variant goes into the row, and the run
goes on. DIR/zoo.jsonl gains one JSON object per (model, exporter, batch) as soon as it is
known, and DIR/zoo.md (the table: card, date, versions, --commit) is rewritten from it.
Rows of the same (model, exporter, batch) replace earlier ones, so a zoo.jsonl can collect
several runs. Progress and per-model times go to stderr.
"""
import argparse
import contextlib
import copy
import datetime
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

DEFAULT_MODELS = [
    "resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0",
    "regnet_y_400mf", "densenet121", "shufflenet_v2_x1_0", "convnext_tiny", "vgg11_bn",
    "deeplabv3_mobilenet_v3_large", "timm:cspdarknet53", "timm:repvgg_a0",
]
EXPORTERS = ("legacy", "dynamo")
TOLERANCE = {"cpu": 1e-5, "cuda": 1e-3}
TORCH_VARIANTS = ("eager", "graph", "compile", "fp16")  # row keys NAME_ms; errors under NAME
COMPILE_TAG = "zoo-compile "  # prefix of the compile worker's result line


def log(msg):
    print(f"[zoo {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def one_line(e, limit=300):
    """An exception or text as one line: its first non-empty line, at most `limit` characters."""
    text = str(e) if not isinstance(e, BaseException) else (str(e) or type(e).__name__)
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    if isinstance(e, BaseException) and not isinstance(e, ValueError):
        line = f"{type(e).__name__}: {line}"
    return line[:limit]


# -- running commands ------------------------------------------------------------------------

def run_cmd(argv, timeout):
    """Runs argv in its own process group. Returns (returncode, stdout, stderr); returncode is
    None when it ran past `timeout` seconds, and then the whole group is killed."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         errors="replace", start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, out, err


def command_error(rc, err, timeout):
    """Why a command failed, in one line: epilog's message is the first line of its stderr."""
    if rc is None:
        return f"timed out after {timeout:g} s"
    line = one_line(err)
    if rc < 0:
        return f"killed by signal {-rc}" + (f" ({line})" if line else "")
    return line or f"exit code {rc}, nothing on stderr"


def file_safe(name):
    """The file name `epilog run --output` gives an output (file_safe in tools/epilog.cpp)."""
    return re.sub(r"[/\\:]", "_", name)


# The two timing lines of cmd_bench in tools/epilog.cpp.
BENCH_E2E = re.compile(r"^end to end: median ([0-9.]+) ms, min ([0-9.]+) ms, max ([0-9.]+) ms "
                       r"over (\d+) iterations$", re.M)
BENCH_REPLAY = re.compile(r"^graph replay: median ([0-9.]+) ms, min ([0-9.]+) ms, "
                          r"max ([0-9.]+) ms$", re.M)


def parse_bench(text):
    """`epilog bench` stdout -> (graph replay median ms, end-to-end median ms). Raises
    ValueError, with the start of the output, when either line is missing."""
    e2e, replay = BENCH_E2E.search(text), BENCH_REPLAY.search(text)
    if not e2e or not replay:
        what = "end to end: median" if not e2e else "graph replay: median"
        head = " | ".join(text.strip().splitlines()[:3])[:200]
        raise ValueError(f"epilog bench: no '{what} ... ms' line in its output ({head!r})")
    return float(replay.group(1)), float(e2e.group(1))


# -- the table -------------------------------------------------------------------------------

def merge_rows(rows):
    """Rows with a key: the last of each (model, exporter, batch), in first-seen order."""
    merged = {}
    for r in rows:
        if "model" in r:
            merged[(r["model"], r.get("exporter"), r.get("batch"))] = r
    return list(merged.values())


def read_jsonl(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise SystemExit(f"zoo: {path}:{n}: not JSON ({e})")
    return rows


def fmt_ms(v):
    return "-" if v is None else f"{v:.3f}" if v < 10 else f"{v:.2f}"


def fmt_err(v, device):
    if v is None:
        return "-"
    return f"{v:.1e}" + ("" if v <= TOLERANCE[device] else " (fail)")


def speedup(row, key):
    t, e = row.get(key), row.get("epilog_ms")
    return t / e if t and e else None


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(rows):
    rows = merge_rows(rows)
    def values(key):
        return ", ".join(sorted({str(r[key]) for r in rows if r.get(key)})) or "-"
    out = [
        "# Model zoo: epilog against PyTorch",
        "",
        f"Card: {values('card')}. Date: {values('date')}. torch {values('torch')}, torchvision "
        f"{values('torchvision')}, timm {values('timm')}, onnx {values('onnx')}. "
        f"epilog commit: {values('commit')}.",
        "",
        "Made by `tools/zoo.py` (its header says how). Random weights and batchnorm statistics; "
        "exported at batch 1, run at the batch shown. err: ||epilog - PyTorch float64|| / "
        "||PyTorch float64||, passing at 1e-5 (CPU) and 1e-3 (GPU, TF32). Times: medians in ms "
        "on the card above, float32 with TF32; epilog = CUDA graph replay; PyTorch eager, eager "
        "captured in a CUDA graph, torch.compile(mode=\"reduce-overhead\"), float16 "
        "channels-last in a CUDA graph. Speedups: the PyTorch time over epilog's.",
        "",
        "| model | exporter | batch | loads | err CPU | err GPU | epilog | eager | graph "
        "| compile | fp16 cl | vs graph | vs compile | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for r in rows:
        loads = {True: "yes", False: "no", None: "-"}[r.get("loads")]
        ups = [speedup(r, k) for k in ("graph_ms", "compile_ms")]
        out.append("| " + " | ".join(cell(c) for c in [
            r["model"], r.get("exporter", "-"), r.get("batch", "-"), loads,
            fmt_err(r.get("err_cpu"), "cpu"), fmt_err(r.get("err_gpu"), "cuda"),
            fmt_ms(r.get("epilog_ms")), *(fmt_ms(r.get(f"{k}_ms")) for k in TORCH_VARIANTS),
            *("-" if u is None else f"{u:.2f}x" for u in ups), r.get("error") or ""]) + " |")
        for k in TORCH_VARIANTS:
            msg = (r.get("errors") or {}).get(k)
            note = f"- {r['model']}, batch {r.get('batch')}: PyTorch {k}: {msg}"
            if msg and note not in notes:
                notes.append(note)
    out += ["", "## Summary", "",
            "| exporter | batch | rows | load | CPU pass | GPU pass | vs graph (geomean, n) "
            "| vs compile (geomean, n) |", "|---|---|---|---|---|---|---|---|"]
    for exporter in sorted({r.get("exporter") for r in rows if r.get("exporter")}):
        for batch in sorted({r.get("batch") for r in rows if r.get("exporter") == exporter}):
            group = [r for r in rows if r.get("exporter") == exporter and r.get("batch") == batch]
            passes = {d: sum(1 for r in group if r.get(k) is not None and r[k] <= TOLERANCE[d])
                      for d, k in (("cpu", "err_cpu"), ("cuda", "err_gpu"))}
            means = []
            for k in ("graph_ms", "compile_ms"):
                ups = [u for u in (speedup(r, k) for r in group) if u]
                means.append(f"{geomean(ups):.2f}x, {len(ups)}" if ups else "-")
            out.append(f"| {exporter} | {batch} | {len(group)} | "
                       f"{sum(1 for r in group if r.get('loads'))} | {passes['cpu']} | "
                       f"{passes['cuda']} | {means[0]} | {means[1]} |")
    if notes:
        out += ["", "PyTorch variants that failed:", ""] + notes
    return "\n".join(out) + "\n"


def write_markdown(out_dir, rows):
    path = os.path.join(out_dir, "zoo.md")
    with open(path + ".tmp", "w") as f:
        f.write(render_markdown(rows))
    os.replace(path + ".tmp", path)
    return path


# -- models ----------------------------------------------------------------------------------

def build_model(spec, seed):
    """spec -> (float32 model in eval mode, (H, W)). Random weights and norm parameters."""
    import torch
    torch.manual_seed(seed)
    if spec.startswith("timm:"):
        import timm
        model = timm.create_model(spec[len("timm:"):], pretrained=False)
        cfg = getattr(model, "pretrained_cfg", None) or {}
        size = tuple(cfg.get("input_size", (3, 224, 224))[1:])
    else:
        import torchvision
        segmentation = spec in torchvision.models.list_models(torchvision.models.segmentation)
        if segmentation:
            class OutOnly(torch.nn.Module):
                def __init__(self, m):
                    super().__init__()
                    self.m = m

                def forward(self, x):
                    return self.m(x)["out"]

            model = OutOnly(torchvision.models.get_model(spec, weights=None,
                                                         weights_backbone=None))
            size = (520, 520)
        else:
            model = torchvision.models.get_model(spec, weights=None)
            size = (299, 299) if spec == "inception_v3" else (224, 224)
    g = torch.Generator().manual_seed(seed)
    norms = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.GroupNorm, torch.nn.LayerNorm)
    with torch.no_grad():
        for mod in model.modules():
            if not isinstance(mod, norms):
                continue
            if getattr(mod, "running_mean", None) is not None:
                mod.running_mean.copy_(torch.randn(mod.running_mean.shape, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(mod.running_var.shape, generator=g) + 0.5)
            if getattr(mod, "weight", None) is not None:
                mod.weight.copy_(torch.rand(mod.weight.shape, generator=g) + 0.5)
            if getattr(mod, "bias", None) is not None:
                mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * 0.1)
    return model.eval(), size


def make_input(size, batch, seed):
    import torch
    g = torch.Generator().manual_seed(seed * 1000 + batch)
    return torch.randn(batch, 3, *size, generator=g)


def outputs_of(y):
    """A model's output as a flat list of tensors."""
    if isinstance(y, (list, tuple)):
        return [t for v in y for t in outputs_of(v)]
    if isinstance(y, dict):
        return [t for v in y.values() for t in outputs_of(v)]
    return [y]


def export(model, x, exporter, path):
    """Writes the ONNX file (PyTorch's messages go to path.log); returns (input name, output
    names) read from the file."""
    import onnx
    import torch
    with open(path + ".log", "w") as f, contextlib.redirect_stdout(f), torch.no_grad():
        if exporter == "legacy":
            torch.onnx.export(model, (x,), path, opset_version=17, dynamo=False)
        else:
            torch.onnx.export(model, (x,), path, dynamo=True)
    graph = onnx.load(path, load_external_data=False).graph
    weights = {t.name for t in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in weights]
    if len(inputs) != 1:
        raise ValueError(f"the ONNX graph has {len(inputs)} inputs ({inputs}), expected one")
    return inputs[0], [o.name for o in graph.output]


def rel_err(got, ref):
    import numpy as np
    if got.shape != ref.shape:
        raise ValueError(f"shape {list(got.shape)}, expected {list(ref.shape)}")
    a, b = got.astype(np.float64), ref.astype(np.float64)
    d, n = float(np.linalg.norm(a - b)), float(np.linalg.norm(b))
    if not math.isfinite(d):
        raise ValueError("not finite (NaN or Inf)")
    return d / n if n > 0 else (0.0 if d == 0 else math.inf)


# -- PyTorch timings -------------------------------------------------------------------------

def setup_cuda():
    import torch
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True


def time_ms(fn, warmup_ms=100, rep_ms=500):
    """Median of CUDA-event timings of fn() after a warm-up (triton's do_bench, no L2 flush)."""
    import torch
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(5):
        fn()
    b.record()
    b.synchronize()
    estimate = max(a.elapsed_time(b) / 5, 1e-3)
    for _ in range(int(warmup_ms / estimate)):
        fn()
    n = max(20, min(2000, int(rep_ms / estimate)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) for s, e in zip(starts, ends))[n // 2]


def cuda_graph(fn):
    """fn captured once into a CUDA graph (after three warm-up calls on a side stream)."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def torch_timings(model, x, refs):
    """Eager, eager in a CUDA graph and float16 channels-last in a CUDA graph, on the GPU:
    ({NAME_ms: ms, 'torch_err_gpu': PyTorch's own TF32 error}, {NAME: error})."""
    import torch
    res, errors = {}, {}
    xc = x.cuda()

    def fp16():
        mh = copy.deepcopy(model).half().to(memory_format=torch.channels_last)
        xh = xc.half().to(memory_format=torch.channels_last)
        return cuda_graph(lambda: mh(xh))

    ways = {"eager": lambda: lambda: model(xc), "graph": lambda: cuda_graph(lambda: model(xc)),
            "fp16": fp16}
    with torch.no_grad():
        try:
            res["torch_err_gpu"] = max(rel_err(o.double().cpu().numpy(), r)
                                       for o, r in zip(outputs_of(model(xc)), refs))
        except Exception as e:
            errors["eager"] = one_line(e)
        for name, make in ways.items():
            try:
                res[f"{name}_ms"] = time_ms(make())
            except Exception as e:
                errors[name] = one_line(e)
            torch.cuda.synchronize()
    return res, errors


def compile_worker(spec, batch, seed):
    """The child process of torch_compile_ms: one line, COMPILE_TAG + JSON, on stdout."""
    import torch
    setup_cuda()
    model, size = build_model(spec, seed)
    model, x = model.cuda(), make_input(size, batch, seed).cuda()
    with torch.no_grad():
        compiled = torch.compile(model, mode="reduce-overhead")
        t0 = time.time()
        compiled(x)
        torch.cuda.synchronize()
        compile_s = time.time() - t0
        for _ in range(3):  # cudagraph trees record on a later call than the first
            compiled(x)
        ms = time_ms(lambda: compiled(x))
    print(COMPILE_TAG + json.dumps({"compile_ms": ms, "compile_s": round(compile_s, 1)}),
          flush=True)


def torch_compile_ms(spec, batch, seed, timeout):
    """torch.compile(mode="reduce-overhead") timed in a child process, so that a slow or
    failing compile costs at most `timeout` seconds: ({'compile_ms': ...}, error or None)."""
    argv = [sys.executable, os.path.abspath(__file__), "--compile-worker", spec,
            "--batches", str(batch), "--seed", str(seed)]
    rc, out, err = run_cmd(argv, timeout)
    for line in out.splitlines():
        if line.startswith(COMPILE_TAG):
            return json.loads(line[len(COMPILE_TAG):]), None
    if rc is None:
        return {}, f"timed out after {timeout:g} s"
    # A Python child's reason is its traceback's last line.
    last = [s for s in err.splitlines() if s.strip()]
    return {}, (last[-1].strip()[:300] if last else f"exit code {rc}")


# -- one model -------------------------------------------------------------------------------

def epilog_check(a, onnx_path, input_name, x_npy, output_names, refs, device, batch, out_dir):
    """`epilog run` on one device: (worst relative error or None, error or None, ran)."""
    import numpy as np
    argv = [a.epilog, "run", onnx_path, "--device", device, "--input", f"{input_name}={x_npy}",
            "--output", out_dir, "--batch", str(batch)]
    rc, _, err = run_cmd(argv, a.timeout)
    if rc != 0:
        return None, command_error(rc, err, a.timeout), False
    if len(output_names) != len(refs):
        return None, f"{len(output_names)} ONNX outputs, PyTorch gives {len(refs)}", True
    worst = 0.0
    for name, ref in zip(output_names, refs):
        try:
            worst = max(worst, rel_err(np.load(os.path.join(out_dir, file_safe(name) + ".npy")),
                                       ref))
        except Exception as e:
            return None, f"output '{name}': {one_line(e)}", True
    return worst, None, True


def epilog_bench(a, onnx_path, batch):
    """`epilog bench` on the GPU: ({'epilog_ms': replay, 'epilog_e2e_ms': ...}, error)."""
    argv = [a.epilog, "bench", onnx_path, "--device", "cuda", "--batch", str(batch),
            "--iters", str(a.iters), "--warmup", "10"]
    rc, out, err = run_cmd(argv, a.timeout)
    if rc != 0:
        return {}, command_error(rc, err, a.timeout)
    try:
        replay, e2e = parse_bench(out)
    except ValueError as e:
        log(f"  {e}")  # the format of tools/epilog.cpp changed: loud in the log and the row
        return {}, str(e)
    return {"epilog_ms": replay, "epilog_e2e_ms": e2e}, None


def run_model(spec, a, meta, work, emit):
    """Every (exporter, batch) row of one model, each passed to emit as soon as it is known."""
    import numpy as np
    import torch
    t_model = time.time()
    base = dict(meta, model=spec)
    try:
        model, size = build_model(spec, a.seed)
    except Exception as e:
        for exporter in a.exporters:
            for batch in a.batches:
                emit(dict(base, exporter=exporter, batch=batch, loads=None,
                          error=f"build: {one_line(e)}"))
        return
    files = {}  # exporter -> (path, input name, output names), or the export's error
    details = {}  # exporter -> the export error's full text (the start of it)
    for exporter in a.exporters:
        t0 = time.time()
        path = os.path.join(work, exporter, "model.onnx")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            files[exporter] = (path, *export(model, make_input(size, 1, a.seed), exporter, path))
            log(f"{spec}: {exporter} export {time.time() - t0:.1f} s")
        except Exception as e:
            files[exporter] = f"export ({exporter}): {one_line(e)}"
            details[exporter] = str(e)[:2000]
            log(f"{spec}: {files[exporter]}")
    gpu = torch.cuda.is_available()
    model_gpu = copy.deepcopy(model).cuda() if gpu else None
    model64 = copy.deepcopy(model).double()
    for batch in a.batches:
        x = make_input(size, batch, a.seed)
        t0 = time.time()
        with torch.no_grad():
            refs = [r.numpy() for r in outputs_of(model64(x.double()))]
        log(f"{spec}: batch {batch}: float64 reference {time.time() - t0:.1f} s")
        x_npy = os.path.join(work, f"x{batch}.npy")
        np.save(x_npy, x.numpy())
        timed, torch_errors = {}, {}
        if gpu:
            t0 = time.time()
            timed, torch_errors = torch_timings(model_gpu, x, refs)
            if a.compile:
                c, err = torch_compile_ms(spec, batch, a.seed, a.compile_timeout)
                timed.update(c)
                if err:
                    torch_errors["compile"] = err
            log(f"{spec}: batch {batch}: PyTorch timings {time.time() - t0:.1f} s "
                + " ".join(f"{k} {timed[k + '_ms']:.3f}" for k in TORCH_VARIANTS
                           if k + "_ms" in timed))
        for exporter in a.exporters:
            row = dict(base, exporter=exporter, batch=batch, input=[batch, 3, *size], **timed,
                       errors=dict(torch_errors), loads=None, error=None)
            if isinstance(files[exporter], str):
                row["error"] = row["errors"]["export"] = files[exporter]
                row["export_detail"] = details[exporter]
                emit(row)
                continue
            path, input_name, output_names = files[exporter]
            row.update(onnx_input=input_name, onnx_outputs=output_names)
            ran = []
            for device, key in (("cpu", "err_cpu"), ("cuda", "err_gpu")):
                if (device == "cpu" and not a.cpu) or (device == "cuda" and not gpu):
                    continue
                t0 = time.time()
                out_dir = os.path.join(work, exporter, f"{device}{batch}")
                row[key], err, ok = epilog_check(a, path, input_name, x_npy, output_names, refs,
                                                 device, batch, out_dir)
                ran.append(ok)
                if err:
                    row["errors"][device] = err
                log(f"{spec}: {exporter} batch {batch} {device}: "
                    + (f"err {row[key]:.1e}" if err is None else err)
                    + f" ({time.time() - t0:.1f} s)")
            if gpu and any(ran):
                t0 = time.time()
                b, err = epilog_bench(a, path, batch)
                row.update(b)
                if err:
                    row["errors"]["bench"] = err
                log(f"{spec}: {exporter} batch {batch} bench: "
                    + (f"{b['epilog_ms']:.3f} ms" if err is None else err)
                    + f" ({time.time() - t0:.1f} s)")
            row["loads"] = any(ran) if ran else None
            row["error"] = next((row["errors"][k] for k in ("cpu", "cuda", "bench")
                                 if k in row["errors"]), None)
            emit(row)
    log(f"{spec}: done in {time.time() - t_model:.0f} s")


def versions():
    meta = {"date": datetime.date.today().isoformat()}
    for name in ("torch", "torchvision", "timm", "onnx"):
        try:
            meta[name] = str(__import__(name).__version__)
        except Exception:
            meta[name] = None
    import torch
    meta["card"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return meta


def csv(kind, choices=None):
    def parse(text):
        items = [s.strip() for s in text.split(",") if s.strip()]
        if kind is int:
            if not all(s.isdigit() and int(s) > 0 for s in items):
                raise argparse.ArgumentTypeError(f"expected positive integers, got '{text}'")
            items = [int(s) for s in items]
        elif choices and not set(items) <= set(choices):
            raise argparse.ArgumentTypeError(f"expected some of {','.join(choices)}, got '{text}'")
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        return items
    return parse


def main():
    p = argparse.ArgumentParser(
        description="Export torchvision/timm models to ONNX, check epilog against PyTorch's "
        "float64 outputs and time both on the GPU (see the header of this file).")
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="torchvision name or timm:NAME (default: " + " ".join(DEFAULT_MODELS) + ")")
    p.add_argument("--epilog", default="build/bin/epilog", help="the epilog CLI (default: %(default)s)")
    p.add_argument("--out", help="folder of zoo.jsonl (appended to) and zoo.md (required)")
    p.add_argument("--exporters", type=csv(str, EXPORTERS), default=list(EXPORTERS),
                   help="legacy,dynamo (default: both)")
    p.add_argument("--batches", type=csv(int), default=[1, 16], help="default: 1,16")
    p.add_argument("--no-compile", dest="compile", action="store_false",
                   help="skip torch.compile (tens of seconds a model and batch)")
    p.add_argument("--no-cpu", dest="cpu", action="store_false", help="skip epilog on the CPU")
    p.add_argument("--budget", type=float, help="start no new model after this many seconds")
    p.add_argument("--timeout", type=float, default=300, help="seconds per epilog command "
                   "(default: %(default)s)")
    p.add_argument("--compile-timeout", type=float, default=240,
                   help="seconds for torch.compile's child process, per batch (default: %(default)s)")
    p.add_argument("--iters", type=int, default=200, help="epilog bench --iters (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and inputs (default: 0)")
    p.add_argument("--commit", help="the epilog commit, for the table")
    p.add_argument("--work", help="folder for ONNX files and arrays, kept (default: a temporary "
                   "folder, removed at the end)")
    p.add_argument("--from-jsonl", nargs="+", metavar="FILE",
                   help="only write OUT/zoo.md from these zoo.jsonl files")
    p.add_argument("--compile-worker", help=argparse.SUPPRESS)
    a = p.parse_args()

    if a.compile_worker:
        compile_worker(a.compile_worker, a.batches[0], a.seed)
        return 0
    if not a.out:
        p.error("--out is required")
    os.makedirs(a.out, exist_ok=True)
    if a.from_jsonl:
        path = write_markdown(a.out, read_jsonl(a.from_jsonl))
        log(f"wrote {path}")
        return 0
    if not os.access(a.epilog, os.X_OK):
        p.error(f"--epilog {a.epilog}: not an executable (build the epilog_cli target first)")

    import torch
    if torch.cuda.is_available():
        setup_cuda()
    else:
        log("no CUDA device: epilog on the CPU only, no timings")
    meta = dict(versions(), commit=a.commit)
    jsonl = os.path.join(a.out, "zoo.jsonl")
    rows = read_jsonl([jsonl]) if os.path.exists(jsonl) else []

    def emit(row):
        rows.append(row)
        with open(jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")
        write_markdown(a.out, rows)

    models = a.models or DEFAULT_MODELS
    work = a.work or tempfile.mkdtemp(prefix="zoo-")
    start, skipped = time.time(), []
    log(f"{len(models)} models, exporters {','.join(a.exporters)}, batches "
        f"{','.join(map(str, a.batches))} on {meta['card']}; rows to {jsonl}")
    try:
        for i, spec in enumerate(models):
            if a.budget is not None and time.time() - start > a.budget:
                skipped = models[i:]
                break
            log(f"{spec} ({i + 1}/{len(models)})")
            model_work = os.path.join(work, file_safe(spec))
            try:
                run_model(spec, a, meta, model_work, emit)
            except Exception as e:  # a bug of this harness, or a CUDA error: the next model
                log(f"{spec}: harness error: {one_line(e)}")
                emit(dict(meta, model=spec, error=f"harness: {one_line(e)}"))
            if not a.work:
                shutil.rmtree(model_work, ignore_errors=True)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    write_markdown(a.out, rows)
    log(f"done in {time.time() - start:.0f} s; table {os.path.join(a.out, 'zoo.md')}")
    if skipped:
        log(f"--budget {a.budget:g} s spent; not started: {' '.join(skipped)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
