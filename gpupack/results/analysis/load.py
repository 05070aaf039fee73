"""Loading: run directories → :class:`Records`, every record of the runs as flat frames. Each pack is read from its
columnar file where it is current (:mod:`gpupack.core.store.columnar`), else from its JSON records (the same rows);
earlier attempts from their JSON; then the run's plan, cleared OOMs and config. Reads only."""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Mapping, Sequence, TypedDict, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from omegaconf import DictConfig, OmegaConf

from gpupack.core.plan import refit_parent
from gpupack.core.stdout_metrics import metrics_from_text, stdout_patterns
from gpupack.core.store.columnar import STRING, ColumnarReader, pack_rows, read_records, split_rows
from gpupack.core.store.journal import PACK, TRAINING, folder_records, identity, kept_log
from gpupack.core.store.lane_columnar import (
    Entry,
    LaneColumns,
    Part,
    later_counts,
    once,
    read_lane_columnar,
    tail_entries,
)
from gpupack.core.store.rank_choice import RankChoice, read_rank
from gpupack.core.store.records import FINISHED, SKIPPED_MEMORY, read_json
from gpupack.core.store.rundir import ATTEMPTS, PACK_RECORD, PROBE, RunDir
from gpupack.results.analysis.frames import DETACHED, TRAINING_ID, RowsByPack, take_rows
from gpupack.search.study import Journal, read_journal


class ClearedOom(TypedDict):
    """An entry of RUN_DIR/cleared_oom.json: the OOM records it clears (None: any), and when."""

    partition: str | None
    mode: str | None
    factor: int | None
    cleared_at: float


class Cleared(ClearedOom):
    """An entry as read: the run directory whose records it clears."""

    run_dir: str


CLEARED_BY: tuple[Literal["partition", "mode", "factor"], ...] = ("partition", "mode", "factor")


@dataclass
class Records:
    """Every record read, flat: a row per training record (``attempt`` 0 the latest) and per pack record, nested
    fields lifted to columns; lists and dicts as Python values, but :data:`gpupack.results.analysis.frames.TEXT_COLUMNS`
    as their JSON text."""

    trainings: pd.DataFrame
    packs: pd.DataFrame
    warnings: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)  # planned packs with no pack record yet
    grid_sizes: dict[str, int] = field(default_factory=dict)  # trainings in each sweep's grid (a multirun's add up)
    rgu: dict[str, float] = field(default_factory=dict)  # the RGU table the first run was configured with
    cleared: list[Cleared] = field(default_factory=list)  # OOMs a user cleared, per run directory
    runs: list[str] = field(default_factory=list)  # the run directories read
    planned: int = 0  # packs in the runs' plans
    planned_ids: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # run → (pack or queue, training id)
    one_host: dict[str, bool] = field(default_factory=dict)  # run → its cluster.nodes_share_one_host
    # How to rank hyperparameters, as the first run that says so says it (its rank.json, else its config), and where
    rank: RankChoice = field(default_factory=RankChoice)
    rank_from: str = ""
    # The columns no table reads (frames.DETACHED), in Arrow, a row for each row of ``trainings`` as loaded
    detached: pa.Table = field(default_factory=lambda: pa.table({}))
    studies: dict[str, Journal] = field(default_factory=dict)  # run → its search's study (search=optuna)

    def with_detached(self, rows: pd.DataFrame, names: Sequence[str] = DETACHED) -> pd.DataFrame:
        """``rows`` (of :attr:`trainings`, its index kept) with the columns ``names`` it lacks, as text."""
        columns = self.detached_of(rows, names)
        return rows.assign(**{n: np.array(c.to_pylist(), dtype=object) for n, c in columns.items()}) if columns \
            else rows

    def detached_of(self, rows: pd.DataFrame, names: Sequence[str] = DETACHED) -> dict[str, pa.ChunkedArray]:
        """The columns ``names`` of :attr:`detached` that ``rows`` lacks, a value for each of its rows, in Arrow. Raises
        ValueError where ``rows`` is not a selection of :attr:`trainings` with its index kept (checked by id)."""
        missing = [n for n in names if n not in rows and n in self.detached.column_names]
        if not missing:
            return {}
        positions = rows.index.to_numpy(dtype=np.int64)
        try:
            columns = {n: take_rows(self.detached.column(n), positions) for n in (*missing, TRAINING_ID)}
        except (IndexError, pa.ArrowException) as err:
            raise ValueError(f"rows not of Records.trainings as loaded: {err}") from err
        ids = rows[TRAINING_ID].to_numpy(dtype=object) if TRAINING_ID in rows else None
        taken = columns.pop(TRAINING_ID)
        if ids is not None and len(ids) and not pc.all(pc.equal(taken, pa.array(ids, STRING))).as_py():
            raise ValueError("rows not of Records.trainings as loaded: their index is not each row's position there "
                             "(reset, or joined with another frame's); select rows with their index kept")
        return columns

    def plan_counts(self) -> "PlanCounts":
        """The trainings of the runs' plans against their current records (:func:`plan_counts`)."""
        if not self.planned_ids:  # no plan to count against (runs written without one)
            return PlanCounts()
        t = self.trainings
        # the columns it reads, before the attempt-0 rows are taken: a million rows of every column is a second
        used = [c for c in ("run_dir", "pack_id", "training_id", "status", "runs_in", "stream", "attempt") if c in t]
        return plan_counts(Records.latest_of(t[used]), self.planned_ids)

    def latest(self) -> pd.DataFrame:
        """Each training's latest record (earlier attempts, kept under attempts/, left out)."""
        return Records.latest_of(self.trainings)

    @staticmethod
    def latest_of(t: pd.DataFrame) -> pd.DataFrame:
        """The rows of ``t`` (training records) that are each training's latest: attempt 0."""
        return t[t["attempt"] == 0] if not t.empty and "attempt" in t else t


