#!/usr/bin/env python3
"""Export PyTorch models for batchtune: scripted and traced TorchScript files.

batchtune trains a model from C++, so it needs the model as TorchScript: a
file that holds the code of `forward` and the weights. Two ways to make one:

  torch.jit.script(model)          compiles the Python code (keeps if/for);
  torch.jit.trace(model, example)  records the ops one example runs.

Save either with `.save("model.pt")`. Trace in training mode (`model.train()`)
so that dropout and batch norm behave as in training, and save the model
before any `torch.jit.freeze` (a frozen model has no trainable parameters).

Run:  python3 examples/export_model.py [OUTDIR]
and it prints the batchtune lines for each file it wrote.
"""
import os
import sys

import torch
import torch.nn as nn


class ImageClassifier(nn.Module):
    """A small CNN: [B, 3, 32, 32] float -> logits [B, 10]."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class TinyLanguageModel(nn.Module):
    """Token ids [B, T] int64 -> next-token logits [B, T, vocab]."""

    def __init__(self, vocab: int = 1000, width: int = 128, max_len: int = 128):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(max_len, width)
        self.block = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width,
                                                dropout=0.0, batch_first=True, norm_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.size(1)
        causal = torch.triu(torch.full((t, t), float("-inf"), device=tokens.device), 1)
        x = self.tokens(tokens) + self.positions(torch.arange(t, device=tokens.device))
        return self.head(self.block(x, src_mask=causal))


class WithOwnLoss(nn.Module):
    """A model whose forward takes the targets too and returns the loss,
    as many training codebases do: use it with --loss model."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.net = ImageClassifier(classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.net(x), y)


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    lines = []

    # 1. Scripted: torch.jit.script keeps Python control flow.
    path = os.path.join(out, "classifier_scripted.pt")
    torch.jit.script(ImageClassifier().train()).save(path)
    lines.append(f"batchtune probe --model {path} --input 3x32x32 --classes 10 --batch-size 64")
    lines.append(f"batchtune tune  --model {path} --input 3x32x32 --classes 10")

    # 2. Traced: torch.jit.trace records one run; give an example batch in
    #    training mode. The batch dimension stays free; other sizes are fixed.
    path = os.path.join(out, "classifier_traced.pt")
    model = ImageClassifier().train()
    torch.jit.trace(model, torch.randn(2, 3, 32, 32)).save(path)
    lines.append(f"batchtune probe --model {path} --input 3x32x32 --classes 10 --batch-size 64")

    # 3. A language model over token ids: the sequence length given to
    #    batchtune is the longest that training will see.
    path = os.path.join(out, "lm_scripted.pt")
    torch.jit.script(TinyLanguageModel(vocab=1000).train()).save(path)
    lines.append(f"batchtune probe --model {path} --input int64:128 --vocab 1000 --classes 1000 "
                 "--batch-size 8")
    lines.append(f"batchtune tune  --model {path} --input int64:128 --vocab 1000")

    # 4. A model that returns its own loss: forward(x, y) -> scalar.
    path = os.path.join(out, "own_loss_scripted.pt")
    torch.jit.script(WithOwnLoss().train()).save(path)
    lines.append(f"batchtune probe --model {path} --input 3x32x32 --classes 10 --loss model "
                 "--batch-size 64")

    print("Wrote TorchScript models. Try:")
    for line in lines:
        print("  " + line)


if __name__ == "__main__":
    main()
