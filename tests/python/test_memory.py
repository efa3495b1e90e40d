"""The emulated device from Python: Python's tensors are counted, and running
out is torch.OutOfMemoryError in the form that Python code recognises."""
import pytest
import torch

import batchtune
from batchtune import _core


def test_env_has_the_fields_of_batchtune_env_json():
    env = batchtune.env()
    for field in ("torch_version", "torch_cuda", "cuda_available", "cuda_reason", "cuda_driver",
                  "device_count", "devices", "nvml_available", "nvml_reason", "cpu_model",
                  "cpu_cores", "threads", "ram_total_bytes", "ram_available_bytes"):
        assert field in env, field
    assert env["torch_version"].split("+")[0] == torch.__version__.split("+")[0]
    assert env["ram_total_bytes"] > 0


def test_python_tensors_count_against_the_budget():
    with batchtune.emulated_memory("64MiB") as memory:
        before = memory.live_bytes
        x = torch.empty(4 << 20, dtype=torch.uint8)  # 4 MiB
        assert memory.live_bytes - before == 4 << 20
        del x
        assert memory.live_bytes == before


def test_running_out_is_torch_out_of_memory_in_pytorchs_form():
    with batchtune.emulated_memory("16MiB"):
        with pytest.raises(torch.OutOfMemoryError) as info:
            torch.empty(32 << 20, dtype=torch.uint8)
    message = str(info.value)
    assert message.startswith("DefaultCPUAllocator: can't allocate memory: you tried to allocate")
    assert "out of memory" in message
    assert isinstance(info.value, RuntimeError) and len(info.value.args) == 1
    # After the block the budget is lifted again.
    torch.empty(32 << 20, dtype=torch.uint8)


def test_lightning_and_accelerate_recognise_the_emulated_out_of_memory():
    accelerate_memory = pytest.importorskip("accelerate.utils.memory")
    lightning_memory = pytest.importorskip("lightning.pytorch.utilities.memory")
    with batchtune.emulated_memory("16MiB"):
        with pytest.raises(torch.OutOfMemoryError) as info:
            torch.empty(32 << 20, dtype=torch.uint8)
    assert accelerate_memory.should_reduce_batch_size(info.value)
    assert lightning_memory.is_oom_error(info.value)


def test_bad_memory_limit_is_one_line_naming_the_input():
    with pytest.raises(batchtune.Error, match="memory_limit"):
        with batchtune.emulated_memory("lots"):
            pass
    with pytest.raises(ValueError, match="memory_limit"):
        with batchtune.emulated_memory(0):
            pass
