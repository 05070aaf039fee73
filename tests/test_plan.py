"""grid → trainings → packs, table-driven."""
from __future__ import annotations

import pytest

from gpupack.core.plan import (
    Pack,
    Plan,
    expand_grid,
    grid_values,
    make_plan,
    spaced_rounds,
    training_id,
)
from gpupack.errors import ConfigError


@pytest.mark.parametrize(
    "grid, expected",
    [
        ({"lr": [0.1, 0.01]}, [{"lr": 0.1}, {"lr": 0.01}]),
        ({"lr": [0.1, 0.01], "bs": [32, 64]},
         [{"lr": 0.1, "bs": 32}, {"lr": 0.1, "bs": 64}, {"lr": 0.01, "bs": 32}, {"lr": 0.01, "bs": 64}]),
        ({"lr": 0.5}, [{"lr": 0.5}]),
        ({"seed": "range(0,3)"}, [{"seed": 0}, {"seed": 1}, {"seed": 2}]),
        ({"model": "mlp", "seed": [1]}, [{"model": "mlp", "seed": 1}]),
        ({"tag": "a;b $(rm -rf /)"}, [{"tag": "a;b $(rm -rf /)"}]),  # literal, never parsed
    ],
)
def test_expand_grid(grid, expected):
    assert expand_grid(grid) == expected


def test_grid_value_empty_list_is_an_error():
    with pytest.raises(ConfigError, match=r"sweep.grid.lr=\[\]"):
        grid_values("lr", [])


def test_training_id_is_stable_and_order_independent():
    a = training_id("w", {"lr": 0.1, "seed": 0})
    assert a == training_id("w", {"seed": 0, "lr": 0.1})
    assert a != training_id("w", {"lr": 0.1, "seed": 1})
    assert a != training_id("other", {"lr": 0.1, "seed": 0})
    assert a.startswith("w-")


def _plan(grid, factors, repeats=1, modes=("process",), partitions=("local",), order="by_factor"):
    return make_plan(sweep="s", workload="w", grid=grid, fixed={"epochs": 1}, factors=factors, modes=modes,
                     partitions=partitions, repeats=repeats, order=order)


@pytest.mark.parametrize(
    "grid_size, factors, repeats, expected_packs, expected_extra",
    [
        # (grid points, N list, repeats) -> packs per N, trainings added with new seeds per N
        (4, [1], 1, {1: 4}, {1: 0}),
        (4, [2], 1, {2: 2}, {2: 0}),
        (4, [3], 1, {3: 2}, {3: 2}),
        (4, [8], 1, {8: 1}, {8: 4}),
        (4, [4], 2, {4: 2}, {4: 4}),
        (1, [1, 3, 5], 2, {1: 2, 3: 2, 5: 2}, {1: 1, 3: 5, 5: 9}),
        (6, [1, 2, 4], 1, {1: 6, 2: 3, 4: 2}, {1: 0, 2: 0, 4: 2}),
    ],
)
def test_packs_are_full_and_cover_the_grid(grid_size, factors, repeats, expected_packs, expected_extra):
    plan = _plan({"lr": [float(i) for i in range(grid_size)], "seed": [0]}, factors, repeats)
    for n in factors:
        packs = [p for p in plan.packs if p.factor == n]
        assert len(packs) == expected_packs[n]
        assert all(len(p.trainings) == n for p in packs)  # every pack is full
        trainings = [t for p in packs for t in p.trainings]
        assert {t.grid_index for t in trainings} == set(range(grid_size))  # every point runs
        assert len({t.training_id for t in trainings}) == len(trainings)  # no duplicate in one N
        assert sum(t.reseed > 0 for t in trainings) == expected_extra[n]
        assert all(t.params["seed"] % 1000 == 0 for t in trainings)
    for n in factors:  # the plan says when it adds trainings, and only then
        assert any(note.startswith(f"N={n}:") for note in plan.notes) == bool(expected_extra[n])


def test_same_training_same_id_across_factors():
    plan = _plan({"lr": [0.1, 0.2]}, [1, 2])
    ids = {n: [t.training_id for p in plan.packs if p.factor == n for t in p.trainings] for n in (1, 2)}
    assert ids[1] == ids[2]


