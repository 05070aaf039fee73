"""What the torch workloads share: the loader, the training loop (with AMP), the loader-only pass, accuracy. Spread
over k devices, the same loop trains on this rank's slice of each global batch (``batch_size`` at every k).
"""
from __future__ import annotations

import contextlib
from abc import abstractmethod
from typing import Callable, ClassVar, ContextManager, Mapping, Sequence, TypeVar, cast

from gpupack.core.frameworks import Device, Framework, GradScaler, Loader, Model, Optimizer, Tensor
from gpupack.core.placement import Spread
from gpupack.core.workload import TrainingContext, Workload
from gpupack.errors import ConfigError
from gpupack.job.workloads import _torch_fused
from gpupack.job.workloads._images import ImageData, ImageSet, images
from gpupack.job.workloads._params import (
    LOADER_PARAM,
    TORCH_KNOBS,
    TORCH_LOADER_KEYS,
    Metrics,
    TorchLoaderParams,
    TrainingParams,
)

TP = TypeVar("TP", bound=TorchLoaderParams)  # a torch image workload's own hyperparameters


class TorchImageWorkload(Workload[TP]):
    """A torch classifier on an image data set, trained alone (:func:`run`) or fused with others of its shape
    (gpupack/job/workloads/_torch_fused.py): what mnist_torch and cifar10_torch share. A subclass names its data module,
    builds its model, and says which hyperparameters fix that model's shape."""

    framework = "torch"
    forkable = True  # torch imports without threads or CUDA: trainings fork from a preloaded server
    fusable = True  # N models of one shape train as one batched model
    spreads = ("ddp",)  # one training over k devices: DistributedDataParallel, one process per device
    loader_param, loader_keys, knob_keys = LOADER_PARAM, TORCH_LOADER_KEYS, TORCH_KNOBS
    # run()'s numbers, and a fused group's size (_torch_fused.train_fused)
    reported_metrics = ("train_loss", "val_accuracy", "peak_gpu_mem_mb", "fused_group")
    data: ClassVar[ImageData]  # a module with load(data_dir) → x_train, y_train, x_test, y_test, source
    shape_keys: ClassVar[tuple[str, ...]]  # the hyperparameters that fix the model's shape (fused groups)
    weight_decay: ClassVar[float] = 0.0
    eval_batch: ClassVar[int] = 2000

    def cost(self, params: Mapping[str, object]) -> float | None:
        """Samples seen: epochs x train_samples (the model and batch size of one sweep usually stay put)."""
        return number(params, "epochs") * number(params, "train_samples")

    @abstractmethod
    def build(self, params: TP, nn: Framework) -> Model:
        """The model for these hyperparameters, from ``torch.nn``."""

    def preload(self, params: Sequence[TP]) -> None:
        preload(self.data.load, params)

    def check_spread(self, params: TP, strategy: str, devices: int) -> None:
        check_split(params, devices)

    def fuse_key(self, params: TP) -> tuple[object, ...]:
        return _torch_fused.fuse_key(params, *self.shape_keys)

    def train_fused(self, params: Sequence[TP], ctxs: Sequence[TrainingContext]) -> list[Metrics | BaseException]:
        return _torch_fused.train_fused(params, ctxs, self.data.load(params[0].data_dir),
                                        lambda nn, p: self.build(p, nn), weight_decay=self.weight_decay,
                                        eval_batch=self.eval_batch)

    def train(self, params: TP, ctx: TrainingContext) -> Metrics:
        return run(params, ctx, self.data.load(params.data_dir), lambda nn: self.build(params, nn),
                   weight_decay=self.weight_decay, eval_batch=self.eval_batch)


def number(params: Mapping[str, object], key: str) -> float:
    """A numeric hyperparameter of a training's plain values (its Params typed them before anything ran)."""
    return float(cast(float, params[key]))


