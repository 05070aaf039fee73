"""Compose the config with Hydra's compose API (gpupack is itself a sweeper: no ``@hydra.main``), each error one line
naming the key, the value and the fix. A sweep override on a grid key (``sweep.grid.lr=0.1,0.01``) is that axis."""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import re
from typing import Any, Iterator, Sequence

from hydra import compose, initialize_config_dir
from hydra.core.config_loader import ConfigLoader
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gpupack.core.plan import is_sweep_function
from gpupack.errors import ConfigError, nearest
from gpupack.submit import backend_configs
from gpupack.sweep.setup import config_dir
from gpupack.sweep.setup.config import register_configs, schema

GRID_PREFIX = "sweep.grid."
# Options each packing mode now owns (packing.<mode>.<option>), by their former key.
MOVED = {"packing.mps": "packing.process.mps", "packing.start": "packing.process.start",
         "packing.cpu_affinity": "packing.process.cpu_affinity",
         "packing.tf_gpu_memory_budget_mb": "packing.tf_logical.gpu_memory_budget_mb",
         "packing.tf_gpu_memory_reserve_mb": "packing.tf_logical.gpu_memory_reserve_mb"}
# search=optuna: a hyperparameter's range, kept as its text (gpupack.search.space); sweep.space: a sweep's default one
SPACE_PREFIXES = ("search.space.", "sweep.space.")
FREE_PREFIXES = (GRID_PREFIX, "sweep.fixed.", *SPACE_PREFIXES)


# A template field as a user writes it bare, which Hydra's grammar cannot read (a dict with no colon): {lr}, {x!r}.
# One with a format spec ({lr:.0e}) is a valid dict to Hydra, so it keeps its meaning there and needs its quotes.
_FIELD = r"\{[A-Za-z_][A-Za-z0-9_]*(?:![rsa])?\}"
_BARE_ITEM = re.compile(rf"(?<=[\[,])(\s*)({_FIELD})(\s*)(?=[,\]])")


def quote_fields(text: str) -> str:
    """``key=[{python},train.py,--lr,{lr}]`` as ``key=["{python}",train.py,--lr,"{lr}"]`` for the free keys: the
    shell strips the quotes a user put around ``'{lr}'``, and a bare ``{lr}`` is a dict to Hydra's grammar."""
    key, eq, value = text.partition("=")
    if not eq or not key.lstrip("+~").startswith(FREE_PREFIXES):
        return text
    if re.fullmatch(_FIELD, value.strip()):
        return f'{key}="{value.strip()}"'
    if not value.startswith("["):
        return text
    return key + "=" + _BARE_ITEM.sub(lambda m: m[1] + '"' + m[2] + '"' + m[3], value)


def grid_overrides(overrides: Sequence[str]) -> tuple[list[str], dict[str, str | list[object]]]:
    """The overrides Hydra composes, and the grid axes given in Hydra's sweep syntax, which compose_config sets after
    composing (a later plain value of the same key wins, as in Hydra); sweeps elsewhere are refused."""
    parser = OverridesParser.create()
    out: list[str] = []
    axes: dict[str, str | list[object]] = {}
    for given in overrides:
        text = quote_fields(given)
        try:
            ov = parser.parse_override(text)
        except (OverrideParseException, HydraException) as err:
            raise _unparsed(given, err) from None
        if ov.key_or_group in ("hydra/launcher", "hydra/sweeper"):  # how an app's multirun runs: gpupack runs its own
            raise ConfigError(ov.key_or_group, ov.value(), "gpupack's own command plans and runs its sweep itself: a "
                              f"Hydra {ov.key_or_group.partition('/')[2]} is for your own Hydra app",
                              "search=optuna for an Optuna search here; hydra/launcher=gpupack_local (or "
                              "gpupack_slurm) on your app's command line: python my_app.py -m hydra/launcher=...")
        if not ov.is_sweep_override():
            # Grid axes and fixed hyperparameters are checked against the workload's Params (with a
            # did-you-mean), so a user may set any of them without Hydra's "+" for new keys.
            axes.pop(ov.get_key_element().lstrip("+~"), None)
            out.append(f"++{text}" if text.startswith(FREE_PREFIXES) else text)
            continue
        key = ov.get_key_element()
        if key.lstrip("+~").startswith(SPACE_PREFIXES):  # a search's range: its text, not a grid
            value = text.split("=", 1)[1].strip().replace("\\", "\\\\").replace("'", "\\'")
            out.append(f"++{key.lstrip('+~')}='{value}'")
            continue
        if not key.lstrip("+~").startswith(GRID_PREFIX):
            raise ConfigError(key, (ov.input_line or "").split("=", 1)[1], "sweep syntax only makes a grid axis",
                              f"put the values under {GRID_PREFIX}<name>, or give one value")
        value = text.split("=", 1)[1]
        # a sweep function (range(0,100000)) stays the text it is, expanded by the plan (core.plan.grid_values):
        # thousands of values as OmegaConf nodes cost seconds; a list of values (a,b,c) is set as one
        axes[key.lstrip("+")] = value.strip() if is_sweep_function(value) else list(ov.sweep_iterator())
    return out, axes


