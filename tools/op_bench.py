#!/usr/bin/env python3
"""Single ops, epilog against PyTorch on the same GPU, at the shapes where they occur in real CNNs.

  python3 tools/op_bench.py [CASE ...] --epilog build/bin/epilog --out DIR [--iters N]
      [--budget SECONDS] [--no-check] [--dry-run] [--list]

Each case is one op at the shape of a real model's layer, batch 16 (--batch) unless its name
says otherwise; --list prints them with the layer each comes from. For each case:
  1. DIR/models/CASE.json: the op as an epilog JSON model, weights from seeds.
     `epilog explain --device cuda` gives the kernel column: what fusion and lowering made of the
     lone op (a lone batchnorm may stay one kernel, reduce_mean over H and W may become
     global_avgpool); a case run with --no-fuse says so in its row.
  2. --check (default): the case at --check-batch, its weights and inputs from PyTorch, through
     `epilog run --device cuda` against PyTorch's output on the GPU: err = ||epilog - torch|| /
     ||torch||, which proves the two sides compute the same thing (1e-3: TF32 matmuls and convs).
  3. epilog: `epilog bench --device cuda --iters N`, its "graph replay: median" (one CUDA graph of
     the whole plan, launched and synchronized on the host).
  4. PyTorch: the torch.nn.functional equivalent on the same shapes, float32, TF32 and
     cudnn.benchmark on, captured in a CUDA graph and replayed: "PyTorch graph" is the median
     of CUDA-event timings (tools/zoo.py's time_ms, its "PyTorch graph"); "host" times
     replay + synchronize on the host as epilog bench does, which matters for ops of a few
     microseconds, where the launch is most of the time.
speedup = PyTorch / epilog (> 1: epilog is faster). DIR/op_bench.jsonl gets a row per case as
soon as it is known (rewritten by each run) and DIR/op_bench.md the table, card and versions on top.
A case that fails is a row with its error. --dry-run needs neither PyTorch nor a GPU: it
writes the models, explains them for CUDA and runs each once on the CPU at --check-batch.
"""
import argparse
import array
import datetime
import json
import math
import os
import random
import re
import shutil
import struct
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # importing zoo leaves no tools/__pycache__
sys.path.insert(0, HERE)
import zoo  # noqa: E402  (stdlib only at import: the helpers it shares are torch-free)

torch = F = None  # imported by import_torch(), so that --help, --list and --dry-run need none
TOLERANCE = 1e-3


def log(msg):
    print(f"[op_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the cases -------------------------------------------------------------------------------
# A case's graph is a function of the batch: (inputs {name: shape}, weights {name: shape},
# nodes). Its torch function maps the tensors by name (inputs and weights) to the output(s).

def node(op, inputs, outputs=("y",), **attrs):
    return {"op": op, "inputs": list(inputs), "outputs": list(outputs), "attrs": attrs}


def unary(op, shape, **attrs):
    return {"x": shape}, {}, [node(op, ["x"], **attrs)]


def affine_norm(op, shape, c, **attrs):
    """A normalization with a scale and a bias of c channels."""
    return {"x": shape}, {"w": [c], "b": [c]}, [node(op, ["x", "w", "b"], **attrs)]


def binary(op, a, b):
    return {"a": a, "b": b}, {}, [node(op, ["a", "b"])]


class Case:
    def __init__(self, name, where, graph, fn, no_fuse=False):
        self.name, self.where, self.graph, self.fn, self.no_fuse = name, where, graph, fn, no_fuse


def ln_channels_first(t):
    # torchvision's and timm's LayerNorm2d: permute to NHWC, layer_norm over C, permute back.
    x = t["x"]
    return F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), t["w"], t["b"],
                        1e-6).permute(0, 3, 1, 2)


def shuffle(x, groups):
    # torchvision's shufflenetv2.channel_shuffle.
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).contiguous().view(n, c, h, w)


def one(name, where, op, shape, fn, **attrs):
    """A case of one input x of `shape` after the batch; fn maps x to PyTorch's output."""
    return Case(name, where, lambda b: unary(op, [b, *shape], **attrs), lambda t: fn(t["x"]))


def ln_cf(name, where, shape, batch=None):
    """ConvNeXt's channels-first LayerNorm over C of NCHW (batch: fixed, else --batch)."""
    return Case(name, where, lambda b: affine_norm("layer_norm", [batch or b, *shape], shape[0],
                                                   axis=1, last_axis=1, eps=1e-6),
                ln_channels_first)