def test_packs_per_partition_and_mode_and_ids():
    plan = _plan({"lr": [0.1, 0.2]}, [2], modes=("process", "other"), partitions=("p100", "v100"))
    assert [p.pack_id for p in plan.packs] == [
        "p100-process-n02-000", "p100-other-n02-000", "v100-process-n02-000", "v100-other-n02-000"]


def test_reseeded_copy_skips_a_seed_the_grid_already_has():
    plan = _plan({"seed": [0, 1000]}, [3])
    seeds = sorted(t.params["seed"] for t in plan.packs[0].trainings)
    assert seeds == [0, 1000, 2000]


def test_plan_json_round_trip():
    plan = _plan({"lr": [0.1, 0.2], "seed": [0]}, [1, 3], repeats=2)
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assert again.n_trainings == sum(p.factor for p in plan.packs)



def test_the_loader_alone_packs_one_per_distinct_pipeline_setting():
    plan = make_plan(sweep="s", workload="w", grid={"amp": [False, True], "batch_size": [64, 256]},
                     fixed={"epochs": 1}, factors=[2], modes=["process"], partitions=["p100", "v100"], repeats=1,
                     loader_alone=("loader_only", ("batch_size", "epochs"), "process"))
    alone = [p for p in plan.packs if p.loader_alone]
    assert len(alone) == 4  # 2 batch sizes (amp does not change the pipeline) x 2 partitions
    assert all(p.factor == 1 and p.pack_id.split("-")[1] == "loader" for p in alone)
    assert sorted({t.params["batch_size"] for p in alone for t in p.trainings}) == [64, 256]
    assert all(t.params["loader_only"] is True for p in alone for t in p.trainings)
    assert plan.packs[0].loader_alone  # the loader alone runs first
    assert any("the data loader alone" in n for n in plan.notes)
    assert [p for p in plan.packs if not p.loader_alone and any(t.params.get("loader_only") for t in p.trainings)] == []


def test_a_plan_and_a_pack_from_an_earlier_gpupack_name_the_loader_alone_as_it_is_named_now():
    """plan.json and a job's pickled packs written while ``loader_alone`` was named ``probe`` (a run resumed, a job
    queued before an upgrade) read back as the same packs."""
    import pickle

    plan = make_plan(sweep="s", workload="w", grid={"batch_size": [64]}, fixed={}, factors=[2], modes=["process"],
                     partitions=["local"], repeats=1, loader_alone=("loader_only", ("batch_size",), "process"))
    written = plan.to_json()
    old = {**written, "packs": [{("probe" if k == "loader_alone" else k): v for k, v in p.items()}
                                for p in written["packs"]]}
    assert any(p.get("probe") for p in old["packs"]) and not any("loader_alone" in p for p in old["packs"])
    assert Plan.from_json(old) == plan
    pack = plan.packs[0]
    earlier = object.__new__(Pack)  # the state an earlier gpupack pickled: its field under the old name
    earlier.__dict__.update({("probe" if k == "loader_alone" else k): v for k, v in vars(pack).items()})
    assert pickle.loads(pickle.dumps(earlier)) == pack and pack.loader_alone


def test_plan_json_has_no_label_unless_set_so_older_run_dirs_still_resume():
    from gpupack.core.plan import plan_in_order

    plan = make_plan(sweep="s", workload="w", grid={"lr": [0.1]}, fixed={}, factors=[1], modes=["process"],
                     partitions=["p"], repeats=1)
    assert "label" not in plan.to_json()["packs"][0]["trainings"][0]
    assert Plan.from_json(plan.to_json()) == plan
    labelled = plan_in_order(sweep="app", workload="gpupack.job.runtime.hydra_job",
                             params=[{"job_num": 0}, {"job_num": 1}, {"job_num": 2}],
                             factor=2, partition="p", mode="process", label="hydra:app")
    assert [p.factor for p in labelled.packs] == [2, 1]  # in order; the last pack holds the rest
    assert [t.params["job_num"] for p in labelled.packs for t in p.trainings] == [0, 1, 2]
    assert labelled.packs[0].trainings[0].workload_label == "hydra:app"
    assert Plan.from_json(labelled.to_json()) == labelled


