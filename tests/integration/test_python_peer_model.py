"""The benchmark's Python peer (bench/py/gpt.py) is the same model as Trireme's C++ GPT:
same parameter names and shapes, and for the same seed the same initial values. The C++
side is dumped by `trireme train gpt --dump-params` after one step at a negligible
learning rate; the difference must stay at that step's size."""
import os
import sys
import unittest

from common import SOURCE, main, max_abs_diff, read_params, run, temp_dir

try:
    import torch
except ImportError:  # the suite runs with the project's venv python, which has torch
    torch = None

sys.path.insert(0, os.path.join(SOURCE, "bench", "py"))


@unittest.skipIf(torch is None, "needs the project's Python torch (scripts/install-deps)")
class PythonPeerModel(unittest.TestCase):
    def test_same_parameters_for_the_same_seed(self):
        import gpt  # bench/py/gpt.py

        cfg = gpt.GptConfig(vocab=256, seq_len=32, layers=2, dim=32, heads=2)
        out = temp_dir()
        dump = os.path.join(out, "init.params")
        run(["train", "gpt", "--nproc-per-node", "1", "--layers", "2", "--dim", "32",
             "--heads", "2", "--seq", "32", "--batch", "2", "--steps", "1", "--lr", "1e-12",
             "--min-lr", "0", "--seed", "42", "--quiet", "--out", out, "--dump-params", dump])
        cpp = read_params(dump)
        py = {k: v.flatten().tolist() for k, v in gpt.Gpt(cfg, seed=42).state_dict().items()}
        self.assertEqual(sorted(cpp), sorted(py))
        worst = max_abs_diff(cpp, py)  # (inf when a difference is NaN)
        print(f"{len(cpp)} tensors, {sum(len(v) for v in cpp.values())} values: "
              f"max abs diff C++ vs Python init {worst:.3g}")
        self.assertLessEqual(worst, 1e-6)


if __name__ == "__main__":
    main()