def resize(name, where, shape, size, mode, fn, **attrs):
    """resize of [b, *shape] to `size` (H, W); its sizes attribute names the batch too."""
    return Case(name, where, lambda b: unary("resize", [b, *shape], sizes=[b, shape[0], *size],
                                             mode=mode, **attrs), lambda t: fn(t["x"]))


CASES = [
    # activations
    one("gelu", "ConvNeXt-T stage 1 MLP", "gelu", [384, 56, 56], lambda x: F.gelu(x)),
    one("hardswish_head", "MobileNetV3-L last stage", "hardswish", [960, 7, 7],
        lambda x: F.hardswish(x)),
    one("hardswish_stem", "MobileNetV3-L stem", "hardswish", [16, 112, 112],
        lambda x: F.hardswish(x)),
    one("hardsigmoid_se", "MobileNetV3-L squeeze-excite gate", "hardsigmoid", [960, 1, 1],
        lambda x: F.hardsigmoid(x), alpha=1 / 6, beta=0.5),
    one("silu", "EfficientNet-B0 block 2 expand", "silu", [96, 112, 112], lambda x: F.silu(x)),
    one("leaky_relu", "CSPDarknet53 stage 1 (256x256 input)", "leaky_relu", [64, 128, 128],
        lambda x: F.leaky_relu(x, 0.1), alpha=0.1),
    one("relu6", "MobileNetV2 block 2 expand (clip 0..6)", "clip", [96, 112, 112],
        lambda x: F.relu6(x), min=0.0, max=6.0),
    one("mish", "CSPDarknet53 stage 1 (256x256 input)", "mish", [64, 128, 128],
        lambda x: F.mish(x)),
    one("tanh", "GAN generator output (256x256)", "tanh", [3, 256, 256], lambda x: torch.tanh(x)),
    # normalizations
    ln_cf("layer_norm_cf_s1", "ConvNeXt-T stage 1, channels-first LayerNorm", [96, 56, 56]),
    ln_cf("layer_norm_cf_s4_b1", "ConvNeXt-T stage 4 at batch 1", [768, 7, 7], batch=1),
    ln_cf("layer_norm_cf_s4", "ConvNeXt-T stage 4", [768, 7, 7]),
    Case("layer_norm_last", "ViT-B/16 tokens, over the last axis",
         lambda b: affine_norm("layer_norm", [b, 196, 768], 768, eps=1e-6),
         lambda t: F.layer_norm(t["x"], (768,), t["w"], t["b"], 1e-6)),
    Case("group_norm", "ResNet-50-GN / FPN head (32 groups)",
         lambda b: affine_norm("group_norm", [b, 256, 56, 56], 256, groups=32),
         lambda t: F.group_norm(t["x"], 32, t["w"], t["b"], 1e-5)),
    Case("group_norm_1", "PoolFormer-S12 stage 1 (GroupNorm(1, C): a whole image a group)",
         lambda b: affine_norm("group_norm", [b, 64, 56, 56], 64, groups=1),
         lambda t: F.group_norm(t["x"], 1, t["w"], t["b"], 1e-5)),
    Case("instance_norm", "style transfer / CycleGAN down block",
         lambda b: affine_norm("instance_norm", [b, 128, 64, 64], 128),
         lambda t: F.instance_norm(t["x"], weight=t["w"], bias=t["b"], eps=1e-5)),
    Case("batchnorm", "DenseNet-121 pre-activation after block 1",
         lambda b: ({"x": [b, 256, 56, 56]}, {"w": [256], "b": [256], "m": [256], "v": [256]},
                    [node("batchnorm", ["x", "w", "b", "m", "v"])]),
         lambda t: F.batch_norm(t["x"], t["m"], t["v"], t["w"], t["b"], False, 0.0, 1e-5)),
    one("softmax", "ViT-B/16 attention scores, last axis", "softmax", [12, 196, 196],
        lambda x: torch.softmax(x, -1), axis=-1),
    # reductions
    one("reduce_mean_hw", "EfficientNet-B0 block 2 squeeze (mean over H, W)", "reduce_mean",
        [96, 112, 112], lambda x: x.mean((2, 3), keepdim=True), axes=[2, 3], keepdims=1),
    one("reduce_mean_c", "CBAM spatial attention (mean over C)", "reduce_mean", [256, 56, 56],
        lambda x: x.mean(1, keepdim=True), axes=[1], keepdims=1),
    one("global_avgpool", "ResNet-50 head", "global_avgpool", [2048, 7, 7],
        lambda x: F.adaptive_avg_pool2d(x, 1)),
    # resampling
    one("upsample_nearest", "YOLOv5 neck (640 input), x2", "upsample_nearest", [256, 40, 40],
        lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), scale=[2, 2]),
    resize("resize_nearest", "FPN top-down, x2 as ONNX Resize", [256, 64, 64], [128, 128],
           "nearest", lambda x: F.interpolate(x, size=(128, 128), mode="nearest"),
           coordinate_mode="asymmetric", nearest_mode="floor"),
    resize("resize_bilinear", "FPN / U-Net decoder, x2 bilinear", [256, 64, 64], [128, 128],
           "linear", lambda x: F.interpolate(x, size=(128, 128), mode="bilinear",
                                             align_corners=False),
           coordinate_mode="pytorch_half_pixel"),
    resize("resize_bilinear_deeplab", "DeepLabV3-MobileNetV3 output (520 input), 33 -> 520",
           [21, 33, 33], [520, 520], "linear",
           lambda x: F.interpolate(x, size=(520, 520), mode="bilinear", align_corners=False),
           coordinate_mode="pytorch_half_pixel"),
    # layout
    one("channel_shuffle", "ShuffleNetV2-1.0 stage 3 (2 groups)", "channel_shuffle",
        [232, 14, 14], lambda x: shuffle(x, 2), groups=2),
    one("channel_shuffle_s2", "ShuffleNetV2-1.0 stage 2 (2 groups)", "channel_shuffle",
        [116, 28, 28], lambda x: shuffle(x, 2), groups=2),
    one("transpose_nhwc", "ConvNeXt-T stage 1, NCHW -> NHWC", "transpose", [96, 56, 56],
        lambda x: x.permute(0, 2, 3, 1).contiguous(), perm=[0, 2, 3, 1]),
    one("slice_focus", "YOLOv5 Focus (x[..., ::2, ::2], 640 input)", "slice", [3, 640, 640],
        lambda x: x[..., ::2, ::2].contiguous(), starts=[0, 0], ends=[640, 640], axes=[2, 3],
        steps=[2, 2]),
    one("slice_channels", "ShuffleNetV2 stage 2, second half of the channels", "slice",
        [232, 28, 28], lambda x: x[:, 116:].contiguous(), starts=[116], ends=[232], axes=[1]),
    Case("split", "ShuffleNetV2 stage 2, chunk(2, dim=1)",
         lambda b: ({"x": [b, 232, 28, 28]}, {},
                    [node("split", ["x"], outputs=["y0", "y1"], axis=1, sizes=[116, 116])]),
         lambda t: [c.contiguous() for c in t["x"].chunk(2, 1)]),
    # pads: the begins of every dim, then the ends (ONNX)
    one("pad_constant", "TF-'same' padding of a stride-2 conv (EfficientNet-B0 block 2)", "pad",
        [96, 112, 112], lambda x: F.pad(x, (0, 1, 0, 1)), pads=[0, 0, 0, 0, 0, 0, 1, 1]),
    one("pad_reflect", "CycleGAN residual block, ReflectionPad2d(1)", "pad", [256, 64, 64],
        lambda x: F.pad(x, (1, 1, 1, 1), mode="reflect"), pads=[0, 0, 1, 1, 0, 0, 1, 1],
        mode="reflect"),
    one("pad_reflect_stem", "CycleGAN stem, ReflectionPad2d(3)", "pad", [3, 256, 256],
        lambda x: F.pad(x, (3, 3, 3, 3), mode="reflect"), pads=[0, 0, 3, 3, 0, 0, 3, 3],
        mode="reflect"),
    Case("concat", "YOLOv5 neck, two maps on channels",
         lambda b: ({"a": [b, 256, 40, 40], "b": [b, 256, 40, 40]}, {},
                    [node("concat", ["a", "b"], axis=1)]),
         lambda t: torch.cat([t["a"], t["b"]], 1)),
    Case("concat_sppf", "YOLOv5 SPPF, four maps on channels",
         lambda b: ({f"x{i}": [b, 256, 20, 20] for i in range(4)}, {},
                    [node("concat", [f"x{i}" for i in range(4)], axis=1)]),
         lambda t: torch.cat([t[f"x{i}"] for i in range(4)], 1)),
    # elementwise binary
    Case("mul_se", "EfficientNet-B0 block 2 excite, [N,C,H,W] * [N,C,1,1]",
         lambda b: binary("mul", [b, 96, 112, 112], [b, 96, 1, 1]),
         lambda t: t["a"] * t["b"]),
    Case("add_residual", "ResNet-50 stage 1 residual, equal shapes",
         lambda b: binary("add", [b, 256, 56, 56], [b, 256, 56, 56]),
         lambda t: t["a"] + t["b"]),
    Case("fused_se_gate", "squeeze-excite gate written as fused_elementwise: x * sigmoid(s)",
         lambda b: ({"s": [b, 96, 1, 1], "x": [b, 96, 112, 112]}, {},
                    [node("fused_elementwise", ["s", "x"], program="sigmoid, mul(x1)")]),
         lambda t: t["x"] * torch.sigmoid(t["s"])),
    # matrix ops
    Case("matmul_qk", "ViT-B/16 attention q @ k^T (batch x 12 heads)",
         lambda b: binary("matmul", [b * 12, 196, 64], [b * 12, 64, 196]),
         lambda t: torch.matmul(t["a"], t["b"])),
    Case("matmul_av", "ViT-B/16 attention p @ v (batch x 12 heads)",
         lambda b: binary("matmul", [b * 12, 196, 196], [b * 12, 196, 64]),
         lambda t: torch.matmul(t["a"], t["b"])),
    Case("conv_transpose2d", "U-Net decoder up, 2x2 stride 2, 256 -> 128",
         lambda b: ({"x": [b, 256, 32, 32]}, {"w": [256, 128, 2, 2], "bias": [128]},
                    [node("conv_transpose2d", ["x", "w", "bias"], stride=[2, 2])]),
         lambda t: F.conv_transpose2d(t["x"], t["w"], t["bias"], stride=2)),
    Case("conv_transpose2d_4x4s2", "DCGAN generator block, 4x4 stride 2 padding 1, 256 -> 128",
         lambda b: ({"x": [b, 256, 16, 16]}, {"w": [256, 128, 4, 4]},
                    [node("conv_transpose2d", ["x", "w"], stride=[2, 2], padding=[1, 1, 1, 1])]),
         lambda t: F.conv_transpose2d(t["x"], t["w"], stride=2, padding=1)),
    Case("conv_transpose2d_3x3s2", "CycleGAN decoder, 3x3 stride 2 padding 1 output_padding 1",
         lambda b: ({"x": [b, 128, 64, 64]}, {"w": [128, 64, 3, 3], "bias": [64]},
                    [node("conv_transpose2d", ["x", "w", "bias"], stride=[2, 2],
                          padding=[1, 1, 1, 1], output_padding=[1, 1])]),
         lambda t: F.conv_transpose2d(t["x"], t["w"], t["bias"], stride=2, padding=1,
                                      output_padding=1)),
    one("pixel_shuffle", "ESPCN / Real-ESRGAN upsampler, x2", "depth_to_space", [256, 64, 64],
        lambda x: F.pixel_shuffle(x, 2), blocksize=[2, 2], mode="CRD"),
    # ops of the table the issue did not list, for reference
    one("relu", "ResNet-50 stem", "relu", [64, 112, 112], lambda x: F.relu(x)),
    one("sigmoid", "YOLOv5 P3 head (640 input)", "sigmoid", [255, 80, 80],
        lambda x: torch.sigmoid(x)),
    one("maxpool2d", "ResNet-50 stem, 3x3 stride 2", "maxpool2d", [64, 112, 112],
        lambda x: F.max_pool2d(x, 3, 2, 1), kernel=[3, 3], stride=[2, 2], padding=[1, 1, 1, 1]),
    one("avgpool2d", "DenseNet-121 transition 1, 2x2 stride 2", "avgpool2d", [128, 56, 56],
        lambda x: F.avg_pool2d(x, 2, 2), kernel=[2, 2], stride=[2, 2]),
    one("reduce_max_c", "CBAM spatial attention (max over C)", "reduce_max", [256, 56, 56],
        lambda x: x.amax(1, keepdim=True), axes=[1], keepdims=1),
    Case("linear", "ResNet-50 classifier, 2048 -> 1000",
         lambda b: ({"x": [b, 2048]}, {"w": [1000, 2048], "bias": [1000]},
                    [node("linear", ["x", "w", "bias"])]),
         lambda t: F.linear(t["x"], t["w"], t["bias"])),
]
CASE_BY_NAME = {c.name: c for c in CASES}

