"""Tensor parallelism, alone and composed with data and pipeline parallelism, against one
process, through `trireme train gpt` (real processes over Gloo): TP=2, TP=2 x PP=2 (under
1F1B, GPipe, ZB-H1 and interleaved 1F1B), DP=2 x TP=2 and DP=2 x TP=2 x PP=2 (8
processes) give the per-step losses and, after 3 AdamW steps with gradient clipping, the
parameters of one process on the whole batch (max abs diff <= 1e-5, printed). The
tensor-parallel shards are gathered into whole-model tensors for the comparison, so this
also checks that a TP=t model is the TP=1 model slice for slice."""
import json
import os
import unittest

from common import main, max_abs, max_abs_diff, metrics, read_params, run, temp_dir

# 2 heads and a 256-byte vocabulary split 2 ways; clipping on, so that the gradient norm
# over shards and replicas is exercised (a wrong norm changes every parameter).
MODEL = ["--layers", "2", "--dim", "32", "--heads", "2", "--seq", "16", "--batch", "8",
         "--steps", "3", "--lr", "3e-3", "--warmup", "0", "--quiet", "--clip", "0.05",
         "--bucket-mb", "0.02", "--first-bucket-mb", "0.01"]
TOLERANCE = 1e-5


def train(out, dp=1, tp=1, pp=1, extra=()):
    dump = out + ".params"
    run(["train", "gpt", "--nproc-per-node", str(dp * tp * pp), "--dp", str(dp), "--tp", str(tp),
         "--pp", str(pp), "--out", out, "--dump-params", dump] + MODEL + list(extra), timeout=300)
    return read_params(dump), [m["loss"] for m in metrics(out)], metrics(out)


def ran_layout(out):
    """run.json's layout of the run in out: its mesh, dp, tp, pp and ranks."""
    with open(os.path.join(out, "run.json")) as f:
        return json.load(f)


class TensorParallelParity(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = temp_dir()
        cls.reference = train(os.path.join(cls.dir, "ref"))

    def check(self, dp, tp, pp, extra=()):
        name = f"dp{dp}-tp{tp}-pp{pp}" + ("-" + "-".join(extra).replace("--", "") if extra else "")
        out = os.path.join(self.dir, name)
        params, losses, steps = train(out, dp, tp, pp, extra)
        # The run really had this layout (a tp flag ignored would compare one process with
        # itself): run.json's sizes, mesh and ranks.
        ran = ran_layout(out)
        self.assertEqual((ran["dp"], ran["tp"], ran["pp"]), (dp, tp, pp), ran)
        self.assertIn(f"tp={tp}", ran["mesh"])
        self.assertEqual(len(ran["ranks"]), dp * tp * pp, ran)
        for flag, field in (("--schedule", "schedule"), ("--chunks", "chunks"), ("--micro-batches", "micro_batches")):
            if flag in extra:  # and the pipeline schedule asked for
                self.assertEqual(str(ran[field]), extra[list(extra).index(flag) + 1], ran)
        ref_params, ref_losses, ref_steps = self.reference
        self.assertEqual(sorted(params), sorted(ref_params))  # every tensor, whole-model shapes
        param_diff = max_abs_diff(ref_params, params)
        loss_diff = max_abs(ref_losses, losses)
        norm_diff = max_abs([m["grad_norm"] for m in ref_steps], [m["grad_norm"] for m in steps])
        print(f"{name}: max abs diff params {param_diff:.3g}, losses {loss_diff:.3g}, "
              f"gradient norms {norm_diff:.3g} (3 steps, vs one process)")
        self.assertEqual(len(losses), 3)
        self.assertLess(losses[-1], losses[0] - 0.05)  # it trained: the comparison is not vacuous
        self.assertLessEqual(param_diff, TOLERANCE)
        self.assertLessEqual(loss_diff, TOLERANCE)
        self.assertLessEqual(norm_diff, TOLERANCE)

    def test_tp2(self):
        self.check(1, 2, 1)

    def test_tp2_micro_batches(self):
        self.check(1, 2, 1, ["--micro-batches", "2"])

    def test_dp2_tp2(self):
        self.check(2, 2, 1)

    def test_dp2_tp2_data_parallel_innermost(self):
        # The other mesh order: data-parallel neighbours are adjacent ranks.
        self.check(2, 2, 1, ["--mesh-order", "dp-tp-pp"])

    def test_tp2_pp2(self):
        self.check(1, 2, 2, ["--schedule", "1f1b", "--micro-batches", "4"])

    def test_tp2_pp2_gpipe(self):
        self.check(1, 2, 2, ["--schedule", "gpipe", "--micro-batches", "4"])

    def test_tp2_pp2_zero_bubble(self):
        # ZB-H1's deferred weight gradients (W instructions) of tensor-parallel linears.
        self.check(1, 2, 2, ["--schedule", "zb-h1", "--micro-batches", "4"])

    def test_tp2_pp2_interleaved(self):
        # 2 chunks per stage: 4 virtual stages, one layer each (embeddings, 2 blocks, head).
        self.check(1, 2, 2, ["--schedule", "interleaved", "--chunks", "2", "--micro-batches", "4"])

    def test_dp2_tp2_pp2(self):
        self.check(2, 2, 2, ["--schedule", "1f1b", "--micro-batches", "2"])


if __name__ == "__main__":
    main()
