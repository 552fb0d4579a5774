"""Byzantine attacks: one module each, registered by name (see ``base``).

Value-level (generalized model, at a proxy): gambler, bitflip.  Vector-level (classic
model), by Byzantine workers or at a proxy: gaussian, inf, omniscient, signflip, mimic,
alie, ipm, minmax, minsum; by Byzantine workers only: alie-opt and ipm-opt (searched
against the servers' aggregation, ``optimised``), labelflip (a gradient of flipped
labels) and mimic-adaptive (a memory from round to round, ``mimic_adaptive``).  The
README's attack table lists each with its settings.
"""

# The catalogue: every built-in attack, a module each, which registers it
# when imported (``ps-list`` shows the registry, in the order of their first import).
from common.learn.attacks import (
    alie,
    alie_opt,
    bitflip,
    gambler,
    gaussian,
    inf,
    ipm,
    ipm_opt,
    labelflip,
    mimic,
    mimic_adaptive,
    minmax,
    minsum,
    omniscient,
    optimised,
    signflip,
)
from common.learn.attacks.base import (
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

CATALOGUE = (
    alie, alie_opt, bitflip, gambler, gaussian, inf, ipm, ipm_opt, labelflip, mimic,
    mimic_adaptive, minmax, minsum, omniscient, optimised, signflip,
)

__all__ = ["ATTACKS", "NO_ATTACK", "Attack", "Site", "ValueAttack", "VectorAttack",
           "attack_class", "attack_names", "register_attack"]
