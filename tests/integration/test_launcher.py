#!/usr/bin/env python3
"""End-to-end tests of `trireme run` (the launcher) with real processes.

Workers are Python one-liners (sys.executable). Every test uses ephemeral ports, waits on
events (output lines, process exits through pidfds) rather than sleeping, and leaves no
process behind. Needs TRIREME_BIN (the trireme CLI).
"""
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from common import free_port, main, stop, store_port

TRIREME = os.environ.get("TRIREME_BIN", "trireme")
PY = sys.executable
TIMEOUT = 60
# How soon a job whose workers sleep 120 s (SLEEPER, the crash tests) must end once one
# failed or a signal came: half of that sleep, so a job that waits it out fails, while a
# loaded 2-core machine's slow start-up and teardown pass.
FAIL_FAST_S = 60

ENV_KEYS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
            "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS"]

# Prints its torchrun variables as JSON, after checking the agent's store accepts a
# connection at MASTER_ADDR:MASTER_PORT.
ENV_WORKER = (
    "import json, os, socket\n"
    "s = socket.create_connection((os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])), 10)\n"
    "s.close()\n"
    f"print(json.dumps({{k: os.environ.get(k) for k in {ENV_KEYS!r}}}))\n")

# Announces its pid, then sleeps until stopped.
SLEEPER = ("import os, sys, time\n"
           "print('ready', os.getpid(), flush=True)\n"
           "time.sleep(120)\n")


def env_without_omp():
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    return env


def launcher_cmd(flags, program):
    return [TRIREME, "run", *flags, "--", *program]


def run(flags, program, timeout=TIMEOUT, env=None):
    start = time.monotonic()
    p = subprocess.run(launcher_cmd(flags, program), capture_output=True, text=True,
                       timeout=timeout, env=env)
    return p.returncode, p.stdout, p.stderr, time.monotonic() - start


