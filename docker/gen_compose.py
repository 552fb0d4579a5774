#!/usr/bin/env python3
"""Write ``docker-compose.yml`` from ``docker/cluster.env`` (see ``ps/deploy/compose.py``).

Run from a checkout, installed or not: ``python3 docker/gen_compose.py [--check] ...``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ps.deploy.compose import main

if __name__ == "__main__":
    sys.exit(main())
