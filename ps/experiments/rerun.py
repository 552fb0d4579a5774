"""Rerun the published results from their grid files, timed and resumable.

Each folder of ``docs/results`` with a ``grid.toml`` is rerun from that file into a folder
of its own under the rerun's directory, by ``ps-experiment run`` (its cache makes a stopped
rerun resume where it was). A ledger, ``rerun.json``, adds up the wall time each folder
took over every invocation (so across sessions), records whether it finished, and how its
runs compare with the published ones bit for bit: a run is compared only where the
published run was made on this machine (``runner.machine``), since floating-point
rounding differs between CPUs.

A rerun may take fewer seeds (``seeds``: the first K of each grid's, or its last K: those
the latest session ran, so compared bit for bit here) or the cut that fits
4 hours here (:data:`CUT`): each grid has the same cells for every seed, so the time of
K seeds scaled by the cells' ratio is what the whole grid takes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import ConfigError
from ps.experiments.gridfile import load_grid, tomllib
from ps.experiments.rebuild import read_results
from ps.experiments.runner import machine

ROOT = Path(__file__).resolve().parents[2]  # the repository (scripts/ lives there)
LEDGER = "rerun.json"
GRID_TOML = "grid.toml"
GRID_JSON = "grid.json"
# The cut that fits 4 hours of this 2-core machine: cells, not claims (docs/results.md,
# "Machine time"): the paper grid at 7 of its 10 seeds still checks every claim.
CUT = {"paper": 7}
# Published folders a script made rather than a grid: name -> (the script, its seeds).
SCRIPTED = {"medoid-float32": ("scripts/medoid_float32.py", 3)}
SAVE_EVERY_S = 30.0  # how often a running grid's time so far is written to the ledger


@dataclass(frozen=True)
class Folder:
    """A published results folder and how it is rerun."""

    name: str
    published: Path
    needs_data_dir: bool  # its grid.json's command gave --data-dir
    script: str | None = None  # made by this script (SCRIPTED), not a grid file

    @property
    def grid(self) -> Path:
        return self.published / GRID_TOML


def published_folders(results: Path) -> list[Folder]:
    """The folders of ``results`` that a grid file made (those with ``grid.toml``), then
    those a script of :data:`SCRIPTED` made."""
    folders = []
    for directory in sorted(p for p in results.iterdir() if (p / GRID_TOML).is_file()):
        made = directory / GRID_JSON
        command = json.loads(made.read_text(encoding="utf-8")).get("command", "") \
            if made.exists() else ""
        folders.append(Folder(directory.name, directory, "--data-dir" in command.split()))
    folders += [Folder(name, results / name, False, script)
                for name, (script, _) in SCRIPTED.items() if (results / name).is_dir()]
    return folders


def with_seeds(grid_text: str, keep: int | None, last: bool = False) -> str:
    """``grid_text`` (a grid file) with only the first ``keep`` of its seeds (None: all;
    ``last``: the last ``keep``).
    ``ValueError`` for a grid that names no ``seeds`` or has fewer than ``keep``."""
    if keep is None:
        return grid_text
    seeds = tomllib.loads(grid_text).get("seeds")
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        listed = list(range(seeds))
    elif isinstance(seeds, list):
        listed = seeds
    else:
        raise ValueError("the grid file has no seeds key to cut")
    if keep > len(listed):
        raise ValueError(f"the grid file has {len(listed)} seeds, fewer than {keep}")
    kept = listed[-keep:] if last else listed[:keep]
    lines = grid_text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.split("=")[0].strip() == "seeds")
    end = first  # a list may run over several lines, to its closing bracket
    opened = lines[first].split("=", 1)[1].count("[")
    while opened > sum(line.count("]") for line in lines[first:end + 1]):
        end += 1
    lines[first:end + 1] = [f"seeds = {kept!r}  # cut by the rerun: the "
                            f"{'last' if last else 'first'} {keep}"]
    text = "\n".join(lines) + "\n"
    if tomllib.loads(text)["seeds"] != kept:
        raise ValueError("could not cut the grid file's seeds key")
    return text


def seeds_kept(folder: str, seeds: int | None, cut: bool) -> int | None:
    """How many seeds of ``folder``'s grid a rerun takes (None: all)."""
    limits = [k for k in (seeds, CUT.get(folder) if cut else None) if k is not None]
    return min(limits) if limits else None