@dataclass(frozen=True)
class PlanCounts:
    """The trainings of a plan by their current record: completed, failed (any other end), skipped for memory (and
    run nowhere else), or none yet (``unrecorded``). A run is ``done`` only where every training has one."""

    planned: int = 0
    completed: int = 0
    failed: int = 0
    skipped: int = 0
    # every planned training is an auto probe's (a search after it plans none: its trials are counted apart)
    probe: bool = False

    @property
    def unrecorded(self) -> int:
        return self.planned - self.completed - self.failed - self.skipped

    @property
    def done(self) -> bool:
        return self.unrecorded == 0

    def line(self) -> str:
        said = (f"{self.planned - self.unrecorded} of {self.planned} trainings of the "
                f"{'probe' if self.probe else 'plan'} have a record: "
                f"{self.completed} completed, {self.failed} failed"
                + (f", {self.skipped} skipped for memory" if self.skipped else ""))
        return f"done: {said}" if self.done else \
            f"not done: {said}; {self.unrecorded} without one (running, or lost: re-run the same command)"


def plan_counts(latest: pd.DataFrame, planned_ids: Mapping[str, Sequence[tuple[str, str]]]) -> PlanCounts:
    """Count each run's planned trainings (``planned_ids``) by their current records (``latest``), at their place in
    the plan (:func:`_where`): completed where a row completed (a skipped training a refit pack ran has two), skipped
    where skipped for memory and run nowhere else (no ``runs_in``), failed where it has any other. Pure."""
    counts = Counter[str]()
    for run, planned in planned_ids.items():
        counts["planned"] += len(planned)
        if latest.empty or "training_id" not in latest:
            continue
        rows = latest[latest["run_dir"] == run]
        # each row's place in the plan, as an integer (a million rows: hashed once, then counted as numbers)
        at = pd.Index([f"{where}\0{tid}" for where, tid in planned]).get_indexer(
            _where(rows) + "\0" + rows["training_id"].astype(str))
        status = rows["status"].astype(str).to_numpy()
        skipped = status == SKIPPED_MEMORY
        waits = skipped & (rows["runs_in"].notna().to_numpy() if "runs_in" in rows else False)
        ours = at >= 0

        def marked(mask: np.ndarray) -> np.ndarray:  # the planned trainings that a row of ``mask`` records
            seen = np.zeros(len(planned), dtype=bool)
            seen[at[ours & mask]] = True
            return seen

        finished = np.isin(status, FINISHED)  # completed, or pruned by its search
        completed = marked(finished)
        failed = marked(~skipped & ~finished) & ~completed
        skipped_ids = marked(skipped & ~waits) & ~completed & ~failed
        counts.update(completed=int(completed.sum()), failed=int(failed.sum()), skipped=int(skipped_ids.sum()))
    planning = [run for run, planned in planned_ids.items() if planned]  # a search's run plans none
    probe = bool(planning) and all(Path(run).parent.name == PROBE for run in planning)
    return PlanCounts(counts["planned"], counts["completed"], counts["failed"], counts["skipped"], probe)


