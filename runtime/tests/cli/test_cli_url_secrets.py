"""A URL an error, a log line or a dashboard page shows never carries its credentials: a token in the query
(``?authToken=``), in the userinfo (``user:pass@``, ``:pass@``, ``TOKEN@``) or in another
query option (``?password=``), for every URL kind whose errors name the URL.

Each case is a URL the CLI cannot use before it reaches any server (a missing host, a
bad port), so the error comes from parsing, where the raw URL is at hand. Errors that
come back from a real server (PostgreSQL, MySQL, libSQL unreachable or refusing the
token) are checked in tests/database (test_libsql.py, test_connectors.py).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from haze._base.urls import redact_url
from haze.cli import get_cli

pytestmark = pytest.mark.usefixtures("isolated_imports")

SECRET = "S3CRET-tok"

DATABASE_URLS = [
    f"http://?authToken={SECRET}",  # the reported case: the token in the query, no host
    f"libsql://:{SECRET}@",  # in the userinfo, as a password
    f"http://{SECRET}@/db",  # in the userinfo, as the user name
    f"https://u:{SECRET}@db.example.com:notaport",
    f"libsql://db.example.com:99999999?tls=0&authToken={SECRET}",
    f"d1://acct:{SECRET}@x/y",
    f"mysql://u:{SECRET}@h:notaport/db",
    f"postgresql://u@h/db?password={SECRET}&sslmode=require&port=x",
    f"cockroach://u:{SECRET}@h/db",  # not a scheme haze knows
    f"postgresql://u:{SECRET}@[::1/db",  # the parser's own error quotes the whole URL
    f"mysql://u:{SECRET}/x@h:1/db",  # an unescaped '/' in the password ends the host early
]

REDIS_URLS = [
    f"redis://:{SECRET}@h:notaport/0",
    f"rediss://u:{SECRET}@h:notaport/0?password={SECRET}",
    f"unix://:{SECRET}@/tmp/x.sock?db=notanumber",
    f"redis://:{SECRET}#x@h:1/0",  # the parser's port error quotes what ends the host
]


def write_app(root: Path, driver: str) -> Path:
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "config/database.py").write_text(
        textwrap.dedent(
            """\
            from haze import define_database_config, env
            config = define_database_config(default="main",
                connections={"main": {"url": env("DATABASE_URL", "sqlite:///x.db")}})
            """
        )
    )
    (root / "config/queue.py").write_text(
        textwrap.dedent(
            f"""\
            from haze import define_queue_config
            config = define_queue_config(default="q", connections={{"q": {{"driver": "{driver}"}}}})
            """
        )
    )
    return root


def queue_size(root: Path, env: dict[str, str]) -> tuple[int, str]:
    result = CliRunner().invoke(get_cli(), ["--root", str(root), "queue:size"], env=env)
    return result.exit_code, result.output


@pytest.mark.parametrize("url", DATABASE_URLS)
def test_a_bad_database_url_is_one_line_without_its_secret(tmp_path: Path, url: str) -> None:
    code, output = queue_size(write_app(tmp_path, "database"), {"DATABASE_URL": url})
    assert code != 0
    assert SECRET not in output
    assert "***" in output or "cockroach" in output  # the URL is shown, masked
    assert "Traceback" not in output
    assert output.startswith("Error: ")
    assert len(output.strip().splitlines()) == 1, output


@pytest.mark.parametrize("url", REDIS_URLS)
def test_a_bad_redis_url_is_one_line_without_its_secret(tmp_path: Path, url: str) -> None:
    code, output = queue_size(write_app(tmp_path, "redis"), {"REDIS_URL": url})
    assert code != 0
    assert SECRET not in output
    assert "Traceback" not in output
    assert output.startswith("Error: ")
    assert "***" in output
    assert len(output.strip().splitlines()) == 1, output


def closed_port() -> int:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.parametrize("mark", ["#", "/", "?"])
def test_a_password_with_an_unescaped_reserved_character_is_masked_whole(
    tmp_path: Path, mark: str
) -> None:
    """libpq takes ``postgresql://u:pa#ss@host/db`` as it is written, so such a URL
    works; its outage line must not show the part of the password after the mark."""
    pytest.importorskip("psycopg")
    url = f"postgresql://u:{SECRET}{mark}{SECRET}@127.0.0.1:{closed_port()}/db"
    code, output = queue_size(write_app(tmp_path, "database"), {"DATABASE_URL": url})
    assert code != 0
    assert SECRET not in output, output
    assert "***" in output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"postgresql://app:{SECRET}@db:5432/x", "postgresql://app:***@db:5432/x"),
        (f"postgresql://app:p#{SECRET}@db:5432/x", "postgresql://***@db:5432/x"),
        (
            f"postgresql://app:p/{SECRET}@db/x?password={SECRET}",
            "postgresql://***@db/x?password=***",
        ),
        (f"redis://:{SECRET}@r:6379/0", "redis://:***@r:6379/0"),
        (f"mysql://root@h/db?password={SECRET}", "mysql://root@h/db?password=***"),
        (
            f"libsql://x.turso.io?authToken={SECRET}&tls=1",
            "libsql://x.turso.io?authToken=***&tls=1",
        ),
        (f"http://h?auth_token={SECRET}&api_key={SECRET}", "http://h?auth_token=***&api_key=***"),
        ("postgresql://u@h/x?sslmode=require", "postgresql://u@h/x?sslmode=require"),
    ],
)
def test_redact_url_masks_passwords_and_secret_options(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_url_can_mask_the_whole_userinfo() -> None:
    # libSQL over HTTP: a token may sit where a user name goes
    assert redact_url(f"http://{SECRET}@h:8080", keep_user=False) == "http://***@h:8080"
    assert redact_url(f"http://{SECRET}@h:8080") == f"http://{SECRET}@h:8080"
    assert redact_url("http://[::1") == "<unparseable URL>"


# ------------------------------------------------------------------ log lines and pages


def unreachable_pg_app() -> tuple[Any, str]:
    from haze import App, define_database_config, define_queue_config

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql://app:{SECRET}@127.0.0.1:{port}/db?sslpassword={SECRET}"
    app = App(
        queue=define_queue_config(default="db", connections={"db": {"driver": "database"}}),
        database=define_database_config(default="main", connections={"main": {"url": url}}),
    )
    return app, url


async def test_the_worker_logs_an_unreachable_database_without_its_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pytest.importorskip("psycopg")
    from haze._workers.worker import Worker

    app, _ = unreachable_pg_app()
    async with app:
        worker = Worker(app, "db", ["default"], 1, sleep=0.05)
        with caplog.at_level(logging.WARNING):
            worker.start()
            for _ in range(200):
                if any("unavailable" in r.getMessage() for r in caplog.records):
                    break
                await asyncio.sleep(0.05)
            await worker.stop()
    lines = [r.getMessage() for r in caplog.records]
    assert any("unavailable" in line and "app:***@127.0.0.1" in line for line in lines), lines
    assert not [line for line in lines if SECRET in line]


def test_the_dashboard_shows_an_unreachable_database_without_its_password() -> None:
    pytest.importorskip("psycopg")
    from haze.dashboard import create_app
    from starlette.testclient import TestClient

    app, _ = unreachable_pg_app()
    with TestClient(create_app(app, authorize=lambda request: True)) as client:
        for path in ("/", "/failed", "/batches"):
            response = client.get(path)
            assert response.status_code == 503, (path, response.text[:300])
            assert "app:***@127.0.0.1" in response.text
            assert SECRET not in response.text
            assert "Traceback" not in response.text
