"""Reasoning benchmarks (`ub eval RUN --tasks`, `eval.benchmarks`): the real
lm-evaluation-harness scoring the tiny model through the real vLLM engine, on a local task in
the harness's own YAML format (arithmetic with known answers), offline.

What is asserted is the pipeline (rows, view, report, replace-not-duplicate, resume, refusals)
and that a score is the mean of its samples, not the tiny model's score. The module's run
(``runs``: checkpoints 0 and 1, nothing scored) is read-only; a test that scores copies it first
(``run_copy``), so no test sees another's scores, whatever order they run in.

Slow, and why: the harness indexes its thousands of task files once per process (~15 s on 2
cores: its TaskManager, cached per include path), and the tests share the process's engine with
the rest of the suite (the `engine` fixture); each scoring is a handful of examples of a few
tokens. The one flow test (~75 s: a Prefect test server, two
flow runs of one tiny round) is the only place the step is seen inside a round.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from ub.flows.cli import main

QUESTIONS = [(1, 2), (3, 4), (2, 5), (6, 1), (4, 4), (7, 2)]

ARITH = """\
task: ub_arith
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: What is {{{{a}}}} + {{{{b}}}}?\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 6
  do_sample: false
filter_list:
  - name: number
    filter:
      - function: regex
        regex_pattern: "(-?[0-9]+)"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

MARKED = """\
task: ub_marked
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: What is {{{{a}}}} + {{{{b}}}}?\\nAnswer:"
doc_to_target: "{{{{'-' if a < b else answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 2
  do_sample: false
filter_list:
  - name: nothing
    filter:
      - function: regex
        regex_pattern: "(?!)"
        fallback: "-"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""
"""A task whose score is known from its data alone: its filter reads nothing from the answer
(a regex that never matches: every response becomes ``-``), and a question is right where its
target is ``-`` (``a < b``). The tiny model answers no sum right, so ub_arith's samples are all
wrong; this task's mix of right and wrong is what tells a mean from a sum, a maximum or one
sample."""

MEDIAN = ARITH.replace("task: ub_arith", "task: ub_median").replace("aggregation: mean",
                                                                     "aggregation: median")
"""ub_arith scored by its median: the harness bootstraps the stderr of a median (a tqdm bar
of its own, and a line printed on stdout)."""

HUB_ONLY = """\
task: ub_hub_only
dataset_path: ub-test/not-in-any-cache
test_split: test
output_type: generate_until
doc_to_text: "{{question}}"
doc_to_target: "{{answer}}"
metric_list:
  - metric: exact_match
"""

CHOICE = """\
task: ub_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "What is {{{{a}}}} + {{{{b}}}}?"
doc_to_choice: ["1", "2"]
doc_to_target: 0
metric_list:
  - metric: acc
"""


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tasks")
    data = folder / "arith.jsonl"
    data.write_text("".join(json.dumps({"a": a, "b": b, "answer": str(a + b)}) + "\n"
                            for a, b in QUESTIONS))
    (folder / "arith.yaml").write_text(ARITH.format(data=data))
    (folder / "marked.yaml").write_text(MARKED.format(data=data))
    (folder / "median.yaml").write_text(MEDIAN.format(data=data))
    (folder / "hub_only.yaml").write_text(HUB_ONLY)
    (folder / "choice.yaml").write_text(CHOICE.format(data=data))
    return folder


def _checkpoint(paths, update: int, model: Path, seed: int) -> None:
    """A finished checkpoint ``update`` of the tiny model: a random rank-8 LoRA (non-zero, so
    that it answers differently from the base)."""
    from ub.learner.base_identity import model_identity
    from ub.learner.checkpoint import CheckpointState
    from ub.learner.checkpoint_writer import write_checkpoint
    from ub.model.lora import LoraSettings, new_adapter

    lora = LoraSettings(rank=8, alpha=16)
    adapter = new_adapter(model, paths.root / f"adapter-{update}", lora, seed=seed,
                          init_std=0.05)
    state = CheckpointState(update=update, base_model=model_identity(model), lora=lora)
    write_checkpoint(paths.checkpoint(update), state,
                     lambda folder: [shutil.copy(f, folder) for f in adapter.iterdir()])
    shutil.rmtree(adapter)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model) -> Path:
    """A run of the tiny-cpu preset with checkpoints 0 and 1 (no rounds played)."""
    from ub.run.config.load import load_config
    from ub.run.folder.layout import RunPaths
    from ub.run.steps.rounds import open_run

    root = tmp_path_factory.mktemp("runs")
    paths = RunPaths.of(root, "bench")
    open_run(paths, load_config("tiny-cpu"))
    _checkpoint(paths, 0, tiny_model, seed=0)
    _checkpoint(paths, 1, tiny_model, seed=1)
    return root


@pytest.fixture()
def run_copy(runs, tmp_path) -> Path:
    """A copy of ``runs`` for a test that scores into it (two LoRA checkpoints of the tiny
    model: a copy is cheap; the checkpoints are not made again)."""
    copy = tmp_path / "runs"
    shutil.copytree(runs, copy)
    return copy


def _mean_and_stderr(values: list[float]) -> tuple[float, float]:
    """The harness's ``mean`` aggregation and its standard error (sample deviation / sqrt n)."""
    mean = sum(values) / len(values)
    deviation = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    return mean, deviation / len(values) ** 0.5


