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

The teacher's score against chance decides which tables are worth keeping (docs/real-teacher.md).
"""

from __future__ import annotations

import html.entities
import http
import random
from typing import Any, Callable

from lrc.errors import LRCError

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


def multiple_choice(facts: list[tuple[str, str]], choices: int, rng: random.Random) -> list[dict[str, Any]]:
    """One item per fact: the true answer among ``choices - 1`` other answers of the table."""
    answers = sorted({a for _, a in facts})
    if len(answers) < choices:
        raise LRCError(f"a table with {len(answers)} distinct answers cannot fill {choices} choices")
    items = []
    for (question, true), gold in zip(facts, balanced_golds(len(facts), choices, rng)):
        options = rng.sample([a for a in answers if a != true], choices - 1)
        options.insert(gold, true)
        items.append({"context": question, "choices": options, "gold": gold})
    return items


def knowledge_task(name: str, choices: int, seed: int) -> list[dict[str, Any]]:
    """The items of table ``name`` (every fact it has), shuffled by ``seed``."""
    if name not in TABLES:
        raise LRCError(f"unknown knowledge table {name!r}; choose among {', '.join(TABLES)}")
    rng = random.Random(f"{seed}-{name}")
    facts = TABLES[name]()
    rng.shuffle(facts)
    return multiple_choice(facts, choices, rng)
