"""A sweep's config from the command line to a checked plan. Only where the config tree lives is here, so that a
command that only reads a file of it (collect's RGU table) does not import Hydra."""
from __future__ import annotations

import importlib.resources
from pathlib import Path


def config_dir() -> Path:
    """conf/ of a checkout, else the copy shipped in the wheel as gpupack.conf."""
    checkout = Path(__file__).resolve().parents[3] / "conf"  # gpupack/sweep/setup/__init__.py: the checkout
    if (checkout / "config.yaml").is_file():
        return checkout
    return Path(str(importlib.resources.files("gpupack.conf")))