def compare(rerun: list[dict[str, Any]], published: list[dict[str, Any]],
            here: str) -> dict[str, int]:
    """How the rerun's runs compare with the published ones: ``identical`` and
    ``different`` final parameters among the runs published from machine ``here``,
    ``other_machine`` (not comparable bit for bit; ``other_machine_identical`` of them
    ended with the same bits all the same), ``unpublished`` (no such cell)."""
    by_key = {r["key"]: r for r in published}
    counts = {"identical": 0, "different": 0, "other_machine": 0,
              "other_machine_identical": 0, "unpublished": 0}
    for run in rerun:
        theirs = by_key.get(run["key"])
        if theirs is None:
            counts["unpublished"] += 1
        elif theirs.get("machine") != here:
            counts["other_machine"] += 1
            counts["other_machine_identical"] += theirs["params_sha256"] == run["params_sha256"]
        elif theirs["params_sha256"] == run["params_sha256"]:
            counts["identical"] += 1
        else:
            counts["different"] += 1
    return counts


class Ledger:
    """``rerun.json``: per folder, the wall seconds spent over every invocation, the
    seeds kept, the cells, whether it finished, and the comparison."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.folders: dict[str, dict[str, Any]] = (
            json.loads(path.read_text(encoding="utf-8")) if path.exists() else {})

    def entry(self, name: str, seeds: int | str | None, cells: int,
              all_cells: int) -> dict[str, Any]:
        """``name``'s entry; a new one (time back to zero) if the seeds kept or the grid's
        cells changed (a grown grid's time so far is not its time)."""
        entry = self.folders.get(name)
        if entry is None or entry.get("seeds") != seeds or (
                entry.get("cells"), entry.get("all_cells")) != (cells, all_cells):
            entry = {"seeds": seeds, "seconds": 0.0, "finished": False}
        entry.update(cells=cells, all_cells=all_cells)
        self.folders[name] = entry
        return entry

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.folders, indent=1, sort_keys=True) + "\n",
                       encoding="utf-8")
        os.replace(tmp, self.path)


def summary(ledger: Ledger) -> list[str]:
    """The ledger as lines: each folder's time, its whole-grid estimate, the comparison."""
    lines = [f"{'folder':<22} {'cells':>11} {'minutes':>8} {'whole grid':>10}  bit for bit"]
    spent = whole = 0.0
    for name, e in sorted(ledger.folders.items()):
        minutes = e["seconds"] / 60
        scaled = minutes * e["all_cells"] / e["cells"] if e["finished"] else float("nan")
        spent += minutes
        whole += scaled
        c = e.get("compared", {})
        bits = (f"{c['identical']} identical, {c['different']} different; "
                f"{c['other_machine']} published from another machine "
                f"({c.get('other_machine_identical', 0)} identical)" if c else "-")
        lines.append(f"{name:<22} {e['cells']:>5}/{e['all_cells']:<5} {minutes:>8.1f} "
                     f"{scaled:>10.1f}  {bits}{'' if e['finished'] else ' (unfinished)'}")
    lines.append(f"{'all':<22} {'':>11} {spent:>8.1f} {whole:>10.1f}")
    return lines


def recompare(ledger: Ledger, folders: Iterable[Folder], out: Path) -> None:
    """Compare the finished grids' reruns with the published runs again (after the
    published results changed, or to count with this code)."""
    here = machine()
    for folder in folders:
        entry = ledger.folders.get(folder.name)
        if entry and entry["finished"] and folder.script is None:
            entry["compared"] = compare(read_results(out / folder.name),
                                        read_results(folder.published), here)
    ledger.save()


