#!/usr/bin/env python3
"""Time to accuracy: does a plan reach the same model sooner? From the same
seed, each way trains until a target and the table says how long it took.

    python bench/time_to_accuracy.py [--batchtune build/batchtune] [--repeats 2]
        [--json tta.json] [--skip-gpt] [--skip-lenet]

lenet on Fashion-MNIST (`--data fashion-mnist`) to 85 % test accuracy:
  (a) fixed    `--batch-size 64` at the default lr;
  (b) throughput  `tune --objective throughput` then `train --plan`;
  (c) goodput     `tune --objective goodput` then `train --plan`;
gpt on a text folder (`--data text:/usr/share/common-licenses`, as
bench/token_budget reads it) to a training loss, (a) and (b) only.
Each tune is `--memory-limit 64MiB --time-budget 30` and the train runs
under the same limit, but gpt's fixed batch of 64 (64 x 128 tokens does
not fit 64 MiB) runs without one. The ways take turns (a, b, c, a, b, c, ...) so that
a change in the machine's load falls on all of them; each is run
`--repeats` times and the table gives medians. Evaluation comes every
`--eval-samples` training samples whatever the batch (`--eval-every` is
that many samples over the global batch), so that a large batch is not
found late for want of an evaluation.

Columns: steps to the target, samples to it, `seconds_to_target` (training
time only, evaluation excluded), the train command's wall time (process
start to exit: loading the data, the evaluations, the stop), the tune's
wall time, and total = tune + train wall time. A run that does not reach
the target within `--epochs` is counted and shown as "not reached"; its
medians leave it out. Prints a markdown table; --json FILE keeps every
run's train summary and plan.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

MEMORY_LIMIT = "64MiB"
TUNE_BUDGET_S = 30


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--batchtune", default="build/batchtune")
    p.add_argument("--repeats", type=int, default=2, help="runs of each way (at least 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target-accuracy", type=float, default=0.85)
    p.add_argument("--epochs", type=int, default=8, help="lenet: at most this many epochs")
    p.add_argument("--eval-samples", type=int, default=6400,
                   help="lenet: evaluate every this many training samples")
    p.add_argument("--text", default="/usr/share/common-licenses")
    p.add_argument("--text-input", default="int64:16..128",
                   help="gpt: token lengths (longer paragraphs are cut in pieces)")
    p.add_argument("--target-loss", type=float, default=2.8)
    p.add_argument("--text-epochs", type=int, default=8, help="gpt: at most this many epochs")
    p.add_argument("--skip-lenet", action="store_true")
    p.add_argument("--skip-gpt", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.repeats < 2:
        p.error("--repeats: at least 2, so that a median means something")
    return args


def timed(command):
    """Runs `command`; its wall seconds, or raises with its output."""
    start = time.perf_counter()
    r = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - start
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(command)}\n{r.stdout[-3000:]}")
    return wall, r.stdout


class Bench:
    def __init__(self, args, tmp):
        self.args = args
        self.tmp = tmp
        self.count = 0

    def path(self, name):
        self.count += 1
        return os.path.join(self.tmp, f"{self.count:03d}-{name}.json")

    def tune(self, workload, objective):
        plan = self.path(f"plan-{objective}")
        wall, _ = timed([self.args.batchtune, "tune", *workload, "--objective", objective,
                         "--memory-limit", MEMORY_LIMIT, "--time-budget", str(TUNE_BUDGET_S),
                         "--json", plan])
        with open(plan) as f:
            return plan, json.load(f), wall

    def train(self, workload, way_flags, stop_flags, limit=True):
        out = self.path("train")
        memory = ["--memory-limit", MEMORY_LIMIT] if limit else []
        wall, console = timed([self.args.batchtune, "train", *workload, *way_flags, *memory,
                               "--seed", str(self.args.seed),
                               "--log-every", "0", *stop_flags, "--json", out])
        with open(out) as f:
            summary = json.load(f)
        summary["wall_s"] = wall
        summary["console_tail"] = console.splitlines()[-6:]
        return summary


def plan_of(tune_json):
    return tune_json.get("plan", tune_json)


def lenet_runs(bench, args):
    workload = ["--data", "fashion-mnist", "--model", "lenet"]
    tune_workload = workload  # tune reads the data's shape and classes too

    def stop(global_batch):
        every = max(1, round(args.eval_samples / global_batch))
        return ["--epochs", str(args.epochs), "--eval-every", str(every),
                "--target-accuracy", str(args.target_accuracy)]

    runs = {"a": [], "b": [], "c": []}
    for repeat in range(args.repeats):
        for way in ("a", "b", "c"):
            if way == "a":
                run = bench.train(workload, ["--batch-size", "64"], stop(64))
                run["tune_s"] = 0.0
            else:
                objective = "throughput" if way == "b" else "goodput"
                plan_file, tuned, tune_s = bench.tune(tune_workload, objective)
                plan = plan_of(tuned)
                run = bench.train(workload, ["--plan", plan_file], stop(plan["global_batch_size"]))
                run["tune_s"] = tune_s
                run["plan"] = plan
            run["repeat"] = repeat
            runs[way].append(run)
            report_progress("lenet", way, run)
    return runs


def gpt_runs(bench, args):
    workload = ["--data", f"text:{args.text}", "--model", "gpt", "--input", args.text_input]
    stop = ["--epochs", str(args.text_epochs), "--target-loss", str(args.target_loss)]
    runs = {"a": [], "b": []}
    for repeat in range(args.repeats):
        for way in ("a", "b"):
            if way == "a":
                # 64 x 128 tokens does not fit the 64 MiB the plan is tuned for.
                run = bench.train(workload, ["--batch-size", "64"], stop, limit=False)
                run["tune_s"] = 0.0
            else:
                plan_file, tuned, tune_s = bench.tune(workload, "throughput")
                run = bench.train(workload, ["--plan", plan_file], stop)
                run["tune_s"] = tune_s
                run["plan"] = plan_of(tuned)
            run["repeat"] = repeat
            runs[way].append(run)
            report_progress("gpt", way, run)
    return runs


def reached(run):
    return bool(run.get("target") and run["target"].get("reached"))


def report_progress(name, way, run):
    where = (f"step {run['steps_to_target']}, {run['seconds_to_target']:.1f} s training"
             if reached(run) else f"not reached in {run['steps']} steps")
    print(f"{name} ({way}) run {run['repeat'] + 1}: {where}; train wall {run['wall_s']:.1f} s, "
          f"tune {run['tune_s']:.1f} s", file=sys.stderr, flush=True)


WAYS = {
    "a": "(a) fixed batch 64, default lr",
    "b": "(b) plan of --objective throughput",
    "c": "(c) plan of --objective goodput",
}


def median(values, fmt="{:.1f}"):
    return fmt.format(statistics.median(values)) if values else "-"


def table(title, target, runs):
    print(f"\n{title}, to {target}; medians of the runs that reached it\n")
    print("| way | batch (micro x accumulation), lr | reached | steps | samples | "
          "train s to target | train wall s | tune s | total s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for way, rs in runs.items():
        ok = [r for r in rs if reached(r)]
        # Each run's own, once: a tune may choose differently from run to run.
        batches = []
        for r in rs:
            batch = f"{r['micro_batch_size']} x {r['accumulation_steps']} = {r['global_batch_size']}"
            if r.get("plan"):
                batch += f", lr {r['plan']['lr']:.3g}"
            if batch not in batches:
                batches.append(batch)
        batch = " / ".join(batches)
        tune = [r["tune_s"] for r in rs]
        print(f"| {WAYS[way]} | {batch} | {len(ok)} of {len(rs)} | "
              f"{median([r['steps_to_target'] for r in ok], '{:.0f}')} | "
              f"{median([r['samples_to_target'] for r in ok], '{:.0f}')} | "
              f"{median([r['seconds_to_target'] for r in ok])} | "
              f"{median([r['wall_s'] for r in ok])} | "
              f"{median(tune)} | "
              f"{median([r['tune_s'] + r['wall_s'] for r in ok])} |")


def main():
    args = parse()
    if not os.path.exists(args.batchtune):
        sys.exit(f"--batchtune: {args.batchtune} not found; build it first "
                 "(cmake --build build --target batchtune)")
    results = {"args": vars(args)}
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(args, tmp)
        if not args.skip_lenet:
            results["lenet"] = lenet_runs(bench, args)
        if not args.skip_gpt:
            results["gpt"] = gpt_runs(bench, args)
    print(f"seed {args.seed}; tunes: --memory-limit {MEMORY_LIMIT} --time-budget "
          f"{TUNE_BUDGET_S}; {args.repeats} runs of each way, taking turns")
    if "lenet" in results:
        table(f"lenet on Fashion-MNIST (evaluated every ~{args.eval_samples} samples, at most "
              f"{args.epochs} epochs)", f"{100 * args.target_accuracy:.0f} % test accuracy",
              results["lenet"])
    if "gpt" in results:
        table(f"gpt on text:{args.text} (--input {args.text_input}, at most "
              f"{args.text_epochs} epochs)",
              f"a mean training loss of {args.target_loss} over 10 steps", results["gpt"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
