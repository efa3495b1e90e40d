"""probe, tune and env: the Python faces of `batchtune probe`, `tune` and `env`.

The C++ core searches, sweeps, chooses, plans and writes the report (`tune`
is the library's pipeline, `batchtune::tune`); Python supplies the model, the
optimizer, the loss and the batches."""
from __future__ import annotations

import contextlib
import json
import threading
import time
import warnings
from typing import (Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple,
                    Union)

import torch

from . import _checks, _core, _distributed
from ._checkpointing import MODES as CHECKPOINTING_MODES
from ._checkpointing import CheckpointingKnob
from ._configuration import ConfigurationRun, Knob, batch_of
from ._compile import CompileWatch, compile_phase, compiled_amps, is_compiled
from ._flops import forward_flops_per_sample
from ._lengths import parse_lengths
from ._memory_format import MemoryFormatKnob, check_memory_format, current_format, has_convolutions
from ._memory import (MemoryLimit, count_only, device_memory, resolve_device, restored_budget,
                      uncounted_bytes)
from ._results import ProbeResult, SweepRow, TuneResult
from ._step import LossFn, check_amp_device
from ._trial import MakeBatch, Runner, Subject
from .plan import Plan, optimizer_kind, reference_lr


def env() -> Dict[str, Any]:
    """What the machine has, as `batchtune env --json`: `torch_version`,
    `cuda_available`, `cuda_reason`, `devices`, `nvml_available`, `cpu_cores`,
    `ram_total_bytes`, ...

    Example::

        >>> batchtune.env()["cuda_available"]
        False
    """
    return json.loads(_core.env_json())


