"""batchtune.estimate: a step traced on fake tensors and replayed through the
core's model of the CUDA caching allocator. On the CPU its answer is checked
against the emulated device it predicts (the same step measured by `probe`,
the largest batch found by `tune`); for named GPUs, against what must hold
whatever the card (more memory, a larger batch; bf16 below fp32)."""
import math

import pytest
import torch

import batchtune

from conftest import assert_bit_identical, classify_loss, image_batch, state_copy


def _mlp(width=512, depth=3, features=256, classes=10):
    layers = [torch.nn.Linear(features, width), torch.nn.ReLU()]
    for _ in range(depth - 1):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, classes))
    return torch.nn.Sequential(*layers)


def _flat_batch(features=256, classes=10):
    def make_batch(n):
        return torch.randn(n, features), torch.randint(0, classes, (n,))
    return make_batch


def test_the_traced_peak_is_the_emulated_devices_measured_peak(one_thread):
    # An MLP: its CPU kernels (matmul, relu, cross entropy) allocate nothing
    # of their own beyond their outputs, so the fake trace sees every byte
    # the emulated device counts. What may differ is small scalars (the
    # loss, Adam's step counters: a few hundred bytes), so 1 % is ample.
    model = _mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    make_batch = _flat_batch()
    for n in (16, 256):
        measured = batchtune.probe(model, optimizer, classify_loss, make_batch, batch_size=n,
                                   memory_limit="256MiB", steps=1, min_time=0, amp="off")
        assert measured.fits, measured.error
        e = batchtune.estimate(model, optimizer, classify_loss, make_batch, device="cpu",
                               memory_limit="256MiB", amp="off", batch_size=n)
        assert e.peak_bytes == pytest.approx(measured.peak_bytes, rel=0.01), (n, e.breakdown)


@pytest.mark.filterwarnings("ignore:batchtune. lr not scaled")
def test_the_estimated_largest_batch_brackets_the_tuned_one(one_thread):
    model = _mlp(width=1024)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    make_batch = _flat_batch()
    limit = "48MiB"
    e = batchtune.estimate(model, optimizer, classify_loss, make_batch, device="cpu",
                           memory_limit=limit, amp="off")
    tuned = batchtune.tune(model, optimizer, classify_loss, make_batch, memory_limit=limit,
                           sweep=False, report=None, amp="off", strategy="binsearch")
    lo, hi = e.interval
    assert 16 <= lo <= hi
    # The low end keeps 5 % of the usable memory back, the high end fills it:
    # tune's binary search lands between them (2 % slack for its rounding).
    assert lo * 0.98 <= tuned.max_batch_size <= math.ceil(hi * 1.02), (e.interval, tuned.max_batch_size)


def test_a_named_gpu_answer_grows_with_the_cards_memory():
    # Wide inputs (256 KiB a sample in fp32) so that even an H200 holds far
    # fewer than the search's cap of samples.
    model = _mlp(width=256, depth=2, features=65536)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    make_batch = _flat_batch(features=65536)
    found = {}
    for gpu in ("L4", "H100", "H200"):
        e = batchtune.estimate(model, optimizer, classify_loss, make_batch, device=gpu, amp="bf16")
        found[gpu] = e
        assert e.max_batch_size <= e.max_batch_size_high
        assert set(e.breakdown) == {"parameters", "gradients", "optimizer_state", "activations",
                                    "temporaries", "workspaces", "allocator_overhead", "context"}
        assert e.breakdown["context"] > 0 and e.breakdown["workspaces"] > 0
        # The peak at the answer fits what the card leaves the allocator.
        assert e.peak_bytes <= e.capacity_bytes_high
        assert e.confidence and e.source
    assert found["L4"].max_batch_size < found["H100"].max_batch_size < found["H200"].max_batch_size


def test_bf16_peaks_below_fp32_at_the_same_batch():
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    peaks = {}
    for amp in ("off", "bf16"):
        e = batchtune.estimate(model, optimizer, classify_loss, image_batch((3, 64, 64)),
                               device="H100", amp=amp, batch_size=256, max_batch=512)
        peaks[amp] = e.breakdown["activations"]
    assert peaks["bf16"] < 0.75 * peaks["off"], peaks


def test_an_unknown_gpu_is_one_line_naming_it_and_the_known_ones():
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(batchtune.Error) as e:
        batchtune.estimate(model, optimizer, classify_loss, _flat_batch(), device="H1000")
    message = str(e.value)
    assert "H1000" in message and "H100" in message and "A100-80GB" in message
    assert "\n" not in message
    with pytest.raises(batchtune.Error, match="memory_limit"):
        batchtune.estimate(model, optimizer, classify_loss, _flat_batch(), device="cpu")
    with pytest.raises(batchtune.Error, match="memory_limit"):
        batchtune.estimate(model, optimizer, classify_loss, _flat_batch(), device="H100",
                           memory_limit="1GiB")
    with pytest.raises(batchtune.Error, match="amp"):
        batchtune.estimate(model, optimizer, classify_loss, _flat_batch(), device="H100", amp="fp8")


def test_the_model_optimizer_and_generators_are_left_as_they_were():
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(num_classes=10)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    make_batch = image_batch((3, 32, 32))
    # One real step first: gradients, Adam's moments and BatchNorm's running
    # statistics exist and must come back bit for bit.
    classify_loss(model, make_batch(4)).backward()
    optimizer.step()
    before = state_copy(model, optimizer)
    rng = torch.get_rng_state()
    e = batchtune.estimate(model, optimizer, classify_loss, make_batch, device="H100", amp="bf16",
                           max_batch=64)
    assert e.max_batch_size == 64
    assert_bit_identical(before, state_copy(model, optimizer))
    assert torch.equal(rng, torch.get_rng_state())
    assert all(isinstance(p, torch.nn.Parameter) and not p.is_meta for p in model.parameters())
    # The optimizer still steps the model's own parameters.
    assert optimizer.param_groups[0]["params"][0] is next(model.parameters())


def test_an_op_with_no_fake_implementation_is_named():
    class Opaque(torch.nn.Module):
        def forward(self, x):
            return torch.from_numpy(x.detach().numpy()) * 2  # needs real data

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), Opaque())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss_fn(m, batch):
        return m(batch).sum()

    with pytest.raises(batchtune.Error, match="fake"):
        batchtune.estimate(model, optimizer, loss_fn, lambda n: torch.randn(n, 8), device="H100")
