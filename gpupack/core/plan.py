"""Plan a sweep: grid → trainings → packs. Pure: no I/O, no clock, tested with tables.

A *training* is one set of hyperparameters for one workload; its id is a hash of both, so the same
training has the same id in every run and every pack. A *pack* is N trainings that share one device in
one job; its id says where (partition), how (mode), how many (N) and which one (index).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import re
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Collection, Hashable, Iterable, Mapping, Sequence, TypedDict, cast

from gpupack.errors import ConfigError

if TYPE_CHECKING:  # typing's own from Python 3.11
    from typing_extensions import NotRequired

PLAN_SCHEMA = 1
ORDERS = ("interleaved", "by_factor")  # packing.order
# A field's old name → its name now, wherever an earlier gpupack wrote it: plan.json, a pickled pack, the records
RENAMED = {"probe": "loader_alone"}
ORDER_GIVEN = "as given"  # a plan whose order is the user's (a Hydra multirun's jobs), or one written before orders
# Only strings that start like a Hydra sweep function are expanded; any other string is a literal value.
_SWEEP_FUNCTION = re.compile(r"^\s*(range|choice|interval|glob|shuffle|sort)\s*\(")


class TrainingJson(TypedDict):
    """A training as plan.json holds it (:meth:`Plan.to_json`)."""
    training_id: str
    workload: str
    params: Mapping[str, object]
    grid_index: int
    reseed: int
    repeat: int
    label: NotRequired[str]  # only where one is set


class PackFields(TypedDict):
    """A pack as plan.json holds it but its trainings: the optional fields only where set."""
    pack_id: str
    partition: str
    mode: str
    factor: int
    index: int
    loader_alone: NotRequired[bool]
    devices: NotRequired[int]
    spread: NotRequired[str]
    stream: NotRequired[str]
    round: NotRequired[int]
    reference_of: NotRequired[str]
    threads: NotRequired[int]


class PackJson(PackFields):
    trainings: Sequence[TrainingJson]


class PlanJson(TypedDict):
    """plan.json (:meth:`Plan.to_json`); ``notes``, ``order`` and ``phase`` may be missing from an older plan."""
    schema: int
    sweep: str
    workload: str
    grid_size: int
    packs: Sequence[PackJson]
    notes: NotRequired[Sequence[str]]
    order: NotRequired[str]
    phase: NotRequired[str]


@dataclass(frozen=True)
class Training:
    training_id: str
    workload: str
    params: Mapping[str, object]
    grid_index: int  # which grid point this training comes from
    reseed: int = 0  # 0 for the grid point itself; k > 0 for the k-th copy with a new seed
    repeat: int = 0  # k > 0: the k-th copy of a grid point whose program takes no seed (run again unchanged)
    label: str | None = None  # how records and tables name the workload (default: its module); e.g. hydra:my_app

    @property
    def workload_label(self) -> str:
        return self.label or self.workload


@dataclass(frozen=True)
class Pack:
    pack_id: str
    partition: str
    mode: str
    factor: int
    index: int
    trainings: tuple[Training, ...]
    loader_alone: bool = False  # the data loader alone (no model): measured at N=1, kept out of the packing table
    # One training spread over k devices by the strategy module ``spread`` (gpupack/job/spread/); ``mode`` is then
    # the strategy's label (ddp-gloo, mirrored).
    devices: int = 1
    spread: str | None = None
    # A streaming lane (packing.stream): one of K jobs that drain the queue named here (gpupack.core.store.claims);
    # ``trainings`` is the lane's share of the queue (where their records live), not what it runs.
    stream: str | None = None
    search: bool = False  # a search's lane: freed slots ask the study for a trial (gpupack.search.lane)
    # The round (block in time) the pack runs in (:func:`in_rounds`); None: the loader alone, a lane, a Hydra
    # multirun's packs, a plan written before rounds.
    round: int | None = None
    reference_of: str | None = None  # the pack this one repeats at the run's end (:func:`drift_check`)
    threads: int | None = None  # a second set-up of the reference N (:func:`setup_packs`): threads per training

    def __setstate__(self, state: dict[str, object]) -> None:
        """A pack pickled by an earlier gpupack (a job submitted before an upgrade): its fields under their names."""
        self.__dict__.update({RENAMED.get(k, k): v for k, v in state.items()})


@dataclass(frozen=True)
class Plan:
    sweep: str
    workload: str
    grid_size: int
    packs: tuple[Pack, ...]  # in the order they run
    notes: tuple[str, ...] = field(default=())
    order: str = ORDER_GIVEN  # how that order was made, e.g. "interleaved (seed 0)"
    phase: str | None = None  # packing.factors=auto: "probe" (finding the best N) or "run" (the grid at it)

    @property
    def n_trainings(self) -> int:
        return sum(len(p.trainings) for p in self.packs)

    def lanes(self, stream: str) -> list[Pack]:
        """The lanes that drain queue ``stream``, in lane order."""
        return sorted((p for p in self.packs if p.stream == stream), key=lambda p: p.index)

    def queue(self, stream: str) -> list[tuple[Pack, Training]]:
        """Queue ``stream``'s trainings in claim order, each with the lane whose folder holds its records."""
        lanes = self.lanes(stream)
        dealt = [(i, lane.index, lane, t) for lane in lanes for i, t in enumerate(lane.trainings)]
        return [(lane, t) for _, _, lane, t in sorted(dealt, key=lambda item: item[:2])]

    def pack(self, pack_id: str) -> Pack:
        for p in self.packs:
            if p.pack_id == pack_id:
                return p
        raise KeyError(pack_id)

    def to_json(self) -> PlanJson:
        # a field left None is not written (so plans written before it still resume), nor a pack's devices unspread
        data = {"schema": PLAN_SCHEMA, **asdict(self, dict_factory=lambda kv: {k: v for k, v in kv if v is not None})}
        for pack in data["packs"]:
            if "spread" not in pack:
                del pack["devices"]
        return cast(PlanJson, data)  # asdict's fields, those left None removed

    @staticmethod
    def from_json(data: Mapping[str, object]) -> "Plan":
        plan = cast(PlanJson, data)  # plan.json as read back (a wrong field fails in Pack/Training below)
        packs = tuple(Pack(**cast(PackFields, {RENAMED.get(k, k): v for k, v in p.items() if k != "trainings"}),
                           trainings=tuple(Training(**t) for t in p["trainings"])) for p in plan["packs"])
        return Plan(sweep=plan["sweep"], workload=plan["workload"], grid_size=plan["grid_size"],
                    packs=packs, notes=tuple(plan.get("notes", ())), order=plan.get("order", ORDER_GIVEN),
                    phase=plan.get("phase"))

    def same_sweep(self, other: "Plan") -> bool:
        """The same packs of the same trainings, whatever their order or rounds (an older plan still resumes). Notes
        and grid size are not compared: a search's study refuses a changed search itself, and lets its budget grow."""
        def key(plan: Plan) -> object:
            written = plan.to_json()
            data: dict[str, object] = {k: v for k, v in written.items() if k not in ("order", "notes", "grid_size")}
            data["packs"] = sorted(({k: v for k, v in p.items() if k != "round"} for p in written["packs"]
                                    if "reference_of" not in p), key=lambda p: str(p["pack_id"]))
            return json.loads(json.dumps(data, default=str))  # as it reads back from disk
        return bool(key(self) == key(other))


