"""Claims: which streaming lane runs which training, exactly once across concurrent jobs on a shared file system.

A claim is the file ``claims/<queue>/<training id>.claim``, made with link(2): the holder writes and fsyncs its claim
in full to a file of its own name, then links the claim's name to it. link fails when the name exists, atomically on
NFS (v2 onwards), Lustre and local file systems alike (``O_CREAT|O_EXCL`` is atomic only from NFSv3). A lost reply on
NFS is told by the holder's own file having two links. A claim appears whole.

A claim is never taken back while its holder may live: only a later run of the lane that made it (its pack lock held,
so the one before is dead) releases it, by renaming it under ``claims/<queue>/released/``. A training whose record
says completed is never claimed again. A folding lane removes its claim once the training's completed record is in
its journal (:func:`drop`); a failed training's claim stays until the lane's next run.

A claim that cannot be read (torn, empty) must not be skipped: it would hold its training for good. Since no live
writer is ever half-way through one, its bytes were lost after it was made (a crash of the machine, a hand from
outside), and no run can be trusted to still run it: it is stale (:func:`stale_why`), released at a lane's start by a
later run of the lane its readable start names, else by the training's home lane alone (exactly one lane decides).
"""
from __future__ import annotations

import json
import os
import re
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Collection, Iterable, Mapping, TypedDict

from gpupack.core.store.records import file_mode, make_dirs

CLAIM = ".claim"
RELEASED = "released"


@dataclass(frozen=True)
class Claimant:
    """Who holds a claim: the lane (pack id), this run of it (``incarnation``), its job and where it runs."""

    lane: str
    incarnation: str
    job_id: str | None
    host: str
    pid: int

    @staticmethod
    def here(lane: str, job_id: str | None) -> "Claimant":
        return Claimant(lane, f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}", job_id,
                      socket.gethostname(), os.getpid())


class ClaimRecord(TypedDict, total=False):
    """A claim's contents as :func:`claim` writes them (a torn claim reads as {}: held, by no one known)."""
    lane: str
    incarnation: str
    job_id: str | None
    host: str
    pid: int
    claimed_at: float


def claim_path(folder: Path, training_id: str) -> Path:
    return folder / f"{training_id}{CLAIM}"


def claim(folder: Path, training_id: str, holder: Claimant) -> bool:
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


@dataclass(frozen=True)
class Seen:
    """A claim as read: its holder's record (None: torn), and the lane it names (None: none can be read)."""

    rec: ClaimRecord | None
    lane: str | None


# The start of a holder's record (asdict keeps Claimant's field order, the lane first), its closing quote included: a
# name cut before its end is not read as another lane's.
_LANE = re.compile(rb'\s*\{\s*"lane"\s*:\s*"([^"\\]+)"')


def read_claim(raw: bytes) -> Seen:
    """A claim's bytes: its holder's record where whole, else the lane its readable start names, if any. Pure."""
    try:
        rec = json.loads(raw)
    except ValueError:  # torn (by a crash, or from outside), empty, or not UTF-8
        rec = None
    whole = _as_claim(rec)
    if whole is not None:
        return Seen(whole, whole["lane"])
    found = _LANE.match(raw)
    return Seen(None, found.group(1).decode(errors="replace") if found else None)


def _as_claim(rec: object) -> ClaimRecord | None:
    """``rec`` as claim() writes it (lane and incarnation required; the rest where of its type), else None."""
    if not (isinstance(rec, dict) and isinstance(rec.get("lane"), str) and isinstance(rec.get("incarnation"), str)
            and rec["incarnation"]):
        return None
    out = ClaimRecord(lane=rec["lane"], incarnation=rec["incarnation"])
    if rec.get("job_id") is None or isinstance(rec["job_id"], str):
        out["job_id"] = rec.get("job_id")
    if isinstance(rec.get("host"), str):
        out["host"] = rec["host"]
    if isinstance(rec.get("pid"), int) and not isinstance(rec["pid"], bool):
        out["pid"] = rec["pid"]
    if isinstance(rec.get("claimed_at"), (int, float)) and not isinstance(rec["claimed_at"], bool):
        out["claimed_at"] = float(rec["claimed_at"])
    return out


def seen_claims(folder: Path) -> dict[str, Seen]:
    """Every claim in ``folder`` as read: training id → :class:`Seen` (a claim released meanwhile is left out)."""
    if not folder.is_dir():
        return {}
    out = {}
    for path in folder.glob(f"*{CLAIM}"):
        try:
            out[path.name[:-len(CLAIM)]] = read_claim(path.read_bytes())
        except FileNotFoundError:
            continue
    return out


def claims(folder: Path) -> dict[str, ClaimRecord]:
    """Every claim in ``folder``: training id → its holder's record (a torn one as {}: held, by no one known)."""
    return {tid: seen.rec or {} for tid, seen in seen_claims(folder).items()}


STALE = "made by an earlier run of this lane"


def stale_why(seen: Seen, holder: Claimant, home: str | None, lanes: Collection[str] = ()) -> str | None:
    """Why ``holder``'s lane, starting, releases a claim (None: it stays): a whole one an earlier run of it made; a torn
    one whose start names it, or names none of ``lanes`` where it is the training's ``home``. Pure."""
    if seen.rec is not None:
        return STALE if seen.lane == holder.lane and seen.rec.get("incarnation") != holder.incarnation else None
    if seen.lane is not None and (seen.lane in lanes or seen.lane == holder.lane):
        return f"torn, {STALE} (its start names it)" if seen.lane == holder.lane else None
    return "torn, its holder unreadable: released by the training's home lane" if home == holder.lane else None


def release_stale(folder: Path, holder: Claimant, keep: Iterable[str] = (),
                  homes: Mapping[str, str] | None = None) -> dict[str, str]:
    """Release, at the lane's start, the claims :func:`stale_why` finds stale for ``holder``, but ``keep``'s; ``homes``:
    each training's home lane. The released training ids, each with why."""
    kept, lanes = set(keep), {*(homes or {}).values(), holder.lane}
    released = {}
    for training_id, seen in seen_claims(folder).items():
        why = None if training_id in kept else stale_why(seen, holder, (homes or {}).get(training_id), lanes)
        if why is None:
            continue
        target = folder / RELEASED / f"{training_id}.{uuid.uuid4().hex[:8]}{CLAIM}"
        make_dirs(target.parent)
        try:
            os.rename(claim_path(folder, training_id), target)
        except FileNotFoundError:
            continue
        released[training_id] = why
    return released


def drop(folder: Path, training_ids: Iterable[str], lane: str) -> list[str]:
    """Remove ``lane``'s claims of ``training_ids`` (their completed records folded); the ids whose claim it removed."""
    held = set(training_ids)
    dropped = []
    for training_id, rec in claims(folder).items() if held else ():
        if training_id in held and rec.get("lane") == lane:
            claim_path(folder, training_id).unlink(missing_ok=True)
            dropped.append(training_id)
    return dropped
