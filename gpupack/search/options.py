"""``search.*`` (conf/search/optuna.yaml, schema :class:`OptunaSearchConfig`), checked before anything runs; what a
run keeps of it is an :class:`OptunaSearch`, the head of its study."""
from __future__ import annotations

import difflib
import inspect
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Dict, Literal, Mapping, Optional, Union, cast

from gpupack.errors import ConfigError, nearest
from gpupack.search.space import Choice, Dimension, parse_space

if TYPE_CHECKING:
    from optuna.pruners import BasePruner
    from optuna.samplers import BaseSampler

Kwarg = Union[int, float, str, bool]
NO_PRUNER = "none"
# a trial number's share of its sampler's seed: seed * SEED_STRIDE + number never repeats for numbers below it
SEED_STRIDE = 1_000_003


@dataclass
class OptunaSearchConfig:
    """search=optuna's keys, typed by Hydra."""

    sampler: str = "TPESampler"  # an Optuna sampler by its class name in optuna.samplers
    sampler_kwargs: Dict[str, Kwarg] = field(default_factory=dict)  # its keyword arguments (seed is search.seed's)
    seed: int = 0  # each trial's sampler is seeded by (seed, trial number): no two lanes share a suggestion
    # hyperparameter → its range in Hydra's grammar: interval(a,b), int(interval(a,b)), tag(log, interval(a,b)),
    # choice(a,b,c), range(a,b[,step]); merged over sweep.fixed
    space: Dict[str, str] = field(default_factory=dict)
    n_trials: int = 32  # finished trials (completed or pruned) the search runs to; this many failed end it too
    device_hours: Optional[float] = None  # the trials' device-hours in all (null: no cap); running ones finish
    pruner: str = "MedianPruner"  # an Optuna pruner by its class name in optuna.pruners (or none)
    pruner_kwargs: Dict[str, Kwarg] = field(default_factory=dict)  # its keyword arguments
    metric: Optional[str] = None  # a trial's value (null: collect.metric, else val_accuracy), towards collect.goal
    # a command workload's intermediate values: a regular expression over its stdout, one group holding the number
    intermediate: Optional[str] = None


@dataclass(frozen=True)
class OptunaSearch:
    """A checked search: what the study's journal keeps at its head and every lane reads."""

    space: Mapping[str, Dimension]
    metric: str
    direction: Literal["maximize", "minimize"]
    n_trials: int
    sampler: str = "TPESampler"
    sampler_kwargs: Mapping[str, Kwarg] = field(default_factory=dict)
    seed: int = 0
    pruner: str = "MedianPruner"
    pruner_kwargs: Mapping[str, Kwarg] = field(default_factory=dict)
    device_hours: float | None = None
    intermediate: str | None = None

    def headline(self) -> str:
        """The search in a few words, for the plan's first line. Pure."""
        budget = f"{self.n_trials} trial(s)" + (f" or {self.device_hours:g} device-hours" if self.device_hours else "")
        pruner = "no pruner" if self.pruner == "none" else self.pruner
        return f"a search of {budget} ({self.sampler}, {pruner}; {self.metric}, {self.direction})"

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        data["space"] = {name: asdict(dim) for name, dim in self.space.items()}
        return data

    @staticmethod
    def from_json(data: Mapping[str, object]) -> OptunaSearch:
        space = cast(dict[str, dict[str, object]], data["space"])  # written by to_json
        dims = {str(k): Dimension(**{**v, "choices": tuple(cast(list[Choice], v.get("choices", ())))})  # type: ignore[arg-type]
                for k, v in space.items()}
        fields = {k: v for k, v in data.items() if k != "space"}
        return OptunaSearch(space=dims, **fields)  # type: ignore[arg-type]

    def make_sampler(self, number: int) -> BaseSampler:
        """Trial ``number``'s sampler, seeded by (seed, number) where it takes a seed."""
        import optuna

        cls = getattr(optuna.samplers, self.sampler)
        seeded = "seed" in inspect.signature(cls).parameters
        kwargs = {**self.sampler_kwargs, **({"seed": self.seed * SEED_STRIDE + number} if seeded else {})}
        sampler: BaseSampler = cls(**kwargs)
        return sampler

    def make_pruner(self) -> BasePruner:
        import optuna

        name, kwargs = ("NopPruner", {}) if self.pruner == NO_PRUNER else (self.pruner, self.pruner_kwargs)
        pruner: BasePruner = getattr(optuna.pruners, name)(**kwargs)
        return pruner


def _check_class(key: str, name: str, module: str, base: str, kwargs: Mapping[str, Kwarg], extra: tuple[str, ...] = (),
                 ) -> None:
    """``name`` a public ``base`` class of ``module`` taking ``kwargs`` (else a ConfigError with a did-you-mean)."""
    import optuna.pruners
    import optuna.samplers

    mod = optuna.samplers if module == "optuna.samplers" else optuna.pruners
    root = getattr(mod, base)
    known = sorted(n for n, c in vars(mod).items()
                   if inspect.isclass(c) and issubclass(c, root) and c is not root and not n.startswith("_"))
    if name not in known and name not in extra:
        raise ConfigError(key, name, f"{module} has no such class", f"{key}={_fix(name, [*known, *extra])}")
    if name in extra:
        return
    params = inspect.signature(getattr(mod, name)).parameters
    for arg in kwargs:
        if arg not in params:
            raise ConfigError(f"{key}_kwargs.{arg}", kwargs[arg], f"{name} takes no argument {arg!r}",
                              nearest(arg, [p for p in params if p not in ("self", "seed")]))