def is_sweep_function(value: object) -> bool:
    """A Hydra sweep function's text (range(0,4), choice(a,b), ...): a grid axis whose values the plan expands."""
    return isinstance(value, str) and bool(_SWEEP_FUNCTION.match(value))


def grid_values(key: str, value: object) -> list[object]:
    """The values one grid key takes: a list as is, a Hydra sweep string expanded, a scalar alone."""
    if isinstance(value, (list, tuple)):
        values = list(value)
    elif is_sweep_function(value):
        from hydra.core.override_parser.overrides_parser import OverridesParser  # not on a job's start

        override = OverridesParser.create().parse_override(f"{key}={value}")
        values = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
    else:
        values = [value]
    if not values:
        raise ConfigError(f"sweep.grid.{key}", value, "gives no values",
                          f"list at least one value, e.g. sweep.grid.{key}=[...]")
    return values


def expand_grid(grid: Mapping[str, object]) -> list[dict[str, object]]:
    """All combinations of the grid's values, in the grid's key order (the first key varies slowest)."""
    keys = list(grid)
    value_lists = [grid_values(k, grid[k]) for k in keys]
    return [dict(zip(keys, combo)) for combo in itertools.product(*value_lists)]


def training_id(workload: str, params: Mapping[str, object]) -> str:
    canonical = json.dumps({"workload": workload, "params": params}, sort_keys=True, default=str)
    return f"{workload}-{hashlib.sha256(canonical.encode()).hexdigest()[:12]}"


