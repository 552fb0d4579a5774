"""The run's defence (pre-aggregation chain, rule, rule state) built from the settings in
one place; the options rules and pre-aggregators declare as settings; the registries."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np
import pytest
import torch

from common.conf.registry import Registry
from common.conf.settings import ROLES, declared, setting
from common.errors import ConfigError
from common.learn.attacks import ATTACKS, NO_ATTACK
from common.learn.data import DATASETS
from common.learn.models import MODELS, ModelSpec
from common.learn.rules import RULES, OptionSettings, Rule, RuleError, make_rule, register_rule
from common.learn.rules.base import option_settings
from common.learn.rules.defence import (
    Defence,
    options_of,
    plugin_option_settings,
    with_option_settings,
)
from common.learn.rules.pre import PRE_AGGREGATORS, Chain, RoundContext, chain_rows
from common.run.config import RunConfig

RNG = np.random.default_rng(0)


def rows(n: int, d: int) -> torch.Tensor:
    return torch.from_numpy(RNG.standard_normal((n, d)).astype(np.float32))


# --------------------------------------------------------------------------- settings


# (settings, config hash) of runs made before the options moved into the rules' files
EXISTING_RUNS = [
    ({}, "1b4005db4f473390"),
    ({"rule": "multikrum", "multikrum_m": 5}, "f5bdb1a89765df79"),
    ({"rule": "multikrum"}, "d8035195ccaff872"),
    ({"rule": "centered-clipping", "cc_tau": 2.5, "cc_iters": 3}, "1bb817f20ed96ef3"),
    ({"pre": "bucketing", "rule": "krum", "bucket_size": 4}, "8de23f2a46a9cc14"),
    ({"rule": "krum", "multikrum_m": 3, "cc_tau": 7.0, "bucket_size": 3}, "d484694848debc3b"),
]


@pytest.mark.parametrize("settings,expected", EXISTING_RUNS)
def test_the_config_hash_of_an_existing_run_is_unchanged(settings: dict, expected: str) -> None:
    assert RunConfig(**settings).validate().config_hash == expected


def test_every_declared_option_is_a_hashed_run_setting_under_its_flag() -> None:
    run = {d.name: d for d in declared(RunConfig)}
    owners = [*RULES.values(), *PRE_AGGREGATORS.values()]
    options = [d for cls in owners for d in option_settings(cls)]
    assert {d.param for d in options} == {"multikrum_m", "cc_tau", "cc_iters", "bucket_size"}
    for d in options:
        field = run[d.param]
        assert (field.flag, field.env, field.default, field.kind) == (d.flag, d.env, d.default,
                                                                     d.kind)
        assert field.spec.hashed and field.roles == frozenset(ROLES)
    order = [f.name for f in fields(RunConfig)]
    assert order[order.index("q"):order.index("q") + 4] == ["q", "multikrum_m", "cc_tau",
                                                            "cc_iters"]
    assert order[order.index("pre") + 1] == "bucket_size"


def test_the_rule_and_the_chain_get_their_options_from_the_settings() -> None:
    cc = Defence(RunConfig(rule="centered-clipping", cc_tau=2.5, cc_iters=3, q=1).validate())
    assert (cc.rule.tau, cc.rule.iters) == (2.5, 3)
    krum = Defence(RunConfig(rule="multikrum", multikrum_m=4, pre="bucketing", bucket_size=4,
                             q=1).validate())
    assert krum.rule.m == 4 and krum.rule.n == 5
    assert krum.chain.steps[0].s == 4
    assert Defence(RunConfig(rule="multikrum", q=3).validate()).rule.m == 17  # n - q


def test_an_option_left_out_takes_its_settings_default() -> None:
    assert (make_rule("centered-clipping", 5, 1).tau, make_rule("centered-clipping", 5, 1).iters
            ) == (100.0, 1)
    assert Chain(("bucketing",), 6, 1, {}).rows_out == 3  # s = 2
    assert chain_rows(("bucketing",), 6, {}) == 3


class _Halfway(Rule):
    """Not registered: what a new rule with an option declares in its file."""

    name: ClassVar[str] = "halfway"
    options: ClassVar[tuple[str, ...]] = ("share",)

    @dataclass(frozen=True)
    class Settings(OptionSettings):
        share: float = setting(0.5, "Halfway: share of the mean.", flag="--halfway-share",
                               minimum=0.0)


def test_a_new_rules_option_becomes_a_run_setting_after_its_anchor() -> None:
    @dataclass(frozen=True)
    @with_option_settings({"rule": [_Halfway]})
    class Settings:
        rule: str = setting("mean", "The rule.", roles=ROLES)
        lr: float = setting(0.1, "lr", roles=ROLES)

    assert [f.name for f in fields(Settings)] == ["rule", "halfway_share", "lr"]
    share = declared(Settings)[1]
    assert (share.flag, share.env, share.default) == ("--halfway-share", "PS_HALFWAY_SHARE", 0.5)
    assert share.spec.hashed and options_of(_Halfway, Settings(halfway_share=0.25)) == {
        "share": 0.25}
    with pytest.raises(TypeError, match="--halfway-share is taken"):
        with_option_settings({"rule": [_Halfway], "lr": [_Halfway]})(
            type("Twice", (), {"__annotations__": {"rule": str, "lr": float}}))


def test_a_setting_that_is_not_an_option_is_refused_at_registration() -> None:
    class Wrong(Rule):
        name = "wrong"

        @dataclass(frozen=True)
        class Settings(OptionSettings):
            level: float = setting(1.0, "Wrong: a level.", flag="--wrong-level")

    with pytest.raises(TypeError, match=r"wrong declares settings \['level'\]"):
        register_rule(Wrong)
    assert "wrong" not in RULES


# --------------------------------------------------------------------------- defence


def test_the_defence_carries_a_stateful_rules_state_and_says_so() -> None:
    cfg = RunConfig(num_workers=5, rule="centered-clipping", q=1, cc_tau=0.5).validate()
    defence = Defence(cfg)
    assert defence.stateful and not Defence(RunConfig(num_workers=5, q=1).validate()).stateful
    G = rows(5, 4)
    first = defence(G, RoundContext())
    np.testing.assert_array_equal(defence.state["center"], first.numpy())
    second = defence(G, RoundContext())  # clipped around the first aggregate
    assert not torch.equal(first, second)
    defence.set_state({})
    assert torch.equal(defence(G, RoundContext()), first)
    with pytest.raises(RuleError, match="unknown entries"):
        defence.set_state({"momentum": np.zeros(4, np.float32)})


def test_the_defence_reports_the_rule_and_the_steps_that_said_anything() -> None:
    cfg = RunConfig(num_workers=10, rule="krum", pre="nnm,bucketing", q=1).validate()
    defence = Defence(cfg)
    defence(rows(10, 3), RoundContext(seed=1, round=2))  # NNM says nothing of finite rows
    info = defence.last_info
    assert "selected" in info and [step["pre"] for step in info["pre"]] == ["bucketing"]


def test_a_partial_round_gets_its_own_chain_and_rule_built_once() -> None:
    cfg = RunConfig(num_workers=6, rule="mean", pre="bucketing", bucket_size=2, q=1).validate()
    defence = Defence(cfg)
    chain, rule = defence.for_rows(5)
    assert (chain.rows_out, rule.n) == (3, 3) and defence.for_rows(5)[1] is rule
    assert defence.for_rows(6) == (defence.chain, defence.rule)
    strict = Defence(RunConfig(num_workers=7, rule="krum", q=2).validate())
    with pytest.raises(RuleError, match="krum needs 2q\\+2 < n"):
        strict(rows(6, 3), RoundContext())


# --------------------------------------------------------------------------- registries


@pytest.mark.parametrize("registry,error", [(RULES, RuleError), (PRE_AGGREGATORS, RuleError),
                                            (ATTACKS, ConfigError), (DATASETS, ConfigError),
                                            (MODELS, ConfigError)])
def test_an_unknown_name_lists_the_known_ones(registry: Registry, error: type) -> None:
    with pytest.raises(error, match=f"unknown {registry.what} 'nope'; valid: "
                                    f"{', '.join(registry)}$"):
        registry["nope"]
    assert "nope" not in registry and registry.get("nope") is None and len(registry) > 0


def test_a_name_is_registered_once() -> None:
    registry: Registry[ModelSpec] = Registry("model", ConfigError, reserved={"none"})
    spec = ModelSpec("tiny", "a tiny model", lambda shape, classes: None)  # type: ignore
    assert registry.register(spec) is spec and registry["tiny"] is spec
    with pytest.raises(ValueError, match="model name 'tiny' is taken"):
        registry.register(ModelSpec("tiny", "another", spec.build))
    with pytest.raises(ValueError, match="model name 'none' is taken"):
        registry.register(ModelSpec("none", "reserved", spec.build))
    with pytest.raises(ValueError, match="rule name 'krum' is taken"):
        register_rule(RULES["krum"])
    with pytest.raises(ValueError, match=f"attack name '{NO_ATTACK}' is taken"):
        ATTACKS.register(type("Nothing", (), {"name": NO_ATTACK}))
    del registry["tiny"]
    assert list(registry) == []


# --------------------------------------------------------------------------- coordinate-wise


@pytest.mark.parametrize("name", sorted(n for n in RULES if RULES[n].coordinatewise))
@pytest.mark.parametrize(("n", "q"), [(20, 8), (7, 2), (4, 1)])
def test_a_coordinate_wise_rule_gives_each_column_block_what_the_whole_gives(
        name: str, n: int, q: int) -> None:
    """What lets a process aggregate its shards in one call (``server/group.py``)."""
    rng = np.random.default_rng(n)
    rule = make_rule(name, n, q)
    for width in (1, 5, 64, 1000, 4099):
        G = (rng.standard_normal((n, width)) * 10.0 ** rng.integers(-3, 4)).astype(np.float32)
        G[rng.random(G.shape) < 0.05] = np.nan
        G[rng.random(G.shape) < 0.02] = np.inf
        G[:, 0] = np.nan  # an all-NaN coordinate
        cuts = sorted({0, width, *rng.integers(0, width, size=3).tolist()})
        blocks = np.concatenate([rule(torch.from_numpy(np.ascontiguousarray(G[:, a:b])))
                                 .numpy() for a, b in itertools.pairwise(cuts)])
        np.testing.assert_array_equal(rule(torch.from_numpy(G)).numpy().view(np.int32),
                                      blocks.view(np.int32))


def test_the_paper_s_coordinate_wise_rules_are_aggregated_across_shards_in_one_call() -> None:
    coordinatewise = {n for n in RULES if RULES[n].coordinatewise}
    assert {"marmed", "meamed", "trimmed-mean"} <= coordinatewise
    assert not coordinatewise & {"mean", "krum", "centered-clipping"}
    cfg = RunConfig(dataset="synthetic", rule="marmed", q=2, num_workers=7)
    assert Defence(cfg.validate()).coordinatewise
    assert not Defence(RunConfig(dataset="synthetic", rule="marmed", q=2, num_workers=7,
                                 pre="nnm").validate()).coordinatewise  # a mixing step


def test_a_rule_that_claims_to_be_coordinate_wise_and_is_not_is_refused_at_start() -> None:
    from common.learn.rules.defence import probe_defence

    class Centred(Rule):  # subtracts the mean of all coordinates: not per column
        name = "centred-median"
        summary = "a test's"
        coordinatewise = True

        def aggregate(self, G):
            median = G.median(dim=0).values
            return median - median.mean()

    register_rule(Centred)
    try:
        cfg = RunConfig(dataset="synthetic", rule="centred-median", q=1).validate()
        with pytest.raises(ConfigError, match="declares itself coordinate-wise, but a test "
                                              "matrix's column blocks"):
            probe_defence(cfg)
        Centred.coordinatewise = False
        probe_defence(cfg)  # honest, it runs (shard by shard)
    finally:
        del RULES["centred-median"]


def test_a_plugins_options_are_settings_not_fields() -> None:
    """Only the built-ins' options are fields (whatever was loaded first); a plugin's are
    settings declared when asked, hashed only where they differ from their defaults."""
    found = plugin_option_settings([_Halfway, RULES["multikrum"]], taken=["rule"])
    assert [(d.name, d.flag, d.default) for d in found] == [
        ("halfway_share", "--halfway-share", 0.5)]
    assert found[0].spec.hashed and not found[0].spec.hash_default
    with pytest.raises(TypeError, match="--halfway-share is taken"):
        plugin_option_settings([_Halfway], taken=["halfway_share"])
