"""The shipped deployments run no proxy; an experiment's overlay adds one.

``docker/cluster.env`` names no proxy attack, so the committed ``docker-compose.yml``
and ``docker/stack.yml`` hold no ``proxy-*`` service and no proxy key anywhere. The
gambler experiment (``docker/experiments/gambler.env``, ``--experiment``: its lines
override the env file's) gives ``proxy-0`` in front of server 0, holding its own key
and nothing of the server's secret. A generated compose file's host paths are relative
to its own directory, so a file written anywhere works; ``--check`` regenerates an
experiment's file from the options recorded in it and catches a changed overlay.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from common.errors import ConfigError
from common.net.keys import SECRET_SUFFIX, needed_keys
from ps.deploy import compose, stack
from ps.deploy.compose import deployment_of, options_env, recorded_options, render
from ps.keys.cli import main as keys_main

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[3]
EXPERIMENT = "docker/experiments/gambler.env"
SHIPPED = {"env_file": "docker/cluster.env", "experiment": None, "proxy_shards": [0],
           "byzantine_workers": [], "worker_attack": "gaussian"}
GAMBLER = {**SHIPPED, "experiment": EXPERIMENT}


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _bundles(services: dict[str, Any], tmp_path: Path) -> Path:
    """Run the compose file's keys service's own command here; the bundles' directory."""
    args = list(services["keys"]["command"][1:])
    args[args.index("--dir") + 1] = str(tmp_path / "all")
    args[args.index("--bundles") + 1] = str(tmp_path / "bundles")
    with pytest.raises(SystemExit) as done:
        keys_main(args)
    assert done.value.code == 0
    return tmp_path / "bundles"


def _generate(module: Any, out: Path, *extra: str) -> int:
    return module.main(["--experiment", EXPERIMENT, "-o", str(out), *extra])


# --- the shipped files ---------------------------------------------------------------

def test_the_env_file_names_no_proxy_attack_and_the_experiment_does() -> None:
    assert compose.read_env(ROOT / "docker" / "cluster.env")["PS_PROXY_ATTACK"] == "none"
    overlay = compose.read_env(ROOT / EXPERIMENT)
    assert overlay == {"PS_PROXY_ATTACK": "gambler", "PS_GAMBLER_P": "0.0005",
                       "PS_GAMBLER_SCALE": "-1e20"}
    assert not any(k.startswith("PS_GAMBLER") for k in compose.read_env(
        ROOT / "docker" / "cluster.env"))


def test_the_shipped_compose_file_has_no_proxy_and_no_proxy_key(tmp_path: Path) -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert recorded_options(ROOT / "docker-compose.yml", compose.ARGS_MARK) == SHIPPED
    services = _load(ROOT / "docker-compose.yml")["services"]
    assert not [name for name in services if name.startswith("proxy")]
    assert "proxy-" not in text.split("\nversion:", 1)[1]  # nowhere in the YAML
    keys = services["keys"]["command"]
    assert "--proxies" not in keys
    servers = ",".join(f"tcp://server-{k}:5550" for k in range(4))
    for i in range(8):
        env = services[f"worker-{i}"]["environment"]
        assert env["PS_SERVERS"] == servers  # straight to the servers
        assert "PS_VIA_PROXY" not in env
        assert set(services[f"worker-{i}"]["depends_on"]) == {f"server-{k}" for k in range(4)}
    assert not any("PS_PROXY_ATTACK" in s.get("environment", {}) for s in services.values())
    bundles = _bundles(services, tmp_path)
    assert not [f for f in os.listdir(tmp_path / "all") if f.startswith("proxy-")]
    for name in os.listdir(bundles):  # no container holds a proxy key
        held = os.listdir(bundles / name)
        assert not [f for f in held if f.startswith("proxy-")], (name, held)
        assert held, name


def test_the_shipped_stack_file_has_no_proxy_and_no_proxy_key() -> None:
    text = (ROOT / "docker" / "stack.yml").read_text()
    spec = _load(ROOT / "docker" / "stack.yml")
    assert recorded_options(ROOT / "docker" / "stack.yml", stack.ARGS_MARK) == SHIPPED
    assert not [name for name in spec["services"] if name.startswith("proxy")]
    assert stack.KEYS_MARK + "--shards 4 --workers 8" in text.splitlines()
    assert not [key for key in spec["secrets"] if key.startswith("proxy-")]
    for name, service in spec["services"].items():
        assert not [m for m in service["secrets"] if m["source"].startswith("proxy-")], name
        assert "PS_VIA_PROXY" not in service["environment"], name
        assert "tcp://proxy" not in service["environment"].get("PS_SERVERS", ""), name


# --- the gambler experiment --------------------------------------------------------------