def _reseeded(params: Mapping[str, object], seed_key: str, k: int) -> dict[str, object]:
    out = dict(params)
    seed = cast("int | str", out.get(seed_key, 0) or 0)  # a grid's seed: a number (or its text)
    out[seed_key] = int(seed) + 1000 * k
    return out


def trainings_for(workload: str, points: Sequence[Mapping[str, object]], fixed: Mapping[str, object],
                  count: int, seed_key: str | None = "seed") -> list[Training]:
    """``count`` trainings cycling over the points; one used again gets a new seed (+k*1000), or, seedless, repeats."""
    out: list[Training] = []
    seen: set[str] = set()
    for i in range(count):
        index, k = i % len(points), i // len(points)
        params = {**fixed, **points[index]}
        if seed_key is None:
            base = training_id(workload, params)
            out.append(Training(f"{base}-r{k}" if k else base, workload, params, grid_index=index, repeat=k))
            continue
        while True:  # a reseeded copy must not collide with another grid point's seed
            candidate = _reseeded(params, seed_key, k) if k else dict(params)
            tid = training_id(workload, candidate)
            if tid not in seen:
                break
            k += 1
        seen.add(tid)
        out.append(Training(tid, workload, candidate, grid_index=index, reseed=k))
    return out


def pack_id(partition: str, mode: str, factor: int, index: int) -> str:
    return f"{partition}-{mode}-n{factor:02d}-{index:03d}"


def again_packs(plan: Plan, rounds: Collection[int], partitions: Collection[str], k: int,
                seed_key: str | None) -> list[Pack]:
    """The packs of ``rounds`` on ``partitions`` measured again the ``k``-th time (``<pack>-again<k>``): their points on
    new seeds (k x 100,000 added), or, where no seed reaches a training, its repeat ``<training>-again<k>``. Pure."""
    return [replace(p, pack_id=f"{p.pack_id}-again{k}",
                    trainings=tuple(_again(t, seed_key, k) for t in p.trainings))
            for p in plan.packs
            if p.round in rounds and p.partition in partitions and p.reference_of is None and not p.loader_alone]


def _again(t: Training, seed_key: str | None, k: int) -> Training:
    if seed_key is None:  # a repeat of each training apart, as trainings_for names them (-r<k>) but never clashing
        return replace(t, training_id=f"{t.training_id}-again{k}", repeat=t.repeat + 100 * k)
    params = _reseeded(t.params, seed_key, 100 * k)
    return replace(t, training_id=training_id(t.workload, params), params=params, reseed=t.reseed + 100 * k)