def _check_callables(model, optimizer, loss_fn, make_batch) -> None:
    if not isinstance(model, torch.nn.Module):
        raise _core.Error(f"model: must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise _core.Error(f"optimizer: must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not callable(loss_fn):
        raise _core.Error("loss_fn: must be callable as loss_fn(model, batch) -> scalar loss")
    if not callable(make_batch):
        raise _core.Error("make_batch: must be callable as make_batch(n) -> a batch of n samples")


# One tune or probe at a time in a process: the CPU's emulated budget, the
# CUDA allocator's statistics and the random generators a trial restores are
# the process's, so a second one running beside it would measure (and put
# back) the first's.
_RUNNING = threading.Lock()
_running_in: Optional[str] = None


@contextlib.contextmanager
def _one_at_a_time(what: str) -> Iterator[None]:
    global _running_in
    if not _RUNNING.acquire(blocking=False):
        raise RuntimeError(
            f"batchtune.{what}: another tune or probe is running in this process (thread "
            f"'{_running_in}'); the emulated memory budget, the device's memory statistics and the "
            "random generators are the process's, so a second one would corrupt both: run them one "
            "after the other, or in separate processes")
    _running_in = threading.current_thread().name
    try:
        yield
    finally:
        _running_in = None
        _RUNNING.release()


def _state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    for p in model.parameters():
        yield p
        yield p.grad
    yield from model.buffers()
    for group in optimizer.param_groups:
        for p in group["params"]:
            yield p
            yield p.grad
    for st in optimizer.state.values():
        yield from (v for v in st.values() if isinstance(v, torch.Tensor))


@contextlib.contextmanager
def _measured_device(device: torch.device, memory_limit: MemoryLimit, model, optimizer):
    """The device memory for a tune or probe. On the CPU the emulated device
    holds what a GPU would: the model and optimizer state, those made before
    the budget was installed charged as a ballast of their size (never
    touched, so it costs no RAM), and what the trials allocate; the rest of
    the process's tensors are host memory (`count_only`)."""
    with restored_budget():
        if device.type == "cpu":
            count_only(_state_tensors(model, optimizer))
        memory = device_memory(device, memory_limit)
        ballast = None
        if device.type == "cpu":
            resident = uncounted_bytes(_state_tensors(model, optimizer))
            if resident > 0:
                if resident > memory.capacity_bytes:
                    raise _core.Error(
                        f"memory_limit: {_core.format_bytes(memory.capacity_bytes)} is less than the "
                        f"model's own {_core.format_bytes(resident)}; give a larger limit")
                ballast = torch.empty(resident, dtype=torch.uint8)
        try:
            yield memory
        finally:
            del ballast
            memory.release_cached()


def probe(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
          make_batch: MakeBatch, batch_size: int = 64, *, device: Union[str, torch.device, None] = None,
          memory_limit: MemoryLimit = None, margin: float = _core.DEFAULT_MARGIN, steps: int = 3,
          warmup_steps: int = 1, amp: str = "auto",
          min_time: float = _core.SWEEP_MIN_TIMED_SECONDS) -> ProbeResult:
    """One trial: the real step (your forward and loss, backward, your
    optimizer's step) at `batch_size`; does it fit, how much memory at peak,
    how fast. The model, optimizer, gradients, random generators and autocast
    state are left bit-identical, whether it fits or not.

    Args:
        make_batch: `make_batch(n)` returns `n` samples (tensor, tuple or dict)
            — the heaviest batch the training will see. Moved to `device`.
        loss_fn: `loss_fn(model, batch)` runs your forward and returns the
            scalar loss.
        memory_limit: on the CPU the emulated device's size (bytes or "512MiB"),
            default the budget of an enclosing `emulated_memory` block, else
            half the available RAM; on CUDA a cap below the device.
        amp: "auto" (as `tune` and `batchtune probe`: on CUDA by capability,
            on the CPU bf16 only when a measured step is 10 % faster), "off",
            "bf16", "fp16" (CUDA only); the result's `amp` and `amp_reason`
            say which ran and why.
        steps, min_time: timed steps at least, and seconds they fill at least
            (0: exactly `steps`), after warm-up steps until the step time
            settles: the interval `samples_per_s_ci` comes from them.

    Example::

        r = batchtune.probe(model, opt, loss_fn, make_batch, batch_size=64,
                            memory_limit="1GiB")
        print(r.fits, r.peak_bytes, r.samples_per_s, r.error)
    """
    _check_callables(model, optimizer, loss_fn, make_batch)
    batch_size = _checks.integer("batch_size", batch_size)
    steps = _checks.integer("steps", steps, 1, _checks.MAX_PROBE_STEPS)
    warmup_steps = _checks.integer("warmup_steps", warmup_steps, 0, _checks.MAX_PROBE_STEPS)
    amp = _checks.choice("amp", amp, ("auto", "off", "bf16", "fp16"))
    margin = _checks.number("margin", margin, f"from 0 to {_core.MAX_MARGIN:g}")
    min_time = _checks.number("min_time", min_time, "seconds, from 0 to 3600")
    if not (0 <= min_time <= _checks.MAX_PROBE_SECONDS):
        raise _core.Error(f"min_time: must be from 0 to {_checks.MAX_PROBE_SECONDS:.0f} seconds, "
                          f"got {min_time}")
    dev = resolve_device(device, model)
    check_amp_device(amp, dev)
    with _one_at_a_time("probe"), _measured_device(dev, memory_limit, model, optimizer) as memory:
        def runner_at(amp_mode: str) -> Runner:
            subject = Subject(model, optimizer, loss_fn, make_batch, dev, amp_mode)
            return Runner(subject, memory, margin)

        amp, amp_reason = _probe_amp(amp, dev, runner_at, batch_size)
        runner = runner_at(amp)
        # Calibrated as a sweep row is: warm-up until the step time settles,
        # then at least `steps` timed steps filling `min_time` seconds.
        t = runner.run(_core.TrialOptions(
            batch_size=batch_size, steps=steps, warmup_steps=warmup_steps,
            max_warmup_steps=max(warmup_steps, _core.SWEEP_MAX_WARMUP_STEPS) if min_time > 0 else 0,
            min_time_s=float(min_time)))
    return ProbeResult._from_core(t, amp, amp_reason)


def _probe_amp(amp: str, dev: torch.device, runner_at, batch_size: int) -> Tuple[str, str]:
    """The precision of a probe and why, as `batchtune probe` resolves it:
    as asked; auto on CUDA by the GPU's capability, on the CPU by timing
    bf16 against fp32 (the library's `measure_cpu_amp`)."""
    if amp != "auto":
        return amp, f"amp {amp}: as asked with amp"
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        mode, reason = _core.choose_cuda_amp(major, minor)
        return mode, reason
    fp32, bf16 = runner_at("off"), runner_at("bf16")
    try:
        mode, reason, _ = _core.measure_cpu_amp(
            fp32._cpp, bf16._cpp, max_batch=min(batch_size, _core.AMP_PROBE_MAX_BATCH))
    finally:
        fp32.subject.batch = bf16.subject.batch = None
    return mode, reason


def tune(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
         make_batch: MakeBatch, device: Union[str, torch.device, None] = None, amp: str = "auto",
         objective: str = "throughput", target_batch: Optional[int] = None,
         memory_limit: MemoryLimit = None, margin: float = _core.DEFAULT_MARGIN,
         time_budget: float = _core.DEFAULT_TIME_BUDGET, report: Optional[str] = None, *,
         strategy: str = "predict", max_batch: int = _core.DEFAULT_MAX_BATCH,
         tolerance: float = _core.DEFAULT_TOLERANCE,
         search_tolerance: float = _core.DEFAULT_SEARCH_TOLERANCE,
         sweep: bool = True, base_lr: Optional[float] = None, base_batch: Optional[int] = None,
         lr_scaling: Optional[str] = None, warmup_steps: Optional[int] = None,
         multiple_of: Optional[int] = None, world_size: Optional[int] = None,
         group: Optional[Any] = None, verbose: bool = False, lengths: Any = None,
         checkpointing: str = "off", checkpoint_modules: Optional[Sequence[Any]] = None,
         memory_format: Optional[str] = None,
         _sources: Optional[Dict[str, str]] = None) -> TuneResult:
    """Finds the largest batch your training step fits at, sweeps speed against
    batch size up to it, chooses, and plans the training — every trial your own
    step, leaving no trace. It is the library's pipeline, the one `batchtune
    tune` runs: precision first, then search, sweep, choice and plan under one
    time budget, with the utilization monitor running.

    Args:
        model, optimizer: what you train; the optimizer's own state is measured.
        loss_fn: `loss_fn(model, batch)` → the scalar loss (your forward).
        make_batch: `make_batch(n)` → a batch of `n` samples (tensor, tuple or
            dict), the heaviest the training will see.
        device: "cpu", "cuda", "cuda:N", or None: the GPU the model is on, else
            with CUDA this process's GPU (`LOCAL_RANK`'s under torchrun, else
            the current device), else the CPU.
        amp: "auto" (bf16 or fp16 on CUDA by capability; on the CPU bf16 only
            when a measured step is 10 % faster), "off", "bf16", "fp16".
        objective: "throughput" (the smallest batch within `tolerance` of the
            fastest) or "max-fit" (the largest).
        target_batch: the global batch to reach (micro-batch × accumulation ×
            processes), exactly where a micro-batch up to the chosen one
            divides it within `tolerance` of its speed, else the nearest (the
            plan's reasons say which and what it cost).
        memory_limit: the CPU's emulated device size (default the budget of
            an enclosing `emulated_memory` block, else half the RAM), or a cap
            on CUDA.
        margin: share of the capacity kept free.
        time_budget: seconds for the whole tune, shared as `batchtune tune
            --time-budget` shares it (precision 10 %, search 30 %, sweep 30 %,
            the goodput noise run 15 %, the evaluation batch 5 %, loader
            tuning 10 %, what a phase leaves handed on); it stops with the best found so far. A trial
            that started runs to its end.
        report: path of the HTML report, or None; checked before the first
            trial (a folder, a missing folder, a device raise at once).
        sweep: False stops after the search (the plan takes the maximum).
        base_lr, base_batch: the lr known to work at `base_batch` (default the
            optimizer's lr). The plan scales it from `base_batch` to its global
            batch; without `base_batch` it cannot, and warns (the plan's
            `warnings`, and a Python warning).
        multiple_of: round the micro-batch down to a multiple of this (8 for
            tensor cores); the reason says what it cost.
        world_size: the processes the plan is for (its global batch counts
            them); default the group's size. A tune over several processes
            plans for its group.
        group: the `torch.distributed` process group (default: the world when
            initialised): the minimum over ranks, one plan to every rank.
        verbose: print `batchtune tune`'s console output (phases, tables,
            plan) to stderr.
        lengths: sequences of varying length — the dataset's lengths (a list
            of ints, one a sample) or a `(shortest, longest)` tuple. Then
            `make_batch(n, length)` makes `n` samples of `length` tokens; the
            search runs at the longest, the length phase fits peak memory
            against batch × length (`result.memory_model`), and the plan
            gets a `token_budget` (padded tokens per micro-batch, fitting at
            every length), `length_buckets` and `tokens_per_step`, its lr
            scaled to the samples such a step holds at the data's mean
            length. Train it with `TokenBudgetSampler` and
            `Trainer(..., loss_items=...)`.
        checkpointing: activation checkpointing — "off" (default), "on" (the
            trials recompute, and the plan keeps it), or "auto": a tune
            without it and one with it, each on half the time budget, and
            the plan keeps it only where its chosen batch ran faster beyond
            both measurements' spread (or only it fits; the largest batch for
            "max-fit"), saying so in its reasons ("checkpointing fits 9
            against 6 at 0.78x the samples/s ...: kept off"). The model is
            left with it on where the plan keeps it, else as found.
        checkpoint_modules: the module classes (or class names) whose
            forward recomputes, under PyTorch's non-reentrant
            `torch.utils.checkpoint`; default a Hugging Face model's own
            `gradient_checkpointing_enable()`. A compiled model without them,
            where the installed torch has it, is checkpointed by the
            compiler's selective checkpointing instead
            (`torch._functorch.config.activation_memory_budget` 0.5 against
            1.0 kept in full, put back after the tune; the plan's
            `activation_memory_budget` says so and `Trainer` sets it).
        memory_format: for a model with `Conv2d` layers — "channels_last"
            (the weights and the batch's 4-D float tensors in NHWC),
            "contiguous" (NCHW), or "auto": a tune in each, on half the
            time budget, the plan keeping channels_last only where its
            chosen batch ran faster beyond both measurements' spread
            ("channels_last at 1.12x the samples/s of contiguous ([1.05x,
            1.19x], batch 32 against 32): faster beyond the measurements'
            spread; kept channels_last"); "auto" on a model without
            convolutions says "not applicable". Left out (None), the model
            is tuned as it is, nothing converted: channels_last where its
            convolutions already are, else contiguous. The model is left in
            the format the plan keeps; the plan's `memory_format` says which,
            and `Trainer` and the integrations apply it.

    A compiled model (`torch.compile(model)` or `model.compile()`) is tuned
    compiled: a compile phase of its own first (steps at batch 2 and 16 at
    each precision the tune runs, with the sweep also at batch 1 and
    forward-only, outside the time budget), the batch dimension
    dynamic so no trial compiles again; `result.compile_seconds` and
    `result.recompiles` say what it cost (a warning when a model recompiles
    in the trials anyway).

    Ctrl-C ends it with what was measured (`complete` False), leaving no trace.
    One tune or probe runs at a time in a process: one called from another
    thread meanwhile raises `RuntimeError`.

    Example::

        result = batchtune.tune(model, opt, loss_fn, make_batch, memory_limit="1GiB")
        print(result.max_batch_size, result.chosen_batch_size, result.plan)
    """
    _check_callables(model, optimizer, loss_fn, make_batch)
    amp = _checks.choice("amp", amp, ("auto", "off", "bf16", "fp16"))
    if objective not in ("throughput", "max-fit"):
        raise _core.Error(f"objective: '{objective}' from Python is throughput or max-fit "
                          "(goodput and energy: the CLI)")
    # The Python types here; every range once, in the C++ options' resolve.
    margin = _checks.number("margin", margin, f"from 0 to {_core.MAX_MARGIN:g}")
    tolerance = _checks.number("tolerance", tolerance, "at least 0 and below 1")
    search_tolerance = _checks.number("search_tolerance", search_tolerance, "at least 0 and below 1")
    target_batch = _checks.optional_integer("target_batch", target_batch)
    time_budget = _checks.number("time_budget", time_budget, "seconds, at least 1")
    max_batch = _checks.integer("max_batch", max_batch)
    base_batch = _checks.optional_integer("base_batch", base_batch)
    multiple_of = _checks.optional_integer("multiple_of", multiple_of)
    world_size = _checks.optional_integer("world_size", world_size)
    # Below 0: the options' resolve says so, naming warmup_steps.
    warmup_steps = _checks.optional_integer("warmup_steps", warmup_steps, -_checks.MAX_PLAN_COUNT)
    if base_lr is not None:
        base_lr = _checks.number("base_lr", base_lr, "positive")
    report = _checks.output_path("report", report)
    seqs = parse_lengths(lengths) if lengths is not None else None
    dev = resolve_device(device, model)
    check_amp_device(amp, dev)
    # Where the values the caller left out came from, for the reasons
    # (keyed by the argument: {"base_lr": "the optimizer's lr"}).
    sources = dict(_sources or {})
    if base_lr is None:
        sources.setdefault("base_lr", "the optimizer's lr")
    lr = base_lr if base_lr is not None else reference_lr(
        [float(g["lr"]) for g in optimizer.param_groups])
    if not (lr > 0):
        raise _core.Error("base_lr: every parameter group of the optimizer has lr 0; give base_lr "
                          "(the lr the plan scales) or an optimizer with a positive lr")
    checkpointing = _checks.choice("checkpointing", checkpointing, CHECKPOINTING_MODES)
    if checkpoint_modules is not None and checkpointing == "off":
        raise _core.Error("checkpoint_modules: names the blocks to recompute; give "
                          "checkpointing=\"on\" or \"auto\" with it")
    memory_format = check_memory_format(model, memory_format)
    settings = _settings(model, checkpointing, checkpoint_modules, memory_format)
    # A tune of the base configuration, then one per knob left to "auto",
    # each on its share of the budget.
    runs_wanted = 1 + sum(1 for s in settings if s.mode == "auto")

    def options_for(budget: float) -> "_core.ResolvedTuneOptions":
        # Resolved once, every option checked (its errors named as Python names them).
        return _core.TuneOptions(
            amp=amp, margin=margin, strategy=strategy, max_batch=max_batch,
            search_tolerance=search_tolerance, time_budget_s=budget, objective=objective,
            tolerance=tolerance, target_batch=target_batch, base_lr=lr, base_batch=base_batch,
            lr_scaling=lr_scaling, warmup_steps=warmup_steps, optimizer=optimizer_kind(optimizer),
            multiple_of=multiple_of, sweep=sweep, world_size=world_size, sources=sources,
            mean_length=seqs.mean if seqs is not None else None).resolve()

    options = options_for(float(time_budget) / runs_wanted)
    communicator = _distributed.communicator(group, dev)
    started = time.perf_counter()
    flops: List[Optional[float]] = []

    def pipeline() -> Tuple["_core.TuneReport", Optional[CompileWatch]]:
        knobs = [s.knob for s in settings if s.knob is not None]
        batches = batch_of(knobs, make_batch)
        if not flops:
            # Once, on the first configuration's model and batches: one forward
            # at batch 1. With lengths a sample's FLOPs depend on its length:
            # not counted.
            try:
                flops.append(forward_flops_per_sample(model, loss_fn, batches, dev)
                             if seqs is None else None)
            except KeyboardInterrupt:
                # Ctrl-C while counting: raised again by the first trial's
                # batch, so that the tune ends as at a Ctrl-C in a trial.
                flops.append(None)
                batches = _raising_first(batches, KeyboardInterrupt)
        return _run_pipeline(model, optimizer, loss_fn, batches, dev, amp, seqs, memory, margin,
                             options, communicator, verbose, sweep, flops[0])

    with _one_at_a_time("tune"), _on_every_rank(
            _measured_device(dev, memory_limit, model, optimizer), group, dev) as memory:
        (core, watch), decided = _choose_configuration(settings, pipeline,
                                                       objective if sweep else "max-fit")
        for setting, kept, reason in decided:
            if setting.knob is not None:
                setting.knob.apply(core, kept, reason)
            elif reason:  # a knob that does not apply: said, nothing set
                core.set_memory_format("contiguous", reason)
        if not any(s.name == "checkpointing" for s in settings) and \
                core.diagnosis.kind == "memory-bound":
            diagnosis = core.diagnosis
            diagnosis.text += "; or activation checkpointing (checkpointing=\"auto\"), not tried"
            core.diagnosis = diagnosis
        written = None
        if report and _distributed.rank(group) == 0 and (list(core.sweep) or not core.complete):
            core.write_report(report)
            written = report
    # Every text of the result (reasons, warnings, diagnosis, the JSON)
    # names Python's arguments: the options said so (TuneOptions).
    document = json.loads(core.to_json())
    if watch is not None:
        watch.warn()
    plan = None
    if core.plan_json is not None:
        plan = Plan(**json.loads(core.plan_json))
        for warning in plan.warnings:
            warnings.warn(f"batchtune: {warning}", stacklevel=2)
    return TuneResult(
        max_batch_size=core.search.max_batch_size, chosen_batch_size=core.selection.batch_size,
        plan=plan, trials=[ProbeResult._from_core(t, document.get("amp", "off"),
                                                  document.get("amp_reason"))
                           for t in list(core.search.trials)],
        sweep=[SweepRow._from_core(r) for r in list(core.sweep)], complete=core.complete,
        reason=core.selection.reason, diagnosis=core.diagnosis.text,
        seconds=time.perf_counter() - started, report=written,
        eval_batch_size=plan.eval_micro_batch_size if plan is not None else 0,
        memory_model=document.get("tokens", {}).get("model"),
        compile_seconds=watch.seconds if watch is not None else None,
        recompiles=watch.recompiles if watch is not None else None, _json=document)


def _run_pipeline(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
                  make_batch: MakeBatch, dev: torch.device, amp: str, seqs: Any,
                  memory: "_core.DeviceMemory", margin: float,
                  options: "_core.ResolvedTuneOptions", communicator: Any, verbose: bool,
                  sweep: bool, flops: Optional[float] = None
                  ) -> Tuple["_core.TuneReport", Optional[CompileWatch]]:
    """The library's pipeline over the user's step as the model is now (one
    configuration), after a compiled model's compile phase; the core's result
    and the compile watch (None for an eager model)."""
    # One runner per precision the pipeline measures or picks (amp auto
    # on the CPU times fp32 against bf16 inside the time budget).
    subjects = []

    def make_runner(amp_mode: str) -> "_core.TrialRunner":
        subject = Subject(model, optimizer, loss_fn, make_batch, dev, amp_mode,
                          longest=seqs.longest if seqs is not None else 0)
        subjects.append(subject)
        return Runner(subject, memory, margin)._cpp

    def warm(amp_mode: str, batch_size: int, forward_only: bool) -> "_core.TrialResult":
        runner = make_runner(amp_mode)
        subjects[-1].set_forward_only(forward_only)
        return runner.run(_core.TrialOptions(batch_size=batch_size, steps=1, warmup_steps=0))

    watch = CompileWatch() if is_compiled(model) else None
    try:
        with watch or contextlib.nullcontext():
            if watch is not None:
                compile_phase(warm, compiled_amps(amp, dev), sweep, watch)
            # The time budget starts here: a compile phase is outside it.
            core = _core.tune(make_runner, memory, options, communicator=communicator,
                              verbose=verbose,
                              lengths=(seqs.shortest, seqs.longest) if seqs is not None else None,
                              gradient_bytes=_gradient_bytes(model) if seqs is not None else 0,
                              compile=watch.record if watch is not None else None,
                              flops_per_sample=flops)
    finally:
        for subject in subjects:
            subject.batch = None
    return core, watch


def _raising_first(make_batch: MakeBatch, error: type) -> MakeBatch:
    """`make_batch` that raises `error` at its first call, then makes batches."""
    raised = [False]

    def made(*args: Any) -> Any:
        if not raised[0]:
            raised[0] = True
            raise error()
        return make_batch(*args)
    return made


def _summary(core: "_core.TuneReport") -> ConfigurationRun:
    """What a configuration choice reads of one configuration's tune: its
    largest batch, and the speed of its chosen one with its interval."""
    chosen = core.selection.batch_size
    rows = [SweepRow._from_core(r) for r in list(core.sweep)]
    trials = [t for t in list(core.search.trials) if t.fits]
    for row in rows:
        if row.batch_size == chosen:
            # The median's speed, as its interval is (a row's `samples_per_s`
            # is its fastest step's): the ratio then lies inside its interval.
            median = 1e3 * chosen / row.step_ms if row.step_ms > 0 else 0.0
            return ConfigurationRun(core.search.max_batch_size, chosen, median,
                                    row.samples_per_s_ci)
    for t in reversed(trials):
        if t.batch_size == chosen:
            probe = ProbeResult._from_core(t, "off", "")
            return ConfigurationRun(core.search.max_batch_size, chosen, probe.samples_per_s,
                                    probe.samples_per_s_ci)
    return ConfigurationRun(core.search.max_batch_size, chosen, 0.0, None)


class _Setting(NamedTuple):
    """One configuration knob of a tune: its argument's name, "on" (set for
    every run, with its reason), or "auto" (a run of its own, chosen by
    measurement); `knob` None for one that does not apply (its reason says
    so)."""
    name: str
    mode: str
    knob: Optional[Knob]
    reason: str


def _settings(model: torch.nn.Module, checkpointing: str, checkpoint_modules: Any,
              memory_format: Optional[str]) -> List[_Setting]:
    """The knobs a tune sets or chooses, checkpointing first."""
    settings = []
    if checkpointing != "off":
        settings.append(_Setting("checkpointing", checkpointing,
                                 CheckpointingKnob(model, checkpoint_modules, is_compiled(model)),
                                 "activation checkpointing on: as asked with checkpointing"))
    name = type(model).__name__
    if memory_format == "auto" and not has_convolutions(model):
        settings.append(_Setting("memory_format", "off", None,
                                 f"memory_format auto: not applicable, {name} has no Conv2d "
                                 "layers; kept contiguous"))
    elif memory_format is not None:
        mode = {"auto": "auto", "channels_last": "on", "contiguous": "off"}[memory_format]
        settings.append(_Setting("memory_format", mode, MemoryFormatKnob(model),
                                 f"memory_format {memory_format}: as asked with memory_format"))
    elif current_format(model) == "channels_last":
        settings.append(_Setting("memory_format", "on", MemoryFormatKnob(model),
                                 "memory_format channels_last: the model's convolutions were in "
                                 "it (memory_format left out)"))
    return settings


def _choose_configuration(settings: List[_Setting], pipeline: Callable[[], Any],
                          objective: str) -> Tuple[Any, List[Tuple[_Setting, bool, str]]]:
    """Runs the tune over the configurations `settings` make: the base one
    (every "on" knob set, every "auto" one not), then for each "auto" knob
    the current best with it set, keeping whichever its knob's choice takes.
    Returns the tune the plan comes from and each knob's (setting, kept,
    reason). Interrupted, the last configuration is the answer, partial,
    its knob not kept; on an error every knob is undone."""
    decided: List[Tuple[_Setting, bool, str]] = []
    try:
        for s in settings:
            if s.knob is None:
                continue
            if s.mode == "on":
                s.knob.on()
            elif isinstance(s.knob, MemoryFormatKnob):
                s.knob.off()  # the base: contiguous
        best = pipeline()
        for s in settings:
            if s.mode != "auto" or not best[0].complete:
                continue
            s.knob.on()
            other = pipeline()
            if not other[0].complete:
                best = other
                decided.append((s, False, ""))
                continue
            kept, reason = s.knob.choose(_summary(best[0]), _summary(other[0]), objective)
            decided.append((s, kept, reason))
            if kept:
                best = other
            elif isinstance(s.knob, MemoryFormatKnob):
                s.knob.off()
            else:
                s.knob.undo()
    except BaseException:
        for s in settings:
            if s.knob is not None:
                s.knob.undo()
        raise
    chosen = {id(s) for s, _, _ in decided}
    for s in settings:
        if id(s) not in chosen:  # "on", "off", or never reached
            kept = s.mode == "on" and best[0].complete
            decided.append((s, kept, s.reason if best[0].complete or s.knob is None else ""))
    order = {id(s): i for i, s in enumerate(settings)}
    decided.sort(key=lambda d: order[id(d[0])])
    for s, kept, _ in decided:
        if s.knob is not None:
            s.knob.leave(kept)
    return best, decided


@contextlib.contextmanager
def _on_every_rank(manager: Any, group: Optional[Any], device: torch.device) -> Iterator[Any]:
    """`manager` entered on this rank, and the ranks agreeing that every one
    entered it, before the tune's first collective: a rank that cannot start
    (a memory limit below what its model already holds) stops every rank,
    each with one line, rather than leaving the others in a collective it
    never joins (a wait until the timeout, or a mismatched one)."""
    with contextlib.ExitStack() as stack:
        error: Optional[BaseException] = None
        entered = None
        try:
            entered = stack.enter_context(manager)
        except Exception as e:  # noqa: BLE001 - raised below, once every rank knows
            error = e
        if _distributed.any_rank(error is not None, group, device) and error is None:
            raise _core.Error("tune: another rank could not start the tune (its own error says "
                              "why); every rank stops")
        if error is not None:
            raise error
        yield entered


def _gradient_bytes(model: torch.nn.Module) -> int:
    """What the gradients hold while micro-batches accumulate: one copy of
    the trained parameters."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
