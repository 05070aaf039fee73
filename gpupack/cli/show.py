"""What the CLI prints of a sweep as it runs: the plan, what a resumed run directory holds, and the packs' progress
(a live table in a terminal, one line per change elsewhere)."""
from __future__ import annotations

import shlex
from collections import Counter
from typing import TYPE_CHECKING, Sequence, TypeVar

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from gpupack import sweep
from gpupack.core.plan import Pack
from gpupack.core.types import PackState

if TYPE_CHECKING:
    from gpupack.sweep.flow.status import RunStatus


def make_console() -> Console:
    """A console that does not squeeze the table to 80 columns when output goes to a file or a pipe."""
    # Markup and emoji off: what gpupack prints is mostly the user's text, which rich would style (":train:",
    # "[bold]"); gpupack's own styled lines say markup=True and escape what they quote.
    console = Console(markup=False, emoji=False)
    return console if console.is_terminal else Console(width=150, markup=False, emoji=False)


def print_plan(console: Console, prepared: sweep.Prepared) -> None:
    for warning in prepared.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, markup=True)
    for note in prepared.spec.notes if prepared.spec is not None else ():
        console.print(f"note: {escape(note)}", highlight=False, markup=True)
    _print_plan(console, prepared)
    for mode, note in (prepared.spec.start_notes() if prepared.spec is not None else {}).items():
        console.print(f"  trainings start ({mode}): {note}", highlight=False)


def print_beside(console: Console, prepared: sweep.Prepared, command: Sequence[str]) -> None:
    """Before a sweep starts in a new run directory: the unfinished or running runs of this same sweep beside it, each
    in one line with how to resume (``command`` again) or follow it. The new run goes on; nothing is overwritten."""
    for b in sweep.unfinished_beside(prepared):
        done = f"{b.complete} of {b.packs} packs done"
        if b.holder is not None:
            line = (f"{b.root} holds a run of this sweep, running now ({b.holder.said()}; {done}); follow it: "
                    f"python -m gpupack watch {b.root}")
        else:
            queued = f"; jobs it submitted may still run: python -m gpupack status {b.root}" if b.submitted else ""
            line = (f"{b.root} holds an unfinished run of this sweep ({done}{queued}); to resume it: "
                    f"{resume_command(command, b.root)}")
        console.print(f"[yellow]note:[/] {escape(line)}", highlight=False, markup=True, soft_wrap=True)


def resume_command(command: Sequence[str], run_dir: object) -> str:
    """``command`` run again in ``run_dir`` (a run_dir= or dry_run= it had left out), as a shell reads it. Pure."""
    def key(word: str) -> str:
        return word.split("=", 1)[0].lstrip("+~")
    return shlex.join([w for w in command if key(w) not in ("run_dir", "dry_run")] + [f"run_dir={run_dir}"])


def _print_plan(console: Console, prepared: sweep.Prepared) -> None:
    auto = prepared.spec.auto if prepared.spec is not None else None
    search = prepared.spec.search if prepared.spec is not None else None
    if auto is not None:
        what, then = ((escape(search.headline()), "streams the search's trials at the best N") if search is not None
                      else (f"{prepared.plan.grid_size} grid point(s)", "runs the rest of the grid at the best N"))
        console.print(f"[bold]gpupack[/] sweep [bold]{escape(prepared.name)}[/]: workload "
                      f"{escape(prepared.plan.workload)}, {what}; "
                      f"packing.factors=auto probes N along {escape(str(list(auto.ladder)))} ({auto.repeats} packs "
                      f"per N, stop below a {auto.min_gain:.0%} gain"
                      + ("; on the space's midpoint" if search is not None else "") + "), then "
                      + (then if auto.then == "run" else "stops (packing.then=stop)"), markup=True)
        for note in (auto.cut, auto.memory_note):
            if note:
                console.print(f"  note: {note}", highlight=False)
        console.print(f"  run directory {prepared.run.root}")
        return
    plan = prepared.plan
    factors = sorted({p.factor for p in plan.packs if p.spread is None})
    modes = sorted({p.mode for p in plan.packs if p.spread is None})
    spread = sorted({p.devices for p in plan.packs if p.spread is not None})
    layouts = sorted({p.mode for p in plan.packs if p.spread is not None})
    what = search.headline() if search is not None else f"{plan.grid_size} grid point(s)"
    console.print(f"[bold]gpupack[/] sweep [bold]{escape(prepared.name)}[/]: workload {escape(plan.workload)}, "
                  + escape(f"{what}, N in {factors}, mode(s) {modes}"
                           + (f"; one training spread over k in {spread} devices with {', '.join(layouts)}"
                              if spread else "")), markup=True)
    lanes = sum(p.stream is not None for p in plan.packs)
    jobs = (f"{lanes} streaming job(s)" + (f" and {len(plan.packs) - lanes} packs" if len(plan.packs) > lanes else "")
            if lanes else f"{len(plan.packs)} packs")
    trainings = "each slot asking the study for its next trial" if search is not None \
        else f"{plan.n_trainings} trainings in all"
    console.print(f"  {jobs}, {trainings}; run directory {prepared.run.root}")
    for line in sweep.forecast(prepared):
        console.print(f"  {line}", highlight=False)
    for note in plan.notes:
        console.print(f"  note: {note}")