# ---------------- the order packs run in ----------------

def _positions(plan):
    """Each (partition, mode, N) group's packs' positions in the run, as fractions of the run."""
    out = {}
    packs = _measured(plan)
    for i, p in enumerate(packs):
        out.setdefault(p.factor, []).append((i + 0.5) / len(packs))
    return out


def _measured(plan):
    """The packs that measure N: the drift check at the end left out."""
    return [p for p in plan.packs if p.reference_of is None]


def test_interleaved_order_spreads_every_n_over_the_whole_run_and_is_recorded():
    plan = _plan({"lr": [0.1, 0.2, 0.3, 0.4]}, [1, 2, 3, 4, 8], repeats=6, order="interleaved")
    packs = _measured(plan)
    by_n = _positions(plan)
    assert plan.order == "interleaved (seed 0): 6 rounds, each with at most one pack of every N"
    assert plan.to_json()["order"] == plan.order
    for n, pos in by_n.items():  # each N's mean position near the middle, and present in both halves of the run
        assert abs(sum(pos) / len(pos) - 0.5) < 0.12, (n, pos)
        assert min(pos) < 0.3 and max(pos) > 0.7, (n, pos)
    assert sorted(p.pack_id for p in packs) == sorted(p.pack_id for p in _plan(
        {"lr": [0.1, 0.2, 0.3, 0.4]}, [1, 2, 3, 4, 8], repeats=6).packs)  # the same packs, in another order


