"""Unit tests of tools/op_bench.py without PyTorch: the cases' models, the parsing of `epilog
explain`, the .npy and safetensors writers (read back by the CLI where it is built), the table
and the command line. Run: python3 tools/test_op_bench.py"""
import array
import json
import os
import struct
import subprocess
import sys
import tempfile
import types
import unittest

sys.dont_write_bytecode = True  # no tools/__pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import op_bench  # noqa: E402

CLI = os.environ.get("EPILOG_CLI", "build/bin/epilog")

# What `epilog explain --device cuda` prints for the linear case (tools/epilog.cpp, explain()).
EXPLAIN_LINEAR = """\
target: cuda, NVIDIA H200 (default profile) (132 SMs)
passes: fused 1 conv2d, fused 1 linear->conv2d(1x1), removed 0 dead nodes
memory: weights 7.8 MiB, activations 0.0 MiB at peak (0.0 MiB unshared), inputs and outputs 0.2 MiB, workspace 0.0 MiB
node                     op                input -> output                                kernel            tiles                                  rule
linear.0.to_4d           reshape           [16,2048] -> [16,2048,1,1]                     reshape                                                  one kernel
linear.0                 fused_conv2d      [16,2048,1,1] -> [16,1000,1,1]                 gemm              m=128 n=64 k=32 stages=3 splits=8      reduction 2048 >= 16: gemm
linear.0.to_nd           reshape           [16,1000,1,1] -> [16,1000]                     reshape                                                  one kernel
"""


