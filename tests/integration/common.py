"""Shared helpers for the integration tests: where the binaries are, running the CLI with
a deadline, reading metrics and parameter dumps. The tests run real processes."""
import atexit
import json
import math
import os
import random
import select
import shutil
import signal
import struct
import subprocess
import socket
import sys
import tempfile
import time
import unittest

TRIREME = os.environ.get("TRIREME_BIN", "build/trireme")
# Every run of the suite fails if its data-parallel replicas end with different parameters
# (by default `trireme train` reports it: replicas on different hardware may round apart).
os.environ.setdefault("TRIREME_REPLICA_CHECK", "strict")
SOURCE = os.environ.get("TRIREME_SOURCE", os.getcwd())


def run(args, timeout=300, env=None, check=True):
    """Runs trireme with args; returns the CompletedProcess (text mode)."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1")
    full_env.update(env or {})
    proc = subprocess.run([TRIREME] + args, capture_output=True, text=True, timeout=timeout,
                          env=full_env)
    if check and proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise AssertionError(f"trireme {' '.join(args)} exited {proc.returncode}")
    return proc


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


LAYOUT_FLAGS = {"--dp": ("dp", int), "--tp": ("tp", int), "--pp": ("pp", int), "--zero": ("zero", int),
                "--micro-batches": ("micro_batches", int), "--chunks": ("chunks", int),
                "--schedule": ("schedule", str), "--replica-batches": ("replica_batches", str)}


def assert_ran(test, run_dir, nproc, args):
    """The run in run_dir ran as `args` asked (run.json): each layout flag among args has
    its value there, and one entry per rank came back, its data-parallel and pipeline
    coordinates covering their axes. A flag ignored would otherwise compare another run
    with the reference (and pass: every layout equals it)."""
    with open(os.path.join(run_dir, "run.json")) as f:
        ran = json.load(f)
    args = list(args)
    for flag, (field, kind) in LAYOUT_FLAGS.items():
        if flag in args:
            test.assertEqual(ran[field], kind(args[args.index(flag) + 1]), f"{flag} in run.json")
    test.assertEqual(len(ran["ranks"]), nproc, "one entry per rank in run.json")
    test.assertEqual(ran["dp"] * ran["tp"] * ran["pp"], nproc)
    test.assertEqual(sorted({r["dp"] for r in ran["ranks"]}), list(range(ran["dp"])))
    test.assertEqual(sorted({r["stage"] for r in ran["ranks"]}), list(range(ran["pp"])))
    return ran


def read_params(path):
    """Reads a --dump-params file: {name: list of float32 values}."""
    out = {}
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at < len(data):
        (name_len,) = struct.unpack_from("<I", data, at)
        at += 4
        name = data[at:at + name_len].decode()
        at += name_len
        (count,) = struct.unpack_from("<Q", data, at)
        at += 8
        out[name] = struct.unpack_from(f"<{count}f", data, at)
        at += 4 * count
    return out


def worst(values):
    """The largest of values (non-negative: differences), 0.0 when there is none, and
    math.inf when any is NaN: Python's max() keeps a NaN only when it comes first, so a
    NaN difference would otherwise pass a tolerance check."""
    out = 0.0
    for v in values:
        v = float(v)
        if math.isnan(v):
            return math.inf
        out = max(out, v)
    return out


def max_abs(xs, ys):
    """max |x - y| over the pairs (see worst: math.inf when one is NaN)."""
    return worst(abs(x - y) for x, y in zip(xs, ys))


def max_abs_diff(a, b):
    """max |a - b| over parameter dumps {name: values} (math.inf when one is NaN)."""
    assert a.keys() == b.keys(), f"parameter names differ: {sorted(a) } vs {sorted(b)}"
    for name in a:
        assert len(a[name]) == len(b[name]), name
    return worst(max_abs(a[name], b[name]) for name in a)


def stop(proc):
    """Kills proc (with its process group, when it leads one: started with
    start_new_session) if it is still running, reaps it and closes its pipes. For
    addCleanup right after a Popen: a test that fails early leaves no job running."""
    if proc.poll() is None:
        try:
            if os.getpgid(proc.pid) == proc.pid:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        except ProcessLookupError:
            pass
        proc.wait(timeout=60)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe:
            pipe.close()


def temp_dir():
    """A fresh directory, removed when the test process exits."""
    path = tempfile.mkdtemp(prefix="trireme-test-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def workers_alive(marker):
    """PIDs of processes whose command line contains marker."""
    alive = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    alive.append(int(pid))
        except OSError:
            pass
    return alive


def free_port():
    """A TCP port of 127.0.0.1 that nothing used a moment ago (bound, then closed), chosen at
    random below the kernel's ephemeral range: a port the kernel hands out (bind to port 0,
    and every outgoing connection of the tests running beside this one) could be taken
    again before the agent binds it (seen in CI: "--rdzv port 32883 is already in use")."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    low = max(1024, min(ephemeral_low, 32768) - 12000)
    for _ in range(200):
        port = random.randrange(low, max(low + 1, ephemeral_low))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no luck below the range: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    """A test script's main: runs its tests (unittest.main, verbosity 2) and exits 0 when they
    passed, 1 when one failed, and 77 when tests ran and every one was skipped (a host
    without what the tests need): ctest shows that as Skipped (SKIP_RETURN_CODE 77 in
    tests/CMakeLists.txt), not Passed."""
    result = unittest.main(exit=False, verbosity=2).result
    if not result.wasSuccessful():
        sys.exit(1)
    if result.skipped and result.testsRun <= len(result.skipped):
        sys.exit(77)
    sys.exit(0)


