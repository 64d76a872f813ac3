"""``haze build --preset cloudflare`` binds the R2 bucket a connection offloads to
(``"offload": {"to": "r2://BINDING/prefix"}``) in ``dist/wrangler.json``, and refuses a
binding name wrangler would not take, in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from haze.build import build
from haze.cli import get_cli
from haze.errors import ConfigError

QUEUE_PY = """\
from haze import define_queue_config

config = define_queue_config(
    default="cloudflare",
    connections={{
        "cloudflare": {{"driver": "cloudflare", "binding": "QUEUE", "offload": {{"to": {to!r}}}}},
        "edge": {{"driver": "cloudflare", "binding": "EDGE", "offload": {{"to": {other!r}}}}},
    }},
)
"""


def write_app(root: Path, to: str, other: str) -> Path:
    (root / "config").mkdir(parents=True)
    (root / "config" / "queue.py").write_text(QUEUE_PY.format(to=to, other=other))
    (root / "app" / "job").mkdir(parents=True)
    (root / "app" / "__init__.py").write_text("")
    (root / "app" / "job" / "__init__.py").write_text("")
    return root


def test_the_offload_bucket_is_bound_in_wrangler_json(tmp_path: Path) -> None:
    root = write_app(
        tmp_path / "app", "r2://HAZE_PAYLOADS/jobs", "r2://ARCHIVE/x?bucket=my-archive"
    )
    build(root, "cloudflare", tmp_path / "dist")
    wrangler = json.loads((tmp_path / "dist" / "wrangler.json").read_text())
    assert wrangler["r2_buckets"] == [
        {"binding": "HAZE_PAYLOADS", "bucket_name": "haze-payloads"},
        {"binding": "ARCHIVE", "bucket_name": "my-archive"},
    ]


def test_no_r2_buckets_without_an_r2_offload(tmp_path: Path) -> None:
    root = write_app(tmp_path / "app", "s3://b/p", "file:///var/haze")
    build(root, "cloudflare", tmp_path / "dist")
    assert "r2_buckets" not in json.loads((tmp_path / "dist" / "wrangler.json").read_text())


@pytest.mark.parametrize("name", ["my-bucket", "9LIVES"])
def test_a_binding_name_that_is_no_identifier_is_refused_in_one_line(
    tmp_path: Path, name: str
) -> None:
    root = write_app(tmp_path / "app", f"r2://{name}/jobs", "r2://OK/x")
    with pytest.raises(ConfigError, match="not an R2 binding name"):
        build(root, "cloudflare", tmp_path / "dist")
    assert not (tmp_path / "dist" / "wrangler.json").exists()
    result = CliRunner().invoke(get_cli(), ["--root", str(root), "build", "--preset", "cloudflare"])
    assert result.exit_code == 1
    (line,) = [x for x in result.output.splitlines() if x.strip()]
    assert f"{name!r} is not an R2 binding name" in line
