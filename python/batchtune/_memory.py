"""The measured device and its memory: the CUDA caching allocator, or on the CPU
the emulated byte budget that C++ installs as LibTorch's CPU allocator (the
extension and Python's torch share one LibTorch, so Python's tensors count)."""
from __future__ import annotations

import contextlib
import gc
import os
from typing import Iterator, Optional, Union

import torch

from . import _core

MemoryLimit = Union[int, str, None]


def resolve_device(device: Union[str, torch.device, None],
                   model: Optional[torch.nn.Module] = None) -> torch.device:
    """`None`/"auto": the GPU the model's parameters are on; else, with CUDA,
    this process's GPU (`LOCAL_RANK`'s under a launcher such as torchrun,
    which runs one process per GPU, else the current device), so that every
    rank measures its own GPU and not GPU 0; else the CPU."""
    if device is None or (isinstance(device, str) and device == "auto"):
        first = next(model.parameters(), None) if model is not None else None
        if first is not None and first.device.type == "cuda":
            index = first.device.index
            return torch.device("cuda", index if index is not None else torch.cuda.current_device())
        if not torch.cuda.is_available():
            return torch.device("cpu")
        local_rank = os.environ.get("LOCAL_RANK", "")
        if local_rank.isdigit() and int(local_rank) < torch.cuda.device_count():
            return torch.device("cuda", int(local_rank))
        return torch.device("cuda", torch.cuda.current_device())
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device: give 'cpu', 'cuda', 'cuda:N', a torch.device or None, got {device!r}")
    try:
        device = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise _core.Error(f"device: {device!r} is not a device; use cpu, cuda or cuda:N "
                          "(or None: CUDA when there is one, else the CPU)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise _core.Error(f"device: {device} asked for, but this machine has no usable CUDA "
                          "device; use cpu (or None: CUDA when there is one)")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    if device.type not in ("cpu", "cuda"):
        raise _core.Error(f"device: '{device}' is not supported; use cpu or cuda[:N]")
    if device.type == "cpu":
        # One CPU, whatever its index says (the Hugging Face Trainer's DDP on
        # CPUs gives each rank cpu:LOCAL_RANK).
        return torch.device("cpu")
    if device.type == "cuda" and device.index >= torch.cuda.device_count():
        raise _core.Error(f"device: {device}: there are only {torch.cuda.device_count()} CUDA "
                          "device(s), numbered from 0")
    return device


def oom_count(device: torch.device) -> int:
    """Allocations the device's allocator refused so far: the caching
    allocator's `num_ooms` on CUDA, the CPU budget's refusals on the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.memory_stats(device).get("num_ooms", 0))
    return int(_core.budget_oom_count())


def parse_limit(limit: MemoryLimit) -> Optional[int]:
    """Bytes of a memory limit given as bytes or as text ("512MiB", "2GiB")."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, (int, str)):
        raise _core.Error(f"memory_limit: give bytes (an int) or a size like '512MiB', got {limit!r}")
    if isinstance(limit, str):
        return _core.parse_size(limit, "memory_limit")
    if limit < 1:
        raise _core.Error(f"memory_limit: must be at least 1 byte, got {limit}")
    # The CLI's reading of the same number (2**63 - 1 and above are too large).
    return _core.parse_size(str(int(limit)), "memory_limit")


def installed_limit() -> Optional[int]:
    """The CPU budget an enclosing `emulated_memory` block set, or None."""
    if not _core.budget_installed():
        return None
    budget = _core.budget_get()
    return None if budget == _core.UNLIMITED else budget


def device_memory(device: torch.device, limit: MemoryLimit) -> "_core.DeviceMemory":
    """`device`'s memory with `limit`; on the CPU no limit inside an
    `emulated_memory` block is the block's budget (not half the RAM)."""
    limit = parse_limit(limit)
    if limit is None and device.type == "cpu":
        limit = installed_limit()
    return _core.make_device_memory(str(device), limit)


@contextlib.contextmanager
def emulated_memory(limit: MemoryLimit) -> Iterator["_core.DeviceMemory"]:
    """Runs the block with the CPU's emulated device memory set to `limit`:
    any CPU allocation past it raises `torch.OutOfMemoryError`, as a full GPU
    does. The previous budget comes back afterwards.

    Example::

        with batchtune.emulated_memory("256MiB"):
            trainer.step(batch)      # an out-of-memory here is recovered from
    """
    previous = _core.budget_get()
    memory = device_memory(torch.device("cpu"), limit)
    try:
        yield memory
    finally:
        _core.budget_set(previous)


@contextlib.contextmanager
def restored_budget() -> Iterator[None]:
    """Puts the CPU budget back as it was (a tune's limit is only the tune's)."""
    installed = _core.budget_installed()
    previous = _core.budget_get()
    try:
        yield
    finally:
        if installed or _core.budget_installed():
            _core.budget_set(previous if installed else -1)


def storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _cpu_storages(tensors) -> Iterator[torch.Tensor]:
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            continue
        if hasattr(t, "to_local"):  # a DTensor (FSDP2): this rank's shard holds the bytes
            t = t.to_local()
        yield t


def count_only(tensors) -> int:
    """Makes the emulated device hold only `tensors` (a model's and optimizer's)
    of what the process holds now: everything else already allocated (the
    data, what earlier code left, garbage collected here first) is host
    memory, as it would be beside a GPU, so a tune's answer does not depend on
    what ran before it. Returns the bytes that stopped counting."""
    if not _core.budget_installed():
        return 0
    gc.collect()
    return int(_core.budget_count_only(list(_cpu_storages(tensors))))


def uncounted_bytes(tensors) -> int:
    """Bytes of the distinct CPU storages among `tensors` that the budget does
    not count (they were allocated before it was installed)."""
    if not _core.budget_installed():
        return 0
    seen = set()
    total = 0
    for t in _cpu_storages(tensors):
        key = storage_key(t)
        if key == 0 or key in seen:
            continue
        seen.add(key)
        if not _core.budget_counts(t):
            total += t.untyped_storage().nbytes()
    return total
