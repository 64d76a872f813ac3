"""``config/schedule.py`` on AWS under Pulumi's mocks: one EventBridge rule per distinct
``cron(...)`` expression, targeting a Lambda on ``handler.schedule`` with the input the
handler reads, allowed to send to the app's queues and nothing else; and a schedule no
rule can express stopping ``stack_config`` with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from infra_apps import isolated_stack_config, require_pulumi, write_app

require_pulumi()

from haze._base.errors import ScheduleError  # noqa: E402
from haze_infra.aws import SEND_SQS_ACTIONS, HazeAwsApp  # noqa: E402
from infra_mocks import RecordingMocks, deploy, policy_of  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*deprecated:DeprecationWarning")

RULE = "aws:cloudwatch/eventRule:EventRule"
TARGET = "aws:cloudwatch/eventTarget:EventTarget"
PERMISSION = "aws:lambda/permission:Permission"
FUNCTION = "aws:lambda/function:Function"

SCHED_APP = {
    "config/queue.py": """
        from haze import define_queue_config

        config = define_queue_config(default="sqs", connections={
            "sqs": {"driver": "sqs", "region": "eu-west-1", "concurrency": 1,
                    "queue_url": "https://sqs.eu-west-1.amazonaws.com/1/infs-{queue}"},
        })
    """,
    "app/__init__.py": "",
    "app/job/__init__.py": "",
    "app/job/infs_jobs.py": """
        from haze import define_job


        @define_job(tries=2, timeout="10s")
        async def infs_report(payload):
            pass
    """,
    "config/schedule.py": """
        from haze import schedule

        from app.job.infs_jobs import infs_report

        schedule(infs_report.with_({"k": "paris"}), cron="30 9 * * 1-5", tz="Europe/Paris",
                 name="paris")
        schedule(infs_report.with_({"k": "hourly"}), cron="30 * * * *", name="hourly")
        schedule(infs_report, every="15m", name="quarter")
    """,
}


@pytest.fixture(scope="module")
def sched_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_app(tmp_path_factory.mktemp("infs_app"), SCHED_APP)
    built = subprocess.run(
        [sys.executable, "-m", "haze.cli", "--root", str(root), "build", "--preset", "aws-lambda"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
        env={k: v for k, v in os.environ.items() if k != "HAZE_APP_ROOT"},
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return root


@pytest.fixture(scope="module")
def deployed(sched_root: Path) -> tuple[Any, RecordingMocks]:
    stack = isolated_stack_config(sched_root)
    return stack, deploy(lambda: HazeAwsApp("infs", stack=stack))


def test_stack_config_lists_the_rules(deployed: tuple[Any, RecordingMocks]) -> None:
    stack, _ = deployed
    assert stack.schedules == {
        "cron(30 * * * ? *)": ("paris", "hourly"),
        "cron(0/15 * * * ? *)": ("quarter",),
    }


def test_one_rule_per_expression_targeting_the_schedule_handler(
    deployed: tuple[Any, RecordingMocks],
) -> None:
    _, mocks = deployed
    rules = {r.name: r for r in mocks.resources if r.typ == RULE}
    assert sorted(r.inputs["scheduleExpression"] for r in rules.values()) == [
        "cron(0/15 * * * ? *)",
        "cron(30 * * * ? *)",
    ]
    for r in rules.values():
        assert r.parent == "haze:aws:HazeScheduleRules"
    fn = mocks.one(FUNCTION, "infs-schedules")
    assert fn.inputs["handler"] == "handler.schedule"
    targets = [r for r in mocks.resources if r.typ == TARGET]
    assert len(targets) == 2
    for t in targets:
        rule = rules[t.name.removesuffix("-target")]
        assert t.inputs["rule"] == rule.outputs["name"]
        assert t.inputs["arn"] == fn.outputs["arn"]
        transformer = t.inputs["inputTransformer"]
        assert transformer["inputPaths"] == {"time": "$.time"}
        # What EventBridge sends once <time> is filled in is what schedule_handler reads.
        sent = json.loads(transformer["inputTemplate"].replace("<time>", '"2026-07-01T07:30:00Z"'))
        assert sent == {
            "haze_schedule": rule.inputs["scheduleExpression"],
            "time": "2026-07-01T07:30:00Z",
        }
    permissions = [r for r in mocks.resources if r.typ == PERMISSION]
    assert sorted(p.inputs["sourceArn"] for p in permissions) == sorted(
        r.outputs["arn"] for r in rules.values()
    )
    assert all(p.inputs["principal"] == "events.amazonaws.com" for p in permissions)


def test_the_dispatcher_may_send_to_the_app_queues_only(
    deployed: tuple[Any, RecordingMocks],
) -> None:
    _, mocks = deployed
    queue_arns = {r.outputs["arn"] for r in mocks.resources if r.typ == "aws:sqs/queue:Queue"}
    statements = policy_of(mocks, "infs-schedules-policy")["Statement"]
    send = [s for s in statements if s["Sid"] == "SendToHazeQueues"]
    assert send[0]["Action"] == list(SEND_SQS_ACTIONS)
    main_queues = {a for a in queue_arns if not a.endswith("-dlq")}
    assert set(send[0]["Resource"]) <= queue_arns
    assert main_queues <= set(send[0]["Resource"])
    others = {a for s in statements if s["Sid"] != "SendToHazeQueues" for a in s["Action"]}
    assert others <= {"logs:CreateLogStream", "logs:PutLogEvents"}


def test_a_schedule_no_rule_can_express_is_one_line(tmp_path: Path) -> None:
    # Its own job name: job names are process-wide.
    app = {k: v.replace("infs_report", "infs_odd") for k, v in SCHED_APP.items()}
    app["config/schedule.py"] = """
        from haze import schedule

        from app.job.infs_jobs import infs_odd

        schedule(infs_odd, cron="0 9 1 * MON", name="odd")
    """
    root = write_app(tmp_path / "odd", app)
    with pytest.raises(ScheduleError) as e:
        isolated_stack_config(root)
    assert str(e.value).startswith('schedule "odd" (')
    assert "both a day of the month and a day of the week" in str(e.value)


def test_the_cloudflare_worker_gets_the_builds_cron_triggers(
    inf_root: Path, tmp_path: Path
) -> None:
    """HazeCloudflareWorker reads triggers.crons of the build's wrangler.json (the
    cloudflare preset writes one per distinct cron of config/schedule.py)."""
    import shutil

    from haze_infra.cloudflare import HazeCloudflareWorker

    dist = tmp_path / "dist"
    shutil.copytree(inf_root / "dist" / "cloudflare", dist / "cloudflare")
    wrangler = json.loads((inf_root / "dist" / "wrangler.json").read_text())
    wrangler["triggers"] = {"crons": ["30 * * * *", "*/15 * * * *"]}
    (dist / "wrangler.json").write_text(json.dumps(wrangler))

    def program() -> None:
        HazeCloudflareWorker(
            "infs-w", account_id="acc", script_name="infs-w", dist_dir=dist / "cloudflare"
        )

    mocks = deploy(program)
    (trigger,) = [
        r
        for r in mocks.resources
        if r.typ == "cloudflare:index/workersCronTrigger:WorkersCronTrigger"
    ]
    assert trigger.inputs["scriptName"] == "infs-w"
    assert trigger.inputs["schedules"] == [{"cron": "30 * * * *"}, {"cron": "*/15 * * * *"}]
    assert trigger.parent == "haze:cloudflare:HazeCloudflareWorker"
    # without schedules, no trigger resource
    (dist / "wrangler.json").write_text(json.dumps({**wrangler, "triggers": {}}))
    mocks = deploy(program)
    assert not [r for r in mocks.resources if r.typ.endswith("WorkersCronTrigger")]
