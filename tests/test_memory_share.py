"""Each training's share of the GPU's memory (issue 32, item 1): what it is, and how each training is given it, at the
seams a CPU machine can reach: MPS through its stand-in control program, torch through tests/fake_torch (a stand-in
that logs each memory-fraction call and allocation), the job's GPU through FakeNvml."""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from gpupack.cli import main
from gpupack.core import monitor
from gpupack.core.memory.figures import CUDA_CONTEXT_MB, Figure, MemoryShare, memory_share, memory_shares
from gpupack.core.plan import make_plan
from gpupack.core.store.records import read_json, write_json_atomic
from gpupack.core.store.rundir import RunDir
from gpupack.core.types import PackSettings
from gpupack.job.body import run_pack
from gpupack.job.pack import PackContext
from gpupack.job.pack.process import PACKER as PROCESS
from gpupack.job.pack.process import ProcessOptions
from tests.fakes import FakeNvml

FAKE_TORCH = Path(__file__).resolve().parent / "fake_torch"
MPS_STAND_IN = f"#!{sys.executable}\nimport sys\nsys.exit(0)\n"  # starts and quits a daemon, says nothing


@pytest.mark.parametrize("fraction, total_mb, slots, expected", [
    (0.8, 16384.0, 4, MemoryShare(0.2, 3276.8)),
    (0.8, 81920.0, 1, MemoryShare(0.8, 65536.0)),
    (1.0, 40960.0, 8, MemoryShare(0.125, 5120.0)),
    (None, 16384.0, 4, None),  # packing.memory_share=off
    (0.8, None, 4, None),  # no GPU: nothing to share here
])
def test_a_trainings_share_is_the_fraction_over_n(fraction, total_mb, slots, expected):
    got = memory_share(fraction, total_mb, slots)
    if expected is None:
        assert got is None
    else:
        assert got is not None and got.fraction == pytest.approx(expected.fraction)
        assert got.mb == pytest.approx(expected.mb) and got.mps_limit() == f"0={int(expected.mb)}M"


def _measured(mb: float) -> Figure:
    return Figure(mb, "the peak of 2 training(s) of its setting in runs/x", measured=True)


GPU = 16384.0


@pytest.mark.parametrize("peaks, margin, stated, expected_mb, source", [
    # nothing measured: the equal split, as before
    ([None, None], 0.25, None, [6553.6, 6553.6], "packing.memory_fraction=0.8 / N=2"),
    # a figure the user stated is not a measurement: the equal split
    ([Figure(2000.0, "sweep.training_memory_mb=2000"), None], 0.25, None, [6553.6, 6553.6], "/ N=2"),
    # measured: its peak x 1.25; the unmeasured one gets the rest of 0.8 x 16 GB
    ([_measured(2000.0), None], 0.25, None, [2500.0, 0.8 * GPU - 2500.0],
     "runs/x: 2000 MB x (1 + packing.memory_margin"),
    ([_measured(2000.0), None, None], 0.5, None, [3000.0, (0.8 * GPU - 3000.0) / 2, (0.8 * GPU - 3000.0) / 2],
     "packing.memory_margin=0.5"),
    # all measured: the whole 0.8 x 16 GB dealt in proportion to the peaks (2000 : 4000), none left unshared (a
    # training grown past its measure would get an OOM that rules its N out, with memory free), whatever the margin
    ([_measured(2000.0), _measured(4000.0)], 0.25, None, [0.8 * GPU / 3, 0.8 * GPU * 2 / 3],
     "2000 MB x 2.18: all of packing.memory_fraction, in proportion to the measured peaks"),
    ([_measured(1000.0)] * 2, 0.0, None, [6553.6, 6553.6], "1000 MB x 6.55: all of packing.memory_fraction"),
    # all measured, peaks within the fraction but not with the margin (0.6 + 0.1 of the device <= 0.8 < 0.875): still
    # in proportion, none below its peak (not the equal split, which would hold the 9830 MB one to 6554 MB)
    ([_measured(0.6 * GPU), _measured(0.1 * GPU)], 0.25, None, [0.8 * GPU * 6 / 7, 0.8 * GPU / 7], "x 1.14"),
    # the measured peaks pass 0.8 x 16 GB: the equal split, saying why
    ([_measured(7000.0), _measured(7000.0)], 0.25, None, [6553.6, 6553.6], "pass 0.8 x the device (13107 MB)"),
    # one measured, the rest would starve the unmeasured one (0.8 - 0.6 x 1.25 = 0.05 of the device < 1024 MB): the
    # margin is given up for it, down to the peak: 0.6 x 16 GB and 0.2 x 16 GB
    ([_measured(0.6 * GPU), None], 0.25, None, [0.8 * GPU - 1024.0, 1024.0],
     "the margin cut for 1024 MB to each unmeasured"),
    # ... but not below the peak: three unmeasured need 3 x 1024 MB > 0.15 x 16 GB left: the equal split, saying why
    ([_measured(0.65 * GPU), None, None, None], 0.25, None, [0.2 * GPU] * 4,
     "leave less than 1024 MB for each of 3 unmeasured"),
    # sweep.training_memory_mb stated: what each unmeasured one keeps at least (here 2000 MB of the 0.8 x 16 GB)
    ([_measured(8000.0), None, None], 0.25, 2000.0, [0.8 * GPU - 4000.0, 2000.0, 2000.0], "the margin cut for 2000"),
    ([_measured(8000.0), None, None], 0.25, 3000.0, [0.8 * GPU / 3] * 3, "leave less than 3000 MB for each of 2"),
], ids=["none", "stated", "one-measured", "margin", "all-measured", "no-margin", "all-measured-tight", "too-big",
        "margin-cut", "starved", "stated-floor", "stated-starved"])
