"""A compiled model (`torch.compile`) tuned as it trains: compiled once in a
phase of its own at a dynamic batch size, no recompile in the trials, the
largest batch the eager model's, the compile time apart, no trace. The
tests compile with the `aot_eager` backend (forward and backward traced,
no code generated) for speed; the bench uses inductor."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import batchtune

from conftest import assert_bit_identical, state_copy

LIMIT = "24MiB"


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(256, 512)
        self.out = torch.nn.Linear(512, 10)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))


def mlp():
    torch.manual_seed(0)
    return MLP()


def make_batch(n):
    return torch.randn(n, 256), torch.randint(0, 10, (n,))


def loss_fn(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_a_compiled_model_is_tuned_compiled_with_no_recompile_and_the_eager_largest_batch():
    eager = mlp()
    optimizer = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    plain = batchtune.tune(eager, optimizer, loss_fn, make_batch, memory_limit=LIMIT, amp="off",
                           sweep=False, report=None, base_batch=64)
    assert plain.compile_seconds is None and plain.to_dict()["compile"] is None

    compiled = torch.compile(eager, backend="aot_eager")
    before = state_copy(eager, optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no recompile warning
        result = batchtune.tune(compiled, optimizer, loss_fn, make_batch, memory_limit=LIMIT,
                                amp="off", sweep=False, report=None, base_batch=64)
    assert_bit_identical(before, state_copy(eager, optimizer))
    # Every trial ran the compiled step: the batch dimension was dynamic from
    # the compile phase on, so the search's sizes compiled nothing more.
    assert result.recompiles == 0
    assert result.compile_seconds > 0
    assert len(result.trials) >= 4
    assert any(t.failure == "out_of_memory" for t in result.trials)  # raised in compiled code
    # aot_eager runs the eager kernels: the eager model's largest batch
    # within the search's tolerance (each tune counts only what the device
    # holds, not what earlier tests left), and it fits again.
    assert abs(result.max_batch_size - plain.max_batch_size) <= 0.05 * plain.max_batch_size
    again = batchtune.probe(compiled, optimizer, loss_fn, make_batch,
                            batch_size=result.max_batch_size, memory_limit=LIMIT, steps=1,
                            min_time=0, amp="off")
    assert again.fits, again.error
    record = result.to_dict()["compile"]
    assert record["recompiles"] == 0 and record["graphs"] >= 1
    assert record["compile_seconds"] == pytest.approx(result.compile_seconds)
    assert "before the time budget's phases and is not counted in it" in record["note"]


def test_module_compile_in_place_is_tuned_compiled_too_and_the_sweep_compiles_nothing_more():
    """With the sweep: batch 1 (which dynamo specialises) and the evaluation
    search's forward-only step in eval mode are compiled in the phase too."""
    model = mlp()
    model.compile(backend="aot_eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # max_batch: the searches' trials small enough that the evaluation search
    # gets its share of the budget on a loaded machine too.
    result = batchtune.tune(model, optimizer, loss_fn, make_batch, memory_limit=LIMIT, amp="off",
                            report=None, base_batch=64, time_budget=20, max_batch=512)
    assert 1 in [row.batch_size for row in result.sweep] and result.eval_batch_size > 0
    assert result.recompiles == 0 and result.compile_seconds > 0
    # The FLOPs were counted on the eager forward, compiling nothing.
    assert all(row.flops_per_s > 0 for row in result.sweep)


class SizeBranch(torch.nn.Module):
    """Takes another path above 20 samples (past the compile phase's 2 and
    16): dynamo guards on the batch size."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(256, 10)

    def forward(self, x):
        if x.shape[0] > 20:
            return self.lin(x) * 2
        return self.lin(x)


def test_a_model_that_specialises_on_the_batch_size_is_counted_and_warned_of():
    model = SizeBranch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model, backend="aot_eager")
    with pytest.warns(UserWarning, match="compiled again 1 time"):
        result = batchtune.tune(compiled, optimizer, loss_fn, make_batch, memory_limit=LIMIT,
                                amp="off", sweep=False, report=None, base_batch=64, max_batch=64)
    assert result.recompiles == 1
    assert "compiled again inside the trials" in result.to_dict()["compile"]["note"]


def test_a_step_that_cannot_compile_says_so_naming_the_model():
    def broken(gm, example_inputs):
        raise RuntimeError("this backend cannot compile")

    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(batchtune.Error, match="model: the compiled step failed at batch 2 "
                                              r"\(amp off\): .*this backend cannot compile"):
        batchtune.tune(torch.compile(model, backend=broken), optimizer, loss_fn, make_batch,
                       memory_limit=LIMIT, amp="off", sweep=False, report=None, base_batch=64)


def test_the_compile_watch_counts_graphs_and_their_time_on_its_clock():
    now = [0.0]
    watch = batchtune._compile.CompileWatch(clock=lambda: now[0])
    watch._start(None)
    now[0] = 2.5
    watch._end(None)
    watch.phase_done(3.0)
    watch._start(None)
    now[0] = 4.0
    watch._end(None)
    assert (watch.seconds, watch.graphs, watch.recompiles) == (4.0, 1, 1)
    seconds, graphs, recompiles, note = watch.record()
    assert note.startswith("The compile phase ran 3.0 s before the time budget's phases")


def test_checkpointing_a_compiled_model_is_the_compilers_activation_memory_budget_put_back_after():
    """Under torch.compile checkpointing is the compiler's selective
    checkpointing: `activation_memory_budget` 0.5 while the checkpointed
    configuration's trials run (1.0 while the other's do), the budget found
    put back after the tune; the plan carries it and `Trainer` sets it."""
    import json

    import torch._functorch.config as functorch_config

    found = functorch_config.activation_memory_budget
    budgets = []

    def watching(model, batch):
        budgets.append(functorch_config.activation_memory_budget)
        return loss_fn(model, batch)

    try:
        model = mlp()
        compiled = torch.compile(model, backend="aot_eager")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        kwargs = dict(memory_limit=LIMIT, amp="off", sweep=False, report=None, base_batch=64,
                      max_batch=256)
        on = batchtune.tune(compiled, optimizer, watching, make_batch, checkpointing="on", **kwargs)
        assert budgets and set(budgets) == {0.5}
        assert functorch_config.activation_memory_budget == found
        assert on.plan.checkpointing == "on" and on.plan.activation_memory_budget == 0.5
        assert on.plan.checkpoint_modules == []  # no blocks wrapped
        assert any("selective checkpointing (activation_memory_budget 0.5), not whole blocks" in r
                   for r in on.plan.reasons)
        assert "forward" not in model.__dict__

        budgets.clear()
        auto = batchtune.tune(compiled, optimizer, watching, make_batch, checkpointing="auto",
                              time_budget=10, **kwargs)
        assert set(budgets) == {found, 0.5}  # each configuration's trials under its own
        assert functorch_config.activation_memory_budget == found
        assert any(r.startswith("checkpointing fits ") for r in auto.plan.reasons)

        plan = batchtune.Plan.from_dict(json.loads(on.plan.to_json()))
        assert plan.activation_memory_budget == 0.5
        batchtune.Trainer(compiled, optimizer, loss_fn, plan)
        assert functorch_config.activation_memory_budget == 0.5
        with pytest.raises(batchtune.Error, match="field 'activation_memory_budget': must be a "
                                                  "number above 0 and below 1"):
            batchtune.Plan.from_dict({**plan.to_dict(), "activation_memory_budget": 1.5})
    finally:
        functorch_config.activation_memory_budget = found
