"""Multiple-choice knowledge tables from Python's standard library, offline on every machine.

Each table is a list of (question, answer) facts; a task item asks the question and offers the
true answer among ``choices - 1`` answers of other facts of the same table. The gold positions
are balanced (each position equally often, up to one) and the order is seeded.

- ``http_status``: an HTTP status code -> its reason phrase (``http.HTTPStatus``, 62 codes in
  Python 3.11). Licence: the codes and phrases are the IANA registry's (public).
- ``html_entity``: an HTML 4 named character reference -> its character
  (``html.entities.name2codepoint``, 252 names). Licence: the W3C's entity list (public).
- ``time_zone``: a city of the IANA time-zone database -> its region ("Paris" -> "Europe";
  ``zoneinfo``, canonical ``Region/City`` names only). Licence: the tz database (public domain).

And ``docstring_name``: the first line of a documented function's, class's or method's docstring
-> its name, against names from the same module, from modules the corpus holds out (the
stdlib-docstring corpus's valid split, or any importable modules named). Items whose first line
contains the name itself are left out. Licence: that of the modules (PSF-2.0 for the stdlib).

And ``code_next_line``: a module's source, ``CONTEXT_LINES`` lines as context and the true next line
against other lines of the same file, one item every ``stride`` lines, from the same held-out modules.

The teacher's score against chance decides which tables are worth keeping (docs/real-teacher.md).
"""

from __future__ import annotations

import html.entities
import http
import inspect
import random
from typing import Any, Callable, Sequence

from lrc.errors import LRCError
from lrc.io.sources import STDLIB_DOC_MODULES, documented_objects, import_quietly, in_valid_split

TZ_REGIONS = ("Africa", "America", "Antarctica", "Asia", "Atlantic", "Australia", "Europe", "Indian", "Pacific")


def http_status_facts() -> list[tuple[str, str]]:
    return [(f"HTTP status code {s.value} means", f" {s.phrase}") for s in http.HTTPStatus]


def html_entity_facts() -> list[tuple[str, str]]:
    return [(f"In HTML, the character reference &{name}; stands for the character", f" {chr(code)}")
            for name, code in sorted(html.entities.name2codepoint.items())]


def time_zone_facts() -> list[tuple[str, str]]:
    """(city, region) of every canonical ``Region/City`` zone; cities named in two regions are left out."""
    import zoneinfo

    zones = zoneinfo.available_timezones()
    if not zones:
        raise LRCError("time_zone: this Python finds no time-zone database (install the tzdata package)")
    regions: dict[str, set[str]] = {}
    for zone in zones:
        region, _, city = zone.partition("/")
        if region in TZ_REGIONS and city:
            regions.setdefault(city.rsplit("/", 1)[-1].replace("_", " "), set()).add(region)
    return [(f"The time zone of the city of {city} lies in the region", f" {next(iter(r))}")
            for city, r in sorted(regions.items()) if len(r) == 1]


TABLES: dict[str, Callable[[], list[tuple[str, str]]]] = {
    "http_status": http_status_facts,
    "html_entity": html_entity_facts,
    "time_zone": time_zone_facts,
}


def balanced_golds(count: int, choices: int, rng: random.Random) -> list[int]:
    """``count`` gold positions, each of ``range(choices)`` equally often (up to one), in seeded order."""
    golds = [i % choices for i in range(count)]
    rng.shuffle(golds)
    return golds


def item(context: str, true: str, pool: Sequence[str], gold: int, choices: int, rng: random.Random) -> dict[str, Any]:
    """An lm-eval item: ``true`` at position ``gold`` among ``choices - 1`` other answers drawn from ``pool``."""
    options = rng.sample([a for a in pool if a != true], choices - 1)
    options.insert(gold, true)
    return {"context": context, "choices": options, "gold": gold}


def multiple_choice(facts: list[tuple[str, str]], choices: int, rng: random.Random) -> list[dict[str, Any]]:
    """One item per fact: the true answer among ``choices - 1`` other answers of the table."""
    answers = sorted({a for _, a in facts})
    if len(answers) < choices:
        raise LRCError(f"a table with {len(answers)} distinct answers cannot fill {choices} choices")
    return [item(question, true, answers, gold, choices, rng)
            for (question, true), gold in zip(facts, balanced_golds(len(facts), choices, rng))]


