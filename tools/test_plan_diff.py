"""Unit tests of tools/plan_diff.py: the reading of `epilog explain`'s node table, the nodes two
plans differ on, a run against the CLI where it is built, and a zoo name without PyTorch.
Run: python3 tools/test_plan_diff.py"""
import os
import subprocess
import sys
import unittest

sys.dont_write_bytecode = True  # no tools/__pycache__
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import plan_diff  # noqa: E402

HEAD = """target: cuda, NVIDIA H200 (default profile) (132 SMs)
passes: fused 1 linear->conv2d(1x1)
node                     op                input -> output      kernel  tiles       rule
"""
A = HEAD + """fc.to_4d                 reshape           [16,8] -> [16,8,1,1]  view                no kernel
fc                       fused_conv2d      [16,8,1,1] -> [16,4,1,1]  gemm  gather m=128 n=32  r
old                      relu              [16,4] -> [16,4]  relu  one kernel
"""
B = HEAD + """fc.to_4d                 reshape           [16,8] -> [16,8,1,1]  view                no kernel
fc                       fused_conv2d      [16,8,1,1] -> [16,4,1,1]  gemm  gather m=32 n=128  r
new                      relu              [16,4] -> [16,4]  relu  one kernel
"""


class PlanDiff(unittest.TestCase):
    def test_table_only(self):
        lines = plan_diff.plan_lines(A)
        self.assertEqual(list(lines), ["fc.to_4d", "fc", "old"])
        self.assertIn("m=128", lines["fc"])

    def test_changes(self):
        diff = plan_diff.plan_changes(A, B)
        self.assertEqual([n for n, _, _ in diff], ["fc", "new", "old"])
        self.assertIn("m=128", diff[0][1])
        self.assertIn("m=32", diff[0][2])
        self.assertIsNone(diff[1][1])  # only B has it
        self.assertIsNone(diff[2][2])  # only A has it
        self.assertEqual(plan_diff.plan_changes(A, A), [])

    def test_cli(self):
        cli = os.environ.get("EPILOG_CLI", os.path.join(HERE, "..", "build", "bin", "epilog"))
        if not os.access(cli, os.X_OK):
            self.skipTest(f"no CLI at {cli} (set EPILOG_CLI)")
        model = os.path.join(HERE, "..", "models", "resnet_like.json")
        r = subprocess.run([sys.executable, os.path.join(HERE, "plan_diff.py"), "--a", cli,
                            "--b", cli, model, "--batches", "1,16"],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.count("0 node(s) planned differently"), 2, r.stdout)

    def test_all_needs_time(self):
        r = subprocess.run([sys.executable, os.path.join(HERE, "plan_diff.py"), "--a", "x",
                            "--b", "y", "m.json", "--all"], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--all says what --time times", r.stderr)

    def test_zoo_name_without_pytorch(self):
        try:
            import torch
            if hasattr(torch, "nn"):
                self.skipTest("PyTorch is installed: the name would be exported")
        except ImportError:
            pass
        r = subprocess.run([sys.executable, os.path.join(HERE, "plan_diff.py"), "--a", "x",
                            "--b", "y", "no_such_model"], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn("'no_such_model' is not a file, and without PyTorch", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
