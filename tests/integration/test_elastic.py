"""Losing whole machines: elastic membership (`--nnodes MIN:MAX`), erasure-coded snapshots
across machines (`--redundancy K+M`) and preemption notices, with machines emulated by
several agents on this host (real processes, real kill -9, real SIGTERM):

- 3 machines, --redundancy 2+1: kill -9 one machine's agent and worker mid-run; the job
  goes on with 2 machines and dp shrunk from 3 to 2 (same global batch), finishes, and its
  loss curve stays within floating-point tolerance of the uninterrupted run (the max
  difference is printed); it resumed from memory although checkpoints exist (none was
  read), and the survivors rebuilt the lost machine's snapshot from parity;
- ZeRO-1, the same kill: the lost machine's third of the optimizer state exists only as
  parity; the survivors rebuild it and resume from memory at that step; also with pp=2 and
  with tp=2 (2 workers per machine), where each stage's or shard's state is re-sharded
  over its new, smaller data-parallel group;
- the same, then a replacement machine joins under the lost one's --node-rank: the job
  grows back to 3 machines;
- SIGTERM to one machine's agent (a preemption notice): it leaves within its grace period,
  the others go on from the step the job had reached (no step lost) with its state (the
  loss curve of the uninterrupted run), also under ZeRO, where the leaving machine first
  flushes its last step into the parity;
- a worker process killed while its machine's agent lives on (the membership unchanged):
  the job resumes from every rank's own snapshot, bucket layout included, and with dp=3
  ends bit for bit equal to the uninterrupted run;
- losing more machines than the redundancy covers falls back to the newest disk checkpoint,
  saying so, and ends bit for bit where one machine resumed from that checkpoint ends;
- with the store on its own (`trireme store`, --rdzv-external), node 0 is a machine like
  the others: killing it leaves the job running on nodes 1 and 2;
- nothing is left behind: no worker process, no snapshot area."""
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import unittest

from common import (SOURCE, TRIREME, free_port, main, max_abs, max_abs_diff, metrics, read_params, stop, store_port,
                    temp_dir, workers_alive)

sys.path.insert(0, os.path.join(SOURCE, "bench", "py"))
from bench_proc import processes_with  # noqa: E402 (bench/py/bench_proc.py)

# Global batch 6: 2 sequences per rank on 3 machines, 3 on 2.
MODEL = ["--layers", "2", "--dim", "32", "--heads", "2", "--seq", "16", "--batch", "6",
         "--lr", "3e-3", "--warmup", "0", "--clip", "0.05", "--bucket-mb", "0.02",
         "--first-bucket-mb", "0.01", "--sample-tokens", "0", "--log-every", "1"]
STEPS = 40
# Seconds without an agent's heartbeat (one every 200 ms) before its machine counts as lost:
# the default, 5. Less (3 was used) can take a live machine for lost when a loaded 2-core
# host starves an agent that long; each kill test waits it out once.
NODE_TIMEOUT = 5
# Reduction order changes with dp (sums of 3 vs 2 partial gradients): losses agree to
# float32 rounding, not bit for bit (measured: under 1e-6 over 150 steps).
LOSS_TOLERANCE = 1e-5


def children(pid):
    return processes_with(1, pid)


