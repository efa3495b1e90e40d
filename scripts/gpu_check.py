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
import sys
from pathlib import Path
from typing import Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the package beside this file

from gpucheck.checks import Checks  # noqa: E402
from gpucheck.rows import FAIL, PASS, SKIP, Row, Summary, passed, table  # noqa: E402


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
    checks.add_argument("--part", choices=["basic", "claims", "python", "all"], default="all")
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
