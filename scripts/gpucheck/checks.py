"""The run: `Checks` runs each row's command against the CLI, bounded by
its own limit and by the overall deadline, and writes each row as it is known."""
from __future__ import annotations

import json
import math
import os
import random
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from .rows import FAIL, PASS, SKIP, Row, Summary
from .running import SMI_TIMEOUT_S, MemoryWatch, Outcome, Smi, end_group, run_bounded
from .verdicts import (
    Verdict, unreadable, verdict_attention, verdict_claim_bf16_batch, verdict_claim_throughput,
    verdict_claim_utilization, verdict_clean_error, verdict_env, verdict_fits,
    verdict_hidden_env, verdict_max, verdict_monitor_vs_smi, verdict_next, verdict_oom,
    verdict_recover, verdict_step_scaling, verdict_train, verdict_tune_memory,
    clearly_larger, verdict_hf, verdict_lightning, verdict_lightning_adapt, verdict_py_probe,
    verdict_py_trainer, verdict_py_tune, verdict_train_adapt, verdict_train_text, verdict_expandable,
    verdict_cli_checkpointing, verdict_py_lengths, verdict_py_compile, verdict_py_checkpointing)

# The Python rows' programs, run by the python given (`--python`).
PYTHON_JOBS = Path(__file__).resolve().with_name("python_jobs.py")

