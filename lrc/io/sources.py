"""Where `lrc tokenize` reads its records: local files, dataset repositories, mixtures.

A source is a local ``.jsonl``/``.json``/``.txt``/``.parquet`` file, a `datasets` hub id, a
local directory that `datasets` reads like one, or a built-in corpus (:data:`BUILTIN_SOURCES`:
``python-stdlib-docs``, the docstrings of Python's own standard library, on every machine; and
``python-package-docs``, those of packages every install of lrc brings, a second source the
stdlib corpus never sees, for held-out tasks).
A corpus may mix several sources
(``--mixture FILE``, a YAML list of :class:`SourceSpec` entries): :func:`mix` interleaves
their documents so that each source's token count tracks its share, and a row filter
(``filter_field``/``filter_min``) keeps only records scoring at least a threshold.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import json
import os
import sys
import warnings
import zlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterator, Sequence

import yaml

from lrc.errors import LRCError

LOCAL_SUFFIXES = (".jsonl", ".json", ".txt", ".parquet")


def is_local_source(source: str) -> bool:
    if source in BUILTIN_SOURCES:
        return True
    return Path(source).exists() or source.endswith(LOCAL_SUFFIXES) or source.startswith((".", "/", "~"))


def _is_dataset_repo(source: str) -> bool:
    """A hub id, or a local directory that `datasets` reads like one (a clone, or a stand-in)."""
    return source not in BUILTIN_SOURCES and (Path(source).is_dir() or not is_local_source(source))


# ---------------------------------------------------------------------------------------
# A built-in real corpus: Python's standard-library docstrings

# Pure-Python modules with substantial English docstrings, present in every CPython >= 3.10
# build (none of the optional C extensions like ssl/sqlite3/tkinter, none removed by PEP 594,
# none that act on import like `this`). Sorted; the order of the corpus is this order.
STDLIB_DOC_MODULES = tuple(sorted("""
    abc argparse ast asyncio.base_events asyncio.events asyncio.futures asyncio.locks
    asyncio.queues asyncio.streams asyncio.subprocess asyncio.tasks base64 bdb bisect calendar
    cmd code codecs collections colorsys concurrent.futures compileall configparser contextlib
    copy copyreg csv dataclasses datetime difflib dis doctest email.charset email.message
    email.parser email.utils enum filecmp fileinput fnmatch fractions ftplib functools
    getopt getpass gettext glob graphlib gzip hashlib heapq hmac html html.parser http.client
    http.cookiejar http.cookies http.server imaplib importlib importlib.abc importlib.metadata
    importlib.resources inspect io ipaddress json json.decoder json.encoder keyword linecache
    locale logging logging.config logging.handlers mailbox mimetypes modulefinder
    multiprocessing.connection multiprocessing.context multiprocessing.managers
    multiprocessing.pool multiprocessing.process netrc numbers
    operator optparse os pathlib pdb pickle pickletools pkgutil platform plistlib poplib
    posixpath pprint profile pstats py_compile pyclbr pydoc queue quopri random re reprlib
    rlcompleter runpy sched secrets selectors shelve shlex shutil signal site smtplib
    socket socketserver stat statistics string stringprep struct subprocess symtable
    sysconfig tabnanny tarfile tempfile textwrap threading timeit token tokenize trace
    traceback tracemalloc types typing unittest.case unittest.loader unittest.mock
    unittest.result unittest.runner unittest.suite urllib.error urllib.parse
    urllib.request urllib.response urllib.robotparser uuid warnings wave weakref
    webbrowser wsgiref.handlers wsgiref.simple_server wsgiref.util xml.dom.minidom
    xml.dom.pulldom xml.etree.ElementTree xml.sax.handler xml.sax.saxutils xmlrpc.client
    xmlrpc.server zipapp zipfile zipimport
""".split()))
STDLIB_DOCS_LICENSE = "PSF-2.0 (Python Software Foundation License; the docstrings of CPython's standard library)"


def in_valid_split(key: int | str, fraction: float) -> bool:
    """Whether a document (by its index, or by its name where it has one) is held out: a fixed hash,
    so the split is deterministic and needs no second pass over a stream."""
    data = key.encode("utf-8") if isinstance(key, str) else key.to_bytes(8, "little")
    return zlib.crc32(data) / 2**32 < fraction


def import_quietly(name: str) -> Any:
    """The module ``name``, imported with its deprecation warnings silenced (some stdlib modules warn)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(name)


def stdlib_documents(modules: Sequence[str] = STDLIB_DOC_MODULES) -> Iterator[dict]:
    """One document per module: its docstring, then those of its public classes (with their
    methods) and functions, in name order; ``{"name": module, "text": ...}``. A module this
    Python lacks is left out (the manifest records the Python version and the text's hash)."""
    for name in modules:
        try:
            module = import_quietly(name)
        except ImportError:
            continue
        text = "\n\n".join(_module_docstrings(module))
        if text:
            yield {"name": name, "text": text}