def read_npy(path):
    """(shape, floats) of a float32 .npy file as epilog writes it."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<H", data[8:10])[0]
    header = data[10:10 + n].decode()
    shape = tuple(int(d) for d in header.split("(")[1].split(")")[0].split(",") if d.strip())
    return shape, array.array("f", data[10 + n:]).tolist()


def args(out, **kw):
    a = dict(epilog=CLI, out=out, timeout=60, check_batch=1, seed=0, batch=16)
    a.update(kw)
    return types.SimpleNamespace(**a)


class Cases(unittest.TestCase):
    def test_models_are_well_formed(self):
        names = set()
        for case in op_bench.CASES:
            self.assertNotIn(case.name, names)
            names.add(case.name)
            for batch in (16, 1):
                m = op_bench.model_json(case, batch)
                self.assertEqual((m["format"], m["version"]), ("epilog", 1))
                defined = {i["name"] for i in m["inputs"]} | set(m["weights"])
                for n in m["nodes"]:
                    self.assertTrue(set(n["inputs"]) <= defined, (case.name, n))
                    defined |= set(n["outputs"])
                self.assertTrue({o["name"] for o in m["outputs"]} <= defined)
        self.assertIn("layer_norm_cf_s4_b1", names)

    def test_import_needs_no_torch(self):
        self.assertNotIn("torch", sys.modules)
        self.assertIsNone(op_bench.torch)


class Explain(unittest.TestCase):
    def test_parse(self):
        rows = op_bench.parse_explain(EXPLAIN_LINEAR)
        self.assertEqual([r["kernel"] for r in rows], ["reshape", "gemm", "reshape"])
        self.assertEqual(rows[1]["io"], "[16,2048,1,1] -> [16,1000,1,1]")
        self.assertEqual(op_bench.kernel_summary(rows, ["linear"]),
                         "reshape + fused_conv2d: gemm + reshape (from linear)")

    def test_two_word_kernel_and_same_op(self):
        text = ("node  op  input -> output  kernel  tiles  rule\n"
                "c.0 concat            [1,2] -> [1,4]   in place     no copy: its inputs ...\n")
        rows = op_bench.parse_explain(text)
        self.assertEqual(rows[0]["kernel"], "in place")
        self.assertEqual(op_bench.kernel_summary(
            [{"op": "gelu", "kernel": "gelu"}], ["gelu"]), "gelu")

    def test_no_table_fails(self):
        with self.assertRaisesRegex(ValueError, "no node table"):
            op_bench.parse_explain("target: cuda\n")


class Table(unittest.TestCase):
    META = {"card": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "epilog": "epilog 0.1.0",
            "date": "2026-12-06"}
    ROWS = [
        {"case": "gelu", "shape": "[16,384,56,56]", "kernel": "gelu", "epilog_ms": 0.25,
         "torch_graph_ms": 0.3, "torch_host_ms": 0.31, "err": 2e-7, "where": "ConvNeXt"},
        {"case": "softmax", "shape": "[16,12,196,196]", "kernel": "softmax", "epilog_ms": 0.2,
         "torch_graph_ms": 0.1, "err": 5e-3, "where": "ViT"},
        {"case": "pad", "shape": "[1]", "where": "x", "error": "explain: bad|thing"},
    ]

    def test_markdown(self):
        md = op_bench.render_markdown(self.ROWS, dict(self.META, skipped=["linear"]))
        self.assertIn("Card: NVIDIA H100 80GB HBM3. torch 2.11.0. epilog 0.1.0.", md)
        self.assertIn("| gelu | [16,384,56,56] | gelu | 0.2500 | 0.3000 | 1.20x | 0.3100 | 1.24x "
                      "| 2.0e-07 | ConvNeXt |  |", md)
        self.assertIn("| 0.2000 | 0.1000 | 0.50x | - | - | 5.0e-03 (fail) |", md)
        self.assertIn("explain: bad\\|thing |", md)
        self.assertIn("2 cases timed, geometric-mean speedup 0.77x; slower than PyTorch's "
                      "graph: softmax.", md)
        self.assertIn("differs from PyTorch's (err above 0.001; their times compare different "
                      "things): softmax.", md)
        self.assertIn("Not started (--budget spent): linear.", md)
        self.assertIn("- adaptive_avg_pool2d", md)

    def test_formats(self):
        self.assertEqual(op_bench.fmt_ms(0.0031), "0.0031")
        self.assertEqual(op_bench.fmt_ms(12.3456), "12.346")
        self.assertIsNone(op_bench.ratio(1.0, None))


class Files(unittest.TestCase):
    def test_npy_header_is_aligned(self):
        with tempfile.TemporaryDirectory() as d:
            for shape in ([3], [1, 96, 112, 112]):
                path = os.path.join(d, "x.npy")
                op_bench.write_npy(path, shape, b"\0" * 4 * (1 if len(shape) == 1 else 0))
                with open(path, "rb") as f:
                    data = f.read()
                n = struct.unpack("<H", data[8:10])[0]
                self.assertEqual((10 + n) % 64, 0)
                self.assertTrue(data[10:10 + n].endswith(b"\n"))
                self.assertIn(b"'shape': (3,)" if len(shape) == 1 else b"(1, 96, 112, 112)",
                              data)

    def test_safetensors_layout(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "w.safetensors")
            op_bench.write_safetensors(path, {"a": ([2], b"\1" * 8), "b": ([1], b"\2" * 4)})
            with open(path, "rb") as f:
                data = f.read()
            n = struct.unpack("<Q", data[:8])[0]
            self.assertEqual(n % 8, 0)
            header = json.loads(data[8:8 + n])
            self.assertEqual(header["b"], {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]})
            self.assertEqual(data[8 + n:], b"\1" * 8 + b"\2" * 4)


@unittest.skipUnless(os.access(CLI, os.X_OK), f"no {CLI} (set EPILOG_CLI)")
class WithCli(unittest.TestCase):
    def test_inputs_and_weights_reach_epilog(self):
        # batchnorm at batch 1 with known values: epilog's output is what Python computes.
        case = op_bench.CASE_BY_NAME["batchnorm"]
        arrays = op_bench.random_arrays(case, 1, seed=3)
        floats = {n: array.array("f", b).tolist() for n, (_, b) in arrays.items()}
        with tempfile.TemporaryDirectory() as d:
            outs = op_bench.run_with(args(d), case, 1, arrays, "cpu", d)
            shape, got = read_npy(outs[0])
        self.assertEqual(shape, (1, 256, 56, 56))
        x, w, b, m, v = (floats[n] for n in ("x", "w", "b", "m", "v"))
        hw = 56 * 56
        for i in (0, 1, hw * 7 + 5, len(x) - 1):
            c = i // hw
            want = (x[i] - m[c]) / (v[c] + 1e-5) ** 0.5 * w[c] + b[c]
            self.assertAlmostEqual(got[i], want, places=4)

    def test_dry_run(self):
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.run([sys.executable, op_bench.__file__, "--dry-run", "--epilog", CLI,
                                "--out", d, "reduce_mean_hw", "channel_shuffle"],
                               capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("reduce_mean_hw (1/2): kernel global_avgpool (from reduce_mean)",
                          p.stderr)
            with open(os.path.join(d, "op_bench.jsonl")) as f:
                rows = [json.loads(line) for line in f]
            self.assertTrue(rows[0]["meta"])
            self.assertEqual([(r["case"], r["cpu_run"], r["error"]) for r in rows[1:]],
                             [("reduce_mean_hw", "ok", None), ("channel_shuffle", "ok", None)])
            self.assertTrue(os.path.exists(os.path.join(d, "models", "channel_shuffle.json")))
            with open(os.path.join(d, "op_bench.md")) as f:
                self.assertIn("| channel_shuffle | [16,232,14,14] | channel_shuffle |", f.read())

    def test_a_failing_case_is_a_row(self):
        with tempfile.TemporaryDirectory() as d:
            bad = op_bench.Case("bad", "nowhere", lambda b: op_bench.unary("no_such_op", [b, 4]),
                                None)
            row = op_bench.run_case(bad, args(d), os.path.join(d, "work"), gpu=False)
        self.assertRegex(row["error"], r"^explain: epilog explain: .*no_such_op")
        self.assertIn("cpu_run", row["errors"])


class CommandLine(unittest.TestCase):
    def run_tool(self, *argv):
        return subprocess.run([sys.executable, op_bench.__file__, *argv], capture_output=True,
                              text=True)

    def test_help_and_list_need_no_torch(self):
        p = self.run_tool("--help")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("--dry-run", p.stdout)
        p = self.run_tool("--list", "gelu", "matmul_qk")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stdout, r"gelu +gelu +\[16,384,56,56\]")
        self.assertRegex(p.stdout, r"matmul_qk +matmul +\[192,196,64\], \[192,64,196\]")

    def test_unknown_case(self):
        p = self.run_tool("--list", "nope")
        self.assertEqual(p.returncode, 2)
        self.assertIn("unknown case(s) nope", p.stderr)

    def test_budget_spent(self):
        if not os.access(CLI, os.X_OK):
            self.skipTest(f"no {CLI}")
        with tempfile.TemporaryDirectory() as d:
            p = self.run_tool("--dry-run", "--epilog", CLI, "--out", d, "--budget", "-1", "gelu")
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("not started: gelu", p.stderr)
            with open(os.path.join(d, "op_bench.md")) as f:
                self.assertIn("Not started (--budget spent): gelu.", f.read())


if __name__ == "__main__":
    unittest.main()
