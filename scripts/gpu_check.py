#!/usr/bin/env python3
"""The rows of `scripts/gpu-check`: each check runs the batchtune CLI bounded,
reads its whole output, and becomes one row of `summary.json`
(`name`, `status` pass/fail/skip, `detail`, `figures`, `seconds`).

`scripts/gpu-check` prepares (prerequisites, the build) and calls this:

    gpu_check.py row --out DIR STATUS NAME SECONDS DETAIL   one row from the shell
    gpu_check.py checks --out DIR --cli PATH --mode gpu|rehearse --deadline-at T
    gpu_check.py finish --out DIR                        the table; exit 0 only when every row passed

Strict: a row skipped for lack of time is not a pass, and the run passes
only when every row did. Every command is bounded by its own limit and by
the overall deadline, `nvidia-smi` and the monitor included.

What comes back in $OUT (the device tool returns at most eight files):
summary.json (the rows), summary.txt (the table), results.json (each
command's whole JSON output, by row), report.html (the guide-claims tune's
HTML report), and the shell's gpu-check.log, build.log and tests.log.

`--mode rehearse` runs the same rows against a CPU build, the CPU standing in
for the GPU at small sizes and `tests/fake_nvidia_smi.py` for nvidia-smi,
so that the parsing and the strictness are tested in CI; the thresholds that
only a GPU can meet (GPU-Util >= 85 %, the guide's ratios) are checked there
for a figure, not for its size.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

PASS, FAIL, SKIP = "pass", "fail", "skip"
# A check that would start with less time than this left is a skip row (a
# failure of the run): no check finishes in less.
MIN_START_S = 20
# Every nvidia-smi call is bounded: a hung driver must not hang the run.
SMI_TIMEOUT_S = 10
# The guide's claims (README, docs/manual.md).
UTILIZATION_TARGET = 85.0       # GPU-Util at the chosen batch, %
THROUGHPUT_GAIN_TARGET = 2.0    # chosen batch against batch 16: the guide says 2-3x
BF16_BATCH_GAIN_TARGET = 1.5    # largest bf16 batch against fp32: the guide says about twice

Verdict = Tuple[str, str, Dict]


@dataclass
class Row:
    name: str
    status: str
    detail: str
    figures: Dict = field(default_factory=dict)
    seconds: float = 0.0


# ------------------------------------------------------------------ summary


class Summary:
    """summary.json in `out` holds the rows; summary.txt, the table, is
    rewritten with it after every row, so a run killed at its limit still
    returns what it saw."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self.path = self.out / "summary.json"

    def load(self) -> Dict:
        if self.path.exists():
            return json.loads(self.path.read_text())
        return {"machine": socket.gethostname(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "mode": None,
                "rows": []}

    def add(self, row: Row, mode: Optional[str] = None) -> None:
        doc = self.load()
        if mode:
            doc["mode"] = mode
        doc["rows"].append(asdict(row))
        self.write(doc)
        print(f"-> {row.status.upper()} {row.name} ({row.seconds:.0f} s): {row.detail}", flush=True)

    def set_mode(self, mode: str, extra: Optional[Dict] = None) -> None:
        doc = self.load()
        doc["mode"] = mode
        doc.update(extra or {})
        self.write(doc)

    def write(self, doc: Dict) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        doc["passed"] = passed(doc["rows"])
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(self.path)
        (self.out / "summary.txt").write_text(table(doc))


def passed(rows: Sequence[Dict]) -> bool:
    """The run passes only when it has rows and every one passed: a skip
    (the deadline, a missing size) is not a pass."""
    return bool(rows) and all(r["status"] == PASS for r in rows)


def table(doc: Dict) -> str:
    rows = doc["rows"]
    lines = [f"gpu-check {doc.get('mode')} on {doc.get('machine')} from {doc.get('started')}"
             + (f"; {doc['device']}" if doc.get("device") else "")]
    width = max([len(r["name"]) for r in rows] + [5])
    for r in rows:
        lines.append(f"{r['status'].upper():4}  {r['name']:<{width}}  {r['seconds']:5.0f} s  {r['detail']}")
    lines.append(f"gpu-check: {'PASS' if passed(rows) else 'FAIL'} "
                 f"({sum(r['status'] == PASS for r in rows)} of {len(rows)} rows passed)")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ running


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
        _end(proc)
        out, err = proc.communicate()
        rc, timed_out = 124, True
    if stdout_path is not None:
        stdout_path.write_text(out)
    return Outcome(rc, out, err, time.monotonic() - start, timed_out)


def _end(proc: subprocess.Popen) -> None:
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


# ------------------------------------------------------------------ verdicts
# Each reads a command's outcome and returns (status, detail, figures). Pure:
# tests/python/test_gpu_check.py feeds them made-up outputs.


def mib(b) -> str:
    return f"{b / 2**20:.0f} MiB"


def unreadable(o: Outcome, e: Exception) -> Verdict:
    return FAIL, f"exit {o.rc}; unreadable output ({type(e).__name__}: {e}); {o.err.strip()[-200:]}", {}


def guarded(fn: Callable[..., Verdict]) -> Callable[..., Verdict]:
    def wrapper(o: Outcome, *args, **kwargs) -> Verdict:
        if o.timed_out:
            return FAIL, f"timed out after {o.seconds:.0f} s", {}
        try:
            return fn(o, *args, **kwargs)
        except (ValueError, KeyError, TypeError, IndexError, ZeroDivisionError) as e:
            return unreadable(o, e)
    wrapper.__name__ = fn.__name__
    return wrapper


@guarded
def verdict_env(o: Outcome, gpu: bool) -> Verdict:
    e = o.json()
    d = e["devices"][0] if e["devices"] else {}
    ok = o.rc == 0 and (not gpu or (e["cuda_available"] and e["device_count"] >= 1 and e["nvml_available"]))
    return (PASS if ok else FAIL,
            f'cuda_available {e["cuda_available"]}, {e["device_count"]} device(s) {d.get("name", "")}, '
            f'nvml {e["nvml_available"]}; {e.get("cuda_reason") or ""}'.strip(),
            {"cuda_available": e["cuda_available"], "device_count": e["device_count"],
             "device": d.get("name"), "total_bytes": d.get("total_bytes"),
             "free_bytes": d.get("free_bytes"), "nvml_available": e["nvml_available"]})


@guarded
def verdict_fits(o: Outcome) -> Verdict:
    r = o.json()
    ok = o.rc == 0 and r["fits"] and r["failure"] is None
    return (PASS if ok else FAIL,
            f'fits {r["fits"]}, peak {mib(r["peak_bytes"])} of {mib(r["usable_bytes"])} usable, '
            f'step {r["step_ms"]:.2f} ms, {r["samples_per_s"]:.0f} samples/s',
            {k: r[k] for k in ("batch_size", "fits", "peak_bytes", "usable_bytes", "step_ms", "samples_per_s")})


@guarded
def verdict_oom(o: Outcome) -> Verdict:
    r = o.json()
    ok = o.rc == 0 and not r["fits"] and r["failure"] == "out_of_memory"
    return (PASS if ok else FAIL, f'fits {r["fits"]}, failure {r["failure"]}: {(r["error"] or "")[:100]}',
            {"batch_size": r["batch_size"], "fits": r["fits"], "failure": r["failure"]})


@guarded
def verdict_next(o: Outcome) -> Verdict:
    r = o.json()
    ok = o.rc == 0 and not r["fits"] and r["failure"] in ("out_of_memory", "over_budget")
    return (PASS if ok else FAIL,
            f'batch {r["batch_size"]}: fits {r["fits"]}, failure {r["failure"]}, peak '
            f'{mib(r["peak_bytes"])} of {mib(r["usable_bytes"])}',
            {"batch_size": r["batch_size"], "fits": r["fits"], "failure": r["failure"],
             "peak_bytes": r["peak_bytes"]})


@guarded
def verdict_max(o: Outcome) -> Verdict:
    r = o.json()
    ok = o.rc == 0 and r["max_batch_size"] > 0 and r["complete"]
    return (PASS if ok else FAIL,
            f'largest fitting batch {r["max_batch_size"]} at amp {r["amp"]} ({r["search"]["trials"]} trials, '
            f'{r["search"]["seconds"]:.1f} s; {r["search"]["stop_reason"]})',
            {"max_batch_size": r["max_batch_size"], "amp": r["amp"], "trials": r["search"]["trials"],
             "usable_bytes": r["usable_bytes"]})


@guarded
def verdict_tune_memory(o: Outcome, limit_bytes: int, smi_used_mib: Sequence[float],
                        baseline_mib: Optional[float], gpu: bool) -> Verdict:
    """The device's used memory seen by nvidia-smi during a tune under a
    limit stays within it (what else was on the device before counted out),
    and every sweep row has its energy and utilization where a GPU measures
    them. A peak inside the budget is true by construction (the trials say
    what they measured); nvidia-smi is the outside witness."""
    r = o.json()
    sweep = r["sweep"]
    if not smi_used_mib or baseline_mib is None:
        return FAIL, f"exit {o.rc}; no nvidia-smi reading during the run", {"chosen_batch_size": r["chosen_batch_size"]}
    used = (max(smi_used_mib) - baseline_mib) * 2**20
    energy = [s for s in sweep if s.get("energy_j_per_sample") is not None]
    util = [s for s in sweep if s.get("utilization") is not None]
    ok = (o.rc == 0 and r["complete"] and sweep and r["chosen_batch_size"] > 0 and used <= limit_bytes
          and (not gpu or (len(energy) == len(sweep) and len(util) == len(sweep))))
    return (PASS if ok else FAIL,
            f'nvidia-smi: at most {mib(used)} used by the run against the limit {mib(limit_bytes)} '
            f'({len(smi_used_mib)} readings); chosen {r["chosen_batch_size"]} of max {r["max_batch_size"]}; '
            f'energy in {len(energy)}/{len(sweep)} rows, utilization in {len(util)}/{len(sweep)}',
            {"smi_max_used_bytes": used, "limit_bytes": limit_bytes, "smi_readings": len(smi_used_mib),
             "baseline_mib": baseline_mib, "chosen_batch_size": r["chosen_batch_size"],
             "max_batch_size": r["max_batch_size"], "rows_with_energy": len(energy),
             "rows_with_utilization": len(util), "rows": len(sweep)})


@guarded
def verdict_train(o: Outcome, amp: str, steps: int) -> Verdict:
    r = o.json()
    ok = o.rc == 0 and r["complete"] and r["steps"] == steps and math.isfinite(r["final_loss"])
    detail = f'{r["steps"]} steps, loss {r["final_loss"]:.4f}, {r["samples_per_s"]:.0f} samples/s'
    figures = {"steps": r["steps"], "final_loss": r["final_loss"], "samples_per_s": r["samples_per_s"]}
    if amp == "fp16":
        scale, skipped = r.get("loss_scale"), r.get("skipped_steps", 0)
        ok = ok and scale is not None and scale >= 1 and skipped <= max(1, steps // 10)
        detail += f", loss scale {scale}, {skipped} skipped"
        figures.update(loss_scale=scale, skipped_steps=skipped)
    return PASS if ok else FAIL, detail, figures


@guarded
def verdict_recover(o: Outcome, start: int) -> Verdict:
    r = o.json()
    ok = (o.rc == 0 and r["complete"] and r["oom_recoveries"] >= 1 and r["micro_batch_size"] < start
          and math.isfinite(r["final_loss"]))
    return (PASS if ok else FAIL,
            f'{r["oom_recoveries"]} recoveries: micro-batch {start} -> {r["micro_batch_size"]} x '
            f'{r["accumulation_steps"]}, loss {r["final_loss"]:.4f}',
            {"oom_recoveries": r["oom_recoveries"], "micro_batch_size": r["micro_batch_size"]})


@guarded
def verdict_attention(o: Outcome, bound: int) -> Verdict:
    r = o.json()
    ok = o.rc == 0 and r["fits"] and r["peak_bytes"] < bound
    return (PASS if ok else FAIL,
            f'fits {r["fits"]}, peak {mib(r["peak_bytes"])} (one materialised score matrix: {mib(bound)}), '
            f'step {r["step_ms"]:.1f} ms; {(r["error"] or "")[:80]}',
            {"fits": r["fits"], "peak_bytes": r["peak_bytes"], "score_matrix_bytes": bound})


def verdict_clean_error(o: Outcome, expected: str) -> Verdict:
    if o.timed_out:
        return FAIL, f"timed out after {o.seconds:.0f} s", {}
    lines = [line for line in o.err.strip().splitlines() if line.strip()]
    ok = o.rc == 2 and len(lines) == 1 and expected in lines[0]
    return PASS if ok else FAIL, f'exit {o.rc}: {lines[0][:160] if lines else "(nothing on stderr)"}', {"exit": o.rc}


@guarded
def verdict_hidden_env(o: Outcome) -> Verdict:
    e = o.json()
    ok = o.rc == 0 and not e["cuda_available"] and bool(e["cuda_reason"])
    return PASS if ok else FAIL, f'exit {o.rc}, cuda_available {e["cuda_available"]}: {e["cuda_reason"]}', {}


def verdict_step_scaling(small: Dict, big: Dict, ratio_bounds=(1.2, 4.8)) -> Verdict:
    """4x the samples take more time, and at most 4.8x (linear plus 20 %):
    a ratio near 1 means the timer saw kernel launches, not finished work."""
    r = big["step_ms"] / small["step_ms"]
    lo, hi = ratio_bounds
    return (PASS if lo <= r <= hi else FAIL,
            f'step {small["step_ms"]:.2f} ms at {small["batch_size"]}, {big["step_ms"]:.2f} ms at '
            f'{big["batch_size"]}: ratio {r:.2f} (expected {lo} to {hi})', {"ratio": r})


def verdict_monitor_vs_smi(monitor_lines: Sequence[str], smi_csv: str, device: str, gpu: bool) -> Verdict:
    """`monitor` and nvidia-smi over the same seconds: medians within 15
    utilization points and 5 % or 512 MiB of memory (on a GPU)."""
    rows = [json.loads(line) for line in monitor_lines if line.strip()][1:]
    rows = [r for r in rows if r["device"] == device]
    smi = [line.split(",") for line in smi_csv.splitlines() if "," in line]
    if len(rows) < 3 or len(smi) < 3:
        return FAIL, f"too few samples: {len(rows)} from monitor, {len(smi)} from nvidia-smi", {}
    u_bt = statistics.median(r["utilization_percent"] for r in rows if r["utilization_percent"] is not None)
    u_smi = statistics.median(float(a) for a, _ in smi)
    m_smi = statistics.median(float(b) for _, b in smi)
    memories = [r["memory_used_bytes"] for r in rows if r["memory_used_bytes"] is not None]
    m_bt = statistics.median(memories) / 2**20 if memories else None
    figures = {"utilization_monitor": u_bt, "utilization_smi": u_smi, "memory_monitor_mib": m_bt,
               "memory_smi_mib": m_smi, "samples": [len(rows), len(smi)]}
    if gpu:
        ok = (m_bt is not None and abs(u_bt - u_smi) <= 15 and abs(m_bt - m_smi) <= max(0.05 * m_smi, 512)
              and u_smi > 0)
    else:  # the CPU's utilization against a stand-in: parsed, not compared
        ok = True
    return (PASS if ok else FAIL,
            f"utilization {u_bt:.0f} % vs nvidia-smi {u_smi:.0f} %, memory "
            f"{'n/a' if m_bt is None else f'{m_bt:.0f}'} vs {m_smi:.0f} MiB ({len(rows)} and {len(smi)} samples)",
            figures)


@guarded
def verdict_claim_utilization(o: Outcome, gpu: bool) -> Verdict:
    """The guide: GPU-Util at the chosen batch, read over its timed steps
    only, at 85 % or more."""
    r = o.json()
    chosen = r["chosen_batch_size"]
    row = next((s for s in r["sweep"] if s["batch_size"] == chosen), None)
    util = row.get("utilization") if row else None
    figures = {"chosen_batch_size": chosen, "max_batch_size": r["max_batch_size"], "amp": r["amp"],
               "utilization": util, "target": UTILIZATION_TARGET,
               "curve": [[s["batch_size"], s["samples_per_s"], s.get("utilization")] for s in r["sweep"]]}
    if o.rc != 0 or row is None or util is None:
        return FAIL, f"exit {o.rc}; no utilization at the chosen batch {chosen}: {r.get('utilization_note')}", figures
    ok = util >= UTILIZATION_TARGET if gpu else util >= 0
    return (PASS if ok else FAIL,
            f'utilization {util:.0f} % at the chosen batch {chosen} (target {UTILIZATION_TARGET:.0f} %'
            f'{"" if gpu else ", GPU only"}); max batch {r["max_batch_size"]}, amp {r["amp"]}', figures)


def verdict_claim_throughput(tune: Dict, base: Dict, gpu: bool) -> Verdict:
    """The guide: the chosen batch runs 2-3x the samples/s of batch 16."""
    chosen = tune["chosen_batch_size"]
    row = next((s for s in tune["sweep"] if s["batch_size"] == chosen), None)
    if row is None or not base.get("fits") or not base.get("samples_per_s"):
        return FAIL, f"no throughput at the chosen batch {chosen} or at batch {base.get('batch_size')}", {}
    gain = row["samples_per_s"] / base["samples_per_s"]
    ok = gain >= THROUGHPUT_GAIN_TARGET if gpu else gain > 0
    return (PASS if ok else FAIL,
            f'{row["samples_per_s"]:.0f} samples/s at the chosen batch {chosen} against '
            f'{base["samples_per_s"]:.0f} at batch {base["batch_size"]}: {gain:.2f}x '
            f'(the guide: {THROUGHPUT_GAIN_TARGET:.0f}-3x{"" if gpu else ", GPU only"})',
            {"chosen_batch_size": chosen, "chosen_samples_per_s": row["samples_per_s"],
             "base_batch_size": base["batch_size"], "base_samples_per_s": base["samples_per_s"], "gain": gain})


def verdict_claim_bf16_batch(model: str, fp32: Dict, bf16: Dict, gpu: bool) -> Verdict:
    """The guide: under bf16 about twice the batch fits."""
    a, b = fp32["max_batch_size"], bf16["max_batch_size"]
    if a <= 0 or b <= 0:
        return FAIL, f"{model}: no largest batch (fp32 {a}, bf16 {b})", {"fp32": a, "bf16": b}
    ratio = b / a
    ok = ratio >= BF16_BATCH_GAIN_TARGET if gpu else ratio > 0
    return (PASS if ok else FAIL,
            f"{model}: largest batch {a} in fp32, {b} in bf16: {ratio:.2f}x (the guide: about 2x"
            f"{'' if gpu else ', GPU only'})",
            {"fp32": a, "bf16": b, "ratio": ratio, "target": BF16_BATCH_GAIN_TARGET})


# ------------------------------------------------------------------ the run


class Checks:
    def __init__(self, args):
        self.out = Path(args.out)
        self.work = Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.cli = args.cli
        self.gpu = args.mode == "gpu"
        self.mode = args.mode
        self.deadline_at = args.deadline_at
        self.python = args.python or sys.executable
        self.smi = Smi(shlex.split(args.smi))
        self.summary = Summary(self.out)
        results = self.out / "results.json"
        self.results: Dict[str, object] = json.loads(results.read_text()) if results.exists() else {}
        self.dev = "cuda" if self.gpu else "cpu"

    # -- time
    def left(self) -> float:
        return self.deadline_at - time.time()

    def bound(self, limit: float) -> float:
        return max(0.0, min(limit, self.left()))

    def enough_time(self, name: str) -> bool:
        if self.left() < MIN_START_S:
            self.row(Row(name, SKIP, f"deadline: {self.left():.0f} s left (a skipped row fails the run)"))
            return False
        return True

    # -- rows and results
    def row(self, row: Row) -> None:
        self.summary.add(row)

    def keep(self, name: str, o: Outcome) -> None:
        """Each command's whole JSON into results.json (its text where it is
        not JSON), rewritten after each command."""
        try:
            self.results[name] = o.json()
        except ValueError:
            self.results[name] = {"exit": o.rc, "stdout": o.out[-20000:], "stderr": o.err[-4000:]}
        tmp = self.out / "results.tmp"
        tmp.write_text(json.dumps(self.results))
        tmp.replace(self.out / "results.json")

    def cli_run(self, name: str, limit: float, *cli_args: str, env: Optional[Dict] = None) -> Outcome:
        print(f"\n== {name}: batchtune {' '.join(cli_args)} ({self.left():.0f} s left)", flush=True)
        o = run_bounded([self.cli, *cli_args], self.bound(limit), env=env,
                        stdout_path=self.work / f"{name}.out")
        (self.work / f"{name}.err").write_text(o.err)
        print(o.err[-1500:], end="", flush=True)
        self.keep(name, o)
        return o

    def check(self, name: str, limit: float, verdict: Callable[..., Verdict], cli_args: Sequence[str],
              *verdict_args, env: Optional[Dict] = None) -> Optional[Outcome]:
        if not self.enough_time(name):
            return None
        o = self.cli_run(name, limit, *cli_args, env=env)
        status, detail, figures = verdict(o, *verdict_args)
        self.row(Row(name, status, detail, figures, o.seconds))
        return o

    # -- the rows
    def run(self, part: str = "all") -> None:
        """`part`: "basic" (every row but the claims), "claims" (the guide's
        claims, run once nothing else competes for the machine: the shell
        runs them after the test build), or "all"."""
        self.summary.set_mode(self.mode)
        if part in ("basic", "all"):
            self.basic()
        if part in ("claims", "all"):
            self.claims()

    def basic(self) -> None:
        gpu, dev = self.gpu, self.dev
        img = ["--model", "resnet18", "--input", "3x224x224"] if gpu else ["--model", "convnet", "--input", "3x32x32"]

        self.check("env", 30, verdict_env, ["env", "--json"], gpu)
        self.no_context()
        if gpu:
            self.check("probe-fits", 90, verdict_fits, ["probe", "--device", dev, *img, "--batch-size", "32",
                                                        "--steps", "5", "--json", "-"])
            self.check("probe-oom", 90, verdict_oom, ["probe", "--device", dev, *img, "--batch-size", "1024",
                                                      "--memory-limit", "2GiB", "--steps", "1", "--json", "-"])
        else:
            self.check("probe-fits", 90, verdict_fits, ["probe", "--device", dev, *img, "--batch-size", "8",
                                                        "--steps", "2", "--memory-limit", "1GiB", "--json", "-"])
            self.check("probe-oom", 90, verdict_oom, ["probe", "--device", dev, "--model", "convnet", "--input",
                                                      "3x64x64", "--batch-size", "1024", "--memory-limit",
                                                      "64MiB", "--steps", "1", "--min-time", "0", "--json", "-"])
        self.boundary(img)
        self.tune_memory(img)
        if gpu:
            train = ["train", "--device", dev, "--model", "resnet18", "--input", "3x64x64", "--batch-size", "64",
                     "--steps", "40", "--workers", "2", "--pin-memory", "on", "--no-noise-scale", "--json", "-"]
            self.check("train-bf16", 120, verdict_train, [*train, "--amp", "bf16"], "bf16", 40)
            self.check("train-fp16", 120, verdict_train, [*train, "--amp", "fp16"], "fp16", 40)
            self.check("train-oom-recovery", 120, verdict_recover,
                       ["train", "--device", dev, *img, "--batch-size", "512", "--memory-limit", "4GiB",
                        "--steps", "2", "--no-noise-scale", "--json", "-"], 512)
            # Fused attention never holds the [batch, heads, T, T] scores:
            # 1 x 8 x 16384^2 x 4 bytes = 8 GiB per layer.
            self.check("gpt-long", 120, verdict_attention,
                       ["probe", "--device", dev, "--model", "gpt", "--input", "int64:16384", "--vocab", "8192",
                        "--layers", "2", "--heads", "8", "--width", "512", "--batch-size", "1", "--steps", "2",
                        "--json", "-"], 8 * 16384 * 16384 * 4)
        else:
            self.check("train-bf16", 120, verdict_train,
                       ["train", "--device", dev, *img, "--batch-size", "16", "--steps", "10", "--amp", "bf16",
                        "--workers", "2", "--no-noise-scale", "--json", "-"], "bf16", 10)
            self.check("train-oom-recovery", 120, verdict_recover,
                       ["train", "--device", dev, "--model", "convnet", "--input", "3x64x64", "--batch-size",
                        "256", "--memory-limit", "256MiB", "--steps", "2", "--no-noise-scale", "--json", "-"], 256)
            self.check("gpt-long", 120, verdict_attention,
                       ["probe", "--device", dev, "--model", "gpt", "--input", "int64:1024", "--heads", "8",
                        "--batch-size", "1", "--steps", "1", "--min-time", "0", "--json", "-"], 8 * 1024 * 1024 * 4)
        self.monitor_vs_smi(img)
        self.step_scaling(img)
        self.clean_errors()

    def no_context(self) -> None:
        """`monitor --device auto` lists the GPUs without making a CUDA
        context: it is not among nvidia-smi's compute apps."""
        name = "no-context"
        if not self.enough_time(name):
            return
        start = time.monotonic()
        mon = subprocess.Popen([self.cli, "monitor", "--device", "auto", "--count", "25", "--interval", "200"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            time.sleep(3)
            apps = self.smi.call("--query-compute-apps=pid,used_memory", "--format=csv,noheader")
        finally:
            _end(mon)
        pids = [line.split(",")[0].strip() for line in apps.out.splitlines() if line.strip()]
        if apps.rc != 0:
            status, detail = FAIL, f"nvidia-smi --query-compute-apps: exit {apps.rc} {apps.err.strip()[:120]}"
        elif str(mon.pid) in pids:
            status, detail = FAIL, f"monitor (pid {mon.pid}) holds a CUDA context: {apps.out.strip()}"
        else:
            status, detail = PASS, f"monitor (pid {mon.pid}) is not among nvidia-smi's compute apps ({apps.out.strip() or 'none'})"
        self.row(Row(name, status, detail, {"compute_apps": pids}, time.monotonic() - start))

    def boundary(self, img: List[str]) -> None:
        """The largest size the search found fits in a fresh process, and one
        a tenth larger does not: the search leaves the allocator's
        fragmentation reserve (5 % of its cap) on a GPU, so the size right
        above its answer may still run, but it is not over-cautious."""
        limit = "3GiB" if self.gpu else "48MiB"
        o = self.check("boundary-search", 120, verdict_max,
                       ["tune", "--device", self.dev, *img, "--memory-limit", limit, "--search-only",
                        "--strategy", "binsearch", "--margin", "0.1", "--json", "-"])
        n = 0
        if o is not None:
            try:
                n = int(o.json()["max_batch_size"])
            except (ValueError, KeyError, TypeError):
                n = 0
        if n <= 0:
            for name in ("boundary-largest", "boundary-next"):
                self.row(Row(name, SKIP, "no size from the search"))
            return
        base = ["probe", "--device", self.dev, *img, "--memory-limit", limit, "--steps", "2", "--json", "-"]
        self.check("boundary-largest", 60, verdict_fits, [*base, "--batch-size", str(n)])
        self.check("boundary-next", 60, verdict_next, [*base, "--batch-size", str(math.ceil(n * 1.1))])

    def tune_memory(self, img: List[str]) -> None:
        name = "tune-memory"
        if not self.enough_time(name):
            return
        limit_text, limit_bytes = ("6GiB", 6 << 30) if self.gpu else ("256MiB", 256 << 20)
        baseline = self.smi.memory_used_mib()
        budget = ["--time-budget", "30", "--max-batch", "256"] if self.gpu else ["--time-budget", "20", "--max-batch", "32"]
        with MemoryWatch(self.smi) as watch:
            o = self.cli_run(name, 150, "tune", "--device", self.dev, *img, "--memory-limit", limit_text,
                             *budget, "--json", "-")
        status, detail, figures = verdict_tune_memory(o, limit_bytes, watch.samples, baseline, self.gpu)
        self.row(Row(name, status, detail, figures, o.seconds))

    def monitor_vs_smi(self, img: List[str]) -> None:
        name = "monitor-vs-smi"
        if not self.enough_time(name):
            return
        start = time.monotonic()
        device = "cuda:0" if self.gpu else "cpu"
        batch = "128" if self.gpu else "16"
        busy = subprocess.Popen([self.cli, "probe", "--device", self.dev, *img, "--batch-size", batch,
                                 "--steps", "400", "--min-time", "0"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            time.sleep(6 if self.gpu else 2)  # past the warm-up
            monitor = subprocess.Popen([self.cli, "monitor", "--device", device, "--count", "10", "--interval",
                                        "300", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, start_new_session=True)
            smi = self.smi.call("--id=0", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits",
                                "-lms", "300", limit=4)
            try:  # 10 samples of 300 ms: 3 s and its start
                mon_out, _ = monitor.communicate(timeout=SMI_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _end(monitor)
                mon_out, _ = monitor.communicate()
        finally:
            _end(busy)
        status, detail, figures = verdict_monitor_vs_smi(mon_out.splitlines(), smi.out, device, self.gpu)
        self.row(Row(name, status, detail, figures, time.monotonic() - start))

    def step_scaling(self, img: List[str]) -> None:
        small, big = (32, 128) if self.gpu else (8, 32)
        outs = []
        for name, batch in (("step-small", small), ("step-big", big)):
            o = self.check(name, 60, verdict_fits, ["probe", "--device", self.dev, *img, "--batch-size", str(batch),
                                                    "--steps", "10", "--json", "-"])
            outs.append(o)
        if all(o is not None and o.rc == 0 for o in outs):
            # A CPU's step time at small sizes follows its caches, not the
            # work: the rehearsal wants the larger batch slower, no more.
            bounds = (1.2, 4.8) if self.gpu else (1.0, math.inf)
            try:
                status, detail, figures = verdict_step_scaling(outs[0].json(), outs[1].json(), bounds)
            except (ValueError, KeyError, ZeroDivisionError) as e:
                status, detail, figures = FAIL, f"unreadable step times ({e})", {}
        else:
            status, detail, figures = SKIP, "no step times (see step-small, step-big)", {}
        self.row(Row("step-scaling", status, detail, figures))

    def export_model(self) -> Optional[Path]:
        """ResNet-50 from torchvision, scripted for `--model FILE` (the
        rehearsal: ResNet-18, small sizes)."""
        name = "export-resnet50" if self.gpu else "export-resnet18"
        if not self.enough_time(name):
            return None
        path = self.work / ("resnet50.pt" if self.gpu else "resnet18.pt")
        arch = "resnet50" if self.gpu else "resnet18"
        code = ("import sys, torch, torchvision\n"
                f"m = torchvision.models.{arch}(weights=None)\n"
                "m.train()\n"
                "torch.jit.script(m).save(sys.argv[1])\n")
        o = run_bounded([self.python, "-c", code, str(path)], self.bound(120))
        ok = o.rc == 0 and path.exists()
        self.row(Row(name, PASS if ok else FAIL,
                     f"torchvision {arch} scripted to {path.name}" if ok else f"exit {o.rc}: {o.err.strip()[-300:]}",
                     {}, o.seconds))
        return path if ok else None

    def claims(self) -> None:
        """The guide's three claims, on the whole GPU (no --memory-limit, no
        --max-batch): GPU-Util at the chosen batch, the largest batch in
        fp32 and bf16 (ResNet-50 3x224x224, gpt at a long sequence), and
        the chosen batch's throughput against batch 16."""
        model = self.export_model()
        names = ["claim-utilization", "claim-throughput", "claim-bf16-batch-resnet", "claim-bf16-batch-gpt"]
        if model is None:
            for name in names:
                self.row(Row(name, SKIP, "no exported model (see the export row)"))
            return
        gpu, dev = self.gpu, self.dev
        # The rehearsal: 64x64, the least at which ResNet's last batch norm
        # sees more than one value per channel at batch 1.
        image = ["--model", str(model), "--input", "3x224x224" if gpu else "3x64x64", "--classes", "1000"]
        whole = [] if gpu else ["--memory-limit", "512MiB", "--max-batch", "16"]
        # Utilization and throughput: one tune, its HTML report kept.
        report = self.work / "claim-tune.html"
        tune = self.check("claim-utilization", 120 if gpu else 150, verdict_claim_utilization,
                          ["tune", "--device", dev, *image, *whole, "--time-budget", "75" if gpu else "30",
                           "--json", "-", "--report", str(report)], gpu)
        if report.exists():
            shutil.copyfile(report, self.out / "report.html")
        tuned = None
        if tune is not None:
            try:
                tuned = tune.json()
            except ValueError:
                tuned = None
        if tuned is None or tuned.get("chosen_batch_size", 0) <= 0:
            self.row(Row("claim-throughput", SKIP, "no chosen batch from the tune"))
        elif self.enough_time("claim-throughput"):
            base = self.cli_run("claim-throughput-base", 90, "probe", "--device", dev, *image, *whole[:2],
                                "--batch-size", "16", "--amp", tuned["amp"], "--min-time", "2", "--json", "-")
            try:
                status, detail, figures = verdict_claim_throughput(tuned, base.json(), gpu)
            except (ValueError, KeyError, ZeroDivisionError) as e:
                status, detail, figures = unreadable(base, e)
            self.row(Row("claim-throughput", status, detail, figures, base.seconds))
        # The largest batch in fp32 and in bf16.
        gpt = (["--model", "gpt", "--input", "int64:4096", "--vocab", "32000", "--layers", "6", "--heads", "12",
                "--width", "768"] if gpu else
               ["--model", "gpt", "--input", "int64:128", "--vocab", "512", "--layers", "2", "--heads", "2",
                "--width", "64"])
        for label, workload, limit in (("resnet", image, 75 if gpu else 120), ("gpt", gpt, 75 if gpu else 120)):
            found = {}
            seconds = 0.0
            for amp in ("off", "bf16"):
                name = f"claim-max-{label}-{'fp32' if amp == 'off' else amp}"
                if not self.enough_time(name):
                    break
                o = self.cli_run(name, limit, "tune", "--device", dev, *workload, *whole, "--amp", amp,
                                 "--search-only", "--strategy", "binsearch", "--time-budget",
                                 "45" if gpu else "60", "--json", "-")
                seconds += o.seconds
                status, detail, figures = verdict_max(o)
                if status != PASS:
                    self.row(Row(name, status, detail, figures, o.seconds))
                    break
                found[amp] = o.json()
            if len(found) == 2:
                status, detail, figures = verdict_claim_bf16_batch(label, found["off"], found["bf16"], gpu)
                self.row(Row(f"claim-bf16-batch-{label}", status, detail, figures, seconds))
            elif self.left() < MIN_START_S:
                self.row(Row(f"claim-bf16-batch-{label}", SKIP, "deadline: the searches did not all run"))
            else:
                self.row(Row(f"claim-bf16-batch-{label}", FAIL, "a search failed (see its row)"))

    def clean_errors(self) -> None:
        hidden = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        self.check("hidden-env", 30, verdict_hidden_env, ["env", "--json"], env=hidden)
        self.check("hidden-probe", 30, verdict_clean_error, ["probe", "--device", "cuda", "--batch-size", "2"],
                   "--device", env=hidden)
        count = self.smi.gpu_count()
        self.check("missing-gpu", 30, verdict_clean_error,
                   ["probe", "--device", f"cuda:{count}", "--batch-size", "2"], f"--device: cuda:{count}")


# ------------------------------------------------------------------ main


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    row = sub.add_parser("row", help="add one row (from the shell)")
    row.add_argument("--out", required=True)
    row.add_argument("--mode")
    row.add_argument("status", choices=[PASS, FAIL, SKIP])
    row.add_argument("name")
    row.add_argument("seconds", type=float)
    row.add_argument("detail")
    checks = sub.add_parser("checks", help="run the checks")
    checks.add_argument("--out", required=True)
    checks.add_argument("--work", required=True)
    checks.add_argument("--cli", required=True)
    checks.add_argument("--mode", choices=["gpu", "rehearse"], required=True)
    checks.add_argument("--deadline-at", type=float, required=True, help="epoch seconds")
    checks.add_argument("--smi", default="nvidia-smi", help="nvidia-smi, or a stand-in command")
    checks.add_argument("--python", help="a python with torch and torchvision (the model export)")
    checks.add_argument("--part", choices=["basic", "claims", "all"], default="all")
    finish = sub.add_parser("finish", help="print the table; exit 0 only when every row passed")
    finish.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    if args.command == "row":
        Summary(Path(args.out)).add(Row(args.name, args.status, args.detail.replace("\n", " "), {}, args.seconds),
                                    mode=args.mode)
        return 0
    if args.command == "checks":
        Checks(args).run(args.part)
        return 0
    doc = Summary(Path(args.out)).load()
    print(table(doc), end="")
    return 0 if passed(doc["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
