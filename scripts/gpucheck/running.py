"""Commands run bounded: `run_bounded` ends a command's whole process group
at its limit, `Smi` bounds every nvidia-smi call, `MemoryWatch` polls the
device's used memory beside a command."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

# Every nvidia-smi call is bounded: a hung driver must not hang the run.
SMI_TIMEOUT_S = 10


@dataclass
class Outcome:
    """What one bounded command did."""
    rc: int
    out: str
    err: str
    seconds: float
    timed_out: bool = False

    def json(self):
        return json.loads(self.out)

    def last_json(self):
        """The last line of stdout as JSON: a Python row's job prints its
        figures last, after whatever the libraries it runs printed."""
        lines = [line for line in self.out.splitlines() if line.strip()]
        if not lines:
            raise ValueError("nothing on stdout")
        return json.loads(lines[-1])


def run_bounded(cmd: Sequence[str], limit: float, env: Optional[Dict] = None,
                stdout_path: Optional[Path] = None) -> Outcome:
    """Runs `cmd` for at most `limit` seconds (its whole process group is
    ended after it); rc 124 when it ran out."""
    start = time.monotonic()
    if limit < 1:
        return Outcome(124, "", "no time left", 0.0, True)
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit)
        rc, timed_out = proc.returncode, False
    except subprocess.TimeoutExpired:
        end_group(proc)
        out, err = proc.communicate()
        rc, timed_out = 124, True
    if stdout_path is not None:
        stdout_path.write_text(out)
    return Outcome(rc, out, err, time.monotonic() - start, timed_out)


def end_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


class Smi:
    """nvidia-smi, each call bounded; `command` may be a stand-in (the
    rehearsal's tests/fake_nvidia_smi.py)."""

    def __init__(self, command: Sequence[str]):
        self.command = list(command)

    def call(self, *args: str, limit: float = SMI_TIMEOUT_S) -> Outcome:
        return run_bounded(self.command + list(args), limit)

    def memory_used_mib(self, index: int = 0) -> Optional[float]:
        o = self.call(f"--id={index}", "--query-gpu=memory.used", "--format=csv,noheader,nounits")
        try:
            return float(o.out.strip().splitlines()[0])
        except (ValueError, IndexError):
            return None

    def gpu_count(self) -> int:
        o = self.call("-L")
        return sum(1 for line in o.out.splitlines() if line.startswith("GPU "))


class MemoryWatch:
    """Polls nvidia-smi's used memory in a thread while a command runs: what
    the device held, by anyone, seen from outside the process."""

    def __init__(self, smi: Smi, interval_s: float = 0.25):
        self.smi = smi
        self.interval_s = interval_s
        self.samples: List[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=SMI_TIMEOUT_S + 1)

    def _run(self):
        while not self._stop.is_set():
            used = self.smi.memory_used_mib()
            if used is not None:
                self.samples.append(used)
            self._stop.wait(self.interval_s)