# A check that would start with less time than this left is a skip row (a
# failure of the run): no check finishes in less.
MIN_START_S = 20


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
        return self.command_run(name, limit, [self.cli, *cli_args], env=env)

    def command_run(self, name: str, limit: float, cmd: Sequence[str], env: Optional[Dict] = None) -> Outcome:
        shown = " ".join(["batchtune" if cmd[0] == self.cli else Path(cmd[0]).name, *map(str, cmd[1:])])
        print(f"\n== {name}: {shown} ({self.left():.0f} s left)", flush=True)
        o = run_bounded(cmd, self.bound(limit), env=env, stdout_path=self.work / f"{name}.out")
        (self.work / f"{name}.err").write_text(o.err)
        print(o.err[-1500:], end="", flush=True)
        self.keep(name, o)
        return o

    def job_run(self, name: str, limit: float, *job_args: str) -> Outcome:
        """One of python_jobs.py's jobs in a fresh process (the batchtune
        package from the environment the shell set)."""
        return self.command_run(name, limit, [self.python, str(PYTHON_JOBS), *job_args, "--device", self.dev])

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
        """`part`: "basic" (the CLI's rows but the claims), "claims" (the
        guide's claims, run once nothing else competes for the machine: the
        shell runs them after the test build), "python" (the Python
        package's rows: the shell sets where batchtune is imported from),
        or "all"."""
        self.summary.set_mode(self.mode)
        if part in ("basic", "all"):
            self.basic()
        if part in ("claims", "all"):
            self.claims()
        if part in ("python", "all"):
            self.python_rows()

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
        # The paths later issues added to the CLI: --adapt, text by a token
        # budget with a resume, the allocator's expandable segments, --checkpointing.
        self.train_adapt()
        self.train_text()
        self.expandable_segments(img)
        self.cli_checkpointing()

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
            end_group(mon)
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

    def train_adapt(self) -> None:
        """`train --adapt` at bf16 with pinned memory and two loader workers:
        the steps run, the loss is finite, the noise scale is measured and
        the batch schedule is there as the CLI writes it, one log line per
        change (on the CPU pinned memory does not apply: the plan keeps it off)."""
        # 100 steps: the adapter's first decision waits for about 30 noise
        # measurements, then one every 10 steps.
        steps, start = (100, 64) if self.gpu else (100, 16)
        model = (["--model", "resnet18", "--input", "3x96x96"] if self.gpu else
                 ["--model", "convnet", "--input", "3x32x32"])
        self.check("train-adapt", 150, verdict_train_adapt,
                   ["train", "--device", self.dev, *model, "--batch-size", str(start), "--amp", "bf16",
                    "--workers", "2", "--pin-memory", "on", "--adapt", "--adapt-every", "10",
                    "--steps", str(steps), "--json", "-"], start, steps, self.gpu)

    def write_text(self, folder: Path, paragraphs: int, shortest: int, longest: int) -> None:
        """A folder of text as tests/text_test.cpp lays it out: paragraphs
        (separated by a blank line) of `shortest` to `longest` bytes, seeded,
        in files at two depths."""
        shutil.rmtree(folder, ignore_errors=True)
        (folder / "sub").mkdir(parents=True)
        rng = random.Random(52)
        files = [[] for _ in range(4)]
        for p in range(paragraphs):
            n = rng.randint(shortest, longest)
            files[p % 4].append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n)))
        for i, paras in enumerate(files):
            ((folder / "sub") if i % 2 else folder).joinpath(f"doc{i}.txt").write_text("\n\n".join(paras) + "\n")

    def train_text(self) -> None:
        """`train --data text:DIR --adapt` from a tuned token plan, with a
        checkpoint; then `--resume` from it asking for more steps: both runs
        finish, the resume goes on from the checkpoint's step with the
        schedule it had."""
        name = "train-text"
        if not self.enough_time(name):
            return
        text, ckpt, plan = self.work / "text", self.work / "text-ckpt", self.work / "text-plan.json"
        shutil.rmtree(ckpt, ignore_errors=True)
        if self.gpu:
            self.write_text(text, 4000, 32, 512)
            gpt = ["--layers", "2", "--heads", "4", "--width", "256", "--memory-limit", "2GiB", "--amp", "bf16"]
            tokens, budget = "8192", "10"
        else:
            self.write_text(text, 800, 16, 64)
            gpt = ["--layers", "1", "--heads", "2", "--width", "32", "--memory-limit", "16MiB", "--amp", "off"]
            tokens, budget = "256", "8"
        first_steps, total_steps = 10, 20
        data = ["--data", f"text:{text}", "--device", self.dev, *gpt]
        start = time.monotonic()
        tune = self.cli_run(f"{name}-tune", 90, "tune", *data, "--time-budget", budget, "--json", str(plan))
        if tune.rc != 0 or not plan.exists():
            self.row(Row(name, FAIL, f"the tune for the token plan: exit {tune.rc}: {tune.err.strip()[-300:]}",
                         {}, time.monotonic() - start))
            return
        train = ["train", "--plan", str(plan), *data, "--target-tokens", tokens, "--adapt", "--adapt-every", "5",
                 "--checkpoint", str(ckpt), "--checkpoint-every", "5", "--json", "-"]
        first = self.cli_run(f"{name}-first", 90, *train, "--steps", str(first_steps))
        saved = (ckpt / "checkpoint.pt").exists()
        resumed = self.cli_run(f"{name}-resume", 90, *[a for a in train if a not in ("--plan", str(plan))],
                               "--steps", str(total_steps), "--resume")
        status, detail, figures = verdict_train_text(first, resumed, first_steps, total_steps, int(tokens), saved)
        self.row(Row(name, status, detail, figures, time.monotonic() - start))

    def expandable_segments(self, img: List[str]) -> None:
        """The boundary rows under `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`:
        the search's answer runs in a fresh process and a clearly larger batch
        does not, the allocator mapping its segments as they grow. The CPU's
        allocator ignores the variable: the rehearsal runs the same commands
        with it set."""
        name = "expandable-segments"
        if not self.enough_time(name):
            return
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
        limit = "3GiB" if self.gpu else "48MiB"
        start = time.monotonic()
        search = self.cli_run(f"{name}-search", 120, "tune", "--device", self.dev, *img, "--memory-limit", limit,
                              "--search-only", "--strategy", "binsearch", "--margin", "0.1", "--json", "-", env=env)
        try:
            n = int(search.json()["max_batch_size"])
        except (ValueError, KeyError, TypeError):
            n = 0
        probes = []
        if n > 0:
            base = ["probe", "--device", self.dev, *img, "--memory-limit", limit, "--steps", "2", "--json", "-"]
            for label, batch in (("largest", n), ("larger", clearly_larger(n))):
                probes.append(self.cli_run(f"{name}-{label}", 60, *base, "--batch-size", str(batch), env=env))
        earlier = self.results.get("boundary-search")
        status, detail, figures = verdict_expandable(search, *(probes or [None, None]), self.gpu,
                                                     earlier.get("max_batch_size") if isinstance(earlier, dict) else None)
        self.row(Row(name, status, detail, figures, time.monotonic() - start))

    def cli_checkpointing(self) -> None:
        """`probe --model gpt --checkpointing on` against off at one batch:
        both fit, and the peak with the blocks recomputed is clearly lower."""
        name = "cli-checkpointing"
        if not self.enough_time(name):
            return
        gpt = (["--model", "gpt", "--input", "int64:1024", "--vocab", "2048", "--layers", "6", "--heads", "8",
                "--width", "512", "--batch-size", "8", "--amp", "bf16", "--steps", "3"] if self.gpu else
               ["--model", "gpt", "--input", "int64:128", "--vocab", "512", "--layers", "4", "--heads", "2",
                "--width", "64", "--batch-size", "16", "--amp", "off", "--steps", "1", "--min-time", "0"])
        start = time.monotonic()
        runs = [self.cli_run(f"{name}-{mode}", 90, "probe", "--device", self.dev, *gpt, "--checkpointing", mode,
                             "--json", "-") for mode in ("off", "on")]
        status, detail, figures = verdict_cli_checkpointing(*runs)
        self.row(Row(name, status, detail, figures, time.monotonic() - start))

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
                end_group(monitor)
                mon_out, _ = monitor.communicate()
        finally:
            end_group(busy)
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

    # -- the Python package's rows (python_jobs.py, each job a fresh process)
    def job_check(self, name: str, limit: float, verdict: Callable[..., Verdict], job_args: Sequence[str],
                  *verdict_args) -> Optional[Outcome]:
        if not self.enough_time(name):
            return None
        o = self.job_run(name, limit, *job_args)
        status, detail, figures = verdict(o, *verdict_args)
        self.row(Row(name, status, detail, figures, o.seconds))
        return o

    def python_rows(self) -> None:
        gpu = self.gpu
        self.py_tune()
        self.job_check("py-trainer", 240, verdict_py_trainer, ["trainer"], gpu)
        self.job_check("lightning", 180, verdict_lightning, ["lightning"])
        self.job_check("lightning-adapt-fp16", 300, verdict_lightning_adapt, ["lightning", "--adapt-fp16"], gpu)
        self.job_check("hf", 180, verdict_hf, ["hf"])
        # The paths later issues added from Python: lengths and the token
        # budget, a compiled model, checkpointing="auto".
        self.job_check("py-lengths", 180 if gpu else 240, verdict_py_lengths, ["lengths"])
        self.job_check("py-compile", 240 if gpu else 300, verdict_py_compile, ["compile"], gpu)
        self.job_check("py-checkpointing", 180 if gpu else 240, verdict_py_checkpointing, ["checkpointing"])

    def py_tune(self) -> None:
        """batchtune.tune leaves no trace, and its answer holds in fresh
        processes: the largest batch runs, a clearly larger one does not."""
        o = self.job_check("py-tune", 180 if self.gpu else 240, verdict_py_tune, ["tune"], self.gpu)
        n = 0
        if o is not None:
            try:
                n = int(o.last_json()["max_batch_size"])
            except (ValueError, KeyError, TypeError):
                n = 0
        if n <= 0:
            for name in ("py-tune-largest", "py-tune-larger"):
                self.row(Row(name, SKIP, "no size from py-tune"))
            return
        self.job_check("py-tune-largest", 90, verdict_py_probe, ["probe", "--batch-size", str(n)], True)
        self.job_check("py-tune-larger", 90, verdict_py_probe, ["probe", "--batch-size", str(clearly_larger(n))],
                       False)
