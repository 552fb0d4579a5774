"""Command-line conventions: flag > PS_* environment > default; exit codes; --help."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from common.errors import EXIT_CONFIG
from ps.launcher.cli import main as cluster_main
from ps.proxy.cli import main as proxy_main
from ps.reference.cli import main as simulate_main
from server.cli import main as server_main
from worker.cli import main as worker_main

SMALL = ["--dataset", "synthetic", "--workers", "3", "--shards", "1", "--rounds", "2"]


def test_environment_fills_in_and_flags_win() -> None:
    runner = CliRunner()
    bad_env = runner.invoke(simulate_main, SMALL, env={"PS_RULE": "bogus"})
    assert bad_env.exit_code == EXIT_CONFIG
    assert "bogus" in bad_env.output
    flag_wins = runner.invoke(simulate_main, [*SMALL, "--rule", "marmed"],
                              env={"PS_RULE": "bogus", "PS_ROUNDS": "999"})
    assert flag_wins.exit_code == 0, flag_wins.output
    assert "2 rounds in" in flag_wins.output
    env_used = runner.invoke(simulate_main, SMALL[:-2], env={"PS_ROUNDS": "3"})
    assert env_used.exit_code == 0 and "3 rounds in" in env_used.output


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--rule", "krum", "--q", "1"], "2q+2 < n"),
        (["--worker-attack", "gaussian"], "byzantine worker"),
        (["--proxy-attack", "gambler", "--proxy-shards", "3"], "out of range"),
        (["--bitflip-bits", "1,x"], "comma-separated integers"),
    ],
)
def test_configuration_errors_exit_2_with_the_reason(args: list[str], needle: str) -> None:
    result = CliRunner().invoke(simulate_main, [*SMALL, *args])
    assert result.exit_code == EXIT_CONFIG, result.output
    assert needle in result.output


@pytest.mark.parametrize("command", [server_main, worker_main, proxy_main, cluster_main,
                                     simulate_main])
def test_help_lists_every_option_with_its_environment_variable(command) -> None:
    result = CliRunner().invoke(command, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    options = [p for p in command.params if p.param_type_name == "option" and p.name != "help"]
    for p in options:
        assert p.opts[0] in result.output
        assert f"PS_{p.envvar[3:]}" in result.output
    assert "Exit codes" in result.output


def test_server_refuses_a_shard_outside_the_cluster() -> None:
    result = CliRunner().invoke(server_main, ["--shard", "4", "--shards", "4", "--insecure"])
    assert result.exit_code == EXIT_CONFIG and "--shard must be in 0..3" in result.output


def test_keys_and_insecure_together_are_a_configuration_error(tmp_path) -> None:
    result = CliRunner().invoke(server_main, ["--keys", str(tmp_path), "--insecure"])
    assert result.exit_code == EXIT_CONFIG and "contradict" in result.output


@pytest.mark.parametrize("command", [server_main, cluster_main])
def test_a_quorum_below_n_minus_q_is_refused_at_start_naming_both(command, tmp_path) -> None:
    args = ["--dataset", "synthetic", "--workers", "10", "--q", "2", "--rule", "marmed",
            "--round-timeout", "1", "--quorum", "7", "--insecure", "--out-dir", str(tmp_path)]
    result = CliRunner().invoke(command, args)
    assert result.exit_code == EXIT_CONFIG, result.output
    assert "--quorum 7 must be in n - q..n = 8..10" in result.output


def test_resume_of_a_directory_that_holds_no_run_is_a_configuration_error(tmp_path) -> None:
    result = CliRunner().invoke(cluster_main, ["--resume", str(tmp_path)])
    assert result.exit_code == EXIT_CONFIG and "command.json" in result.output


def test_checkpoints_sparser_than_the_workers_replay_are_refused(tmp_path) -> None:
    """A server restarted from a checkpoint older than the workers' replay window would
    wait for rounds nobody can resend: ps-cluster refuses it before starting anything."""
    result = CliRunner().invoke(cluster_main, [*SMALL, "--out-dir", str(tmp_path / "run"),
                                               "--checkpoint-every", "20",
                                               "--replay-rounds", "16"])
    assert result.exit_code == EXIT_CONFIG, result.output
    assert "--checkpoint-every 20 is above --replay-rounds 16" in result.output
    assert not list((tmp_path / "run").glob("**/server-*"))  # no process was started
