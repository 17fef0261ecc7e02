"""The library's fault tolerance for a program of one's own (tests/workers/
resumable_probe.cpp: DataParallel, AdamW and ft::Resumable): under `trireme run
--max-restarts 1`, a worker killed with SIGKILL mid-run is restarted with the others, they
resume from the agent's in-memory snapshots at the step it was killed after (each rank
says where it resumed: the probe's data is a function of the step, so a restart from step
0 would end bitwise equal too), and every rank's final parameters and module buffers (a
BatchNorm's running statistics, each rank's own, and its count of steps) are bitwise those
of a run that was never interrupted. Nothing is left behind: no probe process, no snapshot area (put
under a directory of the test's own with TRIREME_SNAPSHOT_ROOT)."""
import os
import re
import struct

from common import SnapshotAreaTest, main, run, workers_alive

PROBE = os.path.join(os.environ.get("TRIREME_WORKERS", "build/tests/workers"), "resumable_probe")
RESUMED = re.compile(r"^\[([01])\] resumable_probe: restart (\d+): resumed at step (\d+)$", re.M)


class Resumable(SnapshotAreaTest):
    def tearDown(self):
        super().tearDown()
        self.assertEqual(workers_alive(PROBE), [], "resumable_probe processes left behind")

    def resumed(self, stderr):
        """{(rank, restart): the step it resumed at} from the probe's lines."""
        found = {(int(r), int(g)): int(s) for r, g, s in RESUMED.findall(stderr)}
        self.assertEqual(len(found), len(RESUMED.findall(stderr)), stderr[-3000:])  # each said once
        return found

    def test_killed_worker_resumes_bitwise(self):
        d = self.dir
        straight, killed = os.path.join(d, "straight.bin"), os.path.join(d, "killed.bin")
        proc = run(["run", "--nproc-per-node", "2", "--max-restarts", "1", "--", PROBE, "12", "0", straight])
        self.assertEqual(self.resumed(proc.stderr), {(0, 0): 0, (1, 0): 0}, proc.stderr[-3000:])
        # --standby 1: the probe awaits activation first thing in main, as such programs must.
        proc = run(["run", "--nproc-per-node", "2", "--max-restarts", "1", "--standby", "1", "--", PROBE, "12",
                    "5", killed])
        # The agent names the first worker it finds dead: rank 1 (SIGKILL) or rank 0, whose
        # all-reduce failed on the broken connection a moment later.
        self.assertRegex(proc.stderr, r"rank [01] \(node 0, local [01]\) (was killed by signal|exited)")
        self.assertIn("restarting the workers (restart 1 of 1)", proc.stderr)
        # The first generation started afresh; the restarted one, on both ranks, resumed at
        # step 5, the step rank 1 was killed after (every rank's snapshot of it complete).
        self.assertEqual(self.resumed(proc.stderr), {(0, 0): 0, (1, 0): 0, (0, 1): 5, (1, 1): 5},
                         proc.stderr[-3000:])
        for rank in (0, 1):
            with open(f"{straight}.{rank}", "rb") as a, open(f"{killed}.{rank}", "rb") as b:
                want, got = a.read(), b.read()
            # The file ends with num_batches_tracked: every step counted once, across the restart.
            self.assertEqual(struct.unpack("<q", got[-8:])[0], 12, f"rank {rank}")
            same = want == got
            print(f"rank {rank}: killed after step 5, restarted, resumed at step 5: final parameters and "
                  f"buffers bitwise equal: {same}")
            self.assertTrue(same, f"rank {rank}")
        with open(f"{straight}.0", "rb") as a, open(f"{straight}.1", "rb") as b:
            self.assertNotEqual(a.read(), b.read())  # the ranks' running statistics differ


if __name__ == "__main__":
    main()