def _samples(folder: Path, task: str) -> list[dict]:
    return [json.loads(line) for line in (folder / f"{task}.samples.jsonl").read_text()
            .splitlines()]


def ub(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_scores_every_checkpoint_as_rows_of_the_run(capsys, engine, run_copy, tasks_dir):
    run = run_copy / "bench"
    code, out, err = ub(capsys, "eval", "bench", "--root", str(run_copy), "--tasks", "ub_arith",
                        "--checkpoint", "all", "--include-path", str(tasks_dir), "--limit", "4")
    assert code == 0, err
    assert "ub_arith" in out and "exact_match" in out
    expected = {}
    for update in (0, 1):
        folder = run / "benchmarks" / f"ckpt-{update:06d}"
        assert sorted(p.name for p in folder.iterdir()) == [
            "ub_arith.parquet", "ub_arith.samples.jsonl"]
        samples = _samples(folder, "ub_arith")
        assert len(samples) == 4  # the per-example outputs, as the harness logged them
        assert samples[0]["doc"] == {"a": 1, "b": 2, "answer": "3"}
        assert samples[0]["arguments"][0][0] == "Question: What is 1 + 2?\nAnswer:"
        assert all("\n" not in s["resps"][0][0] for s in samples)  # cut at `until`
        # Each sample is right where its first number is the sum; the score is their mean.
        right = [float(s["filtered_resps"][0] == str(s["doc"]["a"] + s["doc"]["b"]))
                 for s in samples]
        assert [s["exact_match"] for s in samples] == right
        expected[update] = _mean_and_stderr(right)

    code, out, err = ub(capsys, "sql", str(run), "SELECT checkpoint, task, metric, filter, "
                        "value, stderr, n, \"limit\", prompt_format, harness_version FROM "
                        "benchmarks ORDER BY checkpoint", "--format", "csv")
    assert code == 0, err
    rows = out.splitlines()[1:]
    assert len(rows) == 2
    for update, row in enumerate(rows):
        checkpoint, task, metric, filter_, value, stderr, n, limit, fmt, version = row.split(",")
        assert (checkpoint, task, metric, filter_, n, limit) == (
            str(update), "ub_arith", "exact_match", "number", "4", "4")
        assert (float(value), float(stderr)) == pytest.approx(expected[update])
        assert fmt == "plain" and version == "0.4.13"  # tiny-cpu plays in plain text
    # Plain DuckDB reads the files beside the games.
    count = duckdb.sql(f"SELECT count(*) FROM read_parquet('{run}/benchmarks/*/*.parquet')"
                       ).fetchall()
    assert count == [(2,)]


BAR = re.compile(r"\d+%\||it/s\]|s/it\]")
"""A tqdm bar's marks: ``25%|``, ``[00:00<00:00, 803.35it/s]``."""


def test_the_output_is_ubs_lines_only(capsys, caplog, engine, run_copy, tasks_dir):
    """Issue: the harness's tqdm bars (one per task's requests, one per bootstrapped stderr)
    and its bootstrap line on stdout came between ub's lines; now the table and the scores
    line are all of stdout, no bar is drawn, and the harness's line is in ub's log."""
    with caplog.at_level(logging.INFO, logger="ub.eval"):
        code, out, err = ub(capsys, "eval", "bench", "--root", str(run_copy), "--tasks",
                            "ub_arith,ub_median", "--checkpoint", "all", "--include-path",
                            str(tasks_dir), "--limit", "4")
    assert code == 0, err
    assert not BAR.search(out + err), err
    lines = out.splitlines()
    assert "bench: reasoning benchmarks (limit 4)" in lines[0]
    assert lines[-1].startswith("scores: ") and "4 scored in" in lines[-1]
    assert "bootstrapping" not in out
    assert "lm-eval: bootstrapping for stddev: median" in caplog.messages


def test_a_score_is_the_mean_of_its_samples(capsys, engine, run_copy, tasks_dir):
    """ub_marked's questions are right where a < b: 3 of the first 4 and 3 of all 6, whatever
    the model answers. Each checkpoint's row is the mean of its own samples (and its stderr
    theirs), not a sum, a maximum, one sample or another checkpoint's."""
    # (mean, sample deviation / sqrt n) by hand: 3 of 4 right, and 3 of 6.
    cases = {0: (4, 0.75, 0.25), 1: (6, 0.5, (0.3 / 6) ** 0.5)}
    for update, (limit, _, _) in cases.items():
        code, _, err = ub(capsys, "eval", "bench", "--root", str(run_copy), "--tasks",
                          "ub_marked", "--checkpoint", str(update), "--include-path",
                          str(tasks_dir), "--limit", str(limit))
        assert code == 0, err
    for update, (limit, mean, stderr) in cases.items():
        folder = run_copy / "bench" / "benchmarks" / f"ckpt-{update:06d}"
        samples = sorted(_samples(folder, "ub_marked"), key=lambda s: s["doc_id"])
        right = [float(a < b) for a, b in QUESTIONS[:limit]]
        assert [s["exact_match"] for s in samples] == right
        assert _mean_and_stderr(right) == pytest.approx((mean, stderr))
        [row] = pq.read_table(folder / "ub_marked.parquet").to_pylist()
        assert (row["task"], row["filter"], row["n"]) == ("ub_marked", "nothing", limit)
        assert (row["value"], row["stderr"]) == pytest.approx((mean, stderr))


def test_report_plots_each_benchmark_by_checkpoint(capsys, engine, run_copy, tasks_dir):
    run = run_copy / "bench"
    assert ub(capsys, "eval", "bench", "--root", str(run_copy), "--tasks", "ub_arith",
              "--checkpoint", "all", "--include-path", str(tasks_dir), "--limit", "4")[0] == 0
    code, _, err = ub(capsys, "report", "bench", "--root", str(run_copy), "--out",
                      str(run / "report"))
    assert code == 0, err
    png = run / "report" / "benchmarks.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Reasoning benchmarks" in (run / "report" / "report.html").read_text()


def test_scores_go_to_wandb_on_the_checkpoint_step():
    from ub.run.steps.tracking import wandb_rows

    rows = [{"task": "gsm8k", "metric": "exact_match", "filter": "strict-match",
             "value": 0.25}]
    steps = dict(wandb_rows(3, {"learner/loss": 1.0}, {}, {"4": rows}))
    assert steps[8] == {"checkpoint": 4, "benchmarks/gsm8k/exact_match/strict-match": 0.25}
    assert steps[7] == {"round": 3, "learner/loss": 1.0}


def test_scoring_again_replaces_the_rows(capsys, engine, run_copy, tasks_dir):
    run = run_copy / "bench"
    scores = run / "benchmarks" / "ckpt-000001" / "ub_arith.parquet"
    assert ub(capsys, "eval", "bench", "--root", str(run_copy), "--tasks", "ub_arith",
              "--include-path", str(tasks_dir), "--limit", "4")[0] == 0
    assert pq.read_table(scores).column("n").to_pylist() == [4]
    code, _, err = ub(capsys, "eval", "bench", "--root", str(run_copy), "--tasks", "ub_arith",
                      "--checkpoint", "latest", "--include-path", str(tasks_dir),
                      "--limit", "6")
    assert code == 0, err
    assert pq.read_table(scores).column("n").to_pylist() == [6]
    _, out, _ = ub(capsys, "sql", str(run), "SELECT checkpoint, n FROM benchmarks WHERE "
                   "checkpoint = 1", "--format", "csv")
    assert out.splitlines() == ["checkpoint,n", "1,6"]  # replaced, not a second copy


def test_a_chat_format_prompts_through_the_chat_template(capsys, engine, run_copy, tasks_dir):
    code, _, err = ub(capsys, "eval", "bench", "--root", str(run_copy), "--tasks", "ub_arith",
                      "--checkpoint", "1", "--include-path", str(tasks_dir), "--limit", "2",
                      "--format", "chat")
    assert code == 0, err
    folder = run_copy / "bench" / "benchmarks" / "ckpt-000001"
    [sample, _] = [json.loads(line) for line in
                   (folder / "ub_arith.samples.jsonl").read_text().splitlines()]
    assert sample["arguments"][0][0] == ("<|im_start|>user\nQuestion: What is 1 + 2?\n"
                                         "Answer:<|im_end|>\n<|im_start|>assistant\n")
    assert pq.read_table(folder / "ub_arith.parquet").column(
        "prompt_format").to_pylist() == ["chat"]


def test_training_resume_scores_a_checkpoint_once(engine, run_copy, tasks_dir):
    from ub.benchmarks import BenchmarksSection
    from ub.run.config.base_model import resolve_base_model
    from ub.run.folder.layout import RunPaths
    from ub.run.processes.worker import process_worker
    from ub.run.steps.benchmarks import score_checkpoints
    from ub.run.steps.rounds import Run, resolve_run_config

    paths = RunPaths.of(run_copy, "bench")
    config, _ = resolve_run_config(paths, None)
    run = Run(paths, config, resolve_base_model(config))
    section = BenchmarksSection(tasks=["ub_arith"], every=1, limit=2,
                                include_path=str(tasks_dir))
    first = score_checkpoints(run, [0], section, again=False, worker=process_worker())
    assert first["scored"] == [(0, "ub_arith")] and [r["n"] for r in first["rows"]] == [2]
    written = paths.benchmark_scores(0, "ub_arith").stat().st_mtime_ns
    again = score_checkpoints(run, [0], section, again=False, worker=process_worker())
    assert again["scored"] == [] and again["reused"] == [(0, "ub_arith")]
    assert again["rows"] == first["rows"]
    assert paths.benchmark_scores(0, "ub_arith").stat().st_mtime_ns == written


@pytest.mark.parametrize(("argv", "message"), [
    (["--tasks", "ub_arithm"], "unknown benchmark task 'ub_arithm' (did you mean: ub_arith"),
    (["--tasks", "ub_hub_only"], "task ub_hub_only: its dataset cannot be fetched"),
    (["--tasks", "ub_choice"], "ub_choice need loglikelihood scores"),
    (["--tasks", "ub_arith", "--checkpoint", "7"], "run bench has no checkpoint 7"),
    (["--tasks", "ub_arith", "--games", "2"], "--games set up games; --tasks scores"),
    (["--limit", "3"], "--limit go with --tasks"),
    (["--checkpoint", "all"], "--checkpoint all goes with --tasks"),
    (["--tasks", "../x"], "is not a harness task name"),
])
def test_bad_input_is_one_line_and_writes_nothing(capsys, runs, tasks_dir, argv, message):
    before = sorted(p for p in (runs / "bench").rglob("*") if "benchmarks" in p.parts)
    extra = ["--include-path", str(tasks_dir)] if "--tasks" in argv else []
    code, _, err = ub(capsys, "eval", "bench", "--root", str(runs), *extra, *argv)
    assert code != 0
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p for p in (runs / "bench").rglob("*") if "benchmarks" in p.parts) == before


