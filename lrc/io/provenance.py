"""What produced an output: resolved settings, code revision, library versions and machine.

Every stage calls :func:`write_settings` on its output directory, so any result can
be traced back to the exact settings and code that made it.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import lrc
from lrc.io.atomic import write_json_atomic

SETTINGS_FILE = "settings.json"
_LIBRARIES = ("torch", "transformers", "accelerate", "datasets", "lm_eval", "tokenizers")


def git_revision() -> str | None:
    """The commit of the `lrc` source tree, with ``-dirty`` if it has local changes."""
    src = Path(lrc.__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return rev + ("-dirty" if dirty else "")


def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in _LIBRARIES:
        try:
            versions[name] = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _cpu_model() -> str | None:
    """``model name (family F, model M)`` from /proc/cpuinfo: virtual machines often give only the brand."""
    try:
        first_cpu = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return platform.processor() or None
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first_cpu.splitlines())}
    name = fields.get("model name") or platform.processor() or None
    if name and "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def machine() -> dict[str, Any]:
    """The hardware a result was computed on.

    Recorded because the CPU changes results: BLAS and oneDNN choose their kernels by
    instruction set (``cpu_capability``), and training amplifies the different rounding (the
    tiny table moved between two machines with bitwise-identical code and packages).
    """
    import torch

    info: dict[str, Any] = {"cpu": _cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        info["cuda"] = torch.version.cuda
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def to_jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def provenance(command: str, settings: Any) -> dict[str, Any]:
    return {
        "command": command,
        "settings": to_jsonable(settings),
        "lrc_version": lrc.__version__,
        "git_revision": git_revision(),
        "python": sys.version.split()[0],
        "libraries": library_versions(),
        "machine": machine(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def write_settings(out_dir: str | Path, command: str, settings: Any, **extra: Any) -> Path:
    """Write ``settings.json`` (settings, code revision, versions, and ``extra``) into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = provenance(command, settings) | to_jsonable(extra)
    return write_json_atomic(out / SETTINGS_FILE, record)


def is_main_process() -> bool:
    """True on the process that writes outputs; the launcher's RANK, so it may be asked before
    accelerate's state exists (creating that state early breaks a multi-process launch)."""
    return int(os.environ.get("RANK", "0")) == 0