def start(test, flags, program, env=None):
    """The launcher as a child; killed and reaped when `test` ends, if still running (a
    failed assertion must not leave it and its workers behind)."""
    proc = subprocess.Popen(launcher_cmd(flags, program), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    test.addCleanup(stop, proc)
    return proc


def json_lines(stdout):
    """{rank: env} from lines '[r] {...}'."""
    out = {}
    for line in stdout.splitlines():
        prefix, _, body = line.partition("] ")
        out[int(prefix.lstrip("["))] = json.loads(body)
    return out


def read_ready_pids(proc, n):
    pids = []
    while len(pids) < n:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError("launcher ended before its workers were ready: "
                                 + proc.stderr.read())
        if " ready " in line:
            pids.append(int(line.split()[-1]))
    return pids


def wait_pids_gone(pids, timeout):
    """True when every pid has exited within timeout (pidfds: no polling loops)."""
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            pass
    try:
        deadline = time.monotonic() + timeout
        pending = list(fds)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select(pending, [], [], left)
            pending = [fd for fd in pending if fd not in ready]
        return True
    finally:
        for fd in fds:
            os.close(fd)


def one_line(text):
    lines = [l for l in text.splitlines() if l.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got: {text!r}"
    return lines[0]


class Environment(unittest.TestCase):
    def test_one_node_three_workers(self):
        rc, out, err, _ = run(["--nproc-per-node", "3"], [PY, "-c", ENV_WORKER],
                              env=env_without_omp())
        self.assertEqual(rc, 0, err)
        ranks = json_lines(out)
        self.assertEqual(sorted(ranks), [0, 1, 2])
        run_ids = set()
        for r, env in ranks.items():
            self.assertEqual(env["RANK"], str(r))
            self.assertEqual(env["LOCAL_RANK"], str(r))
            self.assertEqual(env["ROLE_RANK"], str(r))
            self.assertEqual(env["WORLD_SIZE"], "3")
            self.assertEqual(env["ROLE_WORLD_SIZE"], "3")
            self.assertEqual(env["LOCAL_WORLD_SIZE"], "3")
            self.assertEqual(env["GROUP_RANK"], "0")
            self.assertEqual(env["MASTER_ADDR"], "127.0.0.1")
            self.assertNotEqual(env["MASTER_PORT"], "0")
            self.assertEqual(env["TORCHELASTIC_RESTART_COUNT"], "0")
            self.assertEqual(env["TORCHELASTIC_USE_AGENT_STORE"], "True")
            self.assertEqual(env["OMP_NUM_THREADS"], "1")
            run_ids.add(env["TORCHELASTIC_RUN_ID"])
        self.assertEqual(len(run_ids), 1)

    def test_two_agents_form_one_job(self):
        port = free_port()
        common = ["--nproc-per-node", "2", "--nnodes", "2", "--rdzv", f"127.0.0.1:{port}"]
        agents = [start(self, common + ["--node-rank", str(r)], [PY, "-c", ENV_WORKER])
                  for r in (0, 1)]
        results = [a.communicate(timeout=TIMEOUT) for a in agents]
        for agent, (out, err) in zip(agents, results):
            self.assertEqual(agent.returncode, 0, err)
        ranks = {}
        for out, _ in results:
            ranks.update(json_lines(out))
        self.assertEqual(sorted(ranks), [0, 1, 2, 3])
        for r, env in ranks.items():
            self.assertEqual(env["RANK"], str(r))
            self.assertEqual(env["WORLD_SIZE"], "4")
            self.assertEqual(env["GROUP_RANK"], str(r // 2))
            self.assertEqual(env["LOCAL_RANK"], str(r % 2))
            self.assertEqual(env["MASTER_PORT"], str(port))
        self.assertEqual(len({env["TORCHELASTIC_RUN_ID"] for env in ranks.values()}), 1)


class Output(unittest.TestCase):
    def test_lines_are_prefixed_by_rank_and_streams_kept_apart(self):
        prog = ("import os, sys\n"
                "r = os.environ['RANK']\n"
                "sys.stdout.write('hello ' + r + '\\npartial ' + r); sys.stdout.flush()\n"
                "sys.stderr.write('oops ' + r + '\\n')\n"
                "if r == '0': sys.stdout.write('\\rstep 1\\rstep 2\\n')\n")
        # bytes, not text: text mode would turn the '\r' under test into '\n'
        p = subprocess.run(launcher_cmd(["--nproc-per-node", "2"], [PY, "-c", prog]),
                           capture_output=True, timeout=TIMEOUT)
        self.assertEqual(p.returncode, 0, p.stderr)
        out, err = p.stdout.decode(), p.stderr.decode()
        for r in ("0", "1"):
            self.assertIn(f"[{r}] hello {r}\n", out)
            self.assertIn(f"[{r}] oops {r}\n", err)
            self.assertNotIn("oops", out)
        self.assertIn("[1] partial 1\n", out)
        self.assertIn("[0] partial 0\r[0] step 1\r[0] step 2\n", out)
        for line in out.replace("\r", "\n").splitlines():
            self.assertRegex(line, r"^\[[01]\] ")

    def test_tty_flag_unset_when_stderr_is_not_a_terminal(self):
        rc, out, _, _ = run([], [PY, "-c", "import os; print(os.environ.get('TRIREME_TTY'))"])
        self.assertEqual((rc, out), (0, "[0] None\n"))


# A worker that says its pid, leaves a file named after its rank in the folder argv[1], and
# sleeps; rank CRASHER (argv[2]) first waits (up to 60 s) until all WORLD_SIZE files exist,
# so that every pid is known before it does what argv[3] says.
CRASH_WHEN_ALL_READY = (
    "import os, sys, time\n"
    "print('ready', os.getpid(), flush=True)\n"
    "open(os.path.join(sys.argv[1], os.environ['RANK']), 'w').close()\n"
    "if os.environ['RANK'] == sys.argv[2]:\n"
    "    deadline = time.monotonic() + 60\n"
    "    while len(os.listdir(sys.argv[1])) < int(os.environ['WORLD_SIZE']) and time.monotonic() < deadline:\n"
    "        time.sleep(0.01)\n"
    "    exec(sys.argv[3])\n"
    "time.sleep(120)\n")


class Failures(unittest.TestCase):
    def ready_dir(self):
        path = tempfile.mkdtemp(prefix="trireme-ready-")
        self.addCleanup(shutil.rmtree, path, ignore_errors=True)
        return path

    def gone(self, pids):
        """Whether every worker ended within 5 s of its agent; the ones left are killed."""
        def kill_left():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.addCleanup(kill_left)
        return wait_pids_gone(pids, 5)

    def check_crash(self, crash, phrase):
        rc, out, err, elapsed = run(["--nproc-per-node", "3"], [PY, "-c", CRASH_WHEN_ALL_READY, self.ready_dir(),
                                                                  "1", crash])
        self.assertNotEqual(rc, 0)
        # Well under the other workers' 120 s sleep (what a job not stopped would wait out),
        # with room for a loaded machine.
        self.assertLess(elapsed, FAIL_FAST_S)
        self.assertEqual(one_line(err),
                         f"trireme run: rank 1 (node 0, local 1) {phrase}; "
                         "stopped the other workers")
        # The other workers were stopped, not left running (each said its pid first).
        pids = [int(pid) for pid in re.findall(r"ready (\d+)", out)]
        self.assertEqual(len(pids), 3, out)
        self.assertTrue(self.gone(pids), "a worker outlived its agent")

    def test_a_reader_gone_does_not_change_the_exit_status(self):
        """`trireme run ... 2>&1 | head` whose reader has gone: the job's last line cannot be
        written, and the status is still the job's (before, SIGPIPE's: 141)."""
        # (The worker writes to both streams, so the agent's forwarding meets the closed pipes too.)
        proc = subprocess.Popen(launcher_cmd(["--nproc-per-node", "1"],
                                             ["sh", "-c", "echo out; echo err >&2; exit 3"]),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.addCleanup(stop, proc)
        proc.stdout.close()
        proc.stderr.close()
        self.assertEqual(proc.wait(timeout=TIMEOUT), 1)

    def test_worker_exit_code_stops_the_job(self):
        self.check_crash("sys.exit(3)", "exited with code 3")

    def test_worker_killed_by_signal_stops_the_job(self):
        self.check_crash("os.kill(os.getpid(), 9)", "was killed by signal 9 (SIGKILL)")

    def test_crash_on_node_one_stops_node_zero(self):
        port = free_port()
        common = ["--nproc-per-node", "2", "--nnodes", "2", "--rdzv", f"127.0.0.1:{port}"]
        ready = self.ready_dir()
        begin = time.monotonic()
        agents = [start(self, common + ["--node-rank", str(r)], [PY, "-c", CRASH_WHEN_ALL_READY, ready, "3",
                                                                 "sys.exit(3)"]) for r in (0, 1)]
        results = [a.communicate(timeout=TIMEOUT) for a in agents]
        self.assertLess(time.monotonic() - begin, FAIL_FAST_S)  # not the workers' 120 s sleep
        failed = "rank 3 (node 1, local 1) exited with code 3"
        self.assertNotEqual(agents[1].returncode, 0)
        self.assertEqual(one_line(results[1][1]),
                         f"trireme run: {failed}; stopped the other workers")
        self.assertNotEqual(agents[0].returncode, 0)
        self.assertEqual(one_line(results[0][1]),
                         f"trireme run: {failed}; stopped the workers of node 0")
        # Every worker said its pid before rank 3 failed: all of them were stopped.
        pids = [int(pid) for out, _ in results for pid in re.findall(r"ready (\d+)", out)]
        self.assertEqual(len(pids), 4, results)
        self.assertTrue(self.gone(pids), "a worker outlived its agent")


def own_snapshot_root(test):
    """Points the agents `test` starts at a snapshot root of its own, removed when it ends:
    an agent killed with -9 cannot remove its area, which would otherwise stay in /dev/shm
    until some later agent's sweep."""
    root = tempfile.mkdtemp(prefix="trireme-areas-")
    previous = os.environ.get("TRIREME_SNAPSHOT_ROOT")
    os.environ["TRIREME_SNAPSHOT_ROOT"] = root

    def restore():
        if previous is None:
            os.environ.pop("TRIREME_SNAPSHOT_ROOT", None)
        else:
            os.environ["TRIREME_SNAPSHOT_ROOT"] = previous
        shutil.rmtree(root, ignore_errors=True)
    test.addCleanup(restore)


class Signals(unittest.TestCase):
    def setUp(self):
        own_snapshot_root(self)
    def start_sleepers(self, n):
        proc = start(self, ["--nproc-per-node", str(n)], [PY, "-c", SLEEPER])
        return proc, read_ready_pids(proc, n)

    def test_sigterm_reaches_every_worker(self):
        proc, pids = self.start_sleepers(2)
        begin = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=TIMEOUT)
        self.assertEqual(proc.returncode, 128 + signal.SIGTERM)
        self.assertLess(time.monotonic() - begin, FAIL_FAST_S)  # not the workers' 120 s sleep
        self.assertEqual(one_line(err), "trireme run: received SIGTERM; stopped the workers of node 0")
        self.assertTrue(wait_pids_gone(pids, 1))

    def test_sigint_reaches_every_worker(self):
        proc, pids = self.start_sleepers(2)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=TIMEOUT)
        self.assertEqual(proc.returncode, 128 + signal.SIGINT)
        self.assertTrue(wait_pids_gone(pids, 1))

    def test_a_worker_writing_without_pause_does_not_hold_the_agent(self):
        """A worker keeps a 1 MiB pipe full (like `yes`, faster than the agent forwards):
        SIGINT still ends the job within seconds (before, the agent read the pipe until it
        was empty, which it never was, and handled no signal)."""
        prog = ("import fcntl, os\n"
                "fcntl.fcntl(1, fcntl.F_SETPIPE_SZ, 1 << 20)  # 16 of the agent's reads\n"
                "print('ready', os.getpid(), flush=True)\n"
                "lines = b'y\\n' * 32768\n"
                "while True: os.write(1, lines)\n")
        proc = start(self, [], [PY, "-c", prog])
        pids = read_ready_pids(proc, 1)
        fd = proc.stdout.fileno()
        drain = threading.Thread(target=lambda: [None for _ in iter(lambda: os.read(fd, 1 << 16), b"")])
        drain.start()
        try:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.fail("the agent did not end within 10 s of SIGINT while its worker wrote without pause")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            drain.join()
        self.assertEqual(proc.returncode, 128 + signal.SIGINT)
        self.assertEqual(one_line(proc.stderr.read()), "trireme run: received SIGINT; stopped the workers of node 0")
        self.assertTrue(wait_pids_gone(pids, 1))

    def test_stopping_signals_give_the_workers_sigterm_and_remove_the_area(self):
        """SIGTERM, SIGINT, SIGHUP (the terminal went away) and SIGQUIT stop the job alike:
        the workers get SIGTERM (not the signal the agent received), and the node's snapshot
        area goes (before, SIGHUP and SIGQUIT killed the agent at once and left the area in
        /dev/shm)."""
        prog = ("import os, signal, sys, time\n"
                "area = os.environ['TRIREME_SNAPSHOT_DIR']\n"
                "os.makedirs(os.path.join(area, 'rank-' + os.environ['RANK']))\n"
                "def stopped(sig, frame):\n"
                "    print('got', signal.Signals(sig).name, flush=True)\n"
                "    sys.exit(0)\n"
                "signal.signal(signal.SIGTERM, stopped)\n"
                "print('ready', area, os.getpid(), flush=True)\n"
                "time.sleep(120)\n")
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            with self.subTest(signal=sig.name):
                proc = start(self, ["--nproc-per-node", "2"], [PY, "-c", prog])
                lines = [proc.stdout.readline(), proc.stdout.readline()]
                if not all(" ready " in line for line in lines):
                    self.fail(f"the workers did not start: {lines} {proc.communicate(timeout=TIMEOUT)}")
                area = lines[0].split()[-2]
                self.addCleanup(shutil.rmtree, area, ignore_errors=True)
                self.assertTrue(os.path.isdir(area), area)
                proc.send_signal(sig)
                out, err = proc.communicate(timeout=TIMEOUT)
                self.assertEqual(proc.returncode, 128 + sig, err)
                self.assertEqual(one_line(err), f"trireme run: received {sig.name}; stopped the workers of node 0")
                self.assertEqual(sorted(out.splitlines()), ["[0] got SIGTERM", "[1] got SIGTERM"])
                self.assertTrue(wait_pids_gone([int(line.split()[-1]) for line in lines], 1))
                self.assertFalse(os.path.exists(area), "the snapshot area was left behind")

    def test_sighup_ignored_by_nohup_stays_ignored(self):
        """Started under nohup (SIGHUP ignored), the agent and its workers ride out a hangup
        and the job finishes normally (without the nohup, SIGHUP stops it: test above)."""
        prog = ("import os, signal\n"
                "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])\n"
                "print('ready', signal.getsignal(signal.SIGHUP) == signal.SIG_IGN, os.getpid(), flush=True)\n"
                "signal.sigwait([signal.SIGUSR1])\n")
        proc = subprocess.Popen(launcher_cmd(["--nproc-per-node", "1"], [PY, "-c", prog]), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
        self.addCleanup(stop, proc)
        line = proc.stdout.readline().split()
        self.assertEqual(line[1:3], ["ready", "True"], line)  # the worker ignores it too
        proc.send_signal(signal.SIGHUP)
        os.kill(int(line[3]), signal.SIGUSR1)  # (after the hangup: the job then ends by itself)
        out, err = proc.communicate(timeout=TIMEOUT)
        self.assertEqual(proc.returncode, 0, err)

    def test_kill_9_of_the_launcher_leaves_no_orphan(self):
        proc, pids = self.start_sleepers(2)
        proc.kill()
        proc.communicate(timeout=TIMEOUT)
        self.assertTrue(wait_pids_gone(pids, 10), "workers outlived a kill -9 of the launcher")

    def test_kill_9_of_the_launcher_leaves_no_grandchild(self):
        """A process a worker started (a shell's command, a launcher's child) has no
        PR_SET_PDEATHSIG of its own: the agent's guard (launch/group_guard.h) kills the
        workers' process groups when the agent is killed (before, such a process ran on)."""
        prog = ("import os, subprocess, time\n"
                "child = subprocess.Popen(['sleep', '300'])\n"
                "print('ready', os.getpid(), child.pid, flush=True)\n"
                "time.sleep(120)\n")
        proc = start(self, ["--nproc-per-node", "2"], [PY, "-c", prog])
        pids = []
        for _ in range(2):
            line = proc.stdout.readline().split()
            self.assertEqual(line[1:2], ["ready"], line)
            pids += [int(line[2]), int(line[3])]
        self.addCleanup(lambda: [os.kill(p, signal.SIGKILL) for p in pids if os.path.exists(f"/proc/{p}")])
        proc.kill()
        proc.communicate(timeout=TIMEOUT)
        self.assertTrue(wait_pids_gone(pids, 10), "a worker or a process it started outlived a kill -9 of the launcher")


class ExternalStore(unittest.TestCase):
    def test_a_store_serves_one_job(self):
        """A second job against the `trireme store` of one that ended (in success or in
        failure) is refused with one line saying to start a fresh store (before: 'another
        agent already joined ... as --node-rank 0', the first job's keys being still there).
        SIGHUP stops the store as SIGINT and SIGTERM do."""
        for first in ("true", "false"):
            with self.subTest(first_job=first):
                store = subprocess.Popen([TRIREME, "store", "--port", "0"], stdout=subprocess.PIPE, text=True)
                self.addCleanup(stop, store)
                port = store_port(store)
                flags = ["--rdzv", f"127.0.0.1:{port}", "--rdzv-external"]
                rc, _, err, _ = run(flags, [first])
                self.assertEqual(rc, 0 if first == "true" else 1, err)
                rc, out, err, _ = run(flags, ["true"])
                self.assertEqual((rc, out), (1, ""))
                self.assertEqual(one_line(err), f"trireme run: the rendezvous store at 127.0.0.1:{port} already "
                                                "served a job, which has ended; start a fresh `trireme store` for "
                                                "each job")
                # A second store on the same port: its own flag named (before: --rdzv).
                again = subprocess.run([TRIREME, "store", "--port", str(port)], capture_output=True, text=True,
                                       timeout=TIMEOUT)
                self.assertEqual(again.returncode, 2, again.stderr)
                self.assertEqual(one_line(again.stderr), f"trireme store: error: --port {port} is already in use on "
                                                         "this machine; pick a free port, or 0 for an ephemeral one")
                store.send_signal(signal.SIGHUP)
                self.assertEqual(store.wait(timeout=30), 0)
                self.assertIn("trireme store: stopped by SIGHUP", store.stdout.read())


class Membership(unittest.TestCase):
    def setUp(self):
        own_snapshot_root(self)

    def test_a_lost_machine_is_seen_by_the_two_agents_before_it(self):
        """Five agents (emulated machines) of an elastic job; node 3's agent is killed with
        kill -9 (its worker dies with it). Each agent watches only the two members after it
        (the store's reads grow as n, not n^2), so nodes 1 and 2 see the loss and restart
        the job, and nodes 0 and 4 follow it from the store. The job goes on with four."""
        port = free_port()
        common = ["--nproc-per-node", "1", "--nnodes", "4:5", "--rdzv", f"127.0.0.1:{port}",
                  "--max-restarts", "1", "--node-timeout", "1"]
        prog = ("import os, time\n"
                "print('restart', os.environ['TORCHELASTIC_RESTART_COUNT'], 'ready', os.getpid(), flush=True)\n"
                "if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0': time.sleep(120)\n")
        agents = [start(self, common + ["--node-rank", str(r)], [PY, "-c", prog]) for r in range(5)]
        pids = [read_ready_pids(agent, 1)[0] for agent in agents]
        begin = time.monotonic()
        agents[3].kill()
        agents[3].communicate(timeout=TIMEOUT)
        results = {r: agents[r].communicate(timeout=TIMEOUT) for r in (0, 1, 2, 4)}
        self.assertLess(time.monotonic() - begin, FAIL_FAST_S)  # not the workers' 120 s sleep
        self.assertTrue(wait_pids_gone([pids[3]], 5))  # node 3's worker died with its agent
        lost = "node 3 is lost (no heartbeat for 1 s)"
        seen_here = {r for r, (_, err) in results.items() if f"{lost}; restarting" in err}
        for r, (out, err) in results.items():
            self.assertEqual(agents[r].returncode, 0, err)
            self.assertRegex(out, r"restart 1 ready \d+")  # its worker of restart 1 ran
            if r not in seen_here:
                self.assertIn(f"{lost} (on another node); restarting", err)
        print("the loss was seen by nodes", sorted(seen_here))
        self.assertTrue(seen_here)
        self.assertLessEqual(seen_here, {1, 2})


class BadInput(unittest.TestCase):
    def check_refused(self, flags, program, words):
        rc, out, err, _ = run(flags, program, timeout=30)
        self.assertNotEqual(rc, 0)
        self.assertEqual(out, "")
        line = one_line(err)
        self.assertTrue(line.startswith("trireme run: "), line)
        self.assertIn(words, line)

    def test_unknown_flag(self):
        self.check_refused(["--nproc-per-nod", "2"], ["true"], "unknown flag --nproc-per-nod")

    def test_missing_program(self):
        self.check_refused(["--nproc-per-node", "2"], [], "missing the program")

    def test_program_without_dashdash(self):
        p = subprocess.run([TRIREME, "run", "true"], capture_output=True, text=True,
                           timeout=30)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("put the program after '--'", one_line(p.stderr))

    def test_nproc_below_one(self):
        self.check_refused(["--nproc-per-node", "0"], ["true"], "--nproc-per-node")

    def test_node_rank_out_of_range(self):
        self.check_refused(["--nnodes", "2", "--node-rank", "2", "--rdzv", f"127.0.0.1:{free_port()}"],
                           ["true"], "--node-rank")

    def test_multi_node_needs_rdzv(self):
        self.check_refused(["--nnodes", "2"], ["true"], "--rdzv")

    def test_malformed_rdzv(self):
        self.check_refused(["--rdzv", "localhost"], ["true"], "HOST:PORT")
        self.check_refused(["--rdzv", "localhost:http"], ["true"], "--rdzv")
        self.check_refused(["--rdzv", "localhost:70000"], ["true"], "0..65535")

    def test_port_in_use(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            self.check_refused(["--nnodes", "2", "--node-rank", "0",
                                "--rdzv", f"127.0.0.1:{port}"], ["true"],
                               f"--rdzv port {port} is already in use")

    def test_nonexistent_program(self):
        self.check_refused([], ["/nonexistent/trireme-worker"],
                           "cannot execute '/nonexistent/trireme-worker'")
        self.check_refused([], ["no-such-program-trireme"], "no-such-program-trireme")

    def test_join_timeout_names_the_count(self):
        self.check_refused(["--nnodes", "2", "--node-rank", "0", "--join-timeout", "1",
                            "--rdzv", f"127.0.0.1:{free_port()}"], ["true"],
                           "1 of 2 joined")

    def test_an_unreachable_store_is_one_line(self):
        # Before: c10's [E] and [W] log lines and a backtrace of 15 frames, 40 lines in all.
        self.check_refused(["--nnodes", "2", "--node-rank", "1", "--join-timeout", "1",
                            "--rdzv", f"127.0.0.1:{free_port()}"], ["true"],
                           "could not reach the rendezvous store at 127.0.0.1:")


if __name__ == "__main__":
    main()
