"""A run's figures (``ps.plots.run_figures``), ``ps-report`` and ``ps-simulate --out-dir``:
which PNGs the files of a run support, from synthetic metrics and from a real simulation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from common.errors import EXIT_CONFIG
from common.run.config import AttackConfig, RunConfig, write_run_config
from common.run.metrics import read_jsonl
from ps.plots import run_figures
from ps.plots.cli import main as report_main
from ps.plots.run_figures import draw_finished_run, draw_run, read_rounds, run_title
from ps.reference.cli import main as simulate_main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ALL_FIGURES = {"accuracy.png", "round_time.png", "corruption.png", "aggregation.png",
               "partition.png"}


def _write(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def _config(run_dir: Path, **attack: object) -> None:
    cfg = RunConfig(dataset="synthetic", num_workers=3, num_shards=2, rule="marmed",
                    q=1).validate()
    write_run_config(run_dir, cfg, AttackConfig.build(**attack).validate(cfg))


def _assert_pngs(run_dir: Path, names: set[str]) -> None:
    assert {p.name for p in run_dir.glob("*.png")} == names
    for name in names:
        data = (run_dir / name).read_bytes()
        assert data[:8] == PNG_SIGNATURE and len(data) > 5000, name


def _cluster_metrics(run_dir: Path) -> None:
    """A 4-round cluster run of 3 workers and 2 shards whose loss diverged at round 4;
    server 1 resumed and wrote round 2 twice; no proxy file."""
    _write(run_dir / "evaluator.jsonl",
           [{"time": 0.0, "round": t, "loss": loss, "top1": top1, "top3": top1 + 0.2}
            for t, loss, top1 in ((0, 2.3, 0.1), (2, 1.1, 0.5), (4, math.nan, 0.1))])
    for i in range(3):
        _write(run_dir / f"worker-{i}.jsonl",
               [{"round": t, "loss": 1.0, "compute_ms": 2.0 + i, "exchange_ms": 10.0 + t}
                for t in range(4)])
    for s in range(2):
        rows = [{"time": 0.0, "shard": s, "round": t, "aggregation_ms": 0.5 + s,
                 "workers": [0, 1, 2], "missing": []} for t in range(4)]
        if s == 1:  # a resumed server repeats round 2 (the last line wins)
            rows.insert(2, dict(rows[2], aggregation_ms=99.0))
        _write(run_dir / f"server-{s}.jsonl", rows)


def test_a_cluster_run_without_proxy_gets_every_figure_but_corruption(tmp_path: Path) -> None:
    _cluster_metrics(tmp_path)
    _config(tmp_path)
    written = draw_run(tmp_path)
    assert [p.name for p in written] == ["accuracy.png", "round_time.png", "aggregation.png"]
    _assert_pngs(tmp_path, ALL_FIGURES - {"corruption.png", "partition.png"})


def test_the_last_line_of_a_repeated_round_wins(tmp_path: Path) -> None:
    _cluster_metrics(tmp_path)
    rows = read_rounds(tmp_path / "server-1.jsonl", "aggregation_ms")
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    assert rows[2]["aggregation_ms"] == 1.5


def test_proxy_files_give_the_corruption_figure_with_params_lines(tmp_path: Path) -> None:
    _write(tmp_path / "proxy-0.jsonl",
           [{"time": 0.0, "round": t, "pushes": 3, "corrupted_values": 10 ** t, "errors": 0}
            for t in range(4)]
           + [{"time": 0.0, "round": 1, "worker": w, "params_corrupted": 5} for w in range(3)])
    with (tmp_path / "proxy-0.jsonl").open("a") as f:
        f.write('{"time": 0.0, "round": 4, "pus')  # a line cut short by a crash
    (tmp_path / "evaluator.jsonl").write_text("")  # empty: no accuracy figure
    assert [p.name for p in draw_run(tmp_path)] == ["corruption.png"]
    _assert_pngs(tmp_path, {"corruption.png"})


def test_a_loss_never_finite_and_no_config_still_draw(tmp_path: Path) -> None:
    _write(tmp_path / "evaluator.jsonl",
           [{"round": t, "loss": math.inf if t else math.nan, "top1": 0.1, "top3": 0.3}
            for t in range(3)])
    assert [p.name for p in draw_run(tmp_path)] == ["accuracy.png"]


def test_run_title_names_rule_and_attacks() -> None:
    config = {"run": {"rule": "krum", "q": 2, "num_workers": 9, "num_shards": 3,
                      "dataset": "mnist"},
              "attack": {"worker_attack": "gaussian", "byzantine_workers": [0, 1],
                         "proxy_attack": "gambler", "proxy_shards": [2],
                         "corrupt_params": True}}
    assert run_title(config) == ("krum (q=2), n=9, S=3, mnist; gaussian from workers 0,1; "
                                 "proxy gambler (and PARAMS) on shard 2")
    assert run_title({}) == ""


def test_a_figure_that_fails_is_a_warning_at_the_end_of_a_run(tmp_path: Path, monkeypatch,
                                                              capsys, caplog) -> None:
    _cluster_metrics(tmp_path)

    def broken(run_dir: Path, config: dict) -> Path:
        raise RuntimeError("broken figure")

    monkeypatch.setattr(run_figures, "FIGURES", (broken, run_figures.draw_aggregation))
    draw_finished_run(tmp_path)
    assert "figures in" in capsys.readouterr().out
    assert "broken could not be drawn" in caplog.text
    _assert_pngs(tmp_path, {"aggregation.png"})
    with pytest.raises(RuntimeError, match="broken figure"):
        draw_run(tmp_path)


def test_ps_report_redraws_and_refuses_a_directory_without_metrics(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "server-0.jsonl").write_text("")
    refused = CliRunner().invoke(report_main, [str(empty)])
    assert refused.exit_code == EXIT_CONFIG
    assert "nothing to draw" in refused.output
    run = tmp_path / "run"
    run.mkdir()
    _cluster_metrics(run)
    redrawn = CliRunner().invoke(report_main, [str(run)])
    assert redrawn.exit_code == 0, redrawn.output
    assert redrawn.output.split() == [str(run / name) for name in
                                      ("accuracy.png", "round_time.png", "aggregation.png")]


def test_ps_simulate_writes_engine_metrics_config_and_figures(tmp_path: Path) -> None:
    out = tmp_path / "sim"
    result = CliRunner().invoke(simulate_main, [
        "--dataset", "synthetic", "--rounds", "4", "--workers", "4", "--shards", "2",
        "--rule", "mean", "--q", "0", "--proxy-attack", "gambler", "--gambler-p", "0.001",
        "--eval-every", "2", "--out-dir", str(out)])
    assert result.exit_code == 0, result.output
    assert "figures in" in result.output
    engine = read_jsonl(out / "engine.jsonl")
    assert [r["round"] for r in engine] == [0, 1, 2, 3]
    assert all(len(r["aggregation_ms"]) == 2 for r in engine)
    total = next(line for line in result.output.splitlines() if "corrupted in flight" in line)
    assert f"; {sum(r['corrupted_values'] for r in engine)} values corrupted" in total
    config = json.loads((out / "config.json").read_text())
    assert config["attack"]["proxy_attack"] == "gambler" and config["run"]["rounds"] == 4
    _assert_pngs(out, ALL_FIGURES - {"round_time.png"})
    partition = json.loads((out / "partition.json").read_text())
    assert partition["partition"] == "iid" and len(partition["counts"]) == 4
    assert sum(map(sum, partition["counts"])) == 2048  # every synthetic training sample


def test_ps_simulate_refuses_a_worker_left_without_a_batch(tmp_path: Path) -> None:
    result = CliRunner().invoke(simulate_main, [
        "--dataset", "synthetic", "--rounds", "2", "--workers", "8", "--shards", "1",
        "--partition", "dirichlet", "--alpha", "0.1", "--out-dir", str(tmp_path / "sim")])
    assert result.exit_code == EXIT_CONFIG
    assert ("--partition dirichlet --alpha 0.1 leaves worker 4 with 27 training samples, "
            "fewer than one batch (--batch-size 32)") in result.output
    assert not (tmp_path / "sim" / "evaluator.jsonl").exists()


def test_ps_report_draws_the_partition_from_partition_json(tmp_path: Path) -> None:
    counts = [[30, 0, 2], [0, 25, 7], [1, 1, 40], [9, 9, 9]]
    _write(tmp_path / "partition.json", [{"partition": "dirichlet", "alpha": 0.1,
                                          "gamma": 0.5, "counts": counts}])
    drawn = CliRunner().invoke(report_main, [str(tmp_path)])
    assert drawn.exit_code == 0, drawn.output
    assert drawn.output.split() == [str(tmp_path / "partition.png")]
    _assert_pngs(tmp_path, {"partition.png"})


def test_the_partition_figure_is_a_workers_by_classes_heat_map(tmp_path: Path,
                                                               monkeypatch) -> None:
    counts = [[30, 0, 2], [0, 25, 7], [1, 1, 40], [9, 9, 9]]
    _write(tmp_path / "partition.json", [{"partition": "gamma", "alpha": 1.0,
                                          "gamma": 0.25, "counts": counts}])
    figures = []
    monkeypatch.setattr(run_figures, "save", lambda fig, path: figures.append(fig) or path)
    assert run_figures.draw_partition(tmp_path, {}) == tmp_path / "partition.png"
    heat, totals = figures[0].axes[:2]
    assert heat.images[0].get_array().tolist() == counts  # rows: workers, columns: classes
    assert (heat.get_xlabel(), heat.get_ylabel()) == ("class", "worker")
    assert [bar.get_width() for bar in totals.patches] == [32, 32, 42, 27]
    assert "gamma, gamma 0.25" in figures[0].get_suptitle()


def test_a_fresh_matplotlib_cache_logs_nothing_on_the_terminal(tmp_path: Path) -> None:
    """matplotlib builds its font cache on first use and logs "generated new fontManager"
    at INFO; with the project's logging set up (even --verbose), no such line shows."""
    import subprocess
    import sys

    code = ("from common.run.process import setup_logging; setup_logging('x', True)\n"
            "from ps.plots.style import pyplot, save\n"
            "fig = pyplot().figure(); fig.gca().plot([0, 1]); fig.gca().set_title('t')\n"
            f"save(fig, __import__('pathlib').Path({str(tmp_path / 'f.png')!r}))\n")
    root = Path(__file__).resolve().parents[3]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=root, timeout=120,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root),
                                 "MPLCONFIGDIR": str(tmp_path / "mpl"),
                                 "HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "mpl").is_dir()  # the cache was built in this run
    assert (tmp_path / "f.png").read_bytes().startswith(PNG_SIGNATURE)
    assert result.stderr == "" and result.stdout == ""


def test_a_compose_run_of_server_processes_finds_every_shards_metrics(tmp_path: Path) -> None:
    from ps.plots.run_figures import metrics_file, numbered

    for service, shards in (("server-0", (0, 1)), ("server-2", (2, 3))):
        (tmp_path / service).mkdir()
        for s in shards:  # each shard's file in its process's directory
            (tmp_path / service / f"server-{s}.jsonl").write_text("{}\n")
    (tmp_path / "worker-1").mkdir()
    (tmp_path / "worker-1" / "worker-1.jsonl").write_text("{}\n")
    assert numbered(tmp_path, "server") == {
        s: tmp_path / f"server-{s - s % 2}" / f"server-{s}.jsonl" for s in range(4)}
    assert metrics_file(tmp_path, "worker-1") == tmp_path / "worker-1" / "worker-1.jsonl"
    assert metrics_file(tmp_path, "server-9") == tmp_path / "server-9.jsonl"  # none: flat