# Ops of real CNNs that the op table (include/epilog/graph/ops.def) has no form for.
NOT_EXPRESSIBLE = [
    "adaptive_avg_pool2d to sizes other than 1 (PSPNet pyramid pooling): no op",
    "bicubic interpolation: resize has nearest and linear only",
]


def model_json(case, batch):
    """The case's epilog model at `batch`, its weights from seeds (--weights replaces them)."""
    inputs, weights, nodes = case.graph(batch)
    return {"format": "epilog", "version": 1,
            "inputs": [{"name": n, "shape": s} for n, s in inputs.items()],
            "outputs": [{"name": o} for o in nodes[-1]["outputs"]],
            "weights": {n: {"shape": s, "init": {"seed": 1}} for n, s in weights.items()},
            "nodes": [dict(name=f"{case.name}.{i}", **n) for i, n in enumerate(nodes)]}


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
    return path


# Arrays go to epilog as float32 little-endian bytes in the two formats its CLI reads, written
# here so that the dry run needs no numpy.

def write_npy(path, shape, data):
    dims = ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "")  # NumPy's spelling
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({dims}), }}"
    header += " " * (-(len(header) + 11) % 64) + "\n"  # magic, version and length: 10 bytes
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data)


def write_safetensors(path, tensors):
    """tensors: {name: (shape, float32 bytes)}."""
    header, at = {}, 0
    for name, (shape, data) in tensors.items():
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [at, at + len(data)]}
        at += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, data in tensors.values():
            f.write(data)


