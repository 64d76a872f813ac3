"""The app: job discovery, the current app (use_app / run_in_app / implicit default)."""

from __future__ import annotations

import asyncio
import textwrap
import uuid
from pathlib import Path
from typing import Any

import haze._app.app as haze_app
import pytest
from haze import App, DuplicateJobError, JobContext, Queue, define_job, run_in_app, use_app
from haze._jobs.definition import get_job

seen: list[tuple[str, Any]] = []


async def app_ctx_mw(payload: Any, job: JobContext, call_next: Any) -> Any:
    seen.append(("middleware", use_app()))
    return await call_next()


@define_job(name="app_ctx_job", middleware=[app_ctx_mw])
async def app_ctx_job(payload: dict, job: JobContext) -> None:
    seen.append(("handle", use_app()))
    seen.append(("ctx.app", job.app))
    if payload.get("fail"):
        raise RuntimeError("boom")
    if payload.get("child"):
        await Queue.dispatch("app_ctx_child", {})


@app_ctx_job.on_failed
async def _app_ctx_failed(payload: dict, error: BaseException, job: JobContext) -> None:
    seen.append(("failed", use_app()))


@define_job(name="app_ctx_child")
async def app_ctx_child(payload: dict) -> None:
    seen.append(("child", use_app()))


# --------------------------------------------------------------------------- discovery


def _write(root: Path, rel: str, body: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body))
    return path


JOB_FILE = """\
from haze import define_job

@define_job(name="{name}")
async def handler(payload: dict) -> None:
    pass
"""


@pytest.mark.usefixtures("isolated_imports")
def test_discovery_imports_every_job_module_under_app_job(tmp_path: Path) -> None:
    uid = uuid.uuid4().hex[:8]
    names = [f"disc_top_{uid}", f"disc_nested_{uid}", f"disc_deep_{uid}"]
    _write(tmp_path, f"app/job/top_{uid}.py", JOB_FILE.format(name=names[0]))
    _write(tmp_path, f"app/job/admin/nested_{uid}.py", JOB_FILE.format(name=names[1]))
    _write(tmp_path, f"app/job/a/b/deep_{uid}.py", JOB_FILE.format(name=names[2]))
    _write(tmp_path, f"app/other/not_a_job_{uid}.py", JOB_FILE.format(name=f"disc_other_{uid}"))
    app = App(root=tmp_path)
    for n in names:
        job = get_job(n)
        assert Path(job.origin.rsplit(":", 1)[0]).is_relative_to(tmp_path / "app" / "job")
    with pytest.raises(LookupError):
        get_job(f"disc_other_{uid}")
    # discovering again (a second app on the same root) is not a duplicate
    App(root=tmp_path)
    app.discover()


@pytest.mark.usefixtures("isolated_imports")
async def test_discovered_jobs_dispatch_by_name(tmp_path: Path) -> None:
    uid = uuid.uuid4().hex[:8]
    _write(
        tmp_path,
        f"app/job/record_{uid}.py",
        f"""\
        from haze import define_job
        ran = []

        @define_job(name="disc_run_{uid}")
        async def handler(payload: dict) -> None:
            ran.append(payload)
        """,
    )
    root = tmp_path.resolve()
    async with App(root=tmp_path) as app:
        await Queue.dispatch(f"disc_run_{uid}", {"n": 1})
        await Queue.idle()
    module = get_job(f"disc_run_{uid}").handler.__globals__
    assert module["ran"] == [{"n": 1}]
    assert app.root == root


@pytest.mark.usefixtures("isolated_imports")
def test_two_discovered_jobs_with_the_same_name_name_both_files(tmp_path: Path) -> None:
    uid = uuid.uuid4().hex[:8]
    first = _write(tmp_path, f"app/job/cleanup_{uid}.py", JOB_FILE.format(name=f"cleanup_{uid}"))
    second = _write(
        tmp_path, f"app/job/admin/cleanup_{uid}.py", "\n\n" + JOB_FILE.format(name=f"cleanup_{uid}")
    )
    with pytest.raises(DuplicateJobError) as info:
        App(root=tmp_path)
    msg = str(info.value)
    assert f"cleanup_{uid}" in msg
    # both files, each with the line of its definition (the decorator: 3, and 5 in the second)
    assert f"{second}:5" in msg
    assert f"{first}:3" in msg