def _own_doc(obj: Any) -> str:
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc) if isinstance(doc, str) and doc.strip() else ""


def _module_docstrings(module: Any) -> Iterator[str]:
    for name, doc in documented_objects(module):
        yield doc if name is None else f"{name}\n{doc}"


def documented_objects(module: Any) -> Iterator[tuple[str | None, str]]:
    """(qualified name, docstring) of the module (name None), then of its public classes (with their
    methods) and functions, in name order: what the corpus holds of a module."""
    if doc := _own_doc(module):
        yield None, doc
    for attr, obj in sorted(vars(module).items()):
        if attr.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue  # private, or imported from elsewhere (documented there)
        if isinstance(obj, type):
            if doc := _own_doc(obj):
                yield obj.__qualname__, doc
            for meth_name, meth in sorted(vars(obj).items()):
                if not meth_name.startswith("_") and inspect.isfunction(meth) and (doc := _own_doc(meth)):
                    yield f"{obj.__qualname__}.{meth_name}", doc
        elif inspect.isfunction(obj) and (doc := _own_doc(obj)):
            yield attr, doc


def builtin_source_info(source: str) -> dict | None:
    return dict(_builtin_info(source)) if source in BUILTIN_SOURCES else None


@functools.lru_cache(maxsize=None)
def _builtin_info(source: str) -> dict:
    """What the manifest records about a built-in corpus: its licence, the Python version
    that produced it and the SHA-256 of its text (documents in order)."""
    h = hashlib.sha256()
    docs = 0
    for record in BUILTIN_SOURCES[source]():
        h.update(record["name"].encode() + b"\0" + record["text"].encode() + b"\0")
        docs += 1
    return {"builtin": source, "license": BUILTIN_LICENSES[source], "python": sys.version.split()[0],
            "corpus_documents": docs, "text_sha256": h.hexdigest()}


# Modules of packages that lrc's own install brings (its dependencies and theirs), with large
# English docstrings; the text changes with the installed versions (recorded by the text hash).
PACKAGE_DOC_MODULES = ("datasets.arrow_dataset", "huggingface_hub.hf_api", "jinja2.environment", "matplotlib.pyplot",
                       "numpy.lib.npyio", "numpy.linalg", "safetensors.torch", "scipy.stats._stats_py", "tqdm.std",
                       "yaml")
BUILTIN_SOURCES = {"python-stdlib-docs": stdlib_documents,
                   "python-package-docs": functools.partial(stdlib_documents, PACKAGE_DOC_MODULES)}
BUILTIN_LICENSES = {
    "python-stdlib-docs": STDLIB_DOCS_LICENSE,
    "python-package-docs": "each package's own: datasets, huggingface_hub, safetensors Apache-2.0; Jinja2, NumPy, "
                           "SciPy BSD-3-Clause; Matplotlib the Matplotlib licence (PSF-based); tqdm MPL-2.0 and MIT; "
                           "PyYAML MIT",
}


def iter_records(source: str, *, split: str = "train", dataset_config: str | None = None,
                 revision: str | None = None) -> Iterator[dict]:
    """Records (dicts) from a local .jsonl/.json/.txt/.parquet file or a `datasets` hub id
    (``revision``: a branch, tag or commit of the dataset repository)."""
    if source in BUILTIN_SOURCES:
        if revision is not None:
            raise LRCError(f"source {source}: --revision applies to dataset repositories, not to a built-in corpus")
        yield from BUILTIN_SOURCES[source]()
    elif _is_dataset_repo(source):
        yield from _iter_hub(source, split=split, dataset_config=dataset_config, revision=revision)
    else:
        if revision is not None:
            raise LRCError(f"source {source}: --revision applies to dataset repositories, not to local files")
        yield from _iter_local(Path(source).expanduser())


def _iter_local(path: Path) -> Iterator[dict]:
    if not path.is_file():
        raise LRCError(f"source file not found: {path}")
    if path.suffix not in LOCAL_SUFFIXES:
        raise LRCError(f"source {path}: unsupported file type {path.suffix!r}; use one of {', '.join(LOCAL_SUFFIXES)}")
    try:
        if path.suffix == ".jsonl":
            with open(path, encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            yield json.loads(line)
                        except json.JSONDecodeError as err:
                            raise LRCError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
        elif path.suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, list):
                raise LRCError(f"{path}: a .json source must hold a list of records")
            yield from data
        elif path.suffix == ".txt":
            # Documents are separated by blank lines.
            for doc in path.read_text(encoding="utf-8").split("\n\n"):
                if doc.strip():
                    yield {"text": doc.strip("\n")}
        else:
            import pyarrow.parquet as pq

            for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
                yield from batch.to_pylist()
    except (OSError, UnicodeDecodeError, ValueError) as err:
        if isinstance(err, LRCError):
            raise
        raise LRCError(f"cannot read source file {path}: {err}") from err


