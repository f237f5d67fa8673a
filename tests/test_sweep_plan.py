"""A sweep's plan and what it refuses, without training (issue 76): the order its runs go in
(seed by seed), an arm that sets the seed, a seed range too large to plan, and a run already
under the root that its arm's settings no longer describe. The sweep flow is called as its
plain function (``sweep.fn``) with a stand-in for ``selfplay`` that records the runs it is
asked to train; the command is stopped before Prefect starts. tests/test_sweep.py trains a
sweep for real."""

from __future__ import annotations

import time

import pytest
import yaml

import ub.flows.sweep as sweep_module
import ub.flows.sweep_command as sweep_command
import ub.flows.train_command as train_command
import ub.run.config.load as config_load
from ub.errors import UbError
from ub.flows.cli import main
from ub.flows.sweep import sweep
from ub.flows.sweep_plan import MAX_SWEEP_RUNS, sweep_runs
from ub.run.config.load import load_config, read_config_data
from ub.run.folder.layout import RunPaths
from ub.run.steps.rounds import save_run_config

ARMS = {"lr3": [], "lr2": ["learner.learning_rate=0.002"], "lr1": ["learner.learning_rate=0.001"]}
"""(tiny-cpu's learning rate is 0.003)"""


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    """tiny-cpu with one round: a run with a committed round is finished."""
    path = tmp_path_factory.mktemp("sweep-plan") / "one-round.yaml"
    path.write_text(yaml.safe_dump({**read_config_data("tiny-cpu")[0], "rounds": 1}))
    return str(path)


@pytest.fixture
def trained(monkeypatch):
    """The runs the sweep flow asks ``selfplay`` to train, in order (nothing is trained)."""
    names: list[str] = []

    def selfplay(*, run_name: str, **_: object) -> dict[str, str]:
        names.append(run_name)
        return {"run": run_name}

    monkeypatch.setattr(sweep_module, "selfplay", selfplay)
    return names


@pytest.fixture
def no_prefect(monkeypatch):
    """``ub sweep`` fails the test if it gets as far as starting Prefect."""
    def start_prefect(*_: object) -> None:
        pytest.fail("ub sweep started Prefect: it should have refused before")

    monkeypatch.setattr(train_command, "start_prefect", start_prefect)


def existing_run(root, name: str, config_file: str, settings: list[str], rounds: int) -> RunPaths:
    """A run under ``root`` as a sweep leaves it: its config and ``rounds`` committed rounds."""
    paths = RunPaths.of(root, name)
    save_run_config(paths, load_config(config_file, settings), changed=True)
    for round_ in range(rounds):
        paths.manifest(round_).parent.mkdir(exist_ok=True)
        paths.manifest(round_).write_text("{}")
    return paths


