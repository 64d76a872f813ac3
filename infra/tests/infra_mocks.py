"""Pulumi mocks for the infra tests: run a program, record every resource it registers.

No Pulumi CLI, no cloud: ``pulumi.runtime.set_mocks`` replaces the engine and the
providers with :class:`RecordingMocks`, which answers each registration with plausible
outputs (ARNs, URLs, ids) and keeps the inputs for the assertions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pulumi

ACCOUNT = "123456789012"
REGION = "eu-west-1"


@dataclass
class Recorded:
    typ: str
    name: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    custom: bool
    urn: str = ""

    @property
    def parent(self) -> str | None:
        """The type of the component this resource is a child of (from the URN)."""
        chain = self.urn.split("::")[2].split("$") if self.urn else []
        return chain[-2] if len(chain) > 1 else None


class RecordingMocks(pulumi.runtime.Mocks):
    """Mocks that answer like AWS and Cloudflare would, and record everything."""

    def __init__(self) -> None:
        self.resources: list[Recorded] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        inputs = dict(args.inputs)
        out: dict[str, Any] = dict(inputs)
        typ, name = args.typ, args.name
        rid = f"{name}-id"
        if typ == "aws:sqs/queue:Queue":
            qname = inputs.get("name") or f"{name}-gen"
            out.update(
                name=qname,
                arn=f"arn:aws:sqs:{REGION}:{ACCOUNT}:{qname}",
                url=f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{qname}",
            )
            rid = out["url"]
        elif typ == "aws:cloudwatch/logGroup:LogGroup":
            lname = inputs.get("name") or f"{inputs.get('namePrefix', '/')}0001"
            out.update(name=lname, arn=f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{lname}")
            rid = lname
        elif typ == "aws:iam/role:Role":
            out.update(name=f"{name}-1", arn=f"arn:aws:iam::{ACCOUNT}:role/{name}-1")
            rid = f"{name}-1"
        elif typ == "aws:lambda/function:Function":
            fname = f"{name}-1"
            out.update(name=fname, arn=f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{fname}")
            rid = fname
        elif typ == "aws:cloudwatch/eventRule:EventRule":
            out.update(name=f"{name}-1", arn=f"arn:aws:events:{REGION}:{ACCOUNT}:rule/{name}-1")
        elif typ.startswith("aws:ecs/"):
            out.update(name=f"{name}-1", arn=f"arn:aws:ecs:{REGION}:{ACCOUNT}:{name}-1")
        elif typ == "cloudflare:index/queue:Queue":
            out.update(queueId=f"q-{inputs['queueName']}")
            rid = out["queueId"]
        elif typ == "cloudflare:index/d1Database:D1Database":
            out.update(uuid=f"d1-{inputs['name']}")
            rid = out["uuid"]
        elif typ == "cloudflare:index/workersKvNamespace:WorkersKvNamespace":
            rid = f"kv-{inputs['title']}"
        self.resources.append(Recorded(typ, name, inputs, out, bool(args.custom)))
        return rid, out

    def call(self, args: pulumi.runtime.MockCallArgs) -> Any:
        if args.token == "aws:index/getRegion:getRegion":
            return {"region": REGION, "name": REGION, "id": REGION}
        return {}

    # -- queries --------------------------------------------------------------------

    def of(self, typ: str) -> list[Recorded]:
        return [r for r in self.resources if r.typ == typ]

    def one(self, typ: str, name: str | None = None) -> Recorded:
        found = [r for r in self.of(typ) if name is None or r.name == name]
        assert len(found) == 1, (typ, name, [r.name for r in self.of(typ)])
        return found[0]

    def types(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.resources:
            counts[r.typ] = counts.get(r.typ, 0) + 1
        return counts


def _ensure_event_loop() -> None:
    """Pulumi's mocks use ``asyncio.get_event_loop()``; pytest-asyncio tests that ran
    earlier in the session leave the main thread without a loop, so make one."""
    import asyncio

    try:
        closed = asyncio.get_event_loop_policy().get_event_loop().is_closed()
    except RuntimeError:
        closed = True
    if closed:
        asyncio.set_event_loop(asyncio.new_event_loop())


def deploy(program: Callable[[], Any], project: str = "haze-infra-test") -> RecordingMocks:
    """Run ``program`` as a Pulumi program against fresh mocks and wait for everything."""
    mocks = RecordingMocks()
    _ensure_event_loop()
    pulumi.runtime.set_mocks(mocks, project=project, stack="test", preview=False)
    monitor = pulumi.runtime.settings.SETTINGS.monitor

    @pulumi.runtime.test
    def run() -> Any:
        return program()

    run()
    urns = {
        (u.split("::")[2].split("$")[-1], u.rsplit("::", 1)[-1]): u
        for u in (reg.urn for reg in monitor.resources.values())
    }
    for r in mocks.resources:
        r.urn = urns.get((r.typ, r.name), "")
    return mocks


def policy_of(mocks: RecordingMocks, role_policy_name: str) -> dict[str, Any]:
    doc = mocks.one("aws:iam/rolePolicy:RolePolicy", role_policy_name).inputs["policy"]
    return json.loads(doc) if isinstance(doc, str) else doc
