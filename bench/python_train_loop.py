"""The guide's training loop in Python, for bench/train_overhead.

Same model (batchtune's lenet or mlp), Fashion-MNIST held in memory, Adam at
1e-3, a shuffled epoch of index batches; prints `samples_per_s <value>`.

    python python_train_loop.py MODEL BATCH STEPS THREADS
"""
import gzip
import sys
import time

import torch
from torch import nn

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(name, header_ints):
    with gzip.open(f"{DATA}/{name}.gz", "rb") as f:
        raw = f.read()
    return torch.frombuffer(bytearray(raw[4 * header_ints:]), dtype=torch.uint8)


def make_model(name):
    if name == "lenet":
        return nn.Sequential(
            nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 10))
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    raise SystemExit(f"unknown model {name}")


def main():
    model_name, batch, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(threads)
    images = read_idx("train-images-idx3-ubyte", 4).reshape(-1, 1, 28, 28)
    labels = read_idx("train-labels-idx1-ubyte", 2).long()
    inputs = (images.float() / 255.0 - 0.2860) / 0.3530
    torch.manual_seed(0)
    model = make_model(model_name)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    per_epoch = len(labels) // batch
    order = None
    start = time.perf_counter()
    for step in range(steps):
        if step % per_epoch == 0:
            order = torch.randperm(len(labels))
        index = order[(step % per_epoch) * batch:(step % per_epoch + 1) * batch]
        x, y = inputs.index_select(0, index), labels.index_select(0, index)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
    loss.item()
    seconds = time.perf_counter() - start
    print(f"samples_per_s {steps * batch / seconds:.1f}")


if __name__ == "__main__":
    main()
