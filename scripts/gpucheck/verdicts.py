"""The verdicts: each reads a command's outcome and returns (status, detail,
figures). Pure: tests/python/test_gpu_check.py feeds them made-up outputs."""
from __future__ import annotations

import json
import math
import re
import statistics
from typing import Callable, Dict, Optional, Sequence, Tuple

from .rows import FAIL, PASS
from .running import Outcome

# The guide's claims (README, docs/manual.md).
UTILIZATION_TARGET = 85.0       # GPU-Util at the chosen batch, %
THROUGHPUT_GAIN_TARGET = 2.0    # chosen batch against batch 16: the guide says 2-3x
BF16_BATCH_GAIN_TARGET = 1.5    # largest bf16 batch against fp32: the guide says about twice

Verdict = Tuple[str, str, Dict]


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
    and every sweep row has its energy, utilization and model FLOPs
    utilization (the lent cards are in the peak table) where a GPU measures
    them. A peak inside the budget is true by construction (the trials say
    what they measured); nvidia-smi is the outside witness."""
    r = o.json()
    sweep = r["sweep"]
    if not smi_used_mib or baseline_mib is None:
        return FAIL, f"exit {o.rc}; no nvidia-smi reading during the run", {"chosen_batch_size": r["chosen_batch_size"]}
    used = (max(smi_used_mib) - baseline_mib) * 2**20
    energy = [s for s in sweep if s.get("energy_j_per_sample") is not None]
    util = [s for s in sweep if s.get("utilization") is not None]
    mfu = [s["mfu"] for s in sweep if s.get("mfu") is not None and s["mfu"] > 0]
    chosen_mfu = next((s.get("mfu") for s in sweep if s["batch_size"] == r["chosen_batch_size"]), None)
    ok = (o.rc == 0 and r["complete"] and sweep and r["chosen_batch_size"] > 0 and used <= limit_bytes
          and (not gpu or (len(energy) == len(sweep) and len(util) == len(sweep)
                           and len(mfu) == len(sweep))))
    return (PASS if ok else FAIL,
            f'nvidia-smi: at most {mib(used)} used by the run against the limit {mib(limit_bytes)} '
            f'({len(smi_used_mib)} readings); chosen {r["chosen_batch_size"]} of max {r["max_batch_size"]}; '
            f'energy in {len(energy)}/{len(sweep)} rows, utilization in {len(util)}/{len(sweep)}, '
            f'MFU in {len(mfu)}/{len(sweep)}'
            + (f' ({100 * chosen_mfu:.1f} % at the chosen batch)' if chosen_mfu else ''),
            {"smi_max_used_bytes": used, "mfu": chosen_mfu, "limit_bytes": limit_bytes, "smi_readings": len(smi_used_mib),
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


# ------------------------------------------------------------------ the Python rows
# (scripts/gpucheck/python_jobs.py prints each job's figures as its last line)

# A batch this much above the tune's answer must not fit in a fresh process:
# a search leaves the allocator's 5 % fragmentation reserve, and cuDNN's
# smaller workspaces absorb a few percent more (a tenth was 1-3 % over the
# cap on the H200); a quarter is more than either.
CLEARLY_LARGER = 1.25
# The fp16 fit's noise scale against its bf16 reference: a few windows'
# estimate differs by some factor from run to run; gradients left scaled by
# fp16's loss scale put it off by about scale^2 (65536^2), or make it negative.
NOISE_SCALE_AGREEMENT = 100.0


def clearly_larger(n: int) -> int:
    return math.ceil(n * CLEARLY_LARGER)


@guarded
def verdict_py_tune(o: Outcome, gpu: bool) -> Verdict:
    """batchtune.tune in the middle of a run leaves no trace: parameters,
    optimizer state and RNG state bit-identical; the allocator's fraction
    and the current device as found (a GPU's; the CPU has none)."""
    r = o.last_json()
    before, after = r["allocator_before"], r["allocator_after"]
    allocator_ok = before == after and (not gpu or (before["fraction"] is not None
                                                   and before["current_device"] is not None))
    ok = (o.rc == 0 and r["max_batch_size"] > 0 and r["complete"] and r["state_identical"]
          and r["rng_identical"] and allocator_ok)
    return (PASS if ok else FAIL,
            f'{r["model"]} {r["amp"]} under {r["memory_limit"]}: largest batch {r["max_batch_size"]} '
            f'({len(r.get("trials", []))} trials, {r["seconds"]:.1f} s); {r["state_tensors"]} state tensors identical {r["state_identical"]}, '
            f'RNG identical {r["rng_identical"]}; allocator {before} -> {after}',
            {k: r.get(k) for k in ("max_batch_size", "complete", "seconds", "trials", "state_identical",
                                   "rng_identical", "allocator_before", "allocator_after")})


@guarded
def verdict_py_probe(o: Outcome, should_fit: bool) -> Verdict:
    """A fresh process's probe: the tune's answer runs; a clearly larger
    batch runs out of memory (or over the budget)."""
    r = o.last_json()
    if should_fit:
        ok = o.rc == 0 and r["fits"] and r["failure"] is None
    else:
        ok = o.rc == 0 and not r["fits"] and r["failure"] in ("out_of_memory", "over_budget")
    return (PASS if ok else FAIL,
            f'batch {r["batch_size"]}: fits {r["fits"]}, failure {r["failure"]}, peak {mib(r["peak_bytes"])}'
            + (f'; {r["error"][:120]}' if r["error"] and should_fit else ""),
            {k: r[k] for k in ("batch_size", "fits", "failure", "peak_bytes")})


@guarded
def verdict_py_trainer(o: Outcome, gpu: bool) -> Verdict:
    """Trainer with a plan: bf16 steps train; fp16 (a GPU's) takes its steps
    with a loss scale >= 1, at most a tenth skipped; the out-of-memory forced
    mid-step is recovered once, the micro-batch halved, the global batch kept."""
    r = o.last_json()
    problems = []
    runs = [("bf16", r.get("bf16"))] + ([("fp16", r.get("fp16"))] if gpu else [])
    for amp, run in runs:
        if run is None:
            problems.append(f"no {amp} run")
        elif not (run["finite"] and run["parameters_moved"] and run["steps"] == len(run["losses"])):
            problems.append(f"{amp}: finite {run['finite']}, parameters moved {run['parameters_moved']}")
        elif amp == "fp16" and not (run["loss_scale"] is not None and run["loss_scale"] >= 1
                                    and run["skipped_steps"] <= max(1, run["steps"] // 10)):
            problems.append(f"fp16: loss scale {run['loss_scale']}, {run['skipped_steps']} skipped")
    oom = r["oom"]
    if not (oom["forced"] == 1 and len(oom["recoveries"]) == 1
            and oom["micro_batch_size"] == oom["plan_micro_batch_size"] // 2
            and oom["global_batch_size"] == oom["plan_micro_batch_size"] and oom["finite"]
            and oom["steps"] == len(oom["losses"])):
        problems.append(f"out-of-memory: forced {oom['forced']}, {len(oom['recoveries'])} recoveries, micro-batch "
                        f"{oom['plan_micro_batch_size']} -> {oom['micro_batch_size']}, global "
                        f"{oom['global_batch_size']}, finite {oom['finite']}")
    ok = o.rc == 0 and not problems
    fp16 = r.get("fp16")
    figures = {"bf16_final_loss": r["bf16"]["losses"][-1] if r.get("bf16") else None,
               "fp16_loss_scale": fp16["loss_scale"] if fp16 else None,
               "fp16_skipped_steps": fp16["skipped_steps"] if fp16 else None,
               "oom_micro_batch": [oom["plan_micro_batch_size"], oom["micro_batch_size"]],
               "oom_global_batch": oom["global_batch_size"], "recoveries": oom["recoveries"]}
    detail = "; ".join(problems) if problems else (
        f'bf16 {r["bf16"]["steps"]} steps, loss {r["bf16"]["losses"][-1]:.3f}'
        + (f'; fp16 {fp16["steps"]} steps, loss scale {fp16["loss_scale"]:.0f}, {fp16["skipped_steps"]} skipped'
           if fp16 else "; fp16 GPU only")
        + f'; out-of-memory mid-step: micro-batch {oom["plan_micro_batch_size"]} -> {oom["micro_batch_size"]} x 2, '
          f'global {oom["global_batch_size"]} kept')
    return PASS if ok else FAIL, detail, figures


def _fit_problems(label: str, fit: Dict) -> Optional[str]:
    if not (fit["global_step"] == fit["max_steps"] and fit["finite"] and (fit["micro_batch_size"] or 0) > 0):
        return (f'{label}: {fit["global_step"]} of {fit["max_steps"]} steps, finite {fit["finite"]}, '
                f'micro-batch {fit["micro_batch_size"]}')
    return None


@guarded
def verdict_lightning(o: Outcome) -> Verdict:
    """The callback tuned at fit start and the fit ran its steps with the plan."""
    r = o.last_json()
    problem = _fit_problems(r["precision"], r)
    ok = o.rc == 0 and problem is None
    return (PASS if ok else FAIL,
            problem or f'{r["precision"]}: plan micro-batch {r["micro_batch_size"]} of global '
                       f'{r["global_batch_size"]} (largest {r["max_batch_size"]}), {r["global_step"]} steps, '
                       f'loss {r["final_loss"]:.3f}',
            {k: r[k] for k in ("precision", "micro_batch_size", "global_batch_size", "max_batch_size",
                               "global_step", "final_loss", "seconds")})


@guarded
def verdict_lightning_adapt(o: Outcome, gpu: bool) -> Verdict:
    """adapt=True under fp16 ("16-mixed") with a fused AdamW: its noise scale
    is plausible, within NOISE_SCALE_AGREEMENT of the same fit's in bf16 with
    a plain AdamW (on the CPU Lightning runs both in bf16)."""
    r = o.last_json()
    fused, reference = r["fused"], r["reference"]
    problems = [p for p in (_fit_problems("fused", fused), _fit_problems("reference", reference)) if p]
    a, b = fused["noise_scale"], reference["noise_scale"]
    ratio = a / b if a is not None and b is not None and b > 0 else None
    if gpu and fused["precision"] != "16-mixed":
        problems.append(f'the fused fit ran {fused["precision"]}, not 16-mixed')
    if not (fused["fused"] and ratio is not None and a > 0 and math.isfinite(a)
            and 1 / NOISE_SCALE_AGREEMENT <= ratio <= NOISE_SCALE_AGREEMENT):
        problems.append(f"noise scale {a} ({fused['precision']}, fused) against {b} ({reference['precision']})")
    ok = o.rc == 0 and not problems
    return (PASS if ok else FAIL,
            "; ".join(problems) if problems else
            f'noise scale {a:.4g} ({fused["precision"]}, fused AdamW) against {b:.4g} '
            f'({reference["precision"]}, AdamW): {ratio:.2f}x; {len(fused["schedule"])} schedule entries',
            {"noise_scale": a, "reference_noise_scale": b, "ratio": ratio, "precision": fused["precision"],
             "schedule": fused["schedule"]})


@guarded
def verdict_hf(o: Outcome) -> Verdict:
    """tune_training_args keeps the arguments' global batch by accumulation
    and the Trainer trains its 20 steps with what it returned."""
    r = o.last_json()
    ok = (o.rc == 0 and r["global_step"] == r["max_steps"] and math.isfinite(r["training_loss"])
          and r["global_batch_size"] == 64 and r["per_device_train_batch_size"] >= 1)
    return (PASS if ok else FAIL,
            f'per-device {r["per_device_train_batch_size"]} x {r["gradient_accumulation_steps"]} '
            f'(largest {r["max_batch_size"]}, bf16 {r["bf16"]}), {r["global_step"]} of {r["max_steps"]} steps, '
            f'loss {r["training_loss"]:.3f}; tune {r["tune_seconds"]:.1f} s',
            {k: r[k] for k in ("max_batch_size", "per_device_train_batch_size", "gradient_accumulation_steps",
                               "bf16", "global_step", "training_loss", "tune_seconds")})


# ------------------------------------------------------------------ the paths later issues added
# (the CLI's --adapt, text by a token budget, expandable segments and
# --checkpointing; from Python lengths, a compiled model, checkpointing="auto")

# A batch_schedule entry as the CLI writes it (docs/manual.md, `train --adapt`).
SCHEDULE_FIELDS = ("step", "global_batch_size", "micro_batch_size", "accumulation_steps", "lr", "noise_scale",
                   "reason")
# Recomputing the blocks must cut the peak by at least this share: at the
# rows' sizes the blocks' activations are more than half the peak and
# recomputing keeps only each block's input, so a real recompute cuts far
# more; a peak a few percent lower would mean the activations were kept.
CHECKPOINTING_PEAK_CUT = 0.2
# A compiled model's largest batch against the eager one's, each a binsearch
# to the single sample under the same limit: inductor's partitioner saves no
# more for the backward than eager does (it recomputes cheap pointwise ops
# instead), and aot_eager runs eager's kernels, so the compiled answer is at
# least the eager one's but for the boundary's own spread: the allocator's
# rounding of blocks and the kernels' workspaces move the largest batch by a
# few percent between two searches of the same step (tests/python/test_compile.py
# allows 5 % for the same reason).
COMPILE_TOLERANCE = 0.05
# Graphs compiled inside the trials, after the compile phase: 0 where the batch
# dimension stays dynamic (aot_eager); inductor may guard on a size it
# specialises once (the convnet of docs/benchmarks.md recompiled once). More
# than 2 in a search of a dozen sizes means the batch is not dynamic.
MAX_RECOMPILES = 2


def adapt_changes(o: Outcome) -> int:
    """The log lines of --adapt's changes of an image run's global batch,
    wherever the CLI printed them (stderr when the JSON goes to stdout)."""
    return sum(1 for line in (o.out + "\n" + o.err).splitlines()
               if line.startswith("adapt: global batch ") and "->" in line)


def schedule_problems(schedule: Sequence[Dict], start: int, steps: int, images: bool = True) -> list:
    """What is wrong with a `batch_schedule`: there, the first entry the start
    (step 0, the starting global batch, no noise scale read), every entry with
    the CLI's fields, its steps increasing within the run, each change read a
    positive noise scale and says why; for images the global batch is the
    micro-batch times the accumulation (per rank)."""
    if not schedule:
        return ["no batch_schedule in the JSON"]
    problems = []
    missing = sorted({f for entry in schedule for f in SCHEDULE_FIELDS if f not in entry})
    if missing:
        return [f"batch_schedule entries lack {', '.join(missing)}"]
    first = schedule[0]
    if first["step"] != 0 or first["global_batch_size"] != start:
        problems.append(f'the schedule starts at step {first["step"]} with {first["global_batch_size"]}, '
                        f'not at step 0 with {start}')
    steps_at = [e["step"] for e in schedule]
    if steps_at != sorted(set(steps_at)) or steps_at[-1] >= steps:
        problems.append(f"the schedule's steps {steps_at} do not increase within {steps} steps")
    for e in schedule[1:]:
        ns = e["noise_scale"]
        if ns is None or not math.isfinite(ns) or ns <= 0 or not e["reason"]:
            problems.append(f'the change at step {e["step"]} read noise scale {ns}, reason "{e["reason"]}"')
    for e in schedule:
        if not (math.isfinite(e["lr"]) and e["lr"] > 0) or (
                images and e["global_batch_size"] % (e["micro_batch_size"] * e["accumulation_steps"]) != 0):
            problems.append(f'entry at step {e["step"]}: global {e["global_batch_size"]} = '
                            f'{e["micro_batch_size"]} x {e["accumulation_steps"]}?, lr {e["lr"]}')
    return problems


def describe_schedule(schedule: Sequence[Dict]) -> str:
    return " -> ".join(f'{e["global_batch_size"]}@{e["step"]}' for e in schedule) or "none"


@guarded
def verdict_train_adapt(o: Outcome, start: int, steps: int, gpu: bool) -> Verdict:
    """`train --adapt` (bf16, pinned memory, two workers): every step ran with
    a finite loss, the noise scale the adapter decides by was measured, and
    the batch schedule is as the CLI writes it, one log line per change."""
    r = o.json()
    schedule = r.get("batch_schedule") or []
    problems = []
    if not (o.rc == 0 and r["complete"] and r["steps"] == steps and math.isfinite(r["final_loss"])):
        problems.append(f'exit {o.rc}, complete {r["complete"]}, {r["steps"]} of {steps} steps, '
                        f'loss {r["final_loss"]}')
    problems += schedule_problems(schedule, start, steps)
    ns = r.get("noise_scale")
    if ns is None or not math.isfinite(ns) or ns <= 0:
        problems.append(f'no noise scale to decide by: {ns} ({r.get("noise_scale_note")})')
    lines = adapt_changes(o)
    if schedule and lines != len(schedule) - 1:
        problems.append(f"{lines} 'adapt:' log lines for {len(schedule) - 1} change(s)")
    figures = {"steps": r["steps"], "final_loss": r["final_loss"], "noise_scale": ns,
               "samples_per_s": r.get("samples_per_s"), "oom_recoveries": r.get("oom_recoveries"),
               "changes": max(0, len(schedule) - 1), "schedule": [[e.get("step"), e.get("global_batch_size")]
                                                                   for e in schedule]}
    detail = "; ".join(problems) if problems else (
        f'{r["steps"]} steps, loss {r["final_loss"]:.3f}, noise scale {ns:.4g}; global batch '
        f'{describe_schedule(schedule)} ({len(schedule) - 1} change(s), each logged); '
        f'{r["samples_per_s"]:.0f} samples/s, {r["oom_recoveries"]} recoveries'
        + ("" if gpu else "; CPU: pinned memory does not apply, the plan keeps it off"))
    return PASS if not problems else FAIL, detail, figures


def verdict_train_text(first: Outcome, resumed: Outcome, first_steps: int, total_steps: int, tokens: int,
                       saved: bool) -> Verdict:
    """`train --data text:DIR --adapt` with a checkpoint, then `--resume` from
    it asking for more steps: both runs finish with finite losses; the resume
    goes on from the checkpoint's step (`resumed_from_step` and its log
    line), to the steps asked, with the schedule the first run had. (The
    JSON's `token_budget` is the budget at the end, which --adapt moves.)"""
    for label, o in (("first run", first), ("resume", resumed)):
        if o.timed_out:
            return FAIL, f"{label}: timed out after {o.seconds:.0f} s", {}
    try:
        a, b = first.json(), resumed.json()
    except ValueError as e:
        bad = first if first.rc != 0 else resumed
        return unreadable(bad, e)
    problems = []
    for label, o, r, steps in (("first run", first, a, first_steps), ("resume", resumed, b, total_steps)):
        if not (o.rc == 0 and r.get("complete") and r.get("steps") == steps
                and math.isfinite(r.get("final_loss", math.nan)) and (r.get("tokens_per_s") or 0) > 0):
            problems.append(f'{label}: exit {o.rc}, complete {r.get("complete")}, {r.get("steps")} of {steps} '
                            f'steps, loss {r.get("final_loss")}, {r.get("tokens_per_s")} tokens/s')
    if not saved:
        problems.append("the first run wrote no checkpoint.pt")
    if b.get("resumed_from_step") != first_steps or b.get("already_finished"):
        problems.append(f'the resume went on from step {b.get("resumed_from_step")}, not the checkpoint\'s '
                        f'{first_steps}' + (" (already finished)" if b.get("already_finished") else ""))
    said = [line for line in resumed.err.splitlines() if line.startswith("resumed from ")]
    if not said or f"at step {first_steps} " not in said[0]:
        problems.append(f"the resume said {said[:1] or 'nothing'} about where it went on from")
    sa, sb = a.get("batch_schedule") or [], b.get("batch_schedule") or []
    problems += [f"first run: {p}" for p in schedule_problems(sa, tokens, first_steps, images=False)]
    problems += [f"resume: {p}" for p in schedule_problems(sb, tokens, total_steps, images=False)]
    if sa and [e for e in sb if e.get("step", 0) < first_steps] != sa:
        problems.append(f"the resume's schedule {describe_schedule(sb)} does not continue "
                        f"{describe_schedule(sa)}")
    figures = {"first_steps": a.get("steps"), "resumed_from_step": b.get("resumed_from_step"),
               "steps": b.get("steps"), "token_budget": b.get("token_budget"),
               "target_tokens": b.get("target_tokens"), "tokens_per_s": [a.get("tokens_per_s"), b.get("tokens_per_s")],
               "final_loss": [a.get("final_loss"), b.get("final_loss")],
               "schedule": [[e.get("step"), e.get("global_batch_size")] for e in sb],
               "oom_recoveries": [a.get("oom_recoveries"), b.get("oom_recoveries")]}
    if problems:
        return FAIL, "; ".join(problems), figures
    return (PASS,
            f'{a["steps"]} steps ({tokens} real tokens a step to start, loss {a["final_loss"]:.3f}), checkpoint, '
            f'then --resume from step {b["resumed_from_step"]} to {b["steps"]} (loss {b["final_loss"]:.3f}); '
            f'schedule in tokens {describe_schedule(sb)}; {b["tokens_per_s"]:.0f} tokens/s', figures)


def verdict_expandable(search: Outcome, largest: Optional[Outcome], larger: Optional[Outcome], gpu: bool,
                       boundary_n: Optional[int] = None) -> Verdict:
    """The boundary under `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`:
    the search completes with a largest batch N, N fits in a fresh process,
    ceil(1.25 N) does not (out of memory or over the budget). On the CPU the
    variable is set and ignored: the row says so."""
    status, detail, figures = verdict_max(search)
    note = "" if gpu else " (CPU: PYTORCH_CUDA_ALLOC_CONF set, which the CPU's allocator ignores)"
    figures = dict(figures, boundary_max_batch_size=boundary_n)
    if status != PASS:
        return FAIL, f"search: {detail}{note}", figures
    if largest is None or larger is None:
        return FAIL, f"no probes after the search: {detail}{note}", figures
    fit_status, fit_detail, fit_figures = verdict_fits(largest)
    next_status, next_detail, next_figures = verdict_next(larger)
    figures.update(largest_peak_bytes=fit_figures.get("peak_bytes"), larger_batch=next_figures.get("batch_size"),
                   larger_failure=next_figures.get("failure"))
    ok = fit_status == PASS and next_status == PASS
    return (PASS if ok else FAIL,
            f'{detail}; largest {figures["max_batch_size"]}: {fit_detail}; {next_detail}'
            + (f"; without expandable segments the search found {boundary_n}" if boundary_n else "") + note,
            figures)


def verdict_cli_checkpointing(off: Outcome, on: Outcome) -> Verdict:
    """`probe --model gpt --checkpointing on` against off at one batch: both
    fit, and the peak with the blocks recomputed is at least
    CHECKPOINTING_PEAK_CUT below the peak without."""
    for label, o in (("off", off), ("on", on)):
        if o.timed_out:
            return FAIL, f"--checkpointing {label}: timed out after {o.seconds:.0f} s", {}
    try:
        a, b = off.json(), on.json()
        peak_off, peak_on = a["peak_bytes"], b["peak_bytes"]
    except (ValueError, KeyError, TypeError) as e:
        return unreadable(off if off.rc != 0 else on, e)
    figures = {"batch_size": a.get("batch_size"), "peak_off_bytes": peak_off, "peak_on_bytes": peak_on,
               "ratio": peak_on / peak_off if peak_off else None,
               "step_ms": [a.get("step_ms"), b.get("step_ms")]}
    fits = (off.rc == 0 and on.rc == 0 and a.get("fits") and b.get("fits") and a.get("failure") is None
            and b.get("failure") is None)
    if not fits:
        return (FAIL, f'off: exit {off.rc}, fits {a.get("fits")} {a.get("failure")}; on: exit {on.rc}, fits '
                      f'{b.get("fits")} {b.get("failure")}: {(b.get("error") or a.get("error") or "")[:120]}', figures)
    ok = peak_on <= (1 - CHECKPOINTING_PEAK_CUT) * peak_off
    slower = (b["step_ms"] / a["step_ms"]) if a.get("step_ms") else float("nan")
    return (PASS if ok else FAIL,
            f'batch {a["batch_size"]}: peak {mib(peak_on)} with --checkpointing on against {mib(peak_off)} off '
            f'({peak_on / peak_off:.2f}x; at most {1 - CHECKPOINTING_PEAK_CUT:.2f}x wanted), step '
            f'{slower:.2f}x the time', figures)


@guarded
def verdict_py_lengths(o: Outcome) -> Verdict:
    """tune(lengths=...) searched at the longest length and ran the length
    phase at shorter ones; the plan's token budget covers every bucket
    (micro-batch x its longest length within it), the last bucket the
    longest; then Trainer took its steps of the sampler's micro-batches,
    none over the budget, finite, with no out-of-memory under the limit."""
    r = o.last_json()
    buckets, budget, seen = r["length_buckets"] or [], r["token_budget"] or 0, r["seen_lengths"]
    problems = []
    if o.rc != 0:
        problems.append(f"exit {o.rc}")
    if budget <= 0 or not buckets or buckets[-1]["max_length"] != r["longest"]:
        problems.append(f'token budget {budget}, buckets {buckets}')
    over = [b for b in buckets if b["micro_batch_size"] * b["max_length"] > budget]
    if over:
        problems.append(f"buckets over the budget {budget}: {over}")
    if not seen or max(seen) != r["longest"] or min(seen) >= r["longest"]:
        problems.append(f'the trials ran at lengths {seen}, not the longest {r["longest"]} and shorter')
    if not (r["steps"] == r["steps_asked"] >= 2 and r["finite"] and not r["recoveries"]
            and r["micro_batches_over_budget"] == 0):
        problems.append(f'Trainer: {r["steps"]} of {r["steps_asked"]} steps, finite {r["finite"]}, '
                        f'{len(r["recoveries"])} recoveries, {r["micro_batches_over_budget"]} micro-batches '
                        f'over the budget')
    figures = {k: r.get(k) for k in ("token_budget", "tokens_per_step", "length_buckets", "max_batch_size",
                                     "per_token_bytes", "fit_error", "tune_seconds", "steps", "micro_batches",
                                     "peak_allocated_bytes", "recoveries")}
    if problems:
        return FAIL, "; ".join(problems), figures
    peak = r.get("peak_allocated_bytes")
    return (PASS,
            f'token budget {budget} ({len(buckets)} buckets, longest {r["longest"]}: micro-batch '
            f'{buckets[-1]["micro_batch_size"]}; lengths {min(seen)}-{max(seen)} tried, {r["tune_seconds"]:.1f} s); '
            f'Trainer: {r["steps"]} steps of {r["micro_batches"]} micro-batches, loss {r["losses"][-1]:.3f}, '
            f'no out-of-memory under {r["memory_limit"]}' + (f" (peak {mib(peak)})" if peak else ""), figures)


@guarded
def verdict_py_compile(o: Outcome, gpu: bool) -> Verdict:
    """A torch.compile'd model tuned as it trains: the compile seconds apart
    (the eager tune has none), at most MAX_RECOMPILES graphs inside the
    trials, a largest batch at least (1 - COMPILE_TOLERANCE) x the eager
    one's, the model's state as found; inductor on a GPU."""
    r = o.last_json()
    eager, compiled = r["eager_max_batch_size"], r["max_batch_size"]
    problems = []
    if o.rc != 0 or not (r["complete"] and r["eager_complete"]) or eager <= 0 or compiled <= 0:
        problems.append(f'exit {o.rc}: largest batch {compiled} compiled (complete {r["complete"]}), {eager} eager '
                        f'(complete {r["eager_complete"]})')
    if r["eager_compile_seconds"] is not None or not (r["compile_seconds"] or 0) > 0 or not (r["graphs"] or 0) >= 1:
        problems.append(f'compile seconds {r["compile_seconds"]} ({r["graphs"]} graphs), eager\'s '
                        f'{r["eager_compile_seconds"]}')
    if r["recompiles"] is None or r["recompiles"] > MAX_RECOMPILES:
        problems.append(f'{r["recompiles"]} recompiles inside the trials (at most {MAX_RECOMPILES})')
    if compiled < math.floor((1 - COMPILE_TOLERANCE) * eager):
        problems.append(f"compiled {compiled} below the eager {eager} by more than {COMPILE_TOLERANCE:.0%}")
    if not r["state_identical"]:
        problems.append("the model's or optimizer's state changed")
    if gpu and r["backend"] != "inductor":
        problems.append(f'backend {r["backend"]}, not inductor')
    figures = {k: r.get(k) for k in ("backend", "eager_max_batch_size", "max_batch_size", "compile_seconds",
                                     "recompiles", "graphs", "seconds", "eager_seconds", "state_identical")}
    figures["ratio"] = compiled / eager if eager > 0 else None
    if problems:
        return FAIL, "; ".join(problems), figures
    return (PASS,
            f'{r["model"]}, {r["backend"]}, {r["amp"]} under {r["memory_limit"]}: largest batch {compiled} compiled '
            f'against {eager} eager ({compiled / eager:.2f}x); compile {r["compile_seconds"]:.1f} s apart '
            f'({r["graphs"]} graphs, {r["recompiles"]} recompiles); tune {r["seconds"]:.0f} s; state as found',
            figures)


@guarded
def verdict_py_checkpointing(o: Outcome) -> Verdict:
    """checkpointing="auto" says in one reason what each configuration fits
    and which it kept; the plan (and its JSON) and the model agree with it;
    recomputing the blocks fits the larger batch."""
    r = o.last_json()
    reason = r["reason"] or ""
    m = re.match(r"checkpointing fits (\d+) against (\d+)", reason)
    kept = reason.endswith("kept on")
    problems = []
    if o.rc != 0 or r["reasons_found"] != 1 or m is None or not (kept or "kept off" in reason):
        problems.append(f'exit {o.rc}: {r["reasons_found"]} checkpointing reason(s): "{reason}"')
    on, off = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    if m and on <= off:
        problems.append(f"recomputing fits {on}, no more than {off} without")
    want = "on" if kept else "off"
    if (r["checkpointing"] or "off") != want or r["in_plan_json"] != kept:
        problems.append(f'the plan says {r["checkpointing"]} (in its JSON {r["in_plan_json"]}), the reason {want}')
    if r["recomputing"] != (r["blocks"] if kept else 0):
        problems.append(f'{r["recomputing"]} of {r["blocks"]} blocks left recomputing with checkpointing {want}')
    figures = {"fits_on": on, "fits_off": off, "kept": want, "reason": reason, "max_batch_size": r["max_batch_size"],
               "chosen_batch_size": r["chosen_batch_size"], "seconds": r["seconds"]}
    if problems:
        return FAIL, "; ".join(problems), figures
    return (PASS, f'{r["model"]} under {r["memory_limit"]}: "{reason}"; plan micro-batch {r["chosen_batch_size"]}, '
                  f'{r["recomputing"]} blocks recomputing; {r["seconds"]:.0f} s', figures)
