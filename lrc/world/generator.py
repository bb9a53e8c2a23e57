"""A seeded synthetic world: people with attributes and a friend, stated in paraphrases.

Knowledge-heavy on purpose (facts live in MLP weights). Names are short made-up words
that the world's tokenizer learns as single tokens; templates are short. For every
(person, fact) one of the fact's templates is held out of the corpus: the evaluation's
paraphrase tasks ask for the fact in exactly that unseen wording.

Everything is drawn from one ``random.Random(seed)``, so a seed fixes the bytes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# Each fact is a cloze: a template's text before "{v}" is the context, the value follows.
TEMPLATES: dict[str, tuple[str, ...]] = {
    "city": ("{n} lives in {v}.", "{n} is from {v}.", "The home of {n} is {v}."),
    "job": ("{n} works as a {v}.", "{n} is a {v}.", "The job of {n} is {v}."),
    "color": ("{n} likes the color {v}.", "The favorite color of {n} is {v}.", "{n} loves {v}."),
    "pet": ("{n} has a pet {v}.", "The pet of {n} is a {v}.", "{n} owns a {v}."),
    "friend": ("{n} is a friend of {v}.", "The best friend of {n} is {v}.", "{n} often visits {v}."),
}
ATTRIBUTES = ("city", "job", "color", "pet")  # drawn from fixed value sets
FACTS = ATTRIBUTES + ("friend",)  # friend: a relation to another person

JOBS = ("baker", "farmer", "doctor", "teacher", "painter", "sailor", "miner", "singer",
        "tailor", "judge", "cook", "nurse", "pilot", "poet", "smith", "guard")
COLORS = ("red", "blue", "green", "yellow", "black", "white", "pink", "brown", "gray", "purple", "orange", "gold")
PETS = ("cat", "dog", "horse", "goat", "parrot", "rabbit", "snake", "frog", "duck", "mouse", "fox", "owl")

QUESTIONS: dict[str, str] = {
    "city": "Where does {n} live?",
    "job": "What is the job of {n}?",
    "color": "What color does {n} like?",
    "pet": "What pet does {n} have?",
    "friend": "Who is the best friend of {n}?",
}

_ONSETS = "b c d f g h j k l m n p r s t v z br dr gr kr pl tr st".split()
_VOWELS = "a e i o u".split()
_CODAS = ["", "", "n", "r", "l", "s", "k", "m"]


@dataclass(frozen=True)
class WorldSize:
    """How big a world is; the presets below were calibrated (see DESIGN/README)."""

    people: int
    cities: int
    docs_per_person: int  # corpus documents per person (each states all its facts)
    valid_docs_per_person: int
    eval_docs: int  # documents per evaluation task: a seeded sample, or 0 for every question
    vocab_size: int


@dataclass
class Person:
    name: str
    facts: dict[str, str] = field(default_factory=dict)
    heldout: dict[str, int] = field(default_factory=dict)  # fact -> index of its unseen template


@dataclass
class World:
    people: list[Person]
    values: dict[str, tuple[str, ...]]  # fact -> the values it can take

    def seen_templates(self, person: Person, fact: str) -> list[str]:
        return [t for i, t in enumerate(TEMPLATES[fact]) if i != person.heldout[fact]]


def _words(rng: random.Random, count: int, taken: set[str]) -> list[str]:
    """``count`` distinct capitalised made-up words (two syllables), none in ``taken``."""
    out: list[str] = []
    while len(out) < count:
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(2)) + rng.choice(_CODAS)
        word = word.capitalize()
        if word not in taken and 4 <= len(word) <= 7:
            taken.add(word)
            out.append(word)
    return out


def _assign_balanced(people: list[Person], values: dict[str, tuple[str, ...]], rng: random.Random) -> None:
    """Every value held by (almost) equally many people, so a model that knows only how often a
    value occurs, and not who holds it, stays at chance."""
    for fact in ATTRIBUTES:
        pool = [values[fact][i % len(values[fact])] for i in range(len(people))]
        rng.shuffle(pool)
        for person, value in zip(people, pool):
            person.facts[fact] = value


def _hold_out_a_wording(people: list[Person], rng: random.Random) -> None:
    """For every (person, fact) one template that the corpus and the chats never use."""
    for person in people:
        for fact in FACTS:
            person.heldout[fact] = rng.randrange(len(TEMPLATES[fact]))


def build_world(size: WorldSize, seed: int) -> World:
    rng = random.Random(seed)
    taken: set[str] = set()
    names = _words(rng, size.people, taken)
    cities = tuple(_words(rng, size.cities, taken))
    # Never more values than people: a value nobody holds would be a give-away distractor.
    values = {"city": cities, "job": JOBS[:size.people], "color": COLORS[:size.people], "pet": PETS[:size.people],
              "friend": tuple(names)}
    people = [Person(name) for name in names]
    _assign_balanced(people, values, rng)
    # Friends: one random cycle through everybody, so each person is exactly one person's friend.
    order = list(range(len(people)))
    rng.shuffle(order)
    for k, i in enumerate(order):
        people[i].facts["friend"] = names[order[(k + 1) % len(order)]]
    _hold_out_a_wording(people, rng)
    return World(people, values)


def sft_people(world: World, count: int, rng: random.Random) -> list[Person]:
    """People who exist only in the SFT chats: new names, facts drawn from the world's value sets,
    friends among themselves. The chats teach the question/answer format without re-teaching a
    fact the evaluation asks about (the tasks ask only about ``world.people``)."""
    taken = {p.name for p in world.people} | set(world.values["city"])
    names = _words(rng, count, taken)
    people = [Person(name) for name in names]
    _assign_balanced(people, world.values, rng)
    for k, person in enumerate(people):
        person.facts["friend"] = names[(k + 1) % count]
    _hold_out_a_wording(people, rng)
    return people


def sentence(template: str, person: Person, fact: str) -> str:
    return template.format(n=person.name, v=person.facts[fact])


def corpus_documents(world: World, docs_per_person: int, rng: random.Random) -> list[str]:
    """Short biographies: every fact of one person, each in a seen template, shuffled."""
    docs = []
    for _ in range(docs_per_person):
        for person in world.people:
            lines = [sentence(rng.choice(world.seen_templates(person, f)), person, f) for f in FACTS]
            rng.shuffle(lines)
            docs.append(" ".join(lines))
    rng.shuffle(docs)
    return docs


def sft_conversations(world: World, people: list[Person], rng: random.Random) -> list[list[dict[str, str]]]:
    """One to three question/answer turns about one person per conversation, the answer a sentence
    in one of the person's seen wordings (never its held-out one)."""
    convs = []
    for person in people:
        facts = list(FACTS)
        rng.shuffle(facts)
        turns = facts[: rng.randint(1, 3)]
        messages = []
        for fact in turns:
            messages.append({"role": "user", "content": QUESTIONS[fact].format(n=person.name)})
            answer = sentence(rng.choice(world.seen_templates(person, fact)), person, fact)
            messages.append({"role": "assistant", "content": answer})
        convs.append(messages)
    return convs
