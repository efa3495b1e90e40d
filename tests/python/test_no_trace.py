"""probe and tune leave no trace: bit-identical state_dicts of model and
optimizer (a first step's new state removed again), grads, random
generators, autocast; also when the user's code raises, and on Ctrl-C."""
import random

import pytest
import torch

import batchtune
from batchtune import _core

from conftest import (assert_bit_identical, classify_loss, image_batch, small_convnet,
                      state_copy)

OPTIMIZERS = {
    "adam": lambda params: torch.optim.Adam(params, lr=1e-3),
    "adamw_foreach": lambda params: torch.optim.AdamW(params, lr=1e-3, foreach=True),
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
}


def _trained_once(model, optimizer):
    x, y = image_batch()(4)
    optimizer.zero_grad()
    classify_loss(model, (x, y)).backward()
    optimizer.step()


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("first_step", [True, False], ids=["fresh", "after_a_step"])
def test_probe_and_tune_leave_state_bit_identical(name, first_step):
    model = small_convnet()
    optimizer = OPTIMIZERS[name](model.parameters())
    if not first_step:
        _trained_once(model, optimizer)  # state exists; grads are left set
    before = state_copy(model, optimizer)
    rng = torch.get_rng_state()
    py_rng = random.getstate()
    live = _core.budget_live_bytes()

    r = batchtune.probe(model, optimizer, classify_loss, image_batch(), batch_size=8,
                        memory_limit="256MiB", amp="off")
    assert r.fits, r.error
    assert_bit_identical(before, state_copy(model, optimizer))
    if first_step:
        assert optimizer.state_dict()["state"] == {}  # the first step's state is gone
    t = batchtune.tune(model, optimizer, classify_loss, image_batch(), memory_limit="64MiB",
                       max_batch=64, sweep=False, report=None, amp="off")
    assert t.max_batch_size > 0
    assert_bit_identical(before, state_copy(model, optimizer))
    assert torch.equal(torch.get_rng_state(), rng)
    assert random.getstate() == py_rng
    assert _core.budget_live_bytes() <= live


def test_a_trial_that_does_not_fit_leaves_no_trace():
    model = small_convnet()
    optimizer = torch.optim.Adam(model.parameters())
    before = state_copy(model, optimizer)
    r = batchtune.probe(model, optimizer, classify_loss, image_batch(), batch_size=512,
                        memory_limit="16MiB", amp="off")
    assert not r.fits and r.failure == "out_of_memory"
    assert "out of memory" in r.error
    assert_bit_identical(before, state_copy(model, optimizer))
    assert optimizer.state_dict()["state"] == {}


class Boom(Exception):
    pass


@pytest.mark.parametrize("raised", [Boom, KeyboardInterrupt])
def test_user_exception_in_a_step_leaves_no_trace(raised):
    model = small_convnet()
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    _trained_once(model, optimizer)
    before = state_copy(model, optimizer)
    live = _core.budget_live_bytes()
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        loss = classify_loss(model, batch)
        if calls["n"] == 2:  # after a full step: state, grads and weights changed
            torch.set_autocast_enabled("cpu", True)
            model.eval()
            raise raised()
        return loss

    with pytest.raises(raised):
        batchtune.probe(model, optimizer, loss_fn, image_batch(), batch_size=8,
                        memory_limit="256MiB")
    assert_bit_identical(before, state_copy(model, optimizer))
    assert model.training and not torch.is_autocast_enabled("cpu")
    assert _core.budget_live_bytes() <= live


def test_keyboard_interrupt_ends_tune_with_what_was_measured():
    model = small_convnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = state_copy(model, optimizer)
    calls = {"n": 0}
    make = image_batch()

    def make_batch(n):
        calls["n"] += 1
        if calls["n"] == 4:  # the first call, at batch 1, counts the model's FLOPs
            raise KeyboardInterrupt()
        return make(n)

    r = batchtune.tune(model, optimizer, classify_loss, make_batch, memory_limit="64MiB",
                       report=None, amp="off")
    assert not r.complete
    assert len(r.trials) == 2 and all(t.fits for t in r.trials)
    assert r.max_batch_size == max(t.batch_size for t in r.trials)
    d = r.to_dict()
    assert d["complete"] is False and d["interrupted_by"] == "KeyboardInterrupt"
    assert_bit_identical(before, state_copy(model, optimizer))


def test_keyboard_interrupt_while_amp_auto_is_measured_ends_tune_incomplete():
    model = small_convnet()
    optimizer = torch.optim.Adam(model.parameters())
    before = state_copy(model, optimizer)

    def make_batch(n):
        raise KeyboardInterrupt()

    r = batchtune.tune(model, optimizer, classify_loss, make_batch, memory_limit="64MiB",
                       report=None, amp="auto")
    assert not r.complete and r.trials == [] and r.max_batch_size == 0 and r.plan is None
    d = r.to_dict()
    assert d["complete"] is False and d["interrupted_by"] == "KeyboardInterrupt"
    assert_bit_identical(before, state_copy(model, optimizer))
    assert optimizer.state_dict()["state"] == {}
