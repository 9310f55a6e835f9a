"""The README's table of the house ("What is here") names every room of gateway/, and nothing that is not there.

Every package under gateway/ and every module directly in it is named in the table's path column, and every path
the table names (in either column, in backticks) exists. A name without a directory is read as the row's
neighbour: in the path column beside the row's first path (`gateway/ledger/`, `state/` is gateway/state/), in the
description inside the row's directory (`asgi.py` on gateway/http/'s row), else beside it or from the top of the
checkout. Read from the source; the positive controls plant a package the table leaves out and a path that does
not exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TICKED = re.compile(r"`([^`]+)`")
# what a backticked token must look like to be a path: no spaces or placeholders, a directory or a file's suffix
PATHLIKE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_./-]*(/|\.(py|md|yaml|yml|json|toml|txt|csv|png))")


def table(readme: str) -> list[tuple[str, str]]:
    """The rows of the section "What is here": (path column, description), the header rows left out."""
    section = readme.split("\n## What is here\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 2 and cells[0] not in ("path", "---"):
            rows.append((cells[0], "|".join(cells[1:])))
    return rows


def paths(cell: str) -> list[str]:
    return [t for t in TICKED.findall(cell) if PATHLIKE.fullmatch(t)]


def resolve(name: str, bases: list[str], root: Path) -> str:
    """``name`` as a path from the checkout's top: itself when it has a directory, else the first of ``bases``
    (then the top) that holds it; as first tried when none does."""
    if "/" in name.rstrip("/"):
        return name
    for base in [*bases, ""]:
        if (root / base / name).exists():
            return base + name
    return bases[0] + name if bases else name


def named(rows: list[tuple[str, str]], root: Path) -> tuple[set[str], set[str]]:
    """(the paths the path column names, every path the table names), each from the checkout's top."""
    column: set[str] = set()
    everything: set[str] = set()
    for first_cell, description in rows:
        listed = paths(first_cell)
        if not listed:
            continue
        first = listed[0]
        parent = first.rstrip("/").rpartition("/")[0]
        parent = parent + "/" if parent else ""
        home = first if first.endswith("/") else parent  # the row's directory
        for name in listed:
            column.add(resolve(name, [parent], root))
        for name in paths(description):
            everything.add(resolve(name, [home, parent] if home != parent else [home], root))
    return column, everything | column


def house(root: Path) -> set[str]:
    """Every package directly under gateway/ (``gateway/cache/``) and every module directly in it
    (``gateway/pipeline.py``), its __init__ aside."""
    gateway = root / "gateway"
    packages = {f"gateway/{p.parent.name}/" for p in gateway.glob("*/__init__.py")}
    modules = {f"gateway/{p.name}" for p in gateway.glob("*.py") if p.name != "__init__.py"}
    return packages | modules


def unnamed(column: set[str], rooms: set[str]) -> list[str]:
    return sorted(rooms - column)


def missing(everything: set[str], root: Path) -> list[str]:
    return sorted(p for p in everything if not (root / p).exists())


def test_the_table_names_every_package_and_module_of_the_gateway() -> None:
    column, _ = named(table(README.read_text()), ROOT)
    assert unnamed(column, house(ROOT)) == []
    assert {"gateway/finance/", "gateway/keys/", "gateway/tags.py", "gateway/processes.py"} <= column


def test_every_path_the_table_names_exists() -> None:
    _, everything = named(table(README.read_text()), ROOT)
    assert len(everything) > 30, "the table is read (a parse that finds nothing would pass)"
    assert {"gateway/http/asgi.py", "gateway/state/", "gateway/fleet/observe.py"} <= everything, \
        "names without a directory are read beside their row's"
    assert missing(everything, ROOT) == []


def test_a_planted_package_left_out_and_a_path_that_is_not_there_are_caught(tmp_path: Path) -> None:
    """Positive controls: a package the table does not name, and a row naming what does not exist."""
    for name in ("gateway/planted", "gateway/keys"):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "__init__.py").write_text("")
    (tmp_path / "gateway" / "tags.py").write_text("")
    (tmp_path / "gateway" / "keys" / "store.py").write_text("")
    readme = ("# x\n\n## What is here\n\n| path | what |\n|---|---|\n"
              "| `gateway/keys/`, `tags.py` | keys (`store.py`), tags |\n"
              "| `gateway/gone/` | a room that was moved (`gone.py`) |\n\n## Next\n\n| `gateway/planted/` | no |\n")
    column, everything = named(table(readme), tmp_path)
    assert column == {"gateway/keys/", "gateway/tags.py", "gateway/gone/"}
    assert unnamed(column, house(tmp_path)) == ["gateway/planted/"], "a row after the section does not count"
    assert "gateway/keys/store.py" in everything
    assert missing(everything, tmp_path) == ["gateway/gone/", "gateway/gone/gone.py"]
