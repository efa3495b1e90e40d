"""The integrations are optional: batchtune imports without Lightning or
transformers, and asking for a missing one says what to pip install."""
import subprocess
import sys

PROBE = r"""
import sys
import batchtune
assert "lightning" not in sys.modules and "transformers" not in sys.modules, "imported eagerly"
sys.modules["lightning"] = None           # as if not installed
sys.modules["pytorch_lightning"] = None
sys.modules["transformers"] = None
for name in ("lightning", "huggingface"):
    try:
        getattr(batchtune, name)
    except ImportError as e:
        print(e)
    else:
        raise SystemExit(f"batchtune.{name} imported without its package")
"""


def test_batchtune_imports_without_them_and_a_missing_one_says_what_to_install():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("batchtune.lightning needs Lightning") and lines[0].endswith("pip install lightning")
    assert lines[1].startswith("batchtune.huggingface needs transformers") and lines[1].endswith("pip install transformers")