def run_with(a, case, batch, arrays, device, work):
    """`epilog run` of the case at `batch` with these inputs and weights ({name: (shape,
    float32 bytes)}); returns the paths of its outputs' .npy files."""
    inputs, weights, nodes = case.graph(batch)
    model = write_json(os.path.join(work, "check.json"), model_json(case, batch))
    argv = ["run", model, "--device", device, "--output", os.path.join(work, "out")]
    if weights:
        write_safetensors(os.path.join(work, "w.safetensors"), {n: arrays[n] for n in weights})
        argv += ["--weights", os.path.join(work, "w.safetensors")]
    for n in inputs:
        write_npy(os.path.join(work, n + ".npy"), *arrays[n])
        argv += ["--input", f"{n}={os.path.join(work, n + '.npy')}"]
    epilog_cmd(a, case, *argv)
    return [os.path.join(work, "out", zoo.file_safe(o) + ".npy") for o in nodes[-1]["outputs"]]


def random_arrays(case, batch, seed):
    """The dry run's inputs (normal) and weights (uniform in [0.5, 1.5]), from Python's random."""
    inputs, weights, _ = case.graph(batch)
    rng = random.Random(seed)
    out = {}
    for names, draw in ((inputs, lambda: rng.gauss(0, 1)), (weights, lambda: rng.random() + 0.5)):
        for n, s in names.items():
            out[n] = (s, array.array("f", (draw() for _ in range(math.prod(s)))).tobytes())
    return out


