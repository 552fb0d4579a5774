"""Command-line conventions: flag > PS_* environment > default; exit codes; --help."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from common.errors import EXIT_CONFIG, ConfigError
from ps.launcher.cli import main as cluster_main
from ps.proxy.cli import main as proxy_main
from ps.reference.cli import main as simulate_main
from server.cli import main as server_main
from worker.cli import main as worker_main

ROOT = Path(__file__).resolve().parents[2]
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
    assert result.exit_code == EXIT_CONFIG and "the run has S=4 shards (0..3)" in result.output


@pytest.mark.parametrize("spec", ["2-5", "1,1", "3-1", "a", "1-", "-1", "0,,2"])
def test_server_refuses_a_shard_set_it_cannot_host(spec: str) -> None:
    result = CliRunner().invoke(server_main, ["--shard", spec, "--shards", "4", "--insecure"])
    assert result.exit_code == EXIT_CONFIG and "--shard: shards" in result.output


@pytest.mark.parametrize(("args", "says"), [
    (["--worker-id", "5"], "--worker-id: workers '5': the run has n=5 workers (0..4)"),
    (["--worker-id", "1,1"], "--worker-id: workers '1,1' names a worker twice"),
    (["--worker-id", "0-2", "--worker-attack", "alie"],
     "--worker-attack in a process of several workers: name the Byzantine ones with "
     "--byzantine-workers"),
    (["--worker-id", "0-2", "--worker-attack", "alie", "--byzantine-workers", "4"],
     "no worker of --worker-id 0-2 is in --byzantine-workers"),
])
def test_a_worker_process_refuses_workers_it_cannot_run(args: list[str], says: str) -> None:
    result = CliRunner().invoke(worker_main, [
        "--servers", "tcp://127.0.0.1:1", "--workers", "5", "--dataset", "synthetic",
        "--insecure", *args])
    assert result.exit_code == EXIT_CONFIG and says in result.output, result.output


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


@pytest.mark.parametrize(("every", "replay", "needle"), [
    ("20", "16", "--checkpoint-every 20 needs --replay-rounds of at least 22 (got 16)"),
    ("15", "16", "--checkpoint-every 15 needs --replay-rounds of at least 17 (got 16)"),
    ("0", "16", "--checkpoint-every 0 saves only at exit"),
])
def test_checkpoints_the_workers_cannot_replay_from_are_refused(tmp_path, every: str,
                                                                replay: str,
                                                                needle: str) -> None:
    """A server restarted from its last checkpoint (possibly one still being written)
    must get every later round replayed by the workers: ps-cluster refuses an interval
    that leaves the replay window no slack, or no checkpoint at all, before starting
    anything; with --max-restarts 0 nothing is restarted and anything goes."""
    args = [*SMALL, "--out-dir", str(tmp_path / "run"), "--checkpoint-every", every,
            "--replay-rounds", replay]
    result = CliRunner().invoke(cluster_main, args)
    assert result.exit_code == EXIT_CONFIG, result.output
    assert needle in result.output
    assert not list((tmp_path / "run").glob("**/server-*"))  # no process was started


def test_a_process_of_several_shards_needs_two_checkpoints_replayable(tmp_path) -> None:
    """It may resume from the checkpoint before its last (killed between its shards'
    files): the workers must keep twice the interval, and the defaults do."""
    args = [*SMALL, "--shards", "2", "--server-processes", "1", "--out-dir",
            str(tmp_path / "run"), "--checkpoint-every", "8", "--replay-rounds", "17"]
    result = CliRunner().invoke(cluster_main, args)
    assert result.exit_code == EXIT_CONFIG, result.output
    assert ("--checkpoint-every 8 needs --replay-rounds of at least 18 (got 17): a server "
            "restarted from its last checkpoint (a server process of several shards may "
            "resume from the checkpoint before its last)") in result.output.replace("\n", " ")
    assert not list((tmp_path / "run").glob("**/server-*"))


def test_the_compose_generator_refuses_checkpoints_the_workers_cannot_replay() -> None:
    from ps.deploy.compose import deployment, read_env

    env = {**read_env(ROOT / "docker" / "cluster.env"), "PS_CHECKPOINT_EVERY": "17"}
    with pytest.raises(ConfigError, match="needs --replay-rounds of at least 19"):
        deployment(env, {"proxy_shards": [0], "byzantine_workers": [],
                         "worker_attack": "gaussian"})
    env = {**env, "PS_CHECKPOINT_EVERY": "8", "PS_SERVER_PROCESSES": "2"}  # 2 shards each
    with pytest.raises(ConfigError, match="needs --replay-rounds of at least 18 \\(got 16\\)"):
        deployment({**env, "PS_REPLAY_ROUNDS": "16"},
                   {"proxy_shards": [0], "byzantine_workers": [], "worker_attack": "gaussian"})
    deployment(env, {"proxy_shards": [0], "byzantine_workers": [],  # the defaults: 8 and 18
                     "worker_attack": "gaussian"})


def test_verify_knows_which_workers_momentum_the_engine_cannot_reproduce(tmp_path) -> None:
    """Worker momentum lives in the worker process: a worker that computed every round in
    one process is reproducible; one restarted (a process whose first round is not 0) or
    one that skipped a round is not, and --verify says so instead of reporting a
    difference."""
    import json

    from ps.launcher.cli import momentum_breaks

    def write(i: int, rounds: list[int], started_at: int = 0) -> None:
        with (tmp_path / f"worker-{i}.jsonl").open("a") as f:
            for t in rounds:
                f.write(json.dumps({"round": t, "started_at": started_at}) + "\n")

    write(0, [0, 1, 2, 3])
    write(1, [0, 1])
    write(1, [2, 3], started_at=2)  # restarted at round 2
    write(2, [0, 1, 3])  # caught up past round 2
    write(3, [0, 1, 2, 3])
    assert momentum_breaks(tmp_path, 4, 4) == [1, 2]


@pytest.mark.parametrize(("saved", "given", "expected"), [
    ({"insecure": True}, {"insecure": True}, {"insecure": True}),
    ({"keys": "k"}, {"keys": "k"}, {"keys": "k"}),  # the run's own key directory, restated
    ({}, {}, {"keys": None}),  # keys generated for the run (<out-dir>/keys, reused)
    ({}, {"keys": "run/keys"}, {"keys": "run/keys"}),  # the same, named
    ({"keys": "run/keys"}, {}, {"keys": None}),
], ids=["insecure", "keys", "generated", "generated-named", "generated-saved-named"])
def test_a_resumed_run_takes_its_security_settings_from_its_own_command_line(
        tmp_path, saved, given, expected) -> None:
    from common.net.keys import SecurityOptions
    from ps.launcher.cli import resumed_security

    def options(values: dict) -> SecurityOptions:
        return SecurityOptions(**{k: tmp_path / v if k == "keys" and v else v
                                  for k, v in values.items()})

    assert resumed_security(options(saved), options(given), tmp_path / "run") == \
        options(expected)


@pytest.mark.parametrize(("saved", "given", "says"), [
    (["--insecure"], [], "started with --insecure (its checkpoints carry no key) and this "
                         "command line names neither --keys nor --insecure; resume it with "
                         "--insecure"),
    (["--insecure"], ["--keys", "{k}"], "this command line says --keys {k}; resume it with "
                                        "--insecure"),
    (["--keys", "{k}"], [], "started with --keys {k} and this command line names neither "
                            "--keys nor --insecure; pass --keys {k} explicitly"),
    (["--keys", "{k}"], ["--keys", "{other}"], "this command line says --keys {other}; pass "
                                               "--keys {k} explicitly"),
    (["--keys", "{k}"], ["--insecure"], "this command line says --insecure; pass --keys {k}"),
    ([], ["--insecure"], "started with the keys generated for it in {run}/keys and this "
                         "command line says --insecure; resume it with neither --keys nor "
                         "--insecure"),
    ([], ["--keys", "{other}"], "this command line says --keys {other}; resume it with "
                                "neither"),
], ids=["insecure-then-nothing", "insecure-then-keys", "keys-then-nothing",
        "keys-then-other-keys", "keys-then-insecure", "generated-then-insecure",
        "generated-then-other-keys"])
def test_a_resume_whose_saved_security_settings_differ_from_its_own_is_refused(
        tmp_path, monkeypatch, saved: list[str], given: list[str], says: str) -> None:
    """The run directory's command.json is never a source of --keys or --insecure (anyone
    who can write the run directory could point --keys at keys of their own): the resume
    command line must say what the run was started with, or it is refused before
    anything starts, saying what to pass."""
    paths = {"k": tmp_path / "k", "other": tmp_path / "other", "run": tmp_path / "run"}
    run = _saved_run(tmp_path / "run", *(a.format(**paths) for a in saved))
    started = _never_started(monkeypatch)
    result = CliRunner().invoke(cluster_main, ["--resume", str(run),
                                               *(a.format(**paths) for a in given)])
    assert result.exit_code == EXIT_CONFIG, result.output
    assert says.format(**paths) in result.output.replace("\n", " ")
    assert started == []


def test_a_resume_uses_the_keys_its_command_line_names_or_the_runs_own(
        tmp_path, monkeypatch) -> None:
    """With --keys restated, that directory; started with generated keys and resumed with
    neither flag, <run-dir>/keys, refused (before anything starts) unless the key ring
    trusts it."""
    from common.net.keys import create_keys

    create_keys(tmp_path / "k", 1, 3)
    run = _saved_run(tmp_path / "run", "--keys", str(tmp_path / "k"))
    started = _never_started(monkeypatch)
    result = CliRunner().invoke(cluster_main, ["--resume", str(run), "--keys",
                                               str(tmp_path / "k")])
    assert result.exit_code == EXIT_CONFIG and "not started" in result.output, result.output
    assert [spec.security.keys for spec in started] == [tmp_path / "k"]

    run = _saved_run(tmp_path / "generated")
    create_keys(run / "keys", 1, 3)
    result = CliRunner().invoke(cluster_main, ["--resume", str(run)])
    assert result.exit_code == EXIT_CONFIG and "not started" in result.output, result.output
    assert started[-1].security.keys == run / "keys"
    os.chmod(run, 0o777)  # anyone could swap <run-dir>/keys: not trusted
    result = CliRunner().invoke(cluster_main, ["--resume", str(run)])
    assert result.exit_code == EXIT_CONFIG, result.output
    assert "which anyone may write (mode 0777, no sticky bit)" in result.output.replace(
        "\n", " ")
    assert len(started) == 2


def test_a_run_records_its_keys_so_that_a_resume_can_restate_them(tmp_path) -> None:
    """command.json: --keys made absolute (a resume may run from elsewhere), nothing for
    the run's own <out-dir>/keys (the default)."""
    from common.net.keys import SecurityOptions
    from common.run.config import AttackConfig, RunConfig
    from ps.launcher.cluster import Cluster, ClusterSpec

    cfg = RunConfig(dataset="synthetic", num_workers=3, num_shards=1, rounds=2).validate()

    def recorded(keys: Path | None) -> list[str]:
        spec = ClusterSpec(cfg=cfg, attack=AttackConfig().validate(cfg), out_dir=tmp_path,
                           security=SecurityOptions(keys=keys))
        return Cluster(spec).command_argv()

    argv = recorded(Path("k"))
    assert argv[argv.index("--keys") + 1] == str(Path.cwd() / "k")
    assert "--keys" not in recorded(tmp_path / "keys")
    assert "--keys" not in recorded(None)


