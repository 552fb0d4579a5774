"""Chaos: an honest keyed cluster trains while insiders holding the keys of its Byzantine
workers (and the evaluator's) attack one server and one proxy; what does each node pay?
The run is ``ps.chaos`` (its docstring explains it; its command: ``ps.chaos.cli.chaos``).

    python3 scripts/chaos.py                    # 100,000 frames of each class per target
    python3 scripts/chaos.py --frames 2000      # a quick look
    python3 scripts/chaos.py --help             # the options
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ps.chaos.cli import chaos

if __name__ == "__main__":
    chaos()
