"""The rows of a gpu-check run: one `Row` a check, and `Summary`, which
keeps them in summary.json and the table in summary.txt."""
from __future__ import annotations

import json
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Optional, Sequence

PASS, FAIL, SKIP = "pass", "fail", "skip"


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
