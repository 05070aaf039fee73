"""The options each packing mode and spread strategy owns (its ``Options`` dataclass), built from the config and
checked by it, whether or not this sweep uses it: a value out of range is refused, not silently ignored."""
from __future__ import annotations

from typing import cast

from omegaconf import DictConfig, OmegaConf

from gpupack.core.types import Options, PackSettings
from gpupack.job.pack import available_modes, load_packer
from gpupack.job.spread import available_strategies, load_strategy, strategy_options


def mode_options(packing: DictConfig) -> dict[str, Options]:
    """packing.<mode>.* as each mode's own Options instance (what the pack's job gets), each checked by itself."""
    out: dict[str, Options] = {}
    for mode in available_modes():
        options = load_packer(mode).Options
        if options is not None:
            given = packing.get(mode)
            out[mode] = options(**cast("dict[str, object]", OmegaConf.to_container(given))) if given is not None \
                else options()
            out[mode].check()
    return out


def pack_settings(packing: DictConfig, estimate_s: float | None = None,
                  training_memory_mb: float | None = None) -> PackSettings:
    return PackSettings(device=packing.device, threads_per_training=packing.threads_per_training,
                        training_estimate_s=estimate_s, training_memory_mb=training_memory_mb,
                        admission=packing.admission == "on", memory_fraction=float(packing.memory_fraction),
                        host_memory_mb=packing.host_memory_mb,
                        training_timeout_s=packing.training_timeout_s,
                        memory_limit_gb_per_training=packing.memory_limit_gb_per_training,
                        sample_interval_s=packing.sample_interval_s, mode_options=mode_options(packing),
                        memory_share=float(packing.memory_fraction) if packing.memory_share == "on" else None,
                        memory_margin=float(packing.memory_margin))


def check_strategy_options(spread: DictConfig) -> None:
    """spread.<strategy>_* checked by each strategy's own Options, whatever spread.devices and spread.strategy are."""
    for name in available_strategies():
        options = strategy_options(load_strategy(name), spread)
        if options is not None:
            options.check()
