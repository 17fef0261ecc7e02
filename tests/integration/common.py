"""Shared helpers for the integration tests: where the binaries are, running the CLI with
a deadline, reading metrics and parameter dumps. The tests run real processes."""
import atexit
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

TRIREME = os.environ.get("TRIREME_BIN", "build/trireme")
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


def max_abs_diff(a, b):
    assert a.keys() == b.keys(), f"parameter names differ: {sorted(a) } vs {sorted(b)}"
    worst = 0.0
    for name in a:
        assert len(a[name]) == len(b[name]), name
        worst = max(worst, max((abs(x - y) for x, y in zip(a[name], b[name])), default=0.0))
    return worst


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
