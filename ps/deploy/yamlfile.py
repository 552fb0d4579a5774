"""A generated deployment file: a header of comments, then YAML written by PyYAML.

The generators build each file as plain Python data (dicts, lists, strings, ints) and
hand it to :func:`dump`; a few wrapper types say how a value is to be written where
PyYAML's default would be less readable or less safe for Docker's parsers:

* :class:`Anchored`: a mapping written once with a named anchor (``x-node: &node``)
  and as an alias (``*node``) wherever the same object appears again; with
  :data:`MERGE` as a key (``<<: *node``) a mapping merges it. PyYAML aliases an
  object it meets twice; :class:`Dumper` names the anchor after the mapping (instead
  of ``id001``) and aliases nothing else (a list used twice is written twice);
* :class:`Flow`: a list written on one line (``[ps-server]``), :class:`FlowMap` a
  mapping (``{type: tmpfs, target: /tmp}``);
* :class:`Literal`: a multi-line string written as a literal block (``|``);
* :class:`Quoted`: a string written double-quoted (environment values, which every
  YAML version must read as strings, and text another script greps for);
* :class:`Octal`: an int written in octal (a file mode, ``0400``).

:func:`dump` keeps the keys in the order given, writes no line wider than its
content, indents lists under their key, puts a blank line before each top-level key
and each entry of the ``spaced`` sections (the services), and writes ``comments``
before the keys they name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

MAP_TAG = "tag:yaml.org,2002:map"
SEQ_TAG = "tag:yaml.org,2002:seq"
STR_TAG = "tag:yaml.org,2002:str"
INT_TAG = "tag:yaml.org,2002:int"
MERGE_TAG = "tag:yaml.org,2002:merge"


class Anchored(dict):
    """A mapping written with the anchor ``anchor`` (``&anchor``), and as ``*anchor``
    wherever the same object appears again."""

    def __init__(self, anchor: str, items: Mapping[Any, Any] | Iterable[tuple[Any, Any]] = (),
                 ) -> None:
        super().__init__(items)
        self.anchor = anchor


class Flow(list):
    """A list written on one line: ``[a, b]``."""


class FlowMap(dict):
    """A mapping written on one line: ``{a: 1, b: 2}``."""


class Literal(str):
    """A multi-line string written as a literal block (``|``)."""


class Quoted(str):
    """A string written double-quoted."""


class Octal(int):
    """An int written in octal (``0400``)."""


class _MergeKey:
    """The merge key ``<<``: its value, a mapping (an alias), is merged into the mapping
    that holds it."""

    def __repr__(self) -> str:
        return "MERGE"


MERGE = _MergeKey()


class Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper with named anchors, aliases for :class:`Anchored` mappings
    only, and lists indented under their key."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.anchor_names: dict[yaml.Node, str] = {}

    def ignore_aliases(self, data: Any) -> bool:
        return not isinstance(data, Anchored)

    def generate_anchor(self, node: yaml.Node) -> str:
        return self.anchor_names.get(node) or super().generate_anchor(node)

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        return super().increase_indent(flow, False)


def _anchored(dumper: Dumper, data: Anchored) -> yaml.Node:
    node = dumper.represent_mapping(MAP_TAG, data)
    dumper.anchor_names[node] = data.anchor
    return node


Dumper.add_representer(Anchored, _anchored)
Dumper.add_representer(Flow, lambda d, data: d.represent_sequence(SEQ_TAG, data,
                                                                  flow_style=True))
Dumper.add_representer(FlowMap, lambda d, data: d.represent_mapping(MAP_TAG, data,
                                                                    flow_style=True))
Dumper.add_representer(Literal, lambda d, data: d.represent_scalar(STR_TAG, data, style="|"))
Dumper.add_representer(Quoted, lambda d, data: d.represent_scalar(STR_TAG, data, style='"'))
Dumper.add_representer(Octal, lambda d, data: d.represent_scalar(INT_TAG, f"0{int(data):o}"))
Dumper.add_representer(_MergeKey, lambda d, data: d.represent_scalar(MERGE_TAG, "<<"))

_KEY = re.compile(r"^( *)([^ #\-][^:]*):")


def dump(data: Mapping[str, Any], comments: Mapping[str, Sequence[str]] | None = None,
         spaced: Sequence[str] = ()) -> str:
    """``data`` as YAML text. ``comments``: lines written (as ``# ...``, at the key's
    indentation) before the key they name, a top-level key by its name (``x-run``) and
    a second-level one by its path (``services.keys``); ``spaced``: the top-level keys
    whose entries are set apart by a blank line."""
    comments = comments or {}
    text = yaml.dump(data, Dumper=Dumper, sort_keys=False, default_flow_style=False,
                     width=1 << 20, allow_unicode=True)
    out: list[str] = []
    section = ""
    first = False  # the first entry of a section follows its key without a blank line
    for line in text.splitlines():
        key = _KEY.match(line)
        path = None
        if key and not key.group(1):
            section = path = key.group(2)
            first = True
        elif key and len(key.group(1)) == 2:
            path = f"{section}.{key.group(2)}"
        if path is not None and out and (path == section or (section in spaced
                                                             and not first)):
            out.append("")
        if path is not None and path != section:
            first = False
        indent = key.group(1) if key else ""
        out += [f"{indent}# {c}" if c else f"{indent}#" for c in comments.get(path or "", ())]
        out.append(line)
    return "\n".join(out) + "\n"
