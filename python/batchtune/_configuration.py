"""A configuration choice: a knob of the training (activation checkpointing,
the memory format) that the tune sets one way and the other, tuning each,
and the plan keeping the other setting only where it measured better.

A `Knob` turns its setting on and off on the user's model; `ConfigurationRun`
is what the choice reads of one setting's tune; `choose_configuration`
decides on those figures alone, so it is tested on rows written in the test.
The tune (`_tune.py`) runs the base configuration, then for each knob left to
"auto" the same with that knob flipped, keeping the winner as the next base."""
from __future__ import annotations

from typing import Any, Callable, List, NamedTuple, Optional, Tuple


class ConfigurationRun(NamedTuple):
    """One configuration's tune, as the choice reads it: its largest batch,
    its chosen one, and the chosen one's samples/s with its 95 % interval
    (None where it has none)."""
    max_batch: int
    chosen: int
    samples_per_s: float
    interval: Optional[Tuple[float, float]]


class Knob:
    """One setting of the training that a tune can flip: `on()` sets it on
    the model, `undo()` puts the model back; `batch(b)` is the batch as the
    setting wants it (the memory format converts images). `name` is the
    argument it came from ("checkpointing"), `label` how the reasons name the
    setting ("checkpointing", "channels_last") and `base_label` the other
    ("contiguous"; empty where the sentence needs none)."""

    name = ""
    label = ""
    base_label = ""
    # What the tie costs, said where the measurements cannot tell them apart.
    tie_note = ""

    def on(self) -> None:
        raise NotImplementedError

    def undo(self) -> None:
        raise NotImplementedError

    def batch(self, batch: Any) -> Any:
        return batch

    def leave(self, kept: bool) -> None:
        """After the tune: the model left with the setting where the plan
        keeps it, else as found."""
        if not kept:
            self.undo()

    def choose(self, base: ConfigurationRun, other: ConfigurationRun,
               objective: str) -> Tuple[bool, str]:
        """Whether the plan keeps the setting over the base, and why
        (`choose_configuration` in this knob's words)."""
        raise NotImplementedError

    def apply(self, core: Any, kept: bool, reason: str) -> None:
        """Writes the choice into the core's plan (`core.set_...`)."""
        raise NotImplementedError


def choose_configuration(base: ConfigurationRun, other: ConfigurationRun, objective: str,
                         lead: str, kept: str, dropped: str, of: str = "",
                         tie_note: str = "") -> Tuple[bool, str]:
    """Whether the plan takes the `other` configuration over the `base` one,
    and why in one sentence with the figures: by the measured speed of each
    configuration's chosen batch — taken only where its speed is better
    beyond both intervals (the ratio's interval all above 1), never on a
    difference the measurements cannot tell; by the largest batch for the
    max-fit objective; taken where only it fits anything. A speed without an
    interval tells nothing: the base kept.

    The sentence opens with `lead` ("checkpointing fits 9 against 6"), gives
    the ratio "at 1.12x the samples/s{of}" (`of`: " of contiguous") and ends
    with `kept` or `dropped` ("kept on", "kept off"); `tie_note` follows a
    tie."""
    if base.max_batch < 1 or base.samples_per_s <= 0:
        if other.max_batch >= 1:
            return True, f"{lead}: only with it does a batch fit; {kept}"
        return False, f"{lead}: {dropped}"
    if other.max_batch < 1 or other.samples_per_s <= 0:
        return False, f"{lead}: {dropped}"
    if objective == "max-fit":
        take = other.max_batch > base.max_batch
        return take, f"{lead}; the plan takes the largest batch: {kept if take else dropped}"
    ratio = other.samples_per_s / base.samples_per_s
    if other.interval is None or base.interval is None or base.interval[0] <= 0:
        return False, (f"{lead} at {ratio:.2f}x the samples/s{of} (batch {other.chosen} against "
                       f"{base.chosen}), with no interval to judge the difference by: {dropped}")
    low = other.interval[0] / base.interval[1]
    high = other.interval[1] / base.interval[0]
    speed = (f"{lead} at {ratio:.2f}x the samples/s{of} ([{low:.2f}x, {high:.2f}x], batch "
             f"{other.chosen} against {base.chosen})")
    if low > 1:
        return True, f"{speed}: faster beyond the measurements' spread; {kept}"
    if high < 1:
        return False, f"{speed}: slower beyond the measurements' spread; {dropped}"
    return False, f"{speed}: the measurements cannot tell them apart; {dropped}{tie_note}"


def batch_of(knobs: List[Knob], make_batch: Callable[..., Any]) -> Callable[..., Any]:
    """`make_batch` with each knob's batch conversion applied."""
    if not knobs:
        return make_batch

    def made(*args: Any) -> Any:
        batch = make_batch(*args)
        for knob in knobs:
            batch = knob.batch(batch)
        return batch
    return made


def apply_configuration(model: Any, plan: Any) -> None:
    """What `plan`'s configuration asks of `model` before training, as
    `Trainer`, the Lightning callback and the Hugging Face helper apply it:
    checkpointing on (the compiler's activation memory budget where the plan
    has one, else the blocks it names or the model's own switch) and the
    memory format (a plan in "contiguous" leaves the model as it is).
    Applying it twice changes nothing."""
    from ._checkpointing import Checkpointing, set_activation_memory_budget
    from ._memory_format import apply_memory_format

    if plan.checkpointing == "on":  # the plan's batch fits only with it
        if plan.activation_memory_budget > 0:
            set_activation_memory_budget(plan.activation_memory_budget)
        else:
            Checkpointing(model, plan.checkpoint_modules).on()
    if plan.memory_format != "contiguous":
        apply_memory_format(model, plan.memory_format)
