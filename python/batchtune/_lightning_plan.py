"""The plan mapped onto Lightning's own settings: the batch size the loaders
read, `accumulate_grad_batches`, the precision plugin, the optimizer's lr and
a warm-up scheduler."""
from __future__ import annotations

import logging
from typing import Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.parsing import lightning_setattr
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from . import _core
from .plan import Plan, group_lr_ratios

log = logging.getLogger("batchtune.lightning")

# Lightning's precision flags and the amp of batchtune's trials.
_AMP_OF_PRECISION = {"bf16-mixed": "bf16", "16-mixed": "fp16"}
_PRECISION_OF_AMP = {"bf16": "bf16-mixed", "fp16": "16-mixed"}


def trainer_amp(trainer: "pl.Trainer") -> str:
    """The amp that the Trainer's precision runs: bf16/fp16 for the mixed
    precisions, off otherwise (a "-true" precision converts the module itself,
    and the trials run that module as it is)."""
    return _AMP_OF_PRECISION.get(str(trainer.precision), "off")


def switchable(trainer: "pl.Trainer", amp: str) -> bool:
    """Whether the callback can switch the Trainer to `amp`: from "32-true" to
    a mixed precision only (the trials ran at fp32, so the size still fits)."""
    return str(trainer.precision) in ("32-true", "32") and amp in _PRECISION_OF_AMP


def amp_mismatch(trainer: "pl.Trainer", what: str) -> Exception:
    return _core.Error(f"amp: {what} is not the Trainer's precision '{trainer.precision}'; pass "
                       "Trainer(precision=...) to match, or leave amp unset (the Trainer's)")


def apply_plan(trainer: "pl.Trainer", pl_module: "pl.LightningModule", plan: Plan, *,
               batch_arg_name: str, scale_lr: bool, report: Optional[str], resumed: bool) -> None:
    """Sets the plan where Lightning reads it: the micro-batch at
    `batch_arg_name` (the loaders are made again with it), the accumulation,
    the precision (a "32-true" Trainer switched to the plan's mixed
    precision), the lr in every parameter group (their ratios kept, a linear
    warm-up as a step-wise LambdaLR) unless `scale_lr` is False or
    `configure_optimizers` returned a scheduler; says what it set and why,
    and logs the plan as hyperparameters. A plan with a token budget trains
    one micro-batch a rank a step (accumulate_grad_batches 1)."""
    said = []
    lightning_setattr(pl_module, batch_arg_name, plan.micro_batch_size)
    if plan.token_budget > 0:
        # One micro-batch of the budget a rank a step: Lightning divides each
        # accumulated loss by the count alike, which micro-batches of
        # different token counts must not be.
        trainer.accumulate_grad_batches = 1
        said.append(f"micro-batches of at most {plan.token_budget} padded tokens "
                    f"(TokenBudgetSampler), one a rank a step: accumulate_grad_batches 1, "
                    f"about {plan.tokens_per_step} tokens a step")
    else:
        trainer.accumulate_grad_batches = plan.accumulation_steps
        said.append(f"{batch_arg_name} {plan.micro_batch_size}, accumulate_grad_batches "
                    f"{plan.accumulation_steps}, global batch {plan.global_batch_size}")
    _apply_precision(trainer, plan, said)
    _apply_lr(trainer, plan, scale_lr, said)
    # The loaders are made (again) with the new batch size.
    fit_loop = trainer.fit_loop
    if hasattr(fit_loop, "_combined_loader"):
        fit_loop._combined_loader = None
        val_loop = getattr(fit_loop.epoch_loop, "val_loop", None)
        if val_loop is not None and hasattr(val_loop, "_combined_loader"):
            val_loop._combined_loader = None
    head = "batchtune: resumed with the checkpoint's plan: " if resumed else "batchtune: "
    rank_zero_info(head + "; ".join(said))
    for reason in plan.reasons:
        rank_zero_info(f"batchtune:   {reason}")
    if report:
        rank_zero_info(f"batchtune: report {report}")
    if trainer.logger is not None and not resumed:
        try:
            params = {
                "batchtune/micro_batch_size": plan.micro_batch_size,
                "batchtune/accumulation_steps": plan.accumulation_steps,
                "batchtune/global_batch_size": plan.global_batch_size,
                "batchtune/lr": plan.lr, "batchtune/warmup_steps": plan.warmup_steps,
                "batchtune/amp": plan.amp}
            if plan.token_budget > 0:
                params["batchtune/token_budget"] = plan.token_budget
            trainer.logger.log_hyperparams(params)
        except Exception as e:  # noqa: BLE001 - a logger's refusal must not stop the fit
            log.warning("batchtune: the logger did not take the plan (%s)", e)


def _apply_precision(trainer: "pl.Trainer", plan: Plan, said) -> None:
    if plan.amp == trainer_amp(trainer):
        return
    if switchable(trainer, plan.amp):
        from lightning.pytorch.plugins.precision import MixedPrecision

        precision = _PRECISION_OF_AMP[plan.amp]
        trainer.strategy.precision_plugin = MixedPrecision(
            precision, device=trainer.strategy.root_device.type)
        said.append(f"precision {precision} (was 32-true)")
        return
    raise amp_mismatch(trainer, f"the plan's {plan.amp}")


def _apply_lr(trainer: "pl.Trainer", plan: Plan, scale_lr: bool, said) -> None:
    optimizer = trainer.optimizers[0]
    if not scale_lr:
        said.append(f"lr left as it is (scale_lr=False; the plan says {plan.lr:.6g})")
        return
    if trainer.lr_scheduler_configs and not any(
            getattr(c.scheduler, "_batchtune_warmup", False) for c in trainer.lr_scheduler_configs):
        said.append(f"lr left to the scheduler configure_optimizers returned (the plan says "
                    f"{plan.lr:.6g}{f' with {plan.warmup_steps} warm-up steps' if plan.warmup_steps else ''})")
        return
    ratios = group_lr_ratios([float(g.get("initial_lr", g["lr"])) for g in optimizer.param_groups])
    for g, ratio in zip(optimizer.param_groups, ratios):
        g["lr"] = plan.lr * ratio
        g.pop("initial_lr", None)
    said.append(f"lr {plan.lr:.6g}")
    if plan.warmup_steps > 0:
        from lightning.pytorch.utilities.types import LRSchedulerConfig

        lr, steps = plan.lr, plan.warmup_steps
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: _core.scheduled_lr(lr, steps, step) / lr)
        scheduler._batchtune_warmup = True
        trainer.strategy.lr_scheduler_configs = [LRSchedulerConfig(scheduler, interval="step")]
        said.append(f"linear warm-up over {steps} optimizer steps")
