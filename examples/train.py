"""An ordinary argparse training script — packed by gpupack without changing it:

    python -m gpupack +sweep=command 'sweep.fixed.argv=[python,examples/train.py,--lr,"{lr}",--seed,"{seed}"]' \
        sweep.grid.lr=[0.1,0.03] sweep.grid.seed=[0,1] packing.factors=[1,2]

Run alone it just trains. When gpupack packs it, gpupack.result (if importable) reports its first step, samples
and metrics, so start-up and loop are timed apart; without it the exit status and wall time still count.
"""
from __future__ import annotations

import argparse
import json

from mnist_mlp import train

try:  # optional: report to gpupack when it packs this script (a no-op otherwise)
    from gpupack.result import TrainingResult
except ImportError:
    TrainingResult = None


def main() -> None:
    parser = argparse.ArgumentParser(description="Train a small MLP on MNIST.")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-samples", type=int, default=6000)
    parser.add_argument("--data", default=None, help="folder of the MNIST IDX files (default: gpupack's copy)")
    args = parser.parse_args()
    result = TrainingResult() if TrainingResult else None
    metrics = train(args.lr, args.batch_size, args.epochs, args.seed, train_samples=args.train_samples,
                    data=args.data, on_first_step=result.first_step if result else lambda: None,
                    on_step=result.step if result else lambda samples: None)
    if result:
        result.finish(metrics=metrics)
    # The line PyTorch's MNIST example prints: a pattern can read it (sweep.fixed.metrics, or collect --pattern).
    print(f"Test set: Average loss: {metrics['val_loss']:.4f}, Accuracy: {metrics['val_accuracy']:.2%}")
    print(json.dumps({"lr": args.lr, "seed": args.seed, **metrics}))


if __name__ == "__main__":
    main()
