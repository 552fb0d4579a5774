"""Moved to ``common.commands`` (this name stays until ``ps/deploy`` imports it from there)."""

from common.commands import COMMANDS, DEPLOYED, command_of, setting_classes

__all__ = ["COMMANDS", "DEPLOYED", "command_of", "setting_classes"]