def rerun(folders: Iterable[Folder], out: Path, *, seeds: int | None, cut: bool, jobs: int,
          data_dir: Path | None, last: bool = False, progress: Callable[[str], None] = print,
          run: Callable[[list[str]], int] | None = None,
          save_every: float = SAVE_EVERY_S) -> Ledger:
    """Rerun ``folders`` into ``out``/<name>, timed into ``out``/rerun.json (resumable:
    finished folders are skipped, a stopped one resumes from its cache and adds its
    time, saved every ``save_every`` seconds while it runs). A folder whose grid needs
    ``--data-dir`` is skipped without ``data_dir``."""
    run = run or _this_code
    out.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(out / LEDGER)
    here = machine()
    for folder in folders:
        keep = seeds_kept(folder.name, seeds, cut)
        argv, cells, all_cells = _command(folder, out, keep, jobs, data_dir, last)
        which = f"last {keep}" if last and keep is not None else keep
        entry = ledger.entry(folder.name, which, cells, all_cells)
        if entry["finished"]:
            progress(f"{folder.name}: finished before ({entry['seconds'] / 60:.1f} min)")
            continue
        if folder.needs_data_dir and data_dir is None:
            progress(f"{folder.name}: skipped (its grid reads --data-dir: give --data-dir)")
            continue
        if (out / folder.name).resolve() == folder.published.resolve():
            raise ConfigError(f"--out {out}: it holds the published {folder.name}; rerun "
                              "into a folder of its own (e.g. --out runs/rerun)")
        if entry["seconds"] == 0 and (out / folder.name).exists():
            # a new entry's leftover cache (other seeds, a grid since grown): its cached
            # cells would not be timed
            progress(f"{folder.name}: cleared {out / folder.name} (a rerun of other cells)")
            shutil.rmtree(out / folder.name)
        progress(f"{folder.name}: {cells} cells of {all_cells} "
                 f"({'all seeds' if which is None else f'seeds: {which}'})")
        code = _timed(run, argv, entry, ledger, save_every)
        if code != 0:
            progress(f"{folder.name}: exited {code}; rerun to resume")
            return ledger
        entry["finished"] = True
        if folder.script is None:
            entry["compared"] = compare(read_results(out / folder.name),
                                        read_results(folder.published), here)
        ledger.save()
    return ledger


def _timed(run: Callable[[list[str]], int], argv: list[str], entry: dict[str, Any],
           ledger: Ledger, save_every: float) -> int:
    """``run(argv)``, its wall time added to ``entry`` and saved every ``save_every``
    seconds while it runs and once at its end: a rerun killed outright (a session that
    ends) keeps the time of the cells it cached, all but the last interval."""
    base, started = entry["seconds"], time.monotonic()
    done = threading.Event()

    def record() -> None:
        entry["seconds"] = base + time.monotonic() - started
        ledger.save()

    def keep_saving() -> None:
        while not done.wait(save_every):
            record()

    saver = threading.Thread(target=keep_saving, name="rerun-ledger", daemon=True)
    saver.start()
    try:
        return run(argv)
    finally:
        done.set()
        saver.join()
        record()


def _command(folder: Folder, out: Path, keep: int | None, jobs: int,
             data_dir: Path | None, last: bool) -> tuple[list[str], int, int]:
    """The command that reruns ``folder`` into ``out``/<name> with ``keep`` seeds, and
    the cells (runs) it computes of how many the whole folder has; a grid's file with
    its seeds cut is written to ``out``/<name>.toml. (A script takes its first seeds.)"""
    if folder.script is not None:
        whole = SCRIPTED[folder.name][1]
        kept = whole if keep is None else min(keep, whole)
        return ([sys.executable, str(ROOT / folder.script), "--out", str(out / folder.name),
                 "--seeds", str(kept)], kept, whole)
    grid_file = out / f"{folder.name}.toml"
    grid_file.write_text(with_seeds(folder.grid.read_text(encoding="utf-8"), keep, last),
                         encoding="utf-8")
    argv = [sys.executable, "-m", "ps.experiments.cli", "run", str(grid_file),
            "--out", str(out / folder.name), "--jobs", str(jobs)]
    if folder.needs_data_dir and data_dir is not None:
        argv += ["--data-dir", str(data_dir)]
    cells = len({c.key for c in load_grid(grid_file).cells})
    return argv, cells, len({c.key for c in load_grid(folder.grid).cells})


def _this_code(argv: list[str]) -> int:
    """Run ``argv`` with this repository's code first on the path (not another install)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.call(argv, env=env)
