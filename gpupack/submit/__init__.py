"""Submission backends: the only place that knows about executors.

Each backend is one module ``gpupack/submit/<backend>.py`` exposing ``SUBMITTER``, a :class:`Submitter`
subclass; a cluster preset (conf/cluster/*.yaml) names its backend. All backends hand a pack to the
same job body, :func:`gpupack.pack.job.run_pack`.
"""
from __future__ import annotations

import importlib
import pkgutil
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from gpupack.errors import ConfigError, nearest
from gpupack.pack.job import PackSettings
from gpupack.plan import Pack
from gpupack.rundir import RunDir


@dataclass
class PackResult:
    pack_id: str
    partition: str
    job_id: str | None
    ok: bool  # the job ran to its end (its trainings may still have failed: see the records)
    error: str | None = None
    record: dict[str, Any] | None = None


# Called with (pack, state) as packs move: "pending" → "running" → "done" | "failed".
ProgressFn = Callable[[Pack, str], None]


class Submitter(ABC):
    def __init__(self, cluster: Any, run: RunDir) -> None:
        self.cluster = cluster
        self.run = run

    def check(self) -> None:
        """Cluster-specific checks before anything is submitted (raise ConfigError)."""

    @abstractmethod
    def run_packs(self, packs: Sequence[Pack], settings: PackSettings, progress: ProgressFn) -> list[PackResult]:
        """Run every pack as one job on one device, wait for all, and say how each job ended."""


def available_backends() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def load_submitter(backend: str, cluster: Any, run: RunDir, key: str = "cluster.backend") -> Submitter:
    backends = available_backends()
    if backend not in backends:
        raise ConfigError(key, backend, "no such submission backend", nearest(backend, backends))
    cls: type[Submitter] = importlib.import_module(f"{__name__}.{backend}").SUBMITTER
    return cls(cluster, run)
