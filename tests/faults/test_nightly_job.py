"""Items 7 and 8: the nightly job imports nothing from its working folder, and never shows a password.

`cd WORKDIR && python -m autotune` put WORKDIR first on sys.path: a typer.py there ran as part of the job. The job
now runs `python -P -m autotune` (3.11+; the same through -c on 3.10), and a plugin model's folder is named in
PYTHONPATH instead. A MySQL URL's `passwd=` was printed in the cron line; the driver hint named PostgreSQL for it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import optuna
import pytest

from autotune import storage
from autotune.errors import UserError
from autotune.nightly import request as schedule_request
from autotune.nightly import schedule
from autotune.python_command import module_command_without_flag
from autotune.storage import opening as storage_urls
from tests.faults.conftest import error_line, invoke, python_env
from tests.fixtures.runs import FIXTURES, ROOT

DECOY = "open({marker!r}, 'w').write('imported from the working folder')\nraise SystemExit(9)\n"


def _run_job(request: schedule_request.ScheduleRequest, env: dict[str, str]) -> str:
    """The cron line's command under /bin/sh, as cron runs it; returns the job's log. The jobs here end in a
    one-line error of `autotune run` (exit 2): far enough to show what was imported, without a trial."""
    command = schedule.cron_line(request).split(None, 5)[5].replace("\\%", "%")
    done = subprocess.run(["/bin/sh", "-c", command], env=env, timeout=120, check=False)
    log = Path(request.log_file).read_text()
    assert done.returncode == 2, log
    return log


@pytest.mark.parametrize(
    "executable",
    [schedule_request.default_executable(), tuple(module_command_without_flag("autotune"))],
    ids=["default", "python3.10-form"],
)
def test_the_nightly_job_does_not_import_from_its_working_folder(tmp_path, executable):
    marker = tmp_path / "imported"
    for decoy in ("typer.py", "optuna.py", "rich.py"):
        (tmp_path / decoy).write_text(DECOY.format(marker=str(marker)))
    request = schedule_request.ScheduleRequest(
        model="cam++", at="02:30", workdir=str(tmp_path), run_args=("--trials", "0"), executable=executable
    )
    log = _run_job(request, python_env())
    assert "--trials must be at least 1" in log  # autotune ran, to its own one-line error
    assert not marker.exists()


def test_a_plugin_model_is_imported_from_where_it_was_found(tmp_path):
    request = schedule_request.ScheduleRequest(
        model="tests.fixtures.faulty_workload:workload",
        at="02:30",
        workdir=str(tmp_path),
        run_args=("--data", str(tmp_path / "no-such-data"), "--space", str(FIXTURES / "fast_space.yaml")),
    )
    assert request.python_path == (str(ROOT),)
    assert f"PYTHONPATH={ROOT} " in schedule.cron_line(request)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    log = _run_job(request, env)
    assert "no-such-data" in log and "cannot import plugin" not in log  # it loaded, then refused the data
    assert (
        "Environment="
        in schedule.systemd_units(
            schedule_request.ScheduleRequest(model=request.model, at="02:30", workdir=str(tmp_path), systemd=True)
        )[f"{schedule_request.unit_name_for(request.model)}.service"]
    )


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("mysql://u@h/db?passwd=s3cret", "mysql://u@h/db?passwd=***"),
        ("mysql+pymysql://u@h/db?charset=utf8&passwd=s3cret", "mysql+pymysql://u@h/db?charset=utf8&passwd=***"),
        ("mssql+pyodbc://h/db?driver=x&PWD=s3cret", "mssql+pyodbc://h/db?driver=x&PWD=***"),
        ("postgresql://h/db?sslpassword=s3cret&user=u", "postgresql://h/db?sslpassword=***&user=u"),
    ],
    ids=["passwd", "passwd-later", "pwd", "sslpassword"],
)
def test_every_password_parameter_is_redacted(url, shown):
    assert storage_urls.redact_url(url) == shown


def test_schedule_refuses_a_mysql_password_and_never_prints_it(tmp_path):
    result = invoke(["schedule", "--model", "cam++", "--", "--storage", "mysql://u@h/db?passwd=s3cret"])
    assert result.exit_code == 2 and "carries a password" in error_line(result.stderr)
    assert "s3cret" not in result.output


@pytest.mark.parametrize(
    ("url", "hint"),
    [
        ("mysql://u@h/db", "for MySQL: pip install mysqlclient"),
        ("postgresql://u@h/db", "for PostgreSQL: pip install 'psycopg[binary]'"),
        ("mysql+asyncmy://u@h/db", "the 'asyncmy' driver"),
    ],
    ids=["mysql", "postgresql", "named-driver"],
)
def test_the_driver_hint_names_the_urls_database(monkeypatch, url, hint):
    def no_driver(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'driver'")

    monkeypatch.setattr(optuna.storages, "RDBStorage", no_driver)
    with pytest.raises(UserError) as caught:
        storage.open_storage(url)
    assert hint in str(caught.value)