def check_split(params: TrainingParams, devices: int) -> None:
    """Each of a spread training's k processes trains on a slice of every global batch: a batch needs k samples."""
    first = min(params.batch_size, params.train_samples)
    if first < devices:
        key = "batch_size" if params.batch_size <= params.train_samples else "train_samples"
        raise ConfigError(key, getattr(params, key), f"one global batch ({first} samples) is split over the "
                          f"{devices} processes of a spread training", f"use {key} >= {devices}, or fewer devices")


def preload(load: Callable[[str | None], object], params: Sequence[TrainingParams]) -> None:
    """What a torch workload's fork server does once: import torch and read each data folder the pack uses."""
    import torch  # noqa: F401  (imported, never initialised on a device)

    # what the first optimizer imports lazily (~1 s here); imports start no thread, so forking stays safe
    import torch._dynamo  # noqa: F401
    import torch.utils.data  # noqa: F401

    for data_dir in sorted({p.data_dir for p in params}, key=str):
        load(data_dir)


def run(params: TorchLoaderParams, ctx: TrainingContext, data: ImageSet, build_model: Callable[[Framework], Model],
        weight_decay: float = 0.0, eval_batch: int = 2000, channels_last: bool = False) -> Metrics:
    """A whole torch training on an image data set: the loader alone, or SGD on ``build_model(torch.nn)``."""
    import torch

    torch.set_num_threads(ctx.threads)
    torch.manual_seed(params.seed)
    device = torch.device(ctx.device)
    gen = torch.Generator().manual_seed(params.seed)
    order = torch.randperm(len(data.y_train), generator=gen)[: params.train_samples]
    # Subset first, then convert: converting all 60,000 images to float to keep a few thousand cost ~0.5 s of start-up.
    x_train, y_train = images(torch, data.x_train[order.numpy()]), torch.from_numpy(data.y_train[order.numpy()]).long()
    x_val = images(torch, data.x_test[: params.val_samples])
    y_val = torch.from_numpy(data.y_test[: params.val_samples]).long()
    spread = ctx.spread
    if spread is not None:  # some rank's slice of every batch would be empty
        check_split(params, spread.world)
    # Spread: the same batches as packing's trainings (a last partial batch included, split unevenly; see train()).
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=params.batch_size, shuffle=True, generator=gen,
                        num_workers=params.num_workers, pin_memory=params.pin_memory and device.type == "cuda")
    if params.loader_only:
        return loader_only(params, loader, device, ctx, torch, data.source)
    model = build_model(torch.nn).to(device)
    memory_format = torch.channels_last if channels_last else None
    if memory_format is not None:  # NHWC: what tensor cores' convolutions want (with AMP)
        model = model.to(memory_format=memory_format)
    trained = spread.wrap(model) if spread is not None else model  # DDP: the same parameters, all-reduced
    opt = torch.optim.SGD(trained.parameters(), lr=params.lr, momentum=params.momentum, weight_decay=weight_decay)

    def epoch_end(epoch: int) -> bool:  # a search's trial: each epoch's validation accuracy is its curve
        pruned = ctx.report(accuracy(model, x_val, y_val, device, torch, eval_batch), epoch)
        model.train()
        return pruned

    curve = epoch_end if spread is None and ctx.ranks_by("val_accuracy") else None
    loss = train(trained, opt, loader, params, device, ctx, torch, memory_format, curve)
    if spread is not None:
        loss = spread.mean(loss)  # each rank's mean, weighted to its share below: their mean is the global mean
    # Evaluated on the unwrapped model: every rank holds the same weights, and no all-reduce runs outside training.
    return {"train_loss": loss, "val_accuracy": accuracy(model, x_val, y_val, device, torch, eval_batch),
            "peak_gpu_mem_mb": peak_gpu_mem_mb(device, torch), "data": data.source}