def test_a_run_with_an_unknown_benchmark_is_refused_before_it_writes(capsys, tmp_path,
                                                                     tiny_model, tasks_dir):
    """`ub train`'s preflight checks eval.benchmarks' names (not at checkpoint 0's scoring)."""
    code, _, err = ub(capsys, "train", "tiny-cpu", "--run", "x", "--root", str(tmp_path),
                      "--set", "eval.benchmarks.tasks=[ub_arithm]",
                      "--set", f"eval.benchmarks.include_path={tasks_dir}")
    assert code == 2
    assert "unknown benchmark task 'ub_arithm' (did you mean: ub_arith" in err, err
    assert len(err.strip().splitlines()) == 1 and list(tmp_path.iterdir()) == []


def test_a_chat_format_needs_a_chat_template(capsys, tmp_path, tiny_model, tasks_dir):
    from ub.run.config.load import load_config
    from ub.run.folder.layout import RunPaths
    from ub.run.steps.rounds import open_run

    model = tmp_path / "no-chat"
    shutil.copytree(tiny_model, model)
    (model / "chat_template.jinja").unlink()
    config = load_config("tiny-cpu").model_copy(update={"model": load_config(
        "tiny-cpu").model.model_copy(update={"base": str(model)})})
    paths = RunPaths.of(tmp_path / "runs", "nochat")
    open_run(paths, config)
    _checkpoint(paths, 0, model, seed=0)
    code, _, err = ub(capsys, "eval", "nochat", "--root", str(tmp_path / "runs"), "--tasks",
                      "ub_arith", "--include-path", str(tasks_dir), "--format", "chat")
    assert code != 0
    assert "a chat format was asked for, but the base model's tokenizer has no chat template: " \
           "score with plain prompts (--format plain" in err
    assert not paths.benchmarks.exists()


