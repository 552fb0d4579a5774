"""The docker-compose deployment.

* ``test_compose_file_matches_env_file`` (fast, always runs): the committed
  ``docker-compose.yml`` is what ``docker/gen_compose.py`` makes of
  ``docker/cluster.env``, so n and S cannot drift apart from the run config.
* ``test_compose_smoke`` (``-m e2e``; needs Docker, minutes): runs
  ``scripts/compose_smoke.sh``, which builds the image, trains the gambler
  experiment's cluster (``docker/experiments/gambler.env``) and checks accuracy
  and corruption.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_matches_env_file() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "docker" / "gen_compose.py"), "--check"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr


def test_empty_proxy_shards_means_no_proxy(tmp_path: Path) -> None:
    """``--proxy-shards ''`` (docs/docker.md: no proxy) drops the proxy even though the
    gambler experiment names a proxy attack: every worker talks to every server."""
    out = tmp_path / "compose.yml"
    done = subprocess.run(
        [sys.executable, str(ROOT / "docker" / "gen_compose.py"), "--experiment",
         "docker/experiments/gambler.env", "--proxy-shards", "", "-o", str(out)],
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "proxy-0:" not in text and "tcp://proxy-0" not in text
    assert "PS_PROXY_ATTACK: \"gambler\"" not in text and "tcp://server-0:5550" in text


@pytest.mark.e2e
@pytest.mark.timeout(1800)
def test_compose_smoke() -> None:
    if shutil.which("docker") is None and os.environ.get("PS_COMPOSE_ALLOW_SKIP") == "1":
        pytest.skip("no docker command")
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "compose_smoke.sh")],
        cwd=ROOT, capture_output=True, text=True, timeout=1700, check=False,
    )
    output = done.stdout + done.stderr
    if "SKIPPED compose smoke" in done.stdout:
        pytest.skip(done.stdout.strip().splitlines()[0])
    assert done.returncode == 0, output[-6000:]
    assert "PASSED compose smoke" in done.stdout, output[-6000:]
