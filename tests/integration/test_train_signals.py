"""The main job under signals and crashes (real processes, real kill -9):
SIGTERM to `trireme train` stops every rank; a rank killed with SIGKILL makes the job
exit non-zero with one line naming that rank, within 60 s (a loaded 2-core machine's
teardown), not after the survivor's collective times out (5 minutes). Nothing is left
running."""
import os
import signal
import subprocess
import time
import unittest

from common import TRIREME, main, temp_dir, workers_alive

# How soon the job must end after a rank's kill -9: a job that instead waits for the
# survivor's collective to time out (5 minutes) fails this.
FAIL_FAST_S = 60

LONG = ["--layers", "1", "--dim", "32", "--heads", "2", "--seq", "32", "--batch", "4",
        "--steps", "100000", "--quiet", "--log-every", "1"]


def start(out, nproc=2):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen([TRIREME, "train", "gpt", "--nproc-per-node", str(nproc),
                             "--out", out] + LONG, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_training(out, proc, timeout=60):
    """Returns once rank 0 has logged a step (training is under way)."""
    metrics = os.path.join(out, "metrics.jsonl")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"training ended early: {proc.communicate()}")
        if os.path.exists(metrics) and os.path.getsize(metrics) > 0:
            return
        time.sleep(0.05)  # polling for a condition, bounded by the deadline
    raise AssertionError("no step logged within the deadline")


def proc_file(pid, name):
    with open(f"/proc/{pid}/{name}", "rb") as f:
        return f.read()


def worker_pids(out):
    return [p for p in workers_alive(out) if b"__train-worker" in proc_file(p, "cmdline")]


def end(proc, out):
    """For a finally: a job (--steps 100000) still running after a failed assertion is
    killed and reaped, and so are its ranks."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate()
    for pid in workers_alive(out):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class TrainSignals(unittest.TestCase):
    def test_sigterm_stops_every_rank(self):
        out = os.path.join(temp_dir(), "run")
        proc = start(out)
        try:
            wait_for_training(out, proc)
            self.assertEqual(len(worker_pids(out)), 2)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
            print(f"SIGTERM: exit {proc.returncode} after {time.monotonic() - t0:.2f} s: "
                  f"{err.strip().splitlines()[-1]}")
            self.assertEqual(proc.returncode, 128 + signal.SIGTERM, err[-2000:])  # not an abort, not a plain 1
            self.assertIn("received SIGTERM", err.strip().splitlines()[-1])
            self.assertEqual(workers_alive(out), [], "ranks left running after SIGTERM")
        finally:
            end(proc, out)

    def test_killed_rank_stops_the_job_fast(self):
        out = os.path.join(temp_dir(), "run")
        proc = start(out)
        try:
            wait_for_training(out, proc)
            pids = worker_pids(out)
            self.assertEqual(len(pids), 2)
            # Find rank 1 by its environment.
            victim = next(p for p in pids if b"\0RANK=1\0" in b"\0" + proc_file(p, "environ"))
            t0 = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            _, err = proc.communicate(timeout=FAIL_FAST_S + 60)  # past it: the assert below says so
            elapsed = time.monotonic() - t0
            last = err.strip().splitlines()[-1]
            print(f"kill -9 rank 1: exit {proc.returncode} after {elapsed:.2f} s: {last}")
            self.assertEqual(proc.returncode, 1, err[-2000:])
            self.assertLess(elapsed, FAIL_FAST_S, "the job did not fail fast")
            self.assertIn("rank 1", last)
            self.assertIn("signal 9", last)
            self.assertEqual(workers_alive(out), [], "ranks left running after a crash")
        finally:
            end(proc, out)


if __name__ == "__main__":
    main()
