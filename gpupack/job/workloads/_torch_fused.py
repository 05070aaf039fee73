"""Fused training: N same-shape torch models trained as one batched model with torch.func (vmap), each exactly as
alone (_torch_common.run): its own seeded subset, data order, initialisation, learning rate, momentum and weight
decay, loss and metrics. A model whose loss stops being finite is stopped and reported failed; the others go on.
"""
from __future__ import annotations

import copy
from typing import Callable, Iterator, Sequence, TypeVar

from gpupack.core.frameworks import Framework, Generator, Loader, Model, Tensor
from gpupack.core.workload import TrainingContext
from gpupack.errors import ConfigError
from gpupack.job.workloads._images import ImageSet, images
from gpupack.job.workloads._params import Metrics, TrainingParams

TP = TypeVar("TP", bound=TrainingParams)  # the group's hyperparameters, as its workload declares them


def fuse_key(params: TrainingParams, *shape_keys: str) -> tuple[object, ...]:
    """The group key of a torch image workload: its shape hyperparameters and what fixes its batches and steps."""
    for key in ("amp", "loader_only"):  # autocast and the loader alone are per-process: not in a fused group
        if getattr(params, key):
            raise ConfigError(key, True, "cannot be fused", f"set {key}=false, or use packing.modes=[process]")
    return tuple(getattr(params, k) for k in shape_keys) + (
        params.batch_size, params.epochs, params.train_samples, params.val_samples, params.data_dir)


class Diverged(RuntimeError):
    """A fused model's loss became NaN or infinite: that training failed, the others of its group go on."""


def subset(torch: Framework, data: ImageSet, params: TrainingParams, gen: Generator) -> tuple[Tensor, Tensor]:
    """The training's seeded subset, consuming ``gen`` exactly as _torch_common.run does."""
    order = torch.randperm(len(data.y_train), generator=gen)[: params.train_samples].numpy()
    return images(torch, data.x_train[order]), torch.from_numpy(data.y_train[order]).long()


class _Indices:
    """The dataset ``range(n)`` whose batch is fetched whole, not one fetch and collate per sample."""

    def __init__(self, torch: Framework, n: int) -> None:
        self.torch, self.n = torch, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i

    def __getitems__(self, indices: list[int]) -> Tensor:  # torch's fetcher takes a batch this way (torch >= 2.1)
        return self.torch.tensor(indices)


def index_loader(torch: Framework, n: int, batch_size: int, gen: Generator) -> Loader:
    """Batches of indices as a DataLoader(shuffle=True, generator=gen) gives them, drawing from ``gen`` alike."""
    from torch.utils.data import DataLoader

    return DataLoader(_Indices(torch, n), batch_size=batch_size, shuffle=True, generator=gen,  # type: ignore[arg-type]
                      collate_fn=lambda batch: batch)  # the batch is one tensor already


def lockstep(loaders: Sequence[Loader]) -> Iterator[list[Tensor]]:
    """One batch of each loader per step, every iterator drained at the end (a DataLoader draws from its generator
    when it finds its end: each model's must advance exactly as alone)."""
    iters = [iter(loader) for loader in loaders]
    while True:
        batches = [next(it, None) for it in iters]
        present = [b for b in batches if b is not None]
        if len(present) < len(batches):
            if present:
                raise RuntimeError("fused loaders of one group gave different numbers of batches")
            return
        yield present