# -- epilog's output -------------------------------------------------------------------------

EXPLAIN_ROW = re.compile(r"^(\S+)\s+(\S+)\s+(\[[^\]]*\] -> \[[^\]]*\](?: \+ residual)?)\s+(.*)$")
TWO_WORD_KERNELS = ("in place", "gemm pair", "gemm chain")


def parse_explain(text):
    """`epilog explain` stdout -> [{node, op, io, kernel}] of its node table (in plan order)."""
    rows, table = [], False
    for line in text.splitlines():
        if line.startswith("node ") and " kernel " in line:
            table = True
            continue
        m = EXPLAIN_ROW.match(line) if table else None
        if m:
            rest = m.group(4)
            kernel = next((k for k in TWO_WORD_KERNELS if rest.startswith(k)), None)
            rows.append({"node": m.group(1), "op": m.group(2), "io": m.group(3),
                         "kernel": kernel or rest.split()[0]})
    if not rows:
        head = " | ".join(text.strip().splitlines()[:3])[:200]
        raise ValueError(f"epilog explain: no node table in its output ({head!r})")
    return rows


def kernel_summary(rows, source_ops):
    """What ran, in one cell: each node's kernel ('op: kernel' where they differ, as a conv's),
    and the ops of the source graph where the passes rewrote them."""
    text = " + ".join(r["kernel"] if r["kernel"] == r["op"] else f"{r['op']}: {r['kernel']}"
                      for r in rows)
    if [r["op"] for r in rows] != list(source_ops):
        text += f" (from {' + '.join(source_ops)})"
    return text


class EpilogFailed(Exception):
    """An epilog command failed: the message is epilog's own (the first line of its stderr)."""


def why(e):
    """A step's failure in one line; a harness error names its exception type."""
    return zoo.one_line(str(e) if isinstance(e, EpilogFailed) else e)


def epilog_cmd(a, case, *args):
    argv = [a.epilog, *args]
    if case.no_fuse:
        argv.append("--no-fuse")
    rc, out, err = zoo.run_cmd(argv, a.timeout)
    if rc != 0:
        msg = zoo.command_error(rc, err, a.timeout)
        raise EpilogFailed(msg if msg.startswith("epilog ") else f"epilog {args[0]}: {msg}")
    return out


# -- PyTorch ---------------------------------------------------------------------------------

