"""A run's defence: its pre-aggregation chain (``--pre``), its rule (``--rule``) and the
state a stateful rule carries between rounds, built from the run settings in one place.

The server's shard (``server/shard.py``, which the reference engine drives too), the
forging attacks that search against the servers' aggregation (``worker/byzantine.py``),
the launcher's warm-up and the benchmarks all aggregate through :class:`Defence`.

A rule or a pre-aggregator declares the options a run sets as settings (its
``Settings``, see ``common.learn.rules.base.OptionSettings``); :func:`with_option_settings`
makes them fields of the run's settings (``RunConfig``), named after their flags
(``--cc-tau``: ``cc_tau``), so adding a rule with an option is adding its file (named
in the catalogue), and :func:`options_of` reads them back as the keyword options of
the rule.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from common.conf.settings import METADATA_KEY, ROLES, Declared
from common.errors import ConfigError
from common.learn.rules.base import RULES, Rule, Step, as_int, make_rule, option_settings
from common.learn.rules.pre import PRE_AGGREGATORS, Chain, RoundContext, chain_rows, check_chain

if TYPE_CHECKING:
    import torch

    from common.run.config import RunConfig


def options_of(cls: type[Step], values: Any) -> dict[str, Any]:
    """The options rule (or pre-aggregator) ``cls`` declares as settings, from the run
    settings ``values`` (a ``RunConfig``), by option name; an option the run settings do
    not hold (a plugin's, loaded after they were built: ``common.run.plugins``) at its
    default."""
    return {d.name: getattr(values, d.param, d.default) for d in option_settings(cls)}


def validated_q(cfg: RunConfig) -> int:
    """``cfg.q`` of a validated run (``RunConfig.validate`` sets an unset q to the
    rule's default); an unset one is refused as the rules refuse it: ``RuleError``."""
    return as_int(cfg.q, "q")


def rule_options(cfg: RunConfig) -> dict[str, Any]:
    """Keyword options of ``cfg``'s rule."""
    return options_of(RULES[cfg.rule], cfg)


def pre_options(cfg: RunConfig) -> dict[str, dict[str, Any]]:
    """Keyword options of each pre-aggregator of ``cfg``'s chain, by name."""
    return {name: options_of(PRE_AGGREGATORS[name], cfg) for name in cfg.pre_names()}


def rows_after_chain(cfg: RunConfig, rows: int) -> int:
    """Rows the rule gets from ``rows`` pushed rows (options unchecked, no q needed)."""
    return chain_rows(cfg.pre_names(), rows, pre_options(cfg))


def check_defence(cfg: RunConfig, rows: int) -> int:
    """Check that the chain and the rule can aggregate ``rows`` rows at ``cfg.q``; the rows
    the rule then gets. ``RuleError`` naming the step that cannot."""
    return check_chain(cfg.pre_names(), cfg.rule, rows, validated_q(cfg), pre_options(cfg),
                       rule_options(cfg))


def probe_defence(cfg: RunConfig, width: int = 64) -> None:
    """Aggregate a seeded (n, ``width``) matrix with a fresh defence of ``cfg`` (the
    chain and the rule): its kernels compiled or loaded, and a rule that raises or
    returns anything but (width,) float32 (a broken plugin) refused at start with one
    line, ``ConfigError``, instead of at every round; so is a rule that declares itself
    ``coordinatewise`` and gives the column blocks of a test matrix (that one, and one
    with NaN and infinities of a width no multiple of a vector's) other values than the
    whole."""
    import torch


    rng = np.random.default_rng(0)
    rows = rng.standard_normal((cfg.num_workers, width), dtype=np.float32)
    hostile = rng.standard_normal((cfg.num_workers, 2 * width + 22), dtype=np.float32)
    hostile[rng.random(hostile.shape) < 0.05] = np.nan
    hostile[rng.random(hostile.shape) < 0.03] = np.inf
    try:
        defence = Defence(cfg)
        defence(torch.from_numpy(rows), RoundContext(cfg.seed))
        false_claim = defence.coordinatewise and (_blocks_differ(defence, rows)
                                                  or _blocks_differ(defence, hostile))
    except Exception as exc:  # a user's rule: whatever it raises is a refusal
        raise ConfigError(f"--rule {cfg.rule} (--pre {cfg.pre or 'none'}) fails on a "
                          f"test matrix of {cfg.num_workers} rows: {type(exc).__name__}: "
                          f"{exc}") from None
    if false_claim:
        raise ConfigError(f"--rule {cfg.rule} declares itself coordinate-wise, but a test "
                          f"matrix's column blocks aggregated one by one differ from it "
                          f"aggregated whole: a server process of several shards would "
                          f"give other results than the reference (drop coordinatewise)")


def _blocks_differ(defence: Defence, G: np.ndarray) -> bool:
    """Whether ``defence`` gives matrix ``G`` other bits aggregated whole than in three
    column blocks: a broken ``coordinatewise`` claim."""
    import torch

    context = RoundContext(defence.cfg.seed)
    width = G.shape[1]
    whole = defence(torch.from_numpy(G), context).numpy()
    cuts = (0, width // 3, width // 2 + 1, width)
    blocks = [defence(torch.from_numpy(np.ascontiguousarray(G[:, a:b])), context).numpy()
              for a, b in itertools.pairwise(cuts)]
    return not np.array_equal(whole.view(np.int32), np.concatenate(blocks).view(np.int32))


def built_in(step: type[Step]) -> bool:
    """Whether ``step`` is one of this package's (not a plugin's): its options are
    fields of the run settings, whatever was imported or loaded first."""
    return step.__module__.startswith("common.")


def built_ins(steps: Iterable[type[Step]]) -> list[type[Step]]:
    """The built-in rules or pre-aggregators among ``steps``."""
    return [s for s in steps if built_in(s)]


def with_option_settings(after: Mapping[str, Iterable[type[Step]]]
                         ) -> Callable[[type], type]:
    """Class decorator, under ``@dataclass``: after each field named in ``after``, add the
    settings that the classes ``after[field]`` (rules, pre-aggregators) declare, each as
    a field named after its flag; they are run settings (every role takes them, and they
    enter the run hash). ``TypeError`` for a name taken twice. ``RunConfig`` names the
    built-ins (:func:`built_ins`); a plugin's options are no fields, see
    :func:`plugin_option_settings`."""

    def add(cls: type) -> type:
        own = inspect.get_annotations(cls)
        annotations: dict[str, Any] = {}
        for name, hint in own.items():
            annotations[name] = hint
            for owner in after.get(name, ()):
                for d in option_settings(owner):
                    if d.param in own or d.param in annotations:
                        raise TypeError(f"{owner.name}'s setting {d.flag} is taken")
                    annotations[d.param] = typing.get_type_hints(owner.Settings)[d.name]
                    setattr(cls, d.param, _run_field(d))
        cls.__annotations__ = annotations
        return cls

    return add


def plugin_option_settings(steps: Iterable[type[Step]], taken: Iterable[str]
                           ) -> tuple[Declared, ...]:
    """The run settings of the options of the plugin rules and pre-aggregators among
    ``steps`` (those registered now), named after their flags like the built-ins'
    fields; hashed only where they differ from their defaults (a plugin installed does
    not change the hash of a run that does not set its options). ``TypeError`` for a
    flag ``taken`` already or declared twice."""
    out: list[Declared] = []
    names = set(taken)
    for owner in steps:
        if built_in(owner):
            continue
        for d in option_settings(owner):
            if d.param in names:
                raise TypeError(f"{owner.name}'s setting {d.flag} is taken")
            names.add(d.param)
            spec = dataclasses.replace(d.spec, roles=frozenset(ROLES), hashed=True,
                                       hash_default=False, flag=d.flag, env=d.env)
            out.append(dataclasses.replace(d, name=d.param, spec=spec,
                                           roles=frozenset(ROLES)))
    return tuple(out)


def _run_field(d: Declared) -> Any:
    """A field of the run's settings that holds option setting ``d``."""
    spec = dataclasses.replace(d.spec, roles=frozenset(ROLES), hashed=True, flag=d.flag,
                               env=d.env)
    return dataclasses.field(default=d.default, metadata={METADATA_KEY: spec})


class Defence:
    """The pre-aggregation chain and the rule of a run, for rounds of any number of rows
    (n, or the m < n of a round closed at its deadline: the chain built for m rows and
    the rule for what it leaves), and the state a stateful rule carries from round to
    round, whichever rows ran it (centered clipping: the previous aggregate)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self._built: dict[int, tuple[Chain, Rule]] = {}
        self.chain, self.rule = self.for_rows(cfg.num_workers)
        self.state: dict[str, np.ndarray] = {}
        self.last_info: dict[str, Any] = {}

    @property
    def stateful(self) -> bool:
        return self.rule.stateful

    @property
    def coordinatewise(self) -> bool:
        """The defence aggregates each coordinate from its own column alone, whatever the
        width (a coordinate-wise rule, no pre-aggregation step, no state): a matrix's
        column blocks aggregated one by one give the blocks of it aggregated whole."""
        return self.rule.coordinatewise and not self.chain and not self.rule.stateful

    def for_rows(self, rows: int) -> tuple[Chain, Rule]:
        """The chain for ``rows`` rows and the rule for what it leaves (built once);
        ``RuleError`` if they cannot run with that many at this q."""
        built = self._built.get(rows)
        if built is None:
            cfg = self.cfg
            q = validated_q(cfg)
            chain = Chain(cfg.pre_names(), rows, q, pre_options(cfg))
            rule = make_rule(cfg.rule, chain.rows_out, q, **rule_options(cfg))
            built = self._built[rows] = (chain, rule)
        return built

    def __call__(self, G: torch.Tensor, context: RoundContext) -> torch.Tensor:
        """Aggregate a round's contiguous (rows, d) float32 matrix (never modified): the
        chain (seeded by ``context``), then the rule, from the state and updating it.
        ``last_info``: the rule's, with ``"pre"``: the steps that said anything."""
        chain, rule = self.for_rows(G.shape[0])
        if chain:
            G = chain(G, context)
        if rule.stateful:
            rule.set_state(self.state)
        out = rule(G)
        if rule.stateful:
            self.state = dict(rule.get_state())
        info = dict(rule.last_info)
        steps = [step for step in chain.last_info if len(step) > 1] if chain else []
        if steps:
            info["pre"] = steps
        self.last_info = info
        return out

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Continue from ``state`` (a checkpoint's, copied as float32; empty: the first
        round's); ``RuleError`` for entries the rule does not keep."""
        self.rule.set_state(state)
        self.state = {k: np.array(v, dtype=np.float32, copy=True) for k, v in state.items()}