def refusal(capsys, argv: list[str]) -> str:
    """``ub ARGV``'s one line on stderr; it must be refused (exit 2)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ub: error: "), err
    return err


def test_runs_go_seed_by_seed_so_a_sweep_stopped_early_has_every_arm_on_its_first_seeds(
        config_file, trained, tmp_path):
    """Stopped after k runs, a sweep holds every arm on its first k / arms seeds: pairs to
    compare. (Arm by arm, it would hold the first arm alone.)"""
    seeds = [3, 1, 2]
    sweep.fn(config=config_file, arms=ARMS, seeds=seeds, root=str(tmp_path), quiet=True)
    assert trained == [f"{arm}-s{seed}" for seed in seeds for arm in ARMS]
    for done in range(1, len(seeds) + 1):
        first = trained[:done * len(ARMS)]
        assert sorted(first) == sorted(f"{arm}-s{seed}" for arm in ARMS for seed in seeds[:done])
    assert [run.name for run in sweep_runs(config_file, ARMS, seeds)] == trained


def test_an_arm_that_sets_the_seed_is_refused(config_file, capsys, no_prefect, tmp_path):
    """Issue 76, finding 5: the sweep's seed came last, so the arm's was dropped silently."""
    with pytest.raises(UbError, match=r"--arm lr2: 'seed=5': the sweep's --seeds"):
        sweep_runs(config_file, {"lr3": [], "lr2": ["seed=5"]}, [0, 1])
    err = refusal(capsys, ["sweep", config_file, "--arm", "lr3", "--arm", "lr2", " seed =5",
                           "--seeds", "0-1", "--root", str(tmp_path / "runs")])
    assert "--arm lr2: ' seed =5': the sweep's --seeds gives each run its seed: drop it from " \
        "the arm" in err, err
    assert not (tmp_path / "runs").exists()


def test_a_seed_range_too_large_to_plan_is_refused_at_once(config_file, capsys, no_prefect,
                                                            tmp_path):
    """Issue 76, finding 7: `--seeds 0-100000000` took 4.7 GB and 40 s with no output before.
    The count is checked before a seed is listed, and arms x seeds before a config is
    loaded."""
    root = str(tmp_path / "runs")
    for seeds in (f"0-{MAX_SWEEP_RUNS}", "0-100000000", f"0-{10**30}", f"5,0-{MAX_SWEEP_RUNS}"):
        started = time.monotonic()
        err = refusal(capsys, ["sweep", config_file, "--arm", "lr3", "--seeds", seeds,
                               "--root", root])
        assert time.monotonic() - started < 5
        assert (f"argument --seeds: {seeds} is more than {MAX_SWEEP_RUNS} seeds: a sweep "
                f"plans at most {MAX_SWEEP_RUNS} runs (arms x seeds)") in err, err
    half = MAX_SWEEP_RUNS // 2 + 1
    err = refusal(capsys, ["sweep", config_file, "--arm", "lr3", "--arm", "lr2",
                           "--seeds", f"0-{half - 1}", "--root", root])
    assert (f"2 arms x {half} seeds are {2 * half} runs: a sweep plans at most "
            f"{MAX_SWEEP_RUNS}") in err, err
    with pytest.raises(UbError, match="a sweep needs an arm and a seed"):  # (a deployment's)
        sweep_runs(config_file, ARMS, [])


def test_each_arm_s_config_is_loaded_once_not_once_a_seed(config_file, monkeypatch):
    """The seed is the runs' one difference within an arm: planning 3 arms x 300 seeds loads
    each arm's config at its smallest and largest seed (the seed's check is a range)."""
    loads: list[list[str]] = []
    real = config_load.load_config

    def counted(name_or_path, overrides=None):
        loads.append(list(overrides or []))
        return real(name_or_path, overrides)

    monkeypatch.setattr(config_load, "load_config", counted)
    runs = sweep_runs(config_file, ARMS, list(range(300)))
    assert len(runs) == 900 and len(loads) <= 2 * len(ARMS)
    assert {run.config.seed for run in runs if run.arm == "lr2"} == set(range(300))
    assert {run.config.learner.learning_rate for run in runs if run.arm == "lr2"} == {0.002}
    with pytest.raises(UbError, match=r"invalid config .*: seed: got 4294967296"):
        sweep_runs(config_file, ARMS, [0, 2**32])


@pytest.mark.parametrize("rounds_done", [0, 1], ids=["unfinished", "finished"])
def test_a_run_whose_arm_changed_is_refused_finished_or_not(config_file, capsys, no_prefect,
                                                            trained, tmp_path, rounds_done):
    """Issue 76, finding 4: a finished run was kept silently with its old learning rate (an
    unfinished one was refused, in `ub train`'s words); `--rounds 2` refused the same change.
    Now the sweep refuses it before its first run, naming the run, each setting that differs
    and what to do."""
    root = tmp_path / "runs"
    existing_run(root, "lr3-s0", config_file, ["seed=0"], rounds_done)
    changed = RunPaths.of(root, "lr2-s0")
    existing_run(root, "lr2-s0", config_file,
                 ["seed=0", "learner.learning_rate=0.001", "batch.batch_size=8"], rounds_done)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    expected = (f"run lr2-s0 under {root} was trained with other settings than arm lr2 gives "
                "it: batch.batch_size (8 in the run, 512 now); learner.learning_rate (0.001 in "
                "the run, 0.002 now). Give the arm a new name to train it afresh, or remove "
                f"{changed.root} to train this run again")
    for rounds in ([], ["--rounds", "2"]):
        err = refusal(capsys, ["sweep", config_file, "--arm", "lr3", "--arm", "lr2",
                               "learner.learning_rate=0.002", "--seeds", "0", "--root",
                               str(root), *rounds])
        assert expected in err, err
    with pytest.raises(UbError) as refused:
        sweep.fn(config=config_file, arms=ARMS, seeds=[0], root=str(root), quiet=True)
    assert expected in str(refused.value)
    assert trained == []  # (refused before the first run, which is unchanged)
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def test_a_run_with_its_arm_s_settings_is_kept_if_finished_and_resumed_if_not(
        config_file, trained, tmp_path):
    """The same sweep again: a finished run is left as it is, an unfinished one resumes, one
    never started starts; more rounds (`--rounds`, or the config's) extend a finished one."""
    root = tmp_path / "runs"
    existing_run(root, "lr3-s0", config_file, ["seed=0"], rounds=1)
    existing_run(root, "lr2-s0", config_file, ["learner.learning_rate=0.002", "seed=0"], 0)
    arms = {arm: ARMS[arm] for arm in ("lr3", "lr2")}
    sweep.fn(config=config_file, arms=arms, seeds=[0, 1], root=str(root), quiet=True)
    assert trained == ["lr2-s0", "lr3-s1", "lr2-s1"]
    trained.clear()
    sweep.fn(config=config_file, arms=arms, seeds=[0], root=str(root), rounds=2, quiet=True)
    assert trained == ["lr3-s0", "lr2-s0"]
    trained.clear()
    more = {"lr3": ["rounds=2"], "lr2": [*ARMS["lr2"], "rounds=2"]}
    sweep.fn(config=config_file, arms=more, seeds=[0], root=str(root), quiet=True)
    assert trained == ["lr3-s0", "lr2-s0"]


def test_settings_every_arm_shares_are_given_once_and_an_arm_needs_a_name(
        config_file, capsys, monkeypatch, no_prefect, tmp_path):
    """Issue 78: `ub sweep --set KEY=VALUE` for what every arm shares (it was refused as an
    unrecognized argument), an arm's own setting of the same key winning; a nameless arm
    (`--arm learner.entropy_coef=0.05`) is told it needs a name (it was refused as an invalid
    run name)."""
    planned = []

    def planning(config, arms, seeds):
        planned.extend(sweep_runs(config, arms, seeds))
        raise UbError("planned")  # (stop before anything is checked on disk or started)

    monkeypatch.setattr(sweep_command, "sweep_runs", planning)
    refusal(capsys, ["sweep", config_file, "--set", "learner.learning_rate=0.002", "--set",
                     "learner.entropy_coef=0.1", "--arm", "base", "--arm", "lr1",
                     "learner.learning_rate=0.001", "--seeds", "0", "--root", str(tmp_path)])
    assert [(run.name, run.config.learner.learning_rate, run.config.learner.entropy_coef)
            for run in planned] == [("base-s0", 0.002, 0.1), ("lr1-s0", 0.001, 0.1)]
    err = refusal(capsys, ["sweep", config_file, "--arm", "learner.entropy_coef=0.05",
                           "--seeds", "0", "--root", str(tmp_path)])
    assert err == ("ub: error: --arm learner.entropy_coef=0.05: an arm needs a name: "
                   "--arm NAME KEY=VALUE ...\n")
    err = refusal(capsys, ["sweep", config_file, "--set", "rounds", "--arm", "a", "--seeds",
                           "0", "--root", str(tmp_path)])
    assert err == "ub: error: --set 'rounds' is no KEY=VALUE setting\n"
    assert not any(tmp_path.iterdir())
