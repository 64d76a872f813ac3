"""``haze build``: the framework (haze.build) and the CLI's error paths, in-process.

The presets themselves are tested by running their output: the Cloudflare Worker under
Pyodide (adapters/cloudflare/tests/test_build_cloudflare.py), the Lambda zip under
awslambdaric (adapters/lambda/tests/test_build_lambda.py).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from haze._base.errors import ConfigError
from haze.build import PRESETS, BuildContext, build, deterministic_zip
from haze.build.cloudflare import merge_wrangler
from haze.cli import COMMAND_MODULES, get_cli


def memory_app(root: Path) -> Path:
    (root / "config").mkdir(parents=True)
    (root / "config" / "queue.py").write_text(
        "from haze import define_queue_config\n"
        "config = define_queue_config(default='memory', connections={'memory': "
        "{'driver': 'memory'}})\n"
    )
    return root


def test_build_is_a_cli_command() -> None:
    assert "haze.cli.build" in COMMAND_MODULES
    result = CliRunner().invoke(get_cli(), ["build", "--help"])
    assert result.exit_code == 0
    for preset in PRESETS:
        assert preset in result.output


def test_cli_unknown_preset_lists_the_presets(tmp_path: Path) -> None:
    root = memory_app(tmp_path / "app")
    result = CliRunner().invoke(get_cli(), ["--root", str(root), "build", "--preset", "heroku"])
    assert result.exit_code == 2
    assert "unknown preset 'heroku'" in result.output
    assert "cloudflare, aws-lambda, docker, server, vercel" in result.output
    assert not (root / "dist").exists()


def test_cli_preset_is_required(tmp_path: Path) -> None:
    result = CliRunner().invoke(get_cli(), ["--root", str(tmp_path), "build"])
    assert result.exit_code == 2
    assert "--preset" in result.output


def test_cli_broken_config_fails_before_writing(tmp_path: Path) -> None:
    root = memory_app(tmp_path / "app")
    (root / "config" / "queue.py").write_text(
        "from haze import define_queue_config\n"
        "config = define_queue_config(connections={'x': {'driver': 'nope'}})\n"
    )
    out = tmp_path / "dist"
    result = CliRunner().invoke(
        get_cli(), ["--root", str(root), "build", "--preset", "aws-lambda", "--out", str(out)]
    )
    assert result.exit_code == 1
    assert "config/queue.py" in result.output
    assert "connections.x.driver" in result.output
    assert not out.exists()


def test_cli_cloudflare_without_a_cloudflare_connection(tmp_path: Path) -> None:
    root = memory_app(tmp_path / "app")
    result = CliRunner().invoke(get_cli(), ["--root", str(root), "build", "--preset", "cloudflare"])
    assert result.exit_code == 1
    assert "no connection uses the cloudflare driver" in result.output
    assert '"binding": "QUEUE"' in result.output
    assert not (root / "dist" / "wrangler.json").exists()


def test_build_unknown_preset_raises_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="choose one of: cloudflare, aws-lambda"):
        build(memory_app(tmp_path / "app"), "heroku")


def test_a_preset_whose_module_is_missing_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(PRESETS, "ghost", "ghost_preset_module")
    with pytest.raises(ConfigError, match="'ghost' preset is not available"):
        build(memory_app(tmp_path / "app"), "ghost")


def test_vendoring_a_package_that_is_not_installed_says_what_to_install(tmp_path: Path) -> None:
    from haze import App

    root = memory_app(tmp_path / "app")
    ctx = BuildContext(app=App(root=root), root=root, out=tmp_path / "dist", preset="aws-lambda")
    with pytest.raises(ConfigError, match="pip install haze-not-installed-xyz"):
        ctx.vendor(["haze_not_installed_xyz"], tmp_path / "dist")


def test_vendor_and_copy_app_skip_caches(tmp_path: Path) -> None:
    from haze import App

    root = memory_app(tmp_path / "app")
    (root / "config" / "__pycache__").mkdir()
    (root / "config" / "__pycache__" / "queue.cpython-311.pyc").write_bytes(b"x")
    (root / "haze.config.py").write_text(
        "from haze import define_haze_config\nconfig = define_haze_config()\n"
    )
    ctx = BuildContext(app=App(root=root), root=root, out=tmp_path / "dist", preset="aws-lambda")
    files = ctx.copy_app(ctx.dest) + ctx.vendor(["haze"], ctx.dest)
    rel = {f.relative_to(ctx.dest).as_posix() for f in files}
    assert {"config/queue.py", "haze.config.py", "haze/__init__.py"} <= rel
    assert not [r for r in rel if "__pycache__" in r or r.endswith(".pyc")]


def test_deterministic_zip(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "b").mkdir(parents=True)
    (src / "b" / "z.py").write_text("z = 1\n")
    (src / "a.py").write_text("a = 1\n")
    first = deterministic_zip(src, tmp_path / "one.zip").read_bytes()
    (src / "a.py").touch()  # a new mtime changes nothing
    assert deterministic_zip(src, tmp_path / "two.zip").read_bytes() == first
    with zipfile.ZipFile(tmp_path / "one.zip") as z:
        assert z.namelist() == ["a.py", "b/z.py"]
        assert {i.date_time for i in z.infolist()} == {(1980, 1, 1, 0, 0, 0)}
        assert z.read("b/z.py") == b"z = 1\n"


def test_merge_wrangler_rules() -> None:
    base = {
        "name": "derived",
        "compatibility_flags": ["python_workers"],
        "queues": {
            "producers": [{"binding": "QUEUE", "queue": "jobs"}],
            "consumers": [{"queue": "jobs", "max_retries": 2, "max_batch_size": 10}],
        },
        "kv_namespaces": [{"binding": "KV"}],
        "routes": ["a.example.com/*"],
    }
    override = {
        "name": "mine",
        "compatibility_flags": ["nodejs_compat", "python_workers"],
        "queues": {
            "producers": [{"binding": "OTHER", "queue": "jobs"}],
            "consumers": [{"queue": "jobs", "max_batch_size": 5}, {"queue": "more"}],
        },
        "kv_namespaces": [{"binding": "KV", "id": "abc"}],
        "routes": ["b.example.com/*"],
    }
    merged = merge_wrangler(base, override)
    assert merged["name"] == "mine"
    assert merged["compatibility_flags"] == ["python_workers", "nodejs_compat"]
    # producers by binding: a second binding to the same queue is a second producer
    assert merged["queues"]["producers"] == [
        {"binding": "QUEUE", "queue": "jobs"},
        {"binding": "OTHER", "queue": "jobs"},
    ]
    # consumers by queue: the app's values win, the derived ones stay
    assert merged["queues"]["consumers"] == [
        {"queue": "jobs", "max_retries": 2, "max_batch_size": 5},
        {"queue": "more"},
    ]
    assert merged["kv_namespaces"] == [{"binding": "KV", "id": "abc"}]
    assert merged["routes"] == ["b.example.com/*"]
    assert base["queues"]["consumers"][0]["max_batch_size"] == 10  # inputs untouched


# --------------------------------------------------------------------------- all or nothing


def _cloudflare_app(root: Path) -> Path:
    memory_app(root)
    (root / "config" / "queue.py").write_text(
        "from haze import define_queue_config\n"
        "config = define_queue_config(default='cloudflare', connections={'cloudflare': "
        "{'driver': 'cloudflare', 'binding': 'QUEUE'}})\n"
    )
    return root


def test_a_build_that_cannot_finish_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    root = _cloudflare_app(tmp_path / "app")
    # haze_cloudflare is not importable: the preset fails after writing entry.py, the
    # app and the vendored haze into its directory
    monkeypatch.setitem(sys.modules, "haze_cloudflare", None)
    out = tmp_path / "dist"
    with pytest.raises(ConfigError, match="haze_cloudflare"):
        build(root, "cloudflare", out)
    assert not out.exists()
    # a previous build is left as it was, not half replaced
    (out / "cloudflare" / "src").mkdir(parents=True)
    (out / "cloudflare" / "src" / "entry.py").write_text("# the previous build\n")
    (out / "wrangler.json").write_text("{}\n")
    with pytest.raises(ConfigError, match="haze_cloudflare"):
        build(root, "cloudflare", out)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "cloudflare",
        "cloudflare/src",
        "cloudflare/src/entry.py",
        "wrangler.json",
    ]
    assert (out / "cloudflare" / "src" / "entry.py").read_text() == "# the previous build\n"


def test_a_finished_build_replaces_the_previous_one(tmp_path: Path) -> None:
    root = _cloudflare_app(tmp_path / "app")
    out = tmp_path / "dist"
    (out / "cloudflare" / "src").mkdir(parents=True)
    (out / "cloudflare" / "stale.txt").write_text("from an older build\n")
    (out / "keep.txt").write_text("not the preset's\n")
    result = build(root, "cloudflare", out)
    assert result.path == out / "cloudflare"
    assert not (out / "cloudflare" / "stale.txt").exists()
    assert (out / "keep.txt").read_text() == "not the preset's\n"
    assert (out / "cloudflare" / "src" / "entry.py").is_file()
    assert all(f.is_file() and out in f.parents for f in result.files)
    assert not [n for n in result.notes if ".haze-build" in n]
    assert sorted(p.name for p in out.iterdir()) == ["cloudflare", "keep.txt", "wrangler.json"]


def test_a_missing_adapter_names_an_install_that_works_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    root = _cloudflare_app(tmp_path / "app")
    monkeypatch.setitem(sys.modules, "haze_cloudflare", None)
    monkeypatch.chdir(tmp_path)  # outside the checkout: its absolute path
    with pytest.raises(ConfigError) as e:
        build(root, "cloudflare", tmp_path / "dist")
    message = str(e.value)
    # haze runs from this repository's workspace: the adapter is its workspace member
    repo = Path(__file__).resolve().parents[2]
    assert f"pip install {repo / 'adapters' / 'cloudflare'}" in message
    assert "uv sync" in message
    assert "pip install haze-cloudflare\n" not in message + "\n"


def test_outside_a_checkout_the_hint_names_the_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import haze._base.hints
    from haze.build import install_hint

    # haze installed from a wheel: its package is in site-packages, no checkout around it
    fake = tmp_path / "lib" / "site-packages" / "haze" / "_base" / "hints.py"
    monkeypatch.setattr(haze._base.hints, "__file__", str(fake))
    assert install_hint(package="haze_cloudflare") == "pip install haze-cloudflare"
    assert install_hint(package="haze_lambda") == "pip install haze-lambda"


def test_a_killed_builds_leftovers_are_cleared_by_the_next(tmp_path: Path) -> None:
    root = _cloudflare_app(tmp_path / "app")
    out = tmp_path / "dist"
    # what a build killed while staging, or between its two renames, leaves behind
    (out / ".haze-build-abc123" / "cloudflare" / "src").mkdir(parents=True)
    (out / ".haze-build-abc123-old-cloudflare").mkdir()
    build(root, "cloudflare", out)
    assert sorted(p.name for p in out.iterdir()) == ["cloudflare", "wrangler.json"]


# --------------------------------------------------------------------------- checked output


def test_a_worker_name_cloudflare_cannot_take_fails_the_build(tmp_path: Path) -> None:
    root = _cloudflare_app(tmp_path / "app")
    (root / "haze.config.py").write_text(
        "from haze import define_haze_config\n"
        "config = define_haze_config(cloudflare={'wrangler': {'name': 'jobs-\\U0001f680'}})\n"
    )
    out = tmp_path / "dist"
    with pytest.raises(ConfigError, match="worker name") as info:
        build(root, "cloudflare", out)
    assert "\n" not in str(info.value)
    assert not out.exists()


def test_every_generated_file_is_checked_before_the_build_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from haze.build import cloudflare

    root = _cloudflare_app(tmp_path / "app")
    # A generator that writes a file its tools cannot read (as a surrogate escape in a
    # TOML string did): the build fails naming it, and writes nothing.
    monkeypatch.setattr(cloudflare, "pyproject_source", lambda *a: 'name = "\\ud83d"\n')
    out = tmp_path / "dist"
    with pytest.raises(ConfigError, match=r"pyproject\.toml") as info:
        build(root, "cloudflare", out)
    assert "\n" not in str(info.value)
    assert not out.exists()


def test_next_step_commands_are_shell_quoted(tmp_path: Path) -> None:
    import shlex

    root = _cloudflare_app(tmp_path / "app")
    out = tmp_path / "my dist; echo oops"
    result = build(root, "cloudflare", out)
    deploy = next(n for n in result.notes if n.startswith("deploy: "))
    assert shlex.split(deploy.removeprefix("deploy: ")) == [
        "npx",
        "wrangler",
        "deploy",
        "-c",
        str(out / "wrangler.json"),
    ]
    pywrangler = next(n for n in result.notes if n.startswith("or with pywrangler: "))
    assert shlex.split(pywrangler)[4] == str(out / "cloudflare")


def _tree(root: Path) -> list[str]:
    """The files and folders under ``root``, but Python's bytecode: loading the app's
    config may write it (where PYTHONDONTWRITEBYTECODE is not set) and is no build output."""
    return sorted(
        p.relative_to(root).as_posix() for p in root.rglob("*") if "__pycache__" not in p.parts
    )


@pytest.mark.parametrize("inside", ["app/out", "config/dist", "database/x", "."])
def test_an_output_folder_inside_the_app_sources_is_refused(tmp_path: Path, inside: str) -> None:
    root = _cloudflare_app(tmp_path / "app")
    (root / "app").mkdir(exist_ok=True)
    (root / "database").mkdir(exist_ok=True)
    before = _tree(root)
    with pytest.raises(ConfigError, match="inside the app's sources") as info:
        build(root, "cloudflare", root / inside)
    assert "\n" not in str(info.value)
    assert _tree(root) == before


@pytest.mark.parametrize("app_at", ["cloudflare", "cloudflare/my app"])
def test_an_output_folder_whose_build_folder_holds_the_app_is_refused(
    tmp_path: Path, app_at: str
) -> None:
    # The build replaces <out>/cloudflare whole: with the app inside it, that deleted the app.
    root = _cloudflare_app(tmp_path / app_at)
    (root / "notes.txt").write_text("mine")
    before = _tree(root)
    with pytest.raises(ConfigError, match="which holds the app") as info:
        build(root, "cloudflare", tmp_path)
    assert "\n" not in str(info.value)
    assert _tree(root) == before
    assert not list(tmp_path.glob(".haze-build-*"))