def setup_packs(packs: Sequence[Pack], workload: str, points: Sequence[Mapping[str, object]],
                fixed: Mapping[str, object], factor: int, threads: int, seed_key: str | None) -> list[Pack]:
    """A second set-up of N=``factor``'s packs at ``threads`` per training, on new seeds of the same points. Pure."""
    out: list[Pack] = []
    for (partition, mode), mine in itertools.groupby(
            [p for p in packs if p.factor == factor and not p.loader_alone and p.spread is None and p.stream is None],
            key=lambda p: (p.partition, p.mode)):
        own = list(mine)
        count = sum(len(p.trainings) for p in own)
        used = {t.training_id for p in own for t in p.trainings}  # a fused mode's groups reseed on their own
        copies = iter([t for t in trainings_for(workload, points, fixed, count + count * len(points), seed_key)[count:]
                       if t.training_id not in used])
        for p in own:  # the same points as the reference's pack: its times are paired with like
            twins = tuple(next(t for t in copies if t.grid_index == o.grid_index) for o in p.trainings)
            out.append(replace(p, pack_id=f"{partition}-{mode}-n{factor:02d}-t{threads}-{p.index:03d}",
                               trainings=twins, threads=threads))
    return out


def refit_pack_id(parent: str, factor: int, first: int) -> str:
    """A pack that runs trainings of the skipped pack ``parent`` at N = ``factor`` from its ``first``-th one on."""
    return f"{parent}.n{factor:02d}-{first:03d}"


_REFIT_TAIL = re.compile(r"n\d{2,}-\d{3,}")


def refit_parent(pack_id: str) -> str | None:
    """The plan's pack whose trainings a refit pack runs (:func:`refit_pack_id`); None: a pack of the plan itself. A
    plan's pack id never holds '.' followed by its own tail (its N is '-nNN', after a '-'), whatever its partition."""
    head, dot, tail = pack_id.rpartition(".")
    return head if dot and _REFIT_TAIL.fullmatch(tail) else None


def refit_packs(pack: Pack, todo: Sequence[Training], n: int) -> list[Pack]:
    """The trainings ``todo`` of ``pack`` (skipped for memory) in packs of ``n``, in the pack's order; the last may
    hold fewer, and its N is what it holds, so its timing is never another N's. Pure.

    Each is named ``<pack_id>.nMM-FFF`` (:func:`refit_pack_id`) and is not in plan.json: a refit pack is known from
    its name alone (:func:`refit_parent`). Only the job that runs ``pack`` makes them, under the pack's lock; a
    resume that refits at another N, or from another training, makes other names, never writing over earlier ones."""
    position = {t.training_id: i for i, t in enumerate(pack.trainings)}
    ordered = sorted(todo, key=lambda t: position[t.training_id])
    chunks = [tuple(ordered[i:i + max(1, n)]) for i in range(0, len(ordered), max(1, n))]
    return [Pack(refit_pack_id(pack.pack_id, len(c), position[c[0].training_id]), pack.partition, pack.mode, len(c),
                 position[c[0].training_id], c, loader_alone=pack.loader_alone) for c in chunks]


def run_at_smaller_n(plan: Plan, pack: Pack) -> frozenset[str]:
    """The trainings of ``pack`` whose point the plan also runs at a smaller N (refitting them adds nothing). Pure."""
    below = {(t.workload, t.grid_index) for p in plan.packs
             if p.partition == pack.partition and p.mode == pack.mode and p.factor < pack.factor
             and p.spread is None and p.stream is None and not p.loader_alone for t in p.trainings}
    return frozenset(t.training_id for t in pack.trainings if (t.workload, t.grid_index) in below)


def stream_lanes(partition: str, mode: str, factor: int, trainings: Sequence[Training], jobs: int) -> list[Pack]:
    """K lanes (jobs) of N slots that drain ``trainings`` together: no more lanes than ceil(trainings / N), no more
    slots than trainings, each lane dealt every K-th training as its share (its records' home). Pure."""
    factor = max(1, min(factor, len(trainings)))  # a lane has no more slots than the queue has trainings
    k = max(1, min(jobs, math.ceil(len(trainings) / factor)))
    queue = f"{partition}-{mode}-n{factor:02d}-queue"  # what the group streams from (claims/<it>/)
    return [Pack(f"{partition}-{mode}-n{factor:02d}-s{j:03d}", partition, mode, factor, j, tuple(trainings[j::k]),
                 stream=queue) for j in range(k)]


