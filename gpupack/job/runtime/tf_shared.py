"""The TensorFlow process of a tf_logical pack: ``python -m gpupack.job.runtime.tf_shared SPEC.json``. It splits the
device into N logical devices, then runs the N trainings in threads, each writing its own result or error: one
training raising never stops the others.
"""
from __future__ import annotations

import time

_PROCESS_START = time.time()

import json  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

if TYPE_CHECKING:
    from gpupack.job.runtime.worker import SharedSpec


def main(argv: list[str] | None = None) -> int:
    import tensorflow as tf

    from gpupack.core.store.records import write_json_atomic  # this process's imports are the pack's start-up, timed
    from gpupack.job.runtime.worker import run_training, shared_by

    spec = json.loads(Path((sys.argv[1:] if argv is None else argv)[0]).read_text())
    trainings = spec["trainings"]
    tf.config.threading.set_inter_op_parallelism_threads(max(1, int(spec.get("threads", 1))))
    # N logical devices on the first physical GPU (memory_limit each) or on the CPU, before any TensorFlow op
    kind = "GPU" if spec["kind"] == "gpu" else "CPU"
    device = tf.config.list_physical_devices(kind)[0]
    if kind == "GPU":
        tf.config.set_visible_devices(device, "GPU")
    limit = spec.get("memory_limit_mb") if kind == "GPU" else None
    tf.config.set_logical_device_configuration(
        device, [tf.config.LogicalDeviceConfiguration(memory_limit=limit) for _ in trainings])
    devices = [d.name for d in tf.config.list_logical_devices(kind)]
    print(f"gpupack tf_shared: {len(devices)} logical devices: {devices}", flush=True)

    def one(training: SharedSpec) -> None:
        started = time.time()
        try:
            result = run_training(training, _PROCESS_START)
            result["timings"]["thread_start"] = started
            write_json_atomic(Path(training["result_path"]), shared_by(result, len(trainings)))
        except BaseException:  # recorded for this training alone; the other threads go on
            write_json_atomic(Path(training["error_path"]), {"started": started, "ended": time.time(),
                                                             "error": traceback.format_exc()[-4000:]})

    threads = [threading.Thread(target=one, args=(t,), name=t["training_id"]) for t in trainings]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return 0


if __name__ == "__main__":
    from gpupack.job.runtime.worker import exit_at_once

    exit_at_once(main())  # every training's result or error is written: the pack waits on no teardown
