"""What `probe` and `tune` return: one trial (`ProbeResult`), one row of the
sweep (`SweepRow`) and the whole tune (`TuneResult`), each from the core's
result and with the CLI's JSON fields (`to_dict`)."""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, List, Optional, Tuple

from . import _core
from .plan import Plan


def _interval(e: "_core.Estimate") -> Optional[Tuple[float, float]]:
    return (e.low, e.high) if e.n > 0 else None


@dataclasses.dataclass
class ProbeResult:
    """One trial: does `batch_size` fit, at what peak memory, how fast.

    `fits` is True only if the step ran and its peak stayed within the usable
    memory (capacity × (1 − margin)); `failure` is then None, else
    `out_of_memory`, `over_budget` or `does_not_run`, with `error` saying why.
    `step_ms_ci` and `samples_per_s_ci` are the medians' 95 % confidence
    intervals `(low, high)` (distribution-free, from the timed steps); `noisy`
    when one reaches past ±10 % of its median, with the likely cause in
    `noise_cause`.
    """

    batch_size: int
    fits: bool
    peak_bytes: int
    capacity_bytes: int
    usable_bytes: int
    margin: float
    steps: int
    step_ms: float
    step_ms_spread: float
    samples_per_s: float
    busy: float
    loss: float
    failure: Optional[str]
    error: Optional[str]
    step_ms_ci: Optional[Tuple[float, float]] = None
    samples_per_s_ci: Optional[Tuple[float, float]] = None
    noisy: bool = False
    noise_cause: Optional[str] = None
    amp: str = "off"
    """The precision the trial ran at (`probe`'s `amp`, "auto" resolved)."""
    amp_reason: Optional[str] = None
    """Why that precision: as asked, the GPU's capability, or measured."""
    _json: str = dataclasses.field(repr=False, default="{}")

    @classmethod
    def _from_core(cls, t: "_core.TrialResult", amp: str = "off",
                   amp_reason: Optional[str] = None) -> "ProbeResult":
        return cls(amp=amp, amp_reason=amp_reason, batch_size=t.batch_size, fits=t.fits,
                   peak_bytes=t.peak_bytes, capacity_bytes=t.capacity_bytes, usable_bytes=t.usable_bytes,
                   margin=t.margin, steps=t.steps_run, step_ms=t.step_ms,
                   step_ms_spread=t.step_ms_spread, samples_per_s=t.samples_per_s, busy=t.busy,
                   loss=t.loss, failure=None if t.failure == "none" else t.failure,
                   error=t.error or None, step_ms_ci=_interval(t.step_ms_ci),
                   samples_per_s_ci=_interval(t.samples_per_s_ci), noisy=t.noisy,
                   noise_cause=t.noise_cause or None, _json=t.to_json())

    def to_dict(self) -> Dict[str, Any]:
        """The fields of `batchtune probe --json`."""
        return json.loads(self._json)


@dataclasses.dataclass
class SweepRow:
    """Training at one batch size: median throughput and step time with their
    95 % intervals `(low, high)`, peak memory; `noisy` when an interval
    reaches past ±10 % (then no decision rests on the row alone)."""

    batch_size: int
    samples_per_s: float
    samples_per_s_spread: float
    step_ms: float
    busy: float
    peak_bytes: int
    steps: int
    samples_per_s_ci: Optional[Tuple[float, float]] = None
    step_ms_ci: Optional[Tuple[float, float]] = None
    noisy: bool = False
    noise_cause: Optional[str] = None
    flops_per_s: Optional[float] = None
    """Achieved training FLOP/s: 3x the forward's FLOPs a sample (counted by
    `torch.utils.flop_counter` at batch 1) x samples/s; None where not counted."""
    mfu: Optional[float] = None
    """Model FLOPs utilization, `flops_per_s` over the GPU's datasheet peak at
    the row's precision (the result's JSON `peak_flops` names it); None on the
    CPU or for a GPU batchtune's table does not know (`mfu_note` says)."""

    @classmethod
    def _from_core(cls, r: "_core.SweepRow") -> "SweepRow":
        return cls(r.batch_size, r.samples_per_s, r.samples_per_s_spread, r.step_ms, r.busy,
                   r.peak_bytes, r.steps, _interval(r.samples_per_s_ci), _interval(r.step_ms_ci),
                   r.noisy, r.noise_cause or None, r.flops_per_s, r.mfu)


@dataclasses.dataclass
class TuneResult:
    """What `tune` found.

    `max_batch_size` is the largest batch that was tried and fitted (0 when
    not even 1 fits); `chosen_batch_size` the one the objective chose from the
    sweep (the plan's micro-batch); `complete` False when Ctrl-C ended it.
    """

    max_batch_size: int
    chosen_batch_size: int
    plan: Optional[Plan]
    trials: List[ProbeResult]
    sweep: List[SweepRow]
    complete: bool
    reason: str
    diagnosis: str
    seconds: float
    report: Optional[str]
    eval_batch_size: int = 0
    """The largest forward-only (evaluation) batch that fits, from a search
    of `loss_fn` under `torch.no_grad()` with the model in eval mode; 0 when
    it did not run (`sweep=False`). The plan's `eval_micro_batch_size`."""
    memory_model: Optional[Dict[str, Any]] = None
    """With `lengths`: the fit of peak memory against batch × length,
    peak ≈ fixed_bytes + per_token_bytes × (batch × length) +
    per_token_length_bytes × (batch × length²), with `fit_error` (the
    largest relative error over the trials fitted); the length phase's
    trials and checks are in `to_dict()["tokens"]`. None without lengths."""
    compile_seconds: Optional[float] = None
    """A compiled model (`torch.compile`): the seconds spent compiling — the
    compile phase, one step at batch 2 at each precision the tune runs,
    before the time budget's phases and outside the budget — and any graph
    compiled later in a trial. None for an eager model."""
    recompiles: Optional[int] = None
    """A compiled model: graphs compiled inside the trials, after the compile
    phase (0 when the batch dimension stayed dynamic; more, with a warning,
    when the model specialises on the batch size). None for an eager model."""
    _json: Dict[str, Any] = dataclasses.field(repr=False, default_factory=dict)

    def speed_profile(self) -> Dict[int, Tuple[float, float, float]]:
        """The sweep's samples/s by global batch (a row's batch on every rank of
        the plan, no accumulation) as (median, low, high), the ends its 95 %
        interval's (the median where it has none), for `Trainer(adapt=True,
        adapt_speeds=...)`: a batch `adapt` has not run is then expected at
        today's speed times the ratio measured here, and tried where the
        hopeful end of that ratio could win. Empty when no sweep ran."""
        world_size = self.plan.world_size if self.plan is not None else 1
        profile = {}
        for row in self.sweep:
            if row.samples_per_s <= 0:
                continue
            low, high = row.samples_per_s_ci or (row.samples_per_s, row.samples_per_s)
            low = min(low, row.samples_per_s) if low > 0 else row.samples_per_s
            profile[row.batch_size * world_size] = (row.samples_per_s, low,
                                                    max(high, row.samples_per_s))
        return profile

    def to_dict(self) -> Dict[str, Any]:
        """The same fields as `batchtune tune --json`: `max_batch_size`,
        `search`, `trials`, `sweep`, `chosen_batch_size`, `objective`,
        `diagnosis`, `plan`, `loader`, `loader_note`, `complete`, ..."""
        return json.loads(json.dumps(self._json))

    def to_json(self, **kwargs) -> str:
        return json.dumps(self._json, **kwargs)
