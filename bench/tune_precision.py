#!/usr/bin/env python3
"""Tune what you train, measured: for each model, `batchtune tune` under the
same memory limit at `--amp off` and `--amp bf16`, one after the other in one
run. Prints a markdown table: the largest micro-batch that fits, the chosen
one and its throughput, at each precision.

    bench/tune_precision.py build/batchtune [--limit 256MiB] [--time-budget 60]
"""
import argparse
import json
import subprocess
import sys
import tempfile

WORKLOADS = [
    ("convnet", "3x64x64"),
    ("lenet", "1x28x28"),
]


def tune(cli, model, shape, amp, limit, budget):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([cli, "tune", "--model", model, "--input", shape, "--device", "cpu",
                        "--memory-limit", limit, "--amp", amp, "--time-budget", str(budget),
                        "--json", out.name], check=True, stdout=subprocess.DEVNULL)
        return json.load(open(out.name))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("cli")
    parser.add_argument("--limit", default="256MiB")
    parser.add_argument("--time-budget", type=float, default=60)
    args = parser.parse_args()
    print(f"memory limit {args.limit}, time budget {args.time_budget:g} s per tune\n")
    print("| model | input | amp | largest batch that fits | chosen batch | samples/s at it | tune s |")
    print("|---|---|---|---:|---:|---:|---:|")
    for model, shape in WORKLOADS:
        for amp in ("off", "bf16"):
            r = tune(args.cli, model, shape, amp, args.limit, args.time_budget)
            chosen = r.get("chosen_batch_size")
            row = next((s for s in r["sweep"] if s["batch_size"] == chosen), None)
            seconds = sum(r.get("phase_seconds", {}).values())
            print(f"| {model} | {shape} | {r['amp']} | {r['max_batch_size']} | {chosen} | "
                  f"{row['samples_per_s']:.0f} | {seconds:.0f} |" if row else
                  f"| {model} | {shape} | {r['amp']} | {r['max_batch_size']} | {chosen} | - | {seconds:.0f} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
