"""estimate: the largest batch on a GPU you do not have, from a CPU (#54).

Your training step (forward and loss at the precision, backward, optimizer
step) runs under PyTorch's `FakeTensorMode` on a fake device: every tensor
has its shape, dtype and device but no memory, so a step of ResNet-50 at
batch 3000 on a fake H200 runs on a laptop. A `TorchDispatchMode` above the
fake mode records each storage's size when it first appears and, by a weakref
finalizer, when it goes (as `torch.distributed._tools.mem_tracker.MemTracker`
does): the step's allocation trace. The trace is replayed through the C++
core's model of PyTorch's CUDA caching allocator (`replay_trace`: rounding,
pools, segments, splitting, coalescing) under what the named GPU leaves it
(`gpu_profile`: the card's memory less the CUDA context), and a bisection over
batch sizes, each a fresh trace, finds the largest batch that fits.

The model and the optimizer are never touched: the step runs on fake copies
of the parameters, buffers and optimizer state swapped in for the duration
(`torch.nn.utils.stateless`), under a fresh optimizer of the same class, and
the random generators are put back."""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from . import _checks, _core
from ._memory import MemoryLimit, parse_limit
from ._step import AMP_DTYPES, LossFn, check_batch, to_device
from ._trial import MakeBatch


@dataclasses.dataclass
class EstimateResult:
    """What `batchtune.estimate` found.

    `max_batch_size` is the low end of the interval: the batch to use. It
    fits with the CUDA context at its measured high end and 5 % of the
    allocator's memory (the core's `kUnseenShare`) left to what fake tensors cannot see.
    `max_batch_size_high` is the high end: the context at its low end and
    nothing kept back. `peak_bytes` is the allocator's peak reservation
    (`torch.cuda.max_memory_reserved`) at `batch_size` on a GPU; on the
    emulated CPU device, the tensors' peak (what `batchtune.probe` reports).
    `breakdown` splits the device's memory at that peak: parameters,
    gradients, optimizer_state, activations (the batch and what the forward
    keeps for the backward), temporaries, workspaces (cuBLAS's), the
    allocator's overhead (rounding, split blocks, cached segments) and the
    context outside the allocator (its high end)."""

    device: str
    amp: str
    max_batch_size: int
    max_batch_size_high: int
    batch_size: int
    peak_bytes: int
    tensor_peak_bytes: int
    breakdown: Dict[str, int]
    capacity_bytes: int
    capacity_bytes_high: int
    confidence: str
    unseen: List[str]
    source: str
    traces: List[Dict[str, Any]]

    @property
    def interval(self) -> Tuple[int, int]:
        return self.max_batch_size, self.max_batch_size_high

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


class _StorageTrace(TorchDispatchMode):
    """Records each storage of `device_type` an op returns: allocated when
    first seen, freed when its last reference goes (a weakref finalizer on
    the storage, as MemTracker). A storage resized in place is a new
    allocation and the free of the old one."""

    def __init__(self, device_type: str):
        super().__init__()
        self.device_type = device_type
        self.events: List[Tuple[bool, int, int]] = []
        self._ids = WeakIdKeyDictionary()
        self._sizes: Dict[int, int] = {}
        self._next = 0
        self.phase = "parameters"
        self.phase_of: Dict[int, str] = {}
        self.ops: collections.Counter = collections.Counter()
        # The storage (by id, while it lives) to its current allocation.
        self._current_of: Dict[int, int] = {}

    def storage_id(self, t: torch.Tensor) -> Optional[int]:
        if not isinstance(t, torch.Tensor) or t.device.type != self.device_type:
            return None
        st = t.untyped_storage()
        sid = self._ids.get(st)
        return sid

    def track(self, t: Any) -> None:
        if not isinstance(t, torch.Tensor) or t.device.type != self.device_type:
            return
        st = t.untyped_storage()
        nbytes = int(st.nbytes())
        sid = self._ids.get(st)
        if sid is not None and self._sizes.get(sid) == nbytes:
            return
        new = self._next
        self._next += 1
        self.events.append((True, new, nbytes))
        self._sizes[new] = nbytes
        self.phase_of[new] = self.phase
        if sid is None:
            weakref.finalize(st, self._free_current, id(st), new)
        else:  # resized in place: the new block, then the old one goes
            self._free(sid)
        self._current_of[id(st)] = new
        self._ids[st] = new

    def _free_current(self, st_key: int, first: int) -> None:
        sid = self._current_of.pop(st_key, first)
        self._free(sid)

    def _free(self, sid: int) -> None:
        if self._sizes.pop(sid, None) is not None:
            self.events.append((False, sid, 0))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops[func._schema.name] += 1
        for t in pytree.tree_leaves(out):
            self.track(t)
        return out


