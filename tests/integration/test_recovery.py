"""Recovery from worker failures through `trireme train gpt --max-restarts 1` (real
processes, real kill -9):

- kill -9 of one worker at a random step of a DP=2, a DP=2 x PP=2, a DP=2 x TP=2 (with
  dropout) and a ZeRO-2 run: the run completes by itself, resuming from the in-memory snapshots, and its
  final parameters are bitwise equal to an uninterrupted run with the same seed (so are
  its per-step losses); with snapshots shared by the data-parallel replicas (the default)
  and with whole ones (--snapshot-share 0);
- kill -9 in the middle of a snapshot (data written, manifest not; through the
  TRIREME_TEST_KILL_IN_SNAPSHOT seam, which makes the worker SIGKILL itself there):
  recovery uses the previous complete snapshot, still bitwise equal at the end; and a
  committed snapshot whose data is damaged (a flipped byte, TRIREME_TEST_DAMAGE_SNAPSHOT)
  is skipped for the one before it;
- the leader lost between a step's snapshot and its line in metrics.jsonl
  (TRIREME_TEST_KILL_BEFORE_RECORD): the line is not lost;
- a worker lost after the last step (TRIREME_TEST_KILL_AFTER_TRAINING): the restart
  resumes at --steps, trains nothing, and writes the run's files and parameters;
- a worker that hangs (stops without exiting) is detected by its stalled heartbeat
  (--heartbeat-timeout), killed, and the job restarts and finishes bitwise equal too;
- across two agents (emulated machines): the failure on one makes both start a new
  generation together;
- restarts are bounded: with --max-restarts 1 a worker that always fails ends the job
  with one clear line after one restart;
- the snapshot policy (--snapshot-overhead) doubles the interval while the stall exceeds
  the target, and leaves it alone when off;
- the first step after a restart reports how long training stood still, from the agent's
  sight of the failure, in phases (on stderr, and as recovery_ms and recovery_phases_ms in
  metrics.jsonl);
- nothing is left behind: no worker process, no snapshot area (put under a directory of
  the test's own with TRIREME_SNAPSHOT_ROOT)."""
import os
import random
import re
import signal
import subprocess
import time

from common import TRIREME, SnapshotAreaTest, assert_ran, free_port, main, metrics, run, stop, workers_alive

MODEL = ["--layers", "2", "--dim", "32", "--heads", "2", "--seq", "16", "--batch", "8",
         "--lr", "3e-3", "--warmup", "0", "--clip", "0.05", "--bucket-mb", "0.02",
         "--first-bucket-mb", "0.01", "--sample-tokens", "0", "--log-every", "1"]
STEPS = 30
REPORT = re.compile(r"training again (\d+) ms after the failure was seen \(membership (\d+) ms, "
                    r"snapshot recovery (\d+) ms, workers running (\d+) ms, "
                    r"model and groups (\d+) ms, state read (\d+) ms, first step (\d+) ms\)")


def raw(path):
    with open(path, "rb") as f:
        return f.read()


def rank_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"__train-worker" not in f.read():
                return None
        if env.get(b"TRIREME_STANDBY") == b"1":
            return None  # started as a standby (a later generation's worker), not a victim
        return int(env.get(b"RANK", b"-1"))
    except OSError:
        return None


def standbys(marker):
    """Standby workers (launch/standby.h) of the run whose command line contains marker."""
    found = []
    for pid in workers_alive(marker):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if b"\0TRIREME_STANDBY=1\0" in b"\0" + f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def lines_in(path):
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return len(f.readlines())