def import_torch():
    global torch, F
    import torch as t
    import torch.nn.functional as f
    torch, F = t, f


def torch_tensors(case, batch, seed):
    """The case's inputs (normal) and weights (uniform in [0.5, 1.5]: positive variances and
    scales) on the GPU, seeded."""
    inputs, weights, _ = case.graph(batch)
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = {n: torch.randn(s, device="cuda", generator=g) for n, s in inputs.items()}
    t.update({n: torch.rand(s, device="cuda", generator=g) + 0.5 for n, s in weights.items()})
    return t


def as_list(y):
    return list(y) if isinstance(y, (list, tuple)) else [y]


def host_ms(replay, iters):
    """Median of replay + synchronize timed on the host: how epilog bench times its replay."""
    replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def torch_times(case, a):
    t = torch_tensors(case, a.batch, a.seed)
    with torch.no_grad():
        replay = zoo.cuda_graph(lambda: case.fn(t))
        graph_ms = zoo.time_ms(replay, warmup_ms=50, rep_ms=a.rep_ms)
        return graph_ms, host_ms(replay, a.iters)


def check(case, a, work):
    """epilog on the GPU against PyTorch at --check-batch, same weights and inputs: rel err."""
    import numpy as np
    t = torch_tensors(case, a.check_batch, a.seed + 1)
    arrays = {n: (list(v.shape), v.cpu().contiguous().numpy().astype("<f4").tobytes())
              for n, v in t.items()}
    outs = run_with(a, case, a.check_batch, arrays, "cuda", work)
    with torch.no_grad():
        refs = [r.double().cpu().numpy() for r in as_list(case.fn(t))]
    if len(refs) != len(outs):
        raise ValueError(f"{len(outs)} epilog outputs, PyTorch gives {len(refs)}")
    return max(zoo.rel_err(np.load(o), r) for o, r in zip(outs, refs))


# -- one case --------------------------------------------------------------------------------

def shape_cell(case, batch, explained):
    shapes = ["[" + ",".join(map(str, s)) + "]" for s in case.graph(batch)[0].values()]
    same = len(shapes) > 1 and len(set(shapes)) == 1
    text = f"{len(shapes)} x {shapes[0]}" if same else ", ".join(shapes)
    out = explained[-1]["io"].split(" -> ")[1] if explained else None
    outputs = len(case.graph(batch)[2][-1]["outputs"])
    if out and outputs > 1:  # explain shows the first output (split's parts are equal here)
        out = f"{outputs} x {out}"
    return text + (f" -> {out}" if out and out != text else "")


def run_case(case, a, work, gpu):
    """One row. Each step's failure goes into the row; the steps after it that need it skip."""
    row = {"case": case.name, "where": case.where, "no_fuse": case.no_fuse, "error": None}
    errors = {}
    os.makedirs(work, exist_ok=True)
    os.makedirs(os.path.join(a.out, "models"), exist_ok=True)
    path = write_json(os.path.join(a.out, "models", case.name + ".json"), model_json(case, a.batch))
    explained = []
    try:
        text = epilog_cmd(a, case, "explain", path, "--device", "cuda")
        explained = parse_explain(text)
        passes = re.search(r"^passes: (.*)$", text, re.M)
        row["passes"] = passes.group(1) if passes else None
        row["nodes"] = explained
        row["kernel"] = kernel_summary(explained, [n["op"] for n in case.graph(a.batch)[2]])
    except Exception as e:
        errors["explain"] = why(e)
    row["shape"] = shape_cell(case, a.batch, explained)
    if not gpu:  # the dry run: the model at --check-batch once on the CPU
        try:
            run_with(a, case, a.check_batch, random_arrays(case, a.check_batch, a.seed), "cpu",
                     work)
            row["cpu_run"] = "ok"
        except Exception as e:
            errors["cpu_run"] = why(e)
    else:
        if a.check and "explain" not in errors:
            try:
                row["err"] = check(case, a, work)
            except Exception as e:
                errors["check"] = why(e)
        if "explain" not in errors:
            try:
                out = epilog_cmd(a, case, "bench", path, "--device", "cuda", "--iters",
                                 str(a.iters), "--warmup", "10")
                row["epilog_ms"], row["epilog_e2e_ms"] = zoo.parse_bench(out)
            except Exception as e:
                errors["bench"] = why(e)
        try:
            row["torch_graph_ms"], row["torch_host_ms"] = torch_times(case, a)
        except Exception as e:
            errors["torch"] = why(e)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    row["errors"] = errors
    row["error"] = next((f"{step}: {msg}" for step, msg in errors.items()), None)
    return row


# -- the table -------------------------------------------------------------------------------

