"""The workload contract: given hyperparameters, a device and a reporter, train and return metrics.

A built-in workload is a module ``gpupack/job/workloads/<name>.py`` exposing ``WORKLOAD``, an instance of
:class:`Workload`. It never knows how it was packed. Its hyperparameters are a dataclass (``Params``): the schema that
the sweep's grid and fixed values are validated against before anything runs.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Mapping, Sequence, TypedDict, cast

from gpupack.errors import ConfigError, nearest

if TYPE_CHECKING:  # a user's program imports this module: nothing more at run time
    from typing_extensions import TypeVar

    from gpupack.core.placement import Spread
    from gpupack.core.store.curves import CurveSpec, PrunedAt
else:  # typing's TypeVar takes a default from Python 3.13 only; at run time the default changes nothing
    from typing import TypeVar

# What gpupack/workload.py gives a user (tests/test_layers.py holds it to every public name here).
__all__ = ["P", "LoopSummary", "ReporterInfo", "PythonMain", "Reporter", "Range", "at_least", "positive", "Launch",
           "TrainingContext", "Workload", "require_positive", "params_from_mapping"]

# A workload's hyperparameters: its ``Params`` dataclass. One loaded by name holds a type known only at run time.
if TYPE_CHECKING:
    P = TypeVar("P", default=Any)
else:
    P = TypeVar("P")


class LoopSummary(TypedDict):
    """A training's loop as :meth:`Reporter.summary` sums it up: the ``throughput`` of its record."""

    loop_s: float | None
    steps: int
    samples: int
    samples_per_s: float | None
    warmup_excluded: bool
    curve: list[tuple[float, float]]


class ReporterInfo(TypedDict, total=False):
    """What a caller may hand a training through its reporter (tests: each step's loss appended to ``losses``)."""

    losses: list[float]


class PythonMain(TypedDict, total=False):
    """A Python program a fork server runs in a forked child: a ``script`` or a ``module``, and its ``argv``."""

    script: str
    module: str
    argv: list[str]


@dataclass
class Reporter:
    """A training's timings and throughput, for its record: the workload calls :meth:`loop_started` right before its
    first step, :meth:`step` after each and :meth:`loop_ended` after the last; steady throughput skips warm-up."""

    warmup_steps: int = 10
    # Throughput curve: one point per window at least this long; past curve_points points, neighbours merge and
    # the window doubles (a curve of bounded size).
    curve_window_s: float = 0.05
    curve_points: int = 512
    loop_start: float | None = None
    loop_end: float | None = None
    steps: int = 0
    samples: int = 0
    steady_start: float | None = None
    steady_samples: int = 0
    info: ReporterInfo = field(default_factory=lambda: ReporterInfo())
    # (seconds since the loop started, samples/s over the window that ended then)
    curve: list[tuple[float, float]] = field(default_factory=list)
    _window_start: float = 0.0
    _window_samples: int = 0

    def loop_started(self) -> None:
        self.loop_start = self._window_start = time.time()

    def step(self, samples: int) -> None:
        now = time.time()
        self.steps += 1
        self.samples += samples
        if self.steps == self.warmup_steps:
            self.steady_start = now
        elif self.steps > self.warmup_steps:
            self.steady_samples += samples
        self._window_samples += samples
        if self.loop_start is not None and now - self._window_start >= self.curve_window_s:
            rate = self._window_samples / (now - self._window_start)
            self.curve.append((round(now - self.loop_start, 3), round(rate, 1)))
            self._window_start, self._window_samples = now, 0
            if len(self.curve) >= self.curve_points:  # neighbours merge, the window doubles
                pairs = zip(self.curve[0::2], self.curve[1::2])
                self.curve = [(b[0], round((a[1] + b[1]) / 2, 1)) for a, b in pairs]
                self.curve_window_s *= 2

    def loop_ended(self) -> None:
        self.loop_end = time.time()
        elapsed = self.loop_end - self._window_start
        if self.loop_start is not None and self._window_samples and elapsed > 0:  # the last, partial window
            self.curve.append((round(self.loop_end - self.loop_start, 3), round(self._window_samples / elapsed, 1)))
            self._window_samples = 0

    def summary(self) -> LoopSummary:
        end = self.loop_end
        loop_s = (end - self.loop_start) if end is not None and self.loop_start is not None else None
        steady_s = (end - self.steady_start) if end is not None and self.steady_start is not None else None
        if steady_s and self.steady_samples:
            samples_per_s = self.steady_samples / steady_s
        elif loop_s and self.samples:  # too few steps to leave warm-up out: say so through the flag below
            samples_per_s = self.samples / loop_s
        else:  # no samples reported (a Hydra job, say): unknown, not 0
            samples_per_s = None
        return {
            "loop_s": loop_s,
            "steps": self.steps,
            "samples": self.samples,
            "samples_per_s": samples_per_s,
            "warmup_excluded": bool(steady_s and self.steady_samples),
            "curve": self.curve,
        }


