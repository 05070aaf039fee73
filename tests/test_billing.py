"""The Alliance's billing rule ("Allocations and compute scheduling", synced 2026-04-10): the page's own examples on
its fictive bundle, then worked examples from its per-cluster bundles, a pack billed by memory and one by cores."""
from __future__ import annotations

import pytest

from gpupack.core.cost.billing import CORES, GPU, GPU_ONLY, MEMORY, Bill, Bundle, bill, over_bundle

FICTIVE = Bundle(rgu=1.0, cores=3, mem_gb=4)  # the page's fictive bundle: 1 RGU, 3 cores, 4 GB


@pytest.mark.parametrize("bundle, gpus, cores, mem_gb, rgu_eq, term", [
    # the page's examples
    (FICTIVE, 2, 3, 4, 2.0, GPU),  # 2 P100-12gb, 3 cores, 4 GB: 2 RGU equivalents
    (FICTIVE, 1, 5, 5, 5 / 3, CORES),  # 1 RGU, 5 cores, 5 GB: 1.66
    (FICTIVE, 1, 2, 6, 1.5, MEMORY),  # 1 RGU, 2 cores, 6 GB: 1.5
    (Bundle(2.6, 7.8, 10.4), 1, 7.8, 10.4, 2.6, GPU),  # a V100-32gb bundle on the fictive cluster: 2.6
    (Bundle(4.0, 12, 16), 1, 12, 16, 4.0, GPU),  # an A100-40gb bundle: 4.0
    # worked from the page's bundles per GPU
    (Bundle(12.2, 12, 288), 1, 16, 32, 16 / 12 * 12.2, CORES),  # Fir H100: 16 trainings x 1 core: by cores
    (Bundle(12.2, 16, 124.5), 1, 17, 136, 136 / 124.5 * 12.2, MEMORY),  # Rorqual H100, 34 x 4 GB: by memory
    (Bundle(12.2, 14, 250), 1, 8, 100, 12.2, GPU),  # Nibi H100 within its bundle
    (Bundle(1.74, 1.7, 41), 1, 1, 20, 1.74, GPU),  # Fir H100-1g.10gb slice within its bundle
    (Bundle(0.57, 1.7, 17.7), 1, 2, 8, 2 / 1.7 * 0.57, CORES),  # Narval A100-1g.5gb: 2 cores over 1.7
    (Bundle(2.2), 1, 64, 500, 2.2, GPU_ONLY),  # a site without bundles: the GPU alone, as before
])
def test_the_largest_of_gpu_cores_and_memory_bills(bundle, gpus, cores, mem_gb, rgu_eq, term):
    charged = bill(bundle, cores, mem_gb, gpus)
    assert charged.rgu_equivalents == pytest.approx(rgu_eq) and charged.term == term
    assert charged.multiple == pytest.approx(rgu_eq / (gpus * bundle.rgu))


def test_only_a_request_over_its_bundle_is_flagged():
    assert over_bundle(Bundle(12.2, 16, 124.5), 8, 100) is None
    flagged = over_bundle(Bundle(12.2, 16, 124.5), 17, 136)
    assert isinstance(flagged, Bill) and flagged.term == MEMORY and flagged.multiple == pytest.approx(136 / 124.5)