def test_a_trainings_share_comes_from_earlier_records_with_a_margin(peaks, margin, stated, expected_mb, source):
    shares = memory_shares(0.8, GPU, peaks, margin, stated)
    assert shares is not None and [s.mb for s in shares] == pytest.approx(expected_mb)
    assert [s.fraction for s in shares] == pytest.approx([mb / GPU for mb in expected_mb])
    assert source in shares[0].source, shares[0].source
    assert sum(s.mb for s in shares) <= 0.8 * GPU + 1e-6  # never more than the pack may fill together


def test_no_share_without_a_gpu_or_with_sharing_off():
    assert memory_shares(None, GPU, [_measured(1.0)], 0.25) is None
    assert memory_shares(0.8, None, [_measured(1.0)], 0.25) is None


def _pack(tmp_path, n=2, **fixed):
    run = RunDir(tmp_path / "run")
    plan = make_plan(sweep="m", workload="tests.fake_workloads", grid={"tag": [f"t{i}" for i in range(n)]},
                     fixed={"steps": 1, **fixed}, factors=[n], modes=["process"], partitions=["local"], repeats=1)
    write_json_atomic(run.plan, plan.to_json())
    return run, plan.packs[0]


def _torch_env(tmp_path) -> tuple[dict[str, str], Path]:
    log = tmp_path / "torch.jsonl"
    path = os.pathsep.join([str(FAKE_TORCH), str(Path(__file__).resolve().parent.parent),
                            os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path, "FAKE_TORCH_LOG": str(log)}, log


def _calls(log: Path) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        out.setdefault(entry["pid"], []).append(entry)
    return out


@pytest.mark.parametrize("start", ["fork", "fresh"])
def test_torchs_fraction_is_set_in_each_training_before_its_first_allocation(tmp_path, start):
    """Two trainings on a 16 GB GPU at 0.8: each process sets torch's fraction to 0.4 of device 0, then allocates;
    forked from a server that preloaded torch, or a fresh interpreter that imports it for the workload."""
    env, log = _torch_env(tmp_path)
    run, pack = _pack(tmp_path, n=2, cuda_alloc=True, preload_import="torch")
    ctx = PackContext(run=run, pack=pack, device="cuda", threads=1, env=env, gpu_memory_total_mb=16384.0,
                      settings=PackSettings(mode_options={"process": ProcessOptions(start=start)}),
                      memory_share=memory_share(0.8, 16384.0, 2), tmp_dir=str(tmp_path))
    outcomes = PROCESS.run(pack.trainings, ctx)
    assert all(o.result is not None for o in outcomes), [o.error for o in outcomes]
    calls = _calls(log)
    assert len(calls) == 2  # one process a training
    for entries in calls.values():
        assert [e["what"] for e in entries] == ["fraction", "alloc"]  # the share first
        assert entries[0]["fraction"] == pytest.approx(0.4) and entries[0]["device"] == 0
    for o in outcomes:
        assert o.extra["start"] == start and o.result["memory_share_applied"] == pytest.approx(0.4)
        assert o.extra["memory_share"] == {"fraction": 0.4, "mb": 6553.6, "mps_limit": None,
                                           "source": "packing.memory_fraction=0.8 / N=2"}


def test_a_forked_scripts_torch_gets_its_share_before_the_script_runs(tmp_path):
    """A user's Python program forked from a server that preloaded torch (the command workload, start=fork): the
    share is set in the child before the program's first line."""
    from gpupack.job.workloads import load_workload

    script = tmp_path / "train.py"
    script.write_text("import torch\ntorch.zeros(1, device='cuda')\n")
    env, log = _torch_env(tmp_path)
    run = RunDir(tmp_path / "run")
    plan = make_plan(sweep="m", workload="command", grid={"i": [0, 1]},
                     fixed={"argv": [sys.executable, str(script), "{i}"], "start": "fork", "preload": ["torch"]},
                     factors=[2], modes=["process"], partitions=["local"], repeats=1, seed_key=None)
    write_json_atomic(run.plan, plan.to_json())
    pack = plan.packs[0]
    load_workload("command")
    ctx = PackContext(run=run, pack=pack, device="cuda", threads=1, env=env, gpu_memory_total_mb=16384.0,
                      settings=PackSettings(mode_options={"process": ProcessOptions(start="auto")}),
                      memory_share=memory_share(0.8, 16384.0, 2), tmp_dir=str(tmp_path))
    outcomes = PROCESS.run(pack.trainings, ctx)
    assert all(o.exit_code == 0 for o in outcomes), [o.error for o in outcomes]
    assert {o.extra["start"] for o in outcomes} == {"fork"}
    for entries in _calls(log).values():
        assert [e["what"] for e in entries] == ["fraction", "alloc"] and entries[0]["fraction"] == pytest.approx(0.4)


@pytest.fixture
def mps_control(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(MPS_STAND_IN)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


@pytest.mark.parametrize("mps, own_daemon", [(True, False), (False, True), (False, False)])
def test_each_mps_client_is_limited_to_its_share(tmp_path, mps_control, mps, own_daemon):
    """Under the pack's MPS daemon, or one the job runs itself (the Alliance's recipe): each client's environment
    carries CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for its share of device 0 (3 trainings of a 24 GB GPU at 0.9: 7372 MB),
    and no torch fraction (a share of a share, where the client sees its limit as the device). Without MPS, no
    client limit, and torch's fraction instead."""
    run, pack = _pack(tmp_path, n=3, report_env="CUDA_MPS_PINNED_DEVICE_MEM_LIMIT,GPUPACK_MEMORY_SHARE")
    env = {**os.environ, **({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "their-pipe")} if own_daemon else {})}
    ctx = PackContext(run=run, pack=pack, device="cpu", threads=1, env=env, gpu_memory_total_mb=24576.0,
                      settings=PackSettings(mode_options={"process": ProcessOptions(mps=mps)}),
                      memory_share=memory_share(0.9, 24576.0, 3), tmp_dir=str(tmp_path))
    outcomes = PROCESS.run(pack.trainings, ctx)
    limited = mps or own_daemon
    for o in outcomes:
        assert o.result["metrics"]["env"] == {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=7372M" if limited else None,
                                              "GPUPACK_MEMORY_SHARE": None if limited else "0.300000"}
        assert o.extra["memory_share"]["mps_limit"] == ("0=7372M" if limited else None)


@pytest.mark.parametrize("share, expected", [(0.8, {"fraction": 0.4, "mb": 6553.6}), (None, None)])
def test_the_job_body_shares_the_gpu_nvml_names_and_records_each_share(tmp_path, monkeypatch, share, expected):
    """The job's GPU as NVML tells it (a fake 16 GB T4): a pack of 2 gives each training 0.4 of it, recorded; with
    packing.memory_share=off (None) nothing is given or recorded."""
    env, log = _torch_env(tmp_path)
    for key in ("PYTHONPATH", "FAKE_TORCH_LOG"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setattr(monitor, "_nvml", lambda: FakeNvml(names=["Tesla T4"]))
    run, pack = _pack(tmp_path, n=2, cuda_alloc=True)
    run_pack(str(run.root), pack.pack_id, PackSettings(device="auto", memory_share=share))
    recs = [read_json(run.training_record(pack.pack_id, t.training_id)) for t in pack.trainings]
    assert {r["device"] for r in recs} == {"cuda"} and {r["status"] for r in recs} == {"completed"}
    for r in recs:
        assert (None if "memory_share" not in r else {k: r["memory_share"][k] for k in ("fraction", "mb")}) == \
            (None if expected is None else pytest.approx(expected))
    whats = [e["what"] for entries in _calls(log).values() for e in entries]
    assert whats.count("fraction") == (2 if share else 0) and whats.count("alloc") == 2


@pytest.mark.slow
def test_a_training_past_its_share_is_recorded_oom_saying_its_share(tmp_path, monkeypatch):
    """One training runs out of memory (its allocator refused past its share): it alone is oom, its record says the
    share and how to give it more; its neighbour completes."""
    monkeypatch.setattr(monitor, "_nvml", lambda: FakeNvml(names=["Tesla T4"]))
    run, pack = _pack(tmp_path, n=2)
    plan = read_json(run.plan)
    plan["packs"][0]["trainings"][0]["params"]["raise_text"] = "CUDA out of memory. Tried to allocate 2.00 GiB"
    write_json_atomic(run.plan, plan)
    run_pack(str(run.root), pack.pack_id, PackSettings(device="auto", memory_share=0.8))
    recs = [read_json(run.training_record(pack.pack_id, t.training_id)) for t in pack.trainings]
    assert [r["status"] for r in recs] == ["oom", "completed"]
    assert "its share of the GPU was 6554 MB (0.4 of the device" in recs[0]["error"]
    assert "packing.memory_share=off" in recs[0]["error"] and "HINT" not in (recs[1].get("error") or "")


def test_a_bad_memory_share_is_one_line_before_anything(tmp_path, capsys):
    code = main(["+sweep=mnist_pack", "packing.memory_share=maybe", f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "packing.memory_share='maybe'" in err and "on" in err, err
    assert not (tmp_path / "run").exists()


def test_a_forked_trainings_share_comes_from_an_earlier_record_of_its_setting(tmp_path, monkeypatch):
    """An earlier run (a sibling run directory) measured the first training's setting at 1600 MB of torch's own peak
    (+ a CUDA context: 2000 MB on the GPU): on a fake 16 GB T4 at 0.8, that training's torch is set to 2000 x 1.25 =
    2500 MB of the device before its first allocation, the other (nothing measured) to the rest; each record says its
    share and where it came from."""
    env, log = _torch_env(tmp_path)
    for key in ("PYTHONPATH", "FAKE_TORCH_LOG"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setattr(monitor, "_nvml", lambda: FakeNvml(names=["Tesla T4"]))
    run, pack = _pack(tmp_path, n=2, cuda_alloc=True)
    earlier = RunDir(tmp_path / "earlier")
    write_json_atomic(earlier.plan, read_json(run.plan))
    first, second = pack.trainings
    write_json_atomic(earlier.training_record(pack.pack_id, first.training_id),
                      {"training_id": first.training_id, "workload": first.workload, "params": dict(first.params),
                       "status": "completed", "gpu_type": "Tesla T4",  # measured on this device model
                       "memory": {"peak_gpu_mem_mb": 2000.0 - CUDA_CONTEXT_MB}})
    run_pack(str(run.root), pack.pack_id, PackSettings(device="auto", memory_share=0.8, memory_margin=0.25))
    recs = {t.training_id: read_json(run.training_record(pack.pack_id, t.training_id)) for t in pack.trainings}
    assert {r["status"] for r in recs.values()} == {"completed"}
    mine, rest = recs[first.training_id]["memory_share"], recs[second.training_id]["memory_share"]
    assert mine["mb"] == pytest.approx(2500.0) and mine["fraction"] == pytest.approx(2500.0 / 16384.0, abs=1e-6)
    assert str(earlier.root) in mine["source"] and "2000 MB x (1 + packing.memory_margin=0.25)" in mine["source"]
    assert rest["mb"] == pytest.approx(0.8 * 16384.0 - 2500.0) and "the rest of" in rest["source"]
    # what each training's own process set its torch to, before its first allocation
    fractions = sorted(entries[0]["fraction"] for entries in _calls(log).values())
    assert [entries[0]["what"] for entries in _calls(log).values()] == ["fraction", "fraction"]
    assert fractions == pytest.approx(sorted([2500.0 / 16384.0, (0.8 * 16384.0 - 2500.0) / 16384.0]), abs=1e-6)


def test_a_bad_memory_margin_is_one_line_before_anything(tmp_path, capsys):
    code = main(["+sweep=mnist_pack", "packing.memory_margin=-0.5", f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "packing.memory_margin=-0.5" in err and "HINT" in err, err
    assert "packing.memory_margin=0.25" in err and not (tmp_path / "run").exists()


def test_a_share_is_never_sized_by_a_training_cut_short(tmp_path, monkeypatch):
    """A training that ran out of memory (its share, a neighbour's fault) or was taken down peaked at no more than it
    was let: a lower bound, not a measure. Neither an earlier run's such record nor one this run learns sizes a share:
    the equal split stays."""
    from gpupack.job.peaks import PeakBook

    monkeypatch.setattr(monitor, "_nvml", lambda: FakeNvml(names=["Tesla T4"]))
    run, pack = _pack(tmp_path, n=2)
    earlier = RunDir(tmp_path / "earlier")
    write_json_atomic(earlier.plan, read_json(run.plan))
    first, second = pack.trainings
    cut = {"training_id": first.training_id, "workload": first.workload, "params": dict(first.params),
           "status": "oom", "gpu_type": "Tesla T4", "memory": {"peak_gpu_mem_mb": 3276.8}}
    write_json_atomic(earlier.training_record(pack.pack_id, first.training_id), cut)
    book = PeakBook(run, pack.trainings, device="Tesla T4")
    assert book.figure(first, on_gpu=True, stated_mb=None) is None
    book.learn({second.training_id: second}, [{**cut, "training_id": second.training_id, "status": "victim"}])
    assert book.figure(second, on_gpu=True, stated_mb=None) is None
    book.learn({second.training_id: second}, [{**cut, "training_id": second.training_id, "status": "completed"}])
    assert book.figure(second, on_gpu=True, stated_mb=None).mb == pytest.approx(3276.8 + CUDA_CONTEXT_MB)


@pytest.mark.parametrize("memory, sampled, expected", [
    ({"peak_gpu_mem_mb": 74.0}, None, 74.0 + CUDA_CONTEXT_MB),  # torch's own: its context added
    ({"peak_gpu_mem_mb": 74.0, "process_gpu_mem_mb": 808.0}, None, 808.0),  # NVML's whole process, higher
    ({"peak_gpu_mem_mb": 74.0, "process_gpu_mem_mb": 14.0}, None, 74.0 + CUDA_CONTEXT_MB),  # sampled too early
    ({"peak_gpu_mem_mb": 1300.0, "from_sampler": ["peak_gpu_mem_mb"]}, None, 1300.0),  # NVML's already: no context
    ({"peak_gpu_mem_mb": 74.0}, 808.0, 808.0),  # an older record: NVML's figure from its pack's sampler
    ({"peak_rss_mb": 900.0}, None, None),
    (None, None, None),
])
def test_a_trainings_gpu_peak_is_its_whole_process(memory, sampled, expected):
    from gpupack.core.memory.figures import gpu_peak_mb

    assert gpu_peak_mb(memory, sampled) == expected


def test_a_share_holds_the_whole_process_nvml_saw_not_torchs_own_peak(tmp_path, monkeypatch):
    """What the H200 showed (2026-11-30): a forked MNIST training's torch peaked at 74 MB while NVML counted 808 MB
    for its process (its CUDA context). The next pack's shares were sized from 74 MB + an assumed 400 MB context, x
    1.25: 593 MB, and 11 of 21 MPS clients, limited to that, ran out of memory. The share now holds what NVML saw."""
    from gpupack.job.peaks import PeakBook
    from gpupack.job.records import fill_memory

    monkeypatch.setattr(monitor, "_nvml", lambda: FakeNvml(names=["NVIDIA H200"]))
    run, pack = _pack(tmp_path, n=2)
    first, second = pack.trainings
    rec = {"training_id": first.training_id, "workload": first.workload, "params": dict(first.params),
           "status": "completed", "gpu_type": "NVIDIA H200", "memory": {"peak_gpu_mem_mb": 74.1, "peak_rss_mb": 1014.0}}
    fill_memory(rec, {"peak_gpu_mem_mb": 808.0, "peak_rss_mb": 1030.0, "gpu_mem_known": True})
    assert rec["memory"]["process_gpu_mem_mb"] == 808.0 and rec["memory"]["peak_gpu_mem_mb"] == 74.1
    book = PeakBook(run, pack.trainings, device="NVIDIA H200")
    book.learn({first.training_id: first}, [rec])
    figure = book.figure(first, on_gpu=True, stated_mb=None)
    assert figure is not None and figure.mb == 808.0
    shares = memory_shares(0.8, 143771.0, [figure] * 21, 0.25, None)
    assert shares is not None and all(s.mb >= 808.0 * 1.25 for s in shares), [s.mb for s in shares or []]


@pytest.mark.parametrize("memory, sampled, expected", [
    ({"peak_rss_mb": 1036.4}, None, 1036.4),  # its own process's
    ({"peak_rss_mb": None}, 1030.0, 1030.0),  # reported none: its pack's sampler's
    ({"peak_rss_mb": 12900.9, "shared_by": 34}, None, None),  # 34 fused trainings' one process on the H200: the pack's
    ({"peak_rss_mb": 1052.0, "shared_by": 1}, None, 1052.0),
    (None, None, None),
])
def test_a_trainings_host_peak_is_its_own_process(memory, sampled, expected):
    from gpupack.core.memory.figures import host_peak_mb

    assert host_peak_mb(memory, sampled) == expected
