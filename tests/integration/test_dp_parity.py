"""Parity of data parallelism with one process (real processes through `trireme train`).

With the same seed, 2 and 4 ranks each given their shard of the global batch must give,
after 3 optimizer steps, the parameters and per-step losses of one process on the whole
batch: max abs diff <= 1e-5 (printed). Also with no_sync gradient accumulation
(--micro-batches 2), and the trace must show a bucket's all-reduce starting before
backward ends (overlap)."""
import json
import os
import shutil
import subprocess
import unittest

from common import TRIREME, assert_ran, free_port, main, max_abs, max_abs_diff, metrics, read_params, run, stop, temp_dir

# About 180 KB of gradients in 10 KB buckets: many buckets, launched during backward.
MODEL = ["--layers", "2", "--dim", "32", "--heads", "2", "--seq", "32", "--batch", "8",
         "--steps", "3", "--lr", "1e-2", "--quiet", "--bucket-mb", "0.01",
         "--first-bucket-mb", "0.005"]
TOLERANCE = 1e-5


class DataParallelParity(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = temp_dir()
        cls.reference = cls.train(1, 1)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def train(cls, nproc, micro, extra=()):
        out = os.path.join(cls.dir, f"n{nproc}-m{micro}" + "".join(extra).replace("-", "_"))
        shutil.rmtree(out, ignore_errors=True)  # (run again by each test: trireme train keeps an earlier run)
        dump = out + ".params"
        run(["train", "gpt", "--nproc-per-node", str(nproc), "--micro-batches", str(micro),
             "--out", out, "--dump-params", dump] + MODEL + list(extra))
        return read_params(dump), [m["loss"] for m in metrics(out)], out

    def check(self, nproc, micro, extra=()):
        ref_params, ref_losses, _ = self.reference
        params, losses, out = self.train(nproc, micro, extra)
        param_diff = max_abs_diff(ref_params, params)
        loss_diff = max_abs(ref_losses, losses)
        print(f"dp={nproc} micro-batches={micro} {' '.join(extra)}: max abs diff params {param_diff:.3g}, "
              f"losses {loss_diff:.3g} (3 steps, vs one process)")
        self.assertEqual(len(losses), 3)
        assert_ran(self, out, nproc, ["--dp", str(nproc), "--micro-batches", str(micro)] + list(extra))
        if nproc > 1:
            self.assertGreaterEqual(min(m["buckets"] for m in metrics(out)), 8)
        self.assertLessEqual(param_diff, TOLERANCE)
        self.assertLessEqual(loss_diff, TOLERANCE)
        # Training actually moved the parameters (the comparison is not vacuous).
        init_params, _, _ = self.train(1, 1, ["--steps", "1", "--lr", "1e-9", "--min-lr", "0"])
        self.assertGreater(max_abs_diff(init_params, params), 1e-3)

    def test_dp2(self):
        self.check(2, 1)

    def test_dp4(self):
        self.check(4, 1)

    def test_dp2_no_sync_accumulation(self):
        self.check(2, 2)

    def test_dp4_no_sync_accumulation(self):
        self.check(4, 2)

    def test_dp2_unequal_replica_batches(self):
        """Replica 0 takes 6 of the 8 sequences, replica 1 takes 2 (as a slower device
        would): each weights its mean loss by dp x its share, so the averaged gradients
        are still the global batch's."""
        self.check(2, 1, ["--replica-batches", "6,2"])

    def test_dp2_unequal_replica_batches_accumulation_zero2(self):
        self.check(2, 2, ["--replica-batches", "2,6", "--zero", "2"])

    def test_dp4_across_two_agents(self):
        """Two `trireme train` agents (emulated machines) with the same --rdzv form one
        job of 4 data-parallel ranks."""
        port = free_port()
        out = os.path.join(self.dir, "two-agents")
        dump = out + ".params"
        env = dict(os.environ, OMP_NUM_THREADS="1")
        agents = [subprocess.Popen(
            [TRIREME, "train", "gpt", "--nproc-per-node", "2", "--nnodes", "2",
             "--node-rank", str(node), "--rdzv", f"127.0.0.1:{port}", "--out", out,
             "--dump-params", dump] + MODEL, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True) for node in (0, 1)]
        for agent in agents:
            self.addCleanup(stop, agent)  # a failed assertion below must not leave the other running
        for agent in agents:
            _, err = agent.communicate(timeout=300)
            self.assertEqual(agent.returncode, 0, err)
        ref_params, ref_losses, _ = self.reference
        losses = [m["loss"] for m in metrics(out)]
        param_diff = max_abs_diff(ref_params, read_params(dump))
        loss_diff = max_abs(ref_losses, losses)
        print(f"dp=4 over 2 agents x 2 ranks: max abs diff params {param_diff:.3g}, "
              f"losses {loss_diff:.3g}")
        self.assertEqual(len(losses), 3)
        assert_ran(self, out, 4, ["--dp", "4"])
        self.assertLessEqual(param_diff, TOLERANCE)
        self.assertLessEqual(loss_diff, TOLERANCE)

    def test_trace_shows_allreduce_overlapping_backward(self):
        out = os.path.join(self.dir, "overlap")
        # ~20 buckets: 4 layers of dim 64 with 64 KiB buckets.
        run(["train", "gpt", "--nproc-per-node", "2", "--layers", "4", "--dim", "64",
             "--heads", "2", "--seq", "64", "--batch", "8", "--steps", "4", "--quiet",
             "--bucket-mb", "0.0625", "--first-bucket-mb", "0.03", "--out", out])
        with open(os.path.join(out, "trace.json")) as f:
            events = json.load(f)["traceEvents"]
        overlapped = 0
        for rank in (0, 1):
            backward = [e for e in events if e.get("pid") == rank and e.get("name") == "backward"]
            comm = [e for e in events if e.get("pid") == rank and e.get("cat") == "comm"]
            self.assertTrue(backward and comm, f"rank {rank}: no backward or comm events")
            buckets_per_step = len(comm) // len(backward)
            self.assertGreaterEqual(buckets_per_step, 4)
            for e in comm:
                step_backward = [b for b in backward if b["ts"] <= e["ts"] <= b["ts"] + b["dur"]]
                overlapped += bool(step_backward)
        print(f"all-reduces launched while backward was running: {overlapped}")
        with open(os.path.join(out, "timeline.svg")) as f:
            svg = f.read()
        self.assertIn("rank 1 comm", svg)
        self.assertGreaterEqual(svg.count("<title>allreduce"), len([e for e in events if e.get("cat") == "comm"]))
        self.assertGreaterEqual(overlapped, 1)
        self.assertTrue(all(m["buckets_overlapped"] >= 1 for m in metrics(out)[1:]))


if __name__ == "__main__":
    main()
