"""``haze_infra.config`` (no Pulumi) and ``haze infra:config``: what a stack derives from
the app's config/queue.py and its jobs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from haze import App, define_haze_config, define_job, define_queue_config
from haze.build.cloudflare_plan import connection_jobs, connection_max_tries
from haze.cli import get_cli
from haze_infra.config import (
    InfraConfigError,
    StackConfig,
    cloudflare_max_retries,
    container_stop_timeout,
    drain_margin,
    lambda_timeout,
    max_receive_count,
    min_lambda_timeout,
    min_visibility_timeout,
    stack_config,
)
from infra_apps import EXPECTED_JOB_TIMEOUT, EXPECTED_TRIES, isolated_stack_config, write_app

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@define_job(name="inf_cfg_sqs_job", tries=3, timeout="2m", connection="q", queue="bulk")
async def inf_cfg_sqs_job(payload: Any) -> None:
    pass


@define_job(name="inf_cfg_forever", tries=2, retry_until="1h")
async def inf_cfg_forever(payload: Any) -> None:
    pass


@define_job(name="inf_cfg_lost", connection="nowhere")
async def inf_cfg_lost(payload: Any) -> None:
    pass


# --------------------------------------------------------------------------- the rules


def test_the_rules() -> None:
    assert max_receive_count(1) == 3
    assert max_receive_count(4) == 6
    assert max_receive_count(None) == 1000
    assert max_receive_count(5000) == 1000
    # FIFO: a record is received (and held) once per try of each of the up to 9 records
    # ahead of it in its batch, before its own tries
    assert max_receive_count(1, fifo=True) == 12
    assert max_receive_count(3, fifo=True) == 32
    assert max_receive_count(200, fifo=True) == 1000
    assert min_lambda_timeout(40) == 45
    assert min_lambda_timeout(40, batch_size=10, concurrency=5) == 85  # two waves
    assert lambda_timeout(40) == 50
    assert lambda_timeout(None) == 60
    assert min_visibility_timeout(50) == 300
    assert min_visibility_timeout(50, batching_window=20) == 320
    assert cloudflare_max_retries(1) == 0
    assert cloudflare_max_retries(6) == 5
    assert cloudflare_max_retries(None) == 100
    assert container_stop_timeout(30) == 35
    assert drain_margin(None) == 35
    assert drain_margin(1) == 10


# --------------------------------------------------------------------------- the test app


def test_per_connection_values(inf_stack: StackConfig) -> None:
    c = inf_stack.connections
    for name, tries in EXPECTED_TRIES.items():
        assert c[name].max_tries == tries, name
        assert c[name].max_job_timeout == EXPECTED_JOB_TIMEOUT[name], name
    # an unpinned job counts everywhere; a pinned one only on its connection
    assert c["sqs"].jobs == ("inf_anywhere", "inf_sqs_heavy")
    assert c["edge"].jobs == ("inf_anywhere", "inf_edge_job")
    assert c["memory"].jobs == ("inf_anywhere",)
    assert c["memory"].max_tries == 2
    assert c["sqs"].queues == ("high", "default")
    assert inf_stack.default_connection == "sqs"
    assert c["sqs"].default


def test_sqs_plan(inf_stack: StackConfig) -> None:
    sqs = inf_stack.connections["sqs"].aws
    assert sqs is not None
    assert sqs.queue_url is None  # INF_SQS_URL is unset: the stack provides it
    assert sqs.queue_url_env == "INF_SQS_URL"
    assert sqs.queue_names == {"high": None, "default": None}
    assert sqs.max_receive_count == 4 + 2
    assert sqs.batch_size == 2
    assert sqs.function_timeout == 50
    assert sqs.min_function_timeout == 45
    assert sqs.visibility_timeout == 300
    assert not sqs.fifo


def test_cloudflare_plan_reads_haze_config(inf_stack: StackConfig) -> None:
    cf = inf_stack.connections["edge"].cloudflare
    assert cf is not None
    assert cf.binding == "JOBS"
    assert cf.queue_name == "inf-jobs"
    assert cf.dead_letter_queue == "inf-jobs-dead"
    assert (cf.max_retries, cf.min_max_retries) == (5, 5)
    assert (cf.max_batch_size, cf.max_batch_timeout) == (25, 2.0)
    assert [d.binding for d in inf_stack.d1] == ["DB"]
    assert inf_stack.d1[0].connection == "edge"
    assert [k.binding for k in inf_stack.kv] == ["CACHE"]


def test_worker_plan_and_warnings(inf_stack: StackConfig) -> None:
    worker = inf_stack.connections["database"].worker
    assert worker is not None
    assert worker.queues == ("default",)
    assert worker.stop_timeout == 305
    assert worker.drain_margin == 305
    assert worker.drain_function_timeout == 355
    assert inf_stack.warnings == ()


def test_env_reads_names_only(inf_stack: StackConfig) -> None:
    reads = {r.name: r for r in inf_stack.env}
    assert set(reads) == {"INF_SQS_URL", "INF_QUEUE_CONNECTION"}  # not haze's fallbacks
    assert reads["INF_SQS_URL"].set is False
    assert reads["INF_QUEUE_CONNECTION"].default == "sqs"
    assert "value" not in json.dumps(inf_stack.to_dict()["env"])


def test_queue_names_from_a_configured_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = "https://sqs.eu-west-1.amazonaws.com/111122223333/shop-{queue}.fifo"

    def plan(queue_url: str) -> Any:
        app = App(
            queue=define_queue_config(
                default="q",
                connections={"q": {"driver": "sqs", "queue_url": queue_url, "queues": ["high"]}},
            )
        )
        return stack_config(app, jobs=[inf_cfg_sqs_job]).connections["q"]

    templated = plan(url).aws
    assert templated.fifo
    assert templated.queue_names == {
        "high": "shop-high.fifo",
        "default": "shop-default.fifo",
        "bulk": "shop-bulk.fifo",
    }
    assert templated.queue_url_env is None
    siblings = plan("https://sqs.eu-west-1.amazonaws.com/111122223333/shop-main").aws
    assert siblings.queue_names == {"high": "high", "default": "shop-main", "bulk": "bulk"}
    c = plan(url)
    assert c.max_tries == 3
    assert c.aws.function_timeout == 130
    assert c.aws.visibility_timeout == 780
    assert c.aws.max_receive_count == 3 * 10 + 2  # FIFO: held behind a batch's retries
    assert siblings.max_receive_count == 3 + 2


def test_unbounded_tries_and_unknown_connections() -> None:
    app = App(
        queue=define_queue_config(
            default="edge",
            connections={
                "edge": {"driver": "cloudflare"},
                "q": {"driver": "sqs", "queue_url": "https://sqs.eu-west-1.amazonaws.com/1/x"},
            },
        )
    )
    stack = stack_config(app, jobs=[inf_cfg_forever, inf_cfg_lost, inf_cfg_sqs_job])
    assert stack.connections["edge"].max_tries is None
    assert stack.connections["edge"].cloudflare.max_retries == 100
    assert stack.connections["q"].aws.max_receive_count == 1000
    assert any("pinned to connection 'nowhere'" in w for w in stack.warnings)
    with pytest.raises(InfraConfigError, match="no connection 'x'"):
        stack.connection("x")


@pytest.fixture(scope="module")
def wrong_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A haze.config.py asking Cloudflare for fewer retries than a job's tries need."""
    return write_app(
        tmp_path_factory.mktemp("inf_wrong"),
        {
            "config/queue.py": """
            from haze import define_queue_config
            config = define_queue_config(default="cf", connections={
                "cf": {"driver": "cloudflare", "binding": "QUEUE"}})
        """,
            "haze.config.py": """
            from haze import define_haze_config
            config = define_haze_config(cloudflare={"wrangler": {"queues": {
                "producers": [{"binding": "QUEUE", "queue": "inf-wrong"}],
                "consumers": [{"queue": "inf-wrong", "max_retries": 1}]}}})
        """,
            "app/job/inf_wrong_jobs.py": """
            from haze import define_job

            @define_job(tries=5, timeout="1h")
            async def inf_wrong_job(payload):
                pass
        """,
        },
    )