def knowledge_task(name: str, choices: int, seed: int) -> list[dict[str, Any]]:
    """The items of table ``name`` (every fact it has), shuffled by ``seed``."""
    if name not in TABLES:
        raise LRCError(f"unknown knowledge table {name!r}; choose among {', '.join(TABLES)}")
    rng = random.Random(f"{seed}-{name}")
    facts = TABLES[name]()
    rng.shuffle(facts)
    return multiple_choice(facts, choices, rng)


def heldout_stdlib_modules(valid_fraction: float) -> list[str]:
    """The modules of the stdlib-docstring corpus that its valid split holds out at ``valid_fraction``."""
    return [m for m in STDLIB_DOC_MODULES if in_valid_split(m, valid_fraction)]


def docstring_facts(module_name: str) -> list[tuple[str, str]]:
    """(question, " name") for each documented object of a module whose docstring's first line does
    not give its name away."""
    module = _import(module_name, "docstring_name")
    facts = []
    for name, doc in documented_objects(module):
        first = doc.splitlines()[0].strip()
        if name is None or len(first.split()) < 3 or name.rsplit(".", 1)[-1].lower() in first.lower():
            continue
        facts.append((f'In Python\'s {module_name} module, the object documented as "{first}" is named', f" {name}"))
    return facts


def docstring_name_task(modules: Sequence[str], choices: int, seed: int) -> list[dict[str, Any]]:
    """One item per documented object of ``modules``, its name against names of the same module
    (modules with fewer names than ``choices`` give none)."""
    rng = random.Random(f"{seed}-docstring_name")
    facts: list[tuple[str, str, list[str]]] = []
    for module in modules:
        own = docstring_facts(module)
        names = sorted({a for _, a in own})
        if len(names) >= choices:
            facts += [(q, a, names) for q, a in own]
    if not facts:
        raise LRCError(f"docstring_name: no module of {', '.join(modules) or 'none'} documents {choices} objects")
    rng.shuffle(facts)
    return [item(question, true, names, gold, choices, rng)
            for (question, true, names), gold in zip(facts, balanced_golds(len(facts), choices, rng))]


CONTEXT_LINES = 8
MIN_LINE_CHARS = 12  # a next line worth predicting: not a bracket, a blank or a lone keyword


def _import(module_name: str, task: str) -> Any:
    try:
        return import_quietly(module_name)
    except ImportError as err:
        raise LRCError(f"{task}: cannot import module {module_name!r} ({err})") from err


def code_next_line_task(modules: Sequence[str], choices: int, seed: int, stride: int = 8,
                        items: int | None = None) -> list[dict[str, Any]]:
    """One item every ``stride`` lines of each module's source (at most ``items``, drawn at random): the
    ``CONTEXT_LINES`` lines before a line of at least ``MIN_LINE_CHARS`` characters, that line against
    other such lines of the file."""
    rng = random.Random(f"{seed}-code_next_line")
    facts: list[tuple[str, str, list[str]]] = []
    for name in modules:
        try:
            lines = inspect.getsource(_import(name, "code_next_line")).splitlines()
        except (OSError, TypeError) as err:
            raise LRCError(f"code_next_line: no Python source for module {name!r} ({err})") from err
        candidates = sorted({ln for ln in lines if len(ln.strip()) >= MIN_LINE_CHARS})
        if len(candidates) < choices:
            continue  # too short a file to offer distractors
        for i in range(CONTEXT_LINES, len(lines), stride):
            if len(lines[i].strip()) >= MIN_LINE_CHARS:
                facts.append(("\n".join(lines[i - CONTEXT_LINES:i]) + "\n", lines[i], candidates))
    if not facts:
        raise LRCError(f"code_next_line: no line to ask about in {', '.join(modules) or 'no module'}")
    rng.shuffle(facts)
    facts = facts[:items]
    return [item(context, true, candidates, gold, choices, rng)
            for (context, true, candidates), gold in zip(facts, balanced_golds(len(facts), choices, rng))]
