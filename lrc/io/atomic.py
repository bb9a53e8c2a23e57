"""Atomic outputs: a reader (or a restarted job) never sees a half-written file or directory.

Every stage writes its output through these helpers, so a failed or killed job leaves
the previous output (if any) untouched and at most a hidden temporary that the next run
removes. An output directory replaces only a directory that lrc wrote (see :func:`atomic_dir`).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from lrc.errors import LRCError
from lrc.options import OUTPUT_MARKER, check_replaceable, current_command, marker_text


# How writers say it: Python (ENOSPC), safetensors ("os error 28"), torch.save (its zip writer's
# "enforce fail at inline_container.cc" or "basic_ios::clear: iostream error"), none naming the path.
DISK_FULL_SIGNS = ("No space left on device", "os error 28", "inline_container.cc", "iostream error")
NEARLY_FULL = 256 * 2**20  # bytes: below this, a writer's words alone are taken for a full disk


def _existing_folder(path: str | os.PathLike) -> Path:
    folder = Path(os.path.abspath(path))
    while not folder.exists():
        folder = folder.parent
    return folder


class DiskFullError(LRCError):
    """A write ran out of disk space: names the output being written and the space left."""

    def __init__(self, path: str | os.PathLike, cause: str):
        self.cause = cause
        folder = _existing_folder(path)
        super().__init__(f"no space left to write {path}: {shutil.disk_usage(folder).free / 2**20:.1f} MiB free "
                         f"on the disk holding {folder} ({cause}); free some space or write elsewhere, then run "
                         "again (earlier outputs and checkpoints are kept)")


@contextmanager
def disk_errors_named(path: str | os.PathLike) -> Iterator[None]:
    """Re-raise a write that ran out of disk space as a :class:`DiskFullError` naming ``path`` (an
    inner one, naming a temporary inside ``path``, is re-raised naming ``path``)."""
    try:
        yield
    except DiskFullError as err:
        raise DiskFullError(path, err.cause) from err.__cause__
    except (OSError, RuntimeError) as err:
        said = any(sign in str(err) for sign in DISK_FULL_SIGNS)
        if getattr(err, "errno", None) != errno.ENOSPC and not (
                said and shutil.disk_usage(_existing_folder(path)).free <= NEARLY_FULL):
            raise
        raise DiskFullError(path, f"{type(err).__name__}: {str(err).strip()[:200]}") from err


@contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` to write; on success it is renamed over ``path``.

    The temporary keeps ``path``'s suffix, for writers that pick a format from it
    (matplotlib's savefig). On an exception it is removed and ``path`` is left as it was.
    """
    path = Path(path)
    if path.is_dir():
        raise LRCError(f"{path}: is a directory; refusing to write a file in its place")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex[:8]}.tmp{path.suffix}")
    try:
        with disk_errors_named(path):
            yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to a temporary sibling of ``path``, then rename it over ``path``."""
    with atomic_file(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json_atomic(path: str | os.PathLike, data: Any) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2) + "\n")


@contextmanager
def atomic_dir(final: str | os.PathLike, *, command: str | None = None) -> Iterator[Path]:
    """Yield a fresh temporary sibling of ``final``; on success it replaces ``final``.

    On an exception the temporary directory is removed and ``final`` is left as it was.
    The new directory holds the marker :data:`lrc.options.OUTPUT_MARKER`, naming ``command``
    (default: the command whose options were read, :func:`lrc.options.current_command`).
    Only a directory lrc wrote is replaced: ``final`` must be absent, empty or marked, and
    neither the working directory nor the checkout (nor a directory holding them); anything else
    is an LRCError, raised before the body runs and checked again before the replacement. (The
    command line refuses it earlier still, while reading its options: lrc.options.check_outputs.)
    """
    given = Path(final)
    check_replaceable(given)
    final = Path(os.path.abspath(given))  # `..` has no sibling; its absolute form does
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".tmp-{final.name}-*"):  # left by a killed job
        shutil.rmtree(stale, ignore_errors=True)
    tmp = final.with_name(f".tmp-{final.name}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        with disk_errors_named(given):
            yield tmp
            (tmp / OUTPUT_MARKER).write_text(marker_text(command or current_command()))
        check_replaceable(final)  # a directory may have appeared there while the body ran
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if os.path.lexists(final):
        old = final.with_name(f".old-{final.name}-{uuid.uuid4().hex[:8]}")
        os.replace(final, old)
        os.replace(tmp, final)
        if old.is_symlink():
            old.unlink()
        else:
            shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