def test_the_gambler_experiment_compose_file_has_the_proxy(tmp_path: Path) -> None:
    out = tmp_path / "gambler.compose.yml"
    assert _generate(compose, out) == 0
    text = out.read_text()
    assert ("# Regenerate: python3 docker/gen_compose.py --experiment "
            f"{EXPERIMENT} -o {out}") in text.splitlines()
    assert recorded_options(out, compose.ARGS_MARK) == GAMBLER
    services = _load(out)["services"]
    assert [name for name in services if name.startswith("proxy")] == ["proxy-0"]
    proxy = services["proxy-0"]["environment"]
    assert (proxy["PS_PROXY_ATTACK"], proxy["PS_GAMBLER_P"]) == ("gambler", "0.0005")
    assert proxy["PS_PROXY_SERVER"] == "tcp://server-0:5550"
    assert services["worker-0"]["environment"]["PS_SERVERS"].startswith("tcp://proxy-0:5550,")
    assert services["worker-0"]["environment"]["PS_VIA_PROXY"] == "0"
    keys = services["keys"]["command"]
    assert keys[keys.index("--proxies") + 1] == "0"
    bundles = _bundles(services, tmp_path)
    held = sorted(os.listdir(bundles / "proxy-0"))
    assert held == sorted(needed_keys("proxy-0", 4, 8, [0]))
    # its own secret only: nothing of server-0's (it cannot pose as the server)
    assert [f for f in held if f.endswith(SECRET_SUFFIX)] == ["proxy-0.key_secret"]
    assert "proxy-0.key" in os.listdir(bundles / "server-0")
    assert "proxy-0.key" not in os.listdir(bundles / "server-1")


def test_the_gambler_experiment_stack_file_has_the_proxy(tmp_path: Path) -> None:
    out = tmp_path / "gambler.stack.yml"
    assert _generate(stack, out) == 0
    text = out.read_text()
    assert stack.KEYS_MARK + "--shards 4 --workers 8 --proxies 0" in text.splitlines()
    assert f"#   PS_STACK_FILE={out} bash scripts/swarm_secrets.sh create" in text
    spec = _load(out)
    assert spec == stack.stack_spec(deployment_of(GAMBLER))
    proxy = spec["services"]["proxy-0"]
    files = [m["source"] for m in proxy["secrets"]]
    assert files == needed_keys("proxy-0", 4, 8, [0])
    assert [f for f in files if f.endswith(SECRET_SUFFIX)] == ["proxy-0.key_secret"]
    assert not any(f.startswith("server-") and f.endswith(SECRET_SUFFIX) for f in files)
    assert proxy["environment"]["PS_PROXY_ATTACK"] == "gambler"


def test_the_experiment_overrides_the_env_file_and_is_validated(tmp_path: Path,
                                                               capsys: Any) -> None:
    env = options_env(GAMBLER)
    assert env["PS_PROXY_ATTACK"] == "gambler" and env["PS_WORKERS"] == "8"
    bad = tmp_path / "bad.env"
    for text, message in (("PS_NOT_A_SETTING=1\n", f"{bad}: not a setting: PS_NOT_A_SETTING"),
                          ("PS_PROXY_ATTACK\n", "expected KEY=VALUE"),
                          ("PS_GAMBLER_P=2\n", "--gambler-p must be in [0, 1]")):
        bad.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(message)):
            deployment_of({**SHIPPED, "experiment": str(bad)})
        out = tmp_path / "out.yml"
        for module, prefix in ((compose, "gen_compose: "), (stack, "gen_stack: ")):
            capsys.readouterr()
            assert module.main(["--experiment", str(bad), "-o", str(out)]) == 2
            assert capsys.readouterr().err.startswith(prefix)
            assert not out.exists()
    assert compose.main(["--experiment", str(tmp_path / "missing.env"),
                         "-o", str(tmp_path / "out.yml")]) == 2
    assert "no such env file" in capsys.readouterr().err


def test_an_experiment_setting_is_not_changed_through_the_env_file(tmp_path: Path,
                                                                   capsys: Any) -> None:
    env_file = tmp_path / "cluster.env"
    shutil.copy(ROOT / "docker" / "cluster.env", env_file)
    overlay = tmp_path / "six.env"
    overlay.write_text("PS_WORKERS=6\n")
    before = env_file.read_text()
    out = tmp_path / "compose.yml"
    assert compose.main(["--env-file", str(env_file), "--experiment", str(overlay),
                         "-o", str(out), "--workers", "12"]) == 2
    assert "PS_WORKERS is set by the experiment file" in capsys.readouterr().err
    assert env_file.read_text() == before and not out.exists()
    assert compose.main(["--env-file", str(env_file), "--experiment", str(overlay),
                         "-o", str(out), "--shards", "2", "--server-processes", "2"]) == 0
    services = _load(out)["services"]
    assert "worker-5" in services and "worker-6" not in services  # the experiment's n
    assert "PS_SHARDS=2\n" in env_file.read_text()


