"""Nightly schedules: the cron line and systemd units parse back to the intended command; install edits safely."""

from __future__ import annotations

import configparser
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from autotune.errors import UserError
from autotune.nightly.request import ScheduleRequest, unit_name_for
from autotune.nightly.schedule import cron_line, enable_command, install, systemd_units

PYTHON = "/opt/venv/bin/python"
RUN_ARGS = ("--data", "/d/my data/train.csv", "--budget", "30m")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    folder = tmp_path / "tune here"  # a space in every path
    folder.mkdir()
    return folder


def make_request(folder: Path, **changes) -> ScheduleRequest:
    fields = {"model": "cam++", "at": "02:30", "workdir": str(folder), "run_args": RUN_ARGS}
    fields.setdefault("executable", (PYTHON, "-m", "autotune"))
    return ScheduleRequest(**{**fields, **changes})


def cron_command(line: str) -> str:
    """The shell command cron hands to /bin/sh: '\\%' becomes '%', a bare '%' would end the command."""
    command = line.split(None, 5)[5]
    assert re.search(r"(?<!\\)%", command) is None, "a bare % would be cut by cron"
    return command.replace("\\%", "%")


def split_systemd_command(value: str) -> list[str]:
    """ExecStart= as systemd reads it (systemd.syntax Quoting, %% specifiers, $$ at exec time)."""
    words, pattern = [], re.compile(r'"((?:[^"\\]|\\.)*)"|(\S+)')
    for quoted, plain in pattern.findall(value):
        word = re.sub(r"\\(.)", r"\1", quoted) if quoted or not plain else plain
        words.append(undouble(undouble(word, "%"), "$"))
    return words


def undouble(word: str, char: str) -> str:
    """'%%' -> '%'; a lone '%' would be a specifier (a lone '$' a variable) and must not be there."""
    parts = word.split(char * 2)
    assert not any(char in part for part in parts), f"lone {char!r} in {word!r}"
    return char.join(parts)


def parse_unit(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # keys are case-sensitive in systemd
    parser.read_string(text)
    return parser


def test_cron_line_time_fields_and_argv(workdir: Path) -> None:
    line = cron_line(make_request(workdir, at="02:30"))
    assert line.split()[:5] == ["30", "2", "*", "*", "*"]
    log = f"{workdir}/results/cam++/nightly.log"
    assert shlex.split(cron_command(line), comments=True) == [
        *("cd", str(workdir), "&&", "mkdir", "-p", f"{workdir}/results/cam++", "&&"),
        *(PYTHON, "-m", "autotune", "run", "--model", "cam++", *RUN_ARGS),
        *(">>", log, "2>&1"),
    ]
    assert line.endswith(" # autotune:cam++")


@pytest.mark.parametrize(("at", "fields"), [("00:00", ["0", "0"]), ("23:59", ["59", "23"]), ("7:05", ["5", "7"])])
def test_cron_time_of_day(workdir: Path, at: str, fields: list[str]) -> None:
    assert cron_line(make_request(workdir, at=at)).split()[:2] == fields


def test_cron_command_runs_under_sh_with_awkward_arguments(workdir: Path) -> None:
    """The real shell gets back exactly the argv, quotes, '$', '%' and ';' included, and appends to the log."""
    awkward = ("--data", '/d/it\'s a "path"/50% $HOME;x', "--budget", "")
    echo = (sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))")
    request = make_request(workdir, run_args=awkward, executable=echo)
    subprocess.run(["/bin/sh", "-c", cron_command(cron_line(request))], check=True, timeout=30)
    logged = Path(request.log_file).read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in logged] == [["run", "--model", "cam++", *awkward]]


def test_cron_refuses_what_cron_cannot_express(workdir: Path) -> None:
    with pytest.raises(UserError, match="crontab cannot express"):
        cron_line(make_request(workdir, run_args=("--data", "a\\%b")))


def test_systemd_units_sections_keys_and_command(workdir: Path) -> None:
    request = make_request(workdir, systemd=True, run_args=(*RUN_ARGS, "--out", "/r/100% $HOME.yaml"))
    units = systemd_units(request)
    assert set(units) == {"autotune-cam-plus-plus.service", "autotune-cam-plus-plus.timer"}
    service = parse_unit(units["autotune-cam-plus-plus.service"])
    timer = parse_unit(units["autotune-cam-plus-plus.timer"])
    log = f"{workdir}/results/cam++/nightly.log"
    assert service.sections() == ["Unit", "Service"]
    assert service["Service"]["Type"] == "oneshot"
    assert service["Service"]["WorkingDirectory"] == str(workdir)
    assert service["Service"]["StandardOutput"] == service["Service"]["StandardError"] == f"append:{log}"
    assert split_systemd_command(service["Service"]["ExecStart"]) == request.argv
    assert request.argv[-1] == "/r/100% $HOME.yaml"
    assert timer.sections() == ["Unit", "Timer", "Install"]
    assert timer["Timer"]["OnCalendar"] == "*-*-* 02:30:00"
    assert timer["Timer"]["Persistent"] == "true"
    assert timer["Timer"]["Unit"] == "autotune-cam-plus-plus.service"
    assert timer["Install"]["WantedBy"] == "timers.target"


