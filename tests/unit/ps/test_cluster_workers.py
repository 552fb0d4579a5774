"""A cluster that starts only some of its workers (``Cluster(spec, workers=...)``), one
process each: the test bed of ``ps.chaos``, whose attackers hold the other workers' keys.
Its worker processes, their flags, and what its supervisor may lose, on fake processes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from common.errors import ConfigError
from common.run.config import AttackConfig, RunConfig
from ps.launcher.cluster import Cluster, ClusterSpec
from ps.launcher.options import ClusterOptions
from ps.launcher.supervise import ProcessFailed
from server.options import ServerOptions

CFG = RunConfig(dataset="synthetic", num_workers=10, num_shards=2, q=4, rounds=5).validate()
ENDPOINTS = ["tcp://a:1", "tcp://b:2"]


@dataclass
class FakeProcess:
    """A child that has exited with ``returncode`` (None: still running)."""

    name: str
    returncode: int | None = None

    @property
    def running(self) -> bool:
        return self.returncode is None

    def signal(self, signum: int) -> None:
        pass

    def tail(self) -> list[str]:
        return []


def spec(tmp_path: Path, quorum: int, attack: AttackConfig | None = None) -> ClusterSpec:
    return ClusterSpec(cfg=CFG, attack=attack or AttackConfig().validate(CFG),
                       out_dir=tmp_path,
                       cluster=ClusterOptions(worker_processes=2,  # ignored: one each
                                              max_restarts=0),
                       server=ServerOptions(round_timeout="0.3", quorum=quorum))


def started(cluster: Cluster) -> dict[str, FakeProcess]:
    """The children the cluster would start, as fakes in its supervised list."""
    names = [f"server-{k}" for k in cluster.blocks]
    names += [f"worker-{first}" for first in cluster.teams]
    fakes = {n: FakeProcess(n) for n in names}
    cluster.processes[:] = fakes.values()  # type: ignore[assignment]  # (fakes)
    return fakes


def test_only_the_named_workers_start_one_process_each(tmp_path: Path) -> None:
    attack = AttackConfig.build(worker_attack="alie", byzantine_workers=(5,)).validate(CFG)
    cluster = Cluster(spec(tmp_path, quorum=6, attack=attack), workers=range(6))
    assert cluster.teams == {i: (i,) for i in range(6)}
    for i in range(6):
        argv = cluster.worker_argv(cluster.teams[i], ENDPOINTS)
        assert argv[argv.index("--worker-id") + 1] == str(i)
        # a started worker that the attack names still gets the attack's flags
        assert ("--worker-attack" in argv) == (i == 5)
    # the default: every worker, in the processes of --worker-processes
    assert Cluster(spec(tmp_path, quorum=6)).teams == {0: (0, 1, 2, 3, 4),
                                                       5: (5, 6, 7, 8, 9)}


def test_with_a_quorum_of_all_those_started_none_may_be_lost(tmp_path: Path) -> None:
    cluster = Cluster(spec(tmp_path, quorum=6), workers=range(6))
    started(cluster)["worker-3"].returncode = -9
    with pytest.raises(ProcessFailed, match="worker-3"):
        cluster.supervisor.check()


def test_the_spares_are_those_started_beyond_the_quorum(tmp_path: Path) -> None:
    """Workers 0..6 started, quorum 6: one may go (not the three never started)."""
    cluster = Cluster(spec(tmp_path, quorum=6), workers=[6, 0, 1, 2, 3, 4, 5])
    assert list(cluster.teams) == list(range(7))
    fakes = started(cluster)
    fakes["worker-6"].returncode = -9
    cluster.supervisor.check()
    assert cluster.supervisor.lost == ["worker-6"]
    fakes["worker-0"].returncode = -9
    with pytest.raises(ProcessFailed, match="worker-0"):
        cluster.supervisor.check()


@pytest.mark.parametrize("workers", [[], [0, 0], [10], [-1]])
def test_no_worker_a_repeated_one_or_one_outside_the_run_is_refused(
        tmp_path: Path, workers: list[int]) -> None:
    with pytest.raises(ConfigError, match=r"distinct ids in 0\.\.9"):
        Cluster(spec(tmp_path, quorum=6), workers=workers)
