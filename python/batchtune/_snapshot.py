"""What a trial must leave as it found: the model's parameters and buffers,
their gradients, the optimizer's state and hyper-parameters, the random
generators, the autocast and grad modes, the modules' train/eval flags.
The copies live in host memory outside the emulated budget, so they are
not measured."""
from __future__ import annotations

import copy
import random
import sys
from typing import Any, Dict, List, Tuple

import torch

from . import _core

_AUTOCAST_DEVICES = ("cpu", "cuda")


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


def _put_back(target: torch.Tensor, saved: torch.Tensor) -> torch.Tensor:
    """`target` with `saved`'s values, in place when it can be (same object)."""
    if target.shape == saved.shape and target.dtype == saved.dtype:
        with torch.no_grad():
            target.copy_(saved)
        return target
    return saved.to(target.device)


class TrainingSnapshot:
    """Saves on construction; `restore()` puts everything back (any number of
    times). Tensors are restored into the same objects, so references the user
    holds (an EMA, a scheduler) still see them."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.model = model
        self.optimizer = optimizer
        with _core.uncounted():
            self.params: List[Tuple[torch.nn.Parameter, torch.Tensor, Any, Any]] = []
            for p in model.parameters():
                g = p.grad
                self.params.append((p, _host_copy(p), g, None if g is None else _host_copy(g)))
            # Parameters the optimizer trains that the model does not own.
            own = {id(p) for p in model.parameters()}
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if id(p) not in own:
                        own.add(id(p))
                        g = p.grad
                        self.params.append((p, _host_copy(p), g, None if g is None else _host_copy(g)))
            self.buffers: List[Tuple[torch.nn.Module, str, Any, Any]] = []
            for m in model.modules():
                for name, b in m._buffers.items():
                    self.buffers.append((m, name, b, None if b is None else _host_copy(b)))
            self.training = [(m, m.training) for m in model.modules()]
            self.state: Dict[Any, Dict[str, Tuple[Any, Any]]] = {}
            for p, st in optimizer.state.items():
                self.state[p] = {k: (v, _host_copy(v)) if isinstance(v, torch.Tensor)
                                 else (v, copy.deepcopy(v)) for k, v in st.items()}
            self.groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
                           for g in optimizer.param_groups]
            self.optimizer_attrs = {k: getattr(optimizer, k) for k in ("_opt_called",)
                                    if hasattr(optimizer, k)}
            self.rng_cpu = torch.get_rng_state()
            self.rng_cuda = (torch.cuda.get_rng_state_all()
                             if torch.cuda.is_available() and torch.cuda.is_initialized() else None)
        self.rng_python = random.getstate()
        numpy = sys.modules.get("numpy")
        self.rng_numpy = numpy.random.get_state() if numpy is not None else None
        self.autocast = {d: (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                         for d in _AUTOCAST_DEVICES}
        self.autocast_cache = torch.is_autocast_cache_enabled()
        self.grad_enabled = torch.is_grad_enabled()

    def restore(self) -> None:
        opt = self.optimizer
        with torch.no_grad():
            for p, value, grad, grad_value in self.params:
                _put_back(p.data, value)
                if grad is None:
                    p.grad = None
                else:
                    grad = _put_back(grad, grad_value)
                    p.grad = grad
            for m, name, b, value in self.buffers:
                if b is None:
                    m._buffers[name] = None
                else:
                    m._buffers[name] = _put_back(b, value)
            # State a first step created goes again; the rest is put back into
            # the same tensors.
            for p in list(opt.state.keys()):
                if p not in self.state:
                    del opt.state[p]
            for p, saved in self.state.items():
                restored = {}
                for k, (obj, value) in saved.items():
                    if isinstance(obj, torch.Tensor):
                        restored[k] = _put_back(obj, value)
                    else:
                        restored[k] = copy.deepcopy(value)
                opt.state[p] = restored
        for group, saved in zip(opt.param_groups, self.groups):
            for k in list(group.keys()):
                if k != "params" and k not in saved:
                    del group[k]
            for k, v in saved.items():
                group[k] = copy.deepcopy(v)
        for k, v in self.optimizer_attrs.items():
            setattr(opt, k, v)
        for m, training in self.training:
            m.training = training
        torch.set_rng_state(self.rng_cpu)
        if self.rng_cuda is not None:
            torch.cuda.set_rng_state_all(self.rng_cuda)
        random.setstate(self.rng_python)
        if self.rng_numpy is not None:
            sys.modules["numpy"].random.set_state(self.rng_numpy)
        for d, (enabled, dtype) in self.autocast.items():
            torch.set_autocast_enabled(d, enabled)
            torch.set_autocast_dtype(d, dtype)
        torch.set_autocast_cache_enabled(self.autocast_cache)
        if not any(enabled for enabled, _ in self.autocast.values()):
            torch.clear_autocast_cache()
        torch.set_grad_enabled(self.grad_enabled)