def _where(rows: pd.DataFrame) -> pd.Series:
    """The plan's place of each record: its streaming queue, else the pack it refits, else its pack."""
    packs = rows["pack_id"].astype(str)
    refits = packs.str.contains(".", regex=False)  # rare: only a refit pack's id holds a '.' after its N
    if refits.any():
        packs = packs.where(~refits, pd.Series([refit_parent(p) or p for p in packs[refits]],
                                               index=packs.index[refits.to_numpy()], dtype=object))
    if "stream" not in rows:
        return packs
    streams = rows["stream"]
    return streams.where(streams.notna(), packs).astype(str)


def _read_attempts(run: RunDir, pack_dirs: Sequence[str], trainings: RowsByPack, packs: RowsByPack,
                   warnings: list[str]) -> None:
    """Earlier attempts' records (packs/<id>/attempts/<k>/*.json, in path order), from their JSON: a resumed pack
    moves them there, and they still count (an OOM makes its N infeasible; a whole pack is still a timing)."""
    rows: dict[str, list[Mapping[str, object]]] = {"training": [], "pack": []}
    attempts: dict[str, list[int]] = {"training": [], "pack": []}
    for pack_dir in pack_dirs:
        try:  # one stat a pack without attempts
            with os.scandir(f"{pack_dir}/{ATTEMPTS}") as entries:
                numbers = sorted(e.name for e in entries if e.is_dir())
        except (FileNotFoundError, NotADirectoryError):
            continue
        for path in (p for number in numbers for p in sorted(Path(pack_dir, ATTEMPTS, number).glob("*.json"))):
            kind = "pack" if path.name == PACK_RECORD else "training"
            read = read_records([path], kind, warnings)
            rows[kind] += read
            attempts[kind] += [(int(path.parent.name) if path.parent.name.isdigit() else 0) or 1] * len(read)
    trainings.add(split_rows(rows["training"]), str(run.root), attempts["training"])
    packs.add(split_rows(rows["pack"]), str(run.root), attempts["pack"])


def read_cleared(run: RunDir) -> list[ClearedOom]:
    """The OOMs a user cleared (``gpupack clear-oom``): entries {partition, mode, factor, cleared_at}, None = any."""
    return list(read_json(run.cleared_oom).get("cleared", [])) if run.cleared_oom.exists() else []


def cleared_mask(rows: pd.DataFrame, cleared: Sequence[Cleared]) -> pd.Series:
    """True for each OOM record a user cleared: it matches an entry and ended before the entry was written."""
    out = pd.Series(False, index=rows.index)
    if not cleared or rows.empty:
        return out
    ended = pd.to_numeric(rows.get("ended_at"), errors="coerce").fillna(0)
    for entry in cleared:
        match = (rows["run_dir"] == entry["run_dir"]) & (ended <= float(entry["cleared_at"]))
        for key in CLEARED_BY:
            if entry.get(key) is not None:
                match &= rows[key] == entry[key]
        out |= match
    return out


def _read_run(run: RunDir, trainings: RowsByPack, packs: RowsByPack, warnings: list[str],
              reader: ColumnarReader | None) -> set[str]:
    """One run's training and pack rows, into ``trainings`` and ``packs``. Returns the packs with a pack record."""
    root = str(run.root)
    pack_dirs = run.pack_dirs()
    recorded = set()
    pack_records: list[Mapping[str, object]] = []
    for pack_dir in pack_dirs:
        read = reader.read(pack_dir) if reader is not None else None
        if read is not None:  # current: its pack.json is there
            rows, pack_record = read[0], [read[1]]
        else:
            training_rows, pack_record = pack_rows(Path(pack_dir), warnings)
            rows = split_rows(training_rows)
        if read is not None or os.path.exists(f"{pack_dir}/{PACK_RECORD}"):
            recorded.add(os.path.basename(pack_dir))
        trainings.add(rows, root, 0)
        pack_records += pack_record
    packs.add(split_rows(pack_records), root, 0)
    _read_attempts(run, pack_dirs, trainings, packs, warnings)
    return recorded | _read_folded(run, {os.path.basename(d) for d in pack_dirs}, trainings, packs, warnings,
                                   reader)


