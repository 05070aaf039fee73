"""The one supervisor of every child process (gpupack/job/runtime/supervisor.py), on its own: real short programs, no
timing decides a verdict (the programs that must be stopped sleep far past every limit)."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from gpupack.job.runtime.supervisor import ChildSpec, FailTogether, Supervisor


def spec(tmp_path: Path, name: str, code: str) -> ChildSpec:
    return ChildSpec(name, [sys.executable, "-c", code], tmp_path / f"{name}.out", tmp_path / f"{name}.err",
                     dict(os.environ))


SLEEP = "import time; time.sleep(120)"
FAIL = "import sys; sys.stderr.write('boom: the cause\\n'); sys.exit(3)"


def test_each_child_reports_how_it_ended(tmp_path):
    with Supervisor() as sup:
        sup.start(spec(tmp_path, "ok", "print('hi')"))
        sup.start(spec(tmp_path, "bad", FAIL))
        sup.start(ChildSpec("gone", ["/nonexistent/program"], tmp_path / "g.out", tmp_path / "g.err", {}))
        seen: list[str] = []
        exits = {e.name: e for e in sup.follow(on_exit=lambda e: seen.append(e.name))}
    assert sorted(seen) == ["bad", "gone", "ok"]  # on_exit once per child
    assert exits["ok"].returncode == 0 and not exits["ok"].failed and (tmp_path / "ok.out").read_text() == "hi\n"
    assert exits["bad"].returncode == 3 and exits["bad"].failed and "boom: the cause" in exits["bad"].error()
    assert exits["gone"].start_error is not None and exits["gone"].failed and exits["gone"].pid is None


@pytest.mark.slow
def test_past_its_time_limit_a_child_gets_sigterm_then_sigkill(tmp_path):
    ignores_term = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    with Supervisor(timeout_s=0.2) as sup:
        sup.start(spec(tmp_path, "polite", SLEEP))
        sup.start(spec(tmp_path, "stubborn", ignores_term))
        exits = {e.name: e for e in sup.follow()}
    assert exits["polite"].timed_out and exits["polite"].signal == signal.SIGTERM
    assert exits["stubborn"].timed_out and exits["stubborn"].signal == signal.SIGKILL  # after the grace period
    assert not exits["polite"].failed  # stopped by its supervisor, not by its own doing


def test_a_group_fails_together_and_names_its_culprit(tmp_path):
    with Supervisor(together=FailTogether()) as sup:
        sup.start(spec(tmp_path, "waiter", SLEEP))  # a DDP rank waiting in an all-reduce for the failed one
        sup.start(spec(tmp_path, "cause", FAIL))
        exits = {e.name: e for e in sup.follow()}
    assert sup.culprit is not None and sup.culprit.name == "cause"
    assert exits["waiter"].stopped and exits["waiter"].signal == signal.SIGKILL


def test_a_consequence_waits_for_its_cause_to_be_named(tmp_path):
    """A rank that failed only because its peer died is not the culprit when the peer fails too."""
    lost_peer = "import sys; sys.stderr.write('lost its peer\\n'); sys.exit(1)"
    late_cause = "import sys, time; time.sleep(0.5); sys.stderr.write('the real error\\n'); sys.exit(2)"
    together = FailTogether(consequence=lambda e: "lost its peer" in e.error(), grace_s=60.0)
    with Supervisor(together=together) as sup:
        sup.start(spec(tmp_path, "consequence", lost_peer))
        sup.start(spec(tmp_path, "cause", late_cause))
        sup.follow()
    assert sup.culprit is not None and sup.culprit.name == "cause"


def test_leaving_by_an_exception_kills_and_reaps_every_child(tmp_path):
    sup = Supervisor()
    with pytest.raises(KeyboardInterrupt):
        with sup:
            child = sup.start(spec(tmp_path, "orphan?", SLEEP))
            raise KeyboardInterrupt
    assert child.poll() and child.exit().signal == signal.SIGKILL  # reaped: no training outlives its pack
    with pytest.raises(ProcessLookupError):
        os.kill(child.pid or 0, 0)


def test_the_fork_server_is_started_by_the_supervisor_in_a_session_of_its_own(tmp_path):
    with Supervisor() as sup:
        fallback = sup.preload("tests.fake_workloads", [{}], dict(os.environ), tmp_path / "forkserver.err")
        assert fallback is None and sup.server is not None
        pid = sup.server.proc.pid
        assert os.getsid(pid) == pid  # its own session, as every child's: a stop's killpg reaches what it started
    assert sup.server.proc.returncode is not None  # closed and reaped on leaving the block


@pytest.mark.slow
def test_a_helper_program_runs_to_its_end_or_is_killed_past_its_limit(tmp_path):
    sup = Supervisor()
    fed = sup.call(spec(tmp_path, "fed", "import sys; print(sys.stdin.read().upper())"), stdin=b"quit\n")
    assert fed.returncode == 0 and not fed.failed and (tmp_path / "fed.out").read_text() == "QUIT\n\n"
    # A helper that starts a helper of its own and hangs: its whole process group is killed at the limit.
    hung = sup.call(spec(tmp_path, "hung", "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
                                            "'import time; time.sleep(120)']); print('started', flush=True); "
                                            "time.sleep(120)"), timeout_s=1.0)
    assert hung.timed_out and hung.signal == signal.SIGKILL
    gone = sup.call(ChildSpec("gone", ["/nonexistent/program"], tmp_path / "g.out", tmp_path / "g.err", {}))
    assert gone.failed and gone.start_error is not None
    assert sup.children == []  # helpers are not the pack's children: follow() does not wait for them


def test_a_server_that_died_under_a_lane_starts_its_next_training_fresh_and_is_not_kept(tmp_path):
    """A lane's shared server that died (killed, out of memory) fails no training: the supervisor starts the child as
    a fresh interpreter and says why; the lane's share makes a new server for its next pack and closes the dead one."""
    from gpupack.core.store.rundir import RunDir
    from gpupack.job.pack import LaneResources

    class DeadServer:
        closed = False

        def start(self, *args: object) -> None:
            raise BrokenPipeError(32, "Broken pipe")

        def close(self) -> None:
            self.closed = True

    dead = DeadServer()
    sup = Supervisor()
    sup.use(dead)  # type: ignore[arg-type]
    spec = ChildSpec("t", [sys.executable, "-c", "print('fresh')"], tmp_path / "t.out", tmp_path / "t.err",
                     dict(os.environ), spec_path=tmp_path / "t.spec.json")
    with sup:
        child = sup.start(spec)
        (ended,) = sup.follow()
    assert not child.forked and ended.returncode == 0 and (tmp_path / "t.out").read_text() == "fresh\n"
    assert sup.refused is not None and "Broken pipe" in sup.refused and not dead.closed  # the lane's, not its own

    share = LaneResources(RunDir(tmp_path / "run"), "lane")
    servers = iter([dead, DeadServer()])
    first = share.get("fs", lambda: next(servers), close=lambda s: s.close(), alive=lambda s: s is not dead)
    again = share.get("fs", lambda: next(servers), close=lambda s: s.close(), alive=lambda s: s is not dead)
    assert first is dead and again is not dead and dead.closed  # made anew, the dead one closed
    share.close()
    assert again.closed