def _fix(name: str, known: list[str]) -> str:
    """The known name closest to ``name`` (a HINT's value), else the first."""
    return next(iter(difflib.get_close_matches(name, known, n=1, cutoff=0.4)), known[0])


def read_search(section: Mapping[str, object], metric: str | None, goal: str | None,
                reported: tuple[str, ...] | None, workload: str = "", curve_in_output: bool = True) -> OptunaSearch:
    """search.* checked (ConfigError on the first bad key), with the run's metric and goal (collect.*).
    ``reported``: the workload's metrics where it declares them; ``curve_in_output``: whether the workload (named
    ``workload``) prints its curve, for search.intermediate to read."""
    cfg = OptunaSearchConfig(**{k: v for k, v in section.items()})  # type: ignore[arg-type]
    require_optuna()
    space = parse_space(cfg.space)
    if cfg.n_trials < 1:
        raise ConfigError("search.n_trials", cfg.n_trials, "a search runs at least one trial", "search.n_trials=32")
    if cfg.device_hours is not None and cfg.device_hours <= 0:
        raise ConfigError("search.device_hours", cfg.device_hours, "must be > 0 or null", "search.device_hours=1.0")
    if cfg.seed < 0:
        raise ConfigError("search.seed", cfg.seed, "must be >= 0", "search.seed=0")
    _check_class("search.sampler", cfg.sampler, "optuna.samplers", "BaseSampler", cfg.sampler_kwargs)
    _check_class("search.pruner", cfg.pruner, "optuna.pruners", "BasePruner", cfg.pruner_kwargs, extra=(NO_PRUNER,))
    if cfg.intermediate is not None:
        if not curve_in_output:  # first: no pattern would do, so a fix of the pattern would be no fix
            raise ConfigError("search.intermediate", cfg.intermediate, f"{workload} reports its intermediate values "
                              "itself: only a command workload's output is read for them",
                              "search.intermediate=null (leave it unset)")
        _check_pattern(cfg.intermediate)
    chosen = cfg.metric or metric or "val_accuracy"
    if reported is not None and chosen not in reported:
        raise ConfigError("search.metric", chosen, f"the workload reports no such metric ({', '.join(reported)})",
                          f"search.metric={_fix(chosen, list(reported))}")
    directions: dict[str, Literal["maximize", "minimize"]] = {"max": "maximize", "min": "minimize"}
    direction = directions.get(goal or ("max" if chosen == "val_accuracy" else ""))
    if direction is None:
        raise ConfigError("collect.goal", goal, f"a search must know which way {chosen} is better",
                          "collect.goal=min (or max)")
    search = OptunaSearch(space=space, metric=chosen, direction=direction, n_trials=cfg.n_trials,
                          sampler=cfg.sampler, sampler_kwargs=dict(cfg.sampler_kwargs), seed=cfg.seed,
                          pruner=cfg.pruner, pruner_kwargs=dict(cfg.pruner_kwargs), device_hours=cfg.device_hours,
                          intermediate=cfg.intermediate)
    _check_built(search)
    return search


def require_optuna() -> None:
    """Optuna importable here, or one line saying how to install it (gpupack's ``search`` extra)."""
    try:
        import optuna  # noqa: F401
    except ImportError as err:
        raise ConfigError("search", "optuna", f"Optuna cannot be imported here ({err})",
                          "pip install 'gpupack[search]' (or 'optuna>=4.0,<6') in this environment, or leave search= "
                          "out to run the grid") from None


def _check_built(search: OptunaSearch) -> None:
    """The sampler and pruner built once here, so a value Optuna refuses is said before anything runs."""
    for key, kwargs, build in (("search.sampler_kwargs", search.sampler_kwargs, lambda: search.make_sampler(0)),
                               ("search.pruner_kwargs", search.pruner_kwargs, lambda: _first_prune(search))):
        try:
            build()
        except (ValueError, TypeError, ArithmeticError) as err:
            raise ConfigError(key, dict(kwargs), f"Optuna refuses them ({err.__class__.__name__}: {err})",
                              f"{key}={{}} (Optuna's defaults)") from None


def _first_prune(search: OptunaSearch) -> None:
    """The pruner built and asked on a throwaway study (one trial finished over 3 steps, a second at its first): some
    values fail only at its first decision past a finished trial (HyperbandPruner(min_resource=0))."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # its "A new study created" line is no refusal's
    study = optuna.create_study(direction=search.direction, pruner=search.make_pruner(),
                                sampler=optuna.samplers.RandomSampler(seed=0))
    first = study.ask()
    for step in (1, 2, 3):
        first.report(0.5, step)
    study.tell(first, 0.5)
    second = study.ask()
    second.report(0.4, 1)
    second.should_prune()


def _check_pattern(pattern: str) -> None:
    try:
        groups = re.compile(pattern).groups
    except re.error as err:
        raise ConfigError("search.intermediate", pattern, f"is not a regular expression ({err})",
                          "search.intermediate='loss: ([0-9.]+)'") from None
    if groups != 1:
        raise ConfigError("search.intermediate", pattern, f"has {groups} groups, not one holding the number",
                          "search.intermediate='loss: ([0-9.]+)'")
