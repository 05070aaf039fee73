"""A site's stated rules on what one job may ask (one MIG slice a job, a GPU model named, 1 GPU or a whole node),
each recorded with its words and page, and checked before anything is submitted: a refusal quotes them. Pure."""
from __future__ import annotations

import dataclasses
import datetime as _dt
from dataclasses import dataclass, field
from typing import Callable, Optional

from gpupack.errors import ConfigError


@dataclass
class SiteRule:
    """One rule the site states, with its words and page, so that a refusal quotes them; no words: no such rule."""

    quote: str = ""  # the site's own words; "": no such rule here
    source: str = ""  # where they are written (its page)
    since: Optional[str] = None  # the day it took effect (YYYY-MM-DD); null: not dated there
    in_force: bool = True  # false: announced but not yet applied (recorded, not checked)


@dataclass
class SiteRules:
    """The site's rules on what one job may ask, checked before anything is submitted."""

    # One MIG slice per job: a partition with mig=true keeps gpus_per_job=1.
    one_mig_per_job: SiteRule = field(default_factory=SiteRule)
    # Every GPU request names a model (--gpus-per-node=h100:1): a GPU partition's gpu is set.
    gpu_model: SiteRule = field(default_factory=SiteRule)
    # 1 GPU or a whole node: the words for a partition's whole_node_gpus (checked with or without them).
    whole_node: SiteRule = field(default_factory=SiteRule)


def cite(rule: SiteRule) -> str:
    """A :class:`SiteRule` (or its DictConfig) as a refusal quotes it: ("its words", its page, since its date)."""
    return f'("{rule.quote}", {rule.source}' + (f", since {rule.since}" if rule.since else "") + ")"


def in_force(rule: SiteRule) -> bool:
    """Whether a :class:`SiteRule` (or its DictConfig) is recorded and applies now."""
    return bool(rule.quote) and bool(rule.in_force)


def check_rules(rules: SiteRules, key: Callable[[str], str]) -> None:
    """Each rule the preset records (its words given) has its page and a day (YYYY-MM-DD) as its date, so that a
    refusal can quote it; a page or date without words is refused too (no rule would be checked). Pure."""
    for name in (f.name for f in dataclasses.fields(SiteRules)):
        rule, quote, source, since = (getattr(rules, name), key(f"rules.{name}.quote"), key(f"rules.{name}.source"),
                                      key(f"rules.{name}.since"))
        if not str(rule.quote).strip() and (rule.source or rule.since):
            raise ConfigError(quote, rule.quote, "a site rule is recorded by its words, and these are empty: no rule "
                              "would be checked", f"{quote}='...' (the site's words)")
        if rule.quote and not str(rule.source).strip():
            raise ConfigError(source, rule.source, "a site rule is quoted with the page it is written on",
                              f"{source}='...' (the page)")
        if rule.since is not None and not is_day(str(rule.since)):
            raise ConfigError(since, rule.since, "must be a day, YYYY-MM-DD, or null", f"e.g. {since}=2026-04-06")


def is_day(text: str) -> bool:
    """``text`` a calendar day written YYYY-MM-DD. Pure."""
    try:
        return _dt.date.fromisoformat(text).isoformat() == text
    except ValueError:
        return False
