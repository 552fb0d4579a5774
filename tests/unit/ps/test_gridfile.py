"""Grid files (``ps-experiment run GRID.toml``): the product, ``[[exclude]]``,
``[[only]]`` and seeds; each refusal, one line naming the key or the cell; the shipped
files give the cells (the cache keys) of ``ps-experiment paper`` and ``modern``."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from common.errors import ConfigError
from ps.experiments.cli import main
from ps.experiments.grid import GridSpec, paper_cells
from ps.experiments.gridfile import load_grid, parse_grid, shipped, tomllib
from ps.experiments.modern import MODERN_ROUNDS, ModernSpec, modern_cells

BASE = 'dataset = "synthetic"\nworkers = 7\nrounds = 2\n'


def grid(text: str):
    return parse_grid(tomllib.loads(BASE + text), "g.toml")


def cells(text: str) -> list[tuple]:
    return [(c.rule, c.run["lr"], c.seed) for c in grid(text).cells]


def refused(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        grid(text)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("g.toml: ")
    return message


def test_list_valued_keys_expand_into_their_product_with_the_seeds_slowest() -> None:
    got = cells('rule = ["mean", "marmed"]\nlr = [0.1, 0.2]\nseeds = 2\n')
    assert got == [(r, lr, s) for s in (0, 1) for r in ("mean", "marmed") for lr in (0.1, 0.2)]
    assert grid('rule = ["mean", "marmed"]\nlr = 0.5\n').axes == ("rule",)
    assert cells('rule = "mean"\nseeds = [3, 7]\n') == [("mean", 0.1, 3), ("mean", 0.1, 7)]
    # a list setting is one value; a list of lists is its axis
    one = grid('worker-attack = "inf"\nbyzantine-workers = [0, 1]\n').cells
    assert [c.attack["byzantine_workers"] for c in one] == [(0, 1)]
    two = grid('worker-attack = "inf"\nbyzantine-workers = [[0], [0, 1]]\n').cells
    assert [c.attack["byzantine_workers"] for c in two] == [(0,), (0, 1)]


def test_a_defence_names_the_pre_aggregators_options_a_cell_changes() -> None:
    """A swept bucket size is part of the defence (reports and claims group by it)."""
    swept = grid('rule = "geomed"\npre = ["", "bucketing"]\nbucket-size = [2, 3]\n'
                 '[[exclude]]\npre = ""\nbucket-size = 3\n').cells
    assert [c.defence for c in swept] == ["geomed", "bucketing+geomed",
                                          "bucketing(s=3)+geomed"]


def test_exclude_removes_the_cells_matching_all_its_keys() -> None:
    text = ('rule = ["mean", "marmed", "meamed"]\nlr = [0.1, 0.2]\n'
            '[[exclude]]\nrule = ["mean", "meamed"]\nlr = 0.2\n')
    assert cells(text) == [("mean", 0.1, 0), ("marmed", 0.1, 0), ("marmed", 0.2, 0),
                           ("meamed", 0.1, 0)]


def test_only_keeps_the_cells_matching_at_least_one_table() -> None:
    text = ('rule = ["mean", "marmed", "meamed"]\nlr = [0.1, 0.2]\n'
            '[[only]]\nrule = "mean"\n[[only]]\nlr = 0.2\nrule = "meamed"\n')
    assert cells(text) == [("mean", 0.1, 0), ("mean", 0.2, 0), ("meamed", 0.2, 0)]


@pytest.mark.parametrize("text, expected", [
    ('rulez = "mean"\n', "unknown key 'rulez' (did you mean 'rule'?)"),
    ('rule = ["mean", "nope"]\n', "key 'rule': the value must be one of"),
    ("lr = \"fast\"\n", "key 'lr': expected a number, got 'fast'"),
    ("shards = 0\n", "key 'shards': the value must be >= 1, got 0"),
    ('rule = ["mean", "mean"]\n', "key 'rule': value mean given twice"),
    ("rule = []\n", "key 'rule': an empty list gives no value"),
    ("eval-every = [1, 2]\n", "key 'eval-every' takes one value for the whole grid"),
    ("seed = 1\nseeds = 2\n", "give seeds or seed, not both"),
    ('rule = "mean"\n[[exclude]]\nlr = 0.1\n', "[[exclude]] 1: 'lr' is a key the grid does "
     "not set"),
    ('rule = ["mean", "krum"]\n[[only]]\nrule = "meamed"\n', "[[only]] 1, key 'rule': "
     "meamed is not one of the grid's values"),
    ('rule = "mean"\n[[exclude]]\nrule = "mean"\n', "no cell left"),
    ('rule = ["mean", "krum"]\nq = 3\n', "cell grid/rule=krum/seed 0: rule 'krum'"),
    ('worker-attack = "inf"\nbyzantine-workers = [0, 9]\n', "cell grid/marmed/seed 0: "
     "byzantine worker id 9 out of range"),
    ('rule = ["mean", "krum"]\n[report]\nrows = "rule"\ncolumns = "lr"\nworst_over = "rule"\n',
     "[report]: columns = 'lr' is not an axis"),
    ('rule = ["mean", "krum"]\nlr = [0.1, 0.2]\nseeds = 2\n[report]\nrows = "rule"\n'
     'columns = "seed"\nworst_over = "lr"\n', "[report]: columns = 'seed' is not an axis"),
    ('rule = ["mean", "krum"]\nlr = [0.1, 0.2]\nworker-attack = ["none", "alie"]\n'
     'byzantine-workers = [0]\n'
     '[report]\nrows = "rule"\ncolumns = "lr"\nworst_over = "worker-attack"\n'
     'baseline = "ipm"\n', "[report]: baseline = 'ipm' is not a value of worker-attack "
     "(none, alie)"),
    ('rule = ["mean", "krum"]\nlr = [0.1, 0.2]\nworker-attack = ["none", "alie"]\n'
     'byzantine-workers = [0]\n'
     '[report]\nrows = "lr"\ncolumns = "worker-attack"\nworst_over = "defence"\n'
     'baseline = "mean"\n', "a baseline needs worst_over to be a key of the grid, not "
     "'defence'"),
    ('rule = ["mean", "krum"]\nlr = [0.1, 0.2]\nworker-attack = ["none", "alie"]\n'
     'byzantine-workers = [0]\n'
     '[report]\nrows = "rule"\ncolumns = "lr"\nworst_over = "worker-attack"\n'
     'base-line = "none"\n',
     "give exactly rows, columns, worst_over (and perhaps baseline, at_rounds)"),
    ('rule = ["mean", "krum"]\nlr = [0.1, 0.2]\nworker-attack = ["none", "alie"]\n'
     'byzantine-workers = [0]\n[report]\nrows = "rule"\ncolumns = "lr"\n'
     'worst_over = "worker-attack"\nat_rounds = [1, 2]\n', "[report]: at_rounds = [1, 2]: "
     "give a list of rounds, each from 1 to 1 (before the last round, 2)"),
    ('rule = ["mean", "krum"]\nlr = [0.1, 0.2]\nworker-attack = ["none", "alie"]\n'
     'byzantine-workers = [0]\n[report]\nrows = "rule"\ncolumns = "lr"\n'
     'worst_over = "worker-attack"\nat_rounds = 1\n', "at_rounds = 1: give a list of rounds"),
])
def test_each_refusal_is_one_line_naming_the_key_or_the_cell(text: str, expected: str
                                                             ) -> None:
    assert expected in refused(text)


def test_a_file_that_is_not_toml_or_missing_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("rule = [\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: not TOML"):
        load_grid(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_grid(tmp_path / "missing.toml")


def test_a_refused_grid_exits_2_with_its_line_before_anything_runs(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text(BASE + 'rule = ["mean", "krum"]\nq = 3\n')
    result = CliRunner().invoke(main, ["run", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "cell grid/rule=krum/seed 0" in result.output
    assert not (tmp_path / "out").exists()


def test_run_takes_a_shipped_grid_by_its_name(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[int] = []
    monkeypatch.setattr("ps.experiments.cli.execute",
                        lambda cells, *args: ran.append(len(cells)))
    result = CliRunner().invoke(main, ["run", "heterogeneity", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert ran == [len(load_grid(shipped()["heterogeneity"]).cells)]
    missing = CliRunner().invoke(main, ["run", "nope", "--out", str(tmp_path)])
    assert missing.exit_code == 2 and "nope: cannot read" in missing.output


def test_the_shipped_paper_grid_has_the_cells_of_ps_experiment_paper() -> None:
    ours = load_grid(shipped()["paper"]).cells
    theirs = paper_cells(GridSpec())
    assert {c.key for c in ours} == {c.key for c in theirs}
    assert len(ours) == len({c.key for c in theirs})


@pytest.mark.parametrize("name,dataset", [("mnist", "mnist-5k"), ("cifar10", "cifar10")])
def test_the_shipped_dataset_grids_are_the_papers_main_grid_on_their_dataset(
        name: str, dataset: str) -> None:
    ours = load_grid(shipped()[name]).cells
    theirs = paper_cells(GridSpec.for_dataset(dataset, sweeps=False))
    assert sorted(c.key for c in ours) == sorted(c.key for c in theirs)


def test_the_shipped_modern_grid_has_the_cells_of_ps_experiment_modern() -> None:
    ours = load_grid(shipped()["modern"]).cells
    theirs = modern_cells(ModernSpec(GridSpec(rounds=MODERN_ROUNDS, sweeps=False)))
    assert sorted(c.key for c in ours) == sorted(c.key for c in theirs)


def test_grids_lists_and_prints_the_shipped_files() -> None:
    listed = CliRunner().invoke(main, ["grids"])
    assert listed.exit_code == 0
    assert [line.split("\t")[0] for line in listed.output.splitlines()] == [
        "cifar10", "heterogeneity", "mnist", "modern", "paper"]
    printed = CliRunner().invoke(main, ["grids", "paper"])
    assert printed.output == shipped()["paper"].read_text()
    assert CliRunner().invoke(main, ["grids", "nope"]).exit_code == 2


def test_the_shipped_heterogeneity_grid_pairs_the_byzantine_and_the_iid_workers() -> None:
    """Its slices as the file says: 1,572 runs; an attacked cell's Byzantine workers are its
    iid workers (the split over the honest ones), and it has 17 workers; an unattacked
    cell (the baseline) is the 13 honest workers alone."""
    grid = load_grid(shipped()["heterogeneity"])
    assert len(grid.cells) == 1572
    for cell in grid.cells:
        attacked = cell.attack["worker_attack"] != "none"
        expected = (0, 1, 2, 3) if attacked else ()
        assert tuple(cell.attack.get("byzantine_workers", ())) == expected
        assert tuple(cell.run["iid_workers"]) == expected
        assert cell.run["num_workers"] == (17 if attacked else 13)
    assert grid.report is not None and grid.report.columns == "heterogeneity"


def test_heterogeneity_is_a_report_axis_only_where_partition_is_an_axis() -> None:
    text = ('rule = ["mean", "krum"]\npartition = ["iid", "dirichlet"]\nlr = [0.1, 0.2]\n'
            'alpha = [1.0, 0.1]\n'
            '[[exclude]]\npartition = "iid"\nalpha = 0.1\n'
            '[report]\nrows = "rule"\ncolumns = "heterogeneity"\nworst_over = "lr"\n')
    assert parse_grid(tomllib.loads(text), "g.toml").report.columns == "heterogeneity"
    with pytest.raises(ConfigError, match="not an axis of the grid"):
        parse_grid(tomllib.loads('rule = ["mean", "krum"]\n[report]\nrows = "rule"\n'
                                 'columns = "heterogeneity"\nworst_over = "rule"\n'), "g")
    overlapping = text.replace('worst_over = "lr"', 'worst_over = "alpha"')
    with pytest.raises(ConfigError, match="three different axes"):
        parse_grid(tomllib.loads(overlapping), "g.toml")
    with pytest.raises(ConfigError, match=r"defence holds rule, pre"):
        parse_grid(tomllib.loads(text.replace('rows = "rule"', 'rows = "defence"').replace(
            'worst_over = "lr"', 'worst_over = "rule"')), "g.toml")


def test_a_report_takes_a_baseline_and_earlier_rounds() -> None:
    report = grid('rule = ["mean", "krum"]\nlr = [0.1, 0.2]\nworker-attack = ["none", "alie"]\n'
                  'byzantine-workers = [0]\n[report]\nrows = "rule"\ncolumns = "lr"\n'
                  'worst_over = "worker-attack"\nbaseline = "none"\nat_rounds = [1, 1]\n').report
    assert report is not None
    assert (report.baseline, report.at_rounds) == ("none", (1,))


def test_a_baseline_may_be_written_as_its_setting_is() -> None:
    """A number on a numeric axis, as the axis gives it: kept as the tables write it."""
    report = grid('rule = ["mean", "krum"]\nlr = [0.1, 0.2, 0.3]\n'
                  'worker-attack = ["none", "alie"]\nbyzantine-workers = [0]\n[report]\n'
                  'rows = "rule"\ncolumns = "worker-attack"\nworst_over = "lr"\n'
                  'baseline = 0.1\n').report
    assert report is not None and report.baseline == "0.1"
