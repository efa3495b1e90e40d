"""batchtune.estimate against what it predicts (#54).

On the CPU, for a few models under an emulated device: the estimate's
interval against `batchtune.tune`'s binary search (no sweep), and the trace's
tensor peak against `batchtune.probe`'s measured peak at the tuned batch.
For a GPU, with no GPU here: ResNet-50 3x224x224 on "H200" at fp32 and bf16,
trained as `batchtune tune --model resnet50.pt --input 3x224x224 --classes
1000` trains it (Adam at lr 1e-3, one tensor at a time as LibTorch's C++ Adam,
cross-entropy on the logits in fp32), against docs/gpu.md's searches on an
H200: 1463 (fp32) and 2816 (bf16).

    PYTHONPATH=python BATCHTUNE_CORE_DIR=build/python/batchtune \\
        python bench/estimate.py [--skip-cpu] [--skip-gpu]

Prints Markdown tables.
"""
import argparse
import sys
import time

import torch

import batchtune

MiB = 1 << 20
GiB = 1 << 30


def classify_loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x).float(), y)


def image_batch(shape, classes):
    def make_batch(n):
        return torch.randn(n, *shape), torch.randint(0, classes, (n,))
    return make_batch


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                               torch.nn.ReLU(), torch.nn.Linear(1024, 10))


def convnet():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10))


def resnet18():
    import torchvision
    return torchvision.models.resnet18(num_classes=10)


CPU_ROWS = [
    ("MLP 256-1024-1024-10, Adam", mlp, lambda p: torch.optim.Adam(p, lr=1e-3),
     lambda n: (torch.randn(n, 256), torch.randint(0, 10, (n,))), "64MiB"),
    ("convnet 3x32x32, SGD momentum", convnet, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
     image_batch((3, 32, 32), 10), "128MiB"),
    ("ResNet-18 3x32x32, SGD momentum", resnet18, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
     image_batch((3, 32, 32), 10), "256MiB"),
]


def cpu_rows():
    print("| model | limit | estimate (low-high) | tune | estimate s | tune s | traced peak at tune's batch | probe's peak |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for name, make_model, make_opt, make_batch, limit in CPU_ROWS:
        torch.manual_seed(0)
        model = make_model()
        opt = make_opt(model.parameters())
        t = time.time()
        e = batchtune.estimate(model, opt, classify_loss, make_batch, device="cpu", memory_limit=limit,
                               amp="off")
        est_s = time.time() - t
        t = time.time()
        tuned = batchtune.tune(model, opt, classify_loss, make_batch, memory_limit=limit, sweep=False,
                               report=None, amp="off", strategy="binsearch")
        tune_s = time.time() - t
        n = tuned.max_batch_size
        at = batchtune.estimate(model, opt, classify_loss, make_batch, device="cpu", memory_limit=limit,
                                amp="off", batch_size=n)
        probe = batchtune.probe(model, opt, classify_loss, make_batch, batch_size=n, memory_limit=limit,
                                steps=1, min_time=0, amp="off")
        print(f"| {name} | {limit} | {e.max_batch_size}-{e.max_batch_size_high} | {n} | {est_s:.0f} | "
              f"{tune_s:.0f} | {at.peak_bytes / MiB:.1f} MiB | {probe.peak_bytes / MiB:.1f} MiB |")
        sys.stdout.flush()


def gpu_rows():
    import torchvision

    measured = {"off": 1463, "bf16": 2816}
    print("| ResNet-50 3x224x224 on H200 | estimate (low-high) | measured (docs/gpu.md) | peak reserved at the low end | activations | allocator overhead | seconds |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for amp in ("off", "bf16"):
        torch.manual_seed(0)
        model = torchvision.models.resnet50(weights=None)
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
        t = time.time()
        e = batchtune.estimate(model, opt, classify_loss, image_batch((3, 224, 224), 1000), device="H200",
                               amp=amp)
        s = time.time() - t
        print(f"| {'fp32' if amp == 'off' else amp} | {e.max_batch_size}-{e.max_batch_size_high} | "
              f"{measured[amp]} | {e.peak_bytes / GiB:.1f} GiB | {e.breakdown['activations'] / GiB:.1f} GiB | "
              f"{e.breakdown['allocator_overhead'] / GiB:.2f} GiB | {s:.0f} |")
        sys.stdout.flush()
    print()
    print("not seen:", "; ".join(e.unseen))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--skip-cpu", action="store_true")
    p.add_argument("--skip-gpu", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    if not a.skip_cpu:
        cpu_rows()
        print()
    if not a.skip_gpu:
        gpu_rows()


if __name__ == "__main__":
    main()
