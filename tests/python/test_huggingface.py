"""batchtune.huggingface.tune_training_args: a small GPT-2 from a config (no
download) tuned with its real loss on its data set; the returned
TrainingArguments keep the target global batch and train; no trace."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import batchtune

from conftest import assert_bit_identical, state_copy

transformers = pytest.importorskip("transformers")
from batchtune.huggingface import tune_training_args  # noqa: E402

LIMIT = "10MiB"
LENGTH = 16


def tiny_gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=128, n_positions=LENGTH, n_embd=32, n_layer=2,
                                     n_head=2, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def token_data(n=128):
    # Made before any budget: host data, not the emulated device's.
    g = torch.Generator().manual_seed(1)
    return [{"input_ids": x, "labels": x} for x in torch.randint(0, 128, (n, LENGTH), generator=g)]


def training_args(tmp_path, **kwargs):
    kwargs = {"per_device_train_batch_size": 64, "learning_rate": 1e-3, **kwargs}
    return transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none",
                                          save_strategy="no", logging_strategy="no", **kwargs)


def test_helper_keeps_the_global_batch_by_accumulation_and_the_args_train(tmp_path):
    data = token_data()
    with batchtune.emulated_memory(LIMIT):  # the training under the budget it was tuned for
        model = tiny_gpt2()
        args = training_args(tmp_path, max_steps=1)
        tuned, result = tune_training_args(model, args, data, memory_limit=LIMIT, report=None,
                                           amp="off", sweep=False, return_result=True, quiet=True)
        # 64 does not fit: a smaller micro-batch, accumulated to the same 64.
        assert result.max_batch_size < 64
        assert tuned.per_device_train_batch_size < 64
        assert tuned.per_device_train_batch_size * tuned.gradient_accumulation_steps == 64
        assert tuned.learning_rate == pytest.approx(1e-3)  # the global batch kept: lr unscaled
        assert not tuned.bf16 and not tuned.fp16
        assert args.per_device_train_batch_size == 64  # a copy; args is not changed
        out = transformers.Trainer(model=model, args=tuned, train_dataset=data).train()
    assert out.global_step == 1
    assert torch.isfinite(torch.tensor(out.training_loss))


def test_helper_scales_the_lr_to_a_target_batch_and_leaves_no_trace(tmp_path):
    data = token_data()
    model = tiny_gpt2()
    model.eval()
    trainer = transformers.Trainer(model=model, args=training_args(tmp_path, per_device_train_batch_size=8),
                                   train_dataset=data)
    before = state_copy(model, torch.optim.SGD(model.parameters(), lr=0))
    tuned, result = tune_training_args(trainer, target_batch=64, memory_limit=LIMIT, report=None,
                                       amp="off", sweep=False, quiet=True, return_result=True)
    # The reasons say where the lr came from, in Python's words.
    lr_reason = next(r for r in result.plan.reasons if r.startswith("lr "))
    assert "(the TrainingArguments' learning_rate)" in lr_reason, lr_reason
    assert not any(" --" in r for r in result.plan.reasons), result.plan.reasons
    assert_bit_identical(before[0], model.state_dict())
    assert all(p.grad is None for p in model.parameters())
    assert not model.training  # its eval mode back (the trials ran it in train mode)
    assert trainer.optimizer is None  # the trials' AdamW was the helper's own
    assert tuned.per_device_train_batch_size * tuned.gradient_accumulation_steps == 64
    # AdamW: square-root scaling from the configured 8 to 64, with a warm-up.
    assert tuned.learning_rate == pytest.approx(1e-3 * (64 / 8) ** 0.5)
    assert tuned.warmup_steps > 0


def test_helper_without_a_dataset_names_it(tmp_path):
    with pytest.raises(batchtune.Error, match="train_dataset: give the training data set"):
        tune_training_args(tiny_gpt2(), training_args(tmp_path), None)


def test_helper_counts_every_gpu_of_data_parallel_in_the_global_batch(tmp_path, monkeypatch):
    # Without a launcher on a machine of 4 GPUs the Trainer runs DataParallel:
    # world_size 1, n_gpu 4, and each step loads per-device x 4 samples.
    monkeypatch.setattr(transformers.TrainingArguments, "n_gpu", property(lambda self: 4))
    data = token_data()
    args = training_args(tmp_path, per_device_train_batch_size=16)
    assert args.world_size == 1 and args.n_gpu == 4
    tuned, result = tune_training_args(tiny_gpt2(), args, data, memory_limit=LIMIT, report=None,
                                       amp="off", sweep=False, return_result=True, quiet=True)
    assert result.plan.world_size == 4
    assert tuned.per_device_train_batch_size * tuned.gradient_accumulation_steps * 4 == 64
    assert tuned.learning_rate == pytest.approx(1e-3)  # the configured 64 kept: lr unscaled


def launch(launcher, job, tmp_path, *flags):
    """Runs a job of this folder on two CPU processes, by torchrun or by
    `accelerate launch` (explicit flags: no accelerate config file is read)."""
    tools = Path(sys.executable).parent
    if launcher == "torchrun":
        command = [str(tools / "torchrun"), "--standalone", "--nproc_per_node", "2"]
    else:
        pytest.importorskip("accelerate")
        command = [str(tools / "accelerate"), "launch", *flags, "--num_processes", "2",
                   "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([*command, str(Path(__file__).with_name(job)), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_two_processes_of_the_trainers_ddp_get_one_plan_and_train_with_it(tmp_path, launcher):
    """Under torchrun and under `accelerate launch --multi_gpu` (on CPUs: the
    Trainer's DDP on two processes over Gloo), the ranks under different
    budgets: one plan that fits the smaller, the global batch kept, and the
    same weights after training with it."""
    ranks = launch(launcher, "huggingface_ddp_job.py", tmp_path, "--multi_gpu")
    assert ranks[0]["plan"] == ranks[1]["plan"]
    assert ranks[0]["own"] > ranks[1]["own"]  # rank 1's budget is smaller
    for r in ranks:
        assert r["world"] == 2 and r["global_step"] == 2
        assert r["micro_batch"] <= ranks[1]["own"]
        assert r["micro_batch"] * r["accumulation"] == 64  # per device, as asked
    assert ranks[0]["plan"]["global_batch_size"] == 128
    assert ranks[0]["weights"] == ranks[1]["weights"]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
def test_a_model_sharded_with_fsdp2_is_tuned_sharded_under_accelerate_launch(tmp_path):
    """`accelerate launch --use_fsdp --fsdp_version 2`, two CPU processes
    under different budgets, a GPT-2 the user sharded with fully_shard: the
    trials run in lockstep (the same on both ranks, each fitting where it
    fits on both), one plan, the shards as they were, and the plan trains."""
    ranks = launch("accelerate", "huggingface_fsdp_job.py", tmp_path, "--use_fsdp",
                   "--fsdp_version", "2")
    assert ranks[0]["plan"] == ranks[1]["plan"]
    assert ranks[0]["trials"] == ranks[1]["trials"]
    assert any(fits for _, fits in ranks[0]["trials"]) and not all(f for _, f in ranks[0]["trials"])
    for r in ranks:
        assert r["world"] == 2 and r["unchanged"]
        assert r["micro_batch"] <= r["own"] < 64  # 64 a process does not fit: accumulated
        assert r["micro_batch"] * r["accumulation"] == 64
        assert len(r["losses"]) == 2 and all(math.isfinite(loss) for loss in r["losses"])
    assert ranks[0]["plan"]["global_batch_size"] == 128


def test_a_model_the_trainer_will_shard_is_tuned_whole_with_a_warning(tmp_path):
    args = training_args(tmp_path, fsdp=True, max_steps=1)
    with pytest.warns(UserWarning, match="the Trainer will shard this model with FSDP, but it is "
                                         "tuned whole on every process"):
        tuned = tune_training_args(tiny_gpt2(), args, token_data(), memory_limit=LIMIT,
                                   report=None, amp="off", sweep=False, quiet=True)
    assert tuned.per_device_train_batch_size >= 1