def _saved_run(out: Path, *security: str) -> Path:
    """A run directory as ps-cluster leaves it before any checkpoint: its command."""
    import json

    out.mkdir()
    (out / "command.json").write_text(json.dumps([
        *SMALL, "--rule", "mean", "--q", "0", "--no-evaluator", "--out-dir", str(out),
        *security]))
    return out


def _never_started(monkeypatch) -> list:
    """Stand-ins for starting a cluster: each spec it would run, then a configuration
    error ("not started"); no CURVE measurement either."""
    from ps.launcher import cli
    from ps.launcher.cluster import Cluster

    started: list = []

    def run(self, on_progress=None):
        started.append(self.spec)
        raise ConfigError("not started")

    monkeypatch.setattr(Cluster, "run", run)
    monkeypatch.setattr(cli, "slow_curve", lambda security: "")
    return started


@pytest.fixture
def grid_runs(monkeypatch) -> list:
    """The ``GridRun`` of each ``ps-experiment`` invocation, its cells never run."""
    from ps.experiments.cli import GridRun

    runs: list = []
    monkeypatch.setattr(GridRun, "run", lambda self, cells, metric, write: runs.append(self))
    return runs


def _experiment(*args: str, env: dict[str, str] | None = None):
    from ps.experiments.cli import main as experiment_main

    return CliRunner().invoke(experiment_main, ["paper", "--out", "unused", *args], env=env)


