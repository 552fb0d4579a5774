"""Command-line options shared by every process, each also read from a ``PS_*`` variable.

Precedence, everywhere: command-line flag > ``PS_*`` environment variable > default.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import click

from common.attacks import BITFLIP_PAPER_BITS, BITFLIP_PAPER_COORDS
from common.config import PROXY_ATTACKS, AttackConfig, RunConfig
from common.errors import EXIT_CONFIG, EXIT_INTERRUPTED, PSError
from common.rules import rule_names

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "show_default": True}

EXIT_CODES_HELP = (
    "Exit codes: 0 finished, 2 configuration error, 3 protocol/peer error, "
    "4 timeout, 130 interrupted. Every option can also be set with the PS_* "
    "environment variable shown (flag > environment > default)."
)


def option(*names: str, env: str, **kwargs: Any) -> Callable:
    """A click option read from ``PS_<env>`` too, with the variable shown in --help."""
    return click.option(*names, envvar=f"PS_{env}", show_envvar=True, **kwargs)


def parse_int_list(value: str | tuple[int, ...] | None) -> tuple[int, ...]:
    """Parse ``"0,1,5"`` (or ``""``) into a tuple of ints; ``ConfigError``-free click errors."""
    if value is None or isinstance(value, tuple):
        return value or ()
    text = value.strip()
    if not text:
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None


def _int_list_callback(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[int, ...]:
    return parse_int_list(value)


def _compose(*decorators: Callable) -> Callable:
    def apply(f: Callable) -> Callable:
        for d in reversed(decorators):
            f = d(f)
        return f

    return apply


RUN_CONFIG_OPTIONS = _compose(
    option("--model", env="MODEL", default="mlp", type=click.Choice(["mlp", "cnn"]),
           help="Model: the paper's MLP (MNIST-like data) or CNN."),
    option("--dataset", env="DATASET", default="fashion-mnist",
           type=click.Choice(["fashion-mnist", "mnist", "cifar10", "synthetic"]),
           help="Training data; fashion-mnist is found at Debian's "
           "/usr/share/datasets/fashion-mnist, the others read --data-dir."),
    option("--workers", "-n", "num_workers", env="WORKERS", default=20, type=int,
           help="Number of workers n (every server waits for n pushes per round)."),
    option("--shards", "-S", "num_shards", env="SHARDS", default=4, type=int,
           help="Number of server nodes S; the model is split into S contiguous shards."),
    option("--rule", env="RULE", default="marmed", type=click.Choice(rule_names()),
           help="Aggregation rule (see the README's table)."),
    option("--q", "q", env="Q", default=None, type=int,
           help="Byzantine values tolerated per coordinate (Krum: 2q+2 < n; MeaMed: "
           "q <= ceil(n/2)-1). Default: (n-3)//2, the paper's 8 for n=20; Bulyan (n-3)//4."),
    option("--multikrum-m", env="MULTIKRUM_M", default=None, type=int,
           help="Multi-Krum: number of vectors averaged (default n-q)."),
    option("--lr", env="LR", default=0.1, type=float, help="Learning rate."),
    option("--batch-size", env="BATCH_SIZE", default=32, type=int,
           help="Minibatch size per worker and round."),
    option("--rounds", env="ROUNDS", default=500, type=int, help="Synchronous rounds to run."),
    option("--seed", env="SEED", default=0, type=int,
           help="Run seed: model init, data partition, minibatches, attacks."),
)

RUN_CONFIG_KEYS = (
    "model", "dataset", "num_workers", "num_shards", "rule", "q", "multikrum_m",
    "lr", "batch_size", "rounds", "seed",
)


def run_config_from(kwargs: dict[str, Any]) -> RunConfig:
    """Pop the run-configuration options out of ``kwargs`` and validate them."""
    return RunConfig(**{k: kwargs.pop(k) for k in RUN_CONFIG_KEYS}).validate()


ATTACK_PARAMETER_OPTIONS = _compose(
    option("--gambler-p", env="GAMBLER_P", default=5e-4, type=float,
           help="Gambler: probability that a value is corrupted."),
    option("--gambler-scale", env="GAMBLER_SCALE", default=-1e20, type=float,
           help="Gambler: factor applied to a corrupted value."),
    option("--bitflip-bits", env="BITFLIP_BITS", default=",".join(map(str, BITFLIP_PAPER_BITS)),
           callback=_int_list_callback,
           help="Bit-flip: 0-based float32 bits flipped (paper text 21,29,30,31; the "
           "authors' code 22,29,30,31)."),
    option("--bitflip-coords", env="BITFLIP_COORDS", default=BITFLIP_PAPER_COORDS, type=int,
           help="Bit-flip: the first k model coordinates each get one corrupted value "
           "(paper 1000; authors' code 500)."),
    option("--gaussian-sd", env="GAUSSIAN_SD", default=200.0, type=float,
           help="Gaussian attack: standard deviation."),
    option("--omniscient-scale", env="OMNISCIENT_SCALE", default=1e20, type=float,
           help="Omniscient attack: sends -scale * (sum of the correct vectors)."),
    option("--signflip-scale", env="SIGNFLIP_SCALE", default=1.0, type=float,
           help="Sign-flip attack: sends -scale * (mean of the correct vectors)."),
    option("--alie-z", env="ALIE_Z", default=None, type=float,
           help="ALIE attack: z (default from n and the number of Byzantine workers)."),
    option("--ipm-epsilon", env="IPM_EPSILON", default=0.1, type=float,
           help="IPM attack: sends -epsilon * (mean of the correct vectors)."),
)

ATTACK_PARAMETER_KEYS = (
    "gambler_p", "gambler_scale", "bitflip_bits", "bitflip_coords", "gaussian_sd",
    "omniscient_scale", "signflip_scale", "alie_z", "ipm_epsilon",
)


def int_list_option(*names: str, env: str, help: str) -> Callable:
    """A comma-separated list of ints (e.g. worker ids), from a flag or ``PS_<env>``."""
    return option(*names, env=env, default="", callback=_int_list_callback, help=help)


WORKER_ATTACKS = ("none", "gaussian", "omniscient", "signflip", "alie", "ipm")

SCENARIO_ATTACK_OPTIONS = _compose(
    option("--worker-attack", env="WORKER_ATTACK", default="none",
           type=click.Choice(WORKER_ATTACKS),
           help="Classic model: what the --byzantine-workers send."),
    int_list_option("--byzantine-workers", env="BYZANTINE_WORKERS",
                    help="Ids of the Byzantine workers, e.g. 0,1,2."),
    option("--proxy-attack", env="PROXY_ATTACK", default="none",
           type=click.Choice(PROXY_ATTACKS),
           help="Man-in-the-middle corruption by a ps-proxy in front of each --proxy-shards "
           "server."),
    int_list_option("--proxy-shards", env="PROXY_SHARDS",
                    help="Shards whose server has a proxy in front (default 0 when "
                    "--proxy-attack)."),
    int_list_option("--proxy-victims", env="PROXY_VICTIMS",
                    help="Workers whose pushes a gaussian/omniscient proxy replaces."),
    option("--corrupt-params", env="CORRUPT_PARAMS", is_flag=True,
           help="Proxies also corrupt PARAMS replies to workers."),
    ATTACK_PARAMETER_OPTIONS,
)

SCENARIO_KEYS = ("worker_attack", "byzantine_workers", "proxy_attack", "proxy_shards",
                 "proxy_victims", "corrupt_params")


def scenario_attack_from(cfg: RunConfig, kwargs: dict[str, Any]) -> AttackConfig:
    """Pop a whole run's attack options (``SCENARIO_ATTACK_OPTIONS``) out of ``kwargs``."""
    settings = {k: kwargs.pop(k) for k in SCENARIO_KEYS}
    if settings["proxy_attack"] != "none" and not settings["proxy_shards"]:
        settings["proxy_shards"] = (0,)
    return attack_config(cfg, **settings, **attack_parameters_from(kwargs))


def attack_parameters_from(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pop the attack-parameter options out of ``kwargs``."""
    return {k: kwargs.pop(k) for k in ATTACK_PARAMETER_KEYS}


def attack_config(cfg: RunConfig, **settings: Any) -> AttackConfig:
    """An ``AttackConfig`` built and validated against ``cfg``."""
    return AttackConfig(**settings).validate(cfg)


def setup_logging(role: str, verbose: bool = False) -> None:
    """Human-readable log lines on stderr, tagged with the process role."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s {role} %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )


def pin_torch_threads() -> None:
    """One torch thread per process (many processes share few cores; also makes
    BLAS reductions identical across processes, which the bit-exact check needs)."""
    import torch

    threads = int(os.environ.get("PS_TORCH_THREADS", "1"))
    torch.set_num_threads(threads)


def terminate_on_sigterm() -> None:
    """Treat SIGTERM like Ctrl-C: unwind (closing sockets and files), exit 130."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def exits_cleanly(fn: Callable[..., None]) -> Callable[..., None]:
    """Map domain errors to their exit codes with a one-line message on stderr."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except PSError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except ValueError as exc:  # validation errors from the core library
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_CONFIG)

    return wrapper
