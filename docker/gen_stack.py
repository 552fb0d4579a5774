#!/usr/bin/env python3
"""Write ``docker/stack.yml`` (a Docker Swarm stack) from ``docker/cluster.env``.

See ``ps/deploy/stack.py`` and docs/deploy.md.

Run from a checkout, installed or not: ``python3 docker/gen_stack.py [--check] ...``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ps.deploy.stack import main

if __name__ == "__main__":
    sys.exit(main())
