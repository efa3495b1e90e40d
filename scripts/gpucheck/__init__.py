"""The checks of scripts/gpu-check, a module an idea: rows.py (the rows and
their table), running.py (bounded commands, nvidia-smi), verdicts.py (pure
readings of an outcome), checks.py (the run). scripts/gpu_check.py is the
command line."""
