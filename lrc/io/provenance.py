"""What produced an output: resolved settings, code revision, library versions and machine.

Every stage calls :func:`write_settings` on its output directory, so any result can
be traced back to the exact settings and code that made it.

The code is named by :func:`code_identity`: the git revision (``-dirty`` with local changes),
the package version and ``source_sha256``, a hash of the package's own source files, which
tells two dirty trees (or two installs without git) apart and ignores commits that change no
code. A training output's weights may come from an earlier run's checkpoint (a rerun that
finds the run finished, or a run resumed across a code change): the training summary then
lists the code that trained them (``trained_by``, from the checkpoints, see
:mod:`lrc.training.integrity`), and when that is not this code, :func:`write_settings` records
*that* revision as the output's ``git_revision`` (several joined by ``+``) and this one as
``written_by``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
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


@functools.lru_cache(maxsize=1)
def source_sha256() -> str:
    """SHA-256 of the ``lrc`` package's Python files (relative path and bytes), read once per process:
    the code this process imported, whatever is edited later."""
    root = Path(lrc.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(f"{path.relative_to(root).as_posix()}\n{path.stat().st_size}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def code_identity() -> dict[str, str | None]:
    """The code running now: ``git_revision``, ``lrc_version``, ``source_sha256``."""
    return {"git_revision": git_revision(), "lrc_version": lrc.__version__, "source_sha256": source_sha256()}


def same_code(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two :func:`code_identity` records name the same code: by the source hash when both
    have one (a commit that changes no code is the same code), else by revision and version."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    if a.get("source_sha256") and b.get("source_sha256"):
        return a["source_sha256"] == b["source_sha256"]
    return (a.get("git_revision"), a.get("lrc_version")) == (b.get("git_revision"), b.get("lrc_version"))


def describe_code(identity: dict[str, Any] | None) -> str:
    """``revision abc123 (lrc 0.1.0, source 1a2b3c4d5e6f)``, for messages."""
    if not isinstance(identity, dict) or not any(identity.get(k) for k in ("git_revision", "source_sha256")):
        return "unrecorded code"
    source = (identity.get("source_sha256") or "?")[:12]
    return f"revision {identity.get('git_revision') or 'unknown'} (lrc {identity.get('lrc_version')}, source {source})"


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
        **code_identity(),
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
    if isinstance(extra.get("training"), dict):
        record |= weights_code(extra["training"], code_identity())
    return write_json_atomic(out / SETTINGS_FILE, record)


def weights_code(training: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """The code fields of a training output's settings.json, from its training summary.

    Nothing changes when this code trained the weights. When other code did (``trained_by``,
    oldest first; absent on a reused finished run: unrecorded), ``git_revision``,
    ``lrc_version`` and ``source_sha256`` name that code, several joined by ``+``, and
    ``written_by`` this code, which only wrote the output from those weights.
    """
    trained = training.get("trained_by")
    if trained is None and not training.get("already_done"):
        trained = [current]  # trained here, from the start
    if isinstance(trained, list) and len(trained) == 1 and same_code(trained[0], current):
        return {}
    known = trained if isinstance(trained, list) and trained else [{}]
    fields = {}
    for key in ("git_revision", "lrc_version", "source_sha256"):
        values = [str(c.get(key)) if isinstance(c, dict) and c.get(key) else "unrecorded" for c in known]
        fields[key] = "+".join(dict.fromkeys(values))
    return fields | {"written_by": current}


def is_main_process() -> bool:
    """True on the process that writes outputs; the launcher's RANK, so it may be asked before
    accelerate's state exists (creating that state early breaks a multi-process launch)."""
    return int(os.environ.get("RANK", "0")) == 0


def sha256_file(path: str | Path) -> str:
    """SHA-256 of a file's content (a link: of its target's), read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
