#!/usr/bin/env python3
"""Does a batch that follows the gradient noise scale reach the target
sooner than the best fixed batch? `train --adapt` against a grid of fixed
global batches, from the same seeds, each to the same test accuracy.

    python bench/adaptive_batch.py [--batchtune build/batchtune] [--repeats 3]
        [--seeds 0,1,2] [--grid 32,64,128,256] [--start 32,64] [--adapt-lr gain,batch] [--json FILE]

lenet on Fashion-MNIST (`--data fashion-mnist`) to 85 % test accuracy. Each
fixed way is `train --batch-size G` (the lr scaled from the default 1e-3 at
batch 64 by the plan's rule, sqrt for Adam); the adaptive way is
`train --batch-size START --adapt`, from each start of `--start` (`tuned`:
`train --adapt` alone, from its quick tune's plan; the tune's time is in the wall
column, not the training time). All evaluate every `--eval-samples`
training samples whatever the batch (`--eval-every-samples`), so that no
way is found late for want of an evaluation, and all run at `--amp off`
(no precision measurement in the timing). The ways take turns (fixed 32,
fixed 64, ..., adapt, fixed 32, ...) so that a change in the machine's load
falls on all of them; each runs `--repeats` times on each seed of `--seeds`
and the table gives medians of the runs that reached the target. One seed is
one trajectory: a fixed batch's samples to the target are the same in every
repeat of a seed, so only other seeds show how far they move (lenet in
PyTorch, `bench/noise_scale_check.py samples`: 40,000-54,400 samples at batch
32 over six seeds), and a second table gives them per seed.
`seconds_to_target` is training time only (evaluation excluded); the wall column is the whole
command. The adaptive run of median time prints its schedule (step, global
batch, lr, noise scale).

`--task gpt`: gpt on a text folder (`--text DIR`, default
/usr/share/common-licenses) to a training loss (`--target-loss`, the mean
of the last 10 steps), the global batch counted in real tokens per step: the
plan is tuned once (`tune --data text:DIR --memory-limit`, its token budget
what fits) and every way trains from it, fixed ways at `--target-tokens G`
for each G of the grid, adaptive ways `--target-tokens START --adapt`.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--batchtune", default="build/batchtune")
    p.add_argument("--repeats", type=int, default=3, help="runs of each way (at least 2)")
    p.add_argument("--grid", default="32,64,128,256", help="the fixed global batches")
    p.add_argument("--start", default="32,64",
                   help="where --adapt starts (each a way): a global batch, or 'tuned' for "
                        "`train --adapt` alone, which starts from its quick tune's plan (lenet)")
    p.add_argument("--adapt-every", type=int, default=50)
    p.add_argument("--adapt-lr", default="gain",
                   help="the lr rules of the adaptive ways (train --adapt-lr), each a way: "
                        "gain,batch compares them side by side")
    p.add_argument("--seeds", default="0",
                   help="comma-separated seeds; every way runs on each")
    p.add_argument("--target-accuracy", type=float, default=0.85)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--eval-samples", type=int, default=3200)
    p.add_argument("--json", default=None)
    p.add_argument("--task", choices=["lenet", "gpt"], default="lenet")
    p.add_argument("--text", default="/usr/share/common-licenses", help="gpt: the text folder")
    p.add_argument("--target-loss", type=float, default=2.8, help="gpt: the training loss")
    p.add_argument("--memory-limit", default="256MiB", help="gpt: the tune's memory")
    p.add_argument("--gpt", default="--layers 1 --heads 2 --width 64",
                   help="gpt: the model's flags (small, so that a run takes a minute on a CPU)")
    args = p.parse_args()
    if args.task == "gpt" and "--grid" not in sys.argv:
        args.grid = "512,1024,2048,4096"
    if args.task == "gpt" and "--start" not in sys.argv:
        args.start = "512"
    if args.repeats < 2:
        p.error("--repeats: at least 2 (a single run says nothing of its spread)")
    return args


def tune_text(args, seed, out_dir):
    """The plan every gpt way starts from: tuned once, so all share one budget."""
    path = os.path.join(out_dir, f"plan-{seed}.json")
    cmd = [args.batchtune, "tune", "--model", "gpt", *args.gpt.split(), "--data", f"text:{args.text}",
           "--amp", "off", "--memory-limit", args.memory_limit, "--seed", str(seed),
           "--json", path]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}")
    return path


def train(args, cmd, way, size_flag, seed, path):
    """Runs one way (`cmd` plus its size, and --adapt for "adapt:START") and
    returns its summary JSON with the wall time and seed."""
    if isinstance(way, str):  # "adapt:START", or "adapt:START:RULE" for --adapt-lr RULE
        parts = way.split(":")
        if parts[1] != "tuned":  # "tuned": the quick tune's plan, as a user gets it
            cmd += [size_flag, parts[1]]
        cmd += ["--adapt", "--adapt-every", str(args.adapt_every)]
        if len(parts) > 2:
            cmd += ["--adapt-lr", parts[2]]
    else:
        cmd += [size_flag, str(way)]
    start = time.monotonic()
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}")
    with open(path) as f:
        summary = json.load(f)
    summary["wall_s"] = wall
    summary["seed"] = seed
    return summary


def run_text(args, way, seed, plan, out_dir, index):
    path = os.path.join(out_dir, f"{index}.json")
    cmd = [args.batchtune, "train", "--data", f"text:{args.text}", "--model", "gpt",
           *args.gpt.split(),
           "--plan", plan, "--memory-limit", args.memory_limit, "--seed", str(seed),
           "--epochs", str(args.epochs), "--target-loss", str(args.target_loss),
           "--log-every", "0", "--json", path]
    return train(args, cmd, way, "--target-tokens", seed, path)


def run(args, way, seed, out_dir, index):
    path = os.path.join(out_dir, f"{index}.json")
    cmd = [args.batchtune, "train", "--data", "fashion-mnist", "--model", "lenet",
           "--amp", "off", "--seed", str(seed), "--epochs", str(args.epochs),
           "--target-accuracy", str(args.target_accuracy),
           "--eval-every-samples", str(args.eval_samples), "--log-every", "0",
           "--json", path]
    return train(args, cmd, way, "--batch-size", seed, path)


def median(values):
    return statistics.median(values) if values else None


def spread(values):
    """(max - min) / median, the runs' spread as a share."""
    if len(values) < 2:
        return None
    return (max(values) - min(values)) / statistics.median(values)