@dataclass(frozen=True)
class Range:
    """A numeric hyperparameter's declared range (None: unbounded): ``Params.ranges`` maps field names to them."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def text(self) -> str:
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        return f"{'<' if self.high_open else '<='} {self.high:g}" if self.high is not None else "any number"

    def example(self, default: object) -> object:
        """A value inside, for a HINT: ``default`` where it is inside, else a bound (or next to an open one)."""
        if isinstance(default, (int, float)) and not isinstance(default, bool) and self.holds(default):
            return default
        for bound, step in ((self.low, 1), (self.high, -1)):
            if bound is not None:
                return bound if self.holds(bound) else bound + step
        return default


def at_least(low: float) -> Range:
    return Range(low=low)


def positive() -> Range:
    return Range(low=0, low_open=True)


@dataclass(frozen=True)
class Launch:
    """How process mode starts a training: argv (never a shell), extra environment, working directory (None: job's)."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    # A Python program a preloaded fork server can run in a forked child instead of argv; None: argv only.
    python_main: PythonMain | None = None


@dataclass
class TrainingContext:
    """What the packer gives a training: its device, its thread budget and its reporter; and, for one training
    spread over k devices (spread.devices), its :class:`gpupack.job.spread.Spread` (None: one device, not spread).

    A trial of a search (search=optuna) reports its curve with :meth:`report` and returns at once when it says so:

        if ctx.report(val_accuracy, epoch):
            return metrics  # pruned: the study was told so, the worker records it pruned
    """

    device: str
    threads: int
    reporter: Reporter
    spread: Spread | None = None
    # Where this training's stdout and stderr are kept; None where it shares its process with others.
    logs: tuple[str, str] | None = None
    # A search's trial: its curve's files and the metric its study ranks by (gpupack.core.store.curves).
    curve: CurveSpec | None = None
    pruned: PrunedAt | None = None  # set by report() when the pruner stopped it

    def report(self, value: float, step: int) -> bool:
        """The intermediate ``value`` at ``step`` (an epoch's validation metric), given to the study by this trial's
        lane; True: the search's pruner prunes this trial now: return at once. Outside a search: False."""
        if self.pruned is not None:
            return True
        if self.curve is None:
            return False
        from gpupack.core.store.curves import append_point, await_verdict  # a search's trial only

        append_point(Path(self.curve["points"]), int(step), float(value))
        verdict = await_verdict(Path(self.curve["verdict"]), int(step))
        if verdict is not None and verdict["pruned"] is not None:
            self.pruned = verdict["pruned"]
        return self.pruned is not None

    def ranks_by(self, metric: str) -> bool:
        """This is a search's trial ranked by ``metric``: a curve of it is worth reporting."""
        return self.curve is not None and self.curve["metric"] == metric


class Workload(ABC, Generic[P]):
    """One kind of training that gpupack can pack.

    ``params`` below is this workload's own ``Params`` instance (a dict for the ``command`` workload), of the type
    ``P`` it declares (``class MyWorkload(Workload[MyParams])``); the hooks that see a training's plain values (fork,
    cost, launch) take them as a mapping."""

    name: ClassVar[str]
    framework: ClassVar[str]  # "torch" or "tensorflow": packing modes check they can host it
    Params: ClassVar[type]  # a dataclass of hyperparameters with defaults
    seed_key: ClassVar[str] = "seed"
    # The boolean hyperparameter that makes a training run only its input pipeline (None: none), and the
    # hyperparameters the pipeline depends on.
    loader_param: ClassVar[str | None] = None
    loader_keys: ClassVar[tuple[str, ...]] = ()
    knob_keys: ClassVar[tuple[str, ...]] = ()  # throughput knobs a sweep may vary, shown apart by collect
    min_gpu_memory_mb: ClassVar[int] = 256  # MB one training needs: a smaller TF logical split is refused
    # Process mode may fork its trainings from one preloaded server: true only when importing it, its framework
    # and its data starts no thread and touches no device (not TensorFlow).
    forkable: ClassVar[bool] = False
    fresh_reason: ClassVar[str] = "its framework starts threads at import"  # why, where it is not forkable
    fusable: ClassVar[bool] = False  # N trainings can train as one batched model (fuse_key, train_fused)
    # Spread strategies (gpupack/job/spread/) this workload can train under: its train() calls ctx.spread when set.
    spreads: ClassVar[tuple[str, ...]] = ()
    # The numeric metrics its trainings may report (what collect.metric may name); None: not known before they run.
    reported_metrics: ClassVar[tuple[str, ...] | None] = None
    # Its program prints its curve, read from its output (search.intermediate); False: TrainingContext.report.
    curve_in_output: ClassVar[bool] = False

    def check(self, params: P) -> None:
        """Static checks run before submission (data present, a known model). Raise ConfigError. Run once per
        distinct reading of the grid: it must depend only on the hyperparameters it reads from ``params``."""

    def check_ranges(self, params: P | Mapping[str, object]) -> None:
        """Each hyperparameter ``params`` gives that ``Params`` declares a :class:`Range` for within it, else a
        ConfigError with a value inside as the hint. Run before :meth:`check` on sweep.fixed and each grid value."""
        ranges: Mapping[str, Range] = getattr(self.Params, "ranges", {})
        for name, declared in ranges.items():
            value = params.get(name) if isinstance(params, Mapping) else getattr(params, name, None)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not declared.holds(value):
                raise ConfigError(name, value, f"{self.name}'s {name} must be {declared.text()}",
                                  f"{name}={declared.example(self.defaults().get(name))}")

    def check_spread(self, params: P, strategy: str, devices: int) -> None:
        """Before anything runs, for a training spread over ``devices`` devices by ``strategy``: refuse (ConfigError)
        hyperparameters that cannot spread that way, e.g. a global batch that does not split over the devices."""

    def fork_refusal(self, params: Mapping[str, object]) -> str | None:
        """Why this training may not be forked from a preloaded server, or None when it may."""
        return None if self.forkable else self.fresh_reason

    def failure_hint(self, params: Mapping[str, object], error: str) -> str | None:
        """A HINT to add to a failed training's error (its stderr's tail), or None."""
        return None

    def device_note(self, params: Mapping[str, object], has_gpu: bool | None) -> str | None:
        """What this training will do otherwise than asked on a partition with (or without) a GPU, said once before
        anything runs (e.g. amp ignored on a CPU), or None."""
        return None

    def cost(self, params: Mapping[str, object]) -> float | None:
        """A training's relative length (any unit), or None where unknown: a stream claims the longest first."""
        return None

    def filler_seed(self, fixed: Mapping[str, object]) -> str | None:
        """The hyperparameter a copy of a grid point changes to be another training (its seed), or None where no
        seed reaches the training: the copy then repeats the point unchanged."""
        return self.seed_key

    def preload(self, params: Sequence[P]) -> None:
        """In the fork server, once, before any training is forked: import and read what the trainings (``params``) all
        will, so each starts with it in memory. Never touch a device: no CUDA context may exist before a fork."""

    def fuse_key(self, params: P) -> tuple[object, ...]:
        """With ``fusable``: the hyperparameters that fix the model's and the batches' shapes; trainings with equal
        keys train as one group. Raise ConfigError for a setting that cannot be fused (checked before submission)."""
        raise NotImplementedError(f"{self.name} says fusable but defines no fuse_key")

    def train_fused(self, params: Sequence[P],
                    ctxs: Sequence[TrainingContext]) -> Sequence[Mapping[str, object] | BaseException]:
        """With ``fusable``: train the group at once; each training's metrics, or the exception that stopped it."""
        raise NotImplementedError(f"{self.name} says fusable but defines no train_fused")

    # ---- hyperparameters: typed by the Params dataclass (a workload with open hyperparameters overrides these) ----

    def defaults(self) -> dict[str, object]:
        """Every hyperparameter's default."""
        return {f.name: getattr(self.Params(), f.name) for f in dataclasses.fields(self.Params)}

    def typed(self, key: str, value: object, where: str) -> object:
        """``value`` converted to the type Params declares for ``key``; ``where`` names the config key in errors."""
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        fields = {f.name for f in dataclasses.fields(self.Params)}
        if key not in fields:
            raise ConfigError(f"{where}.{key}", value, f"{self.name} has no hyperparameter {key!r}",
                              nearest(key, fields))
        try:
            node = OmegaConf.merge(OmegaConf.structured(self.Params), {key: value})
        except OmegaConfBaseException as err:
            raise ConfigError(f"{where}.{key}", value, str(err).splitlines()[0],
                              f"give {key} a value of the type {self.name} declares") from None
        typed = cast(dict[str, object], OmegaConf.to_container(node))[key]  # a structured config: a dict
        return self._finite(key, typed, where)

    def _finite(self, key: str, value: object, where: str) -> object:
        """``value``, unless it is a float that is no number (nan) or no finite one (inf): refused as a bad value."""
        if isinstance(value, float) and not math.isfinite(value):
            default = self.defaults().get(key)
            example = f"[{default}]" if where == "sweep.grid" else default  # an axis is a list
            raise ConfigError(f"{where}.{key}", value, "is not a finite number",
                              f"give {key} a number" + (f", e.g. {where}.{key}={example}"
                                                        if isinstance(default, (int, float)) else ""))
        return value

    def typed_values(self, key: str, values: Sequence[object], where: str) -> list[object]:
        """:meth:`typed` for every value of one grid axis in one OmegaConf merge, refusing in :meth:`typed`'s words."""
        from typing import List, get_type_hints

        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        hint = get_type_hints(self.Params).get(key) if dataclasses.is_dataclass(self.Params) else None
        if hint is None:  # not a declared field, or open hyperparameters (typed() overridden): one at a time
            return [self.typed(key, value, where) for value in values]
        axis = dataclasses.make_dataclass("Axis", [("values", List[hint])])  # type: ignore[valid-type]
        try:
            node = OmegaConf.merge(OmegaConf.structured(axis), {"values": list(values)})
        except OmegaConfBaseException:
            return [self.typed(key, value, where) for value in values]  # raises for the first bad value
        typed = cast(dict[str, list[object]], OmegaConf.to_container(node))["values"]
        return [self._finite(key, value, where) for value in typed]

    def params(self, values: Mapping[str, object]) -> P:
        """What train() and check() get: the Params dataclass built from plain values."""
        return cast(P, self.Params(**dict(values)))

    # ---- process mode: how a training starts as its own program, and what it reported ----

    def launch(self, params: Mapping[str, object], spec_path: str, result_path: str) -> Launch:
        """By default gpupack's worker: a fresh interpreter that imports this workload and trains once."""
        return Launch([sys.executable, "-m", "gpupack.job.runtime.worker", spec_path])

    def result(self, params: Mapping[str, object], raw: Mapping[str, object] | None, spawned_at: float,
               ended_at: float, stdout: Path | None = None) -> Mapping[str, object] | None:
        """The training's result from what its program wrote at ``result_path`` (None: nothing) after it exited 0,
        and its ``stdout`` log. The worker writes the full result itself."""
        return raw

    @abstractmethod
    def train(self, params: P, ctx: TrainingContext) -> Mapping[str, object]:
        """Train once; return final metrics (e.g. train_loss, val_accuracy) and a ``data`` description."""


def require_positive(params: object, *keys: str) -> None:
    """A workload's check() helper: each named hyperparameter must be > 0."""
    for key in keys:
        value = getattr(params, key)
        if not value > 0:
            raise ConfigError(key, value, "must be > 0", f"set {key} to a positive number")


def params_from_mapping(workload: Workload[P], values: Mapping[str, object]) -> P:
    """Build what the workload's train() takes from plain values (a training's hyperparameters)."""
    return workload.params(values)
