"""What the integrations share: the micro-batch that reaches a target global
batch exactly, and the one-line error for a missing optional package."""
from __future__ import annotations

from typing import Optional, Tuple

# A micro-batch below the chosen one is taken to reach the target exactly only
# down to this share of it: past that, the throughput lost costs more than a
# global batch a few percent off the target.
_MIN_DIVISOR_SHARE = 0.5


def micro_for_target(chosen: int, target: Optional[int], world_size: int) -> Tuple[int, str]:
    """The micro-batch to train with, and why: `chosen` itself, or the largest
    size below it (down to half) whose accumulation reaches `target` exactly
    over `world_size` processes; never above the target's share of a process."""
    if target is None:
        return chosen, ""
    per_process = max(1, target // world_size)
    if target % world_size == 0:
        for size in range(min(chosen, per_process), 0, -1):
            if size < chosen * _MIN_DIVISOR_SHARE:
                break
            if per_process % size == 0:
                if size == chosen:
                    return chosen, ""
                return size, (f"micro-batch {size}, not the {chosen} chosen: the largest size down "
                              f"to half of it whose accumulation reaches the target {target} exactly")
    if chosen > per_process:
        return per_process, (f"micro-batch {per_process}, not the {chosen} chosen: the target "
                             f"{target} over {world_size} process(es) needs no more")
    return chosen, ""


def missing(integration: str, package: str, pip_name: str, error: ImportError) -> ImportError:
    """The one-line error of an integration whose package is not installed."""
    return ImportError(f"{integration} needs {package}, which is not installed "
                       f"({error}); pip install {pip_name}")
