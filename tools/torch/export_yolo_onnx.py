# Exports the YOLO-like model of torch_yolo_like.py to ONNX with its input and PyTorch's outputs,
# and compares epilog's outputs on that file with PyTorch's.
#
#   python3 tools/torch/export_yolo_onnx.py OUT [--device cpu|cuda]
#       OUT/yolo_like.onnx (opset 17, input "images" [1,3,640,640], outputs o3, o4, o5),
#       OUT/images.npy, OUT/o3.npy, OUT/o4.npy, OUT/o5.npy (PyTorch float32, TF32 off),
#       OUT/state_dict.safetensors
#   build/bin/epilog run OUT/yolo_like.onnx --input images=OUT/images.npy --output OUT/epilog
#   python3 tools/torch/export_yolo_onnx.py OUT --compare OUT/epilog [--tol 1e-4]
#       max |epilog - torch| / max |torch| per output (epilog's own measure); exits 1 above --tol
#
# The model and its weights are built exactly as torch_yolo_like.py's main does (seeds 1234);
# the input is the first tensor that main draws from the same generator after the batchnorm
# statistics.
import argparse
import inspect
import os
import sys
import types

import numpy as np

OUTPUTS = ("o3", "o4", "o5")


def yolo_module():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import triton.testing  # noqa: F401  (torch_yolo_like imports do_bench for its timings)
    except ImportError:
        # Only the timings need triton; without it, an empty triton.testing module lets the model
        # classes import (on a CPU machine, say).
        triton, testing = types.ModuleType("triton"), types.ModuleType("triton.testing")
        testing.do_bench = None
        triton.testing = testing
        sys.modules["triton"], sys.modules["triton.testing"] = triton, testing
    import torch_yolo_like
    return torch_yolo_like


def export(out_dir, device):
    import torch
    from safetensors.torch import save_file

    ty = yolo_module()
    os.makedirs(out_dir, exist_ok=True)
    g = torch.Generator().manual_seed(1234)
    torch.manual_seed(1234)
    m = ty.YoloLike().eval()
    ty.randomize_bn(m, g)
    x = torch.randn(1, 3, 640, 640, generator=g)

    # The reference in plain float32: no TF32 in cuDNN convolutions or matmuls.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        outs = m.to(device)(x.to(device))
    m = m.cpu()
    np.save(os.path.join(out_dir, "images.npy"), x.numpy())
    for name, o in zip(OUTPUTS, outs):
        np.save(os.path.join(out_dir, f"{name}.npy"), o.float().cpu().numpy())
    save_file(m.state_dict(), os.path.join(out_dir, "state_dict.safetensors"))

    # TorchScript export: eval-mode Conv+BatchNorm fold into one Conv with bias, SiLU becomes
    # Sigmoid * Mul, chunk a Split, nn.Upsample a Resize (nearest, asymmetric, floor).
    kwargs = {}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kwargs["dynamo"] = False
    path = os.path.join(out_dir, "yolo_like.onnx")
    with torch.no_grad():
        torch.onnx.export(m, (x,), path, opset_version=17, input_names=["images"],
                          output_names=list(OUTPUTS), do_constant_folding=True, **kwargs)
    print(f"wrote {path}, images.npy, {', '.join(n + '.npy' for n in OUTPUTS)} and "
          f"state_dict.safetensors to {out_dir} (outputs computed on {device})")


def compare(ref_dir, got_dir, tol):
    worst = 0.0
    for name in OUTPUTS:
        ref = np.load(os.path.join(ref_dir, f"{name}.npy")).astype(np.float64)
        got = np.load(os.path.join(got_dir, f"{name}.npy")).astype(np.float64)
        if ref.shape != got.shape:
            print(f"{name}: shape {got.shape}, expected {ref.shape}")
            worst = np.inf
            continue
        diff = np.abs(got - ref).max()
        rel = diff / max(np.abs(ref).max(), 1e-30)
        worst = max(worst, rel if np.isfinite(rel) else np.inf)
        print(f"{name}: shape {ref.shape}, max relative error {rel:.3e} (max abs {diff:.3e})")
    ok = worst <= tol
    print(f"{'OK' if ok else 'FAIL'}: worst {worst:.3e}, tolerance {tol:g}")
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description="Export the YOLO-like model to ONNX, or compare "
                                "epilog's outputs with PyTorch's.")
    p.add_argument("out", help="folder for the ONNX file, the input and PyTorch's outputs")
    p.add_argument("--device", default=None, help="where PyTorch computes the reference "
                   "outputs (default: cuda when available, else cpu)")
    p.add_argument("--compare", metavar="DIR", help="compare epilog's DIR/o3.npy ... with OUT's")
    p.add_argument("--tol", type=float, default=1e-4, help="max relative error for --compare")
    a = p.parse_args()
    if a.compare:
        sys.exit(compare(a.out, a.compare, a.tol))
    import torch
    export(a.out, a.device or ("cuda" if torch.cuda.is_available() else "cpu"))


if __name__ == "__main__":
    main()