@pytest.mark.parametrize(("completion", "right"), [
    ("so x = 1/2.\nFinal Answer: The final answer is $\\boxed{1/2}$. I hope it is correct.",
     True),
    ("Final Answer: The final answer is $\\frac{1}{2}$. I hope it is correct.", True),
    ("Final Answer: The final answer is $\\boxed{0.50}$. I hope it is correct.", True),
    ("Final Answer: The final answer is $\\boxed{1/3}$. I hope it is correct.", False),
    ("The answer is 2.", False),
])
def test_math_answers_are_checked_by_value(completion, right):
    """The MATH-500 task's own checking (the harness's minerva_math, with math-verify): an
    answer equal in value to the reference counts, another does not."""
    from lm_eval.tasks.minerva_math.utils import process_results

    doc = {"problem": "What is 1/2 as a decimal?", "solution": "It is $\\boxed{0.5}$.",
           "answer": "0.5"}
    assert process_results(doc, [completion])["math_verify"] == int(right)


def test_training_scores_checkpoints_as_it_goes_and_a_replayed_round_does_not_again(
        prefect_api, tmp_path, engine, tasks_dir):
    """The selfplay flow with ``eval.benchmarks``: checkpoints 0 and 1 are scored in round 0 and
    carried by its manifest and metrics; round 0 replayed after a crash before its commit
    keeps the stored scores. Slow (two flow runs of one tiny round):
    only the real flow shows the step in the round."""
    import yaml

    from ub.flows.selfplay import selfplay
    from ub.run.folder.layout import RunPaths

    config = tmp_path / "bench.yaml"
    config.write_text(yaml.safe_dump({
        "seed": 1, "rounds": 1, "model": {"base": "tiny"},
        "sampling": {"temperature": 1.0, "max_tokens": 8},
        "envs": [{"env_id": "TicTacToe-v0-train"}], "rollout": {"games_per_round": 4},
        "batch": {"batch_size": 8}, "learner": {"lora": {"rank": 8, "alpha": 16}},
        "eval": {"every": 0, "benchmarks": {"tasks": ["ub_arith"], "every": 1, "limit": 2,
                                            "include_path": str(tasks_dir)}},
        "tracking": {"wandb": "disabled"}}))
    paths = RunPaths.of(tmp_path / "runs", "trained")
    selfplay(run_name="trained", config=str(config), root=str(tmp_path / "runs"),
             quiet=True)
    manifest = json.loads(paths.manifest(0).read_text())
    assert sorted(manifest["benchmarks"]) == ["0", "1"]
    assert [r["n"] for r in manifest["benchmarks"]["1"]] == [2]
    metrics = pq.read_table(paths.metrics(0)).to_pydict()
    assert "benchmarks/ub_arith/exact_match/number" in metrics["metric"]
    written = {u: paths.benchmark_scores(u, "ub_arith").stat().st_mtime_ns for u in (0, 1)}
    paths.manifest(0).unlink()  # a crash after the scoring, before the round's commit
    selfplay(run_name="trained", root=str(tmp_path / "runs"), quiet=True)
    assert {u: paths.benchmark_scores(u, "ub_arith").stat().st_mtime_ns
            for u in (0, 1)} == written
    replayed = json.loads(paths.manifest(0).read_text())
    assert replayed["benchmarks"] == manifest["benchmarks"]
