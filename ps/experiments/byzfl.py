"""Our rules, pre-aggregators and attacks beside ByzFL's (EPFL's library, PyPI ``byzfl``;
issue 37, "a peer's numbers beside ours").

Two parts:

* :func:`agreement`: for each :class:`Pair` (one of ours and its ByzFL counterpart), the
  same float32 inputs into both (n = 20, f in {2, 4, 8}, d = 1000, several seeds; rows
  that are all correct, or whose first f are the omniscient attack's or ALIE's), ByzFL
  fed once numpy arrays and once torch tensors (its two code paths), and the outputs
  compared by :func:`within_rounding`, or by the pair's own check where no rounding
  bound applies (a distribution, an attack's line search).
* :func:`train_cells`: ByzFL's aggregators as rules of ours (``byzfl-median``, ...,
  registered only while :func:`registered` is active), trained beside ours through the
  reference engine on the same data, n, f, attack, model, lr and rounds. ByzFL's own
  benchmark imports torchvision, which does not install next to torch 2.13 here, so its
  aggregators are driven from our engine instead.

ByzFL is imported only inside functions (:func:`load_byzfl`): this module imports
without it, and nothing else in the product imports it. Its top package imports its
benchmark, hence torchvision; its ``aggregators`` and ``attacks`` subpackages do not, so
where torchvision is absent ``byzfl`` is entered in ``sys.modules`` as a bare package
(its ``__init__`` not run) and those two are imported from it; nothing is stubbed.
``scripts/compare_byzfl.py`` writes ``docs/results/byzfl/``. CI does not install byzfl:
the test that runs ByzFL (``tests/unit/ps/test_byzfl_compare.py``) is skipped there.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import sys
import time
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np

from common.learn.rules.base import RULES, Rule, median_bound
from ps.experiments.claims import Sample, below, within
from ps.experiments.runner import machine

if TYPE_CHECKING:
    import torch

N, D = 20, 1000
FS = (2, 4, 8)
EXHAUSTIVE_FS = (2, 4)  # ByzFL's MDA enumerates the C(n, f) subsets in Python
INPUTS = ("clean", "omniscient", "alie")
BACKENDS = ("numpy", "torch")
UNIT_ROUNDOFF = 2.0 ** -24  # float32
STATEFUL_ROUNDS = 3  # centered clipping: its state carried over this many rounds
P_VALUE = 0.01  # the distribution checks' level


# --------------------------------------------------------------------------- ByzFL


@dataclass(frozen=True)
class ByzFL:
    """ByzFL's modules that the comparison uses, its version and how it was imported."""

    aggregators: Any
    attacks: Any
    version: str
    imported: str


def load_byzfl() -> ByzFL:
    """ByzFL's ``aggregators`` and ``attacks``; ``ImportError`` if byzfl is not installed.

    Without torchvision, ``byzfl`` is entered in ``sys.modules`` as a bare package (its
    ``__init__``, which imports the benchmark and so torchvision, is not run) and the
    two subpackages are imported from it."""
    spec = importlib.util.find_spec("byzfl")
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError("byzfl is not installed (pip install --no-deps byzfl)")
    imported = "import byzfl"
    if "byzfl" not in sys.modules:
        if importlib.util.find_spec("torchvision") is None:
            package = types.ModuleType("byzfl")
            package.__path__ = list(spec.submodule_search_locations)
            package.__spec__ = spec
            sys.modules["byzfl"] = package
        else:
            importlib.import_module("byzfl")
    if not hasattr(sys.modules["byzfl"], "Average"):
        imported = ("byzfl.aggregators and byzfl.attacks from a bare byzfl package (its "
                    "__init__ imports the benchmark, hence torchvision; not run)")
    return ByzFL(importlib.import_module("byzfl.aggregators"),
                 importlib.import_module("byzfl.attacks"),
                 importlib.metadata.version("byzfl"), imported)


# --------------------------------------------------------------------------- pairs


def _none(f: int) -> dict[str, Any]:
    return {}


def _f(f: int) -> dict[str, Any]:
    return {"f": f}


def _same(f: int) -> int:
    return f


def alie_tau(z: float, honest_rows: int) -> float:
    """ByzFL's ALIE factor that forges what ours forges with ``z``: ByzFL sends ``mean +
    tau * std`` with the sample std (ddof 1), ours ``mean - z * std`` with the population
    std (ddof 0), so ``tau = -z * sqrt((h - 1) / h)``."""
    return -z * float(np.sqrt((honest_rows - 1) / honest_rows))


def _alie_mapped(f: int) -> dict[str, Any]:
    from common.learn.attacks.alie import alie_z

    return {"tau": alie_tau(alie_z(N, f), N - f)}


SEARCH = {"evals": 16, "start": 0.0, "delta": 1.0, "ratio": 0.8}  # ours' defaults, both