def _unparsed(given: str, err: BaseException) -> ConfigError:
    """An override Hydra's grammar cannot parse, and the fix its likeliest cause has."""
    key, _, value = given.partition("=")
    hint = "write key=value, quoting values with special characters: key='a b'"
    undotted = re.sub(r"^(\+*cluster\.partitions\.\w+)\.(?=\d)", r"\1_", key)
    if undotted != key:  # a slice partition's name from before issue 43 (h100_1g.10gb): the presets' has none
        hint = f"{undotted}={value} (a partition's name has no dot)"
    elif "{" in value:  # a template inside Hydra's list syntax: quote it, and the override for the shell
        hint = ("write each templated item in double quotes and the whole override in single quotes, e.g. "
                "'sweep.fixed.argv=[\"{python}\",train.py,--lr,\"{lr}\",--out,\"runs/{lr}\"]'")
    return ConfigError(key, value, f"cannot parse ({_first_line(err)})", hint)


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else err.__class__.__name__


def _root_cause(err: BaseException) -> BaseException:
    while err.__cause__ is not None:
        err = err.__cause__
    return err


def translate(err: Exception, overrides: Sequence[str]) -> ConfigError:
    """One ConfigError for whatever Hydra or OmegaConf raised while composing."""
    if isinstance(err, MissingConfigException):
        m = re.search(r"Could not find '([^']+)'", str(err))
        missing = m.group(1) if m else (err.missing_cfg_file or "?")
        group, _, name = missing.rpartition("/")
        options = [o for o in (err.options or []) if not o.endswith("_schema")]
        if group:
            return ConfigError(group, name, f"no {group} named {name!r} in conf/{group}/",
                               nearest(name, options) if options else f"add conf/{group}/{name}.yaml")
        return ConfigError("config", missing, "no such config", "check the +group=name overrides")
    cause = _root_cause(err)
    if isinstance(cause, OmegaConfBaseException):
        key = getattr(cause, "full_key", None) or "config"
        msg = _first_line(cause)
        m = re.search(r"Key '([^']+)' is not in struct", msg) or re.search(r"Key '([^']+)' not in '", msg)
        if m and key in MOVED:  # options that now live under their mode
            return ConfigError(key, _value_for(key, overrides), "this option moved under its packing mode",
                               f"write {MOVED[key]}={_value_for(key, overrides)}")
        if m:
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            named, value = _as_written(key, overrides)
            if not parent and named != key:  # grid.lr=... for sweep.grid.lr=...: name the key the user meant
                meant = next((g for g in ("sweep", "packing", "cluster") if key in _keys_under(g)), None)
                if meant:
                    return ConfigError(named, value, "unknown config key", f"did you mean {meant}.{named}={value}?")
            return ConfigError(named, value, "unknown config key",
                               _nearest_key(key, m.group(1), getattr(cause, "object_type", None), overrides) +
                               (" (add a new grid axis with +sweep.grid.NAME=[...])"
                                if parent.startswith("sweep.grid") else ""))
        given = getattr(cause, "value", None)
        return ConfigError(key, _value_for(key, overrides) if given is None else given, msg, _type_hint(key))
    m = re.search(r"Could not override '([^']+)'\. No match in the defaults list", str(err))
    if m:  # sweep=NAME: a group the defaults list does not choose is added with +, not overridden
        group = m.group(1)
        value = _value_for(group, overrides)
        return ConfigError(group, value, f"no {group} is chosen by default, so there is none to override",
                           f"write +{group}={value}")
    return ConfigError("config", " ".join(overrides), _first_line(err),
                       "check the override syntax: key=value, +key=value to add, ~key to delete")


def _value_for(key: str, overrides: Sequence[str]) -> str:
    base = re.sub(r"\[\d+\]$", "", key)
    for text in overrides:
        k, _, v = text.partition("=")
        if k.lstrip("+~") in (key, base):
            return v
    return "?"