@pytest.mark.slurm
@pytest.mark.slow
def test_a_slice_and_a_whole_gpu_compared_by_what_bills(tmp_path, slurm_env):
    """On the local slurmctld: partitions standing for an H100 and its 1g.10gb slice, each with a bundle. A pack of 2
    asks 2 cores and 2 GB: over the slice's bundle (1 core, 1 GB: billed by cores, 2x), within the whole GPU's. Said
    before submitting; the cost table names the term; one verdict line names the cheapest and the fastest."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "gpupack", f"hydra.searchpath=[file://{repo / 'tests' / 'conf'}]",
                           "+sweep=probe_pack", "cluster=slices", "partitions=[whole,slice]", "packing.factors=[2]",
                           "cluster.poll_s=0.5", "cluster.cpus_per_training=1", "cluster.mem_gb_per_training=1",
                           f"run_dir={run_dir}"], capture_output=True, text=True, env=slurm_env, cwd=repo,
                          timeout=540)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert "slice: a pack of N=2 asks 2 cores and 2.0 GB; one GPU's bundle here is 1 cores and 1 GB, so the pack " \
           "is billed by cores: 2.00x the GPU's RGU" in " ".join(out.split())
    assert "whole: a pack of N=2" not in out
    cost = {r["partition"]: r for r in json.loads((run_dir / "summary.json").read_text())["cost"]}
    assert cost["slice"]["billed_term"] == CORES and cost["slice"]["billed_multiple"] == pytest.approx(2.0)
    assert cost["whole"]["billed_term"] == GPU and cost["whole"]["billed_multiple"] == pytest.approx(1.0)
    for r in cost.values():  # billed = time per training x the GPU's RGU x what bills
        assert r["rgu_hours_per_training"] == pytest.approx(r["time_per_training_s"] / 3600 * r["rgu"]
                                                            * r["billed_multiple"])
    cheapest = next(p for p, r in cost.items() if r["cheapest"])
    fastest = next(p for p, r in cost.items() if r["fastest"])
    assert f"cheapest per training: {cheapest} (process, N=2)" in " ".join(out.split())
    assert f"fastest sweep: {fastest} (process, N=2)" in " ".join(out.split())


def test_auto_by_cost_stops_where_billing_rises_though_time_still_falls():
    """A partition whose bundle is 4 cores: a pack of 8 asks 8 and is billed twice its GPU's RGU. N=8 is faster per
    training (0.6 s against 1.0 s) but dearer (1.2 against 1.0): objective=time climbs, objective=cost stops."""
    from types import SimpleNamespace

    from gpupack.core.types import Capacity, PackRequest
    from gpupack.sweep.flow.auto import billed_multiple, verdict, weighed

    prepared = SimpleNamespace(capacities={"h100": Capacity(bundle_cores=4, bundle_mem_gb=100)},
                               submitter=SimpleNamespace(request=lambda n: PackRequest(cpus=n, mem_mb=n * 1024)))
    assert [billed_multiple(prepared, "h100", n) for n in (1, 4, 8)] == [1.0, 1.0, 2.0]
    times = {4: [1.0, 1.01, 0.99, 1.0], 8: [0.6, 0.61, 0.59, 0.6]}
    assert verdict(8, weighed(prepared, "h100", times, "time"), 4, 0, 0, 0.05) == "climb"
    by_cost = weighed(prepared, "h100", times, "cost")
    assert by_cost[8] == pytest.approx([1.2, 1.22, 1.18, 1.2]) and by_cost[4] == times[4]
    assert "slower than" in verdict(8, by_cost, 4, 0, 0, 0.05)
    no_bundle = SimpleNamespace(capacities={"local": Capacity()}, submitter=prepared.submitter)
    assert weighed(no_bundle, "local", times, "cost") == times  # a site without bundles: cost orders as time


def test_a_bad_objective_is_refused():
    from gpupack.errors import ConfigError
    from gpupack.sweep.setup.compose import compose_config
    from gpupack.sweep.setup.validate import check_packing

    with pytest.raises(ConfigError) as err:
        check_packing(compose_config(["+sweep=mnist_pack", "packing.factors=auto", "packing.auto.objective=money"]))
    assert err.value.key == "packing.auto.objective" and "HINT" in str(err.value)


def test_rorqual_n34_at_4gb_warns_that_memory_bills_before_anything_is_submitted(tmp_path, capsys, monkeypatch):
    from gpupack.cli import main

    monkeypatch.setenv("SLURM_ACCOUNT", "def-pi")
    assert main(["+sweep=mnist_pack", "cluster=rorqual", "packing.factors=[34]", "cluster.mem_gb_per_training=4",
                 "cluster.cpus_per_training=0.4", "dry_run=true", f"run_dir={tmp_path / 'run'}"]) == 0
    captured = capsys.readouterr()
    said = " ".join((captured.out + captured.err).split())
    assert "h100: a pack of N=34 asks 14 cores and 136.0 GB; one GPU's bundle here is 16 cores and 124.5 GB, so the " \
           "pack is billed by memory: 1.09x the GPU's RGU. HINT:" in said, said
    assert not (tmp_path / "run").exists()  # a dry run: nothing written, nothing submitted
