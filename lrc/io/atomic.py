"""Atomic outputs: a reader (or a restarted job) never sees a half-written file or directory.

Every stage writes its output through these helpers, so a failed or killed job leaves
the previous output (if any) untouched and at most a hidden temporary that the next run
removes. An output directory replaces only a directory that lrc wrote (see :func:`atomic_dir`).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from lrc.errors import LRCError
from lrc.options import OUTPUT_MARKER, check_replaceable, current_command, marker_text


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
