"""Run settings in a file (``--config run.toml``) for every command: precedence flag >
environment > file > default, shown by ``--print-config``; one file for every command
of a run; unknown keys and bad values refused with the key, the file and what is
valid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from common.errors import EXIT_CONFIG
from ps.launcher.cli import main as cluster_main
from ps.proxy.cli import main as proxy_main
from ps.reference.cli import main as simulate_main
from server.cli import main as server_main
from worker.cli import main as worker_main

RUN = """\
rule = "meamed"
workers = 7
batch-size = 16
byzantine_workers = [0, 1]
worker-attack = "gaussian"
timeout = 5.0
rounds = 3
dataset = "synthetic"
"""


def _resolved(output: str) -> dict[str, tuple[str, str]]:
    """``--print-config`` lines as key -> (value as written, where it came from)."""
    out = {}
    for line in output.splitlines():
        if line.startswith("#"):
            continue
        setting, _, where = line.partition("  # ")
        key, _, value = setting.partition(" = ")
        out[key] = (value, where)
    return out


@pytest.fixture
def run_file(tmp_path: Path) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(RUN, encoding="utf-8")
    return path


def test_a_flag_beats_the_environment_which_beats_the_file_which_beats_the_default(
        run_file: Path) -> None:
    result = CliRunner().invoke(server_main, [
        "--config", str(run_file), "--rounds", "9", "--print-config", "--insecure"],
        env={"PS_WORKERS": "11", "PS_RULE": ""})
    assert result.exit_code == 0, result.output
    got = _resolved(result.output)
    assert got["rounds"] == ("9", "from --rounds")  # flag over file
    assert got["workers"] == ("11", "from PS_WORKERS")  # environment over file
    assert got["batch-size"] == ("16", f"from {run_file}")  # file over default
    assert got["lr"] == ("0.1", "default")
    assert "timeout" not in got and "byzantine-workers" not in got  # not a server's


def test_one_file_serves_every_command_of_a_run(run_file: Path) -> None:
    for main, extra in ((server_main, []), (proxy_main, ["--server", "tcp://s:1"]),
                        (worker_main, ["--servers", "tcp://s:1", "--worker-id", "0"]),
                        (cluster_main, []), (simulate_main, [])):
        result = CliRunner().invoke(main, ["--config", str(run_file), "--print-config",
                                           *extra])
        assert result.exit_code == 0, (main.name, result.output)
        got = _resolved(result.output)
        assert got["rule"] == ('"meamed"', f"from {run_file}"), main.name
    cluster = _resolved(CliRunner().invoke(cluster_main, [
        "--config", str(run_file), "--print-config"]).output)
    assert cluster["byzantine-workers"] == ("[0, 1]", f"from {run_file}")
    assert cluster["timeout"] == ("5.0", f"from {run_file}")


def test_the_printed_settings_are_a_run_file_that_resolves_the_same(
        run_file: Path, tmp_path: Path) -> None:
    first = CliRunner().invoke(cluster_main, ["--config", str(run_file), "--seed", "4",
                                              "--print-config"])
    again_path = tmp_path / "again.toml"
    again_path.write_text(first.output, encoding="utf-8")
    again = CliRunner().invoke(cluster_main, ["--config", str(again_path), "--print-config"])
    assert again.exit_code == 0, again.output
    values = {k: v for k, (v, _) in _resolved(first.output).items()}
    assert {k: v for k, (v, _) in _resolved(again.output).items()} == values


@pytest.mark.parametrize(("text", "needle"), [
    ('wrokers = 3\n', "'wrokers' is not a setting; did you mean workers"),
    ('rule = "marmd"\n', "rule must be one of"),
    ('workers = "x"\n', "workers must be an integer, got 'x'"),
    ('workers = 0\n', "workers must be >= 1, got 0"),
    ('insecure = 1\n', "insecure must be true or false"),
    ('byzantine-workers = [0, "a"]\n', "byzantine-workers must be a list of integers"),
    ('rule = \n', "not a TOML file"),
    ('[server]\nrule = "mean"\n', "[server] is a table; a run file is flat"),
])
def test_a_bad_file_is_refused_naming_the_key_and_what_is_valid(tmp_path: Path, text: str,
                                                                 needle: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(cluster_main, ["--config", str(path), "--print-config"])
    assert result.exit_code == EXIT_CONFIG, result.output
    assert str(path) in result.output and needle in result.output


def test_a_run_takes_its_settings_from_the_file(run_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "sim"
    result = CliRunner().invoke(simulate_main, ["--config", str(run_file), "--out-dir",
                                                str(out), "--eval-every", "3"])
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert (config["run"]["rule"], config["run"]["num_workers"],
            config["run"]["batch_size"], config["run"]["rounds"]) == ("meamed", 7, 16, 3)
    assert config["attack"]["byzantine_workers"] == [0, 1]


def test_a_grid_starts_from_a_run_file(tmp_path: Path) -> None:
    from common.errors import ConfigError
    from ps.experiments.gridfile import load_grid

    (tmp_path / "run.toml").write_text(
        'dataset = "synthetic"\nworkers = 7\nrule = "krum"\nq = 2\n'
        'worker-attack = "gaussian"\nbyzantine-workers = [0, 1]\nrounds = 4\n'
        'bind = "tcp://0.0.0.0:5550"\neval-every = 2\n', encoding="utf-8")
    grid = tmp_path / "grid.toml"
    grid.write_text('base = "run.toml"\nrule = ["krum", "meamed"]\nseeds = 1\n',
                    encoding="utf-8")
    loaded = load_grid(grid)
    assert loaded.axes == ("rule",)  # the run file's list is one point, not an axis
    runs = [cell.configs() for cell in loaded.cells]
    assert [cfg.rule for cfg, _ in runs] == ["krum", "meamed"]  # the grid's keys win
    assert all(cfg.num_workers == 7 and cfg.q == 2 and cfg.rounds == 4 for cfg, _ in runs)
    assert all(attack.byzantine_workers == (0, 1) for _, attack in runs)
    assert loaded.invocation == {"eval_every": 2}
    (tmp_path / "run.toml").write_text("wrokers = 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="'wrokers' is not a setting"):
        load_grid(grid)
