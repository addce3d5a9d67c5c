"""Unit tests of tools/zoo.py's parts that need no PyTorch: the parsing of `epilog bench`, the
command runner's errors and timeouts, and the table. Run: python3 tools/test_zoo.py"""
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

sys.dont_write_bytecode = True  # no tools/__pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo  # noqa: E402

# What cmd_bench in tools/epilog.cpp prints on a GPU (on the CPU it has no graph replay line).
BENCH_GPU = """\
m.onnx on cuda, 53 convs fused (53 batchnorms folded)
end to end: median 1.204 ms, min 1.150 ms, max 2.310 ms over 200 iterations
graph replay: median 0.412 ms, min 0.398 ms, max 0.533 ms
per node (median of 5 profiled runs, sum 0.900 ms):
  conv1                        fused_conv2d     gemm         0.100 ms  11.1%
"""


def row(model, exporter="legacy", batch=1, **kw):
    r = dict(model=model, exporter=exporter, batch=batch, card="NVIDIA H100", date="2026-12-06",
             torch="2.11.0", commit="abc1234", loads=True, error=None, errors={})
    r.update(kw)
    return r


class BenchParse(unittest.TestCase):
    def test_gpu_output(self):
        self.assertEqual(zoo.parse_bench(BENCH_GPU), (0.412, 1.204))

    def test_no_replay_line_fails(self):
        text = BENCH_GPU.replace("graph replay", "graph rerun")
        with self.assertRaisesRegex(ValueError, "no 'graph replay: median ... ms' line"):
            zoo.parse_bench(text)

    def test_changed_format_fails(self):
        with self.assertRaisesRegex(ValueError, "no 'end to end: median"):
            zoo.parse_bench(BENCH_GPU.replace(" ms, min 1.150", " us, min 1.150"))
        with self.assertRaises(ValueError):
            zoo.parse_bench("")

    def test_real_cli(self):
        # On a machine with the CLI built: its bench output on the CPU has no replay line, and
        # its end-to-end line is the format parsed above.
        cli = os.environ.get("EPILOG_CLI", "build/bin/epilog")
        model = os.path.join(os.path.dirname(__file__), "..", "models", "demo_conv_bn_silu.json")
        if not os.access(cli, os.X_OK):
            self.skipTest(f"no {cli}")
        rc, out, err = zoo.run_cmd([cli, "bench", model, "--device", "cpu", "--iters", "3"], 120)
        self.assertEqual(rc, 0, err)
        self.assertRegex(out, zoo.BENCH_E2E)
        with self.assertRaisesRegex(ValueError, "graph replay"):
            zoo.parse_bench(out)
        rc, _, err = zoo.run_cmd([cli, "run", "no/such/model.onnx", "--device", "cpu"], 120)
        self.assertEqual(rc, 1)
        self.assertTrue(zoo.command_error(rc, err, 120).startswith("epilog run: "), err)


class Commands(unittest.TestCase):
    def test_first_stderr_line(self):
        rc, _, err = zoo.run_cmd([sys.executable, "-c", "import sys; sys.stderr.write("
                                  "'\\nepilog run: op \\'Foo\\' is not supported\\nmore\\n'); "
                                  "sys.exit(1)"], 30)
        self.assertEqual(zoo.command_error(rc, err, 30), "epilog run: op 'Foo' is not supported")
        self.assertEqual(zoo.command_error(3, "", 30), "exit code 3, nothing on stderr")

    def test_timeout_kills_the_group(self):
        t0 = time.time()
        # A child that starts a grandchild holding the pipes: both must go.
        rc, _, _ = zoo.run_cmd(["sh", "-c", "sleep 30 & sleep 30"], 1)
        self.assertIsNone(rc)
        self.assertLess(time.time() - t0, 10)
        self.assertEqual(zoo.command_error(rc, "", 1), "timed out after 1 s")

    def test_file_safe(self):
        self.assertEqual(zoo.file_safe("a/b:c\\d"), "a_b_c_d")

    def test_one_line(self):
        self.assertEqual(zoo.one_line(RuntimeError("\n  first\nsecond")), "RuntimeError: first")
        self.assertEqual(zoo.one_line(ValueError("shape [1]")), "shape [1]")


