"""What the torch workloads share: the loader, the training loop (with AMP), the loader-only pass, accuracy."""
from __future__ import annotations

import contextlib
from typing import Any

from gpupack.workload import TrainingContext


def make_loader(torch: Any, x: Any, y: Any, params: Any, device: Any, gen: Any) -> Any:
    from torch.utils.data import DataLoader, TensorDataset

    return DataLoader(TensorDataset(x, y), batch_size=params.batch_size, shuffle=True, generator=gen,
                      num_workers=params.num_workers, pin_memory=params.pin_memory and device.type == "cuda")


def amp(enabled: bool, device: Any, torch: Any) -> tuple[Any, Any]:
    """The autocast context and, on CUDA, the GradScaler that float16 needs (bfloat16 on CPU needs none)."""
    if not enabled:
        return contextlib.nullcontext, None
    if device.type == "cuda":
        return (lambda: torch.autocast("cuda", dtype=torch.float16)), torch.amp.GradScaler("cuda")
    return (lambda: torch.autocast("cpu", dtype=torch.bfloat16)), None


def loader_only(params: Any, loader: Any, device: Any, ctx: TrainingContext, torch: Any,
                source: str) -> dict[str, Any]:
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


def train(model: Any, opt: Any, loader: Any, params: Any, device: Any, ctx: TrainingContext,
          torch: Any) -> float:
    """The training loop, each step reported; returns the mean training loss."""
    loss_fn = torch.nn.CrossEntropyLoss()
    autocast, scaler = amp(params.amp, device, torch)
    rep = ctx.reporter
    rep.loop_started()
    running, count = 0.0, 0
    model.train()
    for _ in range(params.epochs):
        for xb, yb in loader:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss = loss_fn(model(xb), yb)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            running += loss.item() * len(yb)
            count += len(yb)
            rep.step(len(yb))
    if device.type == "cuda":
        torch.cuda.synchronize()
    rep.loop_ended()
    return running / max(count, 1)


def accuracy(model: Any, x: Any, y: Any, device: Any, torch: Any, batch: int = 2000) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y), batch):
            correct += int((model(x[i:i + batch].to(device)).argmax(1).cpu() == y[i:i + batch]).sum())
    return correct / max(len(y), 1)


def peak_gpu_mem_mb(device: Any, torch: Any) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
