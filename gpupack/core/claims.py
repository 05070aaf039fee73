"""Claims: which streaming lane runs which training, exactly once across concurrent jobs on a shared file system.

A claim is the file ``claims/<queue>/<training id>.claim`` in the run directory. It is made with link(2): the holder
writes its claim in full to a file of its own name, then links the claim's name to it. link fails when the name
exists, atomically on NFS (v2 onwards: the server does it), Lustre and local file systems alike, where
``O_CREAT|O_EXCL`` is atomic only from NFSv3 and a mkdir lock carries no content. A lost reply on NFS (the link was
made but the client saw an error) is told by the holder's own file having two links, as open(2) advises. A claim
appears whole, so a reader never sees it half written.

A claim is never taken back while its holder may live: only a later run of the lane that made it (its pack lock held,
so the one before is provably dead: requeued, killed, cancelled, or its node gone) releases it, by renaming it under
``claims/<queue>/released/``. A training whose record says completed is never claimed again, released or not.

A lane that folds its records (a cluster's shared filesystem) removes its claim of a training once that training's
completed record is in its journal (:func:`drop`): a lane that claims it after that finds it completed in the
journals, and lets its claim go again. A failed training's claim stays, as before, until the lane's next run.
"""
from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

from gpupack.core.records import file_mode, make_dirs, read_json_or_none

CLAIM = ".claim"
RELEASED = "released"


@dataclass(frozen=True)
class Holder:
    """Who holds a claim: the lane (pack id), this run of it (``incarnation``), its job and where it runs."""

    lane: str
    incarnation: str
    job_id: str | None
    host: str
    pid: int

    @staticmethod
    def here(lane: str, job_id: str | None) -> "Holder":
        return Holder(lane, f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}", job_id,
                      socket.gethostname(), os.getpid())


def claim_path(folder: Path, training_id: str) -> Path:
    return folder / f"{training_id}{CLAIM}"


def claim(folder: Path, training_id: str, holder: Holder) -> bool:
    """Claim ``training_id`` for ``holder``; True when this call made the claim, False when someone holds it."""
    make_dirs(folder)
    target = claim_path(folder, training_id)
    mine = folder / f".{training_id}.{holder.incarnation.replace(':', '_')}.{uuid.uuid4().hex[:6]}.tmp"
    fd = os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_EXCL, file_mode())
    try:
        os.write(fd, json.dumps({**asdict(holder), "claimed_at": time.time()}).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(mine, target)
        return True
    except FileExistsError:
        return False
    except OSError:  # NFS: the link may have been made although the reply was lost
        if os.stat(mine).st_nlink == 2:
            return True
        raise
    finally:
        os.unlink(mine)


def claims(folder: Path) -> dict[str, dict[str, Any]]:
    """Every claim in ``folder``: training id → its holder's record (an unreadable one as {})."""
    if not folder.is_dir():
        return {}
    return {p.name[:-len(CLAIM)]: read_json_or_none(p) or {} for p in folder.glob(f"*{CLAIM}")}


def release_stale(folder: Path, holder: Holder, keep: Iterable[str] = ()) -> list[str]:
    """Release the claims this lane made in its earlier runs (another incarnation of ``holder.lane``): it holds the
    lane's lock now, so they are dead. ``keep``: training ids whose claim stays (completed ones: never run again).
    Returns the released training ids."""
    kept = set(keep)
    released = []
    for training_id, rec in claims(folder).items():
        if rec.get("lane") != holder.lane or rec.get("incarnation") == holder.incarnation or training_id in kept:
            continue
        target = folder / RELEASED / f"{training_id}.{uuid.uuid4().hex[:8]}{CLAIM}"
        make_dirs(target.parent)
        try:
            os.rename(claim_path(folder, training_id), target)
        except FileNotFoundError:
            continue
        released.append(training_id)
    return released


def drop(folder: Path, training_ids: Iterable[str], lane: str) -> list[str]:
    """Remove the claims ``lane`` (any run of it) holds of ``training_ids``: trainings whose completed record is
    folded into a journal, where every lane sees it. Returns the training ids whose claim it removed."""
    held = set(training_ids)
    dropped = []
    for training_id, rec in claims(folder).items() if held else ():
        if training_id in held and rec.get("lane") == lane:
            claim_path(folder, training_id).unlink(missing_ok=True)
            dropped.append(training_id)
    return dropped
