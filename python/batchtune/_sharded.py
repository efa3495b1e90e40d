"""A model sharded with PyTorch's `fully_shard` (FSDP2), tuned on several ranks.

An FSDP2 module all-gathers its parameters before its forward (and again
before its backward) and reduce-scatters its gradients after its backward:
collectives inside the step. A rank that runs out of memory halfway through
leaves its peers in a gather it will not join. So, while a tune's trials
run in lockstep (`_core.Lockstep`), every FSDP module meets the other ranks
first: before its forward (ahead of FSDP's own gather), when the gradient of
its outputs arrives (ahead of the backward gather) and when that of its
inputs is done (ahead of the reduce-scatter), and once more before FSDP's
end-of-backward callback. A rank that failed meets them with its failure
instead, and every rank raises the out-of-memory together. After such a step
FSDP2's record of the aborted step (its forward order for the backward
prefetch, its training states) is cleared on every rank, or the next step's
prefetch would gather on one rank what the other does not; torch 2.11 has no
public call for that, so `reset` sets the private fields its own
end-of-backward callback sets."""
from __future__ import annotations

import sys
from typing import Any, Callable, List

import torch

from . import _core

def sharded_modules(model: torch.nn.Module) -> List[torch.nn.Module]:
    """The model's FSDP2 modules (the root first), none when it is not sharded."""
    if "torch.distributed.fsdp" not in sys.modules:
        return []  # nothing was sharded in this process
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model: torch.nn.Module) -> bool:
    return bool(sharded_modules(model))


class _MeetInBackward(torch.autograd.Function):
    """Identity whose backward meets the other ranks (`meet()`) first."""

    @staticmethod
    def forward(ctx, meet: Callable[[], None], *xs: torch.Tensor):
        ctx.meet = meet
        return tuple(x.view_as(x) for x in xs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        ctx.meet()
        return (None, *grads)


def _through_meeting(meet: Callable[[], None], values: Any) -> Any:
    """`values` (a tensor or a tuple of values) with its tensors that need a
    gradient passed through `_MeetInBackward`."""
    single = isinstance(values, torch.Tensor)
    items = (values,) if single else values
    if not isinstance(items, tuple):
        return values
    at = [i for i, v in enumerate(items) if isinstance(v, torch.Tensor) and v.requires_grad]
    if not at:
        return values
    met = _MeetInBackward.apply(meet, *(items[i] for i in at))
    out = list(items)
    for i, v in zip(at, met):
        out[i] = v
    return out[0] if single else tuple(out)


class PeerMeetings:
    """The meetings of an FSDP2 model's step with the other ranks, installed on
    its FSDP modules until `remove()`. `lockstep.check_peers()` False (a peer
    ran out of memory) raises `torch.OutOfMemoryError` on this rank too."""

    def __init__(self, model: torch.nn.Module, lockstep: "_core.Lockstep"):
        self.lockstep = lockstep
        self.handles = []
        modules = sharded_modules(model)
        for module in modules:
            # Before FSDP's own pre-forward hook, which gathers the parameters.
            self.handles.append(module.register_forward_pre_hook(
                lambda _m, _args: self.meet(), prepend=True))
            # After FSDP's pre-forward (its post-backward hook on the inputs):
            # the inputs' gradient meets first, then FSDP reduce-scatters.
            self.handles.append(module.register_forward_pre_hook(
                lambda _m, args: _through_meeting(self.meet, args)))
            # After FSDP's post-forward (its pre-backward hook on the outputs):
            # the outputs' gradient meets first, then FSDP gathers again.
            self.handles.append(module.register_forward_hook(
                lambda _m, _args, out: _through_meeting(self.meet, out)))
        if modules:
            # The root's outputs: before FSDP's end-of-backward callback
            # (which reduce-scatters what the inputs' hooks did not), queued
            # ahead of it.
            self.handles.append(modules[0].register_forward_hook(
                lambda _m, _args, out: _through_meeting(self._queue_meeting, out)))

    def meet(self) -> None:
        if self.lockstep.failure_agreed():
            return
        if not self.lockstep.check_peers():
            raise torch.OutOfMemoryError("another rank ran out of memory in this step")

    def _queue_meeting(self) -> None:
        torch.autograd.Variable._execution_engine.queue_callback(self.meet)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def reset(model: torch.nn.Module) -> None:
    """After a step that stopped halfway (on every rank alike): FSDP2's state
    as its end-of-backward callback leaves it, the gradients accumulated
    without reduction dropped, every module resharded. Local: no
    collective."""
    modules = sharded_modules(model)
    if not modules:
        return
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

    for module in modules:
        state = module._get_fsdp_state()
        state._training_state = TrainingState.IDLE
        state._modules_to_run_forward.clear()
        group = state._fsdp_param_group
        if group is not None:
            group._training_state = TrainingState.IDLE
            group.finalize_backward()
            # Gradients a micro-batch without reduction accumulated: the step
            # runs again from its first micro-batch.
            for param in group.fsdp_params:
                param.unsharded_accumulated_grad = None
                unsharded = getattr(param, "_unsharded_param", None)
                if unsharded is not None:
                    unsharded.grad = None
        module.reshard()
    root = modules[0]._get_fsdp_state()
    root._comm_ctx.post_forward_order.clear()
    root._comm_ctx.reduce_scatter_state = None
    root._state_ctx.post_backward_final_callback_queued = False

