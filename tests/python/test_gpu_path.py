"""The GPU path's Python side, on the CPU with fakes: an out-of-memory under
another name, the fp16 loss scale carried from trial to trial, each rank's
own device by default, and the Hugging Face helper on several GPUs without a
launcher."""
import types

import pytest
import torch

import batchtune
from batchtune import _core
from batchtune._memory import oom_count, resolve_device
from batchtune._trial import Runner, Subject


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))


def _batch(n):
    g = torch.Generator().manual_seed(n)
    return torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)


def _loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


def _swallowed_oom_loss(largest, memory_limit_bytes, message):
    """A loss that, past `largest` samples, fails as a library does that
    catches the allocator's refusal and raises its own error (cuDNN's engine
    search): the budget counts the refusal, the error is a RuntimeError."""
    def loss_fn(model, batch):
        x, _ = batch
        if x.shape[0] > largest:
            try:
                torch.empty(memory_limit_bytes, dtype=torch.uint8)  # more than the whole budget
            except torch.OutOfMemoryError:
                pass
            raise RuntimeError(message)
        return _loss(model, batch)
    return loss_fn


ENGINE = "GET was unable to find an engine to execute this computation"


def test_probe_counts_an_out_of_memory_under_another_name():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = _swallowed_oom_loss(8, 64 << 20, ENGINE)
    r = batchtune.probe(model, opt, loss_fn, _batch, batch_size=16, device="cpu",
                        memory_limit="32MiB", amp="off")
    assert not r.fits
    assert r.failure == "out_of_memory"
    assert ENGINE in r.error
    assert batchtune.probe(model, opt, loss_fn, _batch, batch_size=8, device="cpu",
                           memory_limit="32MiB", amp="off").fits


def test_probe_counts_cuda_error_out_of_memory_by_its_message():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss_fn(m, batch):  # a cudaMalloc outside the caching allocator: no counter saw it
        if batch[0].shape[0] > 8:
            raise RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be reported later")
        return _loss(m, batch)
    r = batchtune.probe(model, opt, loss_fn, _batch, batch_size=16, device="cpu",
                        memory_limit="32MiB", amp="off")
    assert not r.fits and r.failure == "out_of_memory"
    assert r.error.endswith("CUDA error: out of memory")  # "RuntimeError: CUDA error: ..."


def test_probe_passes_the_users_own_error_on():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss_fn(m, batch):
        raise RuntimeError(ENGINE)  # no counter rose: not memory
    with pytest.raises(RuntimeError, match="unable to find an engine"):
        batchtune.probe(model, opt, loss_fn, _batch, batch_size=16, device="cpu",
                        memory_limit="32MiB", amp="off")


def test_trainer_recovers_from_an_out_of_memory_that_only_the_counter_saw():
    model = _mlp()
    plan = batchtune.Plan(micro_batch_size=32, accumulation_steps=1, global_batch_size=32, lr=0.1,
                          lr_scaling="none", warmup_steps=0, amp="off")
    with batchtune.emulated_memory("64MiB"):
        trainer = batchtune.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                    _swallowed_oom_loss(8, 128 << 20, ENGINE), plan)
        before = oom_count(torch.device("cpu"))
        loss = trainer.step(_batch(32))
        assert oom_count(torch.device("cpu")) > before
    assert trainer.micro_batch_size <= 8
    assert len(trainer.recoveries) >= 1 and ENGINE in trainer.recoveries[0]
    assert torch.isfinite(torch.tensor(loss))


def test_trainer_passes_on_an_error_no_counter_saw():
    model = _mlp()
    plan = batchtune.Plan(micro_batch_size=32, accumulation_steps=1, global_batch_size=32, lr=0.1,
                          lr_scaling="none", warmup_steps=0, amp="off")

    def loss_fn(m, batch):
        raise RuntimeError(ENGINE)
    trainer = batchtune.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn, plan)
    with pytest.raises(RuntimeError, match="unable to find an engine"):
        trainer.step(_batch(32))
    assert trainer.micro_batch_size == 32


def test_classify_failure_is_the_runners_rule():
    assert _core.classify_failure(ENGINE, 3, 4) == "out_of_memory"
    assert _core.classify_failure(ENGINE, 4, 4) == "error"
    assert _core.classify_failure("CUDA error: out of memory", 0, 0) == "out_of_memory"
    assert _core.classify_failure("Expected more than 1 value per channel when training, got input size",
                                  0, 0) == "size_refusal"


class _Scaled(torch.nn.Module):
    """loss = sum(w · x) · 1e34 with x = 1 at batch 1: at the loss scale of
    2^16 its gradients (1e34 · scale) overflow fp32 (inf: the scaler skips
    the step), at 2^15 they do not. Elementwise, so autocast leaves it in
    fp32."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((4,), 0.5))

    def forward(self, x):
        return (self.w * x.clamp(-1, 1)).sum() * 1e34


def test_fp16_trials_carry_the_loss_scale_and_warm_up_until_a_step_is_taken():
    model = _Scaled()
    opt = torch.optim.SGD(model.parameters(), lr=1e-40)
    subject = Subject(model, opt, lambda m, b: m(b), lambda n: torch.ones(n, 4),
                      torch.device("cpu"), amp="fp16")
    memory = batchtune._memory.device_memory(torch.device("cpu"), "64MiB")
    runner = Runner(subject, memory, 0.1)
    first = runner.run(_core.TrialOptions(batch_size=1, steps=2, warmup_steps=0))
    assert first.fits, first.error
    assert first.warmup_steps_run == 2  # skipped at 2^16, taken at 2^15
    assert subject.loss_scale == 2.0 ** 15
    second = runner.run(_core.TrialOptions(batch_size=1, steps=2, warmup_steps=1))
    assert second.fits, second.error
    assert second.warmup_steps_run == 1  # started at 2^15: nothing skipped
    assert subject.loss_scale == 2.0 ** 15


def test_default_device_is_the_models_then_local_rank_then_current(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    cpu_model = torch.nn.Linear(2, 2)
    assert resolve_device(None, cpu_model) == torch.device("cuda", 1)  # the current device, not 0
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert resolve_device(None, cpu_model) == torch.device("cuda", 2)
    assert resolve_device("auto") == torch.device("cuda", 2)

    class OnGpu3(torch.nn.Module):
        def parameters(self, recurse=True):
            return iter([types.SimpleNamespace(device=torch.device("cuda", 3))])
    assert resolve_device(None, OnGpu3()) == torch.device("cuda", 3)
    assert resolve_device("cpu", OnGpu3()) == torch.device("cpu")  # given: kept
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device(None, cpu_model) == torch.device("cpu")


def test_hugging_face_counts_every_gpu_of_data_parallel():
    pytest.importorskip("transformers")
    from batchtune.huggingface import replicas

    assert replicas(types.SimpleNamespace(world_size=1, n_gpu=4)) == 4  # DataParallel, no launcher
    assert replicas(types.SimpleNamespace(world_size=8, n_gpu=1)) == 8  # torchrun: one GPU a process
    assert replicas(types.SimpleNamespace(world_size=1, n_gpu=0)) == 1  # the CPU
