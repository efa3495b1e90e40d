"""The README's Python quick start runs on a CPU as written: a subprocess
of examples/python/from_python.py (ResNet-18 under an emulated 256 MiB
device), with a shorter time budget (its --time-budget argument) so the
default test run stays short."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_from_python_example_runs_on_a_cpu(tmp_path):
    pytest.importorskip("torchvision")
    example = ROOT / "examples" / "python" / "from_python.py"
    env = dict(os.environ)
    done = subprocess.run([sys.executable, str(example), "--time-budget", "20"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    largest = int(re.search(r"largest batch that fits: (\d+)", out).group(1))
    chosen = int(re.search(r"chosen micro-batch: +(\d+)", out).group(1))
    assert 0 < chosen <= largest
    steps = re.findall(r"^step (\d+): loss ([0-9.]+), lr ([0-9.]+)$", out, re.M)
    assert [int(s) for s, _, _ in steps] == [1, 2], out  # two optimizer steps of the plan
    assert (tmp_path / "tune.html").read_text().lstrip().startswith("<!DOCTYPE html>")


def test_readme_snippet_is_the_example():
    """Every line of the README's snippet is a line of the example (which adds
    its data set, prints and the --time-budget argument; the README shows the
    default, 60 s)."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Quick start (Python)"):]
    snippet = section[section.index("```python\n") + len("```python\n"):]
    snippet = snippet[:snippet.index("```")]
    example = (ROOT / "examples" / "python" / "from_python.py").read_text()
    lines = set(example.replace("time_budget=TIME_BUDGET", "time_budget=60").splitlines())
    for line in snippet.splitlines():
        if line.strip():
            assert line in lines, f"README line not in from_python.py: {line!r}"
    assert "else 60\n" in example


def readme_snippet(heading: str) -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index(heading):]
    snippet = section[section.index("```python\n") + len("```python\n"):]
    return snippet[:snippet.index("```")]


def test_text_lengths_example_trains_an_epoch_by_the_token_budget_as_the_readme_shows(tmp_path):
    """README "Text of varying length": every line of its snippet is a line of
    examples/python/text_lengths.py, which tunes by the lengths and trains an
    epoch with no out-of-memory."""
    example = ROOT / "examples" / "python" / "text_lengths.py"
    lines = set(example.read_text().splitlines())
    for line in readme_snippet("### Text of varying length").splitlines():
        if line.strip():
            assert line in lines, f"README line not in text_lengths.py: {line!r}"
    done = subprocess.run([sys.executable, str(example)], cwd=tmp_path, env=dict(os.environ),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    budget = int(re.search(r"token budget: (\d+) padded tokens", out).group(1))
    assert budget > 0
    assert int(re.search(r"trained (\d+) steps", out).group(1)) > 0
    assert re.search(r"out-of-memory recoveries: 0$", out, re.M), out