def test_systemd_doubles_percent_in_paths(tmp_path: Path) -> None:
    workdir = tmp_path / "at 100%"
    workdir.mkdir()
    service = parse_unit(systemd_units(make_request(workdir))["autotune-cam-plus-plus.service"])
    assert service["Service"]["WorkingDirectory"] == str(workdir).replace("%", "%%")
    assert service["Service"]["StandardOutput"].endswith("at 100%%/results/cam++/nightly.log")


@pytest.mark.parametrize(
    ("model", "unit"),
    [("cam++", "autotune-cam-plus-plus"), ("eres2net", "autotune-eres2net"), ("ecapa-tdnn", "autotune-ecapa-tdnn")],
)
def test_unit_names_are_safe(model: str, unit: str) -> None:
    assert unit_name_for(model) == unit


class FakeCrontab:
    """`crontab -l` / `crontab -` over an in-memory table; None means the user has no crontab yet."""

    def __init__(self, table: str | None) -> None:
        self.table = table

    def __call__(self, args: Sequence[str], input_text: str | None) -> subprocess.CompletedProcess[str]:
        if list(args) == ["-l"]:
            if self.table is None:
                return subprocess.CompletedProcess(args, 1, "", "no crontab for tester\n")
            return subprocess.CompletedProcess(args, 0, self.table, "")
        assert list(args) == ["-"] and input_text is not None
        self.table = input_text
        return subprocess.CompletedProcess(args, 0, "", "")


def test_install_cron_replaces_this_models_line_and_keeps_the_rest(workdir: Path) -> None:
    others = [
        "MAILTO=ops@example.com",
        "0 * * * * /usr/bin/backup --all  # nightly backup",
        "15 3 * * * cd /x && python -m autotune run --model eres2net >> /x/log 2>&1 # autotune:eres2net",
    ]
    old = "0 1 * * * cd /old && python -m autotune run --model cam++ >> /old/log 2>&1 # autotune:cam++"
    crontab = FakeCrontab("\n".join([others[0], old, *others[1:]]) + "\n")
    request = make_request(workdir)
    lines = install(request, crontab_runner=crontab)
    assert crontab.table == "\n".join([*others, cron_line(request)]) + "\n"
    assert lines and "replaced" in lines[0]
    assert Path(request.log_file).parent.is_dir()
    install(request, crontab_runner=crontab)  # idempotent
    assert crontab.table is not None and crontab.table.count("# autotune:cam++") == 1


def test_install_cron_without_a_crontab_yet(workdir: Path) -> None:
    crontab = FakeCrontab(None)
    request = make_request(workdir)
    assert "added" in install(request, crontab_runner=crontab)[0]
    assert crontab.table == cron_line(request) + "\n"


def test_install_systemd_writes_both_units(workdir: Path, tmp_path: Path) -> None:
    request = make_request(workdir, systemd=True)
    unit_dir = tmp_path / "units"
    lines = install(request, systemd_dir=unit_dir)
    written = {path.name: path.read_text(encoding="utf-8") for path in unit_dir.iterdir()}
    assert written == systemd_units(request)
    assert lines[-1] == enable_command(request)
    assert enable_command(request).endswith("systemctl --user enable --now autotune-cam-plus-plus.timer")
    assert Path(request.log_file).parent.is_dir()


def _missing_crontab(args: Sequence[str], input_text: str | None) -> subprocess.CompletedProcess[str]:
    raise FileNotFoundError("crontab")


def _denied_crontab(args: Sequence[str], input_text: str | None) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(args, 1, "", "You (tester) are not allowed to use this program (crontab)\n")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"at": "24:00"}, "--at"),
        ({"at": "2:3"}, "--at"),
        ({"at": "12:60"}, "--at"),
        ({"at": "noon"}, "--at"),
        ({"model": "no-such-model"}, "unknown model"),
        ({"model": "no_such_pkg.module:factory"}, "cannot import plugin"),
        ({"workdir": "/no/such/folder"}, "does not exist"),
        ({"run_args": ("--model", "eres2net")}, "give the model once"),
        ({"run_args": ("--data", "a\nb")}, "control character"),
        ({"executable": ("python", "-m", "autotune")}, "absolute path"),
        ({"unit_name": "bad name"}, "unit name"),
        ({"run_args": ("--storage", "postgresql://tune:pw@db/t")}, "carries a password; .* ~/.pgpass"),
    ],
)
def test_bad_requests_are_one_line_user_errors(workdir: Path, changes: dict, message: str) -> None:
    with pytest.raises(UserError, match=message) as caught:
        make_request(workdir, **changes)
    assert "\n" not in str(caught.value) and ":pw@" not in str(caught.value)


@pytest.mark.parametrize(
    ("runner", "message"), [(_missing_crontab, "install cron .* or use --systemd"), (_denied_crontab, "not allowed")]
)
def test_crontab_problems_are_one_line_user_errors(workdir: Path, runner, message: str) -> None:
    with pytest.raises(UserError, match=message) as caught:
        install(make_request(workdir), crontab_runner=runner)
    assert "\n" not in str(caught.value)
    assert not (workdir / "results").exists()  # nothing done before the crontab could be read


def test_systemd_refuses_an_executable_it_cannot_run(workdir: Path, tmp_path: Path) -> None:
    request = make_request(workdir, systemd=True, executable=("/opt/$weird/python", "-m", "autotune"))
    with pytest.raises(UserError, match="systemd cannot run"):
        install(request, systemd_dir=tmp_path / "units")
    assert not (tmp_path / "units").exists()