def _as_written(key: str, overrides: Sequence[str]) -> tuple[str, str]:
    """An unknown ``key`` and its value as written, in full (``a.b.c=1`` where the unknown key is ``a.b``)."""
    given = next((o.lstrip("+~") for o in overrides if o.lstrip("+~").startswith(f"{key}.")), None)
    if given and "=" in given:
        named, value = given.split("=", 1)
        return named, value
    return key, _value_for(key, overrides)


def _nearest_key(key: str, word: str, kind: object, overrides: Sequence[str]) -> str:
    """The HINT of an unknown key ``key`` (its last part ``word``) of a node typed ``kind``: the nearest keys of its
    group as the override to write; else a key another backend's clusters have; else the group's keys."""
    parent = key.rpartition(".")[0]
    keys = _keys_of(kind) or _keys_under(parent)
    close = difflib.get_close_matches(word, keys, n=3, cutoff=0.6)
    elsewhere = _other_backends_key(word, kind)
    if elsewhere and (not close or elsewhere[2] == word):  # a key this cluster's backend lacks: say whose it is
        backend, here, found = elsewhere
        preset = f"e.g. cluster={backend}" if (config_dir() / "cluster" / f"{backend}.yaml").is_file() else \
            f"one whose cluster.backend={backend}"
        whose = f"a key of clusters with backend {backend}, not of this one (backend {here}): choose one, {preset}"
        meant = _join(parent, found)
        return f"{meant} is {whose}" if found == word else \
            f"did you mean {_as_given(key, meant, overrides)}? It is {whose}"
    if close:
        return "did you mean " + " or ".join(_as_given(key, _join(parent, c), overrides) for c in close) + "?"
    return f"{parent or 'the config'} has: {', '.join(sorted(keys))}" if keys else "nothing is available"


def _join(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


def _as_given(key: str, meant: str, overrides: Sequence[str]) -> str:
    """``meant`` as the user's override would read with ``key`` replaced by it (``sweep.gridd.lr=1``: its ``.lr=1``
    kept); the bare key where no override named it."""
    for text in overrides:
        given, eq, value = text.lstrip("+~").partition("=")
        if eq and (given == key or given.startswith(f"{key}.")):
            return f"{meant}{given[len(key):]}={value}"
    return meant


def _keys_of(kind: object) -> list[str] | None:
    """The keys of a structured config node's dataclass ``kind`` (None: not one), which ``Any`` fields do not show."""
    return [f.name for f in dataclasses.fields(kind)] if isinstance(kind, type) and dataclasses.is_dataclass(kind) \
        else None


def _other_backends_key(word: str, kind: object) -> tuple[str, str, str] | None:
    """(backend, this backend, key) where ``word`` is (close to) a key of another backend's cluster config than
    ``kind``'s: ``cluster.account`` under cluster=local is a SLURM cluster's."""
    here = next((name for name, config in backend_configs().items() if config is kind), None)
    if here is None:
        return None
    for backend, config in backend_configs().items():
        found = difflib.get_close_matches(word, [f.name for f in dataclasses.fields(config)], n=1, cutoff=0.6)
        if config is not kind and found:
            return backend, here, found[0]
    return None


def _keys_under(parent: str) -> list[str]:
    try:
        node = OmegaConf.select(OmegaConf.structured(schema()), parent)
    except Exception:  # a path through a value, not a node
        return []
    return [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []


def _type_hint(key: str) -> str:
    if key.startswith("packing.factors"):
        return "give whole numbers >= 1, e.g. packing.factors=[1,2,4]"
    kind = _declared_type(key)
    if kind is None:
        return "give a value of the type this key takes (python -m gpupack +sweep=NAME --cfg job shows its value)"
    example = {"int": "a whole number, e.g. 3", "float": "a number, e.g. 0.5", "bool": f"true or false ({key}=true)",
               "str": "a string, quoted if it has special characters"}.get(kind, kind)
    return f"{key} takes {example}"


def _declared_type(key: str) -> str | None:
    """The type ``key`` is declared with in the schema (gpupack.sweep.setup.config), by name; None where it has none."""
    parent, _, last = re.sub(r"\[\d+\]$", "", key).rpartition(".")
    try:
        root = OmegaConf.structured(schema())
        node = (OmegaConf.select(root, parent) if parent else root)._get_node(last)
        kind = node._metadata.ref_type
    except Exception:  # a key of a group's own config, or none: no declared type to name
        return None
    return getattr(kind, "__name__", None) if kind is not None and kind is not Any else None


# The config groups, each with what choosing one of its options does (--help's lines)
GROUPS = {
    "sweep": "what trains and over which grid (added: +sweep=NAME)",
    "cluster": "where the packs run: this machine (local, the default) or a SLURM site's preset",
    "search": "an Optuna study chooses each training instead of the grid (pip install 'gpupack[search]')",
    "rgu": "what a GPU-hour costs the allocation, by GPU model",
}


@contextlib.contextmanager
def _gpupack_hydra() -> Iterator[ConfigLoader]:
    """Hydra initialised on gpupack's conf/ and schema (its config loader), leaving the process-wide version_base as
    the caller (a notebook, a Hydra app) had it."""
    from hydra.version import VersionBase

    register_configs()
    before = VersionBase.instance().getbase()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3", job_name="gpupack"):
            yield GlobalHydra.instance().config_loader()
    finally:
        VersionBase.instance().version_base = before


def compose_config(overrides: Sequence[str], with_hydra: bool = False) -> DictConfig:
    """gpupack's config composed from conf/ and the overrides; ``with_hydra`` keeps Hydra's own node."""
    rewritten, axes = grid_overrides(overrides)
    try:
        with _gpupack_hydra():
            cfg = compose(config_name="config", overrides=list(rewritten), return_hydra_config=with_hydra)
        for key, values in axes.items():  # sweep.grid is Dict[str, Any]: any list of values composes
            OmegaConf.update(cfg, key, values, merge=False, force_add=True)
    except (HydraException, OmegaConfBaseException) as err:
        raise translate(err, rewritten) from None
    except AssertionError:  # OmegaConf's own assert: a key set under a group left null (search.n_trials=8 alone)
        raise under_unchosen_group(rewritten) from None
    for key, kind in added_keys(cfg):  # the first is refused, as the user wrote it: one line
        raise ConfigError(*_as_written(key, rewritten), "unknown config key",
                          _nearest_key(key, key.rpartition(".")[2], kind, rewritten))
    return cfg


def under_unchosen_group(overrides: Sequence[str]) -> ConfigError:
    """The ConfigError for an override of a key under a config group nothing chose, so its node is null
    (``search.n_trials=8`` without ``search=optuna``): the key, the group, and how to choose it."""
    parser = OverridesParser.create()
    parsed = [(text, parser.parse_override(text)) for text in overrides]  # they parsed once already: no error here
    # the group choices (+sweep=..., search=...) and Hydra's own settings they are found by (hydra.searchpath)
    choices = [text for text, ov in parsed if "." not in ov.key_or_group or ov.key_or_group.startswith("hydra.")]
    with _gpupack_hydra():
        chosen = compose(config_name="config", overrides=choices)
    for text, ov in parsed:
        key = ov.key_or_group
        group = key.partition(".")[0]
        if "." in key and group in chosen and chosen[group] is None:
            options = sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))
            return ConfigError(key, ov.value(), f"sets a key of {group}, which no config chose ({group}: null)",
                               f"choose it first: {group}={options[0] if options else 'NAME'} {text}"
                               + (f" ({group} is one of {', '.join(options)})" if len(options) > 1 else ""))
    return ConfigError("overrides", list(overrides), "could not be composed into a config",
                       "python -m gpupack +sweep=NAME --cfg job shows the config they apply to")