def amp(enabled: bool, device: Device, torch: Framework) -> tuple[Callable[[], ContextManager[object]],
                                                                   GradScaler | None]:
    """The autocast context and, on CUDA, the GradScaler that float16 needs (bfloat16 on CPU needs none)."""
    if not enabled:
        return contextlib.nullcontext, None
    if device.type == "cuda":
        return (lambda: torch.autocast("cuda", dtype=torch.float16)), torch.amp.GradScaler("cuda")
    return (lambda: torch.autocast("cpu", dtype=torch.bfloat16)), None


def loader_only(params: TrainingParams, loader: Loader, device: Device, ctx: TrainingContext, torch: Framework,
                source: str) -> Metrics:
    """The same batches, onto the device, and nothing else: what the input pipeline alone can deliver."""
    rep = ctx.reporter
    rep.loop_started()
    for _ in range(params.epochs):
        for xb, yb in loader:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            rep.step(len(yb))
    if device.type == "cuda":
        torch.cuda.synchronize()
    rep.loop_ended()
    return {"loader_only": True, "data": source}


def train(model: Model, opt: Optimizer, loader: Loader, params: TrainingParams, device: Device, ctx: TrainingContext,
          torch: Framework, memory_format: Framework = None, epoch_end: Callable[[int], bool] | None = None) -> float:
    """The training loop, each step reported; returns the mean training loss (spread: this rank's share of it).
    ``epoch_end(epoch)`` after each epoch: True (pruned) ends the loop. A list under ``ctx.reporter.info["losses"]``
    gets each step's loss (spread: this rank's weighted share), to compare loss curves in tests."""
    loss_fn = torch.nn.CrossEntropyLoss()
    autocast, scaler = amp(params.amp, device, torch)
    rep = ctx.reporter
    losses = rep.info.get("losses")
    rep.loop_started()
    running, count = 0.0, 0
    model.train()
    for epoch in range(params.epochs):
        for xb, yb in loader:
            n = len(yb)  # the global batch: what the step trained on, over all ranks
            batch = _on_device(xb, yb, device, memory_format, ctx.spread)
            if batch is None:
                continue
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss = loss_fn(model(batch[0]), batch[1])
                if batch[2] != 1.0:
                    loss = loss * batch[2]
            _backward_step(loss, opt, scaler)
            value = loss.item()
            running += value * n
            count += n
            if losses is not None:
                losses.append(value)
            rep.step(n)
        if epoch_end is not None and epoch_end(epoch):
            break
    if device.type == "cuda":
        torch.cuda.synchronize()
    rep.loop_ended()
    return running / max(count, 1)


def _on_device(xb: Tensor, yb: Tensor, device: Device, memory_format: Framework, spread: Spread | None
               ) -> tuple[Tensor, Tensor, float] | None:
    """A batch on the device, spread: this rank's slice of it, with its loss weight; None for a last partial batch too
    small to give every rank a sample (every rank skips it alike: the only step a spread training leaves out)."""
    xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
    if memory_format is not None:
        xb = xb.contiguous(memory_format=memory_format)
    n = len(yb)
    if spread is None:
        return xb, yb, 1.0
    if n < spread.world:
        return None
    xb, yb = spread.shard(xb, yb)
    # weighted by its share of the batch, DDP's average of the ranks' gradients stays the global batch's mean
    return xb, yb, len(yb) * spread.world / n


def _backward_step(loss: Tensor, opt: Optimizer, scaler: GradScaler | None) -> None:
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    else:
        loss.backward()
        opt.step()


def accuracy(model: Model, x: Tensor, y: Tensor, device: Device, torch: Framework, batch: int = 2000) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y), batch):
            correct += int((model(x[i:i + batch].to(device)).argmax(1).cpu() == y[i:i + batch]).sum())
    return correct / max(len(y), 1)


def peak_gpu_mem_mb(device: Device, torch: Framework) -> float | None:
    return float(torch.cuda.max_memory_allocated(device) / 2**20) if device.type == "cuda" else None
