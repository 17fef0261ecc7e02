"""What the ranks of one run must agree on, and `trireme train` checks.

The data-parallel replicas of every layout end bit-for-bit equal: --dump-params (and with
it every parity test) writes the first replica's copy only, so a replica that drifted
would go unseen. The check is one all-reduce of the
parameters' CRCs after the last step; here it is shown to fail when a replica drifts
(TRIREME_TEST_DRIFT_REPLICA) under TRIREME_REPLICA_CHECK=strict, and is reported by
default, under plain data parallelism, ZeRO, and a pipeline's per-stage groups.

Every rank reads the same corpus: two agents (emulated machines) given different --data
files are refused at the start. And a --resume that reads other data (another corpus or
--seed) than the checkpoint's run says so."""
import os
import shutil
import subprocess
import unittest

from common import TRIREME, free_port, main, run, stop, temp_dir

MODEL = ["--layers", "2", "--dim", "32", "--heads", "2", "--seq", "32", "--batch", "8",
         "--steps", "2", "--lr", "1e-2", "--quiet"]


class ReplicaAgreement(unittest.TestCase):
    def setUp(self):
        self.dir = temp_dir()
        self.addCleanup(shutil.rmtree, self.dir, True)

    def train(self, layout, env=None):
        self.runs = getattr(self, "runs", 0) + 1  # an --out each: trireme train keeps an earlier run
        return run(["train", "gpt", "--out", f"{self.dir}/run{self.runs}"] + layout + MODEL, env=env, check=False)

    def check(self, layout):
        agreed = self.train(layout)  # (strict, as the whole suite: common.py)
        self.assertEqual(agreed.returncode, 0, agreed.stdout + agreed.stderr)
        self.assertNotIn("different parameters", agreed.stderr)
        # (--max-restarts 2: a restart would find the same drift, so none is made.)
        drifted = self.train(layout + ["--max-restarts", "2"], env={"TRIREME_TEST_DRIFT_REPLICA": "1"})
        self.assertNotEqual(drifted.returncode, 0, drifted.stdout + drifted.stderr)
        self.assertNotIn("restarting the workers", drifted.stderr)
        self.assertIn("(kExitNoRestart: a restart would repeat it), so the job was not restarted", drifted.stderr)
        # One value of one replica moved by 1.0: the difference is measured, not only seen.
        self.assertIn("the data-parallel replicas ended with different parameters (wte.weight; max abs diff 1)",
                      drifted.stderr)
        # By default it is reported and the run succeeds (replicas on different hardware).
        reported = self.train(layout, env={"TRIREME_TEST_DRIFT_REPLICA": "1", "TRIREME_REPLICA_CHECK": "report"})
        self.assertEqual(reported.returncode, 0, reported.stdout + reported.stderr)
        self.assertIn("gpt: the data-parallel replicas ended with different parameters (wte.weight; max abs diff 1)",
                      reported.stderr)
        print(f"{' '.join(layout)}: a drifted replica is measured, and fails a strict run")

    def test_data_parallel(self):
        self.check(["--nproc-per-node", "2", "--dp", "2"])

    def test_zero(self):
        self.check(["--nproc-per-node", "2", "--dp", "2", "--zero", "1"])

    def test_pipeline_stages(self):
        self.check(["--nproc-per-node", "4", "--dp", "2", "--pp", "2", "--micro-batches", "2"])


class CorpusAgreement(unittest.TestCase):
    def setUp(self):
        self.dir = temp_dir()
        self.addCleanup(shutil.rmtree, self.dir, True)
        with open(os.path.join(os.environ.get("TRIREME_SOURCE", "."), "assets/corpus/kjv.txt"), "rb") as f:
            text = f.read(20000)
        self.corpora = []
        for node, cut in ((0, 20000), (1, 19000)):
            path = os.path.join(self.dir, f"corpus{node}.txt")
            with open(path, "wb") as f:
                f.write(text[:cut])
            self.corpora.append(path)

    def test_nodes_reading_different_corpora_are_refused(self):
        port = free_port()
        agents = [subprocess.Popen(
            [TRIREME, "train", "gpt", "--nproc-per-node", "1", "--nnodes", "2", "--node-rank", str(node),
             "--rdzv", f"127.0.0.1:{port}", "--out", os.path.join(self.dir, "run"),
             "--data", self.corpora[node]] + MODEL,
            env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for node in (0, 1)]
        for agent in agents:
            self.addCleanup(stop, agent)
        errors = ""
        for agent in agents:
            _, err = agent.communicate(timeout=300)
            self.assertNotEqual(agent.returncode, 0, err)
            errors += err
        self.assertIn("the ranks read different corpora (--data ", errors)
        self.assertIn("19000 to 20000 bytes): give every node the same --data file", errors)

    def test_resume_on_other_data_says_so(self):
        out = os.path.join(self.dir, "run")
        model = [a for i, a in enumerate(MODEL) if "--steps" not in MODEL[max(0, i - 1):i + 1]]
        common = ["train", "gpt", "--nproc-per-node", "2", "--out", out, "--checkpoint-every", "2"] + model
        run(common + ["--data", self.corpora[0], "--steps", "2"])
        same = run(common + ["--data", self.corpora[0], "--resume", "--steps", "3"])
        self.assertNotIn("was trained on other data", same.stderr)
        other = run(common + ["--data", self.corpora[1], "--resume", "--steps", "4"])
        self.assertIn("was trained on other data (corpus of 20000 bytes", other.stderr)
        self.assertIn("this run reads corpus of 19000 bytes", other.stderr)
        seed = run(common + ["--data", self.corpora[1], "--resume", "--steps", "5", "--seed", "7"])
        self.assertIn("--seed 7 --batch 8): the batches from here on differ", seed.stderr)


if __name__ == "__main__":
    main()
