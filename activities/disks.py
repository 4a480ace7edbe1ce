"""A node's local disks: where it writes, how a write that found no room is named, and when the node has too little
room to take a session (issue 28, "node disk full").

A node writes its scratch folder (`MONOLOGUE_NODE__SCRATCH_DIR`: finalize assembles the whole final MP4 there, a sink
pump copies it there) and, with the embedded default, the object store's folder. A full disk is neither the session's
fault nor the code's: the same write may pass on another node. So an OSError of ENOSPC or EDQUOT inside an activity
becomes ApplicationError NodeDiskFull (`activities/errors.py`) whose message names the disk and its free space, and
the workflow moves the session to another node (`workflows/lease.py`). No truncated file is ever read: the final MP4
is written under a temporary name (`gpu_worker/publish/final.py`) in a temporary folder, and the local store renames
its temporary file only once it is whole (`monologue/storage.py`); checkpoints are read back against their SHA-256.

The node then takes no new session while `shortage()` names a reason (`node/lease_gate.py`, and `/readyz` says it):
its scratch folder has less than `min_free_scratch_mb` free, or a disk has not gained `min_free_scratch_mb` since a
write last failed there (the same write would fail again: the session must not come straight back). Once there is that
much more room it takes sessions again. This module never imports temporalio: the activity edge translates, the node
process gates.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from monologue.settings import NodeSettings, StorageSettings

NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})  # disk full; quota spent


class DiskRole(StrEnum):
    """What a node keeps on a disk, as its messages name it."""

    SCRATCH = "scratch"  # temporary files: the final MP4 being assembled, a sink's copy of it
    STORE = "store"  # the local object store's folder (the embedded default; S3 nodes have none)
    OTHER = "disk"  # a file elsewhere (a library's own temporary file)


def no_room(err: BaseException) -> OSError | None:
    """The OSError of a full disk or spent quota behind `err` (a library may have wrapped it), or None."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError) and current.errno in NO_ROOM:
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def shown(size: int) -> str:
    """A byte count for people: `12 KiB`."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}"
        value /= 1024
    return f"{value:.0f} TiB"


def free_bytes(path: Path) -> int:
    """Free bytes of the filesystem holding `path` (or its nearest existing parent)."""
    return shutil.disk_usage(_existing(path)).free


@dataclass
class NodeDisks:
    """The disks one node writes, and the room each had when a write there last found none."""

    node_id: str
    scratch: Path
    min_free_bytes: int
    store: Path | None = None
    _full_at: dict[DiskRole, int] = field(default_factory=dict)  # free bytes after the failed write was cleaned up
    _lock: threading.Lock = field(default_factory=threading.Lock)  # activity threads write, the loop reads

    @classmethod
    def of(cls, node: NodeSettings, storage: StorageSettings) -> NodeDisks:
        """The disks of the node `node` describes; its scratch folder is created here (it may be a fresh mount)."""
        scratch = (node.scratch_dir or Path(tempfile.gettempdir())).absolute()
        scratch.mkdir(parents=True, exist_ok=True)
        store = storage.root.absolute() if storage.backend == "local" and storage.root is not None else None
        min_free = int(node.min_free_scratch_mb * 1024 * 1024)
        return cls(node_id=node.id, scratch=scratch, min_free_bytes=min_free, store=store)

    def found_full(self, err: OSError, step: str) -> str:
        """The message for a write that found no room (`step`: the activity), naming the disk and its free space.
        The node remembers the disk's room now, so it takes no session until there is more (`shortage`)."""
        role, path = self._disk_of(err)
        free = free_bytes(path)
        if role is not DiskRole.OTHER:
            with self._lock:
                self._full_at[role] = free
        return f"node {self.node_id}: no space left on {path} ({role}, {shown(free)} free): {step}"

    def shortage(self) -> str | None:
        """Why the node must take no new session now (None: it may)."""
        try:
            free = free_bytes(self.scratch)
        except OSError as err:  # the folder (or its mount) went away: nothing can be assembled there
            return f"scratch {self.scratch}: {err.strerror}"
        if free < self.min_free_bytes:
            least = shown(self.min_free_bytes)
            return f"scratch {self.scratch}: {shown(free)} free, under min_free_scratch_mb ({least})"
        with self._lock:
            for role, full_at in list(self._full_at.items()):
                path = self._paths()[role]
                room = free if role is DiskRole.SCRATCH else free_bytes(path)
                # A margin, so that a few KiB freed elsewhere do not bring the session back to fail again.
                wanted = full_at + self.min_free_bytes
                if room >= wanted:  # room came back: forget the failure
                    del self._full_at[role]
                    continue
                return f"{role} {path} filled up: {shown(room)} free, waiting for {shown(wanted)}"
        return None

    def _paths(self) -> dict[DiskRole, Path]:
        paths = {DiskRole.SCRATCH: self.scratch}
        if self.store is not None:
            paths[DiskRole.STORE] = self.store
        return paths

    def _disk_of(self, err: OSError) -> tuple[DiskRole, Path]:
        """The disk a failed write was on: the one holding the file the error names, else (a write to an open file
        names none) the one with the least room, which the write has just used up."""
        paths = self._paths()
        if err.filename:
            named = Path(os.fsdecode(err.filename))
            device = _device(named)
            for role, path in paths.items():
                if _device(path) == device:
                    return role, path
            return DiskRole.OTHER, _existing(named)
        role = min(paths, key=lambda each: free_bytes(paths[each]))
        return role, paths[role]


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _device(path: Path) -> int:
    return _existing(path).stat().st_dev


# The disks of the node this process runs (`watch`, at its start), for the activity edge that names a full one.
_watched: NodeDisks | None = None


def watch(disks: NodeDisks) -> None:
    """Make `disks` the ones this process's activities name when a write finds no room."""
    global _watched
    _watched = disks


def disk_full_message(err: OSError, step: str) -> str:
    """The message of a write that found no room, naming the disk (see `NodeDisks.found_full`)."""
    if _watched is not None:
        return _watched.found_full(err, step)
    where = _existing(Path(os.fsdecode(err.filename))) if err.filename else Path(tempfile.gettempdir())
    return f"no space left on {where} ({shown(free_bytes(where))} free): {step}"


def watched_node() -> str | None:
    """The id of the node whose disks are watched (None: none is)."""
    return None if _watched is None else _watched.node_id