def added_keys(cfg: DictConfig) -> list[tuple[str, type]]:
    """Keys a ``+key=value`` override added to a typed node that its dataclass does not declare, with that dataclass:
    Hydra's append writes past the struct flag, so they would be kept and never read. Pure."""
    found: list[tuple[str, type]] = []

    def walk(node: DictConfig, prefix: str) -> None:
        kind = OmegaConf.get_type(node)
        declared = _keys_of(kind)
        for name in node.keys():
            key = _join(prefix, str(name))
            if declared is not None and name not in declared and key != "hydra":  # Hydra's own node, with_hydra
                found.append((key, kind))  # type: ignore[arg-type]  # a dataclass: declared is not None
                continue
            child = node._get_node(name)  # not resolved: an interpolation stays as written
            if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
                walk(child, key)

    walk(cfg, "")
    return found


def group_options(overrides: Sequence[str] = ()) -> dict[str, list[str]]:
    """The options of each config group (conf/<group>/*.yaml, and any hydra.searchpath the overrides add)."""
    searchpath = [o for o in overrides if o.lstrip("+").startswith("hydra.searchpath=")]
    with _gpupack_hydra() as loader:
        return {g: [o for o in loader.get_group_options(g, config_name="config", overrides=searchpath)
                    if not o.endswith("_schema")] for g in GROUPS}


def search_path(overrides: Sequence[str] = ()) -> list[str]:
    """Where configs are looked up, in order (provider: path)."""
    with _gpupack_hydra() as loader:
        extra = [o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith("hydra.searchpath=")]
        return [f"{e.provider}: {e.path}" for e in loader.get_sources()] + [f"command line: {e}" for e in extra]
