"""Does a second run answer the same? The same `batchtune tune` several times
while a second process keeps one core busy (what a shared node looks like),
and how often the precision, the largest fit and the chosen batch agree, with
the wall time of each run against its time budget.

    python bench/repeatability.py [--batchtune build/batchtune] [--runs 5]
        [--budget 30] [--no-load] [-- extra tune flags]

Default workload: convnet 3x32x32 in a 256 MiB emulated device, amp auto.
Prints a Markdown table (one row per run) and the agreement; --json FILE
keeps every run's tune JSON.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--batchtune", default="build/batchtune")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--budget", type=float, default=30)
    p.add_argument("--no-load", action="store_true", help="no busy second process")
    p.add_argument("--json", default=None)
    p.add_argument("extra", nargs="*", help="tune flags replacing the default workload")
    return p.parse_args()


def busy_core():
    """A second process spinning on one core until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def confidence(value):
    return value if isinstance(value, str) else f"{100 * value:.1f} %"


def main():
    args = parse()
    workload = args.extra or ["--model", "convnet", "--input", "3x32x32",
                              "--memory-limit", "256MiB", "--amp", "auto"]
    load = None if args.no_load else busy_core()
    runs = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.runs):
                out = os.path.join(tmp, f"run{i}.json")
                command = [args.batchtune, "tune", *workload, "--time-budget", str(args.budget),
                           "--json", out]
                start = time.perf_counter()
                subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
                wall = time.perf_counter() - start
                with open(out) as f:
                    result = json.load(f)
                result["wall_s"] = wall
                runs.append(result)
    finally:
        if load is not None:
            load.kill()

    print(f"`{' '.join(['batchtune tune', *workload, '--time-budget', str(args.budget)])}`, "
          f"{args.runs} runs{'' if args.no_load else ', one core kept busy by a second process'}\n")
    print("| run | amp (confidence) | largest fit | chosen (confidence) | noisy rows | "
          "wall s / budget | phases s |")
    print("|---|---|---|---|---|---|---|")
    for i, r in enumerate(runs):
        noisy = sum(1 for row in r["sweep"] if row["noisy"])
        phases = ", ".join(f"{k} {v:.1f}" for k, v in r["phase_seconds"].items())
        print(f"| {i + 1} | {r['amp']} ({confidence(r['amp_confidence'])}) | "
              f"{r['max_batch_size']} | {r['chosen_batch_size']} "
              f"({confidence(r['selection']['confidence'])}) | {noisy} of {len(r['sweep'])} | "
              f"{r['wall_s']:.1f} / {args.budget:.0f} | {phases} |")

    def agreement(key):
        values = collections.Counter(key(r) for r in runs)
        value, count = values.most_common(1)[0]
        return f"{count} of {len(runs)} ({value})"

    print(f"\nagree: amp {agreement(lambda r: r['amp'])}; largest fit "
          f"{agreement(lambda r: r['max_batch_size'])}; chosen "
          f"{agreement(lambda r: r['chosen_batch_size'])}")
    over = max(r["wall_s"] / args.budget for r in runs)
    print(f"longest run: {100 * over:.0f} % of the budget (the tune's own clock starts after "
          "the process has loaded LibTorch)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
