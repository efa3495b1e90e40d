"""The README's "From Python" example: tune the nn.Module you already train,
then train with the plan. Runs on a CPU as written (an emulated 256 MiB device);
on a GPU leave out memory_limit.

    python examples/python/from_python.py
"""
import torch
import torchvision

import batchtune

model = torchvision.models.resnet18(num_classes=10)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def make_batch(n):
    # The heaviest batch the training will see: n samples of your data's shape.
    return torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,))


def loss_fn(model, batch):
    images, labels = batch
    return torch.nn.functional.cross_entropy(model(images), labels)


result = batchtune.tune(model, optimizer, loss_fn, make_batch,
                        memory_limit="256MiB",  # CPU: the emulated device; omit on a GPU
                        target_batch=256, time_budget=60, report="tune.html")
print("largest batch that fits:", result.max_batch_size)
print("chosen micro-batch:     ", result.chosen_batch_size, "-", result.reason)
print("plan:", {k: v for k, v in result.plan.to_dict().items() if k != "reasons"})

# The plan in your own loop.
dataset = torch.utils.data.TensorDataset(*make_batch(2 * result.plan.batch_size))
loader = torch.utils.data.DataLoader(dataset, shuffle=True, **result.plan.dataloader_kwargs())
trainer = batchtune.Trainer(model, optimizer, loss_fn, result.plan)
for batch in loader:
    print(f"step {trainer.steps_done}: loss {trainer.step(batch):.3f}, lr {optimizer.param_groups[0]['lr']:.4f}")