def spread_packs(workload: str, points: Sequence[Mapping[str, object]], fixed: Mapping[str, object],
                 partitions: Iterable[str], layouts: Sequence[tuple[str, str]], devices: Sequence[int], repeats: int,
                 seed_key: str | None = "seed") -> list[Pack]:
    """One training per pack over k devices for each layout and k: the trainings N=1 packing runs, to compare."""
    trainings = trainings_for(workload, points, fixed, max(repeats, len(points)), seed_key)
    return [Pack(f"{partition}-{label}-k{k:02d}-{i:03d}", partition, label, 1, i, (t,), devices=k, spread=strategy)
            for partition in partitions for strategy, label in layouts for k in devices
            for i, t in enumerate(trainings)]


def make_plan(*, sweep: str, workload: str, grid: Mapping[str, object], fixed: Mapping[str, object],
              factors: Iterable[int], modes: Iterable[str], partitions: Iterable[str], repeats: int,
              seed_key: str | None = "seed", loader_alone: tuple[str, Sequence[str], str] | None = None,
              group_keys: Mapping[str, Callable[[Mapping[str, object]], Hashable]] | None = None,
              order: str = "interleaved", order_seed: int = 0, points: Sequence[Mapping[str, object]] | None = None,
              phase: str | None = None, spread_layouts: Sequence[tuple[str, str]] = (),
              spread_devices: Sequence[int] = (), spread_repeats: int | None = None,
              stream_jobs: int | None = None,
              cost: Callable[[Mapping[str, object]], float | None] | None = None,
              reference_threads: int | None = None) -> Plan:
    """Every grid point runs at least once per (partition, mode, N), in at least ``repeats`` full packs, in
    ``order`` (:func:`run_order`).

    ``loader_alone`` (loader param, loader keys, the mode it runs in): one N=1 pack of the data loader alone per
    partition and input-pipeline setting, run first. A mode in ``group_keys`` packs only trainings of equal key
    together (fused: same shapes). ``spread_layouts`` ((strategy, label)) × ``spread_devices`` (k): packs of one
    training spread over k devices (:func:`spread_packs`). ``reference_threads``: the smallest N is also measured at
    that many threads per training (:func:`setup_packs`), so the reference runs as it runs best.

    ``stream_jobs`` (K): each (partition, mode, N) runs the grid once as K streaming lanes (:func:`stream_lanes`)
    instead of whole packs (a production run: no filler, no repeats), longest first where ``cost``
    (:meth:`gpupack.core.workload.Workload.cost`) knows every training.
    """
    points = expand_grid(grid) if points is None else list(points)  # points: a part of the grid (what is left)
    if not points:
        raise ConfigError("sweep.grid", dict(grid), "the grid is empty", "give at least one value per key")
    packs: list[Pack] = []
    notes: list[str] = []
    if loader_alone:
        packs, notes = _loader_alone_packs(workload, points, fixed, partitions, loader_alone)
    if stream_jobs is not None:
        lanes, note = _stream_packs(workload, points, fixed, factors, partitions, modes, seed_key, stream_jobs, cost)
        packs, notes, factors = packs + lanes, notes + [note], ()  # nothing else is planned for them
    made, said = _packing_packs(workload, points, fixed, factors, partitions, modes, repeats, seed_key, group_keys)
    packs, notes = packs + made, notes + said
    if reference_threads is not None and factors:
        packs += setup_packs(packs, workload, points, fixed, min(factors), reference_threads, seed_key)
        notes.append(f"N={min(factors)}, the reference, is also measured at {reference_threads} thread(s) per training "
                     "in every round, beside the job's cores shared out: the faster set-up is the reference")
    if spread_layouts and spread_devices:
        packs += spread_packs(workload, points, fixed, partitions, spread_layouts, spread_devices,
                              spread_repeats or repeats, seed_key)
        notes.append(f"spread: one training over k={', '.join(map(str, spread_devices))} device(s) with "
                     f"{', '.join(label for _, label in spread_layouts)}, beside packing")
    alone: list[Pack] = [p for p in packs if p.loader_alone]
    lanes = [p for p in packs if p.stream]  # they run together, not in turn: no order to shuffle
    measured = run_order([p for p in packs if not p.loader_alone and not p.stream], order, order_seed)
    if order == "interleaved" and phase is None:  # an auto step is one round of a longer run: no check of its own
        measured += drift_check(measured)
    rounds = 1 + max((p.round for p in measured if p.round is not None), default=-1)
    return Plan(sweep=sweep, workload=workload, grid_size=len(points), packs=tuple(alone + lanes + measured),
                notes=tuple(notes), order=order_label(order, order_seed, rounds, reference_threads is not None),
                phase=phase)