def is_worker(pid):
    """Whether pid is a training worker of the current generation (not a standby)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"__train-worker" not in f.read():
                return False
        with open(f"/proc/{pid}/environ", "rb") as f:
            return b"\0TRIREME_STANDBY=1\0" not in b"\0" + f.read()
    except OSError:
        return False


def listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def last_step(out):
    path = os.path.join(out, "metrics.jsonl")
    if not os.path.exists(path):
        return 0
    try:
        return max((m["step"] for m in metrics(out)), default=0)
    except ValueError:
        return 0  # a line being written


class ElasticBase(unittest.TestCase):
    """Agents on this host, one per emulated machine, and the checks the tests share."""

    def setUp(self):
        self.dir = temp_dir()
        self.areas = os.path.join(self.dir, "snapshot-areas")
        os.makedirs(self.areas)
        self.env = dict(os.environ, OMP_NUM_THREADS="1", TRIREME_SNAPSHOT_ROOT=self.areas)
        self.marker = self.dir
        self.procs = []
        self.steps = STEPS

    def tearDown(self):
        for p in self.procs:
            stop(p)
        for pid in workers_alive(self.marker):
            os.kill(pid, signal.SIGKILL)

    def start(self, node, port, out, extra=(), nproc=1, nnodes="2:3"):
        args = [TRIREME, "train", "gpt", "--nproc-per-node", str(nproc), "--nnodes", nnodes, "--node-rank", str(node),
                "--rdzv", f"127.0.0.1:{port}", "--max-restarts", "4", "--node-timeout", str(NODE_TIMEOUT),
                "--snapshot-every", "1", "--snapshot-overhead", "0", "--steps", str(self.steps), "--out", out,
                "--seed", "7"] + MODEL + list(extra)
        p = subprocess.Popen(args, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        return p

    def reference(self, extra=(), nproc=1, out=None):
        out = out or os.path.join(self.dir, "reference")
        port = free_port()
        agents = [self.start(n, port, out, extra, nproc=nproc) for n in range(3)]
        for a in agents:
            _, err = a.communicate(timeout=300)
            self.assertEqual(a.returncode, 0, err[-3000:])
        return [m["loss"] for m in metrics(out)]

    def wait_for_step(self, out, step, agents):
        deadline = time.monotonic() + 240
        while last_step(out) < step:
            for a in agents:
                self.assertIsNone(a.poll(), "an agent exited before the failure was injected")
            self.assertLess(time.monotonic(), deadline, "the run did not reach the step")
            time.sleep(0.05)

    def wait_for_restart(self, out, agents):
        """Until the next generation has finished a step (a metrics line of restart 1): the
        job has then dropped the killed machine, so a replacement may take its --node-rank.
        (Waiting for a step number is not enough: the kill can come after that step, when
        the keepers' protection lagged, and the replacement would then join before the
        survivors' --node-timeout ran out and be refused as a duplicate.)"""
        deadline = time.monotonic() + 240
        while True:
            try:
                if any(m.get("restart", 0) >= 1 for m in metrics(out)):
                    return
            except (ValueError, OSError):
                pass  # a line being written, or the file being rewritten at the restart
            for a in agents:
                self.assertIsNone(a.poll(), "an agent exited before the replacement joined")
            self.assertLess(time.monotonic(), deadline, "the survivors did not resume")
            time.sleep(0.05)

    def wait_for_protection(self, agents):
        """Until every machine's keeper has protected a step (AREA/protected/<step>): its
        rounds run at idle priority, so on a loaded machine the first can come late."""
        deadline = time.monotonic() + 120
        while True:
            areas = [a for a in os.listdir(self.areas) if "-node" in a and not a.endswith(".lock")]
            done = [a for a in areas if any(p.isdigit() for p in listdir(os.path.join(self.areas, a, "protected")))]
            if len(areas) == len(agents) and len(done) == len(agents):
                return
            for a in agents:
                self.assertIsNone(a.poll(), "an agent exited before the failure was injected")
            self.assertLess(time.monotonic(), deadline, "no snapshot step was protected on every machine")
            time.sleep(0.05)

    def kill_machine(self, agent, node):
        """kill -9 of an agent and its workers; its snapshot area goes too (its memory), with
        the lock its agent held on it (AREA.lock)."""
        workers = children(agent.pid)
        agent.kill()
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        agent.communicate()
        for area in os.listdir(self.areas):
            if area.endswith(f"-node{node}"):
                shutil.rmtree(os.path.join(self.areas, area), ignore_errors=True)
            elif area.endswith(f"-node{node}.lock"):
                os.remove(os.path.join(self.areas, area))

    def finish(self, agents, survivors):
        errs = {}
        for node in survivors:
            _, err = agents[node].communicate(timeout=300)
            self.assertEqual(agents[node].returncode, 0, err[-4000:])
            errs[node] = err
        return errs

    def check_curve(self, out, ref, what, missing_allowed=0):
        rows = metrics(out)
        steps = [m["step"] for m in rows]
        self.assertEqual(steps, sorted(set(steps)))
        self.assertEqual(steps[-1], self.steps)
        self.assertLessEqual(self.steps - len(steps), missing_allowed, steps)
        diff = max_abs([m["loss"] for m in rows], [ref[m["step"] - 1] for m in rows])
        print(f"{what}: max |loss - uninterrupted loss| over {self.steps} steps = {diff:.3g}")
        self.assertLess(diff, LOSS_TOLERANCE)

    def check_as_resumed_by_hand(self, checkpoint, nproc, layout, params, what):
        """The job's final parameters (the dump `params`) are, to the bit, those of a
        `trireme train` of `nproc` workers resumed by hand from `checkpoint` (DIR/<step>,
        copied to a directory of its own) under `layout` to the end: the state the job went
        on from was that checkpoint's."""
        step = os.path.basename(checkpoint)
        resumed_ckpt = os.path.join(self.dir, "resumed-checkpoints")
        shutil.copytree(checkpoint, os.path.join(resumed_ckpt, step))
        resumed = os.path.join(self.dir, "resumed")
        proc = subprocess.run(
            [TRIREME, "train", "gpt", "--nproc-per-node", str(nproc), "--steps", str(self.steps), "--out", resumed,
             "--seed", "7", "--resume", "--checkpoint-dir", resumed_ckpt, "--dump-params", resumed + ".params"]
            + MODEL + list(layout), env=self.env, capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertIn(f"resumed at step {step} from", proc.stderr)
        diff = max_abs_diff(read_params(resumed + ".params"), read_params(params))
        print(f"  final parameters against {what}: max abs diff {diff:.3g}")
        self.assertEqual(diff, 0.0)


class Elastic(ElasticBase):
    def test_lose_a_machine_and_grow_back(self):
        # Long enough that the job is still running when the replacement has started and
        # asked to join (a node that arrives after the end is told so and does not join),
        # and that every keeper protects a step first (idle-priority rounds: 150 steps once
        # ended before that under a loaded ctest).
        self.steps = 250
        ref = self.reference()
        out = os.path.join(self.dir, "run")
        port = free_port()
        # Disk checkpoints exist too (every 5 steps): memory must serve anyway.
        extra = ["--redundancy", "2+1", "--checkpoint-every", "5"]
        agents = [self.start(n, port, out, extra) for n in range(3)]
        self.wait_for_step(out, 10, agents)
        self.wait_for_protection(agents)
        self.kill_machine(agents[2], 2)
        # A replacement under the lost node's id, once the job has gone on without it.
        self.wait_for_restart(out, agents[:2])
        replacement = self.start(2, port, out, extra)
        agents[2] = replacement
        errs = self.finish(agents, [0, 1, 2])
        print("".join(l + "\n" for l in errs[0].splitlines() if "first step done" in l or "training again" in l), end="")
        both = errs[0] + errs[1]
        self.assertIn("node 2 is lost", both)
        self.assertIn("going on with nodes 0,1", both)
        self.assertIn("rebuilt the snapshot of step", both)  # (not "... cannot be rebuilt ...")
        self.assertIn("node 2 joined the job", errs[2])
        resumes = [l for l in errs[0].splitlines() if "resumed at step" in l]
        self.assertEqual(len(resumes), 2, errs[0][-3000:])  # after the loss, after the join
        for line in resumes:
            self.assertIn("from memory", line)  # no checkpoint was read
        self.check_curve(out, ref, "3 machines, one killed at step >= 10, then a replacement joined")
        self.assertEqual(workers_alive(self.marker), [])
        self.assertEqual(os.listdir(self.areas), [])

    def test_zero_sharded_state_rebuilt_from_parity(self):
        # Under ZeRO-1 each machine holds the only copy of its third of the optimizer
        # state: after the kill, the survivors need the lost third, which only the parity
        # can give back.
        self.check_zero_rebuilt([], nproc=1)

    def check_zero_rebuilt(self, layout, nproc):
        """ZeRO-1 on 3 machines with --redundancy 2+1, machine 2 killed: dp shrinks and the
        optimizer state is re-sharded over the new data-parallel groups from the old
        ranks' pieces, wherever they are in memory (the lost machine's rebuilt from
        parity), not only from a group's own nodes. With 2 workers per machine and pp=2
        (or tp=2), dp goes from 3 to 2 for each stage (or tensor-parallel shard)."""
        # Long enough that the job cannot end before every keeper has protected a step (in a
        # loaded ctest, 40 steps once ended first: their rounds run at idle priority).
        self.steps = 120
        extra = ["--zero", "1"] + layout
        # The reference keeps a checkpoint of every step: the run after the kill must equal,
        # bit for bit, 2 machines resumed from the reference's checkpoint of the rebuilt step.
        ref_ckpt = os.path.join(self.dir, "reference-checkpoints")
        ref = self.reference(extra + ["--checkpoint-every", "1", "--keep-checkpoints", str(self.steps),
                                      "--checkpoint-dir", ref_ckpt], nproc=nproc)
        out = os.path.join(self.dir, "run")
        port = free_port()
        agents = [self.start(n, port, out, extra + ["--redundancy", "2+1", "--dump-params", out + ".params"],
                             nproc=nproc) for n in range(3)]
        self.wait_for_step(out, 12, agents)
        self.wait_for_protection(agents)
        self.kill_machine(agents[2], 2)
        errs = self.finish(agents, [0, 1])
        both = errs[0] + errs[1]
        self.assertIn("going on with nodes 0,1", both)
        self.assertIn("rebuilt the snapshot of step", both)
        rebuilt = int(both.split("rebuilt the snapshot of step ")[1].split()[0])
        self.assertIn(f"resumed at step {rebuilt} from memory", errs[0])
        self.assertNotIn("checkpoint", both)
        self.check_curve(out, ref, f"ZeRO-1 {' '.join(layout) or 'dp only'}, {nproc} worker(s) per machine, one "
                         f"machine killed, optimizer state rebuilt from parity and re-sharded (step {rebuilt})")
        # The same 2 machines resumed from the reference's checkpoint of that step: the state
        # rebuilt from parity and re-sharded must be that checkpoint's, to the bit.
        self.check_as_resumed_by_hand(os.path.join(ref_ckpt, str(rebuilt)), 2 * nproc, extra, out + ".params",
                                      f"2 machines resumed from the checkpoint of step {rebuilt}")
        self.assertEqual(workers_alive(self.marker), [])

    def test_zero_resharded_under_pipeline(self):
        self.check_zero_rebuilt(["--pp", "2"], nproc=2)

    def test_zero_resharded_under_tensor_parallelism(self):
        self.check_zero_rebuilt(["--tp", "2"], nproc=2)

    def test_node_zero_may_be_lost_with_a_store_of_its_own(self):
        store = subprocess.Popen([TRIREME, "store", "--port", "0"], stdout=subprocess.PIPE, text=True)
        self.procs.append(store)
        port = store_port(store)
        ref = self.reference()
        out = os.path.join(self.dir, "run")
        agents = [self.start(n, port, out, ["--rdzv-external"]) for n in range(3)]
        self.wait_for_step(out, 10, agents)
        self.kill_machine(agents[0], 0)
        errs = self.finish(agents, [1, 2])
        self.assertIn("node 0 is lost", errs[1] + errs[2])
        self.assertIn("going on with nodes 1,2", errs[1] + errs[2])
        # Rank 0 writes metrics.jsonl: the line of the last step node 0 finished can die with
        # it while that step's state lives on in the others' snapshots (the job then goes on
        # from the step after it), so one line may be missing.
        self.check_curve(out, ref, "store apart, node 0 killed at step >= 10", missing_allowed=1)
        store.send_signal(signal.SIGTERM)
        self.assertEqual(store.wait(timeout=30), 0)

    def test_a_lost_worker_process_resumes_bit_for_bit(self):
        # Elastic, but the membership stays: one worker is killed and its machine's agent
        # lives on, so every rank finds its own snapshot of the chosen step, with its
        # generators and gradient-bucket layout. With 3 replicas (where the buckets decide
        # the order of the all-reduce's sums) the run is then the uninterrupted one bit for bit.
        ref_dump = os.path.join(self.dir, "reference.params")
        ref = self.reference(["--dump-params", ref_dump])
        out = os.path.join(self.dir, "run")
        dump = os.path.join(self.dir, "run.params")
        port = free_port()
        agents = [self.start(n, port, out, ["--dump-params", dump]) for n in range(3)]
        kill_at = random.randint(5, STEPS // 2)
        self.wait_for_step(out, kill_at, agents)
        victims = [pid for pid in children(agents[1].pid) if is_worker(pid)]
        self.assertEqual(len(victims), 1, "node 1's worker was not found")
        os.kill(victims[0], signal.SIGKILL)
        errs = self.finish(agents, [0, 1, 2])
        resumes = [l for l in errs[0].splitlines() if "resumed at step" in l]
        self.assertEqual(len(resumes), 1, errs[0][-3000:])
        print(f"node 1's worker killed after step >= {kill_at}; {resumes[0].strip()}")
        self.assertIn("from memory", resumes[0])
        self.assertEqual([m["loss"] for m in metrics(out)], ref)
        with open(ref_dump, "rb") as a, open(dump, "rb") as b:
            self.assertTrue(a.read() == b.read(), "final parameters differ from the uninterrupted run "
                            f"(max abs diff {max_abs_diff(read_params(ref_dump), read_params(dump)):.3g})")
        self.assertEqual(workers_alive(self.marker), [])
        self.assertEqual(os.listdir(self.areas), [])

    def test_preemption_notice(self):
        self.preempt([], "replicated state")

    def test_preemption_notice_keeps_the_last_step_of_sharded_state(self):
        # Under ZeRO-1 the leaving machine's third of the optimizer state is nowhere else:
        # it flushes its last step into the parity before it goes, and the others rebuild it.
        errs = self.preempt(["--zero", "1", "--redundancy", "2+1"], "ZeRO-1, its shard rebuilt from parity")
        self.assertIn("rebuilt the snapshot of step", errs[0] + errs[2])

    def preempt(self, extra, what):
        ref = self.reference(extra)
        out = os.path.join(self.dir, "run")
        port = free_port()
        agents = [self.start(n, port, out, ["--grace-seconds", "20"] + extra) for n in range(3)]
        self.wait_for_step(out, 8, agents)
        notice = time.monotonic()
        agents[1].send_signal(signal.SIGTERM)
        _, err1 = agents[1].communicate(timeout=60)
        left_after = time.monotonic() - notice
        self.assertEqual(agents[1].returncode, 0, err1[-3000:])
        self.assertIn("preemption notice", err1)
        errs = self.finish(agents, [0, 2])
        errs[1] = err1
        self.assertIn("node 1 left the job", errs[0] + errs[2])
        # The last step rank 0 finished before the restart (its progress lines) must be
        # the one the job resumed at. (The leaving worker says where it stopped when the
        # notice reached it before a peer had stopped; else its next collective broke.)
        before, _, after = errs[0].partition("restarting the workers")
        finished = max(int(l.split("step")[1].split("/")[0]) for l in before.splitlines()
                       if l.startswith("[0] step") and "/" in l)
        resumed = [int(l.split("resumed at step ")[1].split()[0]) for l in after.splitlines()
                   if "resumed at step" in l]
        stopped = [int(l.split("stopped after step ")[1].split()[0]) for l in err1.splitlines()
                   if "stopped after step" in l]
        print(f"preemption notice ({what}): node 1 left {left_after:.2f} s after SIGTERM (grace 20 s); "
              f"last step finished {finished}, the others resumed at step {resumed[0]}"
              + (f", node 1's worker stopped after step {stopped[0]}" if stopped else ""))
        self.assertLess(left_after, 20)
        self.assertEqual(resumed, [finished], "a finished step was lost")
        for step in stopped:
            self.assertEqual(step, finished)
        for line in err1.splitlines():  # snapshots every step: its newest is the step it stopped after
            if "stopped after step" in line:
                self.assertIn(f"its snapshot of step {finished} committed", line)
        self.assertEqual([m["step"] for m in metrics(out)], list(range(1, STEPS + 1)))
        # The state the others went on from was the job's, not merely its step number.
        self.check_curve(out, ref, f"preemption notice ({what}), node 1 left after step {finished}")
        self.assertEqual(workers_alive(self.marker), [])
        return errs

    def test_losing_more_than_the_redundancy_falls_back_to_disk(self):
        # 2 workers per machine, pp=2, dp=3: stage 1 of every replica lives on nodes 1 and 2
        # (ranks 3..5 under the tp-dp-pp order). Losing both loses stage 1 from memory.
        # Long enough that the job cannot end before every keeper has protected a step: on
        # a loaded machine their idle-priority rounds can come late.
        self.steps = 200
        out = os.path.join(self.dir, "run")
        ckpt = os.path.join(self.dir, "ckpt")
        port = free_port()
        extra = ["--pp", "2", "--redundancy", "2+1", "--checkpoint-every", "5", "--checkpoint-dir", ckpt,
                 "--keep-checkpoints", str(self.steps // 5), "--dump-params", out + ".params"]
        agents = [self.start(n, port, out, extra, nproc=2, nnodes="1:3") for n in range(3)]
        self.wait_for_step(out, 12, agents)
        self.wait_for_protection(agents)
        self.kill_machine(agents[1], 1)
        self.kill_machine(agents[2], 2)
        errs = self.finish(agents, [0])
        self.assertIn("cannot be rebuilt from memory", errs[0])
        self.assertIn("resuming from the newest checkpoint", errs[0])
        self.assertIn(f"from {ckpt}", errs[0])
        self.assertEqual([m["step"] for m in metrics(out)], list(range(1, self.steps + 1)))
        # The checkpoint served whole: one machine resumed from it by hand, on the layout
        # the job went on with (dp 1 x pp 2), ends where the job ended, to the bit.
        from_disk = [l for l in errs[0].splitlines() if "resumed at step" in l and f"from {ckpt}" in l]
        step = int(from_disk[-1].split("resumed at step ")[1].split()[0])
        self.check_as_resumed_by_hand(os.path.join(ckpt, str(step)), 2, ["--pp", "2"], out + ".params",
                                      f"one machine resumed by hand from the checkpoint of step {step} fallen back to")


if __name__ == "__main__":
    main()