class Table(unittest.TestCase):
    ROWS = [
        row("resnet18", err_cpu=2e-7, err_gpu=4e-4, epilog_ms=0.25, eager_ms=1.3, graph_ms=0.5,
            compile_ms=0.3, fp16_ms=0.35),
        row("resnet18", batch=16, err_cpu=3e-5, err_gpu=2e-3, epilog_ms=1.0, graph_ms=1.2,
            errors={"compile": "timed out after 240 s"}),
        row("convnext_tiny", "dynamo", loads=False, error="epilog run: op 'Foo|Bar' unsupported",
            errors={"cpu": "epilog run: op 'Foo|Bar' unsupported"}),
        row("timm:cspdarknet53", "dynamo", loads=None, error="export (dynamo): Boom"),
    ]

    def test_markdown(self):
        md = zoo.render_markdown(self.ROWS)
        self.assertIn("Card: NVIDIA H100. Date: 2026-12-06. torch 2.11.0", md)
        self.assertIn("| resnet18 | legacy | 1 | yes | 2.0e-07 | 4.0e-04 | 0.250 | 1.300 | 0.500 "
                      "| 0.300 | 0.350 | 2.00x | 1.20x |  |", md)
        self.assertIn("| 3.0e-05 (fail) | 2.0e-03 (fail) | 1.000 | - | 1.200 | - | - | 1.20x | - |", md)
        self.assertIn("| convnext_tiny | dynamo | 1 | no | - | - |", md)
        self.assertIn("op 'Foo\\|Bar' unsupported |", md)
        self.assertIn("- resnet18, batch 16: PyTorch compile: timed out after 240 s", md)
        # Summary: legacy batch 1 has one row passing both, speedups 2.00x and 1.20x.
        self.assertIn("| legacy | 1 | 1 | 1 | 1 | 1 | 2.00x, 1 | 1.20x, 1 |", md)
        self.assertIn("| dynamo | 1 | 2 | 0 | 0 | 0 | - | - |", md)

    def test_later_rows_replace_earlier(self):
        rows = self.ROWS + [row("resnet18", err_cpu=1e-7, epilog_ms=0.2, graph_ms=0.5)]
        md = zoo.render_markdown(rows)
        self.assertEqual(md.count("| resnet18 | legacy | 1 |"), 1)
        self.assertIn("| resnet18 | legacy | 1 | yes | 1.0e-07 |", md)

    def test_from_jsonl(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "a.jsonl"), "w") as f:
                for r in self.ROWS[:2]:
                    f.write(json.dumps(r) + "\n")
            with open(os.path.join(d, "b.jsonl"), "w") as f:
                f.write(json.dumps(self.ROWS[2]) + "\n\n")
            out = os.path.join(d, "out")
            p = subprocess.run([sys.executable, zoo.__file__, "--from-jsonl",
                                os.path.join(d, "a.jsonl"), os.path.join(d, "b.jsonl"),
                                "--out", out], capture_output=True, text=True)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(os.path.join(out, "zoo.md")) as f:
                self.assertEqual(f.read(), zoo.render_markdown(self.ROWS[:3]))
            with open(os.path.join(d, "a.jsonl"), "a") as f:
                f.write("{not json\n")
            p = subprocess.run([sys.executable, zoo.__file__, "--from-jsonl",
                                os.path.join(d, "a.jsonl"), "--out", out],
                               capture_output=True, text=True)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("a.jsonl:3: not JSON", p.stderr)

    def test_help_needs_no_torch(self):
        p = subprocess.run([sys.executable, zoo.__file__, "--help"], capture_output=True,
                           text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("--from-jsonl", p.stdout)


if __name__ == "__main__":
    unittest.main()
