"""Faults on a schedule: a worker, the proxy and a server SIGKILLed during one supervised
cluster run; does it finish bit-identical to the reference engine's replay? The run is
``ps.chaos.faults`` (its command: ``ps.chaos.cli.faults``).

    python3 scripts/chaos_faults.py                 # 8 workers, 4 servers, 300 rounds
    python3 scripts/chaos_faults.py --rounds 120    # quicker
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ps.chaos.cli import faults

if __name__ == "__main__":
    faults()
