"""Agreement across the ranks of the user's own process group (no second
rendezvous): the smallest rank's maximum, rank 0's plan for every rank.

`tune` runs the library's pipeline, whose data-parallel agreement
(`DataParallel`: the minimum over ranks after the search, rank 0's plan)
calls the collectives of a `Communicator`; `TorchCommunicator` is that
interface over torch.distributed and the user's group."""
from __future__ import annotations

from typing import Any, Optional

import torch

from . import _core


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


def collective_device(group: Optional[Any] = None,
                      device: Optional[torch.device] = None) -> torch.device:
    """Where a collective's tensors live: the CPU for Gloo; for NCCL the GPU
    the group is bound to (`init_process_group(device_id=...)`), else the
    model's (`device`), else the current one. A torchrun user who moved the
    model to cuda:LOCAL_RANK without `set_device` keeps every rank on its
    own GPU."""
    import torch.distributed as dist

    backend = str(dist.get_backend(group)).lower()
    if "nccl" not in backend or not torch.cuda.is_available():
        return torch.device("cpu")
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    bound = getattr(pg, "bound_device_id", None)
    if bound is not None:
        return torch.device(bound)
    if device is not None and torch.device(device).type == "cuda":
        device = torch.device(device)
        return torch.device("cuda", device.index if device.index is not None
                            else torch.cuda.current_device())
    return torch.device("cuda", torch.cuda.current_device())


def _all_reduce(value: Any, op: str, dtype: torch.dtype, group: Optional[Any],
                device: Optional[torch.device] = None) -> Any:
    """`value` reduced over the ranks by `op` ("MIN", "SUM") as one tensor of
    `dtype`, outside an emulated device's budget."""
    import torch.distributed as dist

    if not active(group):
        return value
    from . import _core

    with _core.uncounted():
        t = torch.tensor([value], dtype=dtype, device=collective_device(group, device))
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
        return t.item()


def all_min(value: int, group: Optional[Any] = None,
            device: Optional[torch.device] = None) -> int:
    return int(_all_reduce(value, "MIN", torch.int64, group, device))


def all_sum(value: float, group: Optional[Any] = None,
            device: Optional[torch.device] = None) -> float:
    """`value` summed over the ranks (float64: counts exact up to 2**53)."""
    return float(_all_reduce(value, "SUM", torch.float64, group, device))


def any_rank(flag: bool, group: Optional[Any] = None,
             device: Optional[torch.device] = None) -> bool:
    """Whether `flag` is true on any rank."""
    import torch.distributed as dist

    if not active(group):
        return flag
    from . import _core

    with _core.uncounted():
        t = torch.tensor([1 if flag else 0], dtype=torch.int64,
                         device=collective_device(group, device))
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
                                   device=collective_device(group))
    return box[0]


class TorchCommunicator(_core.Communicator):
    """The C++ `Communicator` over torch.distributed: the library's
    collectives run on the user's own process group."""

    def __init__(self, group: Optional[Any] = None, device: Optional[torch.device] = None):
        _core.Communicator.__init__(self)
        self.group = group
        self._device = collective_device(group, device)

    def rank(self) -> int:
        return rank(self.group)

    def world_size(self) -> int:
        return world_size(self.group)

    def backend(self) -> str:
        import torch.distributed as dist

        return str(dist.get_backend(self.group)).lower()

    def device(self) -> str:
        return str(self._device)

    def all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        import torch.distributed as dist

        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        dist.all_reduce(tensor, op=ops[op], group=self.group)

    def broadcast(self, tensors, root: int) -> None:
        import torch.distributed as dist

        src = dist.get_global_rank(self.group, root) if self.group is not None else root
        for t in tensors:
            dist.broadcast(t, src=src, group=self.group)

    def report_failure(self, message: str) -> None:
        pass  # torch.distributed's own timeouts name the rank that is gone


def communicator(group: Optional[Any] = None,
                 device: Optional[torch.device] = None) -> Optional[TorchCommunicator]:
    """The library's communicator over `group` (its tensors where
    `collective_device` puts them for a model on `device`) when the job has
    more than one rank, else None (one process: nothing to agree)."""
    return TorchCommunicator(group, device) if active(group) else None
