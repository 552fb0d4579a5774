"""Run configuration: validation with precise errors, stable hash, differences."""

from __future__ import annotations

import re

import pytest

from common.errors import ConfigError
from common.learn.rules import rule_class
from common.run.config import AttackConfig, RunConfig


def test_defaults_are_the_papers_setting() -> None:
    cfg = RunConfig().validate()
    assert (cfg.num_workers, cfg.q, cfg.lr, cfg.batch_size) == (20, 8, 0.1, 32)


def test_q_defaults_per_rule() -> None:
    assert rule_class("krum").default_q(20) == 8
    assert rule_class("bulyan").default_q(20) == 4
    assert rule_class("marmed").default_q(2) == 0
    assert RunConfig(rule="bulyan").validate().q == 4


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"model": "resnet"}, "model"),
        ({"dataset": "imagenet"}, "dataset"),
        ({"num_workers": 0}, "--workers must be >= 1"),
        ({"lr": 0.0}, "lr"),
        ({"rounds": 0}, "rounds"),
        ({"q": 20}, "q must satisfy"),
        ({"rule": "krum", "q": 9}, "2q+2 < n"),
        ({"rule": "meamed", "q": 10}, "n=20"),
        ({"rule": "nope"}, "nope"),
        ({"partition": "shards"}, "--partition must be one of iid, dirichlet, extreme, gamma"),
        ({"alpha": 0.0}, "--alpha must be > 0, got 0.0"),
        ({"gamma": 1.5}, "--gamma must be in [0, 1], got 1.5"),
        ({"lr_milestones": (0,)}, "--lr-milestones must be >= 1, got 0"),
        ({"lr_milestones": (9, 9)}, "--lr-milestones names a round twice: 9,9"),
        ({"lr_milestones": (500,)}, "round 500 is not before --rounds 500"),
        ({"lr_milestones": (9,), "lr_decay": 0.0}, "--lr-decay must be in (0, 1]"),
        ({"lr_milestones": (9,), "lr_decay": 2.0}, "(0 < decay <= 1), got 2"),
        ({"lr_decay": 0.5}, "--lr-decay applies at --lr-milestones: give the rounds too"),
    ],
)
def test_invalid_settings_name_the_problem(changes: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        RunConfig(**changes).validate()


def test_hash_is_stable_and_sensitive() -> None:
    a = RunConfig().validate()
    assert a.config_hash == RunConfig().validate().config_hash
    assert len(a.config_hash) == 16
    b = RunConfig(lr=0.05).validate()
    assert a.config_hash != b.config_hash
    assert a.differences(b.to_dict()) == ["lr: 0.1 != 0.05"]
    assert RunConfig(**a.to_dict()) == a
    assert a.differences({**a.to_dict(), "bogus": 1}) == [
        "1 setting(s) this version does not know"]
    odd = a.differences({b"x": 1})  # a peer's odd keys: counted, never echoed
    assert "lr: 0.1 != '<missing>'" in odd and odd[-1].startswith("1 setting(s)")


def test_partition_settings_at_their_defaults_leave_the_hash_of_earlier_runs() -> None:
    """Added after the others (``hash_default=False``): the default configuration keeps
    the hash it had before them (so its checkpoints still resume); set, they count."""
    default = RunConfig().validate()
    assert default.config_hash == "1b4005db4f473390"
    assert {"partition", "alpha", "gamma"} <= set(default.to_dict())  # still in HELLO
    hashes = {RunConfig(**changes).validate().config_hash for changes in (
        {}, {"partition": "dirichlet"}, {"partition": "dirichlet", "alpha": 0.1},
        {"partition": "gamma"}, {"partition": "gamma", "gamma": 0.1}, {"alpha": 0.1})}
    assert len(hashes) == 6
    assert RunConfig(lr=0.05).validate().config_hash != default.config_hash


def test_the_step_schedule_multiplies_lr_by_the_decay_at_each_milestone() -> None:
    """Round t applies lr x decay^k, k the milestones <= t (torch's MultiStepLR stepped
    once a round); the milestones have one spelling (sorted) and so one hash; without
    them the rate is --lr itself, bit for bit, and the hash what it was."""
    cfg = RunConfig(rounds=400, lr=0.2, lr_milestones=(300, 200), lr_decay=0.5).validate()
    assert cfg.lr_milestones == (200, 300)
    assert [cfg.lr_at(t) for t in (0, 199, 200, 299, 300, 399)] == [
        0.2, 0.2, 0.1, 0.1, 0.05, 0.05]
    tenth = RunConfig(rounds=9, lr_milestones=(3, 6)).validate()  # 0.1 x 0.1 x 0.1
    assert [tenth.lr_at(t) for t in (2, 3, 6)] == [0.1, 0.01, 0.001]
    odd = RunConfig(rounds=9, lr=0.123456789012345678, lr_milestones=(3,)).validate()
    assert odd.lr_at(0) == 0.123456789012345678  # --lr itself, every digit
    assert cfg.config_hash == RunConfig(rounds=400, lr=0.2, lr_milestones=[200, 300],
                                        lr_decay=0.5).validate().config_hash
    constant = RunConfig(rounds=400, lr=0.2).validate()
    assert {constant.lr_at(t) for t in range(400)} == {0.2}
    assert len({c.validate().config_hash for c in (
        constant, cfg, RunConfig(rounds=400, lr=0.2, lr_milestones=(200, 300)),
        RunConfig(rounds=400, lr=0.2, lr_milestones=(200,), lr_decay=0.5))}) == 4
    assert RunConfig(lr_decay=0.1).validate().config_hash == "1b4005db4f473390"


def test_differences_look_up_only_the_known_names() -> None:
    """A HELLO's map of thousands of names (the decoder refuses more than 64 entries;
    the rule holds beyond) is compared by this configuration's own names only, and a
    peer's long value is cut short."""
    a = RunConfig().validate()
    flood = {f"name-{i}": i for i in range(3000)} | {"lr": "x" * 10_000}
    out = a.differences(flood)
    assert out[-1] == "3000 setting(s) this version does not know"
    assert len(out) == len(a.to_dict()) + 1
    assert max(len(line) for line in out) < 200


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        ({"worker_attack": "gaussian"}, "at least one byzantine"),
        ({"worker_attack": "bogus", "byzantine_workers": (0,)}, "--worker-attack must be one of"),
        ({"byzantine_workers": (20,), "worker_attack": "gaussian"}, "out of range"),
        ({"byzantine_workers": (1, 1), "worker_attack": "gaussian"}, "duplicate"),
        ({"proxy_attack": "omniscient", "proxy_shards": (0,)}, "proxy-victims"),
        ({"proxy_attack": "gambler", "proxy_shards": (4,)}, "out of range"),
        ({"gambler_p": 1.5}, "--gambler-p must be in"),
        ({"bitflip_bits": (32,)}, "--bitflip-bits must be in"),
        ({"corrupt_params": True, "proxy_attack": "gaussian", "proxy_victims": (0,)}, "PARAMS"),
    ],
)
def test_attack_settings_are_checked(settings: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        AttackConfig.build(**settings).validate(RunConfig().validate())


def test_launcher_children_do_not_inherit_ps_settings(monkeypatch) -> None:
    from ps.launcher.processes import child_environment

    monkeypatch.setenv("PS_EVALUATE", "1")
    monkeypatch.setenv("HOME_LIKE", "kept")
    env = child_environment({"PS_TORCH_THREADS": "1"})
    assert "PS_EVALUATE" not in env
    assert env["HOME_LIKE"] == "kept" and env["PS_TORCH_THREADS"] == "1"
