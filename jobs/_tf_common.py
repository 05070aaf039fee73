"""What the TensorFlow workloads share: device names, a Keras callback that feeds gpupack's reporter,
per-model mixed precision, and the loader-only pass."""
from __future__ import annotations

from typing import Any


def run(params: Any, ctx: Any, data: Any, build_model: Any) -> dict[str, Any]:
    """A whole Keras training on an image data set (x/y train/test uint8 arrays): the seeded subset, a
    tf.data pipeline, then either the pipeline alone or ``build_model(keras, dtype_policy)`` fitted and
    evaluated — all under ``tf.device(<this training's device>)``."""
    import numpy as np
    import tensorflow as tf
    import keras

    def scaled(x: Any) -> Any:
        x = x.astype("float32") / 255.0
        return x[..., None] if x.ndim == 3 else x  # grey images get their channel axis

    order = np.random.default_rng(params.seed).permutation(len(data.y_train))[: params.train_samples]
    x_train, y_train = scaled(data.x_train[order]), data.y_train[order].astype("int64")
    x_val, y_val = scaled(data.x_test[: params.val_samples]), data.y_test[: params.val_samples]
    device = tf_device(ctx.device)
    with tf.device(device):
        ds = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
              .shuffle(len(y_train), seed=params.seed).batch(params.batch_size).prefetch(2))
        if params.loader_only:
            loader_only(ds, params.epochs, ctx.reporter)
            return {"loader_only": True, "data": data.source}
        model = build_model(keras, dtype_policy(params.amp, ctx.device))
        metrics = fit_and_evaluate(keras, model, ds, params, ctx.reporter, x_val, y_val)
    return {**metrics, "data": data.source, "device": device}


def tf_device(device: str) -> str:
    """gpupack's device ("cpu", "cuda", or a logical device name) as a TensorFlow device string."""
    return {"cpu": "/device:CPU:0", "cuda": "/device:GPU:0"}.get(device, device)


def dtype_policy(amp: bool, device: str) -> str | None:
    """Per-layer Keras dtype policy: per model, not global, because tf_logical trainings share one process."""
    if not amp:
        return None
    return "mixed_float16" if "GPU" in tf_device(device) else "mixed_bfloat16"


def reporter_callback(keras: Any, reporter: Any, batch_size: int) -> Any:
    class Report(keras.callbacks.Callback):
        def on_train_begin(self, logs: Any = None) -> None:
            reporter.loop_started()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            reporter.step(batch_size)

        def on_train_end(self, logs: Any = None) -> None:
            reporter.loop_ended()

    return Report()


def loader_only(dataset: Any, epochs: int, reporter: Any) -> None:
    reporter.loop_started()
    for _ in range(epochs):
        for xb, _yb in dataset:
            reporter.step(int(xb.shape[0]))
    reporter.loop_ended()


def accuracy(model: Any, x: Any, y: Any, batch_size: int = 1000) -> float:
    import numpy as np

    logits = model.predict(x, batch_size=batch_size, verbose=0)
    return float((np.argmax(logits, axis=1) == y).mean())


def placement(model: Any) -> str:
    """Where the model's first weight really lives (Keras 3 variables expose it as .value.device)."""
    weight = model.trainable_weights[0]
    return str(getattr(getattr(weight, "value", weight), "device", ""))


def fit_and_evaluate(keras: Any, model: Any, dataset: Any, params: Any, reporter: Any, x_val: Any,
                     y_val: Any) -> dict[str, Any]:
    """Compile (SGD with momentum), fit with every step reported, and measure validation accuracy."""
    model.compile(optimizer=keras.optimizers.SGD(params.lr, momentum=params.momentum),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(dataset, epochs=params.epochs, verbose=0,
                        callbacks=[reporter_callback(keras, reporter, params.batch_size)])
    return {"train_loss": float(history.history["loss"][-1]), "val_accuracy": accuracy(model, x_val, y_val),
            "placed_on": placement(model)}
