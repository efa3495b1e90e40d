"""Checks of what a Python caller passes, before anything runs: a wrong type
raises `TypeError`, a wrong value `batchtune.Error` (a `ValueError`), each one
line naming the argument and the fix, in the CLI's words where the CLI has
the same flag. The bounds are the CLI's (`include/batchtune/plan/plan.h`,
`tools/probe_command.cpp`)."""
from __future__ import annotations

import math
import numbers
import os
import stat
import tempfile
from typing import Any, Optional

from . import _core

# kMaxPlanCount: a batch, a target, a warm-up past 2^40 is a typo.
MAX_PLAN_COUNT = 1 << 40
# kMaxProbeSteps of `batchtune probe`: a million steps is hours.
MAX_PROBE_STEPS = 1_000_000
# kMaxProbeSeconds: an hour of timing answers nothing a minute does not.
MAX_PROBE_SECONDS = 3600.0
# kMaxWorkers, kMaxPrefetch, kMaxLearningRate of a plan.
MAX_WORKERS = 256
MAX_PREFETCH = 64
MAX_LEARNING_RATE = 1e3
# The optimizer kinds a plan scales the lr for (sgd: linear; adam, adamw: sqrt).
OPTIMIZERS = ("sgd", "adam", "adamw")


def whole(name: str, value: Any) -> int:
    """`value` as an int; a bool or a float is refused (`batch_size=1.5`,
    `micro_batch_size=True`)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: must be a whole number (an int), got {value!r}")
    return int(value)


def integer(name: str, value: Any, minimum: int = 1, maximum: int = MAX_PLAN_COUNT) -> int:
    """`value` as an int from `minimum` to `maximum` (`whole`'s types)."""
    value = whole(name, value)
    if minimum <= value <= maximum:
        return value
    if maximum != MAX_PLAN_COUNT:
        raise _core.Error(f"{name}: must be from {minimum} to {maximum}, got {value}")
    if value < minimum:
        raise _core.Error(f"{name}: must be at least {minimum}, got {value}")
    raise _core.Error(f"{name}: must be at most {maximum}, got {value}")


def optional_integer(name: str, value: Any, minimum: int = 1,
                     maximum: int = MAX_PLAN_COUNT) -> Optional[int]:
    return None if value is None else integer(name, value, minimum, maximum)


def number(name: str, value: Any, what: str) -> float:
    """`value` as a finite float (an int or a float, not a bool); `what` is
    the range the caller checks next, said when the type is wrong."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: must be a number ({what}), got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise _core.Error(f"{name}: must be a finite number ({what}), got {value}")
    return value


def choice(name: str, value: Any, choices) -> str:
    if not isinstance(value, str) or value not in choices:
        raise _core.Error(f"{name}: {value!r} is not one of {', '.join(choices)}")
    return value


def output_path(name: str, path: Any) -> Optional[str]:
    """A file the call will write at its end, checked now so that a long run
    is not lost to a path that cannot be written: not a folder, not a device
    or FIFO (`/dev/full`), in an existing folder where a file can be made
    (the file is written beside itself and renamed into place)."""
    if path is None:
        return None
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name}: give a file path (a str), or None for no file; got {path!r}")
    path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError(f"{name}: give a file path as a str, got {path!r}")
    if not path:
        raise _core.Error(f"{name}: the path is empty; give a file path, or None for no file")
    target = os.path.realpath(path)  # a link is written through, as the CLI does
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise _core.Error(f"{name}: cannot look at {path} ({e.strerror}); give another path") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise _core.Error(f"{name}: {path} is a folder; give a file path, like "
                          f"{os.path.join(path, 'tune.html')}")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise _core.Error(f"{name}: {path} is not a regular file (a device, a FIFO or a socket); "
                          "give a file path")
    folder = os.path.dirname(target) or "."
    if not os.path.isdir(folder):
        raise _core.Error(f"{name}: the folder {os.path.dirname(path) or folder} does not exist; "
                          "create it first, or give a path in an existing folder")
    try:
        fd, trial = tempfile.mkstemp(prefix=".batchtune-check-", dir=folder)
    except OSError as e:
        raise _core.Error(f"{name}: cannot write in {folder} ({e.strerror}); give a path in a "
                          "folder you can write") from None
    os.close(fd)
    os.unlink(trial)
    return path
