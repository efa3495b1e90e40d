"""The runner of a plan: accumulation equals one big batch, warm-up lr,
out-of-memory recovery that keeps the logical batch."""
import copy

import pytest
import torch

import batchtune
from batchtune import _core


def _mlp(width=256):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.Tanh(), torch.nn.Linear(width, 4))


def _data(n=64):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 32, generator=g), torch.randint(0, 4, (n,), generator=g)


def _loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


def _plan(micro, accumulation, lr=0.1, warmup=0, amp="off"):
    return batchtune.Plan(micro_batch_size=micro, accumulation_steps=accumulation,
                          global_batch_size=micro * accumulation, lr=lr, lr_scaling="none",
                          warmup_steps=warmup, amp=amp)


def _one_big_step(model, batch, lr=0.1):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    optimizer.zero_grad()
    _loss(model, batch).backward()
    optimizer.step()


def _close(a, b, tol=1e-5):
    for (name, x), y in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(x, y, rtol=tol, atol=tol), name


@pytest.mark.parametrize("micro,accumulation", [(16, 4), (24, 3), (64, 1)])
def test_accumulation_equals_one_big_batch(micro, accumulation):
    model = _mlp()
    reference = copy.deepcopy(model)
    batch = _data(64)
    trainer = batchtune.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), _loss,
                                _plan(micro, accumulation))
    loss = trainer.step(batch)  # 24 x 3 = 72 > 64: the last micro-batch is short
    _one_big_step(reference, batch)
    _close(model, reference)
    assert abs(loss - float(_loss(copy.deepcopy(reference), batch).detach())) < 1.0  # a number, finite


def test_warmup_raises_the_lr_linearly_to_the_plan_lr():
    model = _mlp(8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = batchtune.Trainer(model, optimizer, _loss, _plan(8, 1, lr=0.4, warmup=4))
    seen = []
    for _ in range(6):
        trainer.step(_data(8))
        seen.append(optimizer.param_groups[0]["lr"])
    assert seen == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4, 0.4])


def test_out_of_memory_halves_the_micro_batch_and_keeps_the_logical_batch():
    batch = _data(64)
    with batchtune.emulated_memory("1GiB") as memory:
        model = _mlp(4096)
        reference = copy.deepcopy(model)
        probe_model = copy.deepcopy(model)
        extra = {}
        for micro in (16, 64):
            m = copy.deepcopy(probe_model)
            before = memory.live_bytes
            memory.reset_peak()
            batchtune.Trainer(m, torch.optim.SGD(m.parameters(), lr=0.1), _loss,
                              _plan(micro, 64 // micro)).step(batch)
            extra[micro] = memory.peak_bytes - before
            del m
        assert extra[64] > extra[16]
        limit = memory.live_bytes + (extra[16] + extra[64]) // 2
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = batchtune.Trainer(model, optimizer, _loss, _plan(64, 1))
    with batchtune.emulated_memory(limit):
        trainer.step(batch)
    assert trainer.micro_batch_size < 64
    assert trainer.recoveries and "logical batch 64 kept" in trainer.recoveries[0]
    _one_big_step(reference, batch)
    _close(model, reference)


def test_bf16_autocast_step_runs_and_learns_on_cpu():
    model = _mlp(16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    trainer = batchtune.Trainer(model, optimizer, _loss, _plan(16, 2, lr=1e-2, amp="bf16"))
    batch = _data(32)
    first = trainer.step(batch)
    for _ in range(20):
        last = trainer.step(batch)
    assert last < first


@pytest.mark.cuda
def test_fp16_runs_with_a_grad_scaler_on_cuda():
    model = _mlp(16).cuda()
    trainer = batchtune.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), _loss,
                                _plan(16, 2, amp="fp16"))
    assert isinstance(trainer.scaler, torch.amp.GradScaler)
    trainer.step(tuple(t.cuda() for t in _data(32)))


def test_fp16_on_the_cpu_is_refused_as_the_cli_refuses_it():
    """`batchtune train --amp fp16` on the CPU is refused (LibTorch has no CPU
    fp16 autocast): a plan saying fp16 is refused the same way, before a step."""
    model = _mlp(16)
    before = copy.deepcopy(model)
    with pytest.raises(batchtune.Error) as e:
        batchtune.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), _loss,
                          _plan(16, 2, amp="fp16"))
    message = str(e.value)
    assert message == "amp: fp16 autocast is for CUDA devices; on the CPU use bf16 or off"
    _close(model, before, tol=0)


def test_a_group_at_lr_0_stays_frozen():
    """Groups [0, 1e-3]: the first is frozen; the plan's lr goes to the second
    (the first group not at 0), the frozen one stays at 0 and its weights
    do not move."""
    model = _mlp(16)
    frozen, trained = list(model[0].parameters()), list(model[2].parameters())
    optimizer = torch.optim.SGD([{"params": frozen, "lr": 0.0}, {"params": trained, "lr": 1e-3}])
    before = [p.detach().clone() for p in frozen]
    trainer = batchtune.Trainer(model, optimizer, _loss, _plan(8, 1, lr=0.05))
    for _ in range(3):
        trainer.step(_data(8))
    assert [g["lr"] for g in optimizer.param_groups] == [0.0, pytest.approx(0.05)]
    for p, b in zip(frozen, before):
        assert torch.equal(p, b)
    # Groups keep their ratios to the first one not at 0; frozen ones stay at 0.
    optimizer = torch.optim.SGD([{"params": frozen, "lr": 0.0}, {"params": trained[:1], "lr": 1e-3},
                                 {"params": trained[1:], "lr": 2e-3}])
    trainer = batchtune.Trainer(model, optimizer, _loss, _plan(8, 1, lr=0.05, warmup=2))
    trainer.step(_data(8))
    assert [g["lr"] for g in optimizer.param_groups] == [0.0, pytest.approx(0.025), pytest.approx(0.05)]


def test_a_dict_batch_with_a_0_dim_tensor_first_steps_with_the_tensor_whole():
    """A per-batch constant (0-dim) before the samples: the batch size comes
    from the tensors that have one, and the constant goes whole to every
    micro-batch."""
    model = _mlp(16)
    seen = []

    def loss_fn(m, batch):
        seen.append((float(batch["temperature"]), batch["x"].shape[0]))
        return torch.nn.functional.cross_entropy(m(batch["x"]) / batch["temperature"], batch["y"])

    x, y = _data(16)
    trainer = batchtune.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn, _plan(8, 2))
    trainer.step({"temperature": torch.tensor(2.0), "x": x, "y": y})
    assert seen == [(2.0, 8), (2.0, 8)]
    with pytest.raises(ValueError, match=r"batch: batch\['x'\] has 16 samples but batch\['y'\] has 15"):
        trainer.step({"x": x, "y": y[:15]})
    with pytest.raises(TypeError, match="batch: has no tensor with a batch dimension"):
        trainer.step({"temperature": torch.tensor(2.0)})
