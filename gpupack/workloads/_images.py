"""Images as torch tensors, for the torch workloads and their fused training alike."""
from __future__ import annotations

from typing import Any


def images(torch: Any, x: Any) -> Any:
    """uint8 images (n, H, W) or (n, H, W, C) as float NCHW tensors in [0, 1]."""
    t = torch.from_numpy(x).float().div_(255.0)
    return t.unsqueeze(1) if t.ndim == 3 else t.permute(0, 3, 1, 2)