def test_experiment_takes_the_run_settings_by_their_declared_names(grid_runs) -> None:
    result = _experiment("-n", "7", "--dataset", "synthetic", "--eval-every", "3",
                         env={"PS_ROUNDS": "11"})
    assert result.exit_code == 0, result.output
    run = grid_runs[-1]
    assert (run.num_workers, run.dataset, run.eval_every, run.rounds) == (7, "synthetic", 3, 11)
    assert run.model is None  # left to the dataset's recipe
    refused = _experiment("--workers", "2")
    assert refused.exit_code == 2 and "at least 3 workers" in refused.output


def test_experiment_num_workers_is_a_hidden_deprecated_name_of_workers(grid_runs) -> None:
    result = _experiment("--num-workers", "5")
    assert result.exit_code == 0, result.output
    assert grid_runs[-1].num_workers == 5 and "deprecated" in result.output
    both = _experiment("--num-workers", "5", "--workers", "6")
    assert both.exit_code == 2 and "give --workers only" in both.output
    assert "--num-workers " not in _experiment("--help").output


def test_a_reference_mismatch_has_its_own_documented_exit_code(tmp_path, monkeypatch) -> None:
    """--verify's difference is neither a peer error (3) nor any other code: exit 5,
    listed in every --help's exit codes."""
    from types import SimpleNamespace

    import common.errors as errors
    import ps.reference.engine
    import ps.reference.participation
    from common.run.config import AttackConfig, RunConfig
    from common.run.process import ProcessOptions, run_process
    from ps.launcher.cli import verify

    others = {errors.EXIT_OK, errors.EXIT_INTERNAL, errors.EXIT_CONFIG, errors.EXIT_PEER,
              errors.EXIT_TIMEOUT, errors.EXIT_INTERRUPTED}
    assert errors.EXIT_MISMATCH not in others
    assert f"{errors.EXIT_MISMATCH} the cluster's result differs" in errors.EXIT_CODES_TEXT
    monkeypatch.setattr(ps.reference.participation, "read_participation",
                        lambda *args: SimpleNamespace(rounds_closed_short=0))
    monkeypatch.setattr(ps.reference.engine, "simulate",
                        lambda *args, **kwargs: SimpleNamespace(digest="b" * 64, seconds=1.0))
    spec = SimpleNamespace(cfg=RunConfig(), attack=AttackConfig(), out_dir=tmp_path,
                           client=SimpleNamespace(data_dir=None, device="cpu"),
                           process=ProcessOptions())
    with pytest.raises(SystemExit) as ended:
        run_process("cluster", ProcessOptions(), lambda: verify(spec, "a" * 64))
    assert ended.value.code == errors.EXIT_MISMATCH