def _read_folded(run: RunDir, folders: set[str], trainings: RowsByPack, packs: RowsByPack, warnings: list[str],
                 reader: ColumnarReader | None) -> set[str]:
    """The records lanes folded into their journals: from a lane's columnar file where no other source holds records
    of the same pack, the rest weighed record by record (:func:`_weigh`). Returns the packs with a current record."""
    lanes = sorted(path.stem for path in run.lanes.glob("*.jsonl")) if run.lanes.is_dir() else []
    files: list[LaneColumns] = []
    weighed: list[Entry] = []  # journal lines no columnar file covers: parsed
    for lane in lanes:
        columns = read_lane_columnar(run, lane, reader) if reader is not None else None
        weighed += tail_entries(run, lane, columns.covers if columns else 0, warnings)
        if columns is not None:
            files.append(columns)
    held = _held_in_folders(run, folders)
    sources = Counter(home for f in files for home in f.homes)
    sources.update({e.home for e in weighed})  # the journals' lines past the files count as one source more
    apart = {home for home, n in sources.items() if n > 1} | folders  # a pack more than one source holds records of
    root, recorded = str(run.root), set()
    for f in files:
        mask = _weighed_apart(f.trainings, apart & f.homes, folders, held)
        weighed += f.trainings.entries(mask)
        rows = f.trainings.without(mask)
        if rows is not None:  # one lane's records of its packs alone: their attempts are what its journal held
            trainings.add(rows, root, f.trainings.column("later").to_numpy()[~mask])  # after them
        pack_mask = _weighed_apart(f.packs, apart, set(), set())
        weighed += f.packs.entries(pack_mask)
        pack_rows = f.packs.without(pack_mask)
        if pack_rows is not None:
            later = f.packs.column("later").to_numpy()[~pack_mask]
            packs.add(pack_rows, root, later)
            homes = np.asarray(f.packs.column("home").to_pylist(), dtype=object)[~pack_mask]
            recorded.update(homes[later == 0])
    return recorded | _weigh(run, weighed, folders, held, trainings, packs)


def _weighed_apart(part: Part, homes: set[str], folders: set[str], held: set[str]) -> np.ndarray:
    """The rows of a lane's file to weigh record by record: kept under a pack another source (or a folder) holds
    records of, run by a pack or lane whose folder exists (it may hold the same record), or of a training a folder
    holds (a later record of it)."""
    mask = np.zeros(part.rows.rows if part.rows is not None else 0, dtype=bool)
    if part.rows is None:
        return mask
    for name, values in (("home", homes), ("pack_id", folders), ("training_id", held)):
        if values:  # (mostly none: a finished run's lanes hold their packs alone, and no folder is left)
            column = part.column(name)
            found = pc.is_in(column, value_set=pa.array(sorted(values), column.type))
            mask |= found.fill_null(False).to_numpy(zero_copy_only=False)
    return mask


def _weigh(run: RunDir, entries: list[Entry], folders: set[str], held: set[str], trainings: RowsByPack,
           packs: RowsByPack) -> set[str]:
    """Folded records weighed one by one, in the order folded, each record once (one a folder still holds is the
    folder's), each latest current unless a folder holds a later one. Returns the packs with a current pack record."""
    if not entries:
        return set()
    entries = sorted(entries, key=lambda e: (e.folded_at, e.seq))
    folded = {str(e.row.get("pack_id")) for e in entries}
    seen = {identity(rec) for pack_id in folded & folders for rec in folder_records(run, pack_id)}
    entries = once(entries, seen)
    root = str(run.root)
    kept = [e for e in entries if e.kind == TRAINING]
    attempts = [later + (str(e.row.get("training_id")) in held) for e, later in zip(kept, later_counts(kept))]
    trainings.add(split_rows([e.row for e in kept]), root, attempts)
    pack_entries = [e for e in entries if e.kind == PACK]
    pack_attempts = [later + (e.home in folders) for e, later in zip(pack_entries, later_counts(pack_entries))]
    packs.add(split_rows([e.row for e in pack_entries]), root, pack_attempts)
    return {e.home for e, attempt in zip(pack_entries, pack_attempts) if attempt == 0}


def _held_in_folders(run: RunDir, folders: set[str]) -> set[str]:
    """The trainings a pack's folder holds a record of: later than any a journal holds of them."""
    held: set[str] = set()
    for pack_id in folders:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            held.update(name[:-5] for name in os.listdir(run.trainings(pack_id)) if name.endswith(".json"))
    return held


