"""A `DistributedDataParallel` model's step that cannot desynchronise the ranks.

DDP all-reduces gradient buckets inside `backward`, as they become ready. A
rank that runs out of memory halfway through a backward leaves its peers'
bucket all-reduces unmatched, and its next collective pairs with a peer's
bucket: a hang until the timeout, or Gloo's "Received data size doesn't
match". So batchtune runs every micro-batch of a DDP step locally (under
`no_sync()`, where DDP's forward and backward communicate nothing), lets the
ranks agree on an out-of-memory, and only then averages the gradients once,
as DDP would have (each rank's sum over the group / its size), and hands
rank 0's buffers to every rank, as DDP's forward does. The trials of `tune`
and the `Trainer` run this same step."""
from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Optional

import torch

from . import _core, _distributed

DDP = torch.nn.parallel.DistributedDataParallel


def ddp_of(model: torch.nn.Module) -> Optional[DDP]:
    """The model as `DistributedDataParallel` (under `torch.compile`'s wrapper
    too: DDP is compiled after wrapping), or None when it is not one."""
    model = getattr(model, "_orig_mod", model)
    return model if isinstance(model, DDP) else None


def local_backward(model: torch.nn.Module) -> ContextManager[Any]:
    """Where a micro-batch's forward and backward communicate nothing: DDP's
    `no_sync()` (no gradient all-reduce, no buffer broadcast), else nothing
    to turn off."""
    ddp = ddp_of(model)
    return ddp.no_sync() if ddp is not None else contextlib.nullcontext()


def group_of(model: torch.nn.Module, group: Optional[Any] = None) -> Optional[Any]:
    """The process group a step agrees over: the one given, else the DDP
    model's own, else the default group."""
    ddp = ddp_of(model)
    if group is None and ddp is not None:
        return ddp.process_group
    return group


def average_gradients(model: torch.nn.Module) -> None:
    """After the ranks agreed that every local backward went through: the
    gradients averaged over the DDP model's group, in place, and rank 0's
    buffers on every rank. A parameter that has a gradient on some ranks
    only (an unused branch) gets zeros where it has none, as DDP's
    `find_unused_parameters` gives it; one without a gradient on any rank
    keeps none. Nothing here allocates beyond those zeros, so nothing here
    runs out of memory after the agreement. No DDP model: nothing to do."""
    import torch.distributed as dist

    ddp = ddp_of(model)
    if ddp is None or not _distributed.active(ddp.process_group):
        return
    group = ddp.process_group
    params = [p for p in ddp.module.parameters() if p.requires_grad]
    device = params[0].device if params else torch.device("cpu")
    with _core.uncounted():
        has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32,
                           device=_distributed.collective_device(group, device))
        dist.all_reduce(has, group=group)
        anywhere = has.tolist()
    grads = []
    for p, count in zip(params, anywhere):
        if count == 0:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    if grads:
        works = [dist.all_reduce(g, group=group, async_op=True) for g in grads]
        for work in works:
            work.wait()
        torch._foreach_div_(grads, dist.get_world_size(group))
    if ddp.broadcast_buffers:
        for buffer in ddp.module.buffers():
            dist.broadcast(buffer, src=dist.get_global_rank(group, 0), group=group)