def _loader_alone_packs(workload: str, points: Sequence[Mapping[str, object]], fixed: Mapping[str, object],
                        partitions: Iterable[str], loader_alone: tuple[str, Sequence[str], str],
                        ) -> tuple[list[Pack], list[str]]:
    """One N=1 loader-only pack per partition and input-pipeline setting, and the plan's note of them."""
    param, keys, solo = loader_alone
    seen: dict[tuple[str, ...], Training] = {}
    for index, point in enumerate(points):
        params = {**fixed, **point}
        key = tuple(json.dumps(params.get(k), default=str) for k in keys)
        if key not in seen:
            params[param] = True
            seen[key] = Training(training_id(workload, params), workload, params, grid_index=index)
    alone = list(seen.values())
    packs = [Pack(f"{partition}-loader-n01-{i:03d}", partition, solo, 1, i, (t,), loader_alone=True)
             for partition in partitions for i, t in enumerate(alone)]
    return packs, [f"the data loader alone: {len(alone)} loader-only training(s) per partition measure the input "
                   "pipeline's own samples/s"]


def _stream_packs(workload: str, points: Sequence[Mapping[str, object]], fixed: Mapping[str, object],
                  factors: Iterable[int], partitions: Iterable[str], modes: Iterable[str], seed_key: str | None,
                  stream_jobs: int, cost: Callable[[Mapping[str, object]], float | None] | None,
                  ) -> tuple[list[Pack], str]:
    """The grid once as ``stream_jobs`` lanes per (partition, mode, N), and the plan's note; longest first (stable)
    where ``cost`` knows every training, so short ones fill the slots at the stream's end (LPT)."""
    trainings = trainings_for(workload, points, fixed, len(points), seed_key)
    costs = [cost(t.params) for t in trainings] if cost is not None else []
    by_cost = bool(costs) and all(c is not None for c in costs)
    if by_cost:
        trainings = [t for _, t in sorted(zip(costs, trainings), key=lambda ct: -float(ct[0] or 0))]
    partitions, modes = list(partitions), list(modes)
    packs = [lane for factor, partition, mode in itertools.product(factors, partitions, modes)
             for lane in stream_lanes(partition, mode, factor, trainings, stream_jobs)]
    most = 1 + max(p.index for p in packs)
    return packs, (f"streaming: up to {most} job(s) of N slots per (partition, mode, N) drain the grid's "
                   f"{len(points)} training(s); a slot that frees takes the next unclaimed one"
                   + (", longest first (the workload's estimate)" if by_cost else ", in the grid's order"))


