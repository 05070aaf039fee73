"""A Hydra app for the launcher tests (imports nothing of gpupack). `mode` picks what a job does:
ok (return lr * 10), raise (an exception), kill (SIGKILL itself: no JobReturn can come back), sleep then ok.
`burn_s` > 0: after the sleep, burn that many seconds of the CPU (a CPU-bound job: its wall grows with its
neighbours).
`meet` > 0: a barrier, not a clock: wait until that many jobs of the multirun have started (jobs run one after
another never meet: the job fails after 120 s)."""
import os
import signal
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    out = Path(HydraConfig.get().runtime.output_dir)
    (out / "started.txt").write_text(f"{time.time()} {os.getpid()}\n")
    print(f"job prints lr={cfg.lr}", flush=True)  # where a Hydra user finds a job's output: its folder
    print(f"job warns lr={cfg.lr}", file=sys.stderr, flush=True)
    deadline = time.time() + 120
    while cfg.meet and len(list(out.parent.glob("*/started.txt"))) < cfg.meet:
        if time.time() > deadline:
            raise RuntimeError(f"only {len(list(out.parent.glob('*/started.txt')))} of {cfg.meet} jobs ever met")
        time.sleep(0.05)
    time.sleep(cfg.sleep_s)
    burnt = time.process_time() + cfg.burn_s
    while time.process_time() < burnt:
        pass
    if cfg.mode == "raise":
        raise RuntimeError(f"job failure on purpose (lr={cfg.lr})")
    if cfg.mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    (out / "done.txt").write_text(f"{time.time()}\n")
    return cfg.lr * 10


if __name__ == "__main__":
    main()
