"""A pipeline stage that fails mid-step makes the whole job fail fast, with a message naming
the stage, instead of leaving its neighbours blocked in a receive: a real kill -9 of one
stage's process while the pipeline is running, at PP=2 (the last stage) and PP=4 (a middle
stage, with neighbours on both sides)."""
import os
import signal
import subprocess
import time
import unittest

from common import TRIREME, main, temp_dir, workers_alive

MODEL = ["--layers", "2", "--dim", "32", "--heads", "2", "--seq", "16", "--batch", "8",
         "--steps", "100000", "--micro-batches", "4", "--quiet"]


def rank_of(pid):
    """The RANK of a launched worker; None for the agent (which has no RANK)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    except OSError:
        return None
    return int(env[b"RANK"]) if b"RANK" in env else None


def steps_done(metrics):
    """Lines in the run's metrics.jsonl (one per step), 0 before it exists."""
    if not os.path.exists(metrics):
        return 0
    with open(metrics) as f:
        return len(f.readlines())


class PipelineFailFast(unittest.TestCase):
    def kill_stage(self, pp, stage):
        out = os.path.join(temp_dir(), f"pp{pp}-kill{stage}")
        agent = subprocess.Popen(
            [TRIREME, "train", "gpt", "--nproc-per-node", str(pp), "--pp", str(pp), "--out", out]
            + MODEL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, OMP_NUM_THREADS="1"))
        try:
            metrics = os.path.join(out, "metrics.jsonl")
            deadline = time.monotonic() + 120
            # Wait until a few steps are done, so the kill lands while the pipeline runs.
            reached = False
            while time.monotonic() < deadline and agent.poll() is None:
                if steps_done(metrics) >= 3:
                    reached = True
                    break
                time.sleep(0.05)
            self.assertIsNone(agent.poll(), "training ended before the kill")
            self.assertTrue(reached, f"training did not reach step 3 within 120 s (steps done: {steps_done(metrics)}); "
                            "a kill now would not land in a running pipeline")
            # Stage s is rank s here (dp=1, tp=1).
            victim = [pid for pid in workers_alive(out) if rank_of(pid) == stage]
            self.assertEqual(len(victim), 1)
            killed = time.monotonic()
            os.kill(victim[0], signal.SIGKILL)
            _, err = agent.communicate(timeout=60)
            elapsed = time.monotonic() - killed
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.communicate()
        last = [l for l in err.splitlines() if l.startswith("trireme train:")]
        print(f"pp={pp}, killed stage {stage}: exit {agent.returncode} after {elapsed:.2f} s: "
              f"{last[-1] if last else err[-200:]}")
        self.assertNotEqual(agent.returncode, 0)
        self.assertTrue(last, err)
        self.assertIn(f"pipeline stage {stage} of {pp}", last[-1])
        self.assertIn("SIGKILL", last[-1])
        self.assertLess(elapsed, 30, "the job did not fail fast")
        self.assertEqual(workers_alive(out), [], "worker processes left behind")

    def test_last_stage_of_two(self):
        self.kill_stage(2, 1)

    def test_middle_stage_of_four(self):
        self.kill_stage(4, 2)


if __name__ == "__main__":
    main()