class Recovery(SnapshotAreaTest):

    def reference(self, nproc, layout, steps=STEPS, model=MODEL):
        out = os.path.join(self.dir, "straight")
        dump = out + ".params"
        run(["train", "gpt", "--nproc-per-node", str(nproc), "--out", out, "--dump-params", dump,
             "--steps", str(steps), "--quiet"] + layout + model, timeout=300)
        return raw(dump), [m["loss"] for m in metrics(out)]

    def check(self, nproc, layout, victim, kill_at=None, env=None, steps=STEPS, after_standby=False, shared=None,
              model=MODEL, trains_after=True, ready=None, resumed_from="memory snapshots"):
        ref_params, ref_losses = self.reference(nproc, layout, steps, model)
        out = os.path.join(self.dir, "killed")
        dump = out + ".params"
        cmd = [TRIREME, "train", "gpt", "--nproc-per-node", str(nproc), "--out", out,
               "--dump-params", dump, "--steps", str(steps), "--max-restarts", "1"] + layout + model
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))
        self.addCleanup(stop, proc)  # a failed assertion below must not leave the job running
        killed_at = None
        if kill_at is not None:
            # Wait (polling the run's own progress) until it has done kill_at steps.
            deadline = time.monotonic() + 120
            path = os.path.join(out, "metrics.jsonl")
            reached = False
            while time.monotonic() < deadline and proc.poll() is None:
                if (lines_in(path) >= kill_at and (not after_standby or len(standbys(out)) == nproc)
                        and (ready is None or ready(out))):
                    reached = True
                    break
                time.sleep(0.01)
            # A kill after the run ended, or before the awaited step, would test nothing
            # (or something else): say which condition was missed.
            self.assertTrue(reached, f"not reached within 120 s: {kill_at} steps done (done: {lines_in(path)})"
                            + (f" and {nproc} standby workers up (up: {len(standbys(out))})" if after_standby else "")
                            + ("; the run had ended (exit %s)" % proc.returncode if proc.poll() is not None else ""))
            pids = [p for p in workers_alive(out) if rank_of(p) == victim]
            self.assertEqual(len(pids), 1, "the victim worker was not found")
            killed_at = lines_in(path)
            os.kill(pids[0], signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=300)
        self.assertEqual(proc.returncode, 0, stderr[-3000:])
        self.assertIn("restarting the workers (restart 1 of 1)", stderr)
        resumed = [l for l in stderr.splitlines() if "resumed at step" in l]
        self.assertTrue(resumed, f"the restarted workers did not resume from a snapshot:\n{stderr[-3000:]}")
        print(f"{' '.join(layout)}: killed rank {victim} after step {killed_at}; {resumed[0].strip()}")
        self.assertIn("from " + resumed_from, resumed[0])
        if shared is not None:  # the data-parallel replicas shared each snapshot (--snapshot-share)
            self.assertEqual(f"(shared by {shared} replicas)" in resumed[0], shared > 1, resumed[0])
        self.assertEqual([m["step"] for m in metrics(out)], list(range(1, steps + 1)))
        assert_ran(self, out, nproc, layout)  # (so the reference did too: a flag ignored by both passes)
        if trains_after:  # (the report comes with the first step after the restart)
            self.check_recovery_report(stderr, metrics(out))
        self.assertEqual([m["loss"] for m in metrics(out)], ref_losses)
        self.assertEqual(raw(dump), ref_params, "final parameters differ from the uninterrupted run")
        self.assertEqual(workers_alive(out), [])
        return stderr

    def check_recovery_report(self, stderr, rows):
        """The first step after the restart says how long training stood still, from the
        agent's sight of the failure, in phases that add up to it (stderr and metrics)."""
        found = [REPORT.search(l) for l in stderr.splitlines() if REPORT.search(l)]
        self.assertEqual(len(found), 1, stderr[-3000:])
        self.assertNotIn("first step done", stderr)  # the agent's coarser line gives way to it
        total, *phases = (int(x) for x in found[0].groups())
        print(f"recovery: {found[0].group(0)}")
        self.assertTrue(all(p >= 0 for p in phases), found[0].group(0))
        self.assertLessEqual(abs(sum(phases) - total), len(phases), found[0].group(0))  # each rounded
        with_field = [m for m in rows if "recovery_ms" in m]
        self.assertEqual(len(with_field), 1)
        self.assertEqual(with_field[0], [m for m in rows if m["restart"] == 1][0])
        self.assertAlmostEqual(with_field[0]["recovery_ms"], total, delta=1)
        in_metrics = with_field[0]["recovery_phases_ms"]  # the same phases, unrounded
        self.assertEqual(list(in_metrics), ["membership", "snapshot_recovery", "workers", "setup", "state",
                                            "first_step"])
        for printed, field in zip(phases, in_metrics.values()):
            self.assertAlmostEqual(printed, field, delta=0.5 + 1e-9)

    def test_kill_dp2(self):
        # By default the two replicas share each snapshot, each holding half the tensors.
        self.check(2, ["--dp", "2"], victim=1, kill_at=random.randint(3, STEPS // 2), shared=2)

    def test_kill_dp3(self):
        # Three replicas: Gloo's ring sums an element in an order set by its place in the
        # bucket, so a restarted run must use the uninterrupted run's buckets to give its bits.
        self.check(3, ["--dp", "3"], victim=1, kill_at=random.randint(3, STEPS // 2), shared=3,
                   model=MODEL + ["--batch", "12"])

    def test_kill_dp2_whole_snapshots(self):
        # --snapshot-share 0: every rank snapshots all of its state and restores alone.
        self.check(2, ["--dp", "2", "--snapshot-share", "0"], victim=random.randint(0, 1),
                   kill_at=random.randint(3, STEPS // 2), shared=0)

    def test_kill_dp2_pp2(self):
        self.check(4, ["--dp", "2", "--pp", "2", "--micro-batches", "2"], victim=random.randint(0, 3),
                   kill_at=random.randint(3, STEPS // 2), shared=2)

    def test_restart_cuts_the_pipeline_where_the_first_generation_did(self):
        # The stages are balanced by measured layer times; a restarted generation measuring
        # otherwise (here forced: TRIREME_TEST_SKEW_COSTS makes its first layer read 100x
        # slower) must still cut where the first did, or its snapshots hold other stages.
        stderr = self.check(4, ["--pp", "2", "--micro-batches", "2"], victim=random.randint(0, 3),
                            kill_at=random.randint(3, STEPS // 2), env={"TRIREME_TEST_SKEW_COSTS": "1"})
        splits = [m.group(1) for m in (re.search(r"layers split (\S+)", l) for l in stderr.splitlines()) if m]
        print(f"stages per generation: {splits}")
        self.assertEqual(len(splits), 2, stderr[-3000:])
        self.assertEqual(splits[0], splits[1])

    def test_kill_dp2_tp2(self):
        # Shares of tensor-parallel shards; the replicated tensors (LayerNorms, some
        # biases) are shared within each tensor-parallel rank's data-parallel group too.
        # With dropout: the split regions' per-rank stream (tensor::RngTracker) is restored
        # with the default generators, or the resumed masks would differ.
        self.check(4, ["--dp", "2", "--tp", "2", "--dropout", "0.1"], victim=random.randint(0, 3), kill_at=random.randint(3, STEPS // 2),
                   shared=2)

    def test_kill_zero2(self):
        # Under ZeRO each rank's snapshot holds only its own pieces' optimizer state.
        self.check(2, ["--dp", "2", "--zero", "2"], victim=1, kill_at=random.randint(3, STEPS // 2), shared=0)

    def test_restart_activates_standby_workers(self):
        # trireme train starts the next generation's workers ahead of time; once they are
        # up, a kill -9 restarts the job with them instead of new processes.
        # Late enough that snapshots are complete even when a loaded machine has starved
        # their idle-priority checksum thread until the next snapshot.
        stderr = self.check(2, ["--dp", "2"], victim=1, kill_at=40, steps=400, after_standby=True)
        self.assertIn("restarting the workers (restart 1 of 1), 2 from standby", stderr)

    def test_kill_during_snapshot(self):
        # Every step snapshotted (the stall policy off), so that step 7 has one.
        stderr = self.check(2, ["--dp", "2", "--snapshot-every", "1", "--snapshot-overhead", "0"], victim=1,
                            env={"TRIREME_TEST_KILL_IN_SNAPSHOT": "1:7"})
        # Snapshot 7 was interrupted (no manifest): the previous one, 6, is used.
        self.assertIn("resumed at step 6 from memory snapshots", stderr)

    def test_a_newer_checkpoint_than_the_snapshots_serves(self):
        # Snapshots every 3 steps, checkpoints every 4; rank 1 stops after step 5
        # (TRIREME_TEST_HANG_AT, so that no snapshot of 6 is taken) and is killed once
        # checkpoint 4 is committed. The restart resumes from checkpoint 4 (before: from
        # snapshot 3, redoing step 4 and rewriting its checkpoint in place), to the same bits.
        def committed(out):
            return os.path.exists(os.path.join(out, "checkpoints", "4", "manifest.json"))

        stderr = self.check(2, ["--dp", "2", "--snapshot-every", "3", "--checkpoint-every", "4",
                                "--snapshot-overhead", "0"], victim=1, kill_at=5, ready=committed,
                            env={"TRIREME_TEST_HANG_AT": "1:5"},
                            resumed_from=os.path.join(self.dir, "killed", "checkpoints"))
        self.assertIn("resumed at step 4 from", stderr)

    def test_damaged_snapshot_is_skipped(self, victim=1):
        # Rank 1's committed snapshot of step 6 gets a flipped byte (a memory fault), then it
        # dies: the ranks agree on step 6 by its manifest, but rank 1's data fails its CRC,
        # so the restart takes step 5 (before, the damaged step was agreed on, its restore
        # failed on one rank, and every restart picked it again).
        stderr = self.check(2, ["--dp", "2", "--snapshot-every", "1", "--snapshot-overhead", "0"], victim=victim,
                            env={"TRIREME_TEST_DAMAGE_SNAPSHOT": f"{victim}:6"})
        self.assertIn("skipping a damaged snapshot", stderr)
        self.assertIn("CRC-32 mismatch", stderr)
        self.assertIn("resumed at step 5 from memory snapshots", stderr)

    def test_damaged_snapshot_of_the_leader_is_skipped(self):
        # The same on rank 0, whose commit waits for the step's metrics line: the seam waits
        # for that commit before the line (it hung there until the seam opened the gate).
        self.test_damaged_snapshot_is_skipped(victim=0)

    def test_a_worker_lost_after_the_last_step_is_restarted_at_it(self):
        # Rank 1 is killed after its last step, once every rank's snapshot of it is whole
        # (TRIREME_TEST_KILL_AFTER_TRAINING): the restart resumes at --steps, trains
        # nothing, and still writes the run's files (the loss curve, the traces, the
        # layout, the parameters), equal to the uninterrupted run's.
        steps = 6
        stderr = self.check(2, ["--dp", "2", "--snapshot-every", "1", "--snapshot-overhead", "0"], victim=1,
                            env={"TRIREME_TEST_KILL_AFTER_TRAINING": "1"}, steps=steps, trains_after=False)
        self.assertIn(f"resumed at step {steps} from memory snapshots", stderr)
        self.assertNotIn("nothing to train", stderr)  # (that is a --resume's, not a restart's)
        out = os.path.join(self.dir, "killed")
        for name in ("loss.svg", "trace.json", "timeline.svg", "run.json"):
            self.assertTrue(os.path.exists(os.path.join(out, name)), name)

    def test_the_leader_lost_before_a_steps_line_leaves_no_line_missing(self):
        # The leader is killed after its snapshot of step 7 was taken, before step 7's line
        # was written, once the other rank has committed step 7 and its own writer waits to
        # (TRIREME_TEST_KILL_BEFORE_RECORD). Its snapshot of 7 must not commit before the
        # line: the job resumes at step 6 and writes step 7's line (check(): every step's
        # line once, the losses and parameters of the uninterrupted run). Before, the
        # writer committed step 7 first and the resumed job started after it, its line
        # missing.
        stderr = self.check(2, ["--dp", "2", "--snapshot-every", "1", "--snapshot-overhead", "0"], victim=0,
                            env={"TRIREME_TEST_KILL_BEFORE_RECORD": "7"})
        self.assertIn("resumed at step 6 from memory snapshots", stderr)

    def test_hung_worker_is_killed_and_restarted(self):
        # Rank 1 stops after step 6 without exiting (TRIREME_TEST_HANG_AT); its heartbeat
        # stalls, so do its peer's (waiting for it), and the agent kills and restarts them.
        # 5 s, not less: a busy 2-core machine can hold a healthy step that long (the test
        # waits it out once, after the hang).
        stderr = self.check(2, ["--dp", "2", "--heartbeat-timeout", "5", "--snapshot-every", "1",
                                "--snapshot-overhead", "0"], victim=1, env={"TRIREME_TEST_HANG_AT": "1:6"})
        self.assertIn("no progress for 5 s", stderr)
        self.assertIn("killed as hung", stderr)
        # It hung before its snapshot of step 6: step 5 is the newest all ranks hold.
        self.assertIn("resumed at step 5 from memory snapshots", stderr)

    def test_snapshot_policy_lowers_the_frequency(self):
        # CheckFreq's policy: a stall above --snapshot-overhead doubles the interval. The
        # first three snapshots create their slots and are not judged; the fourth (step 4)
        # is, once step 5 has waited for the rest of its copy: every 2 steps, then the one
        # of step 6 makes it 4 and the one of step 8 makes it 8. With the policy off
        # (--snapshot-overhead 0) the interval stays. (Not a generous target instead: on a
        # loaded machine a small model's stall can be most of its step.)
        out = os.path.join(self.dir, "policy")
        base = ["train", "gpt", "--nproc-per-node", "2", "--dp", "2", "--max-restarts", "1",
                "--snapshot-every", "1", "--steps", "12"] + MODEL
        stderr = run(base + ["--out", out, "--snapshot-overhead", "1e-9"], timeout=300).stderr
        changes = [l.strip() for l in stderr.splitlines() if "snapshots cost" in l]
        print("snapshot policy:", "; ".join(changes))
        self.assertEqual([l.rsplit("now every ", 1)[1] for l in changes], ["2 steps", "4 steps", "8 steps"])
        for line in changes:
            self.assertGreater(float(line.split("cost ")[1].split("%")[0]), 0.0, line)
        stderr = run(base + ["--out", out + "-fixed", "--snapshot-overhead", "0"], timeout=300).stderr
        self.assertNotIn("snapshots cost", stderr)

    def test_bad_snapshot_share_is_refused(self):
        # One line naming the flag and the fix, exit status 2, before anything starts.
        cases = [(["--snapshot-share", "2"], "--snapshot-share must be 0 or 1"),
                 (["--nnodes", "1:2", "--rdzv", f"127.0.0.1:{free_port()}", "--max-restarts", "1",
                   "--snapshot-share", "1"],
                  "--snapshot-share 1 cannot be used in an elastic job")]
        for flags, message in cases:
            proc = run(["train", "gpt", "--steps", "1", "--out", os.path.join(self.dir, "refused")] + flags,
                       check=False, timeout=60)
            lines = [l for l in proc.stderr.splitlines() if l.strip()]
            self.assertEqual(proc.returncode, 2, proc.stderr)
            self.assertEqual(len(lines), 1, proc.stderr)
            self.assertIn(message, lines[0])
        self.assertFalse(os.path.exists(os.path.join(self.dir, "refused")))

    def test_restarts_are_bounded(self):
        proc = run(["run", "--nproc-per-node", "2", "--max-restarts", "1", "--", "sh", "-c", "exit 3"],
                   check=False, timeout=60)
        lines = [l for l in proc.stderr.splitlines() if l.strip()]
        print("always failing worker:", lines[-1])
        self.assertNotEqual(proc.returncode, 0)
        self.assertEqual(sum("restarting the workers" in l for l in lines), 1)
        self.assertIn("exited with code 3", lines[-1])
        self.assertIn("gave up after 1 restart (--max-restarts 1)", lines[-1])

    def start_two_agents(self, flags, envs):
        """Two agents (emulated machines) of a DP=2 `--max-restarts 1` run of STEPS steps, one
        worker each, node N with envs[N]; stopped at the test's end whatever happens."""
        port = free_port()
        agents = [subprocess.Popen(
            [TRIREME, "train", "gpt", "--nproc-per-node", "1", "--nnodes", "2", "--node-rank", str(node),
             "--rdzv", f"127.0.0.1:{port}", "--max-restarts", "1", "--dp", "2", "--steps", str(STEPS)]
            + flags + MODEL, env=envs[node], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for node in (0, 1)]
        for agent in agents:
            self.addCleanup(stop, agent)
        return agents

    def stderr_of_success(self, agents):
        """Each agent's stderr, once it has exited 0."""
        errs = []
        for agent in agents:
            _, err = agent.communicate(timeout=300)
            self.assertEqual(agent.returncode, 0, err[-3000:])
            errs.append(err)
        return errs

    def test_restart_across_two_agents(self):
        """Two agents (emulated machines, one worker each) on one rendezvous: the worker
        of node 1 dies inside a snapshot; node 1's agent asks for a new generation, node
        0's stops its worker too, they meet in the store and both restart; bitwise. Node
        1's clock runs 30 s ahead (TRIREME_TEST_CLOCK_SKEW_US): the recovery report, which
        rank 0 makes on node 0 from moments that node 1 saw, still adds up (before, its
        phases were off by the skew, e.g. "membership -29950 ms")."""
        ref_params, ref_losses = self.reference(2, ["--dp", "2"])
        out = os.path.join(self.dir, "two-agents")
        dump = out + ".params"
        env = dict(os.environ, OMP_NUM_THREADS="1", TRIREME_TEST_KILL_IN_SNAPSHOT="1:9")
        skewed = dict(env, TRIREME_TEST_CLOCK_SKEW_US="30000000")
        agents = self.start_two_agents(["--snapshot-every", "1", "--snapshot-overhead", "0", "--out", out,
                                        "--dump-params", dump], [env, skewed])
        errs = self.stderr_of_success(agents)
        # Node 0 restarts either because it saw node 1's request or because its own
        # worker lost its peer first; either way it joins generation 1.
        self.assertIn("restarting the workers (restart 1 of 1)", errs[0])
        self.assertIn("killed by signal 9 (SIGKILL); restarting the workers (restart 1 of 1)", errs[1])
        print("two agents: node 1's worker killed in its snapshot of step 9; both agents restarted; "
              f"final parameters bitwise equal: {raw(dump) == ref_params}")
        self.assertEqual([m["loss"] for m in metrics(out)], ref_losses)
        self.assertEqual(raw(dump), ref_params)
        self.check_recovery_report(errs[0], metrics(out))
        total = int(REPORT.search(errs[0]).group(1))
        self.assertLess(total, 20000, "the report counted the 30 s between the machines' clocks")

    def test_a_node_without_a_snapshot_area_makes_every_rank_resume_from_disk(self):
        """Two agents, one worker each; node 1's agent can make no snapshot area (its root
        does not exist). No rank snapshots to memory, and the restart after a kill -9 of
        node 1's worker resumes every rank from the checkpoint, bitwise. Before, node 0's
        rank called the in-memory resume's collectives, which node 1's skipped."""
        ref_params, ref_losses = self.reference(2, ["--dp", "2"])
        out = os.path.join(self.dir, "one-area")
        dump = out + ".params"
        env = dict(os.environ, OMP_NUM_THREADS="1")
        no_area = dict(env, TRIREME_SNAPSHOT_ROOT=os.path.join(self.dir, "no-such-directory"))
        agents = self.start_two_agents(["--checkpoint-every", "1", "--out", out, "--dump-params", dump], [env, no_area])
        path = os.path.join(out, "metrics.jsonl")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and lines_in(path) < 8 and all(a.poll() is None for a in agents):
            time.sleep(0.01)
        victims = [p for p in workers_alive(out) if rank_of(p) == 1]
        self.assertEqual(len(victims), 1, f"node 1's worker not found after {lines_in(path)} steps")
        os.kill(victims[0], signal.SIGKILL)
        errs = self.stderr_of_success(agents)
        self.assertIn("a node has no snapshot area", errs[0])
        resumed = [l for l in errs[0].splitlines() if "resumed at step" in l]
        self.assertTrue(resumed, errs[0][-3000:])
        print(f"node 1 without a snapshot area: {resumed[0].strip()}")
        self.assertIn("from " + os.path.join(out, "checkpoints"), resumed[0])
        self.assertEqual([m["loss"] for m in metrics(out)], ref_losses)
        self.assertEqual(raw(dump), ref_params, "final parameters differ from the uninterrupted run")


if __name__ == "__main__":
    main()
