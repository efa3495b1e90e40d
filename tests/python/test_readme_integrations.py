"""The examples of docs/python.md's "With Lightning" and "With the Hugging
Face Trainer" (the README points there) run as written on a CPU: each runs the full search and sweep, about a minute
on a loaded 2-core machine."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "python.md"


def example(heading: str) -> str:
    text = GUIDE.read_text()
    start = text.index(f"\n## {heading}\n")
    # To the next heading of the same level or above.
    ends = [i for i in (text.find("\n## ", start + 1), text.find("\n# ", start + 1)) if i >= 0]
    end = min(ends) if ends else len(text)
    blocks = re.findall(r"```python\n(.*?)```", text[start:end], re.S)
    assert len(blocks) == 1, f"{heading}: {len(blocks)} python blocks"
    return blocks[0]


@pytest.mark.parametrize("heading,package", [("With Lightning", "lightning"),
                                             ("With the Hugging Face Trainer", "transformers")])
def test_guide_example_runs_as_written(heading, package, tmp_path):
    pytest.importorskip(package)
    script = tmp_path / "example.py"
    script.write_text(example(heading))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env=dict(os.environ))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "tune.html").exists()  # the report the example asks for


def test_guide_has_both_examples():
    assert "BatchTune(" in example("With Lightning")
    assert "tune_training_args(" in example("With the Hugging Face Trainer")