def _read_plan_and_config(run: RunDir, out: Records, recorded: set[str]) -> None:
    """The run's plan (``recorded``: packs with a record), cleared OOMs, study, ranking, config."""
    out.cleared += [{**entry, "run_dir": str(run.root)} for entry in read_cleared(run)]
    if run.plan.exists():
        plan = read_json(run.plan)
        sweep_key = str(run.sweep_root)
        out.grid_sizes[sweep_key] = out.grid_sizes.get(sweep_key, 0) + int(plan.get("grid_size", 0))
        out.planned += len(plan["packs"])
        # each training of each pack (a grid point at N=1 and N=4 is two), of each streaming queue once
        out.planned_ids[str(run.root)] = list(dict.fromkeys((str(p.get("stream") or p["pack_id"]),
                                                             str(t["training_id"]))
                                                            for p in plan["packs"] for t in p.get("trainings", [])))
        out.pending += [f"{run.root}:{p['pack_id']}" for p in plan["packs"] if p["pack_id"] not in recorded]
    if (study := read_journal(run.study)) is not None:
        out.studies[str(run.root)] = study
    kept = read_rank(run) if not out.rank.given() else None  # an earlier collect's flags win over the config
    if kept is not None and kept.given():
        out.rank, out.rank_from = kept, str(run.rank_choice)
    if run.config.exists():
        cfg = cast(DictConfig, OmegaConf.load(run.config))  # the run's config.yaml, as gpupack wrote it: a mapping
        rgu = cfg.get("rgu")
        if rgu is not None and "models" in rgu and not out.rgu:
            out.rgu = dict(rgu.models)
        out.one_host[str(run.root)] = bool((cfg.get("cluster") or {}).get("nodes_share_one_host", False))
        if not out.rank.given():
            configured = RankChoice.of(cfg.get("collect") or {})
            out.rank, out.rank_from = configured, str(run.config) if configured.given() else ""


def load_records(run_dirs: Sequence[Path], columnar: bool = True) -> Records:
    """Every record of the runs, as flat frames; ``columnar=False``: from the JSON records only."""
    out = Records(pd.DataFrame(), pd.DataFrame())
    trainings, packs = RowsByPack(), RowsByPack()
    reader = ColumnarReader() if columnar else None
    collecting = gc.isenabled()
    gc.disable()  # a million rows allocate millions of objects, none cyclic: the collector would scan them often
    try:
        for root in run_dirs:
            run = RunDir(Path(root))
            out.runs.append(str(run.root))
            recorded = _read_run(run, trainings, packs, out.warnings, reader)
            _read_plan_and_config(run, out, recorded)
        (out.trainings, out.detached), (out.packs, _) = trainings.frame(DETACHED), packs.frame()
        earlier_refits(out.trainings)
    finally:
        if collecting:
            gc.enable()
    return out


def earlier_refits(t: pd.DataFrame) -> None:
    """A training that refit packs of one skipped pack ran more than once (job.body.PackAttempt.run_refits) has one
    current record, its latest start; the others become earlier attempts (a lane's journal keeps each refit pack's
    latest, so they are told apart here). In place: only ``attempt`` changes."""
    if t.empty or "refit_of" not in t or "started_at" not in t:
        return
    refit = (t["refit_of"].notna() & (t["attempt"] == 0)).to_numpy()
    if refit.sum() < 2:
        return
    rows = t.loc[refit, ["run_dir", "refit_of", "training_id", "started_at"]].sort_values("started_at",
                                                                                            ascending=False)
    later = rows.groupby(["run_dir", "refit_of", "training_id"], sort=False).cumcount()  # 0: the latest
    again = later[later > 0]
    t.loc[again.index, "attempt"] = again.to_numpy()


def shared_host(records: Records) -> str | None:
    """The host every pack ran on where they shared its cores (several partitions on it, or a cluster whose nodes
    are one machine); None otherwise."""
    packs = records.packs
    if packs.empty or "host" not in packs:
        return None
    hosts = packs["host"].dropna().unique()
    if len(hosts) != 1:
        return None
    partitions = set(packs["partition"].dropna()) if "partition" in packs else set()
    return str(hosts[0]) if len(partitions) > 1 or any(records.one_host.values()) else None


def with_stdout_metric(records: Records, name: str, pattern: str) -> Records:
    """``records`` with metric ``name`` read from each latest training's kept stdout by ``pattern`` (the last match:
    ``collect --metric NAME --pattern REGEX``); what a training reported itself wins. The records on disk stay."""
    patterns = stdout_patterns({name: pattern}, "--pattern")
    t = records.trainings
    if t.empty:
        return records
    t = records.with_detached(t, ("logs",)).copy(deep=False)  # where each training's stdout is kept
    metrics = []
    for _, row in t.iterrows():
        reported = json.loads(row["metrics"]) if isinstance(row["metrics"], str) else dict(row["metrics"] or {})
        if int(row.get("attempt") or 0) == 0 and name not in reported:
            kept = kept_log(str(row["run_dir"]), row.to_dict(), "out")  # its pack's folder, or its lane's fold
            text = kept.read() if kept else None
            reported.update(metrics_from_text(text or "", patterns))
        metrics.append(json.dumps(reported))
    t["metrics"] = metrics
    return dataclasses.replace(records, trainings=t if "logs" in records.trainings
                               else t.drop(columns="logs", errors="ignore"))
