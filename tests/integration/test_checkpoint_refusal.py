"""A real ``ps-server --resume`` on a checkpoint it did not write, or one that was
altered, exits 2 with one line naming the file and the reason (a supervisor does not
restart exit 2: no crash loop), and leaves the file as it was; on the checkpoint a real
server wrote, it resumes. The keyed servers' checkpoints are written once for the module
(each test alters its own copy). Of what anyone could write where servers run
--insecure, a garbage file and a table of 4e12 values go through real processes; the
other reasons (each unit-tested in ``tests/unit/server/test_checkpoint.py``) through the
server's loading path in this process (``server.node.build_core``), the same error."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from common.conf.settings import SERVER, to_argv
from common.errors import EXIT_CONFIG, EXIT_INTERRUPTED
from common.net.keys import KeyRing
from common.run.config import RunConfig
from ps.launcher.supervise import restartable
from server.checkpoint import (
    Checkpoint,
    CheckpointError,
    checkpoint_path,
    model_size,
    read_run_checkpoint,
    save_checkpoint,
    seal,
)
from server.checkpoint.format import ENTRY, FIXED, LINE_UNKEYED
from server.options import ServerOptions
from tests.integration.conftest import Processes

pytestmark = pytest.mark.integration

CFG = RunConfig(dataset="synthetic", num_workers=2, num_shards=2, rule="marmed",
                rounds=5, seed=3).validate()


def _start(processes: Processes, name: str, out: Path, shard: int, security: list[str],
           *extra: str):
    ready = out / f"{name}.endpoint"
    return processes.start(name, "server.cli", [
        "--shard", str(shard), "--bind", "tcp://127.0.0.1:*", "--ready-file", str(ready),
        "--out-dir", str(out), "--linger", "0", *security, *extra,
        *to_argv(CFG, SERVER)]), ready


def _stopped_server(processes: Processes, name: str, out: Path, shard: int,
                    security: list[str], *extra: str) -> list[str]:
    """Start a server, wait until it listens, stop it (it saves its checkpoint on the
    way out); its log."""
    proc, ready = _start(processes, name, out, shard, security, *extra)
    processes.endpoint(ready, proc)
    proc.signal(signal.SIGTERM)
    assert processes.wait_exit(proc, 60) == EXIT_INTERRUPTED, proc.tail()
    return proc.tail(40)


def _refused(processes: Processes, name: str, out: Path, shard: int, security: list[str],
             reason: str) -> str:
    """``ps-server --resume`` exits 2 with one line naming the checkpoint and
    ``reason``, and no traceback; the checkpoint is left as it was. The line."""
    path = checkpoint_path(out, shard)
    before = path.read_bytes()
    proc, _ = _start(processes, name, out, shard, security, "--resume")
    code = processes.wait_exit(proc, 60)
    log = proc.tail(200)
    assert code == EXIT_CONFIG, log
    assert not restartable(code)  # ps-cluster does not restart it
    lines = [line for line in log if "refused" in line]
    assert len(lines) == 1, log
    assert lines[0].startswith(f"error: checkpoint {path} refused: "), lines[0]
    assert reason in lines[0], lines[0]
    assert not any("Traceback" in line for line in log), log
    assert path.read_bytes() == before
    return lines[0]


def _refused_on_load(out: Path, shard: int, reason: str) -> None:
    """What ``ps-server --resume --insecure`` does with the checkpoint before it
    listens, in this process: the ``CheckpointError`` it exits 2 with (its line, the
    message, naming the checkpoint and ``reason``); the checkpoint is left as it was."""
    from server.node import build_core

    path = checkpoint_path(out, shard)
    before = path.read_bytes()
    options = ServerOptions(shard=str(shard), resume=True)
    with pytest.raises(CheckpointError) as refused:
        build_core(CFG, options, out, np.zeros(model_size(CFG), np.float32))
    line = str(refused.value)
    assert line.startswith(f"checkpoint {path} refused: "), line
    assert reason in line, line
    assert path.read_bytes() == before


@pytest.fixture(scope="module")
def keyed_checkpoints(module_processes: Processes, tmp_path_factory: pytest.TempPathFactory,
                      module_run_keys: Callable[..., list[str]]) -> tuple[Path, Path]:
    """Both servers of a keyed run started and stopped, once for the module: the run
    directory with their checkpoints as they wrote them, and the run's keys. Not to be
    altered: see ``keyed_run``."""
    security = module_run_keys(CFG.num_shards, CFG.num_workers)
    out = tmp_path_factory.mktemp("keyed") / "run"
    for s in range(CFG.num_shards):
        _stopped_server(module_processes, f"first-{s}", out, s, security)
    return out, Path(security[1])


@pytest.fixture
def keyed_run(keyed_checkpoints: tuple[Path, Path], tmp_path: Path) -> tuple[Path, list[str]]:
    """This test's copy of the keyed run (``keyed_checkpoints``): the checkpoints in
    ``tmp_path / "run"``, the keys in ``tmp_path / "keys"``; the --keys flags."""
    run, keys = keyed_checkpoints
    shutil.copytree(run, tmp_path / "run")
    shutil.copytree(keys, tmp_path / "keys")
    return tmp_path / "run", ["--keys", str(tmp_path / "keys")]


def test_a_checkpoint_a_keyed_server_wrote_resumes(processes, keyed_run, tmp_path) -> None:
    out, security = keyed_run
    ring = KeyRing(tmp_path / "keys")
    assert read_run_checkpoint(out, CFG, 1, ring, finite=True).round == 0
    log = _stopped_server(processes, "again-1", out, 1, security, "--resume")
    assert any(f"resumed shards 1 from {out} at round 0" in line for line in log)


def test_a_flipped_byte_is_refused_by_the_mac(processes, keyed_run) -> None:
    out, security = keyed_run
    path = checkpoint_path(out, 1)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x04  # somewhere in the parameters
    path.write_bytes(bytes(data))
    _refused(processes, "flipped", out, 1, security,
             "MAC mismatch: not written with server-1's key")


def test_a_checkpoint_of_another_shards_server_is_refused(processes, keyed_run) -> None:
    out, security = keyed_run
    shutil.copyfile(checkpoint_path(out, 0), checkpoint_path(out, 1))
    _refused(processes, "swapped", out, 1, security, "it holds shard 0, not shard 1")


def test_a_corrupt_or_old_format_file_is_refused(processes, keyed_run) -> None:
    out, security = keyed_run
    path = checkpoint_path(out, 1)
    path.write_bytes(b"PK\x03\x04" + b"\x00" * 100)  # what crashed servers with BadZipFile
    _refused(processes, "corrupt", out, 1, security, "an old-format checkpoint (a plain .npz "
             "with no MAC), which this version does not resume")
    path.write_bytes(b"")
    _refused(processes, "empty", out, 1, security, "the file is empty")


def test_an_unkeyed_checkpoint_is_refused_by_a_keyed_server(processes, keyed_run) -> None:
    out, security = keyed_run
    save_checkpoint(checkpoint_path(out, 1),
                    Checkpoint(1, 0, CFG.config_hash, np.zeros(3, np.float32)), key=None)
    _refused(processes, "unkeyed", out, 1, security, "written without a key")


def _forged(path: Path, arrays: dict[str, int], payload: bytes, round_: int = 2) -> None:
    """What anyone can write where servers run --insecure: a table declaring ``arrays``
    (name: values) over ``payload``, with a valid unkeyed digest."""
    head = LINE_UNKEYED + FIXED.pack(1, round_, CFG.config_hash.encode(), len(arrays))
    head += b"".join(ENTRY.pack(name.encode(), n) for name, n in arrays.items())
    path.write_bytes(head + seal.tag(None, head, [payload]) + payload)


def test_an_insecure_server_refuses_what_anyone_could_write(processes, tmp_path) -> None:
    out = tmp_path / "run"
    insecure = ["--insecure"]
    _stopped_server(processes, "first", out, 1, insecure)
    path = checkpoint_path(out, 1)
    size = read_run_checkpoint(out, CFG, 1, None, finite=True).params.size
    good = {"params": size, "previous": size}
    zeros = np.zeros(2 * size, "<f4").tobytes()
    path.write_bytes(LINE_UNKEYED + b"garbage")
    _refused(processes, "short", out, 1, insecure, "truncated: ")
    _forged(path, {"params": size, "shard": size}, zeros)
    _refused_on_load(out, 1, "unexpected array 'shard'")
    # float64 1e300 (inf as float32): the file holds twice the bytes its table declares
    _forged(path, {"params": size}, np.full(size, 1e300).tobytes())
    _refused_on_load(out, 1, "its header declares (bytes added after")
    _forged(path, good, zeros, round_=CFG.rounds + 1)
    _refused_on_load(out, 1, f"round {CFG.rounds + 1} outside 0..5")
    # a table declaring 4e12 values (16 TB): refused before anything is allocated
    _forged(path, {"params": 4_000_000_000_000}, zeros[:64])
    _refused(processes, "declared", out, 1, insecure,
             f"array 'params' declares 4000000000000 values, expected {size}")
    nan = np.zeros(2 * size, "<f4")
    nan[size + 1] = np.nan
    _forged(path, good, nan.tobytes())
    _refused_on_load(out, 1, "previous holds 1 non-finite value(s)")
