"""The run configuration every role shares, and the attack scenario of a run.

``RunConfig`` holds what must be identical on every node of a run (model, data, n,
S, rule, q, learning rate, worker momentum, batch, rounds, seed, partition, validation
split). Its
``config_hash`` is compared at the HELLO handshake, so a mis-configured process is
refused with a message naming the settings that differ.

``AttackConfig`` holds the Byzantine behaviour (which workers lie and how, what the
man-in-the-middle proxy corrupts, and every attack's parameters). It is deliberately
*not* part of the hash: an attacker does not announce itself. The in-process
reference engine needs both to reproduce a cluster run bit for bit.

Each field is a setting (``common.conf.settings``): its flag, variable, help and range are
declared here once. Validation only checks; it never builds a rule or a model.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from common.conf.settings import (
    EXPERIMENT,
    LAUNCHERS,
    PROXY,
    ROLES,
    WORKER,
    Declared,
    check_ranges,
    declared,
    hash_input,
    hashed_values,
    setting,
    take,
)
from common.errors import ConfigError
from common.learn.attacks import (
    ATTACKS,
    NO_ATTACK,
    Attack,
    VectorAttack,
    attack_class,
    attack_names,
)
from common.learn.data import PARTITIONS, dataset_names
from common.learn.models import MODELS
from common.learn.rules import RULES, RuleError, rule_class, rule_names
from common.learn.rules.defence import (
    built_ins,
    check_defence,
    plugin_option_settings,
    rows_after_chain,
    with_option_settings,
)
from common.learn.rules.pre import PRE_AGGREGATORS, parse_chain
from common.net.budgets import peer_repr
from common.net.wire import FLOAT32, WIRE_DTYPES
from common.run.plugins import fingerprints

RUN_CONFIG_FILE = "config.json"  # a run's settings and attack, in its output directory
# the roles of a run's settings that a grid of runs (ps-experiment) takes too: those it
# does not vary
RUN_AND_GRID = (*ROLES, EXPERIMENT)
_LR_DECAY = 0.1  # --lr-decay's default: a tenth at each milestone


@dataclass(frozen=True)
@with_option_settings({"q": built_ins(RULES.values()),
                       "pre": built_ins(PRE_AGGREGATORS.values())})
class RunConfig:
    """Settings shared by every server, worker, proxy and evaluator of one run.

    The options of the rules and the pre-aggregators are declared by each (its
    ``Settings``: ``--multikrum-m``, ``--cc-tau``, ``--cc-iters`` after ``q``,
    ``--bucket-size`` after ``pre``). The built-ins' are fields here too, named after
    their flags; a plugin's (loaded when a command starts, after this class exists) are
    settings too (:meth:`extra_settings`), held in ``plugin_options`` and read as
    attributes by the same names. Build an instance with plugin options through
    :meth:`from_settings`.
    """

    model: str = setting("mlp", "Model: the paper's MLP (MNIST-like data) or CNN; wide: "
                         "an MLP of 10.6M parameters, for scaling benchmarks; resnet18: "
                         "ResNet-18 with GroupNorm, 11.2M parameters (CIFAR-10).",
                         roles=RUN_AND_GRID, hashed=True, choices=lambda: tuple(MODELS))
    dataset: str = setting("fashion-mnist", "Training data; fashion-mnist is found at "
                           "Debian's /usr/share/datasets/fashion-mnist, the others read "
                           "--data-dir.", roles=RUN_AND_GRID, hashed=True,
                           choices=dataset_names)
    num_workers: int = setting(20, "Number of workers n (every server waits for n pushes "
                               "per round).", flag="--workers", short="-n",
                               roles=RUN_AND_GRID, hashed=True, minimum=1)
    num_shards: int = setting(4, "Number of server nodes S; the model is split into S "
                              "contiguous shards.", flag="--shards", short="-S",
                              roles=ROLES, hashed=True, minimum=1)
    rule: str = setting("marmed", "Aggregation rule (see the README's table).", roles=ROLES,
                        hashed=True, choices=rule_names)
    q: int | None = setting(None, "Byzantine values tolerated per coordinate (Krum: 2q+2 < n; "
                            "MeaMed: q <= ceil(n/2)-1). Default: (n-3)//2, the paper's 8 for "
                            "n=20; Bulyan (n-3)//4.", roles=ROLES, hashed=True, minimum=0)
    pre: str | None = setting(None, "Pre-aggregation before the rule, on each server's shard "
                              "rows: a comma-separated chain applied in order, e.g. arc,nnm "
                              "(nnm, bucketing, arc; see the README); unset: none. After "
                              "bucketing the rule gets ceil(n/s) rows with the same q, and "
                              "the default q is the rule's for that many rows.", roles=ROLES,
                              hashed=True)
    lr: float = setting(0.1, "Learning rate.", roles=ROLES, hashed=True)
    worker_momentum: float = setting(
        0.0, "Worker momentum beta in [0, 1): each worker pushes m_t = beta m_(t-1) + "
        "(1 - beta) g_t, m starting at 0 (ByzFL's convention), instead of its gradient g_t; "
        "0: the gradient itself (the paper's SGD). A restarted worker's momentum starts "
        "again at 0.", roles=ROLES, hashed=True, minimum=0.0, maximum=1.0)
    batch_size: int = setting(32, "Minibatch size per worker and round.", roles=ROLES,
                              hashed=True, minimum=1)
    rounds: int = setting(500, "Synchronous rounds to run.", roles=RUN_AND_GRID, hashed=True,
                          minimum=1)
    seed: int = setting(0, "Run seed: model init, data partition, minibatches, attacks.",
                        roles=ROLES, hashed=True, minimum=0)
    # added after the others: at their defaults they leave a run's hash what it was
    partition: str = setting(
        "iid", "How the training set is shared out over the n workers (ByzFL's "
        "definitions): iid, a shuffled split (the paper's); dirichlet, each class split by "
        "proportions drawn from Dir(--alpha); extreme, sorted by label then split (one or "
        "two classes per worker); gamma, a --gamma share iid and the rest extreme. A worker "
        "left with fewer samples than --batch-size is refused before the run starts.",
        roles=ROLES, hashed=True, hash_default=False, choices=PARTITIONS)
    alpha: float = setting(1.0, "Dirichlet concentration of --partition dirichlet (> 0): "
                           "0.1 gives each worker a few classes, large values approach iid.",
                           roles=ROLES, hashed=True, hash_default=False, minimum=0.0)
    gamma: float = setting(0.5, "Share of the training set split iid under --partition "
                           "gamma (ByzFL's similarity): 1 is iid, 0 extreme.", roles=ROLES,
                           hashed=True, hash_default=False, minimum=0.0, maximum=1.0)
    iid_workers: tuple[int, ...] = setting(
        (), "Workers given an iid share of the training set instead of a part of the "
        "heterogeneous --partition, which is then shared out over the others only; name "
        "the Byzantine workers here to share the data among the honest ones, as ByzFL does. "
        "No effect with --partition iid.", roles=ROLES, hashed=True, hash_default=False,
        minimum=0)
    wire_dtype: str = setting(
        FLOAT32, "How workers send their vectors: float32, or bfloat16 (half the bytes; "
        "each worker rounds its vector to nearest even, the servers widen it back exactly, "
        "a proxy corrupts the decoded values and rounds what it forwards; the reference "
        "engine rounds at the same point). Parameters always travel as float32.",
        roles=ROLES, hashed=True, hash_default=False, choices=WIRE_DTYPES)
    lr_milestones: tuple[int, ...] = setting(
        (), "Rounds at which the learning rate is multiplied by --lr-decay (a step "
        "schedule, as torch's MultiStepLR stepped once a round): round t applies lr x "
        "decay^k, k the milestones <= t; e.g. 200,300. Empty: a constant --lr (the "
        "paper's).", roles=ROLES, hashed=True, hash_default=False, minimum=1,
        metavar="ROUNDS")
    lr_decay: float = setting(_LR_DECAY, "Factor the learning rate is multiplied by at each of "
                              "--lr-milestones: 0 < decay <= 1.", roles=ROLES, hashed=True,
                              hash_default=False)
    validation: float = setting(
        0.0, "Share of the training set held out as the evaluation set, in place of the "
        "test set, for tuning a setting: stratified by class, the same samples for every "
        "seed (drawn from a fixed seed), taken out before --partition shares the rest over "
        "the workers; 0: off, the test set.", roles=ROLES, hashed=True, hash_default=False,
        minimum=0.0, maximum=1.0)
    # the values of the plugin rules' and pre-aggregators' options, (name, value) sorted
    plugin_options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        # the ids as they come from a peer's or a file's dict (a list) are the same setting
        for name in ("iid_workers", "lr_milestones"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))

    @classmethod
    def extra_settings(cls) -> tuple[Declared, ...]:
        """The options of the plugin rules and pre-aggregators registered now."""
        fields = (f.name for f in dataclasses.fields(cls))
        return plugin_option_settings((*RULES.values(), *PRE_AGGREGATORS.values()), fields)

    @classmethod
    def from_settings(cls, **values: Any) -> RunConfig:
        """An instance from settings by name, a plugin's options among them (as read
        from a run's ``config.json``, a grid cell or a peer); ``TypeError`` for a name
        that is no setting."""
        fields = {f.name for f in dataclasses.fields(cls)}
        defaults = {d.name: d.default for d in cls.extra_settings()}
        unknown = set(values) - fields - set(defaults)
        if unknown:
            raise TypeError(f"RunConfig has no settings {sorted(unknown)}")
        given = {k: v for k, v in values.items() if k in fields}
        # later values win; an option at its default is left out, so that two runs that
        # hash alike are equal
        options = dict(given.get("plugin_options", ()))
        options.update((k, v) for k, v in values.items() if k in defaults)
        kept = tuple(sorted((k, v) for k, v in options.items()
                            if k not in defaults or v != defaults[k]))
        return cls(**{**given, "plugin_options": kept})

    def __getattr__(self, name: str) -> Any:
        """A plugin's option by its name: its value in this run, else its default."""
        if name.startswith("_") or name == "plugin_options":
            raise AttributeError(name)
        for key, value in self.plugin_options:
            if key == name:
                return value
        for d in self.extra_settings():
            if d.name == name:
                return d.default
        raise AttributeError(f"RunConfig has no setting {name!r}")

    def validate(self) -> RunConfig:
        """Raise ``ConfigError`` naming the offending setting.

        Returns the validated configuration, with ``q`` resolved when it was left
        unset (``None``): the rule's ``default_q``.
        """
        check_ranges(self)
        rule = rule_class(self.rule)
        try:
            chain = ",".join(parse_chain(self.pre or "")) or None
        except RuleError as exc:
            raise ConfigError(f"--pre {self.pre!r}: {exc}") from exc
        if chain != self.pre:  # one spelling per chain, so that one chain has one hash
            return replace(self, pre=chain).validate()
        if self.q is None:
            rows = rows_after_chain(self, self.num_workers)
            return replace(self, q=rule.default_q(rows)).validate()
        if not self.lr > 0:
            raise ConfigError(f"--lr must be > 0, got {self.lr}")
        if not self.alpha > 0:
            raise ConfigError(f"--alpha must be > 0, got {self.alpha}")
        if list(self.iid_workers) != sorted(self.iid_workers):  # one spelling, one hash
            return replace(self, iid_workers=tuple(sorted(self.iid_workers))).validate()
        _check_ids("--iid-workers", self.iid_workers, self.num_workers)
        if list(self.lr_milestones) != sorted(self.lr_milestones):  # one spelling, one hash
            return replace(self, lr_milestones=tuple(sorted(self.lr_milestones))).validate()
        self._check_schedule()
        _require(len(self.iid_workers) < self.num_workers,
                 "--iid-workers must leave at least one worker for the --partition split")
        _require(self.validation < 1, "--validation must be below 1 (the share of the "
                 f"training set held out; 0: off), got {self.validation:g}")
        if not 0 <= self.worker_momentum < 1:
            raise ConfigError(f"--worker-momentum must be in [0, 1), got {self.worker_momentum}")
        if not self.q < self.num_workers:
            raise ConfigError(
                f"q must satisfy 0 <= q < num_workers={self.num_workers}, got {self.q}")
        try:
            self.check_rows(self.num_workers)
        except RuleError as exc:
            what = f"--pre {self.pre!r}, rule {self.rule!r}" if self.pre else f"rule {self.rule!r}"
            raise ConfigError(f"{what}: {exc}") from exc
        return self

    def _check_schedule(self) -> None:
        """``ConfigError`` for a step schedule that would not do what it says."""
        steps = self.lr_milestones
        _require(len(set(steps)) == len(steps), "--lr-milestones names a round twice: "
                 f"{','.join(map(str, steps))}")
        _require(not steps or steps[-1] < self.rounds, f"--lr-milestones: round "
                 f"{steps[-1] if steps else 0} is not before --rounds {self.rounds}: it "
                 "would never apply")
        _require(0 < self.lr_decay <= 1, "--lr-decay must be in (0, 1] (0 < decay <= 1), got "
                 f"{self.lr_decay:g}")
        _require(bool(steps) or self.lr_decay == _LR_DECAY, "--lr-decay applies at "
                 "--lr-milestones: give the rounds too")

    def lr_at(self, round_: int) -> float:
        """The learning rate of round ``round_``'s update (``--lr`` times ``--lr-decay``
        once per milestone reached, to 12 significant digits: 0.1 x 0.1 is 0.01, not
        0.010000000000000002), the one value every shard and the reference engine apply
        (as float32) and log. Before the first milestone: ``--lr`` itself."""
        steps = bisect.bisect_right(self.lr_milestones, round_)
        return float(f"{self.lr * self.lr_decay ** steps:.12g}") if steps else self.lr

    def check_rows(self, rows: int) -> int:
        """Check that the pre-aggregation chain and the rule can aggregate ``rows`` rows
        (n, or a quorum) at this q; the rows the rule then gets. ``RuleError`` if not."""
        return check_defence(self, rows)

    def pre_names(self) -> tuple[str, ...]:
        """The pre-aggregators of ``--pre``, in order (``RuleError`` for an unknown one)."""
        return parse_chain(self.pre or "")

    def to_dict(self) -> dict[str, Any]:
        return hashed_values(self)

    def plugins(self) -> list[str]:
        """The fingerprints of the plugins this run names (``common.run.plugins``: each
        one's dotted path or entry point with its source's hash or package version)."""
        names = [self.rule, *(p.strip() for p in (self.pre or "").split(",")), self.model,
                 self.dataset]
        return fingerprints(names)

    @property
    def config_hash(self) -> str:
        """Stable 16-hex-digit hash of the canonical JSON of every hashed setting (those
        added later only where they differ from their defaults: ``hash_input``) and of
        the plugins the run names, if any (their code: every node must run the same)."""
        data = hash_input(self)
        plugged = self.plugins()
        if plugged:
            data = {**data, "plugins": plugged}
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def differences(self, other: Mapping[Any, Any]) -> list[str]:
        """Human-readable ``name: ours != theirs`` for each setting that differs.

        ``other`` comes from a peer: only the names of this configuration's settings are
        looked up (a peer's map of thousands of names costs no more than a right one),
        each value compared as it is, never trusted; other names are counted.
        """
        ours = self.to_dict()
        missing = "<missing>"
        out = [f"{k}: {ours[k]!r} != {peer_repr(other.get(k, missing), 80)}"
               for k in sorted(ours) if ours[k] != other.get(k, missing)]
        unknown = len(other) - sum(k in other for k in ours)
        if unknown:
            out.append(f"{unknown} setting(s) this version does not know")
        return out


