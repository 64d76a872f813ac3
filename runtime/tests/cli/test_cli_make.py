"""``haze make:job``: names, paths, overwrite protection (in-process, CliRunner)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from haze.cli import get_cli
from haze.cli.make import snake_case


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("SendInvoice", "send_invoice"),
        ("sendInvoice", "send_invoice"),
        ("send_invoice", "send_invoice"),
        ("send-invoice", "send_invoice"),
        ("HTTPPing", "http_ping"),
        ("ResizeImage2x", "resize_image2x"),
        ("Job", "job"),
    ],
)
def test_snake_case(name: str, expected: str) -> None:
    assert snake_case(name) == expected


def test_make_job_writes_the_template(tmp_path: Path) -> None:
    result = CliRunner().invoke(get_cli(), ["--root", str(tmp_path), "make:job", "SendInvoice"])
    assert result.exit_code == 0, result.output
    path = tmp_path / "app" / "job" / "send_invoice.py"
    assert str(path) in result.output
    text = path.read_text()
    assert "from haze import JobContext, define_job" in text
    assert "@define_job(" in text
    assert "async def send_invoice(payload: dict[str, Any], job: JobContext) -> None:" in text
    compile(text, str(path), "exec")


def test_make_job_nests_subfolders(tmp_path: Path) -> None:
    result = CliRunner().invoke(get_cli(), ["--root", str(tmp_path), "make:job", "admin/Cleanup"])
    assert result.exit_code == 0, result.output
    assert "async def cleanup(" in (tmp_path / "app/job/admin/cleanup.py").read_text()


def test_a_job_made_in_a_subfolder_is_named_by_its_path(tmp_path: Path) -> None:
    # admin/Example beside the example job `haze init` writes: two jobs named "example"
    # would stop every command with DuplicateJobError
    runner, cli = CliRunner(), get_cli()
    for name in ("Example", "admin/Example"):
        result = runner.invoke(cli, ["--root", str(tmp_path), "make:job", name])
        assert result.exit_code == 0, result.output
    top = (tmp_path / "app/job/example.py").read_text()
    nested = (tmp_path / "app/job/admin/example.py").read_text()
    assert "@define_job(tries=3" in top
    assert '@define_job(name="admin.example", tries=3' in nested
    compile(nested, "admin/example.py", "exec")


def test_make_job_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    runner, cli = CliRunner(), get_cli()
    path = tmp_path / "app" / "job" / "send_invoice.py"
    path.parent.mkdir(parents=True)
    path.write_text("# mine\n")
    result = runner.invoke(cli, ["--root", str(tmp_path), "make:job", "SendInvoice"])
    assert result.exit_code == 1
    assert "already exists" in result.output
    assert "--force" in result.output
    assert path.read_text() == "# mine\n"
    result = runner.invoke(cli, ["--root", str(tmp_path), "make:job", "SendInvoice", "--force"])
    assert result.exit_code == 0, result.output
    assert "async def send_invoice(" in path.read_text()


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("9Lives", "is not a job name"),
        ("Send Invoice", "is not a job name"),
        ("send.invoice", "is not a job name"),
        ("admin//Cleanup", "is not a job name"),
        ("", "is not a job name"),
        ("Import", "Python keyword"),
    ],
)
def test_make_job_rejects_bad_names(tmp_path: Path, name: str, message: str) -> None:
    result = CliRunner().invoke(get_cli(), ["--root", str(tmp_path), "make:job", name])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "app").exists()


def test_make_job_does_not_need_a_valid_config(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "queue.py").write_text("raise RuntimeError('broken')\n")
    result = CliRunner().invoke(get_cli(), ["--root", str(tmp_path), "make:job", "Ping"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "app" / "job" / "ping.py").is_file()


def test_root_defaults_to_haze_app_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAZE_APP_ROOT", str(tmp_path))
    result = CliRunner().invoke(get_cli(), ["make:job", "FromEnv"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "app" / "job" / "from_env.py").is_file()


def test_missing_root_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(get_cli(), ["--root", str(tmp_path / "nope"), "make:job", "X"])
    assert result.exit_code == 2
    assert "--root" in result.output
