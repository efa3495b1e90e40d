#!/usr/bin/env python3
"""nvidia-smi's stand-in for `scripts/gpu-check --rehearse`: the answers of a
machine with no GPU process and 100 MiB used, in nvidia-smi's formats, so
that the rehearsal parses what the real one prints."""
import sys
import time

args = sys.argv[1:]
if "-L" in args:
    sys.exit(0)  # no GPU listed
query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
if any(a.startswith("--query-compute-apps") for a in args):
    sys.exit(0)  # no compute app: nothing holds a context
if query == "memory.used":
    print("100")
    sys.exit(0)
if query == "utilization.gpu,memory.used":
    loop = "-lms" in args
    for _ in range(10 if loop else 1):
        print("50, 100", flush=True)
        if loop:
            time.sleep(0.3)
    sys.exit(0)
print(f"fake nvidia-smi: no answer for {' '.join(args)}", file=sys.stderr)
sys.exit(2)