def _packing_packs(workload: str, points: Sequence[Mapping[str, object]], fixed: Mapping[str, object],
                   factors: Iterable[int], partitions: Iterable[str], modes: Iterable[str], repeats: int,
                   seed_key: str | None,
                   group_keys: Mapping[str, Callable[[Mapping[str, object]], Hashable]] | None,
                   ) -> tuple[list[Pack], list[str]]:
    """Whole packs of each N for each (partition, mode): the grid in at least ``repeats`` full packs, filled with points
    run again; a mode in ``group_keys`` packs one key together. With the plan's notes of both."""
    packs: list[Pack] = []
    notes: list[str] = []
    partitions, modes = list(partitions), list(modes)
    for factor in factors:
        n_packs = max(repeats, math.ceil(len(points) / factor))
        extra = n_packs * factor - len(points)
        if extra:
            how = (f"with new seeds ({seed_key})" if seed_key is not None else
                   "unchanged (labelled repeats: the program takes no seed, so a new one would not reach it)")
            notes.append(f"N={factor}: the grid has {len(points)} point(s); {extra} more training(s) repeat "
                         f"grid points {how} so that {n_packs} packs of {factor} are full")
        plain = grouped_chunks(workload, points, fixed, factor, repeats, seed_key, None)
        for partition, mode in itertools.product(partitions, modes):
            key = (group_keys or {}).get(mode)
            chunks = plain if key is None else grouped_chunks(workload, points, fixed, factor, repeats, seed_key, key)
            packs += [Pack(pack_id(partition, mode, factor, index), partition, mode, factor, index, chunk)
                      for index, chunk in enumerate(chunks)]
            if key is not None and partition == partitions[0]:
                n_groups = len({key({**fixed, **p}) for p in points})
                if n_groups > 1:
                    notes.append(f"{mode} N={factor}: the grid's {n_groups} shapes train in separate groups "
                                 f"({len(chunks)} packs; each pack holds one shape)")
    return packs, notes


def order_label(order: str, seed: int, rounds: int, setups: bool = False) -> str:
    """How plan.json and the dry run name the order (:func:`run_order`); ``setups``: the reference has two."""
    if order != "interleaved":
        return order
    rounds_said = (f": {rounds} rounds, each with at most one pack of every N"
                   + (" and set-up" if setups else "")) if rounds else ""
    return f"interleaved (seed {seed}){rounds_said}"


def run_order(packs: Sequence[Pack], order: str, seed: int = 0) -> list[Pack]:
    """The order packs run in: by_factor as planned, interleaved in rounds (:func:`in_rounds`)."""
    if order == "by_factor":
        return list(packs)
    if order != "interleaved":
        raise ConfigError("packing.order", order, "unknown pack order", f"use one of {', '.join(ORDERS)}")
    return in_rounds(packs, seed)


