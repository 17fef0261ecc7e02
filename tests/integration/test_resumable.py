"""The library's fault tolerance for a program of one's own (tests/workers/
resumable_probe.cpp: DataParallel, AdamW and ft::Resumable): under `trireme run
--max-restarts 1`, a worker killed with SIGKILL mid-run is restarted with the others, they
resume from the agent's in-memory snapshots, and the final parameters are bitwise those of
a run that was never interrupted."""
import os
import unittest

from common import run, temp_dir

PROBE = os.path.join(os.environ.get("TRIREME_WORKERS", "build/tests/workers"), "resumable_probe")


class Resumable(unittest.TestCase):
    def test_killed_worker_resumes_bitwise(self):
        d = temp_dir()
        straight, killed = os.path.join(d, "straight.bin"), os.path.join(d, "killed.bin")
        run(["run", "--nproc-per-node", "2", "--max-restarts", "1", "--", PROBE, "12", "0", straight])
        # --standby 1: the probe awaits activation first thing in main, as such programs must.
        proc = run(["run", "--nproc-per-node", "2", "--max-restarts", "1", "--standby", "1", "--", PROBE, "12",
                    "5", killed])
        # The agent names the first worker it finds dead: rank 1 (SIGKILL) or rank 0, whose
        # all-reduce failed on the broken connection a moment later.
        self.assertRegex(proc.stderr, r"rank [01] \(node 0, local [01]\) (was killed by signal|exited)")
        self.assertIn("restarting the workers (restart 1 of 1)", proc.stderr)
        with open(straight, "rb") as a, open(killed, "rb") as b:
            same = a.read() == b.read()
        print(f"killed after step 5, restarted, resumed: final parameters bitwise equal: {same}")
        self.assertTrue(same)


if __name__ == "__main__":
    unittest.main(verbosity=2)
