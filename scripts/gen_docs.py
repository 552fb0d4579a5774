#!/usr/bin/env python3
"""Regenerate the README's tables of rules, attacks, datasets and settings from their
declarations (the registries, as ``ps-list`` shows them: ``ps/catalog.py``;
``common.conf.settings``, and ``common.run.commands`` for which settings classes the
commands take).

    python3 scripts/gen_docs.py           # rewrite the generated blocks of README.md
    python3 scripts/gen_docs.py --check   # exit 1 if README.md is stale

A generated block sits between ``<!-- generated: NAME -->`` and ``<!-- end: NAME -->``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common.conf.settings import markdown_table  # noqa: E402
from common.run.commands import COMMANDS, setting_classes  # noqa: E402
from ps.catalog import catalog  # noqa: E402

README = ROOT / "README.md"


def rules_table() -> str:
    rows = ["| `--rule` | definition | needs |", "|---|---|---|"]
    rows += [f"| `{e.name}` | {e.summary} | {e.needs or '–'} |" for e in catalog(["rules"])]
    return "\n".join(rows)


def attacks_table() -> str:
    rows = ["| attack | model | where | what | parameters |", "|---|---|---|---|---|"]
    for e in catalog(["attacks"]):
        params = ", ".join(f"`{o.flag}`" for o in e.options) or "–"
        rows.append(f"| `{e.name}` | {e.details['model']} | {', '.join(e.details['where'])} "
                    f"| {e.summary} | {params} |")
    return "\n".join(rows)


def datasets_table() -> str:
    rows = ["| `--dataset` | input | what |", "|---|---|---|"]
    rows += [f"| `{e.name}` | {'x'.join(map(str, e.details['input']))} | {e.summary} |"
             for e in catalog(["datasets"])]
    return "\n".join(rows)


def settings_table() -> str:
    """Every setting of every command; the classes most commands take first."""
    classes = setting_classes()
    takers = {cls: sum(cls in c.classes() for c in COMMANDS.values()) for cls in classes}
    return markdown_table(sorted(classes, key=lambda cls: -takers[cls]))


BLOCKS = {"rules": rules_table, "attacks": attacks_table, "datasets": datasets_table,
          "settings": settings_table}


def regenerate(text: str) -> str:
    for name, make in BLOCKS.items():
        pattern = re.compile(rf"(<!-- generated: {name} -->\n).*?(<!-- end: {name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"README.md has no generated block {name!r}")
        text = pattern.sub(lambda m, make=make: m.group(1) + make() + "\n" + m.group(2), text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is stale")
    args = parser.parse_args(argv)
    current = README.read_text(encoding="utf-8")
    fresh = regenerate(current)
    if args.check:
        if fresh != current:
            print("README.md is stale: run python3 scripts/gen_docs.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