def paired_ratio(adapt_runs, fixed_runs):
    """adapt's training time to the target over the fixed way's, paired by
    seed: per seed, the median of adapt's runs over the median of the fixed
    way's (its repeats ran side by side). A seed is one trajectory and its
    repeats re-time that same trajectory, so the seeds, not the runs, are the
    independent draws: the median ratio over the seeds and a 90 % bootstrap
    interval of it (2,000 resamples of the seeds, seeded), or None with fewer
    than 2 seeds where both ways reached the target."""
    def by_seed(runs):
        seconds = {}
        for r in runs:
            if r.get("seconds_to_target") is not None:
                seconds.setdefault(r["seed"], []).append(r["seconds_to_target"])
        return {seed: statistics.median(s) for seed, s in seconds.items()}
    adapt, fixed = by_seed(adapt_runs), by_seed(fixed_runs)
    ratios = [adapt[seed] / fixed[seed] for seed in sorted(adapt) if seed in fixed]
    if len(ratios) < 2:
        return None
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios)))
                     for _ in range(2000))
    return statistics.median(ratios), medians[100], medians[1899], len(ratios)


def verdict(low, high):
    if high <= 1:
        return "no slower than the best fixed batch"
    if low > 1:
        return "slower than the best fixed batch"
    return "cannot tell whether it is slower or faster (the interval holds 1)"


