"""Child processes of the benchmarks. Each run is started in a session of its own
(start_new_session=True), so that a timeout, a failure or Ctrl-C can end everything it
started: `trireme run`'s agent puts every worker in a process group of its own and torchrun
has workers of its own, so killing the direct child alone would leave them running (and an
agent's /dev/shm snapshot area with them)."""
from __future__ import annotations

import os
import signal
import subprocess


def processes_with(field: int, value: int) -> list[int]:
    """The processes whose /proc/PID/stat field after the command name, counted from 0, is
    `value`: 1 the parent's pid, 3 the session id. (Also used by the integration tests.)"""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[field]) == value:
                found.append(int(entry))
        except (OSError, IndexError, ValueError):
            pass
    return found


def session_members(sid: int) -> list[int]:
    """The processes whose session id is `sid`."""
    return processes_with(3, sid)


def stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Ends a run started with start_new_session=True: SIGTERM to its leader if it is still
    running (an agent then stops its workers and removes its snapshot area; torchrun stops
    its workers), up to grace_s for it to exit, then SIGKILL to whatever is left of its
    session. Safe to call on a run that has ended."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=grace_s)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            pass
    for pid in session_members(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def run(cmd: list[str], timeout: float, **popen) -> subprocess.CompletedProcess:
    """subprocess.run in a session of its own: on a timeout (subprocess.TimeoutExpired, with
    what the run wrote to its pipes), Ctrl-C or any other exception, the whole session is
    stopped before the exception goes on."""
    proc = subprocess.Popen(cmd, start_new_session=True, **popen)
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(proc)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    finally:
        stop(proc)


def tail(text, chars: int = 3000) -> str:
    """The end of a run's output (str, bytes or None)."""
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text[-chars:]