def _iter_hub(repo_id: str, *, split: str, dataset_config: str | None, revision: str | None) -> Iterator[dict]:
    import datasets

    try:
        ds = datasets.load_dataset(repo_id, dataset_config, split=split, revision=revision, streaming=True)
        iterator = iter(ds)
        first = next(iterator, None)
    except Exception as err:  # offline, unknown id, bad split or revision: all surface here
        raise LRCError(f"cannot load dataset {repo_id!r} (config {dataset_config!r}, split {split!r}, "
                       f"revision {revision!r}) from the hub: {type(err).__name__}: {err}") from err
    if first is not None:
        yield first
        yield from iterator


def record_field(record: dict, name: str, source: str, option: str = "--text-field") -> Any:
    """``record[name]``; a dotted name reaches into nested records (``metadata.int_score``)."""
    value = record
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            keys = list(value) if isinstance(value, dict) else type(value).__name__
            raise LRCError(f"source {source}: record has no field {name!r} ({part!r} not in {keys}); set {option}")
        value = value[part]
    return value


# ---------------------------------------------------------------------------------------
# Source specifications and mixtures


@dataclass(kw_only=True)
class SourceSpec:
    """One source of a corpus: where to read it, which records to keep, its share of tokens.

    The keys of a mixture file's entries are these field names (the `lrc tokenize` flags)."""

    source: str
    split: str = "train"
    dataset_config: str | None = None
    revision: str | None = None
    text_field: str = "text"
    messages_field: str = "messages"
    # In a mixture: render the conversation with the chat template into one document's text.
    chat: bool = False
    filter_field: str | None = None
    filter_min: float | None = None
    share: float = 1.0

    def check(self, where: str) -> None:
        strings = {"source": False, "split": False, "dataset_config": True, "revision": True,
                   "text_field": False, "messages_field": False, "filter_field": True}
        for name, optional in strings.items():
            value = getattr(self, name)
            if not (isinstance(value, str) and value) and not (optional and value is None):
                raise LRCError(f"{where}: {name} must be a non-empty string, got {value!r}")
        if not isinstance(self.chat, bool):
            raise LRCError(f"{where}: chat must be true or false, got {self.chat!r}")
        for name in ("share", "filter_min"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise LRCError(f"{where}: {name} must be a number, got {value!r}")
        if not self.share > 0:
            raise LRCError(f"{where}: share must be positive, got {self.share}")
        if (self.filter_field is None) != (self.filter_min is None):
            raise LRCError(f"{where}: give filter_field and filter_min together (keep records with field >= min)")
        if self.revision is not None and not _is_dataset_repo(self.source):
            raise LRCError(f"{where}: revision applies to dataset repositories, not to the local file {self.source}")

    def keeps(self, record: dict) -> bool:
        """The row filter: a record passes if its ``filter_field`` is at least ``filter_min``."""
        if self.filter_field is None:
            return True
        value = record_field(record, self.filter_field, self.source, option="--filter-field")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise LRCError(f"source {self.source}: filter field {self.filter_field!r} must be a number, "
                           f"got {type(value).__name__} {value!r}")
        return value >= self.filter_min


def load_mixture(path: str | os.PathLike) -> list[SourceSpec]:
    """The sources of a mixture file: YAML ``sources:`` list of :class:`SourceSpec` entries."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise LRCError(f"cannot read mixture file {path}: {err}") from err
    entries = data.get("sources") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise LRCError(f"mixture file {path}: expected a mapping with a non-empty list 'sources'")
    known = {f.name for f in fields(SourceSpec)}
    specs = []
    for i, entry in enumerate(entries):
        name = entry.get("source") if isinstance(entry, dict) else None
        where = f"mixture file {path}: sources[{i}] ({name or 'no source'})"
        if not isinstance(entry, dict) or not name:
            raise LRCError(f"{where}: each entry must be a mapping with a 'source'")
        unknown = sorted(set(entry) - known)
        if unknown:
            raise LRCError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")
        spec = SourceSpec(**entry)
        spec.check(where)
        specs.append(spec)
    return specs


def mix(streams: Sequence[Iterator[Any]], shares: Sequence[float],
         size: Any = len) -> Iterator[tuple[int, Any]]:
    """Interleave document streams so each one's token count tracks its share.

    The next document always comes from the source furthest below its share (the first
    listed on a tie), so no source is ever more than one document off its target. A source
    that runs out drops out; the others fill the rest (its count shows in the manifest).
    """
    taken = [0] * len(streams)
    live = list(range(len(streams)))
    while live:
        k = min(live, key=lambda j: taken[j] / shares[j])
        item = next(streams[k], None)
        if item is None:
            live.remove(k)
            continue
        taken[k] += size(item)
        yield k, item