def main():
    args = parse()
    starts = args.start.split(",")
    for b in starts:
        if b == "tuned" and args.task != "lenet":
            sys.exit("--start tuned: for --task lenet (gpt's ways share one tuned plan)")
        if b != "tuned" and not b.isdigit():
            sys.exit(f"--start: {b} is not a global batch or 'tuned'")
    rules = args.adapt_lr.split(",")
    ways = [int(g) for g in args.grid.split(",")] + [
        f"adapt:{b}" if rules == ["gain"] else f"adapt:{b}:{rule}" for b in starts for rule in rules]
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = {way: [] for way in ways}
    text = args.task == "gpt"
    with tempfile.TemporaryDirectory() as out_dir:
        plans = {seed: tune_text(args, seed, out_dir) for seed in seeds} if text else {}
        index = 0
        for round_ in range(args.repeats):
            for seed in seeds:
                for way in ways:
                    runs[way].append(run_text(args, way, seed, plans[seed], out_dir, index)
                                     if text else run(args, way, seed, out_dir, index))
                    runs[way][-1]["round"] = round_
                    index += 1
                    print(f"{way} seed {seed}: {runs[way][-1].get('seconds_to_target')}",
                          file=sys.stderr)

    if text:
        print(f"gpt on {args.text} to a training loss of {args.target_loss} (mean of 10 steps, "
              f"at most {args.epochs} epochs), the batch in real tokens per step; medians of "
              f"{args.repeats} runs on each of {len(seeds)} seeds that reached it\n")
        print("| way | reached | steps | tokens | train s to target (spread) | wall s |")
    else:
        print(f"lenet on Fashion-MNIST to {args.target_accuracy * 100:.0f} % test accuracy "
              f"(evaluated every {args.eval_samples} samples, at most {args.epochs} epochs); "
              f"medians of {args.repeats} runs on each of {len(seeds)} seeds that reached it\n")
        print("| way | reached | steps | samples | train s to target (spread) | wall s |")
    print("|---|---:|---:|---:|---:|---:|")
    amount = "tokens" if text else "samples_to_target"
    medians = {}
    for way in ways:
        reached = [r for r in runs[way] if r.get("target_reached") or
                   (r.get("target") or {}).get("reached")]
        seconds = [r["seconds_to_target"] for r in reached]
        medians[way] = median(seconds)
        unit = " tokens" if text else ""
        name = (f"fixed batch {way}{unit}" if isinstance(way, int)
                else f"--adapt from {way[6:]}{unit}")
        s = spread(seconds)
        cell = "-" if not seconds else f"{medians[way]:.2f}" + (f" (±{s * 50:.0f} %)" if s else "")
        print(f"| {name} | {len(reached)} of {len(runs[way])} | "
              f"{median([r['steps_to_target'] for r in reached]) or '-'} | "
              f"{median([r[amount] for r in reached]) or '-'} | {cell} | "
              f"{median([r['wall_s'] for r in runs[way]]):.1f} |")
    if len(seeds) > 1:
        print(f"\n{'tokens' if text else 'samples'} to the target per seed (median of its runs; - "
              "where none reached it):\n")
        print("| way | " + " | ".join(f"seed {seed}" for seed in seeds) + " |")
        print("|---|" + "---:|" * len(seeds))
        for way in ways:
            name = f"fixed batch {way}" if isinstance(way, int) else f"--adapt from {way[6:]}"
            cells = []
            for seed in seeds:
                samples = [r[amount] for r in runs[way] if r["seed"] == seed and
                           r.get(amount) is not None and r.get("seconds_to_target") is not None]
                cells.append(f"{median(samples):.0f}" if samples else "-")
            print(f"| {name} | " + " | ".join(cells) + " |")
    fixed = {w: m for w, m in medians.items() if isinstance(w, int) and m is not None}
    best = min(fixed, key=fixed.get) if fixed else None
    for way in ways:
        if isinstance(way, int):
            continue
        if best is not None and medians[way] is not None:
            print(f"\n--adapt from {way[6:]} / best fixed (batch {best}): "
                  f"{medians[way] / fixed[best]:.2f}x the training time to the target")
            paired = paired_ratio(runs[way], runs[best])
            if paired is not None:
                ratio, low, high, pairs = paired
                print(f"paired by seed ({pairs} seeds): median {ratio:.2f}x, 90 % "
                      f"interval {low:.2f}-{high:.2f}x: {verdict(low, high)}. The best fixed "
                      "batch is picked from the same runs, which favours it.")
        adapt_runs = sorted((r for r in runs[way] if r.get("seconds_to_target") is not None),
                            key=lambda r: r["seconds_to_target"])
        if adapt_runs:
            middle = adapt_runs[len(adapt_runs) // 2]
            print(f"\nschedule of the median run from {way[6:]} (step: global batch, lr, noise "
                  "scale):")
            for c in middle.get("batch_schedule", []):
                noise = f"{c['noise_scale']:.0f}" if c.get("noise_scale") is not None else "-"
                print(f"- {c['step']}: {c['global_batch_size']}, lr {c['lr']:.3g}, noise {noise}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({str(w): r for w, r in runs.items()}, f, indent=1)


if __name__ == "__main__":
    main()
