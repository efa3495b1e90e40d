"""The README's "From Python" example: tune the nn.Module you already train,
then train with the plan. Runs on a CPU as written (an emulated 256 MiB device);
on a GPU leave out memory_limit.

    python examples/python/from_python.py                    # a 60 s tune
    python examples/python/from_python.py --time-budget 20   # shorter (the tests)
"""
import sys

import torch, torchvision, batchtune

TIME_BUDGET = float(sys.argv[sys.argv.index("--time-budget") + 1]) if "--time-budget" in sys.argv else 60

model = torchvision.models.resnet18(num_classes=10)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

def make_batch(n):            # n samples, the heaviest the training will see
    return torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,))

def loss_fn(model, batch):    # your forward; returns the scalar loss
    images, labels = batch
    return torch.nn.functional.cross_entropy(model(images), labels)

result = batchtune.tune(model, optimizer, loss_fn, make_batch,
                        memory_limit="256MiB",      # CPU: the emulated device; omit on a GPU
                        target_batch=256, base_batch=256,  # lr=0.1 belongs to batch 256
                        time_budget=TIME_BUDGET, report="tune.html")
print("largest batch that fits:", result.max_batch_size)
print("chosen micro-batch:", result.chosen_batch_size, "-", result.reason)
print("evaluation batch:", result.eval_batch_size)
print("plan:", {k: v for k, v in result.plan.to_dict().items() if k not in ("reasons", "workload")})

# The plan in your own loop; this data set (two optimizer steps of random
# samples) stands in for yours.
dataset = torch.utils.data.TensorDataset(*make_batch(2 * result.plan.batch_size))
loader = torch.utils.data.DataLoader(dataset, shuffle=True, **result.plan.dataloader_kwargs())
trainer = batchtune.Trainer(model, optimizer, loss_fn, result.plan)
for batch in loader:
    loss = trainer.step(batch)
    print(f"step {trainer.steps_done}: loss {loss:.3f}, lr {optimizer.param_groups[0]['lr']:.4f}")