@contextlib.contextmanager
def _autocast_on(device_type: str, amp: str) -> Iterator[None]:
    """Autocast for `device_type` at `amp`, set by hand: `torch.autocast("cuda")`
    turns itself off where CUDA is not available, which is where an estimate
    runs; the dispatcher's autocast for CUDA tensors works on fake ones all
    the same. Leaves the autocast state as it found it, its cache cleared at
    the end as `torch.autocast` does."""
    if amp == "off":
        yield
        return
    was_enabled = torch.is_autocast_enabled(device_type)
    was_dtype = torch.get_autocast_dtype(device_type)
    torch.set_autocast_enabled(device_type, True)
    torch.set_autocast_dtype(device_type, AMP_DTYPES[amp])
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled(device_type, was_enabled)
        torch.set_autocast_dtype(device_type, was_dtype)


def _fake_optimizer(optimizer: torch.optim.Optimizer, fake_of: Dict[int, torch.Tensor],
                    fake: Callable[[torch.Tensor], torch.Tensor], for_cuda: bool) -> torch.optim.Optimizer:
    """A fresh optimizer of `optimizer`'s class over the fake parameters, with
    its hyperparameters and its state made fake (where the state sits beside
    its parameter). For a GPU, `foreach` left to its default is on, as torch
    picks it for CUDA parameters (its per-list temporaries are in the trace)."""
    groups = []
    for g in optimizer.param_groups:
        group = {k: v for k, v in g.items() if k != "params"}
        group["params"] = [fake_of[id(p)] for p in g["params"]]
        if for_cuda and "foreach" in group and group["foreach"] is None and not group.get("fused"):
            group["foreach"] = True
        groups.append(group)
    cls = type(optimizer)
    try:
        copy = cls(groups, **optimizer.defaults)
    except TypeError:
        copy = cls(groups)
    for p, state in optimizer.state.items():
        if id(p) not in fake_of:
            continue
        copy.state[fake_of[id(p)]] = {k: _fake_state(v, fake) for k, v in state.items()}
    return copy


