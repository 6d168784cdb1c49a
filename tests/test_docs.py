"""The user docs against the code: the option reference cannot drift from the typed config,
every option is documented, the README stays short, links resolve, no development history."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path

import pytest

from kvtier.config import KVTierConfig
from kvtier.contract import SlotStore
from kvtier.contract.spec import TierSpec
from kvtier.stack.registry import builtin_tier_kinds, tier_kind

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]


def generator():
    spec = importlib.util.spec_from_file_location(
        "gen_config_docs", ROOT / "scripts" / "gen_config_docs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations there
    spec.loader.exec_module(module)
    return module


def test_option_reference_is_generated_from_the_config():
    gen = generator()
    text = (DOCS / "configuration.md").read_text()
    assert gen.generated_section(text) == gen.render(), (
        f"docs/configuration.md is out of date with the typed config: run {gen.COMMAND}"
    )


OPTION_CLASSES = [
    KVTierConfig,
    TierSpec,
    # Sorted: parallel test workers must collect the same ids in the same order.
    *sorted({tier_kind(k).options for k in builtin_tier_kinds()}, key=lambda c: c.__name__),
]


@pytest.mark.parametrize("cls", OPTION_CLASSES, ids=lambda c: c.__name__)
def test_every_option_is_documented(cls):
    text = (DOCS / "configuration.md").read_text()
    fields = [
        f.name for f in dataclasses.fields(cls) if not (cls is TierSpec and f.name == "options")
    ]
    missing = [name for name in fields if f"#### `{name}`" not in text]
    assert not missing, f"{cls.__name__} options missing from docs/configuration.md: {missing}"


def test_an_option_without_a_docstring_is_refused():
    gen = generator()

    @dataclasses.dataclass
    class Undocumented:
        documented: int = 1
        """Has one."""
        bare: int = 2

    with pytest.raises(SystemExit, match=r"Undocumented\.bare has no docstring"):
        gen.options(Undocumented, {}, "")


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 200, f"README.md has {lines} lines; move detail into docs/"


LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """Heading anchors as GitHub and mkdocs make them, plus explicit ``<a id>``s."""
    text = page.read_text()
    out = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#+ (.+)$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_existing_files(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        path, _, anchor = target.partition("#")
        if re.match(r"^[a-z]+:", path):
            continue  # a URL
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists() or (
            anchor and resolved.suffix == ".md" and anchor not in anchors(resolved)
        ):
            broken.append(target)
    assert not broken, f"{page.name}: links to missing files or anchors {broken}"


HISTORY = re.compile(
    r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|this|last|"
    r"earlier|previous|next) (session|round of work)s?\b",
    re.IGNORECASE,
)


@pytest.mark.parametrize(
    "page", [p for p in PAGES if p.name != "CHANGELOG.md"], ids=lambda p: p.name
)
def test_docs_carry_no_development_history(page):
    found = HISTORY.findall(page.read_text())
    assert not found, f"{page.name}: development history belongs in CHANGELOG.md: {found}"


def test_the_tier_contract_section_names_every_store_member():
    """docs/tiers.md's contract section lists all a store declares, the optional copy
    paths included: a new medium's author finds the whole contract there."""
    text = (DOCS / "tiers.md").read_text()
    section = text[text.index("## The tier contract") : text.index("## Faults")]
    members = {n for n in vars(SlotStore) if not n.startswith("_")}
    members |= set(SlotStore.__annotations__)
    missing = sorted(n for n in members if f"`{n}" not in section)
    assert not missing, f"docs/tiers.md, the tier contract: not named {missing}"
    assert "host_payload" in members and "read" in members  # the check sees members