def test_the_summary_line_says_which_span_its_time_and_rate_cover(tmp_path) -> None:
    """The wall time includes start-up; the rate is over the rounds after server 0's
    first, and the line names them, so rate x span gives the rounds it names."""
    import json
    import re

    from ps.launcher.cli import summary_line
    from ps.launcher.report import Progress, read_progress

    times = [8.5 + 29.3 * t / 299 for t in range(300)]
    (tmp_path / "server-0.jsonl").write_text(
        "".join(json.dumps({"round": t, "time": x}) + "\n" for t, x in enumerate(times)))
    p = read_progress(tmp_path)
    assert (p.round, p.timed_rounds) == (300, 299) and p.span_s == pytest.approx(29.3)
    line = summary_line(300, 37.8, p)
    assert line.startswith("done: 300 rounds in 37.8 s wall time (start-up included)")
    short = Progress(round=20, rounds_per_s=19 / 0.462, timed_rounds=19, span_s=0.462)
    for progress, timed in ((p, 299), (short, 19)):
        rounds, span, rate = re.search(r"the last (\d+) rounds in ([\d.]+) s, ([\d.]+) "
                                       r"rounds/s", summary_line(300, 37.8, progress)).groups()
        assert int(rounds) == timed
        assert float(rate) * float(span) == pytest.approx(timed, rel=0.01)  # they agree
    assert "top-1" not in line
    p.top1, p.top3, p.loss = 0.5, 0.75, 1.25
    assert summary_line(300, 37.8, p).endswith("; test top-1 0.5000, top-3 0.7500, "
                                               "loss 1.2500")
    assert summary_line(1, 2.0, Progress(round=1)) == \
        "done: 1 rounds in 2.0 s wall time (start-up included)"


def test_ps_cluster_refuses_more_worker_processes_than_workers(tmp_path) -> None:
    result = CliRunner().invoke(cluster_main, [
        "--dataset", "synthetic", "--workers", "3", "--worker-processes", "4", "--insecure",
        "--out-dir", str(tmp_path / "run")])
    assert result.exit_code == EXIT_CONFIG
    assert "--worker-processes 4 must be in 1..n=3" in result.output


def test_the_default_worker_processes_are_two_per_core_in_contiguous_blocks(
        monkeypatch) -> None:
    from ps.launcher import options

    monkeypatch.setattr(options, "local_cores", lambda: 2)
    assert options.ClusterOptions().worker_blocks(10) == [
        (0, 1, 2), (3, 4, 5), (6, 7), (8, 9)]
    assert options.ClusterOptions().worker_blocks(3) == [(0,), (1,), (2,)]
    assert options.ClusterOptions(worker_processes=1).worker_blocks(3) == [(0, 1, 2)]
