"""TensorBoard event files (the optional extra ``byzps[tensorboard]``): a run's metrics
files become scalars by round, followed as they grow; ps-simulate and an experiment
grid write them; without the extra nothing is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import (
    EventAccumulator,
)

from ps.plots import tensorboard
from ps.plots.tensorboard import RunEvents, run_events


def _scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}


def _append(path: Path, *records: dict, partial: str = "") -> None:
    with path.open("a", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
        f.write(partial)


def test_a_runs_metrics_become_scalars_by_round_as_they_grow(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    _append(run / "evaluator.jsonl", {"round": 0, "top1": 0.1, "top3": 0.3, "loss": 2.3})
    _append(run / "worker-3.jsonl", {"round": 0, "loss": 2.2, "compute_ms": 1.5,
                                     "exchange_ms": 4.0})
    _append(run / "server-1.jsonl", {"round": 0, "lr": 0.1, "aggregation_ms": 0.4,
                                     "nonfinite_values": 0, "missing": [2]})
    _append(run / "proxy-0.jsonl", {"round": 0, "corrupted_values": 57},
            partial='{"round": 1, "corrupted')  # a line still being written
    events = RunEvents(run, every=1)
    events.update(restarts=0)
    _append(run / "evaluator.jsonl", {"round": 5, "top1": 0.6, "top3": 0.9, "loss": 1.0})
    _append(run / "proxy-0.jsonl", partial='_values": 60}\n')  # now complete
    events.update(restarts=1, round_=5)
    events.close()
    got = _scalars(run / "tensorboard")
    assert [(s, round(v, 3)) for s, v in got["test/top1"]] == [(0, 0.1), (5, 0.6)]
    assert got["train/loss/worker-3"][0][0] == 0 and got["time/exchange_ms/worker-3"]
    assert got["server/missing_workers/shard-1"] == [(0, 1.0)]
    assert [(s, round(v, 6)) for s, v in got["server/lr/shard-1"]] == [(0, 0.1)]
    assert got["proxy/corrupted_values/proxy-0"] == [(0, 57.0), (1, 60.0)]  # once each
    assert got["cluster/restarts"] == [(5, 1.0)]


def test_the_per_round_series_are_sampled_every_k_rounds_evaluations_all(
        tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    _append(run / "worker-0.jsonl", *({"round": t, "loss": 1.0 / (t + 1), "compute_ms": 1.0,
                                       "exchange_ms": 2.0} for t in range(25)))
    _append(run / "server-0.jsonl", *({"round": t, "aggregation_ms": 0.3,
                                       "nonfinite_values": 5 * (t == 13),
                                       "missing": [2] if t == 17 else []}
                                      for t in range(25)))
    _append(run / "evaluator.jsonl", *({"round": t, "top1": 0.5, "top3": 0.8, "loss": 1.0}
                                       for t in (0, 3, 7)))
    events = run_events(run, every=10)
    assert events is not None
    events.update()
    events.close()
    got = _scalars(run / "tensorboard")
    assert [s for s, _ in got["train/loss/worker-0"]] == [0, 10, 20]
    # a round with non-finite values or missing workers is written whatever the sampling
    assert [s for s, _ in got["server/aggregation_ms/shard-0"]] == [0, 10, 13, 17, 20]
    assert (13, 5.0) in got["server/nonfinite_values/shard-0"]
    assert (17, 1.0) in got["server/missing_workers/shard-0"]
    assert [s for s, _ in got["test/top1"]] == [0, 3, 7]
    assert run_events(tmp_path / "other", every=0) is None  # --tensorboard-every 0: none
    assert not (tmp_path / "other").exists()


def test_without_the_extra_nothing_is_written(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tensorboard, "available", lambda: False)
    assert run_events(tmp_path) is None
    assert list(tmp_path.iterdir()) == []


def test_ps_simulate_writes_the_runs_events(tmp_path: Path) -> None:
    from ps.reference.cli import main as simulate_main

    out = tmp_path / "sim"
    result = CliRunner().invoke(simulate_main, [
        "--dataset", "synthetic", "--workers", "3", "--shards", "2", "--rounds", "4",
        "--eval-every", "2", "--proxy-attack", "gambler", "--tensorboard-every", "1",
        "--lr", "0.5", "--lr-milestones", "2", "--lr-decay", "0.5", "--out-dir", str(out)])
    assert result.exit_code == 0, result.output
    got = _scalars(out / "tensorboard")
    assert [s for s, _ in got["test/top1"]] == [2, 4]
    assert [s for s, _ in got["server/aggregation_ms/shard-0"]] == [0, 1, 2, 3]
    # the step schedule: 0.5 to round 1, halved from round 2
    assert [v for _, v in got["server/lr/shard-1"]] == [0.5, 0.5, 0.25, 0.25]
    assert {"server/aggregation_ms/shard-0", "server/aggregation_ms/shard-1",
            "proxy/corrupted_values/engine"} <= set(got)


def test_a_grids_cells_compare_side_by_side(tmp_path: Path) -> None:
    from ps.experiments.runner import _write_events

    class Cell:
        def __init__(self, key: str, label: str) -> None:
            self.key, self._label = key, label

        def label(self) -> str:
            return self._label

    cells = [Cell("a", "grid/rule=krum/seed 0"), Cell("b", "grid/rule=mean/seed 0")]
    results = {c.key: {"points": [{"round": 0, "top1": 0.1, "top3": 0.3, "loss": 2.0},
                                  {"round": 4, "top1": 0.5 if c.key == "a" else 0.2,
                                   "top3": 0.8, "loss": 1.0}]} for c in cells}
    _write_events(tmp_path, cells, results)
    krum = _scalars(tmp_path / "tensorboard" / "grid" / "rule=krum" / "seed_0")
    mean = _scalars(tmp_path / "tensorboard" / "grid" / "rule=mean" / "seed_0")
    assert krum["test/top1"][-1] == (4, 0.5) and mean["test/top1"][-1][0] == 4


def test_events_that_cannot_be_written_are_a_warning_not_the_runs_failure(
        tmp_path: Path, monkeypatch, caplog) -> None:
    run = tmp_path / "run"
    run.mkdir()
    _append(run / "evaluator.jsonl", {"round": 0, "top1": 0.1, "top3": 0.3, "loss": 2.3})
    events = RunEvents(run)

    def disk_full() -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(events.writer, "flush", disk_full)
    events.update()
    events.update()  # once failed, it stops: one warning
    assert [r.getMessage() for r in caplog.records if "TensorBoard" in r.getMessage()] == [
        f"TensorBoard events of {run} not written any more: [Errno 28] No space left on "
        "device"]
