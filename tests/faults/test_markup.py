"""Item 3: text from outside is shown as typed, never read as rich markup.

A '[/x]' in a model name, a data path, --at, an export path or --out was a MarkupError traceback (with --out: after
the YAML was written, exit 1 instead of the run's own code), and markup-like text was eaten silently (the psycopg
hint printed `pip install 'psycopg'`).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import typer

from autotune.cli import exit as cli_exit
from tests.faults.conftest import error_line, invoke
from tests.fixtures.runs import run_args, start

MARKUP = "[/x]"


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["run", "--model", f"a{MARKUP}"], f"unknown model 'a{MARKUP}'"),
        (["run", "--model", "cam++", "--data", f"/no/such/{MARKUP}/train.csv"], f"/no/such/{MARKUP}/train.csv"),
        (["schedule", "--model", "cam++", "--at", MARKUP], f"--at '{MARKUP}' is not a time of day"),
        (["export", f"/no/such/r{MARKUP}.yaml", "--to", "wenet"], f"/no/such/r{MARKUP}.yaml does not exist"),
        (["report", f"/no/such/r{MARKUP}.yaml"], f"/no/such/r{MARKUP}.yaml"),
    ],
    ids=["model", "data", "at", "export", "report"],
)
def test_markup_in_what_the_user_typed_is_shown_as_typed(args, shown, tmp_path):
    result = invoke([*args, *(["--results-dir", str(tmp_path)] if args[0] == "run" else [])])
    assert result.exit_code == 2, result.output
    assert shown in error_line(result.stderr)


def test_the_driver_hint_keeps_its_brackets(tmp_path, monkeypatch):
    def no_driver(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'psycopg'")

    monkeypatch.setattr(optuna.storages, "RDBStorage", no_driver)
    result = invoke(
        ["run", "--model", "cam++", "--storage", "postgresql://tune@db/studies", "--results-dir", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "pip install 'psycopg[binary]'" in error_line(result.stderr)


def test_a_regression_on_an_out_with_markup_keeps_exit_code_3(capsys):
    verdict = SimpleNamespace(
        previous_path=Path(f"r{MARKUP}.yaml"),
        regression=True,
        lines=lambda: [f"regression: the previous winner in r{MARKUP}.yaml is slower by 20%"],
    )
    report = SimpleNamespace(verdict=verdict, outcome=SimpleNamespace(stopped_by="trials"), written=False)
    with pytest.raises(typer.Exit) as caught:
        cli_exit.finish(report)
    assert caught.value.exit_code == cli_exit.EXIT_REGRESSION
    assert f"previous winner in r{MARKUP}.yaml" in capsys.readouterr().out


@pytest.mark.slow
def test_a_run_whose_out_has_markup_writes_it_and_says_where(tiny_corpus, tmp_path):
    out, log = tmp_path / f"r{MARKUP}" / f"cam{MARKUP}.yaml", tmp_path / "run.log"
    args = run_args(tiny_corpus, tmp_path / "results", "--trials", "1", "--no-amp-check", "--no-ceiling")
    args += ["--max-throughput-cv", "0"]  # a busy machine must not fail this run
    process = start([*args, "--out", str(out)], log)
    assert process.wait(timeout=300) == 0, log.read_text()
    assert out.is_file()
    assert f"result written to {out}" in "".join(log.read_text().split("\n")), log.read_text()
