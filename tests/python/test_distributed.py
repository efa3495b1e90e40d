"""Two ranks under torchrun (Gloo, the venv's own torchrun) get the same plan,
with the job's maximum the smallest rank's: a plain module, and one wrapped
in DistributedDataParallel (whose trials must not leave DDP's all-reduces
unmatched) that then trains with the plan."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
@pytest.mark.parametrize("kind", ["plain", "ddp", "compiled-ddp"])
def test_two_ranks_under_torchrun_get_one_plan(tmp_path, kind):
    torchrun = Path(sys.executable).with_name("torchrun")
    assert torchrun.exists(), torchrun
    env = dict(os.environ, OMP_NUM_THREADS="1")
    job = Path(__file__).with_name("ddp_tune_job.py")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(job),
                           str(tmp_path), kind], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["plan"] == ranks[1]["plan"]
    assert ranks[0]["max"] == ranks[1]["max"] == min(r["own"] for r in ranks)
    if kind == "plain":
        assert ranks[0]["own"] > ranks[1]["own"]  # rank 1's budget is smaller
    elif kind == "compiled-ddp":
        # Compiled once at a dynamic batch: no trial compiled again, and the
        # trials stayed in lockstep.
        assert ranks[0]["recompiles"] == ranks[1]["recompiles"] == 0
        assert [t[:2] for t in ranks[0]["trials"]] == [t[:2] for t in ranks[1]["trials"]]
    else:
        # In lockstep: the same trials on both ranks, each fitting where it
        # fits on both (alone, rank 0's larger budget finds a larger batch,
        # as in the plain case).
        assert [t[:2] for t in ranks[0]["trials"]] == [t[:2] for t in ranks[1]["trials"]]
        assert ranks[0]["own"] == ranks[1]["own"]
        # Rank 1 alone ran out of memory above 40 samples: one answer, 40.
        forced = [r["forced"] for r in ranks]
        assert forced[0]["max"] == forced[1]["max"] == 40
        assert [t[:2] for t in forced[0]["trials"]] == [t[:2] for t in forced[1]["trials"]]
        assert any(not fits and error.startswith("another rank ran out of memory")
                   for _, fits, error in forced[0]["trials"]), forced[0]["trials"]
    plan = ranks[0]["plan"]
    assert plan["world_size"] == 2
    assert plan["global_batch_size"] == plan["micro_batch_size"] * plan["accumulation_steps"] * 2
    if kind != "plain":  # trained in step: the same weights on both ranks
        assert ranks[0]["weights"] == ranks[1]["weights"]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
@pytest.mark.parametrize("where", ["forward", "backward"])
def test_an_fsdp2_model_tunes_in_lockstep_and_is_left_as_it_was(tmp_path, where):
    """FSDP2 on a CPU mesh: rank 1 alone runs out of memory above 40 samples
    (in its forward, or in its backward between FSDP's gathers and
    reduce-scatters); neither rank waits on a collective the other left."""
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    job = Path(__file__).with_name("fsdp_tune_job.py")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(job),
                           str(tmp_path), where], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["max"] == ranks[1]["max"] == 40
    assert ranks[0]["plan"] == ranks[1]["plan"]
    assert ranks[0]["plan"]["world_size"] == 2
    assert [t[:2] for t in ranks[0]["trials"]] == [t[:2] for t in ranks[1]["trials"]]
    assert any(not fits and error == "another rank ran out of memory in this step"
               for _, fits, error in ranks[0]["trials"]), ranks[0]["trials"]
    assert any(not fits and f"forced on rank 1 ({where})" in error
               for _, fits, error in ranks[1]["trials"]), ranks[1]["trials"]
    # Each rank's shards and optimizer state bit-identical after the tune.
    assert ranks[0]["unchanged"] and ranks[1]["unchanged"]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
def test_a_rank_that_cannot_start_the_tune_stops_every_rank_at_once(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    job = Path(__file__).with_name("ddp_tune_job.py")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(job),
                           str(tmp_path), "short"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    errors = [json.loads((tmp_path / f"rank{r}.json").read_text())["error"] for r in (0, 1)]
    assert errors[0] == ("tune: another rank could not start the tune (its own error says "
                         "why); every rank stops")
    assert errors[1] is not None and errors[1].startswith("memory_limit:"), errors[1]
    assert "\n" not in errors[1]



@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
@pytest.mark.parametrize("where", ["save", "restore"])
def test_an_error_outside_a_step_on_one_rank_stops_every_rank_at_its_next_meeting(tmp_path, where):
    # Before, rank 0 waited in its next collective until the 60 s timeout
    # (Gloo's "Timed out waiting" or a mismatched collective), or for ever.
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    job = Path(__file__).with_name("ddp_tune_job.py")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", str(job),
                           str(tmp_path), f"{where}-error"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[1]["error"] == f"RuntimeError: {where} failed on rank 1 (injected)", ranks[1]
    assert ranks[0]["error"] is not None, ranks[0]
    assert ranks[0]["error"].startswith("Error: "), ranks[0]["error"]
    assert "another rank stopped with an error (its own output says which)" in ranks[0]["error"]
    assert "\n" not in ranks[0]["error"]
    # Rank 0 reached the trial rank 1 stopped in, and no further.
    assert ranks[0]["calls"] == 3
