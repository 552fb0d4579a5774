"""Byzantine attacks: one module each, registered by name (see ``base``).

Value-level (generalized model, at a proxy): gambler, bitflip.  Vector-level (classic
model), by Byzantine workers or at a proxy: gaussian, inf, omniscient, signflip, mimic,
alie, ipm, minmax, minsum; by Byzantine workers only: alie-opt and ipm-opt (searched
against the servers' aggregation, ``optimised``) and labelflip (a gradient of flipped
labels).  The README's attack table lists each with its settings.
"""

from common.attacks.base import (
    ATTACKS,
    NO_ATTACK,
    Attack,
    Site,
    ValueAttack,
    VectorAttack,
    attack_class,
    attack_names,
    register_attack,
)
from common.registry import import_modules

import_modules(__name__, __path__, skip={"base"})

__all__ = ["ATTACKS", "NO_ATTACK", "Attack", "Site", "ValueAttack", "VectorAttack",
           "attack_class", "attack_names", "register_attack"]
