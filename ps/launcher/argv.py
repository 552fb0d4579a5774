"""The flags ``ps-cluster`` hands a child: the settings of the command that serves the
child's role (``common.run.commands``), derived from their declarations."""

from __future__ import annotations

from typing import Any

from common.conf.settings import to_argv
from common.run.commands import command_of


def child_argv(role: str, *settings: Any) -> list[str]:
    """The flags that hand a ``role`` process every setting of ``settings`` it takes;
    ``TypeError`` for settings its command does not take."""
    handed = command_of(role).handed(settings)
    return [flag for instance in handed for flag in to_argv(instance, role)]