def store_port(store, timeout=60):
    """The port `trireme store --port 0` (started with stdout=PIPE) says it listens on, in
    its first line, read with a deadline: a store that never starts fails the test with
    what it printed instead of hanging it."""
    fd = store.stdout.fileno()
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise AssertionError(f"trireme store did not say its port within {timeout} s; it printed {data!r}")
        chunk = os.read(fd, 4096)
        if not chunk:
            raise AssertionError(f"trireme store ended (exit {store.wait()}) before saying its port; "
                                 f"it printed {data!r}")
        data += chunk
    line = data.split(b"\n")[0].decode(errors="replace")
    if "listening on port " not in line:
        raise AssertionError(f"trireme store's first line does not give its port: {line!r}")
    return int(line.split("listening on port ")[1].split(";")[0])


class SnapshotAreaTest(unittest.TestCase):
    """A test whose agents put their snapshot areas in a directory of its own (not /dev/shm,
    shared with parallel tests), and which checks that none is left behind."""

    def setUp(self):
        self.dir = temp_dir()
        self.areas = os.path.join(self.dir, "snapshot-areas")
        os.makedirs(self.areas)
        os.environ["TRIREME_SNAPSHOT_ROOT"] = self.areas
        # A cleanup, registered before any of the test's own: cleanups run last registered
        # first, after tearDown, so the jobs a test stops with addCleanup(stop, ...) are
        # gone before their areas are looked at.
        self.addCleanup(self.check_snapshot_areas)

    def check_snapshot_areas(self):
        del os.environ["TRIREME_SNAPSHOT_ROOT"]
        # A test that already failed had its jobs killed (stop: SIGKILL, no agent can clear
        # its area then): a leftover area says nothing more, so it is not a second error.
        if self.failed_so_far():
            return
        self.assertEqual(os.listdir(self.areas), [], "the agent left its snapshot area behind")

    def failed_so_far(self):
        """Whether this test (its body, tearDown or an earlier cleanup) has failed or erred.
        Python 3.11+ reports each failure to the result as it happens; earlier versions
        collect them in the outcome until the test ends."""
        outcome = getattr(self, "_outcome", None)
        result = getattr(outcome, "result", None)
        reported = list(getattr(result, "failures", [])) + list(getattr(result, "errors", []))
        if any(test is self for test, _ in reported):
            return True
        return any(test is self and exc is not None for test, exc in getattr(outcome, "errors", []))