@dataclass(frozen=True)
class Pair:
    """One of ours (a registered rule, pre-aggregator or attack) and ByzFL's class."""

    kind: str  # "rule", "pre" or "attack"
    ours: str
    theirs: str
    ours_text: str
    theirs_text: str
    ours_options: Callable[[int], dict[str, Any]] = _none
    theirs_options: Callable[[int], dict[str, Any]] = _none
    q: Callable[[int], int] = _same
    check: str = "rounding"  # "rounding", "distribution" or "search"
    note: str = ""
    fs: tuple[int, ...] = FS
    inputs: tuple[str, ...] = INPUTS
    target: tuple[str, str] = ("", "")  # optimised attacks: our rule, ByzFL's class
    rounds: int = 1  # > 1: a stateful rule, fed that many matrices in turn

    @property
    def label(self) -> str:
        return f"{self.ours_text} / {self.theirs_text}"


PAIRS: tuple[Pair, ...] = (
    Pair("rule", "mean", "Average", "mean", "Average()"),
    Pair("rule", "marmed", "Median", "marmed", "Median()"),
    Pair("rule", "trimmed-mean", "TrMean", "trimmed-mean q=f", "TrMean(f)",
         theirs_options=_f),
    Pair("rule", "meamed", "Meamed", "meamed q=f", "Meamed(f)", theirs_options=_f),
    Pair("rule", "krum", "Krum", "krum q=f", "Krum(f)", theirs_options=_f),
    Pair("rule", "krum", "Krum", "krum q=f-1", "Krum(f)", theirs_options=_f,
         q=lambda f: f - 1),
    Pair("rule", "multikrum", "MultiKrum", "multikrum q=f", "MultiKrum(f)",
         theirs_options=_f),
    Pair("rule", "multikrum", "MultiKrum", "multikrum q=f-1 m=n-f", "MultiKrum(f)",
         ours_options=lambda f: {"m": N - f}, theirs_options=_f, q=lambda f: f - 1),
    Pair("rule", "geomed", "GeometricMedian", "geomed", "GeometricMedian()"),
    Pair("rule", "geomed", "GeometricMedian", "geomed tol=1e-9",
         "GeometricMedian(nu=1e-6, T=1000)",
         ours_options=lambda f: {"tol": 1e-9, "max_iter": 1000},
         theirs_options=lambda f: {"nu": 1e-6, "T": 1000}),
    Pair("rule", "centered-clipping", "CenteredClipping", "centered-clipping",
         "CenteredClipping()", rounds=STATEFUL_ROUNDS),
    Pair("rule", "centered-clipping", "CenteredClipping", "centered-clipping tau=10 L=3",
         "CenteredClipping(tau=10, L=3)", ours_options=lambda f: {"tau": 10.0, "iters": 3},
         theirs_options=lambda f: {"tau": 10.0, "L": 3}, rounds=STATEFUL_ROUNDS),
    Pair("rule", "mda", "MDA", "mda q=f", "MDA(f)", theirs_options=_f, fs=EXHAUSTIVE_FS),
    Pair("rule", "smea", "SMEA", "smea q=f", "SMEA(f)", theirs_options=_f, fs=(2,)),
    Pair("rule", "caf", "CAF", "caf q=f", "CAF(f)", theirs_options=_f,
         inputs=("clean", "alie")),
    Pair("pre", "nnm", "NNM", "nnm q=f", "NNM(f)", theirs_options=_f),
    Pair("pre", "bucketing", "Bucketing", "bucketing s=2", "Bucketing(s=2)",
         ours_options=lambda f: {"s": 2}, theirs_options=lambda f: {"s": 2}, fs=(2,)),
    Pair("pre", "bucketing", "Bucketing", "bucketing s=3", "Bucketing(s=3)",
         ours_options=lambda f: {"s": 3}, theirs_options=lambda f: {"s": 3}, fs=(2,)),
    Pair("pre", "arc", "ARC", "arc q=f", "ARC(f)", theirs_options=_f),
    Pair("attack", "signflip", "SignFlipping", "signflip", "SignFlipping()",
         inputs=("clean",)),
    Pair("attack", "ipm", "InnerProductManipulation", "ipm epsilon=0.1",
         "InnerProductManipulation(tau=0.1)", ours_options=lambda f: {"epsilon": 0.1},
         theirs_options=lambda f: {"tau": 0.1}, inputs=("clean",)),
    Pair("attack", "alie", "ALittleIsEnough", "alie (z of n, f)",
         "ALittleIsEnough(tau=-z sqrt((h-1)/h))", theirs_options=_alie_mapped,
         inputs=("clean",)),
    Pair("attack", "alie", "ALittleIsEnough", "alie (z of n, f)", "ALittleIsEnough()",
         inputs=("clean",)),
    Pair("attack", "gaussian", "Gaussian", "gaussian sd=200", "Gaussian(sigma=200)",
         theirs_options=lambda f: {"mu": 0.0, "sigma": 200.0}, check="distribution",
         inputs=("clean",)),
    Pair("attack", "inf", "Inf", "inf", "Inf()", inputs=("clean",)),
    Pair("attack", "mimic", "Mimic", "mimic index=0", "Mimic(epsilon=0)",
         theirs_options=lambda f: {"epsilon": 0}, inputs=("clean",)),
    *(Pair("attack", ours, theirs, f"{ours} vs {rule}",
           f"{theirs}(agg={agg}, pre_agg_list=[])",
           ours_options=lambda f: dict(SEARCH), theirs_options=lambda f: dict(SEARCH),
           check="search", inputs=("clean",), target=(rule, agg))
      for ours, theirs in (("alie-opt", "Optimal_ALittleIsEnough"),
                           ("ipm-opt", "Optimal_InnerProductManipulation"))
      for rule, agg in (("marmed", "Median"), ("trimmed-mean", "TrMean"))),
)
"""Every comparison: the pairs whose definitions match, and, beside them, the pairs a
user would set alike (the same f, the defaults) where the definitions differ."""

