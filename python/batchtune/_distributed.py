"""Agreement across the ranks of the user's own process group (no second
rendezvous): the smallest rank's maximum, rank 0's plan for every rank."""
from __future__ import annotations

from typing import Any, Optional

import torch


def active(group: Optional[Any] = None) -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def world_size(group: Optional[Any] = None) -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group)
    return 1


def rank(group: Optional[Any] = None) -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group)
    return 0


def _collective_device(group: Optional[Any]) -> torch.device:
    import torch.distributed as dist

    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_min(value: int, group: Optional[Any] = None) -> int:
    import torch.distributed as dist

    if not active(group):
        return value
    from . import _core

    with _core.uncounted():
        t = torch.tensor([value], dtype=torch.int64, device=_collective_device(group))
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
        return int(t.item())


def any_rank(flag: bool, group: Optional[Any] = None) -> bool:
    """Whether `flag` is true on any rank."""
    import torch.distributed as dist

    if not active(group):
        return flag
    from . import _core

    with _core.uncounted():
        t = torch.tensor([1 if flag else 0], dtype=torch.int64, device=_collective_device(group))
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return bool(t.item())


def broadcast_object(obj: Any, group: Optional[Any] = None) -> Any:
    """Rank 0's `obj` (of `group`) on every rank."""
    import torch.distributed as dist

    if not active(group):
        return obj
    from . import _core

    src = dist.get_global_rank(group, 0) if group is not None else 0
    box = [obj]
    with _core.uncounted():
        dist.broadcast_object_list(box, src=src, group=group,
                                   device=_collective_device(group))
    return box[0]