@pytest.mark.usefixtures("isolated_imports")
def test_a_second_app_root_with_the_same_job_module_path_is_not_silently_shadowed(
    tmp_path: Path,
) -> None:
    # ``app`` is a namespace package over every root on sys.path: app.job.x of the second
    # root must not resolve to the first root's module (its job would be kept silently).
    uid = uuid.uuid4().hex[:8]
    first = _write(tmp_path / "a", f"app/job/same_{uid}.py", JOB_FILE.format(name=f"same_{uid}"))
    second = _write(tmp_path / "b", f"app/job/same_{uid}.py", JOB_FILE.format(name=f"same_{uid}"))
    App(root=tmp_path / "a")
    with pytest.raises(DuplicateJobError) as info:
        App(root=tmp_path / "b")
    assert str(first) in str(info.value)
    assert str(second) in str(info.value)


@pytest.mark.usefixtures("isolated_imports")
def test_a_second_app_root_keeps_relative_imports_between_its_job_modules(
    tmp_path: Path,
) -> None:
    uid = uuid.uuid4().hex[:8]
    _write(tmp_path / "a", f"app/job/first_{uid}.py", JOB_FILE.format(name=f"first_{uid}"))
    _write(tmp_path / "a", "app/__init__.py", "")  # a regular package: it owns "app"
    _write(tmp_path / "b", "app/job/helpers.py", "TAG = 'from b'\n")
    _write(
        tmp_path / "b",
        "app/job/feeds.py",
        "from .helpers import TAG\n" + JOB_FILE.format(name=f"feeds_{uid}"),
    )
    App(root=tmp_path / "a")
    App(root=tmp_path / "b")  # "app" is the first root's package: b loads privately
    assert get_job(f"feeds_{uid}").handler.__globals__["TAG"] == "from b"


@pytest.mark.usefixtures("isolated_imports")
def test_a_broken_job_module_is_a_config_error_naming_it(tmp_path: Path) -> None:
    from haze import ConfigError

    uid = uuid.uuid4().hex[:8]
    path = _write(tmp_path, f"app/job/broken_{uid}.py", "raise RuntimeError('kaputt')\n")
    with pytest.raises(ConfigError) as info:
        App(root=tmp_path)
    assert str(path) in str(info.value)
    assert "kaputt" in str(info.value)


# --------------------------------------------------------------------------- current app


def test_implicit_default_app_without_any_app() -> None:
    assert haze_app._current.get() is None
    default = use_app()
    assert isinstance(default, App)
    assert use_app() is default
    assert list(default.queue_config.connections) == ["memory"]
    assert default.queue_config.connections["memory"]["driver"] == "memory"


async def test_implicit_default_app_runs_jobs() -> None:
    seen.clear()
    await app_ctx_child.dispatch({})
    await Queue.idle()
    assert seen == [("child", use_app())]
    assert use_app() is haze_app._default()


async def test_entered_app_is_current_and_nesting_restores(make_app: Any) -> None:
    outer, inner = make_app(), make_app()
    default = use_app()
    async with outer:
        assert use_app() is outer
        async with inner:
            assert use_app() is inner
        assert use_app() is outer
    assert use_app() is default


async def test_app_fixture_is_current(app: App) -> None:
    assert use_app() is app


async def test_run_in_app_pins_an_app_for_sync_and_async_functions(make_app: Any) -> None:
    a, b = make_app(), make_app()
    async with a:
        assert await run_in_app(b, use_app) is b

        async def body() -> App:
            await asyncio.sleep(0)
            return use_app()

        assert await run_in_app(b, body) is b
        assert use_app() is a