_OVERFLOW = ("ByzFL computes norms in float32: those of the forged rows (about 1e21 per "
             "value) overflow to inf")
NOTES: dict[str, str] = {
    "mean / Average()": "Same definition; numpy sums in another order (rounding), torch "
    "is the same `torch.mean`, bit for bit.",
    "marmed / Median()": "Same definition (even n: the mean of the two middle values); "
    "ByzFL's torch path, `torch.quantile(0.5)`, interpolates a + 0.5 (b - a): rounding.",
    "trimmed-mean q=f / TrMean(f)": "Same definition.",
    "meamed q=f / Meamed(f)": "Same definition: per coordinate, the mean of the n - f "
    "values nearest the median.",
    "krum q=f / Krum(f)": "Different scores: ours sums the squared distances to the "
    "n - q - 2 nearest others (Blanchard et al.), ByzFL averages those to the n - f - 1 "
    "nearest; with the same f they can pick different rows (here they never did).",
    "krum q=f-1 / Krum(f)": "With q = f - 1 both score each row on its n - f - 1 nearest "
    "others (a sum and a mean have the same argmin): the same row, bit for bit.",
    "multikrum q=f / MultiKrum(f)": "Both average n - f rows (our default m = n - q; the "
    "paper leaves m free, ByzFL fixes n - f), ranked by different Krum scores (see "
    "Krum): other rows on some inputs.",
    "multikrum q=f-1 m=n-f / MultiKrum(f)": "The same scores (q = f - 1) and the same "
    "m = n - f.",
    "geomed / GeometricMedian()": "Different solvers at their defaults: ByzFL takes T = 3 "
    "smoothed Weiszfeld steps from 0, distances floored at nu = 0.1; ours iterates from "
    "the mean until a step is below 1e-6 of the median distance, at most 100 steps. "
    "Omniscient rows: see the next rows; and at f = 8 our 100 steps stop before "
    "convergence (`converged: false` in `last_info`), far from the median.",
    "geomed tol=1e-9 / GeometricMedian(nu=1e-6, T=1000)": "Both run to convergence: the "
    "same geometric median.",
    "geomed tol=1e-9 / GeometricMedian(nu=1e-6, T=1000) [omniscient]": f"{_OVERFLOW}, "
    "their weights to 0: ByzFL returns the geometric median of the correct rows alone. "
    "Ours (float64) returns that of all n rows, which the f far rows pull away from the "
    "correct ones (a unit force each), as the definition says.",
    "centered-clipping / CenteredClipping()": "Same algorithm and state: both start at 0 "
    "and carry the last output over (3 rounds chained); tau = 100, L = 1.",
    "centered-clipping tau=10 L=3 / CenteredClipping(tau=10, L=3)": "Same algorithm and "
    "state (3 rounds chained), clipping correct rows too.",
    "mda q=f / MDA(f)": "Same definition (ties: the first subset in lexicographic order). "
    "f = 8 left out: ByzFL enumerates the 125,970 subsets in Python (about 5 s a call "
    "on an idle core here).",
    "smea q=f / SMEA(f)": "ByzFL estimates each subset's top eigenvalue by one power-"
    "iteration step from a random vector, so it picks a random subset; ours is exact. "
    "Omniscient rows: every subset holding a forged row is far worse, so both drop "
    "them. f = 2 only (ByzFL's Python enumeration).",
    "caf q=f / CAF(f)": "ByzFL's top eigenvector is one power-iteration step from a "
    "random vector, so its filter is random; ours is exact. Omniscient rows left out: "
    "there ByzFL's CAF never returns: its max tau is over every row, so the forged rows, "
    "weighted 0 after the first step, keep it, each correct weight is multiplied by "
    "1 - tau_i / tau_max (about 1 - 1e-40), which rounds to 1, and the weights sum to "
    "n - f > n - 2f for ever. Ours takes the max over the rows still weighted.",
    "nnm q=f / NNM(f)": "Same definition: each row becomes the mean of its n - f nearest "
    "rows, itself included.",
    "bucketing s=2 / Bucketing(s=2)": "The same permutation in both: ByzFL shuffles with "
    "numpy's (torch's) global generator, seeded, so its permutation sigma is known "
    "beforehand, and it is handed our rows in the order tau, tau[sigma] = ours'.",
    "bucketing s=3 / Bucketing(s=3)": "As s = 2; both put the n mod s rows left in a "
    "last, smaller bucket.",
    "arc q=f / ARC(f)": "Same k = floor(2 f (n - f) / n) and threshold (the norm of the "
    "largest row left unclipped).",
    "signflip / SignFlipping()": "Same: minus the mean of the correct vectors.",
    "ipm epsilon=0.1 / InnerProductManipulation(tau=0.1)": "Same with ByzFL's tau = our "
    "epsilon (defaults differ: ours 0.1, ByzFL's 2.0).",
    "alie (z of n, f) / ALittleIsEnough(tau=-z sqrt((h-1)/h))": "ByzFL sends mean + tau "
    "std with the sample std (ddof 1), ours mean - z std with the population std (ddof "
    "0); with tau = -z sqrt((h - 1)/h), h = n - f, the same vectors.",
    "alie (z of n, f) / ALittleIsEnough()": "At the defaults they differ: ByzFL's tau = "
    "1.5 moves every coordinate up by 1.5 sample std, ours down by Baruch et al.'s "
    "z(n, f) population std (0.13, 0.39, 1.04 for f = 2, 4, 8).",
    "gaussian sd=200 / Gaussian(sigma=200)": "Different generators (ours a PCG64 stream "
    "per round, ByzFL numpy's or torch's global one): compared as distributions, N(0, "
    "200^2) on both sides. ByzFL's ByzantineClient sends its one vector from all f "
    "Byzantine clients; ours draws f independent vectors.",
    "inf / Inf()": "Same: +inf everywhere (ByzFL's in float64).",
    "mimic index=0 / Mimic(epsilon=0)": "Same: copies of the first correct vector.",
    **{label: "The same line search in outline, not in detail: ByzFL 0.0.11's contraction "
       "only probes best + delta (never below the best), ours (the LineMaximize of an "
       "earlier ByzFL, as `line_maximize` says) moves the probe toward the best and "
       "bisects; and ALIE's sign and std as above. Both run 16 evaluations, start 0, step "
       "1, ratio 0.8 (ours' defaults; ByzFL's are 20, 0, 10, 0.8). The distances each "
       "reaches (`distance_ours`, `distance_theirs` in agreement.json) are within a few per "
       "cent of each other, neither always the larger."
       for label in ("alie-opt vs marmed / Optimal_ALittleIsEnough(agg=Median, "
                     "pre_agg_list=[])", "alie-opt vs trimmed-mean / Optimal_ALittleIs"
                     "Enough(agg=TrMean, pre_agg_list=[])")},
    **{label: "ByzFL 0.0.11 forges -tau mean (tau = 0: the zero vector), ours (1 - tau) "
       "mean (tau = 0: the correct mean; the parameterisation `ipm_opt` gives for "
       "ByzFL's FOE); and the contraction differs as for ALIE. A median or trimmed mean "
       "saturates (once the forged values pass the correct ones, a larger factor changes "
       "nothing), so both reach the same distance (`distance_ours`, `distance_theirs`), "
       "equal on most inputs, with different factors."
       for label in ("ipm-opt vs marmed / Optimal_InnerProductManipulation(agg=Median, "
                     "pre_agg_list=[])", "ipm-opt vs trimmed-mean / Optimal_InnerProduct"
                     "Manipulation(agg=TrMean, pre_agg_list=[])")},
    "arc q=f / ARC(f) [omniscient]": f"{_OVERFLOW}, and threshold/inf = 0 turns them "
    "into zero vectors; ours (float64 norms) scales them down to the threshold.",
    **{f"{label} [omniscient]": f"{_OVERFLOW}, so ByzFL's clipping factor tau/inf = 0 "
       "drops each forged row; ours (float64 norms) clips it to length tau, as the "
       "definition says: f tau / n more toward the forged rows per iteration."
       for label in ("centered-clipping / CenteredClipping()",
                     "centered-clipping tau=10 L=3 / CenteredClipping(tau=10, L=3)")},
}
"""Why each pair agrees or differs, by ``Pair.label`` (or ``label [inputs]``)."""


