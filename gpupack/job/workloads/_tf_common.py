"""What the TensorFlow workloads share: device names, a Keras callback that feeds gpupack's reporter,
per-model mixed precision, and the loader-only pass."""
from __future__ import annotations

from typing import Callable, Mapping, TypeVar

import numpy as np

from gpupack.core.frameworks import Framework, Loader, Model, Tensor
from gpupack.core.placement import Spread
from gpupack.core.workload import Reporter, TrainingContext, Workload
from gpupack.errors import ConfigError
from gpupack.job.workloads._images import ImageSet
from gpupack.job.workloads._params import LOADER_PARAM, TF_KNOBS, TF_LOADER_KEYS, Metrics, TrainingParams

KP = TypeVar("KP", bound=TrainingParams)  # a Keras workload's own hyperparameters
# The model for a training: build_model(keras, its dtype policy (None: the default)).
BuildModel = Callable[[Framework, "str | None"], Model]


class KerasWorkload(Workload[KP]):
    """What the Keras workloads share: TensorFlow, the loader knobs, one training spread by MirroredStrategy."""

    framework = "tensorflow"
    fresh_reason = "TensorFlow starts threads at import"
    loader_param, loader_keys, knob_keys = LOADER_PARAM, TF_LOADER_KEYS, TF_KNOBS
    spreads = ("mirrored",)  # run() builds under ctx.spread.scope()
    reported_metrics = ("train_loss", "val_accuracy", "replicas")  # fit_and_evaluate's numbers; a spread one's replicas

    def check_spread(self, params: KP, strategy: str, devices: int) -> None:
        check_even_split(min(params.batch_size, params.train_samples), devices)


def run(params: TrainingParams, ctx: TrainingContext, data: ImageSet, build_model: BuildModel) -> Metrics:
    """A whole Keras training on an image data set: the tf.data pipeline alone, or ``build_model(keras, policy)``
    fitted and evaluated, under ``tf.device`` (spread: the strategy's scope)."""
    import keras
    import tensorflow as tf

    def scaled(x: np.ndarray) -> np.ndarray:
        x = x.astype("float32") / 255.0
        return x[..., None] if x.ndim == 3 else x  # grey images get their channel axis

    order = np.random.default_rng(params.seed).permutation(len(data.y_train))[: params.train_samples]
    x_train, y_train = scaled(data.x_train[order]), data.y_train[order].astype("int64")
    x_val, y_val = scaled(data.x_test[: params.val_samples]), data.y_test[: params.val_samples]
    if ctx.spread is not None:
        return _run_spread(params, ctx, ctx.spread, data, build_model, (x_train, y_train), (x_val, y_val))
    device = tf_device(ctx.device)
    with tf.device(device):
        ds = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
              .shuffle(len(y_train), seed=params.seed).batch(params.batch_size).prefetch(2))
        if params.loader_only:
            loader_only(ds, params.epochs, ctx.reporter)
            return {"loader_only": True, "data": data.source}
        model = build_model(keras, dtype_policy(params.amp, ctx.device))
        # a search's trial: each epoch's validation accuracy is its curve, reported; a prune stops the fit there
        curve = (lambda m, epoch: ctx.report(accuracy(m, x_val, y_val), epoch)) if ctx.ranks_by("val_accuracy") \
            else None
        metrics = fit_and_evaluate(keras, model, ds, params, ctx.reporter, x_val, y_val, curve)
    return {**metrics, "data": data.source, "device": device}


def _run_spread(params: TrainingParams, ctx: TrainingContext, spread: Spread, data: ImageSet, build_model: BuildModel,
                train: tuple[np.ndarray, np.ndarray], val: tuple[np.ndarray, np.ndarray]) -> Metrics:
    """The same training spread by ``spread``'s strategy; the dataset keeps the global batch, split by Keras."""
    import keras
    import tensorflow as tf

    x_train, y_train = train
    ds = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
          .shuffle(len(y_train), seed=params.seed).batch(params.batch_size).prefetch(2))
    if params.loader_only:  # the input pipeline alone, on the host: nothing to spread
        loader_only(ds, params.epochs, ctx.reporter)
        return {"loader_only": True, "data": data.source}
    check_even_split(min(params.batch_size, len(y_train)), spread.placement.devices)
    with spread.scope():  # model, optimizer and compile: their variables become mirrored
        model = spread.wrap(build_model(keras, dtype_policy(params.amp, ctx.device)))
        metrics = fit_and_evaluate(keras, model, ds, params, ctx.reporter, *val)
    devices = spread.stats().get("replica_devices") or [tf_device(ctx.device)]
    # The replicas Keras really trained over: the strategy in scope when the model was made.
    return {**metrics, "data": data.source, "device": ",".join(devices),
            "replicas": int(model.distribute_strategy.num_replicas_in_sync)}


def check_even_split(first_batch: int, replicas: int) -> None:
    """Keras 3 under a tf.distribute strategy builds the model from the first batch's per-replica shares averaged
    together, which fails (AddN: shapes differ) unless the first global batch splits evenly over the replicas. Pure."""
    if first_batch % replicas:
        raise ConfigError("batch_size", first_batch, f"one training spread over {replicas} replicas needs its first "
                          f"global batch to split evenly over them (Keras builds the model from equal shares)",
                          f"use a batch_size (and train_samples, if smaller) divisible by {replicas}")


def tf_device(device: str) -> str:
    """gpupack's device ("cpu", "cuda", or a logical device name) as a TensorFlow device string."""
    return {"cpu": "/device:CPU:0", "cuda": "/device:GPU:0"}.get(device, device)


def dtype_policy(amp: bool, device: str) -> str | None:
    """Per-layer Keras dtype policy: per model, not global, because tf_logical trainings share one process."""
    if not amp:
        return None
    return "mixed_float16" if "GPU" in tf_device(device) else "mixed_bfloat16"


def loader_only(dataset: Loader, epochs: int, reporter: Reporter) -> None:
    reporter.loop_started()
    for _ in range(epochs):
        for xb, _yb in dataset:
            reporter.step(int(xb.shape[0]))
    reporter.loop_ended()


def accuracy(model: Model, x: Tensor, y: Tensor, batch_size: int = 1000) -> float:
    logits = model.predict(x, batch_size=batch_size, verbose=0)
    return float((np.argmax(logits, axis=1) == y).mean())


def fit_and_evaluate(keras: Framework, model: Model, dataset: Loader, params: TrainingParams, reporter: Reporter,
                     x_val: Tensor, y_val: Tensor, curve: Callable[[Model, int], bool] | None = None) -> Metrics:
    """Compile, fit with every step reported, and measure validation accuracy; ``curve`` True (pruned) stops the fit."""
    class Report(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Mapping[str, float] | None = None) -> None:
            if curve is not None and curve(self.model, epoch):
                self.model.stop_training = True

        def on_train_begin(self, logs: Mapping[str, float] | None = None) -> None:
            reporter.loop_started()

        def on_train_batch_end(self, batch: int, logs: Mapping[str, float] | None = None) -> None:
            reporter.step(params.batch_size)

        def on_train_end(self, logs: Mapping[str, float] | None = None) -> None:
            reporter.loop_ended()

    model.compile(optimizer=keras.optimizers.SGD(params.lr, momentum=params.momentum),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(dataset, epochs=params.epochs, verbose=0, callbacks=[Report()])
    weight = model.trainable_weights[0]  # where it really lives: a Keras 3 variable's .value.device
    return {"train_loss": float(history.history["loss"][-1]), "val_accuracy": accuracy(model, x_val, y_val),
            "placed_on": str(getattr(getattr(weight, "value", weight), "device", ""))}