async def test_jobs_run_in_their_own_app_context(make_app: Any) -> None:
    """Handle, middleware, failed and facades inside them resolve to the job's app,
    even while another app is the most recently entered one."""
    seen.clear()
    first, second = make_app(), make_app()
    async with first, second:
        assert use_app() is second

        async def go() -> None:
            await app_ctx_job.dispatch({"child": True})
            await app_ctx_job.dispatch({"fail": True})
            await Queue.idle()

        await run_in_app(first, go)
        assert await Queue.failed() == []  # second app: nothing failed there
        assert len(await run_in_app(first, Queue.failed)) == 1
    where = {(what, app) for what, app in seen}
    assert where == {
        ("middleware", first),
        ("handle", first),
        ("ctx.app", first),
        ("failed", first),
        ("child", first),
    }


async def test_the_app_fixture_runs_jobs(app: App) -> None:
    seen.clear()
    await app_ctx_child.dispatch({})
    await Queue.idle()
    assert seen == [("child", app)]


@define_job(name="app_test_encrypted", encrypted=True)
async def app_test_encrypted(payload: Any) -> None:
    pass


def test_app_refuses_an_unusable_key_when_an_encrypted_job_is_registered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from haze.crypto import generate_key
    from haze.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^App\(key=\.\.\.\): a base64 key must decode to 32"):
        App(key="base64:c2hvcnQ=")
    monkeypatch.setenv("APP_KEY", "base64:short")
    with pytest.raises(ConfigError, match=r"^APP_KEY: the text after 'base64:' is not valid"):
        App()
    monkeypatch.setenv("APP_KEY", generate_key())
    monkeypatch.setenv("APP_PREVIOUS_KEYS", f"{generate_key()}, base64:AAAA")
    with pytest.raises(ConfigError, match=r"^APP_PREVIOUS_KEYS: a base64 key must decode"):
        App()


async def test_dispatch_with_a_key_broken_after_start_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from haze.crypto import generate_key
    from haze.errors import ConfigError

    monkeypatch.delenv("APP_PREVIOUS_KEYS", raising=False)
    monkeypatch.setenv("APP_KEY", generate_key())
    async with App():
        monkeypatch.setenv("APP_KEY", "base64:short")  # never a raw binascii.Error
        with pytest.raises(ConfigError, match="APP_KEY: the text after 'base64:'"):
            await app_test_encrypted.dispatch({"n": 1})


@pytest.mark.parametrize("padded", [" {key}", "{key}\n", "\t{key} ", " a long enough passphrase"])
def test_a_key_with_whitespace_around_it_is_refused_not_hashed_as_a_passphrase(
    monkeypatch: pytest.MonkeyPatch, padded: str
) -> None:
    """' base64:…' (a space after '=' in an env file) does not start with 'base64:', so it
    was taken as a passphrase: another key than the one meant, found only when another
    process could not decrypt. A newline read from a secrets file was 'not valid base64'.
    (APP_PREVIOUS_KEYS is a list: the spaces around its commas are not part of a key.)"""
    from haze.crypto import generate_key
    from haze.errors import ConfigError

    monkeypatch.delenv("APP_PREVIOUS_KEYS", raising=False)
    monkeypatch.setenv("APP_KEY", padded.format(key=generate_key()))
    with pytest.raises(ConfigError, match=r"^APP_KEY: .*whitespace"):
        App()
    with pytest.raises(ConfigError, match=r"^App\(key=\.\.\.\): .*whitespace"):
        App(key=padded.format(key=generate_key()))


@pytest.mark.parametrize("variable", ["APP_KEY", "APP_PREVIOUS_KEYS"])
def test_a_key_that_is_not_utf8_is_one_config_error_line(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    """A byte that is not UTF-8 in the environment reaches Python as a lone surrogate:
    hashing the passphrase raised a raw UnicodeEncodeError in every command."""
    from haze.crypto import generate_key
    from haze.errors import ConfigError

    monkeypatch.delenv("APP_PREVIOUS_KEYS", raising=False)
    monkeypatch.setenv("APP_KEY", generate_key())
    monkeypatch.setenv(variable, "a passphrase long enough \udcff")
    with pytest.raises(ConfigError, match=rf"^{variable}: .*UTF-8"):
        App()