# --------------------------------------------------------------------------- inputs


def make_inputs(kind: str, seed: int, f: int, round_: int = 0) -> tuple[np.ndarray, int]:
    """(n, d) float32 rows and how many of the first are forged: N(centre, 1) rows around
    a N(0, 1) centre; for ``omniscient`` or ``alie`` the first f rows are that attack's
    (ours, at its defaults) on the other n - f."""
    from common.learn.attacks.alie import alie
    from common.learn.attacks.omniscient import omniscient

    rng = np.random.default_rng([seed, f, INPUTS.index(kind), round_])
    rows = (rng.standard_normal(D) + rng.standard_normal((N, D))).astype(np.float32)
    if kind == "clean":
        return rows, 0
    rows[:f] = omniscient(rows[f:], f, rng) if kind == "omniscient" else alie(rows[f:], f, rng)
    return rows, f


def honest_rows(f: int, seed: int) -> np.ndarray:
    """The (n - f, d) correct vectors an attack forges from."""
    return make_inputs("clean", seed, f)[0][f:]


# --------------------------------------------------------------------------- verdicts


def within_rounding(ours: np.ndarray, theirs: np.ndarray, scale: np.ndarray,
                    n: int = N) -> tuple[float, bool]:
    """(max |ours - theirs| over the finite values, whether they agree to float32
    rounding): the same NaN and infinities, and every finite difference within
    ``2 n u scale`` (u = 2^-24), twice the worst-case error of a float32 sum of n terms
    of magnitude ``scale``, so two implementations of one definition stay within it and
    anything beyond it is a different result. ``scale`` (broadcast to the outputs): the
    largest of |ours|, |theirs| and the correct inputs' magnitude, coordinate-wise."""
    a = np.asarray(ours, dtype=np.float64)
    b = np.asarray(theirs, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf"), False
    finite = np.isfinite(a) & np.isfinite(b)
    same_special = bool(np.array_equal(np.isnan(a), np.isnan(b))
                        and np.array_equal(a[np.isinf(a)], b[np.isinf(a)])
                        and np.array_equal(np.isinf(a), np.isinf(b)))
    if not finite.any():
        return 0.0, same_special
    diff = np.abs(a[finite] - b[finite])
    bound = np.maximum(np.maximum(np.abs(a), np.abs(b)), scale)[finite]
    return float(diff.max()), same_special and bool(
        (diff <= 2 * n * UNIT_ROUNDOFF * bound).all())


def verdict(agreed: int, total: int) -> str:
    """``agree``, ``differ`` or ``agree in k/total``."""
    if agreed == total:
        return "agree"
    return "differ" if agreed == 0 else f"agree in {agreed}/{total}"


# --------------------------------------------------------------------------- one case


def _as_backend(rows: np.ndarray, backend: str) -> Any:
    import torch

    return torch.from_numpy(rows.copy()) if backend == "torch" else rows.copy()


def _numpy(values: Any) -> np.ndarray:
    import torch

    if isinstance(values, torch.Tensor):
        return values.detach().cpu().numpy()
    return np.asarray(values)


def _seed_byzfl(seed: int) -> None:
    """ByzFL draws from numpy's and torch's global generators."""
    import torch

    np.random.seed(seed)
    torch.manual_seed(seed)


def _run_rule(pair: Pair, byz: ByzFL, kind: str, seed: int, f: int,
              backend: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    import torch

    from common.learn.rules import make_rule

    rule = make_rule(pair.ours, N, pair.q(f), **pair.ours_options(f))
    agg = getattr(byz.aggregators, pair.theirs)(**pair.theirs_options(f))
    _seed_byzfl(seed)
    ours, theirs, scales = [], [], []
    for t in range(pair.rounds):
        rows, forged = make_inputs(kind, seed, f, t)
        ours.append(rule(torch.from_numpy(rows)).numpy())
        theirs.append(_numpy(agg(_as_backend(rows, backend))))
        scales.append(np.abs(rows[forged:]).max(axis=0))
    return np.stack(ours), np.stack(theirs), np.stack(scales), {}


def _run_pre(pair: Pair, byz: ByzFL, kind: str, seed: int, f: int,
             backend: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """A pre-aggregator's rows. Bucketing: ByzFL permutes with numpy's (torch's) global
    generator; with it seeded, its permutation sigma is known beforehand, and ByzFL is
    handed our rows reordered by tau (tau[sigma] = pi, ours' permutation), so that both
    average the same buckets."""
    import torch

    from common.learn.rules.pre import RoundContext, pre_class

    rows, forged = make_inputs(kind, seed, f)
    step = pre_class(pair.ours)(N, pair.q(f), **pair.ours_options(f))
    ours = _numpy(step(torch.from_numpy(rows), RoundContext(seed, 0, 0)))
    given = rows
    if pair.ours == "bucketing":
        if backend == "torch":
            sigma = torch.randperm(N, generator=torch.Generator().manual_seed(seed)).numpy()
        else:
            sigma = np.random.RandomState(seed).permutation(N)
        tau = np.empty(N, dtype=np.int64)
        tau[sigma] = step.last_info["permutation"]
        given = rows[tau]
    _seed_byzfl(seed)
    theirs = _numpy(getattr(byz.aggregators, pair.theirs)(**pair.theirs_options(f))(
        _as_backend(given, backend)))
    return ours, theirs, np.abs(rows[forged:]).max(axis=0), {}


def _run_attack(pair: Pair, byz: ByzFL, kind: str, seed: int, f: int,
                backend: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """The f forged vectors of each side; ByzFL's one vector is sent by all f Byzantine
    clients (its ``ByzantineClient``), so it is repeated f times."""
    import torch

    from common.learn.attacks import VectorAttack, attack_class
    from common.learn.attacks.base import Aim
    from common.learn.rules import make_rule

    honest = honest_rows(f, seed)
    options = pair.theirs_options(f)
    aim = None
    if pair.check == "search":
        rule = make_rule(pair.target[0], N, f)
        aim = Aim(lambda rows: rule(torch.from_numpy(rows)).numpy(), tuple(range(N - f, N)))
        agg = getattr(byz.aggregators, pair.target[1])
        options |= {"agg": agg(f) if pair.target[1] != "Median" else agg(),
                    "pre_agg_list": [], "f": f}
    impl = cast(VectorAttack, attack_class(pair.ours)(**pair.ours_options(f)))
    ours = impl.forge_at(honest, f, N, seed, "worker-attack", 0, aim=aim)
    _seed_byzfl(seed)
    theirs = np.tile(_numpy(getattr(byz.attacks, pair.theirs)(**options)(
        _as_backend(honest, backend))), (f, 1))
    extra: dict[str, Any] = {}
    if aim is not None:
        extra = {"distance_ours": aim.distance(honest, ours),
                 "distance_theirs": aim.distance(honest, theirs.astype(np.float32))}
    if pair.check == "distribution":
        extra = distributions(ours, theirs, options["sigma"])
    return ours, theirs, np.abs(honest).max(axis=0), extra


def distributions(ours: np.ndarray, theirs: np.ndarray, sd: float) -> dict[str, Any]:
    """Two-sample Kolmogorov-Smirnov test of the values each side drew (ByzFL's one
    vector, ours' f), each one's test against N(0, sd^2), their means, sds and distinct
    rows."""
    stats = importlib.import_module("scipy.stats")  # a dependency of byzfl's
    a, b = ours.ravel().astype(np.float64), theirs[0].astype(np.float64)
    return {"p_two_sample": float(stats.ks_2samp(a, b).pvalue),
            "p_ours_normal": float(stats.kstest(a, "norm", args=(0, sd)).pvalue),
            "p_theirs_normal": float(stats.kstest(b, "norm", args=(0, sd)).pvalue),
            "mean_ours": float(a.mean()), "mean_theirs": float(b.mean()),
            "sd_ours": float(a.std()), "sd_theirs": float(b.std()),
            "distinct_rows_ours": len(np.unique(ours, axis=0)),
            "distinct_rows_theirs": len(np.unique(theirs, axis=0))}


RUNNERS = {"rule": _run_rule, "pre": _run_pre, "attack": _run_attack}


def compare_case(pair: Pair, byz: ByzFL, kind: str, seed: int, f: int,
                 backend: str) -> dict[str, Any]:
    """One input through both sides: the difference and whether it passes the pair's
    check."""
    ours, theirs, scale, extra = RUNNERS[pair.kind](pair, byz, kind, seed, f, backend)
    diff, close = within_rounding(ours, theirs, scale)
    if pair.check == "distribution":
        close = extra["p_two_sample"] > P_VALUE
    return {"f": f, "seed": seed, "inputs": kind, "backend": backend,
            "max_abs_diff": diff, "agree": bool(close), **extra}


# --------------------------------------------------------------------------- all pairs


def agreement(seeds: int = 3, pairs: tuple[Pair, ...] = PAIRS,
              say: Callable[[str], None] = print) -> dict[str, Any]:
    """Every pair on every input, f, seed and ByzFL backend; the cases and a summary row
    per (pair, inputs)."""
    import torch

    byz = load_byzfl()
    torch.set_num_threads(1)
    rows = []
    for pair in pairs:
        started = time.perf_counter()
        for kind in pair.inputs:
            cases = [compare_case(pair, byz, kind, seed, f, backend)
                     for f in pair.fs for seed in range(seeds) for backend in BACKENDS]
            row = summary_row(pair, kind, cases)
            rows.append(row)
            say(f"{pair.label} [{kind}]: numpy {row['max_abs_diff']['numpy']:.3g}, torch "
                f"{row['max_abs_diff']['torch']:.3g}, {row['verdict']} "
                f"({time.perf_counter() - started:.1f} s)")
    return {"byzfl": byz.version, "imported": byz.imported, "n": N, "d": D,
            "fs": list(FS), "seeds": seeds, "tolerance": TOLERANCE, "rows": rows}


TOLERANCE = ("|ours - theirs| <= 2 n u max(|ours|, |theirs|, max |correct input|) per "
             "coordinate, u = 2^-24, n = 20, with the same NaN and infinities")


def summary_row(pair: Pair, kind: str, cases: list[dict[str, Any]]) -> dict[str, Any]:
    """A pair's cases on one kind of input: the largest difference per backend, the
    verdict, and the cases."""
    by_backend = {b: max(c["max_abs_diff"] for c in cases if c["backend"] == b)
                  for b in BACKENDS}
    agreed = sum(c["agree"] for c in cases)
    said = verdict(agreed, len(cases))
    if pair.check == "distribution":
        said = ("same distribution" if agreed == len(cases)
                else f"same distribution in {agreed}/{len(cases)}")
    return {"kind": pair.kind, "pair": pair.label, "ours": pair.ours_text,
            "theirs": pair.theirs_text, "inputs": kind, "check": pair.check,
            "fs": list(pair.fs), "max_abs_diff": by_backend, "verdict": said,
            "cases": cases}


def note(row: dict[str, Any]) -> str:
    """Why a pair agrees or differs on a kind of input (:data:`NOTES`)."""
    return NOTES.get(f"{row['pair']} [{row['inputs']}]", NOTES.get(row["pair"], ""))


# --------------------------------------------------------------------------- training


class ByzflRule(Rule):
    """A ByzFL aggregator as one of our rules, fed torch tensors as ByzFL's own server
    feeds it; f is our q."""

    theirs: ClassVar[str]
    takes_f: ClassVar[bool]

    def aggregate(self, G: torch.Tensor) -> torch.Tensor:
        cls = getattr(load_byzfl().aggregators, self.theirs)
        agg = cls(f=self.q) if self.takes_f else cls()
        return agg(G.clone()).to(G.dtype)


def byzfl_rule(name: str, theirs: str, takes_f: bool) -> type[Rule]:
    """The rule class ``name`` for ByzFL's aggregator ``theirs``."""
    namespace: dict[str, Any] = {
        "name": name, "theirs": theirs, "takes_f": takes_f,
        "summary": f"ByzFL's {theirs} (issue 37's comparison; not for use)"}
    if takes_f:  # ByzFL refuses 2f >= n
        namespace |= {"needs": "2q < n",
                      "precondition": staticmethod(lambda n, q: q <= median_bound(n))}
    return type(f"Byzfl{theirs}", (ByzflRule,), namespace)


CELLS: tuple[tuple[str, str, str, bool], ...] = (
    ("marmed", "byzfl-median", "Median", False),
    ("trimmed-mean", "byzfl-trmean", "TrMean", True),
    ("meamed", "byzfl-meamed", "Meamed", True),
    ("krum", "byzfl-krum", "Krum", True),
)
"""(our rule, ByzFL's as a rule, ByzFL's class, whether it takes f) of each cell."""


@contextmanager
def registered() -> Iterator[None]:
    """The ``byzfl-*`` rules of :data:`CELLS` in the rule registry for the duration."""
    names = []
    try:
        for _, name, theirs, takes_f in CELLS:
            RULES.register(byzfl_rule(name, theirs, takes_f))
            names.append(name)
        yield
    finally:
        for name in names:
            del RULES[name]


@dataclass(frozen=True)
class CellSpec:
    """The training cells' common settings (issue 37: the paper's MLP on Fashion-MNIST,
    n = 20 of which 6 Byzantine sending ALIE, 4 shards, batch 32, lr 0.1, q = f = 6), on
    seeds 0 to ``seeds - 1``: ours and ByzFL's aggregator are paired by seed."""

    rounds: int = 100
    seeds: int = 5
    attack: str = "alie"
    q: int = 6
    tolerance: float = 0.02  # "alike": the claims' "~" (``ps.experiments.claims``)


def train_cells(spec: CellSpec, say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Each cell of :data:`CELLS`, ours and ByzFL's, on each seed, one at a time: final
    top-1 and final parameters' digest."""
    import torch

    from common.learn.data import load_dataset
    from ps.experiments.grid import Cell, GridSpec, byzantine_workers
    from ps.reference.engine import simulate
    from worker.evaluator import Evaluator

    load_byzfl()
    torch.set_num_threads(1)
    grid = GridSpec(rounds=spec.rounds)
    attack = {"worker_attack": spec.attack,
              "byzantine_workers": byzantine_workers(grid.num_workers)}
    out = []
    with registered():
        for seed in range(spec.seeds):
            dataset = load_dataset(grid.dataset, None, seed=seed)
            for ours, theirs, _, _ in CELLS:
                for rule in (ours, theirs):
                    run = {**grid.base(seed), "rule": rule, "q": spec.q}
                    cfg, attack_cfg = Cell("byzfl", spec.attack, run, attack).configs()
                    started = time.perf_counter()
                    result = simulate(cfg, attack_cfg, dataset=dataset)
                    top1 = Evaluator(cfg, dataset, None).evaluate(result.params).top1
                    record = {"rule": rule, "pair": ours, "seed": seed, "top1": top1,
                              "seconds": round(time.perf_counter() - started, 1),
                              "params_sha256": result.digest}
                    say(str(record))
                    out.append(record)
    return out


def cell_verdict(ours: Sample, theirs: Sample, tolerance: float) -> str:
    """Ours against ByzFL's final top-1, paired by seed: *higher* or *lower* where the
    difference's 95 % interval excludes 0, *alike* where it lies inside ±``tolerance``
    (both can hold), else *inconclusive*."""
    order = below(ours, theirs)
    alike = within(ours, theirs, tolerance)
    words = []
    if order is not None:
        words.append("ours lower" if order else "ours higher")
    if alike:
        words.append(f"alike (within ±{tolerance:g})")
    return ", ".join(words) or "inconclusive"


# --------------------------------------------------------------------------- report


def _number(value: float) -> str:
    return "0" if value == 0 else f"{value:.3g}"


def report(result: dict[str, Any], command: str) -> str:
    """``report.md``: the agreement table and the training cells side by side."""
    lines = [
        "# ByzFL beside ours (issue 37)", "",
        f"ByzFL {result['byzfl']} (PyPI `byzfl`, installed with `pip install --no-deps`), "
        f"imported as {result['imported']}; torch {result['torch']}, numpy "
        f"{result['numpy']}" + (f"; on {result['machine']}" if "machine" in result
                                 else "") + ".", "",
        f"Command: `{command}`"
        + (f" ({result['minutes']} min of wall time here, one core)" if "minutes" in result
           else ""), "",
        "## Agreement", "",
        f"n = {result['n']}, d = {result['d']}, f in {result['fs']} (MDA: 2, 4; SMEA: 2; "
        f"bucketing: 2), {result['seeds']} seeds; inputs: `clean` (all rows correct, "
        "N(c, 1) around a N(0, 1) centre c), `omniscient` and `alie` (the first f rows "
        "that attack's, ours at its defaults, forged from the others). Attacks forge from "
        "the n - f correct rows. ByzFL is fed numpy arrays and torch tensors (its two code "
        "paths); ours always its own. Verdicts count every (f, seed, backend).", "",
        f"Tolerance (`within_rounding`): {result['tolerance']}: twice the worst-case "
        "error of a float32 sum of n terms, so two float32 implementations of one "
        "definition cannot differ by more, and a larger difference is a different "
        "result. Distribution checks: two-sample Kolmogorov-Smirnov, p > "
        f"{P_VALUE}.", "",
        "| ours | ByzFL | inputs | max \\|diff\\| numpy | max \\|diff\\| torch | verdict "
        "| explanation |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        diff = row["max_abs_diff"]
        lines.append(f"| {row['ours']} | {row['theirs']} | {row['inputs']} | "
                     f"{_number(diff['numpy'])} | {_number(diff['torch'])} | "
                     f"{row['verdict']} | {note(row)} |")
    cells = result.get("cells")
    if cells:
        lines += ["", *_cells_section(result["cell_spec"], cells)]
    return "\n".join(lines) + "\n"


def _cells_section(spec: dict[str, Any], cells: list[dict[str, Any]]) -> list[str]:
    """The report's training cells: per pair, each side's final top-1 over the seeds, the
    paired difference and its verdict (:func:`cell_verdict`)."""
    lines = [
        "## Training cells", "",
        "ByzFL's benchmark imports torchvision (not installed beside torch 2.13 here), so "
        "its aggregators are driven from our engine instead: each is registered as a rule "
        "of ours (`byzfl-*`, only while the comparison runs) and trained by "
        "`ps.reference.engine.simulate` beside ours on the same settings: Fashion-MNIST, "
        f"the MLP, n = 20 of which 6 Byzantine sending our `{spec['attack']}` (ByzFL's "
        "ALittleIsEnough with the mapped tau above), S = 4 shards, batch 32, lr 0.1, "
        f"q = f = {spec['q']}, {spec['rounds']} rounds, seeds 0-{spec['seeds'] - 1}: "
        "the same data, partition, minibatches and attack on both sides of a pair. "
        "ByzFL's aggregators get torch tensors, as its own server gives them. Training "
        "amplifies any difference (the median's rounding in `torch.quantile`, another row "
        "picked by ByzFL's Krum score, whose neighbours are n - f - 1 against our "
        "n - q - 2), so even a pair with one definition ends with other parameters: its "
        "paired differences measure how far rounding alone moves a run, which the "
        "interval must hold before a gap between the libraries can be read.", "",
        f"Final top-1: mean ± half its 95 % interval over the {spec['seeds']} seeds; "
        "ours − ByzFL's paired by seed, mean [95 % Student-t interval]; verdict: *ours "
        "higher* or *lower* where the interval excludes 0, *alike* where it lies inside "
        f"±{spec['tolerance']:g} (the claims' \"~\"), else *inconclusive*.", "",
        "| ours | top-1 | ByzFL's | top-1 | ours − ByzFL's | verdict | params identical |",
        "|---|---|---|---|---|---|---|",
    ]
    by_rule: dict[str, dict[int, dict[str, Any]]] = {}
    for cell in cells:
        by_rule.setdefault(cell["rule"], {})[cell["seed"]] = cell
    for ours, theirs, _, _ in CELLS:
        mine, other = by_rule.get(ours, {}), by_rule.get(theirs, {})
        a = Sample({s: c["top1"] for s, c in mine.items()})
        b = Sample({s: c["top1"] for s, c in other.items()})
        shared = sorted(set(mine) & set(other))
        same = sum(mine[s]["params_sha256"] == other[s]["params_sha256"] for s in shared)
        lines.append(f"| {ours} | {a.text()} | {theirs} | {b.text()} | "
                     f"{(a - b).difference_text()} | "
                     f"{cell_verdict(a, b, spec['tolerance'])} | {same}/{len(shared)} |")
    return lines


def write(out_dir: Path, seeds: int, cells: CellSpec | None, command: str,
          say: Callable[[str], None] = print) -> Path:
    """Run the comparison (and the training cells, unless ``cells`` is None); write
    ``agreement.json`` and ``report.md`` into ``out_dir``."""
    import torch

    started = time.perf_counter()
    result = agreement(seeds, say=say)
    result |= {"torch": torch.__version__, "numpy": np.__version__, "command": command,
               "machine": machine()}
    if cells is not None:
        result |= {"cell_spec": asdict(cells), "cells": train_cells(cells, say)}
    result["minutes"] = round((time.perf_counter() - started) / 60, 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "agreement.json").write_text(json.dumps(result, indent=1) + "\n",
                                            encoding="utf-8")
    path = out_dir / "report.md"
    path.write_text(report(result, command), encoding="utf-8")
    return path