def _worker_attacks() -> tuple[str, ...]:
    return attack_names(WORKER)


def _proxy_attacks() -> tuple[str, ...]:
    return attack_names(PROXY)


@dataclass(frozen=True)
class AttackConfig:
    """Byzantine behaviour of a run (not part of the handshake hash).

    * ``worker_attack`` on ``byzantine_workers``: the classic model, whole vectors,
      computed by the Byzantine worker processes themselves;
    * ``proxy_attack`` on the shards in ``proxy_shards``: the man-in-the-middle proxy;
      value-level attacks (gambler, bitflip) corrupt every push (generalized model),
      vector attacks replace the pushes of ``proxy_victims`` (classic model);
    * ``params``: every registered attack with its parameters (defaults where not given).
    """

    worker_attack: str = setting(NO_ATTACK, "Classic model: what the --byzantine-workers "
                                 "send.", roles=(WORKER, *LAUNCHERS), choices=_worker_attacks)
    byzantine_workers: tuple[int, ...] = setting(
        (), "Ids of the (colluding) Byzantine workers, e.g. 0,1,2 (ps-worker: default this "
        "worker when --worker-attack is given).", roles=(WORKER, *LAUNCHERS), minimum=0)
    proxy_attack: str = setting(NO_ATTACK, "Man-in-the-middle corruption by a ps-proxy: "
                                "gambler/bitflip on every push value (generalized model), a "
                                "vector attack on the pushes of --proxy-victims.",
                                roles=(PROXY, *LAUNCHERS), choices=_proxy_attacks)
    proxy_shards: tuple[int, ...] = setting(
        (), "Shards a proxy corrupts, in front of the server process hosting each (default "
        "0 when --proxy-attack; ps-proxy: default every shard of its server).",
        roles=(PROXY, *LAUNCHERS), minimum=0)
    proxy_victims: tuple[int, ...] = setting(
        (), "Workers whose pushes a proxy's vector attack replaces.",
        roles=(PROXY, *LAUNCHERS), minimum=0)
    corrupt_params: bool = setting(False, "Proxies also corrupt PARAMS replies to workers "
                                   "(gambler/bitflip).", roles=(PROXY, *LAUNCHERS))
    params: Mapping[str, Attack] = field(default_factory=dict)

    def __post_init__(self) -> None:
        given = dict(self.params)
        unknown = sorted(set(given) - set(ATTACKS))
        if unknown:
            raise ConfigError(f"parameters for unknown attacks: {', '.join(unknown)}")
        full: dict[str, Attack] = {}
        for name, cls in ATTACKS.items():
            value: Attack | dict[str, Any] = given.get(name, {})
            full[name] = value if isinstance(value, Attack) else cls(**value)
        object.__setattr__(self, "params", full)

    @classmethod
    def build(cls, values: Mapping[str, Any] | None = None, roles: frozenset[str] = LAUNCHERS,
              **given: Any) -> AttackConfig:
        """From command values keyed by parameter name (``gambler_p=...``, as click gives
        them) and scenario fields (``proxy_attack="gambler"``); ``given`` may hold both."""
        parameters = {d.param for a in ATTACKS.values() for d in declared(a)}
        values = {**(values or {}), **{k: v for k, v in given.items() if k in parameters}}
        scenario = {k: v for k, v in given.items() if k not in parameters}
        params = {name: take(a, values, roles) for name, a in ATTACKS.items()}
        return take(cls, values, roles, params=params, **scenario)

    def attack(self, name: str) -> Attack:
        """Attack ``name`` with this run's parameters."""
        attack_class(name)
        return self.params[name]

    def active(self, name: str) -> tuple[Attack, ...]:
        """``(attack name with its parameters,)``, or ``()`` for "none"."""
        return () if name == NO_ATTACK else (self.attack(name),)

    def validate(self, cfg: RunConfig) -> AttackConfig:
        """Check the attack settings against the run; raise ``ConfigError``.

        Returns the validated configuration, with ``proxy_shards`` defaulting to (0,)
        when a proxy attack is given without shards.
        """
        if self.proxy_attack != NO_ATTACK and not self.proxy_shards:
            return replace(self, proxy_shards=(0,)).validate(cfg)
        check_ranges(self)
        for params in self.params.values():
            check_ranges(params)
        n, s = cfg.num_workers, cfg.num_shards
        _check_ids("byzantine worker", self.byzantine_workers, n)
        _check_ids("proxy victim worker", self.proxy_victims, n)
        _check_ids("proxy shard", self.proxy_shards, s)
        if self.worker_attack != NO_ATTACK:
            _require(bool(self.byzantine_workers),
                     f"worker attack {self.worker_attack!r} needs at least one byzantine worker")
            _require(len(self.byzantine_workers) < n,
                     "at least one worker must be honest for a worker attack")
            self.attack(self.worker_attack).check(n, len(self.byzantine_workers))
        if self.proxy_attack != NO_ATTACK:
            proxy = self.attack(self.proxy_attack)
            if self.vector_proxy:
                _require(bool(self.proxy_victims),
                         f"proxy attack {self.proxy_attack!r} needs --proxy-victims (worker ids)")
                _require(len(self.proxy_victims) < n, "at least one proxy victim must stay honest")
            proxy.check(n, len(self.proxy_victims))
        _require(not self.corrupt_params or (self.proxy_attack != NO_ATTACK
                                             and not self.vector_proxy),
                 "corrupting PARAMS replies needs a value-level proxy attack (gambler or bitflip)")
        return self

    @property
    def vector_proxy(self) -> bool:
        """The proxy replaces whole pushes of its victims (classic model)."""
        return isinstance(self.params.get(self.proxy_attack), VectorAttack)

    @property
    def proxy_holds_rounds(self) -> bool:
        """The proxy's attack reads every honest push of a round before it forwards any."""
        attack = self.params.get(self.proxy_attack)
        return isinstance(attack, VectorAttack) and attack.reads_honest

    def is_byzantine(self, worker: int) -> bool:
        return self.worker_attack != NO_ATTACK and worker in self.byzantine_workers

    def to_dict(self) -> dict[str, Any]:
        out = {d.name: getattr(self, d.name) for d in declared(AttackConfig)}
        out["params"] = {name: dataclasses.asdict(a) for name, a in self.params.items()}
        return out


def write_run_config(out_dir: Path, cfg: RunConfig, attack: AttackConfig) -> None:
    """``out_dir/config.json``: the run's settings and attack (ps-cluster, ps-simulate)."""
    path = out_dir / RUN_CONFIG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"run": cfg.to_dict(), "attack": attack.to_dict()}, indent=2)
                    + "\n", encoding="utf-8")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _check_ids(what: str, ids: tuple[int, ...], limit: int) -> None:
    for i in ids:
        _require(0 <= i < limit, f"{what} id {i} out of range 0..{limit - 1}")
    _require(len(set(ids)) == len(ids), f"duplicate {what} ids in {ids}")