def test_a_training_started_fresh_because_the_server_failed_says_why_in_its_record(tmp_path):
    """Process mode with a lane's server that is dead: each training starts fresh, completes, and its outcome says why
    it was not forked (fork_fallback), as one whose server never started does."""
    from gpupack.core.plan import make_plan
    from gpupack.core.store.records import write_json_atomic
    from gpupack.core.store.rundir import RunDir
    from gpupack.core.types import PackSettings
    from gpupack.job.pack import LaneResources, PackContext
    from gpupack.job.pack.process import PACKER, ProcessOptions

    class DeadServer:
        def start(self, *args: object) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    run = RunDir(tmp_path / "run")
    plan = make_plan(sweep="s", workload="tests.fake_workloads", grid={"tag": ["a", "b"]}, fixed={"steps": 1},
                     factors=[2], modes=["process"], partitions=["local"], repeats=1)
    write_json_atomic(run.plan, plan.to_json())
    pack = plan.packs[0]
    share = LaneResources(run, "lane", pack.trainings)
    share.get(("forkserver", "tests.fake_workloads"), DeadServer)
    ctx = PackContext(run=run, pack=pack, device="cpu", threads=1, env=dict(os.environ), resources=share,
                      settings=PackSettings(mode_options={"process": ProcessOptions(start="fork")}))
    outcomes = PACKER.run(pack.trainings, ctx)
    assert [o.extra["start"] for o in outcomes] == ["fresh", "fresh"] and all(o.result for o in outcomes)
    assert all("the fork server failed" in o.extra["fork_fallback"] for o in outcomes)


def test_an_exit_is_seen_as_it_happens_not_at_the_next_look(tmp_path, monkeypatch):
    """A child's end wakes its supervisor (its pidfd): with a minute between two looks, children that end at once are
    all followed to their end in far less, and each one's end is taken when it came."""
    import time

    from gpupack.core.waits import pidfd
    from gpupack.job.runtime import supervisor

    if pidfd(os.getpid()) is None:
        pytest.skip("no pidfd here (Linux 5.3 or later): an exit is seen at the next look")
    monkeypatch.setattr(supervisor, "POLL_S", 60.0)
    began = time.monotonic()
    with Supervisor() as sup:
        for k in range(3):
            sup.start(spec(tmp_path, f"quick{k}", "pass"))
        exits = sup.follow()
    assert time.monotonic() - began < 30, "the supervisor slept to its next look"
    assert [e.returncode for e in exits] == [0, 0, 0]
