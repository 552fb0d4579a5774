"""Things by name (rules, pre-aggregators, attacks, datasets, models), each registered
from the module that defines it.

A :class:`Registry` maps names to the registered things in registration order. A
module adds its own with :meth:`Registry.register` (a class decorator, or a call), and
its package's ``__init__`` imports it by name in its ``CATALOGUE``, the one list of the
package's members: adding a rule, an attack or a dataset is adding a file and naming
it there. A name is registered once; looking up an unknown name raises the registry's
error listing the known ones.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, Generic, Protocol, TypeVar


class Named(Protocol):
    """What a registry holds: anything with a ``name`` (a class attribute of a class)."""

    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Named)


class Registry(Mapping[str, T], Generic[T]):
    """The registered ``what`` (e.g. "rule") by their ``name`` attribute; an unknown name
    looked up raises ``error`` naming the known ones; ``reserved`` names are refused, and
    ``check`` may refuse an item (raising) before it is registered."""

    def __init__(self, what: str, error: type[Exception], reserved: Collection[str] = (),
                 check: Callable[[T], None] | None = None) -> None:
        self.what = what
        self.error = error
        self.reserved = frozenset(reserved)
        self.check = check
        self._items: dict[str, T] = {}

    def register(self, item: T) -> T:
        """Add ``item`` under ``item.name`` (after the registry's ``check`` of it) and
        return it: a class decorator, or a call. ``ValueError`` if the name is taken or
        reserved."""
        return self.add(item.name, item)

    def add(self, name: str, item: T) -> T:
        """Add ``item`` under ``name`` (a plugin's dotted path or entry-point name: its
        own ``name`` stays what its messages say), after the registry's ``check``."""
        if name in self._items or name in self.reserved:
            raise ValueError(f"{self.what} name {name!r} is taken")
        if self.check is not None:
            self.check(item)
        self._items[name] = item
        return item

    def __getitem__(self, name: str) -> T:
        item = self._items.get(name) if isinstance(name, str) else None
        if item is None:
            raise self.error(f"unknown {self.what} {name!r}; valid: {', '.join(self._items)}")
        return item

    def __delitem__(self, name: str) -> None:
        """Remove ``name`` (tests register throw-away entries)."""
        del self._items[name]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def get(self, name: str, default: Any = None) -> Any:
        return self._items.get(name, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {', '.join(self._items)})"
