"""The examples of docs/python.md's section on sequences of varying length,
run as written in a fresh interpreter (by test_huggingface_lengths.py and
test_lightning_lengths.py)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import batchtune


GUIDE = Path(__file__).resolve().parents[2] / "docs" / "python.md"
GUIDE_SECTION = "Language models: sequences of varying length"


def guide_example(marker):
    """The python block of docs/python.md's section on varying lengths that
    holds `marker`."""
    text = GUIDE.read_text()
    start = text.index(f"\n## {GUIDE_SECTION}\n")
    end = text.find("\n## ", start + 1)
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text[start:end], re.S) if marker in b]
    assert len(blocks) == 1, f"{marker}: {len(blocks)} blocks"
    return blocks[0]


def run_as_written(source, tmp_path):
    """The example in a fresh interpreter, in an empty folder, importing this
    batchtune (the paths it was imported by made absolute)."""
    script = tmp_path / "example.py"
    script.write_text(source)
    env = dict(os.environ)
    paths = [str(Path(batchtune.__file__).resolve().parents[1])]
    paths += [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    if env.get("BATCHTUNE_CORE_DIR"):
        env["BATCHTUNE_CORE_DIR"] = os.path.abspath(env["BATCHTUNE_CORE_DIR"])
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout

