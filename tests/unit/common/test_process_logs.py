"""A process's log file: rotated at its size limit, stdout and stderr following it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHILD = """
import logging, os, sys
from pathlib import Path
from common.run.process import setup_logging
log = Path(sys.argv[1])
fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)  # as ps-cluster's children
os.dup2(fd, 1); os.dup2(fd, 2)
setup_logging("node", log_file=log, max_mb=0.01)
for i in range(600):
    logging.getLogger("ps").info("line %d %s", i, "x" * 60)
os.write(2, b"RAW-AFTER-ROTATION\\n")
"""


def test_the_log_rotates_at_its_size_and_raw_output_follows_the_current_file(
        tmp_path: Path) -> None:
    log = tmp_path / "node.log"
    subprocess.run([sys.executable, "-c", CHILD, str(log)], check=True, timeout=60,
                   cwd=Path(__file__).resolve().parents[3])
    files = sorted(tmp_path.glob("node.log*"))
    assert [f.name for f in files] == ["node.log", "node.log.1", "node.log.2"]
    assert all(f.stat().st_size <= 10_100 for f in files)  # 0.01 MB each, a line over
    assert "RAW-AFTER-ROTATION" in log.read_text()  # not lost in a rotated file
    assert "line 599" in log.read_text()