def print_opened(console: Console, opened: sweep.Opened) -> None:
    if opened.resumed:
        console.print(f"  resuming: {opened.complete} pack(s) already complete, "
                      f"{len(opened.todo) + len(opened.queued)} to run")
    if opened.queued:
        console.print(f"  {len(opened.queued)} pack(s) still queued or running from an earlier submission, not "
                      f"submitted again: " + ", ".join(f"{p} (job {j})" for p, j in sorted(opened.queued.items())))


STATES = ("pending", "running", "done", "failed")


ViewT = TypeVar("ViewT", bound="LiveView")


class LiveView:
    """In a terminal, a live table (rich) while the view is entered; elsewhere none, and the view prints lines."""

    def __init__(self, console: Console, first: Table) -> None:
        self.console = console
        self.live = Live(first, console=console, auto_refresh=False) if console.is_terminal else None

    def __enter__(self: ViewT) -> ViewT:
        if self.live:
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.live.stop()


class ProgressView(LiveView):
    """Packs per partition as they move pending → running → done | failed."""

    def __init__(self, console: Console, packs: Sequence[Pack]) -> None:
        self.partition = {p.pack_id: p.partition for p in packs}
        self.state: dict[str, str] = {p.pack_id: "pending" for p in packs}
        super().__init__(console, self.table())

    def counts(self) -> dict[str, Counter[str]]:
        out: dict[str, Counter[str]] = {}
        for pack_id, state in self.state.items():
            out.setdefault(self.partition[pack_id], Counter())[state] += 1
        return out

    def table(self) -> Table:
        table = Table(title="packs")
        table.add_column("partition")
        for state in STATES:
            table.add_column(state, justify="right")
        for partition, c in sorted(self.counts().items()):
            table.add_row(partition, *(str(c[s]) for s in STATES))
        return table

    def __call__(self, pack: Pack, state: str) -> None:
        if self.state.get(pack.pack_id) == state:
            return
        self.state[pack.pack_id] = state
        self.partition[pack.pack_id] = pack.partition
        why = state.why if isinstance(state, PackState) else None  # a failed job's one line, where it is known
        if self.live:
            if why:
                self.console.print(f"  {pack.pack_id} failed: {why}", highlight=False, markup=False, soft_wrap=True)
            self.live.update(self.table(), refresh=True)
            return
        finished = sum(s in ("done", "failed") for s in self.state.values())
        counts = "; ".join(f"{part}: " + ", ".join(f"{s} {c[s]}" for s in STATES)
                           for part, c in sorted(self.counts().items()))
        self.console.print(f"  [{finished}/{len(self.state)}] {pack.pack_id} {state:7s} ({counts})"
                           + (f" — {why}" if why else ""), highlight=False, markup=False, soft_wrap=True)


def duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def print_status(console: Console, st: RunStatus, now: float) -> None:
    """Where a run stands: trainings and packs per partition, elapsed and left, and each pack not done."""
    total = sum(sum(c.values()) for c in st.trainings.values())
    if st.search is not None:  # a search's lanes ask its study: its trials, not a plan's trainings
        said = st.search.line(runs=not st.stopped)
        console.print(f"{st.run_dir}: sweep {st.sweep}, a search, {len(st.packs)} pack(s)\n  {said}",
                      highlight=False)
    else:
        console.print(f"{st.run_dir}: sweep {st.sweep}, {total} trainings in {len(st.packs)} packs", highlight=False)
    if not st.queue_answered:
        console.print("  the queue (sacct) did not answer: packs not finished show as unknown")
    packs = st.counts()
    for partition, c in st.trainings.items():
        console.print(f"  {partition}: trainings " + ", ".join(f"{k} {c[k]}" for k in sweep.TRAINING_STATES) +
                      (f", {sweep.T_SKIPPED} {c[sweep.T_SKIPPED]}" if c[sweep.T_SKIPPED] else "") +
                      "; packs " + ", ".join(f"{k} {v}" for k, v in sorted(packs.get(partition, {}).items())),
                      highlight=False)
    elapsed, left = st.elapsed_s(now), st.left_s(now)
    if st.stopped:  # nothing runs or is queued: no rate says when it ends, and its clock stopped with its last training
        ran = f"; its trainings ran {duration(st.last_end_at - st.started_at)}, from the first one's start to the " \
            "last one's end" if st.started_at is not None and st.last_end_at is not None else ""
        console.print(f"  stopped: nothing of it runs or is queued now{ran}", highlight=False)
    elif elapsed is not None:
        when = "took" if st.ended_at is not None else "elapsed"
        rest = "" if st.ended_at is not None else (
            ", left: unknown until a training ends" if left is None else f", about {duration(left)} left at this rate")
        console.print(f"  {when} {duration(elapsed)}{rest}", highlight=False)
    for p in st.packs:
        if p.state == sweep.SKIPPED:  # its N infeasible, not a failure: how many, and why
            console.print(f"  {p.pack_id}: {p.state} ({p.skipped}/{p.trainings} trainings not started, "
                          f"{p.done} done): {p.why}" + (f"; {p.refit}" if p.refit else ""), highlight=False)
        elif p.state != "done":
            console.print(f"  {p.pack_id}: {p.state} ({p.done}/{p.trainings} trainings done"
                          f"{f', job {p.job_id}' if p.job_id else ''})", highlight=False)
        if p.why and p.state != sweep.SKIPPED:  # skipped for memory, its trainings run at a smaller N instead
            console.print(f"  {p.pack_id}: skipped for memory: {p.why}; {p.refit}", highlight=False)
    if st.stopped:
        rest = f"{st.search.left} trial(s)" if st.search is not None else f"{st.trainings_left} training(s)"
        console.print(f"  to resume it ({rest} left): run the same command again with "
                      f"run_dir={st.run_dir} (without it, a new run starts); completed trainings are kept",
                      highlight=False)
    elif any(p.state == sweep.STOPPED for p in st.packs):
        console.print(f"  stopped: started and ended without a pack record (stopped or killed); re-run the same "
                      f"command with run_dir={st.run_dir} to resume: completed trainings are kept", highlight=False)


class StatusView(LiveView):
    """A run followed from its records and the queue (``watch``): trainings per partition, elapsed and left; in a log,
    one line each time the counts change."""

    def __init__(self, console: Console) -> None:
        super().__init__(console, Table())
        self.said = ""

    def line(self, st: RunStatus, now: float) -> str:
        total = sum(st.trainings.values(), Counter[str]())
        left = st.left_s(now)
        return (", ".join(f"{k} {total[k]}" for k in sweep.TRAINING_STATES)
                + ("; stopped" if st.stopped else
                   "" if left is None or st.ended_at is not None else f"; about {duration(left)} left"))

    def table(self, st: RunStatus, now: float) -> Table:
        elapsed = st.elapsed_s(now)
        table = Table(title=f"{st.sweep}: {st.run_dir}", caption=self.line(st, now)
                      + (f"; elapsed {duration(elapsed)}" if elapsed is not None else ""))
        table.add_column("partition")
        for state in sweep.TRAINING_STATES:
            table.add_column(state, justify="right")
        table.add_column("packs")
        packs = st.counts()
        for partition, c in sorted(st.trainings.items()):
            table.add_row(partition, *(str(c[s]) for s in sweep.TRAINING_STATES),
                          ", ".join(f"{k} {v}" for k, v in sorted(packs.get(partition, {}).items())))
        return table

    def show(self, st: RunStatus, now: float) -> None:
        if self.live:
            self.live.update(self.table(st, now), refresh=True)
            return
        counts = self.line(st, now).split("; about")[0]  # a log line when the counts change, not the estimate
        if counts != self.said:
            self.said = counts
            self.console.print(f"  {self.line(st, now)}", highlight=False)