def ratio(num, den):
    return num / den if num and den else None


def fmt_ms(v):
    # Four decimals below 1 ms: ops of a few microseconds (epilog bench prints three).
    return "-" if v is None else f"{v:.4f}" if v < 1 else f"{v:.3f}"


def fmt_x(v):
    return "-" if v is None else f"{v:.2f}x"


def render_markdown(rows, meta):
    out = ["# Single ops: epilog against PyTorch", "",
           f"Card: {meta.get('card', '-')}. torch {meta.get('torch') or '-'}. "
           f"{meta.get('epilog') or 'epilog -'}. Date: {meta.get('date', '-')}."
           + (" Dry run: models explained for CUDA and run on the CPU, no timings."
              if meta.get("dry_run") else ""), "",
           "Made by `tools/op_bench.py` (its header says how). Times: medians in ms, float32 "
           "with TF32. epilog: CUDA graph replay of the one-op plan, timed on the host. PyTorch "
           "graph: the op captured in a CUDA graph, CUDA events around each replay; host: the "
           "same replay timed on the host, as epilog's is. speedup = PyTorch / epilog. err: "
           f"epilog on the GPU against PyTorch, same inputs and weights (passes at "
           f"{TOLERANCE:g}). kernel: what `epilog explain` lowered the op to.", "",
           "| case | shape | epilog kernel | epilog ms | PyTorch graph ms | speedup "
           "| PyTorch host ms | speedup (host) | err | where | error |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        err = r.get("err")
        err = "-" if err is None else f"{err:.1e}" + ("" if err <= TOLERANCE else " (fail)")
        kernel = (r.get("kernel") or "-") + (" (--no-fuse)" if r.get("no_fuse") else "")
        out.append("| " + " | ".join(zoo.cell(c) for c in [
            r["case"], r.get("shape", "-"), kernel, fmt_ms(r.get("epilog_ms")),
            fmt_ms(r.get("torch_graph_ms")),
            fmt_x(ratio(r.get("torch_graph_ms"), r.get("epilog_ms"))),
            fmt_ms(r.get("torch_host_ms")),
            fmt_x(ratio(r.get("torch_host_ms"), r.get("epilog_ms"))), err, r.get("where", ""),
            r.get("error") or ""]) + " |")
    timed = [r for r in rows if ratio(r.get("torch_graph_ms"), r.get("epilog_ms"))]
    if timed:
        slower = [r["case"] for r in timed if r["torch_graph_ms"] < r["epilog_ms"]]
        ups = [r["torch_graph_ms"] / r["epilog_ms"] for r in timed]
        out += ["", f"{len(timed)} cases timed, geometric-mean speedup "
                f"{zoo.geomean(ups):.2f}x; slower than PyTorch's graph: "
                + (", ".join(slower) if slower else "none") + "."]
    wrong = [r["case"] for r in rows if r.get("err") is not None and r["err"] > TOLERANCE]
    if wrong:
        out += ["", "epilog's output differs from PyTorch's (err above "
                f"{TOLERANCE:g}; their times compare different things): " + ", ".join(wrong) + "."]
    if meta.get("skipped"):
        out += ["", "Not started (--budget spent): " + ", ".join(meta["skipped"]) + "."]
    out += ["", "Not expressible in epilog's op table:", ""] + [f"- {s}" for s in NOT_EXPRESSIBLE]
    return "\n".join(out) + "\n"


def write_outputs(out_dir, rows, meta):
    with open(os.path.join(out_dir, "op_bench.jsonl"), "w") as f:
        f.write(json.dumps(dict(meta, meta=True)) + "\n")
        for r in rows:
            f.write(json.dumps(r) + "\n")
    path = os.path.join(out_dir, "op_bench.md")
    with open(path + ".tmp", "w") as f:
        f.write(render_markdown(rows, meta))
    os.replace(path + ".tmp", path)
    return path


def epilog_version(cli):
    rc, out, _ = zoo.run_cmd([cli, "--version"], 30)
    return out.strip().splitlines()[0] if rc == 0 and out.strip() else None


def main(argv=None):
    p = argparse.ArgumentParser(
        description="Time single ops in epilog and PyTorch on the same GPU, at the shapes where "
        "they occur in real CNNs (see the header of this file).")
    p.add_argument("cases", nargs="*", metavar="CASE", help="cases to run (default: all; --list)")
    p.add_argument("--epilog", default="build/bin/epilog",
                   help="the epilog CLI (default: %(default)s)")
    p.add_argument("--out", help="folder of op_bench.md, op_bench.jsonl and models/ (required)")
    p.add_argument("--iters", type=int, default=100,
                   help="epilog bench --iters, and PyTorch's host-timed replays "
                   "(default: %(default)s)")
    p.add_argument("--rep-ms", type=float, default=300,
                   help="PyTorch's CUDA-event timing: about this many ms of replays "
                   "(default: %(default)s)")
    p.add_argument("--batch", type=int, default=16,
                   help="the batch of the timed cases (default: 16)")
    p.add_argument("--check-batch", type=int, default=1,
                   help="the batch of the correctness check and the dry run's CPU run (default: 1)")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="skip the check of epilog's output against PyTorch's")
    p.add_argument("--budget", type=float,
                   help="start no new case this many seconds after the start")
    p.add_argument("--timeout", type=float, default=120, help="seconds per epilog command "
                   "(default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of PyTorch's tensors (default: 0)")
    p.add_argument("--dry-run", action="store_true", help="no PyTorch, no GPU: write the models, "
                   "explain them for CUDA and run each once on the CPU at --check-batch")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    a = p.parse_args(argv)
    start = time.time()  # --budget counts PyTorch's import and CUDA start-up too

    unknown = [c for c in a.cases if c not in CASE_BY_NAME]
    if unknown:
        p.error(f"unknown case(s) {', '.join(unknown)} (--list shows them)")
    cases = [CASE_BY_NAME[c] for c in a.cases] or CASES
    if a.list:
        for c in cases:
            inputs, _, nodes = c.graph(a.batch)
            shapes = ", ".join(str(s).replace(" ", "") for s in inputs.values())
            print(f"{c.name:<24} {nodes[0]['op']:<18} {shapes:<36} {c.where}")
        print("\nnot expressible:\n  " + "\n  ".join(NOT_EXPRESSIBLE))
        return 0
    if not a.out:
        p.error("--out is required")
    if not os.access(a.epilog, os.X_OK):
        p.error(f"--epilog {a.epilog}: not an executable (build the epilog_cli target first)")
    os.makedirs(a.out, exist_ok=True)

    meta = {"date": datetime.date.today().isoformat(), "epilog": epilog_version(a.epilog),
            "batch": a.batch, "iters": a.iters, "dry_run": a.dry_run, "torch": None}
    gpu = False
    if a.dry_run:
        meta["card"] = "none (dry run)"
    else:
        try:
            import_torch()
        except ImportError as e:
            p.error(f"PyTorch is needed to time ({e}); --dry-run checks the models without it")
        meta["torch"] = torch.__version__
        if not torch.cuda.is_available():
            p.error("no CUDA device for PyTorch (--dry-run checks the models without one)")
        zoo.setup_cuda()  # TF32 and cudnn.benchmark, as the zoo's PyTorch timings
        meta["card"] = torch.cuda.get_device_name()
        gpu = True

    rows = []
    work = tempfile.mkdtemp(prefix="op_bench-")
    log(f"{len(cases)} cases at batch {a.batch} on {meta['card']}; table {a.out}/op_bench.md")
    try:
        for i, case in enumerate(cases):
            if a.budget is not None and time.time() - start > a.budget:
                meta["skipped"] = [c.name for c in cases[i:]]
                break
            t0 = time.time()
            try:
                row = run_case(case, a, os.path.join(work, case.name), gpu)
            except Exception as e:  # a bug of this harness: the row says so, the next case runs
                row = {"case": case.name, "where": case.where,
                       "error": f"harness: {zoo.one_line(e)}"}
            rows.append(row)
            write_outputs(a.out, rows, meta)
            if gpu:
                e, g, h = (row.get(k) for k in ("epilog_ms", "torch_graph_ms", "torch_host_ms"))
                err = row.get("err")
                what = (f"epilog {fmt_ms(e)} ms ({row.get('kernel', '-')}), PyTorch graph "
                        f"{fmt_ms(g)} ms, speedup {fmt_x(ratio(g, e))} (host {fmt_x(ratio(h, e))})"
                        + ("" if err is None else f", err {err:.1e}"))
            else:
                what = f"kernel {row.get('kernel', '-')}, cpu run {row.get('cpu_run', '-')}"
            log(f"{case.name} ({i + 1}/{len(cases)}): {what}"
                + (f"; error: {row['error']}" if row.get("error") else "")
                + f" ({time.time() - t0:.1f} s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    path = write_outputs(a.out, rows, meta)
    failed = sum(1 for r in rows if r.get("error"))
    log(f"done in {time.time() - start:.0f} s: {len(rows)} cases, {failed} with errors; {path}")
    if meta.get("skipped"):
        log(f"--budget {a.budget:g} s spent; not started: {' '.join(meta['skipped'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