@pytest.mark.parametrize("grid, factors, repeats", [
    ({"lr": [0.05, 0.1], "batch_size": [64, 128]}, [1, 2, 3, 4], 2),  # the default sweep
    ({"lr": [0.05, 0.1], "batch_size": [64, 128]}, [1, 2, 3, 4], 3),
    ({"lr": [0.1, 0.2, 0.3]}, [4, 2, 1], 3),
    ({"lr": [0.1, 0.2, 0.3, 0.4, 0.5]}, [1, 3, 5, 8, 13], 2),
])
def test_rounds_hold_one_pack_of_every_n_at_most_run_in_order_and_the_smallest_n_is_in_each(grid, factors, repeats):
    """The plan's order is its rounds' order; no round holds two packs of one N; N=1 (most packs) is in every round,
    so every pack has the reference beside it in time; a round pairs like with like (its N=1 pack trains one of the
    points a pack of N beside it trains, where the grid is as long as the rounds and N divides it)."""
    plan = _plan(grid, factors, repeats=repeats, order="interleaved")
    packs = _measured(plan)
    rounds = [p.round for p in packs]
    assert rounds == sorted(rounds) and None not in rounds  # run in their rounds' order
    total = 1 + max(rounds)
    for r in range(total):
        factors_in = [p.factor for p in packs if p.round == r]
        assert len(factors_in) == len(set(factors_in)), (r, factors_in)
        assert min(factors) in factors_in, (r, factors_in)
    points = len(expand_grid(grid))
    if total == points:
        for p in (p for p in packs if points % p.factor == 0 and points // p.factor >= repeats):
            ref = next(q for q in packs if q.round == p.round and q.factor == min(factors))
            assert ref.trainings[0].grid_index in {t.grid_index for t in p.trainings}, (p.pack_id, ref.pack_id)


def test_the_first_rounds_reference_runs_again_at_the_end_as_a_drift_check():
    plan = _plan({"lr": [0.1, 0.2]}, [1, 2], repeats=3, order="interleaved")
    end = plan.packs[-1]
    first = next(p for p in plan.packs if p.round == 0 and p.factor == 1)
    assert end.reference_of == first.pack_id and end.pack_id == f"{first.pack_id}-end" and end.round is None
    assert end.trainings == first.trainings and end.factor == 1
    assert [p for p in plan.packs if p.reference_of] == [end]  # one per partition
    assert Plan.from_json(plan.to_json()) == plan
    assert not any(p.reference_of for p in _plan({"lr": [0.1, 0.2]}, [1, 2], repeats=3).packs)  # by_factor: none


@pytest.mark.parametrize("n, total", [(n, t) for t in range(1, 40) for n in range(1, t + 1)])
def test_spaced_rounds_are_distinct_in_range_and_centred(n, total):
    import random
    got = spaced_rounds(n, total, random.Random(n * 100 + total))
    assert len(set(got)) == n and all(0 <= r < total for r in got)
    assert abs(sum(got) / n - (total - 1) / 2) <= 0.5  # the group's mean round is the run's middle (half a round)


def test_by_factor_order_runs_n_by_n():
    plan = _plan({"lr": [0.1, 0.2]}, [1, 2, 3], repeats=3)
    assert [p.factor for p in plan.packs] == sorted(p.factor for p in plan.packs)
    assert plan.order == "by_factor"


def test_interleaved_order_is_seeded():
    a = make_plan(sweep="s", workload="w", grid={"lr": [0.1, 0.2]}, fixed={}, factors=[1, 2, 3], modes=["process"],
                  partitions=["local"], repeats=4, order_seed=1)
    b = make_plan(sweep="s", workload="w", grid={"lr": [0.1, 0.2]}, fixed={}, factors=[1, 2, 3], modes=["process"],
                  partitions=["local"], repeats=4, order_seed=1)
    c = make_plan(sweep="s", workload="w", grid={"lr": [0.1, 0.2]}, fixed={}, factors=[1, 2, 3], modes=["process"],
                  partitions=["local"], repeats=4, order_seed=2)
    assert [p.pack_id for p in a.packs] == [p.pack_id for p in b.packs] != [p.pack_id for p in c.packs]
    assert Plan.from_json(a.to_json()) == a and a.same_sweep(c) and c.order.startswith("interleaved (seed 2)")


def test_a_plan_written_before_orders_is_the_same_sweep():
    new = _plan({"lr": [0.1, 0.2]}, [1, 2], repeats=2, order="interleaved")
    old = new.to_json()
    del old["order"]
    old["packs"] = sorted(old["packs"], key=lambda p: (p["factor"], p["index"]))
    earlier = Plan.from_json(old)
    assert earlier.order == "as given" and earlier.same_sweep(new)
    other = _plan({"lr": [0.1, 0.3]}, [1, 2], repeats=2, order="interleaved")
    assert not other.same_sweep(new)


@pytest.mark.parametrize("grid, factors, repeats", [
    ({"lr": [0.05, 0.1], "batch_size": [64, 128]}, [1, 2, 3, 4], 2),  # the default sweep
    ({"lr": [0.1, 0.2, 0.3]}, [4, 2, 1], 3),
    ({"lr": [0.1, 0.2]}, [2, 4], 3),  # the reference is N=2
])
def test_the_reference_has_a_second_set_up_in_every_round_on_the_same_points(grid, factors, repeats):
    """reference_threads: the smallest N gets as many packs again at that many threads per training, one in each
    round beside its own, each training a new seed of the point its own pack beside it trains (distinct ids), and
    the rest of the plan is as it was (in its rounds); the drift check repeats the reference's own set-up."""
    plain = _plan(grid, factors, repeats=repeats, order="interleaved")
    plan = make_plan(sweep="s", workload="w", grid=grid, fixed={"epochs": 1}, factors=factors, modes=["process"],
                     partitions=["local"], repeats=repeats, order="interleaved", reference_threads=1)
    ref = min(factors)
    twins = [p for p in plan.packs if p.threads is not None]
    own = [p for p in _measured(plan) if p.factor == ref and p.threads is None]
    assert twins and len(twins) == len(own) and {p.threads for p in twins} == {1}
    assert sorted(repr(p) for p in plan.packs if p.threads is None) == sorted(map(repr, plain.packs))  # in their rounds
    for twin in twins:
        beside = next(p for p in own if p.round == twin.round)  # one of each set-up a round
        assert [t.grid_index for t in twin.trainings] == [t.grid_index for t in beside.trainings]
        assert twin.factor == ref and twin.pack_id == f"local-process-n{ref:02d}-t1-{beside.index:03d}"
    ids = [t.training_id for p in twins + own for t in p.trainings]
    assert len(ids) == len(set(ids))
    assert plan.packs[-1].reference_of and plan.packs[-1].threads is None
    assert any("also measured at 1 thread(s) per training" in n for n in plan.notes)
    assert plan.order.endswith("each with at most one pack of every N and set-up")
    assert Plan.from_json(plan.to_json()) == plan


@pytest.mark.parametrize("factors, cores, gpu, device, threads, expected", [
    ([1, 2, 3], 2, False, "auto", None, 1),  # N=1 would get 2 threads: measured at 1 as well
    ([1, 2, 3], 8, False, "auto", None, 1),
    ([2, 4], 2, False, "auto", None, None),  # the reference N=2 gets 1 thread already
    ([2, 4], 8, False, "auto", None, 1),
    ([1, 2, 3], 2, False, "auto", 2, None),  # the user's threads
    ([1, 2, 3], 16, True, "auto", None, None),  # a GPU's trainings
    ([1, 2, 3], 16, True, "cpu", None, 1),  # packing.device=cpu on a GPU machine
    ([1], 8, False, "auto", None, None),  # one N: nothing is weighed against it
    ([1, 2], None, False, "auto", None, None),  # cores unknown
])
def test_the_reference_gets_a_second_set_up_where_it_would_have_threads_to_spare(factors, cores, gpu, device, threads,
                                                                                 expected):
    from gpupack.core.types import Capacity, PackRequest, PackSettings
    from gpupack.sweep.setup.cluster_facts import ClusterFacts
    from gpupack.sweep.setup.validate import reference_threads

    facts = ClusterFacts(partitions=("local",), capacities={"local": Capacity(has_gpu=gpu, max_cpus=cores)},
                         request=lambda *a: PackRequest())
    settings = PackSettings(device=device, threads_per_training=threads)
    assert reference_threads(factors, facts, settings) == expected


@pytest.mark.parametrize("seed_key", ["seed", None])
def test_rounds_measured_again_are_the_same_packs_on_new_trainings(seed_key):
    """packing.remeasure: the packs of the rounds asked (both set-ups of the reference, no drift check), each with
    its N and grid points, on trainings no other pack of the plan holds, named <pack>-again<k>, in their round."""
    from gpupack.core.plan import again_packs

    plan = make_plan(sweep="s", workload="w", grid={"lr": [0.1, 0.2]}, fixed={"seed": 0}, factors=[1, 2],
                     modes=["process"], partitions=["local"], repeats=3, order="interleaved", reference_threads=1,
                     seed_key=seed_key)
    again = again_packs(plan, {0, 2}, {"local"}, 1, seed_key)
    asked = [p for p in plan.packs if p.round in {0, 2} and p.reference_of is None]
    assert [p.pack_id for p in again] == [f"{p.pack_id}-again1" for p in asked]
    assert [(p.round, p.factor, p.threads) for p in again] == [(p.round, p.factor, p.threads) for p in asked]
    for new, old in zip(again, asked):
        assert [t.grid_index for t in new.trainings] == [t.grid_index for t in old.trainings]
        assert {k: v for k, v in new.trainings[0].params.items() if k != "seed"} == \
            {k: v for k, v in old.trainings[0].params.items() if k != "seed"}
    planned = {t.training_id for p in plan.packs for t in p.trainings}
    ids = [t.training_id for p in again for t in p.trainings]
    for n, threads in {(p.factor, p.threads) for p in again}:  # as in any plan: one training once at each N
        mine = [t.training_id for p in again if (p.factor, p.threads) == (n, threads) for t in p.trainings]
        assert len(mine) == len(set(mine))
    assert not planned & set(ids)
    second = {t.training_id for p in again_packs(plan, {0, 2}, {"local"}, 2, seed_key) for t in p.trainings}
    assert not second & (planned | set(ids))
    assert again_packs(plan, {0}, {"elsewhere"}, 1, seed_key) == []
