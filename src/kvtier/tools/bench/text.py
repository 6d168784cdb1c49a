"""Deterministic English text for prompts: no data sets, no downloads.

Documents are built from a fixed pool of plain sentences chosen by a seeded RNG, so every
run, machine and process produces the same prompts, and a small chat model answers them
with confident (numerically robust) greedy tokens.
"""

from __future__ import annotations

import random

SUBJECTS = [
    "The city council",
    "A small bakery",
    "The river",
    "Our research team",
    "The old library",
    "The train to the coast",
    "A young engineer",
    "The mountain village",
    "The school choir",
    "The harbor",
    "A local farmer",
    "The museum",
    "The football club",
    "The weather station",
    "A travelling musician",
    "The hospital",
    "The village market",
    "The new bridge",
]
VERBS = [
    "opened",
    "announced",
    "repaired",
    "visited",
    "described",
    "measured",
    "celebrated",
    "planned",
    "protected",
    "studied",
    "painted",
    "welcomed",
    "expanded",
    "recorded",
]
OBJECTS = [
    "a garden for children",
    "the annual spring festival",
    "a collection of rare maps",
    "the water supply of the town",
    "a plan to reduce traffic",
    "three new reading rooms",
    "the history of the region",
    "a concert in the main square",
    "a path along the coast",
    "the temperature every morning",
    "a shelter for wild birds",
    "a course on mathematics",
    "the tallest tree in the park",
    "a bus line to the airport",
    "a festival of local food",
]
TIMES = [
    "last spring",
    "in the early morning",
    "after a long winter",
    "on a rainy Sunday",
    "during the summer holidays",
    "in the autumn of that year",
    "before the election",
    "at the end of the month",
    "two weeks ago",
    "for the first time in ten years",
]
QUESTIONS = [
    "What did the city council do?",
    "Summarize the text in one sentence.",
    "Which event happened first?",
    "Name two places mentioned in the text.",
    "What is the main topic of the text?",
    "Who visited the museum?",
    "Write a short title for this text.",
    "What happened in the early morning?",
    "List three activities described above.",
    "Which group celebrated something?",
]
SYSTEM = (
    "You are a careful assistant. Answer questions about the documents you are given, "
    "quote them when useful, and keep every answer short and precise."
)


def sentence(rng: random.Random) -> str:
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(TIMES)}."


def document(seed: int, sentences: int) -> str:
    """A deterministic paragraph of ``sentences`` sentences."""
    rng = random.Random(seed)
    return " ".join(sentence(rng) for _ in range(sentences))


def question(seed: int) -> str:
    return random.Random(seed).choice(QUESTIONS)