def test_a_wrong_haze_config_is_reported(wrong_root: Path) -> None:
    stack = isolated_stack_config(wrong_root)
    cf = stack.connections["cf"].cloudflare
    assert cf is not None
    assert (cf.max_retries, cf.min_max_retries) == (1, 4)
    assert any("max_retries=1" in w and "needs >= 4" in w for w in stack.warnings)
    assert any("15 minutes of wall time" in w for w in stack.warnings)
    assert define_haze_config  # the helper the wrong app uses


# --------------------------------------------------------------------------- the command


def test_the_command_prints_json(inf_root: Path, inf_stack: StackConfig) -> None:
    result = CliRunner().invoke(
        get_cli(), ["--root", str(inf_root), "infra:config", "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data == json.loads(json.dumps(inf_stack.to_dict()))
    assert data["connections"]["sqs"]["aws"]["max_receive_count"] == 6
    assert data["connections"]["edge"]["cloudflare"]["max_retries"] == 5


def test_the_command_prints_text_and_filters(inf_root: Path) -> None:
    result = CliRunner().invoke(
        get_cli(), ["--root", str(inf_root), "infra:config", "--connection", "sqs"]
    )
    assert result.exit_code == 0, result.output
    assert "connection sqs (sqs) [default]" in result.output
    assert "redrive maxReceiveCount 6; visibility 300s" in result.output
    assert "lambda timeout 50s (>= 45s)" in result.output
    assert "connection edge (cloudflare)" not in result.output
    result = CliRunner().invoke(
        get_cli(), ["--root", str(inf_root), "infra:config", "--connection", "nope"]
    )
    assert result.exit_code == 1
    assert "no connection 'nope'" in result.output


def test_the_command_imports_no_pulumi(inf_root: Path) -> None:
    code = (
        "import sys\nfrom click.testing import CliRunner\nfrom haze.cli import get_cli\n"
        f"r = CliRunner().invoke(get_cli(), ['--root', {str(inf_root)!r}, 'infra:config'])\n"
        "assert r.exit_code == 0, r.output\n"
        "assert not [m for m in sys.modules if m.startswith('pulumi')], 'pulumi imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_example_app() -> None:
    """``haze infra:config`` on examples/ (its own process: the example app's job package
    is ``app``, which this session's test app already holds)."""
    haze = Path(sys.executable).with_name("haze")
    out = subprocess.run(
        [str(haze), "--root", str(EXAMPLES), "infra:config", "--format", "json"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    data = json.loads(out.stdout)
    db = data["connections"]["database"]
    assert db["max_tries"] == 3  # publish_post
    assert db["queues"] == ["high", "default"]
    assert "charge_card" in db["jobs"]


def test_installing_haze_infra_does_not_install_pulumi() -> None:
    """``haze infra:config`` needs only haze-infra itself: Pulumi (hundreds of MB) comes
    with the extras the components need."""
    from importlib import metadata

    plain = [r for r in metadata.requires("haze-infra") or [] if "extra ==" not in r]
    assert not [r for r in plain if r.lower().startswith("pulumi")], plain
    extras = set(metadata.metadata("haze-infra").get_all("Provides-Extra") or [])
    assert {"aws", "cloudflare"} <= extras


# A stand-in for an environment without Pulumi: every ``pulumi*`` import fails as it
# would if the packages were not installed (they are, in this workspace).
_NO_PULUMI = (
    "import sys\n"
    "class _NoPulumi:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in ('pulumi', 'pulumi_aws', 'pulumi_cloudflare'):\n"
    "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
    "sys.meta_path.insert(0, _NoPulumi())\n"
)


def test_infra_config_prints_the_plan_without_pulumi(inf_root: Path) -> None:
    code = _NO_PULUMI + (
        "from click.testing import CliRunner\nfrom haze.cli import get_cli\n"
        f"r = CliRunner().invoke(get_cli(), ['--root', {str(inf_root)!r}, 'infra:config'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print(r.output)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=120, capture_output=True, text=True
    )
    assert "connection" in out.stdout


def test_a_component_without_pulumi_names_the_extra() -> None:
    code = _NO_PULUMI + (
        "import haze_infra\n"
        "for name, extra in (('HazeAwsApp', 'aws'), ('HazeCloudflareApp', 'cloudflare')):\n"
        "    try:\n"
        "        getattr(haze_infra, name)\n"
        "    except haze_infra.InfraConfigError as e:\n"
        '        assert f"haze-infra[{extra}]" in str(e), str(e)\n'
        "        print(e)\n"
        "    else:\n"
        "        raise AssertionError(name)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=120, capture_output=True, text=True
    )
    assert out.stdout.count("Pulumi") == 2, out.stdout


@define_job(name="inf_cfg_routed.mail", tries=4)
async def inf_cfg_routed(payload: Any) -> None:
    pass


def test_a_routed_job_counts_where_its_route_sends_it_and_its_queue_is_made() -> None:
    """``routes`` send the job to connection "q" and queue "mail": the stack makes an SQS
    queue (and the Lambda's event source) for "mail" there, counts its tries there only,
    and the other sqs connection neither gets the queue nor counts the job."""
    app = App(
        queue=define_queue_config(
            default="other",
            connections={
                "q": {"driver": "sqs", "queue_url": "https://sqs.eu-west-1.amazonaws.com/1/x"},
                "other": {"driver": "sqs", "queue_url": "https://sqs.eu-west-1.amazonaws.com/1/y"},
            },
            routes={"inf_cfg_routed.*": {"queue": "mail", "connection": "q"}},
        )
    )
    c = stack_config(app, jobs=[inf_cfg_routed]).connections
    assert c["q"].queues == ("default", "mail")
    assert "mail" in c["q"].aws.queue_names
    assert c["q"].jobs == ("inf_cfg_routed.mail",) and c["q"].max_tries == 4
    assert c["other"].queues == ("default",) and c["other"].jobs == ()
    # `haze build` derives the same counts from the same app (one rule, not two)
    routes = app.queue_config.routes
    for name in ("q", "other"):
        jobs = [inf_cfg_routed]
        assert connection_max_tries(jobs, name, routes) == c[name].max_tries
        assert [j.name for j in connection_jobs(jobs, name, routes)] == list(c[name].jobs)
