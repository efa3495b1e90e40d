"""Shared pieces of the Python tests: seeded, CPU-only, emulated budgets."""
import math

import pytest
import torch

import batchtune


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_thread():
    """One intra-op thread for the test: with a tiny model, threads only wait
    on each other (and on a loaded machine, long)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def has_cuda() -> bool:
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


class TinyTransformer(torch.nn.Module):
    """A small encoder-style transformer as a plain nn.Module (token ids in,
    per-token classes out)."""

    def __init__(self, vocab=64, dim=32, heads=2, layers=2, length=16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Parameter(torch.zeros(1, length, dim))
        layer = torch.nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, dropout=0.1,
                                                 batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(dim, vocab)
        self.length = length
        self.vocab = vocab

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens) + self.pos))


def transformer_batch(model):
    def make_batch(n):
        g = torch.Generator().manual_seed(n)
        x = torch.randint(0, model.vocab, (n, model.length), generator=g)
        return {"tokens": x, "labels": torch.roll(x, 1, dims=1)}
    return make_batch


def transformer_loss(model, batch):
    logits = model(batch["tokens"])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             batch["labels"].reshape(-1))


def image_batch(shape=(3, 32, 32), classes=10):
    def make_batch(n):
        return torch.randn(n, *shape), torch.randint(0, classes, (n,))
    return make_batch


def classify_loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


def small_convnet(classes=10):
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, classes))


def state_copy(model, optimizer):
    """Deep copies of the model's and the optimizer's state_dicts and the grads."""
    def clone(obj):
        if isinstance(obj, torch.Tensor):
            return obj.detach().clone()
        if isinstance(obj, dict):
            return {k: clone(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(clone(v) for v in obj)
        return obj
    grads = [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
    return clone(model.state_dict()), clone(optimizer.state_dict()), grads


def assert_bit_identical(a, b, path="state"):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a.view(-1).view(torch.uint8) if a.numel() else a,
                           b.view(-1).view(torch.uint8) if b.numel() else b), f"{path} differs"
    elif isinstance(a, dict):
        assert set(a.keys()) == set(b.keys()), f"{path}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for k in a:
            assert_bit_identical(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_bit_identical(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), path
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def ragged_corpus(n, longest, vocab, mean=24, shortest=8, seed=0):
    """Sequences of varying length as text has them (lengths drawn
    exponential around `mean`, most short, a few long; the first at the
    longest): (lengths, samples), each sample {"input_ids", "labels"}."""
    import random

    rng = random.Random(seed)
    lengths = [min(longest, max(shortest, int(rng.expovariate(1 / mean)))) for _ in range(n)]
    lengths[0] = longest
    g = torch.Generator().manual_seed(seed)
    samples = []
    for length in lengths:
        ids = torch.randint(0, vocab, (length,), generator=g)
        samples.append({"input_ids": ids, "labels": ids.clone()})
    return lengths, samples


def exit_distributed_job() -> None:
    """Ends a job run under torchrun once its results are written and its
    ranks have met: without the interpreter's finalization. A Gloo group that
    a DistributedDataParallel model used outlives `destroy_process_group`
    (its worker threads run until the process ends), and a worker still
    releasing a collective's Python tensor while the interpreter finalizes
    aborts the rank ("terminate called without an active exception",
    SIGABRT; seen under load in CI; pytorch/pytorch#190489)."""
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class _FailInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, message):
        ctx.message = message
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise torch.OutOfMemoryError(ctx.message)


def fail_in_backward(x: torch.Tensor, message: str) -> torch.Tensor:
    """`x` as it is, whose backward raises `torch.OutOfMemoryError(message)`:
    an out-of-memory in the middle of a backward pass."""
    return _FailInBackward.apply(x, message)

