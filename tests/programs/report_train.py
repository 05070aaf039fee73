"""A stand-in training program for the command workload's tests (stdlib and gpupack.result only).

    report_train.py --mode report|silent|malformed --lr LR --tag TAG --exit-code K --steps S --samples-per-step B

It first writes what it received as one JSON line on stdout -- its argv items, its working directory and
``$STUB_ENV`` -- so tests can check that each argv item arrived verbatim (no shell in between); arguments it does
not know are ignored. ``--mode report`` marks the first step, counts S steps of B samples and reports
``val_accuracy`` = LR; ``--mode silent`` reports nothing; ``--mode malformed`` writes its result file itself, as a
program in another language might, with a count that is no number. A non-zero ``--exit-code`` writes a recognisable
line to stderr and exits with that code (before reporting anything).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> int:
    print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": os.environ.get("STUB_ENV")}), flush=True)
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["report", "silent", "malformed"], default="report")
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--tag", default="")
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--samples-per-step", type=int, default=8)
    args, _ = parser.parse_known_args()
    if args.exit_code:
        print("stub training: some earlier noise", file=sys.stderr)
        print(f"stub training failing on purpose with code {args.exit_code}", file=sys.stderr, flush=True)
        return args.exit_code
    if args.mode == "silent":
        time.sleep(0.05)
        return 0
    if args.mode == "malformed":
        with open(os.environ["GPUPACK_RESULT"], "w") as f:
            json.dump({"metrics": {"val_accuracy": args.lr}, "samples": "many"}, f)
        return 0
    from gpupack.result import TrainingResult

    time.sleep(0.05)  # "start-up"
    result = TrainingResult()
    result.first_step()
    for _ in range(args.steps):
        time.sleep(0.02)
        result.step(args.samples_per_step)
    result.finish(metrics={"val_accuracy": args.lr, "tag_len": len(args.tag)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