def train_fused(params_list: Sequence[TP], ctxs: Sequence[TrainingContext], data: ImageSet,
                build_model: Callable[[Framework, TP], Model], weight_decay: float = 0.0, eval_batch: int = 2000,
                keep: list[dict[str, Tensor]] | None = None) -> list[Metrics | BaseException]:
    """Train the group; each training's metrics, or the exception that stopped it. ``keep``: final state dicts."""
    import torch
    import torch.nn.functional as F
    from torch.func import functional_call, stack_module_state, vmap

    device = torch.device(ctxs[0].device)
    n = len(params_list)
    x_all, y_all, loaders, models = _set_up(torch, params_list, data, build_model, device)
    base = copy.deepcopy(models[0]).to("meta")
    weights, buffers = stack_module_state(models)  # {name: [N, ...]} leaves that require grad
    x_val = images(torch, data.x_test[: params_list[0].val_samples]).to(device)
    y_val = torch.from_numpy(data.y_test[: params_list[0].val_samples]).long().to(device)
    lr, momentum, decay = (torch.tensor(values, dtype=x_all.dtype, device=device) for values in (
        [p.lr for p in params_list], [p.momentum for p in params_list], [weight_decay] * n))  # per model

    def loss_of(w: Tensor, b: Tensor, xb: Tensor, yb: Tensor) -> Tensor:
        return F.cross_entropy(functional_call(base, (w, b), (xb,)), yb)

    batched_loss = vmap(loss_of)
    rows = torch.arange(n, device=device)[:, None]
    bufs: dict[str, Tensor] = {}
    alive = [True] * n
    failure: list[BaseException | None] = [None] * n
    running, count = torch.zeros(n, dtype=torch.float64), 0
    base.eval()  # eval: the warm-up must not touch BatchNorm's running statistics
    with torch.no_grad():  # the first batched call pays torch.func's lazy set-up (~1 s): start-up, not loop
        batched_loss(weights, buffers, x_all[:, :2], y_all[:, :2])
    base.train()  # as alone: batch statistics (BatchNorm) while training, running statistics to evaluate
    for ctx in ctxs:
        ctx.reporter.loop_started()
    for epoch in range(params_list[0].epochs):
        for step, idx in enumerate(lockstep(loaders)):
            batch = torch.stack(idx).to(device)  # [N, B]: each model's own batch
            xb, yb = x_all[rows, batch], y_all[rows, batch]
            losses = batched_loss(weights, buffers, xb, yb)
            for w in weights.values():
                w.grad = None
            losses.sum().backward()  # the models are independent: each gets its own gradient
            with torch.no_grad():
                sgd_step(weights, bufs, lr, momentum, decay)
            values = losses.detach().to("cpu", torch.float64)
            _count_step(torch, values, alive, failure, ctxs, [len(i) for i in idx],
                        f"epoch {epoch + 1}, step {step + 1}")
            running += values.nan_to_num(0.0) * len(idx[0])
            count += len(idx[0])
    for m, ctx in enumerate(ctxs):
        if alive[m]:
            ctx.reporter.loop_ended()
    if keep is not None:
        keep += [{name: t[m].detach().clone() for name, t in {**weights, **buffers}.items()} for m in range(n)]
    accuracy = fused_accuracy(torch, vmap, functional_call, base, weights, buffers, x_val, y_val, eval_batch)
    return [failed if (failed := failure[m]) is not None else
            {"train_loss": running[m].item() / max(count, 1), "val_accuracy": accuracy[m], "data": data.source,
             "fused_group": n}
            for m in range(n)]


def _set_up(torch: Framework, params_list: Sequence[TP], data: ImageSet,
            build_model: Callable[[Framework, TP], Model], device: object,
            ) -> tuple[Tensor, Tensor, list[Loader], list[Model]]:
    """Each model set up as alone (seed, subset, loader, initialisation); the subsets stacked on the device."""
    xs, ys, loaders, models = [], [], [], []
    for p in params_list:
        torch.manual_seed(p.seed)
        gen = torch.Generator().manual_seed(p.seed)
        x, y = subset(torch, data, p, gen)
        xs.append(x)
        ys.append(y)
        loaders.append(index_loader(torch, len(y), p.batch_size, gen))
        models.append(build_model(torch.nn, p).to(device))
    return torch.stack(xs).to(device), torch.stack(ys).to(device), loaders, models


def _count_step(torch: Framework, values: Tensor, alive: list[bool], failure: list[BaseException | None],
                ctxs: Sequence[TrainingContext], batches: Sequence[int], where: str) -> None:
    """One step of each model told to its reporter; a model whose loss is no longer finite stops (Diverged)."""
    finite = torch.isfinite(values).tolist()  # one call, not one per model: N of them cost a step's time
    for m, ctx in enumerate(ctxs):
        if alive[m] and not finite[m]:
            alive[m] = False
            failure[m] = Diverged(f"loss became {values[m].item()} at {where}: this model stopped, the others of its "
                                  "fused group went on")
            ctx.reporter.loop_ended()
        elif alive[m]:
            ctx.reporter.step(batches[m])


def sgd_step(weights: dict[str, Tensor], bufs: dict[str, Tensor], lr: Tensor, momentum: Tensor, decay: Tensor) -> None:
    """torch.optim.SGD's update (dampening 0, no Nesterov), one learning rate, momentum and weight decay per model."""
    for name, w in weights.items():
        shape = (-1,) + (1,) * (w.dim() - 1)
        d_p = w.grad + decay.view(shape) * w
        buf = bufs.get(name)
        if buf is None:  # SGD's first step: the buffer is the gradient itself
            buf = bufs[name] = d_p.clone()
        else:
            buf.mul_(momentum.view(shape)).add_(d_p)
        w.sub_(lr.view(shape) * buf)


def fused_accuracy(torch: Framework, vmap: Framework, functional_call: Framework, base: Model, weights: Tensor,
                   buffers: Tensor, x: Tensor, y: Tensor, batch: int) -> list[float]:
    base.eval()  # as alone's accuracy(): BatchNorm uses each model's running statistics
    correct = torch.zeros(len(next(iter(weights.values()))), dtype=torch.long)
    with torch.no_grad():
        forward = vmap(lambda w, b, xb: functional_call(base, (w, b), (xb,)), in_dims=(0, 0, None))
        for i in range(0, len(y), batch):
            logits = forward(weights, buffers, x[i:i + batch])  # [N, b, classes]
            correct += (logits.argmax(-1).cpu() == y[i:i + batch].cpu()).sum(1)
    return [c / max(len(y), 1) for c in correct.tolist()]
