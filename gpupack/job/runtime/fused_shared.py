"""The process of a fused pack: ``python -m gpupack.job.runtime.fused_shared SPEC.json``. It trains the N trainings
as one batched model (``train_fused``) and writes each one's result or error: one diverging never stops the others.
"""
from __future__ import annotations

import time

_PROCESS_START = time.time()

import contextlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from gpupack.core.store.records import write_json_atomic  # this process's imports are the pack's start-up, timed
    from gpupack.core.workload import Reporter, TrainingContext
    from gpupack.job.runtime.worker import compose_result, shared_by
    from gpupack.job.workloads import load_workload

    spec = json.loads(Path((sys.argv[1:] if argv is None else argv)[0]).read_text())
    trainings = spec["trainings"]
    workload = load_workload(trainings[0]["workload"])
    threads = max(1, int(spec.get("threads", 1)))
    with contextlib.suppress(ImportError):
        import torch

        torch.set_num_threads(threads)  # the group is one process: it gets the cores of all N
    params = [workload.params(t["params"]) for t in trainings]
    ctxs = [TrainingContext(device=t["device"], threads=threads, reporter=Reporter(warmup_steps=int(t["warmup_steps"])))
            for t in trainings]
    started = time.time()
    try:
        outs = workload.train_fused(params, ctxs)
    except BaseException:  # the group itself broke: every training of it failed, with the same traceback
        error = traceback.format_exc()[-4000:]
        for t in trainings:
            write_json_atomic(Path(t["error_path"]), {"started": started, "ended": time.time(), "error": error})
        return 1
    for t, p, ctx, out in zip(trainings, params, ctxs, outs):
        if isinstance(out, BaseException):
            write_json_atomic(Path(t["error_path"]), {"started": started, "ended": time.time(),
                                                      "error": f"{out.__class__.__name__}: {out}"})
        else:
            result = compose_result(t, workload, p, ctx.reporter, out, _PROCESS_START)
            write_json_atomic(Path(t["result_path"]), shared_by(result, len(trainings)))
    return 0


if __name__ == "__main__":
    from gpupack.job.runtime.worker import exit_at_once

    exit_at_once(main())  # every training's result or error is written: the pack waits on no teardown