def _fake_state(v: Any, fake: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """One entry of the optimizer's state, made fake. A 0-dim tensor (Adam's
    step count) is made anew from its value, so the fake mode knows the
    value and `.item()` on it works as on the real one."""
    if not isinstance(v, torch.Tensor):
        return v
    if v.dim() == 0:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            value = v.item()
        return torch.tensor(value, dtype=v.dtype)
    return fake(v)


@dataclasses.dataclass
class _Trace:
    events: List[Tuple[bool, int, int]]
    category: Dict[int, str]
    ops: collections.Counter


def _trace_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
                make_batch: MakeBatch, n: int, device: torch.device, amp: str,
                for_cuda: bool, steps: int = 2) -> _Trace:
    """`steps` training steps at batch `n` on fake tensors of `device`,
    traced. Two steps: the first allocates the optimizer's state while the
    gradients are live, the second runs with it held, as every later step."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.nn.utils.stateless import _reparametrize_module

    cpu_rng = torch.get_rng_state()
    # No fallback to a real kernel on zeros: an op with no fake implementation
    # fails by name instead of allocating real memory of the batch's size.
    mode = FakeTensorMode(allow_non_fake_inputs=True, allow_fallback_kernels=False)
    tracer = _StorageTrace(device.type)
    try:
        with mode:
            # The fakes are made before the tracer starts (making one runs
            # ops of its own), then tracked as the step's starting memory.
            def fake(t: torch.Tensor) -> torch.Tensor:
                return mode.from_tensor(t.detach()).to(device)

            fake_of: Dict[int, torch.Tensor] = {}
            swapped: Dict[str, torch.Tensor] = {}
            for name, p in model.named_parameters(remove_duplicate=False):
                if id(p) not in fake_of:
                    fake_of[id(p)] = torch.nn.Parameter(fake(p), requires_grad=p.requires_grad)
                swapped[name] = fake_of[id(p)]
            for name, b in model.named_buffers(remove_duplicate=False):
                if b is not None:
                    if id(b) not in fake_of:
                        fake_of[id(b)] = fake(b)
                    swapped[name] = fake_of[id(b)]
            params = [fake_of[id(p)] for p in model.parameters()]
            opt = _fake_optimizer(optimizer, fake_of, fake, for_cuda)
        with mode, tracer:
            tracer.phase = "parameters"
            for t in swapped.values():
                tracer.track(t)
            tracer.phase = "optimizer_state"
            for state in opt.state.values():
                for v in state.values():
                    tracer.track(v)
            # One batch for the steps, held through them as a trial and a
            # training loop hold theirs.
            tracer.phase = "activations"
            batch = make_batch(n)
            check_batch(batch, n)
            batch = to_device(batch, device)
            for t in pytree.tree_leaves(batch):
                tracer.track(t)
            with _reparametrize_module(model, swapped, tie_weights=True):
                for _ in range(steps):
                    for p in params:
                        p.grad = None
                    tracer.phase = "activations"
                    with _autocast_on(device.type, amp):
                        loss = loss_fn(model, batch)
                    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                        raise TypeError("loss_fn(model, batch) must return the scalar loss (a 0-dim "
                                        f"tensor), got {type(loss).__name__}")
                    tracer.phase = "temporaries"
                    loss.backward()
                    del loss
                    opt.step()
            # What the forward made is an activation (what it kept for the
            # backward is what is live at the peak); what the backward and the
            # optimizer made is a temporary unless it is a gradient or the
            # optimizer's state at the end.
            category = dict(tracer.phase_of)
            for p in params:
                sid = tracer.storage_id(p.grad) if p.grad is not None else None
                if sid is not None:
                    category[sid] = "gradients"
            for state in opt.state.values():
                for v in state.values():
                    sid = tracer.storage_id(v)
                    if sid is not None:
                        category[sid] = "optimizer_state"
            del opt, params, swapped, fake_of, batch
    finally:
        torch.set_rng_state(cpu_rng)
    return _Trace(tracer.events, category, tracer.ops)


def _unseen(ops: collections.Counter, for_cuda: bool) -> List[str]:
    """What the trace cannot see, named from the ops the step ran."""
    out = []
    if for_cuda:
        out.append("CUDA's own choices of op (cuDNN's batch norm and convolution, the fused "
                   "attention backends) traced as the CPU's, whose outputs are the same sizes but "
                   "whose saved buffers may differ")
        conv = sum(c for name, c in ops.items() if "convolution" in name)
        mm = sum(c for name, c in ops.items()
                 if name.split("::")[-1] in ("mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "matmul"))
        if conv:
            out.append(f"cuDNN's convolution workspaces ({conv} convolution ops): chosen at run time, "
                       "freed at once")
        if mm:
            out.append(f"cuBLASLt's workspace beyond cuBLAS's ({mm} matrix products)")
        attn = sum(c for name, c in ops.items() if "scaled_dot_product" in name or "_flash" in name
                   or "_efficient_attention" in name)
        if attn:
            out.append(f"the fused attention kernels' own scratch ({attn} calls)")
    custom = sorted({name for name in ops if name.split("::")[0] not in ("aten", "prims", "prim", "profiler")})
    if custom:
        out.append("ops outside aten, traced by their fake implementation, whose own allocations "
                   "are not seen: " + ", ".join(custom))
    return out


def estimate(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
             make_batch: MakeBatch, device: str = "H100", amp: str = "bf16",
             batch_size: Optional[int] = None, memory_limit: MemoryLimit = None,
             margin: float = _core.DEFAULT_MARGIN, max_batch: int = _core.MAX_ESTIMATE_BATCH) -> EstimateResult:
    """The largest batch that fits a GPU you do not have, from a CPU: your
    step traced on fake tensors and replayed through a model of PyTorch's
    CUDA caching allocator under the named GPU's memory.

    Args:
        device: a GPU's short name (`batchtune._core.gpu_profile_names()`:
            H100, H200, A100-80GB, A100-40GB, L4, A10G, RTX-4090), or "cpu" for
            the emulated device of `memory_limit` bytes.
        amp: "off" (fp32), "bf16" or "fp16" autocast, as `batchtune.tune`.
        batch_size: the batch `peak_bytes` and `breakdown` are for; default
            the estimated `max_batch_size`.
        margin: the share of the memory kept free, as `tune`'s (default 10 %):
            the answer is the batch `tune` would find.
        max_batch: the search's largest batch.

    The model, its gradients, the optimizer's state and the random
    generators are left as they were: the step runs on fake copies.

    Example::

        e = batchtune.estimate(model, opt, loss_fn, make_batch, device="H100", amp="bf16")
        print(e.max_batch_size, e.interval, e.peak_bytes, e.breakdown, e.confidence)
    """
    from ._tune import _check_callables

    _check_callables(model, optimizer, loss_fn, make_batch)
    if not isinstance(device, str):
        raise TypeError(f"device: give a GPU's short name (a str) such as 'H100', or 'cpu'; got {device!r}")
    amp = _checks.choice("amp", amp, ("off", "bf16", "fp16"))
    margin = _checks.number("margin", margin, f"from 0 to {_core.MAX_MARGIN:g}")
    if not 0 <= margin <= _core.MAX_MARGIN:
        raise _core.Error(f"margin: must be from 0 to {_core.MAX_MARGIN:g}, got {margin}")
    max_batch = _checks.integer("max_batch", max_batch, 1, _core.MAX_ESTIMATE_BATCH)
    batch_size = _checks.optional_integer("batch_size", batch_size, 1, _core.MAX_ESTIMATE_BATCH)
    limit = parse_limit(memory_limit)
    if device.lower() == "cpu" and limit is None:
        raise _core.Error("memory_limit: device='cpu' is the emulated device; give its size, "
                          "like memory_limit='512MiB'")
    try:
        profile = _core.gpu_profile(device, limit or 0)
    except _core.Error as e:
        raise _core.Error(f"device: {e}") from None
    if limit is not None and not profile.emulated:
        raise _core.Error(f"memory_limit: is the emulated device's size, for device='cpu'; "
                          f"{profile.name} has its own memory")
    if amp == "fp16" and profile.emulated:
        raise _core.Error("amp: fp16 autocast is for CUDA devices; on the CPU use bf16 or off")
    # The step is traced on fake CPU tensors even for a GPU: on a torch with
    # no GPU the autograd engine refuses fake CUDA tensors (it asks the driver
    # for a primary context: "hasPrimaryContext expects a valid device
    # index"). What differs on CUDA is put in by hand: autocast's bf16/fp16
    # (the CPU's op list is close to CUDA's), the optimizers' foreach default.
    target = torch.device("cpu")

    traces: Dict[int, _Trace] = {}

    def trace_at(n: int) -> _Trace:
        if n not in traces:
            try:
                traces[n] = _trace_step(model, optimizer, loss_fn, make_batch, n, target, amp,
                                        for_cuda=not profile.emulated)
            except (TypeError, _core.Error):
                raise
            except Exception as e:  # the fake mode's own errors name the op
                what = str(e).strip().splitlines()[0] if str(e).strip() else ""
                raise _core.Error(
                    f"estimate: the step cannot run on fake tensors at batch {n} "
                    f"({type(e).__name__}: {what[:300]}); an op that reads real data (.numpy(), "
                    ".item() deciding what runs, a shape that depends on values) or has no fake "
                    "implementation cannot be traced; estimate the model without it, or measure "
                    "with batchtune.tune on the GPU") from None
        return traces[n]

    # The search and its rules (the two ends' capacities, the doubling and
    # bisection) are the core's; Python gives it the traces.
    found = _core.estimate_largest_batch(lambda n: trace_at(n).events, profile, margin, max_batch)
    lo, hi = found.low, found.high
    rows = [{"batch_size": t.batch_size, "capacity_bytes": t.capacity, "fits": t.fits,
             "peak_reserved": t.peak_reserved, "peak_requested": t.peak_requested}
            for t in found.trials]
    at = batch_size or max(lo, 1)
    trace = trace_at(at)
    found_at = _core.breakdown_at_peak(trace.events, trace.category, profile, found.capacity.high)
    breakdown = {k: found_at.bytes[k] for k in _core.breakdown_keys()}
    unseen = _unseen(trace.ops, not profile.emulated)
    return EstimateResult(
        device=profile.name, amp=amp, max_batch_size=lo, max_batch_size_high=hi, batch_size=at,
        peak_bytes=found_at.peak_bytes, tensor_peak_bytes=found_at.tensor_peak, breakdown=breakdown,
        capacity_bytes=found.capacity.low, capacity_bytes_high=found.capacity.high,
        confidence=_confidence(profile, lo, hi, margin, unseen),
        unseen=unseen, source=profile.source, traces=rows)


def _confidence(profile, lo: int, hi: int, margin: float, unseen: List[str]) -> str:
    if profile.emulated:
        return (f"from fake tensors against the emulated device's exact byte count: batch {lo} keeps "
                f"{_core.UNSEEN_SHARE:.0%} of the {1 - margin:.0%} of memory_limit a trial may use for what "
                f"the CPU's kernels allocate on their own; {hi} fills it")
    seen = "; not seen: " + "; ".join(unseen) if unseen else ""
    return (f"batch {lo} to {hi} on {profile.name}: the low end takes the CUDA context at its high end "
            f"({profile.context_high >> 20} MiB) and keeps {_core.UNSEEN_SHARE:.0%} of the allocator's "
            f"memory for what fake tensors cannot see, the high end neither; the caching allocator is "
            f"modelled with its default settings, the card's figures are not measured here "
            f"({profile.source}){seen}")
