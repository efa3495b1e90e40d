"""A compiled model (`torch.compile`) in a tune: its trials run compiled, as
it will train, the batch dimension dynamic from the first, and the time
spent compiling measured apart from every trial.

The compile phase runs the step at batch 2 (sizes 0 and 1 are always
specialised by dynamo) and at 16 (a convolution's guard) for each precision
the tune will run — and with the sweep at batch 1 and forward-only, as the
sweep and the evaluation search run them — before the time budget's phases:
the graphs it compiles take any batch size after it, so the search and the
sweep time compiled steps, not compilation. Graphs compiled later, inside
the trials, are counted as recompiles (a model that
specialises on the batch size anyway) and warned of."""
from __future__ import annotations

import time
import warnings
from typing import Any, Callable, Iterable, List, Optional, Tuple

import torch

from . import _core

# The batch the compile phase compiles at: the smallest size dynamo keeps
# symbolic (0 and 1 are specialised).
COMPILE_BATCH = 2
# And a second size: PyTorch's convolution guards batches of 2 to 15 apart
# from larger ones (its fake kernel's choice), so a convnet compiles a
# second graph at 16, in the phase rather than inside a trial.
LARGER_BATCH = 16


def is_compiled(model: torch.nn.Module) -> bool:
    """`torch.compile(model)` (an `OptimizedModule`) or `model.compile()`."""
    optimized = getattr(torch._dynamo.eval_frame, "OptimizedModule", ())
    return isinstance(model, optimized) or getattr(model, "_compiled_call_impl", None) is not None


def mark_dynamic(batch: Any, dims: Tuple[int, ...]) -> None:
    """Marks `dims` of every tensor of `batch` (a tensor, or tuples, lists and
    dicts of them) dynamic for dynamo, so the first compile is for any size;
    a size dynamo specialises anyway (1) is left to it."""
    if isinstance(batch, torch.Tensor):
        for dim in dims:
            if batch.dim() > dim:
                torch._dynamo.maybe_mark_dynamic(batch, dim)
    elif isinstance(batch, dict):
        for value in batch.values():
            mark_dynamic(value, dims)
    elif isinstance(batch, (tuple, list)):
        for value in batch:
            mark_dynamic(value, dims)


class CompileWatch:
    """Counts the graphs dynamo compiles, and the seconds compiling takes, by
    its compile callbacks, while entered; `phase_done()` marks the end of the
    compile phase (graphs compiled after it are recompiles). `clock`: seconds,
    `time.perf_counter` unless a test gives its own."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.seconds = 0.0
        self.graphs = 0
        self.recompiles = 0
        self.phase_seconds = 0.0
        self._phase = True
        self._started: Optional[float] = None

    def _start(self, _args: Any) -> None:
        self._started = self.clock()

    def _end(self, _args: Any) -> None:
        if self._started is not None:
            self.seconds += self.clock() - self._started
            self._started = None
        if self._phase:
            self.graphs += 1
        else:
            self.recompiles += 1

    def __enter__(self) -> "CompileWatch":
        handler = torch._dynamo.callback.callback_handler
        handler.register_start_callback(self._start)
        handler.register_end_callback(self._end)
        return self

    def __exit__(self, *exc: Any) -> None:
        handler = torch._dynamo.callback.callback_handler
        handler.remove_start_callback(self._start)
        handler.remove_end_callback(self._end)

    def phase_done(self, seconds: float) -> None:
        self._phase = False
        self.phase_seconds = seconds

    def record(self) -> Tuple[float, int, int, str]:
        """(seconds, graphs, recompiles, note) for the result, the JSON and
        the report (the core's `CompileRecord`)."""
        note = (f"The compile phase ran {self.phase_seconds:.1f} s before the time budget's phases "
                f"and is not counted in it; the trials then timed compiled steps.")
        if self.recompiles:
            note += (f" {self.recompiles} graph(s) were compiled again inside the trials: the "
                     "model specialises on the batch size; that time was charged to the trials.")
        return self.seconds, self.graphs, self.recompiles, note

    def warn(self) -> None:
        if self.recompiles:
            warnings.warn(f"batchtune: the compiled model was compiled again {self.recompiles} "
                          "time(s) inside the trials: it specialises on the batch size (or a "
                          "shape of the batch), so a step at a new size recompiles; see "
                          "TORCH_LOGS=recompiles", stacklevel=3)


def compile_phase(run: Callable[[str, int, bool], "_core.TrialResult"], amps: Iterable[str],
                  sweep: bool, watch: CompileWatch) -> None:
    """Compiles the steps the tune will run, by one trial each (`run(amp,
    batch_size, forward_only)`), leaving no trace as every trial does: the
    training step at `COMPILE_BATCH` and `LARGER_BATCH` at each precision of
    `amps`; with the sweep (which times batch 1, a size dynamo specialises,
    and searches the evaluation batch forward-only in eval mode) also at
    batch 1 and the forward-only step. A model with no such guard compiles
    nothing at the second size: one step's cost. An out-of-memory there is left to the search (it then
    compiles at the size that fits); any other error is the model's and
    raised."""
    started = watch.clock()
    steps = [(COMPILE_BATCH, False), (LARGER_BATCH, False)] + \
        ([(1, False), (COMPILE_BATCH, True), (LARGER_BATCH, True)] if sweep else [])
    for amp in amps:
        for batch_size, forward_only in steps:
            try:
                trial = run(amp, batch_size, forward_only)
            except Exception as e:  # noqa: BLE001 - dynamo's own errors (BackendCompilerFailed)
                raise _core.Error(f"model: the compiled step failed at batch {batch_size} "
                                  f"(amp {amp}): {_one_line(e)}; tune the model uncompiled, or fix "
                                  "what torch.compile says") from e
            if trial.failure == "does_not_run":
                raise _core.Error(f"model: the compiled step failed at batch {batch_size} "
                                  f"(amp {amp}): {trial.error}; tune the model uncompiled, or fix "
                                  "what torch.compile says")
    watch.phase_done(watch.clock() - started)


def _one_line(e: BaseException) -> str:
    """Dynamo's message on one line, without its advice on logging."""
    lines = [line.strip() for line in str(e).splitlines()
             if line.strip() and not line.startswith(("Set TORCHDYNAMO", "You can suppress"))]
    return " ".join(lines)[:500] or type(e).__name__


def compiled_amps(amp: str, device: torch.device) -> List[str]:
    """The precisions a tune at `amp` runs trials at, so the compile phase
    compiles each: amp auto measures fp32 against bf16 on the CPU, and takes
    the GPU's own choice on CUDA."""
    if amp != "auto":
        return [amp]
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return [_core.choose_cuda_amp(major, minor)[0]]
    return ["off", "bf16"]
