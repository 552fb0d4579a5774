"""What the system has, from its registries: every rule, pre-aggregator, attack, model and
dataset with its one-line summary, its preconditions and the settings of its options
(flag, ``PS_*`` variable, default, help). ``ps-list`` prints it (``--json`` for
scripts); the registries are the ones every command reads, so whatever registers
itself (a module added to a package) is listed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from common.conf.settings import PROXY, WORKER, Declared, declared

KINDS = ("rules", "pre", "attacks", "models", "datasets")
# where each kind is named
CHOSEN_BY = {"rules": "--rule", "pre": "--pre, a chain such as arc,nnm",
             "attacks": "--worker-attack, --proxy-attack", "models": "--model",
             "datasets": "--dataset"}


@dataclass(frozen=True)
class Option:
    """One setting of an entry's options."""

    flag: str
    env: str
    default: Any
    help: str


@dataclass(frozen=True)
class Entry:
    """One registered thing: how it is named where it is chosen (``flag``), what it is,
    what it needs, and its options."""

    kind: str
    name: str
    flag: str
    summary: str
    needs: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    options: tuple[Option, ...] = ()


def _options(settings: Iterable[Declared]) -> tuple[Option, ...]:
    return tuple(Option(d.flag, d.env, list(d.default) if isinstance(d.default, tuple)
                        else d.default, d.spec.help) for d in settings)


def catalog(kinds: Iterable[str] = KINDS) -> list[Entry]:
    """The entries of ``kinds``, each kind in its registry's order (rules by name)."""
    out: list[Entry] = []
    for kind in kinds:
        out += _ENTRIES[kind]()
    return out


def _rules() -> list[Entry]:
    from common.learn.rules import RULES
    from common.learn.rules.base import option_settings

    return [Entry("rules", name, "--rule", cls.summary, cls.needs,
                  {"stateful": cls.stateful}, _options(option_settings(cls)))
            for name, cls in sorted(RULES.items())]


def _pre() -> list[Entry]:
    from common.learn.rules.base import option_settings
    from common.learn.rules.pre import PRE_AGGREGATORS

    return [Entry("pre", name, "--pre", cls.summary, cls.needs, {},
                  _options(option_settings(cls)))
            for name, cls in PRE_AGGREGATORS.items()]


def _attacks() -> list[Entry]:
    from common.learn.attacks import ATTACKS, ValueAttack

    entries = []
    for name, cls in ATTACKS.items():
        sites = [site for site in (WORKER, PROXY) if site in cls.sites]
        flags = " / ".join(f"--{site}-attack" for site in sites)
        model = "generalized (values)" if issubclass(cls, ValueAttack) else "classic (vectors)"
        entries.append(Entry("attacks", name, flags, cls.summary, "",
                             {"model": model, "where": sites}, _options(declared(cls))))
    return entries


# every model computes where --device says: the CPU, or a GPU (deterministic there); the
# servers aggregate on the CPU
MODEL_DEVICES = ["cpu", "cuda (deterministic)"]


def _models() -> list[Entry]:
    from common.learn.models import MODELS

    return [Entry("models", name, "--model", spec.summary, "", {"devices": MODEL_DEVICES})
            for name, spec in MODELS.items()]


def _datasets() -> list[Entry]:
    from common.learn.data import DATASETS

    return [Entry("datasets", name, "--dataset", spec.summary, "",
                  {"input": list(spec.input_shape), "classes": spec.num_classes})
            for name, spec in DATASETS.items()]


_ENTRIES = {"rules": _rules, "pre": _pre, "attacks": _attacks, "models": _models,
            "datasets": _datasets}


def as_json(entries: Iterable[Entry]) -> list[dict[str, Any]]:
    """The entries as JSON-ready dicts."""
    return [asdict(e) for e in entries]


def as_text(entries: Iterable[Entry]) -> str:
    """The entries for a terminal: one block per kind, one line per entry, its options
    indented under it."""
    lines: list[str] = []
    kind = None
    for e in entries:
        if e.kind != kind:
            kind = e.kind
            lines += ["", f"{kind} ({CHOSEN_BY[kind]})"]
        extra = [f"needs {e.needs}" if e.needs else "",
                 *(_detail(k, v) for k, v in e.details.items())]
        extra_text = f" [{'; '.join(x for x in extra if x)}]" if any(extra) else ""
        lines.append(f"  {e.name:<18} {e.summary}{extra_text}")
        for o in e.options:
            lines.append(f"      {o.flag} ({o.env}, default {o.default}): {o.help}")
    return "\n".join(lines).strip("\n")


def _detail(key: str, value: Any) -> str:
    """One detail as text ("" for a false one; a true one by its name)."""
    if value is True:
        return key
    if value in (False, None, ""):
        return ""
    return f"{key}: {', '.join(map(str, value)) if isinstance(value, list) else value}"