def in_rounds(packs: Sequence[Pack], seed: int = 0) -> list[Pack]:
    """``packs`` in R rounds, R the most packs of any (partition, mode, N, k) group, each tagged with its round and
    each round in a seeded random order (a randomized block design: drift cannot line up with N). A group's packs
    are evenly spaced and centred over the rounds (:func:`spaced_rounds`), never two in one round; the smallest N,
    having the most packs, is in every round: the reference each pack is compared with
    (:mod:`gpupack.results.analysis.choose`), on the same points where N divides the grid. Pure; seeded."""
    groups: dict[tuple[str, str, int, int, int | None], list[Pack]] = {}
    for p in packs:  # a set-up of the reference (its threads) is a group of its own: one pack of it a round
        groups.setdefault((p.partition, p.mode, p.factor, p.devices, p.threads), []).append(p)
    if not groups:
        return []
    # the rounds are the packing groups' (a spread layout may have more packs than N=1: it is not compared within
    # rounds, and would otherwise leave N=1 out of some)
    packing = [len(m) for m in groups.values() if m[0].spread is None]
    total = max(packing or [len(m) for m in groups.values()])
    rng = random.Random(seed)
    rounds: list[list[Pack]] = [[] for _ in range(total)]
    for members in groups.values():
        places = (spaced_rounds(len(members), total, rng) if len(members) <= total else
                  [k * total // len(members) for k in range(len(members))])  # several a round, in turn
        for r, p in zip(places, members):
            rounds[r].append(p)
    out: list[Pack] = []
    for r, members in enumerate(rounds):
        members.sort(key=lambda p: p.pack_id)  # the draw below decides the order, not how the groups were listed
        rng.shuffle(members)
        out += [replace(p, round=r) for p in members]
    return out


def spaced_rounds(n: int, total: int, rng: random.Random) -> list[int]:
    """The rounds of ``n`` packs among ``total`` >= n: the k-th nearest (k + 1/2) total / n - 1/2, centred on the middle
    (a half away from it, the middle one's by a draw); distinct, being total / n >= 1 apart. Pure."""
    centre = (total - 1) / 2
    out = []
    for k in range(n):
        place = (k + 0.5) * total / n - 0.5
        low = math.floor(place)
        if place - low != 0.5:
            out.append(round(place))
        elif place == centre:
            out.append(low + rng.randint(0, 1))
        else:
            out.append(low if place < centre else low + 1)
    return out


def drift_check(ordered: Sequence[Pack]) -> list[Pack]:
    """Each partition's first-round reference pack (smallest N, first mode) again at the end (``<pack>-end``), to tell
    drift; only where two rounds or more compare two N or more. Pure."""
    out: list[Pack] = []
    for partition in dict.fromkeys(p.partition for p in ordered):
        mine = [p for p in ordered if p.partition == partition and p.spread is None and p.round is not None
                and p.threads is None]
        if len({p.round for p in mine}) < 2 or len({(p.mode, p.factor) for p in mine}) < 2:
            continue  # one round, or one N: nothing is compared that a drift could bias
        mode = mine[0].mode
        smallest = min(p.factor for p in mine if p.mode == mode)
        first = min((p for p in mine if p.mode == mode and p.factor == smallest), key=lambda p: p.round or 0)
        out.append(replace(first, pack_id=f"{first.pack_id}-end", round=None, reference_of=first.pack_id))
    return out


def deal(packs: Sequence[Pack], lanes: int) -> list[list[Pack]]:
    """Packs dealt to ``lanes`` jobs (lane i: packs i, i + lanes, ...): interleaved N stays interleaved. Pure."""
    return [list(packs[i::lanes]) for i in range(lanes)]


def grouped_chunks(workload: str, points: Sequence[Mapping[str, object]], fixed: Mapping[str, object], factor: int,
                   repeats: int, seed_key: str | None,
                   key: Callable[[Mapping[str, object]], Hashable] | None) -> list[tuple[Training, ...]]:
    """Packs of ``factor`` trainings sharing ``key`` (None: all one group), each group in ``repeats`` packs or more."""
    groups: dict[Hashable, list[Mapping[str, object]]] = {}
    for p in points:
        groups.setdefault(None if key is None else key({**fixed, **p}), []).append(p)
    chunks: list[tuple[Training, ...]] = []
    for members in groups.values():
        n_packs = max(repeats, math.ceil(len(members) / factor))
        trainings = trainings_for(workload, members, fixed, n_packs * factor, seed_key)
        chunks += [tuple(trainings[i * factor:(i + 1) * factor]) for i in range(n_packs)]
    return chunks


def plan_in_order(*, sweep: str, workload: str, params: Sequence[Mapping[str, object]], factor: int, partition: str,
                  mode: str, label: str | None = None, names: Sequence[str] | None = None,
                  stream_jobs: int | None = None) -> Plan:
    """Trainings given one by one (a Hydra multirun's jobs), in order, in packs of ``factor``, none repeated; ``names``:
    each id's start (a job's number); ``stream_jobs`` (K): K lanes of ``factor`` slots drain them instead."""
    if factor < 1:
        raise ConfigError("pack", factor, "a pack holds at least one training", "use pack >= 1")
    trainings = [Training(training_id(names[i] if names else workload, p), workload, dict(p), grid_index=i,
                          label=label)
                 for i, p in enumerate(params)]
    if stream_jobs is not None:
        return Plan(sweep=sweep, workload=workload, grid_size=len(trainings),
                    packs=tuple(stream_lanes(partition, mode, factor, trainings, stream_jobs)))
    chunks = [tuple(trainings[i:i + factor]) for i in range(0, len(trainings), factor)]
    packs = tuple(Pack(pack_id(partition, mode, len(c), index), partition, mode, len(c), index, c)
                  for index, c in enumerate(chunks))
    return Plan(sweep=sweep, workload=workload, grid_size=len(trainings), packs=packs)
