"""The shapes of accelerate's decorator and Lightning's callback."""
import pytest
import torch

import batchtune

from conftest import classify_loss, image_batch, small_convnet


def test_accelerate_shaped_decorator_calls_once_with_the_largest_that_fits():
    from batchtune.integrations.accelerate import find_executable_batch_size

    model = small_convnet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []

    @find_executable_batch_size(model=model, optimizer=optimizer, loss_fn=classify_loss,
                                make_batch=image_batch((3, 16, 16)), memory_limit="16MiB",
                                max_batch=256)
    def train(batch_size, tag):
        calls.append((batch_size, tag))
        return batch_size

    size = train("x")
    assert calls == [(size, "x")]
    assert size == train.tune_result.max_batch_size > 0


def test_lightning_callback_sets_the_batch_size_before_the_data_loads():
    pl = pytest.importorskip("lightning.pytorch")
    from batchtune.integrations.lightning import BatchtuneFinder

    seen = []

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = small_convnet()
            self.batch_size = 2

        def training_step(self, batch, _):
            seen.append(batch[0].shape[0])
            return classify_loss(self.net, batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            data = torch.utils.data.TensorDataset(*image_batch((3, 16, 16))(self.batch_size))
            return torch.utils.data.DataLoader(data, batch_size=self.batch_size)

    finder = BatchtuneFinder(image_batch((3, 16, 16)), lambda m, b: classify_loss(m.net, b),
                             memory_limit="16MiB", max_batch=256)
    trainer = pl.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[finder])
    module = Module()
    trainer.fit(module)
    assert module.batch_size == finder.result.max_batch_size > 2
    assert seen[-1] == module.batch_size