# --- where the generated file is written --------------------------------------------------

def _resolves_to_root(directory: Path, relative: str) -> bool:
    return (directory / relative).resolve() == ROOT


@pytest.mark.parametrize("where", ["outside", "docker/experiments/gambler.compose.yml"])
def test_a_compose_file_away_from_the_root_has_paths_relative_to_itself(
        where: str, tmp_path: Path) -> None:
    """Its build context and the runs directory's default are the repository's, seen
    from the file's own directory (docker-compose reads them so)."""
    if where == "outside":
        out = tmp_path / "sub" / "gambler.compose.yml"  # its directory made by the generator
        assert _generate(compose, out) == 0
        text = out.read_text()
    else:  # in the repository (rendered only: the test writes nothing there)
        out = ROOT / where
        text = render(deployment_of(GAMBLER), GAMBLER, where)
    services = yaml.safe_load(text)["services"]
    context = services["runs-dir"]["build"]["context"]
    assert context == os.path.relpath(ROOT, out.parent) != "."
    assert _resolves_to_root(out.parent, context)
    source = services["runs-dir"]["volumes"][0].split(":/runs")[0]
    default = re.fullmatch(r"\$\{PS_RUNS_DIR:-(.*)\}", source)
    assert default is not None, source
    assert (out.parent / default.group(1)).resolve() == ROOT / "runs" / "compose"
    for name, service in services.items():
        for volume in service["volumes"]:
            assert volume.startswith(source), (name, volume)
    # the shipped file, at the root, keeps ./
    shipped = _load(ROOT / "docker-compose.yml")["services"]
    assert shipped["runs-dir"]["build"]["context"] == "."
    assert shipped["runs-dir"]["volumes"][0] == "${PS_RUNS_DIR:-./runs/compose}:/runs"
    if where == "outside" and shutil.which("docker-compose"):  # what docker-compose reads
        done = subprocess.run(["docker-compose", "-f", str(out), "config"],
                              capture_output=True, text=True, timeout=60, check=False,
                              env={k: v for k, v in os.environ.items() if k != "PS_RUNS_DIR"})
        assert done.returncode == 0, done.stderr
        seen = yaml.safe_load(done.stdout)["services"]
        assert seen["runs-dir"]["build"]["context"] == str(ROOT)
        volume = seen["server-0"]["volumes"][0]  # v1: a string; v2: a mapping
        source = volume if isinstance(volume, str) else volume["source"]
        assert source.split(":")[0] == str(ROOT / "runs" / "compose" / "server-0")


# --- --check of an experiment's file --------------------------------------------------------

@pytest.mark.parametrize("module", [compose, stack], ids=["compose", "stack"])
def test_check_catches_a_stale_experiment_file(module: Any, tmp_path: Path,
                                               capsys: Any) -> None:
    overlay = tmp_path / "gambler.env"
    shutil.copy(ROOT / EXPERIMENT, overlay)
    out = tmp_path / "gambler.yml"
    assert module.main(["--experiment", str(overlay), "-o", str(out)]) == 0
    assert module.main(["--check", "-o", str(out)]) == 0
    original = overlay.read_text()
    overlay.write_text(original.replace("PS_GAMBLER_P=0.0005", "PS_GAMBLER_P=0.001"))
    capsys.readouterr()
    assert module.main(["--check", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "stale" in err and f"--experiment {overlay} -o {out}" in err
    overlay.write_text(original)
    assert module.main(["--check", "-o", str(out)]) == 0
    # the shipped file with the experiment's options is stale, and the other way round
    shipped = tmp_path / "shipped.yml"
    assert module.main(["-o", str(shipped)]) == 0
    text = shipped.read_text()
    mark = module.ARGS_MARK
    line = next(x for x in text.splitlines() if x.startswith(mark))
    shipped.write_text(text.replace(line, line.replace('"experiment": null',
                                                       f'"experiment": "{EXPERIMENT}"')))
    assert module.main(["--check", "-o", str(shipped)]) == 1


def test_a_file_recorded_before_experiments_reads_as_without_one(tmp_path: Path) -> None:
    old = tmp_path / "old.yml"
    old.write_text(compose.ARGS_MARK + '{"byzantine_workers": [], "env_file": '
                   '"docker/cluster.env", "proxy_shards": [0], "worker_attack": "gaussian"}\n')
    assert recorded_options(old, compose.ARGS_MARK) == SHIPPED
