"""The goal remembered (issue 41, item 5): what `collect --metric/--goal/--pattern` ranked a run by is kept in the run
(RUN_DIR/rank.json, atomic, the records untouched), so a later collect of it ranks the same way; a flag given later
wins and is remembered in turn; a metric no record has is refused before anything is written."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpupack import sweep
from gpupack.cli import main
from gpupack.core.store import rank_choice
from gpupack.core.store.rank_choice import RankChoice, choose, read_rank
from gpupack.core.store.rundir import RunDir
from gpupack.job.workloads import load_workload
from gpupack.results.analysis.load import load_records
from gpupack.results.analysis.tables import reported_metrics

REPO = Path(__file__).resolve().parent.parent
# The test workload (tests/fake_workloads.py): train_loss = 1/(1+lr), val_accuracy = min(lr, 1), "score: <lr>" printed
PROBE = [f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]", "+sweep=probe_pack", "sweep.grid.lr=[0.1,0.2,0.4]",
         "++sweep.fixed.say='score: {lr}'", "packing.repeats=1", "packing.factors=[1]"]

ASKED = RankChoice("train_loss", "min", None)
CHOSEN = [  # (asked, kept) -> (chosen, the keys that came from kept)
    (RankChoice(), RankChoice(), (RankChoice(), ())),
    (RankChoice(), ASKED, (ASKED, ("metric", "goal"))),
    (RankChoice(goal="max"), ASKED, (RankChoice("train_loss", "max"), ("metric",))),  # the flag wins
    (RankChoice("train_loss"), ASKED, (ASKED, ("goal",))),  # the same metric keeps its goal
    (RankChoice("val_accuracy"), ASKED, (RankChoice("val_accuracy"), ())),  # another metric: not the loss's min
    (RankChoice("score", "max", "s=(.*)"), ASKED, (RankChoice("score", "max", "s=(.*)"), ())),
    (RankChoice(goal="min"), RankChoice("score", "max", "s=(.*)"),
     (RankChoice("score", "min", "s=(.*)"), ("metric", "pattern"))),  # the pattern goes with its metric
]


@pytest.mark.parametrize("asked, kept, out", CHOSEN)
def test_what_is_asked_wins_and_a_goal_goes_with_its_metric(asked, kept, out):
    assert choose(asked, kept) == out


FROM = [  # rank.json or a config's collect section -> the choice (anything but text left out)
    ({"metric": "loss", "goal": "min"}, RankChoice("loss", "min")),
    ({"metric": "loss", "goal": None, "other": "x"}, RankChoice("loss")),
    ({"metric": 3, "goal": ""}, RankChoice()),
    ({}, RankChoice()),
]


@pytest.mark.parametrize("data, choice", FROM)
def test_a_choice_is_read_from_its_text_keys_only(data, choice):
    assert RankChoice.of(data) == choice


def order(out: str, metric: str) -> list[str]:
    """The lr of each ranked line, best first."""
    return [line.split("lr=")[1].split()[0] for line in out.splitlines() if f"  {metric}=" in line]


def collect(capsys: pytest.CaptureFixture[str], run_dir: Path, *flags: str) -> str:
    assert main(["collect", str(run_dir), "--no-plots", "--out", str(run_dir.parent / "out"), *flags]) == 0
    return capsys.readouterr().out


def flat(out: str) -> str:
    """The output as one line, each run of spaces one (rich wraps long lines at its width)."""
    return " ".join(out.split())


def files(run_dir: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != "rank.json"}


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("ran") / "run"
    sweep.run(sweep.prepare([*PROBE, f"run_dir={run_dir}"]), collect_outputs=False, plots=False)
    return run_dir


@pytest.fixture
def run_dir(ran: Path, tmp_path: Path) -> Path:
    """A copy of the run for each test: each remembers its own choice."""
    import shutil

    return Path(shutil.copytree(ran, tmp_path / "run", symlinks=True))


@pytest.mark.slow
def test_the_goal_and_metric_given_are_how_later_collects_rank(run_dir, capsys):
    before = files(run_dir)
    asked = collect(capsys, run_dir, "--metric", "train_loss", "--goal", "max")
    assert order(asked, "train_loss") == ["0.1", "0.2", "0.4"], asked  # 1/(1+lr), highest first
    assert json.loads((run_dir / "rank.json").read_text()) == {"metric": "train_loss", "goal": "max"}
    for flags in [(), ("--wide",)]:  # without the flags: ranked the same way, and said where the choice came from
        later = collect(capsys, run_dir, *flags)
        assert "Best hyperparameters by train_loss (highest first" in later, later
        assert order(later, "train_loss") == ["0.1", "0.2", "0.4"], later
        assert f"Ranked by metric train_loss, goal max: remembered from an earlier collect ({run_dir}/rank.json)" \
            in flat(later), later
    assert files(run_dir) == before  # nothing but rank.json written in the run: no record rewritten


@pytest.mark.slow
def test_a_later_flag_wins_and_is_remembered_in_turn(run_dir, capsys):
    collect(capsys, run_dir, "--metric", "train_loss", "--goal", "max")
    flipped = collect(capsys, run_dir, "--goal", "min")
    assert order(flipped, "train_loss") == ["0.4", "0.2", "0.1"], flipped
    assert "Ranked by metric train_loss: remembered" in flipped, flipped  # the goal was given: only the metric kept
    assert order(collect(capsys, run_dir), "train_loss") == ["0.4", "0.2", "0.1"]
    other = collect(capsys, run_dir, "--metric", "val_accuracy")  # another metric: the loss's goal does not follow
    assert "Best hyperparameters by val_accuracy (highest first" in other and "remembered" not in other, other
    assert read_rank(RunDir(run_dir)) == RankChoice("val_accuracy", "max")  # the goal known for it, pinned


def test_a_pattern_is_remembered_with_its_metric(run_dir, capsys):
    collect(capsys, run_dir, "--metric", "score", "--goal", "min", "--pattern", r"score: ([0-9.]+)")
    later = collect(capsys, run_dir)
    assert order(later, "score") == ["0.1", "0.2", "0.4"], later
    assert "pattern score: ([0-9.]+)" in flat(later), later


@pytest.mark.slow
def test_the_goal_and_metric_of_the_run_config_rank_until_a_flag_says_otherwise(tmp_path, capsys):
    run_dir = tmp_path / "run"
    sweep.run(sweep.prepare([*PROBE, "collect.metric=train_loss", "collect.goal=max", f"run_dir={run_dir}"]),
              collect_outputs=False, plots=False)
    configured = collect(capsys, run_dir)
    assert order(configured, "train_loss") == ["0.1", "0.2", "0.4"], configured
    assert f"as the run was configured ({run_dir}/config.yaml: collect.*)" in flat(configured)
    collect(capsys, run_dir, "--goal", "min")
    assert order(collect(capsys, run_dir), "train_loss") == ["0.4", "0.2", "0.1"]  # rank.json over config.yaml


def test_a_metric_no_record_has_is_refused_before_anything_is_written(run_dir, capsys):
    collect(capsys, run_dir, "--metric", "train_loss", "--goal", "max")
    kept = (run_dir / "rank.json").read_bytes()
    out = run_dir.parent / "refused"
    code = main(["collect", str(run_dir), "--no-plots", "--out", str(out), "--metric", "val_acc", "--goal", "max"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert re.search(r"--metric='val_acc': the trainings of \S+ report no such metric \(they report [^)]*"
                     r"train_loss, val_accuracy\)\. HINT: --metric val_accuracy$", err), err
    assert (run_dir / "rank.json").read_bytes() == kept and not out.exists()


def test_a_run_that_cannot_be_written_is_still_collected_and_says_so(run_dir, capsys, monkeypatch):
    def refuse(path: Path, data: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(rank_choice, "write_json_atomic", refuse)
    out = collect(capsys, run_dir, "--metric", "train_loss", "--goal", "max")
    assert order(out, "train_loss") == ["0.1", "0.2", "0.4"], out
    assert "not remembered, give it again next time" in flat(out), out
    assert not (run_dir / "rank.json").exists()


@pytest.mark.slow
def test_the_metrics_a_builtin_workload_declares_are_those_it_reports(tmp_path):
    run_dir = tmp_path / "run"
    sweep.run(sweep.prepare(["+sweep=mnist_pack", "sweep.fixed.train_samples=256", "sweep.fixed.val_samples=128",
                             "sweep.fixed.epochs=1", "packing.repeats=1", "packing.factors=[1]",
                             "sweep.grid.batch_size=[128]", "sweep.grid.lr=[0.1]", f"run_dir={run_dir}"]),
              collect_outputs=False, plots=False)
    reported = reported_metrics(load_records([run_dir]).trainings)
    declared = load_workload("mnist_torch").reported_metrics
    assert declared is not None and reported and set(reported) <= set(declared), (reported, declared)


def test_a_torn_rank_file_is_as_none_and_the_next_flag_replaces_it(run_dir, capsys):
    (run_dir / "rank.json").write_text('{"metric": "train_lo')  # as a write that was not atomic would leave it
    assert read_rank(RunDir(run_dir)) is None
    assert "Best hyperparameters by val_accuracy" in collect(capsys, run_dir)  # the default, as with no file
    collect(capsys, run_dir, "--metric", "train_loss", "--goal", "min")
    assert read_rank(RunDir(run_dir)) == RankChoice("train_loss", "min")
