"""Pulumi components for haze on Cloudflare (pulumi-cloudflare 6).

- :class:`HazeCloudflareQueue`: a Queue and its dead-letter Queue.
- :class:`HazeCloudflareWorker`: the Python Worker of ``dist/cloudflare`` (``haze build
  --preset cloudflare``), its producer bindings, one consumer per queue (``max_batch_size``,
  ``max_retries``, ``dead_letter_queue``), and the D1 databases and KV namespaces it binds.
- :class:`HazeCloudflareApp`: both, for a :class:`~haze_infra.config.StackConfig`.

Cloudflare counts *retries*, haze counts *tries*: a consumer's ``max_retries`` is
``tries - 1`` (see :func:`haze_infra.config.cloudflare_max_retries`), and a smaller one
raises :class:`~haze_infra.config.InfraConfigError`.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi

with warnings.catch_warnings():  # the package warns about its deprecated resources on import
    warnings.simplefilter("ignore", DeprecationWarning)
    import pulumi_cloudflare as cloudflare

from haze_infra.config import (
    CF_DEFAULT_BATCH_SIZE,
    CF_DEFAULT_BATCH_TIMEOUT,
    CF_MAX_BATCH_SIZE,
    CF_MAX_BATCH_TIMEOUT,
    CF_MAX_RETRIES,
    ConnectionPlan,
    StackConfig,
    cloudflare_max_retries,
)
from haze_infra.rules import (
    InfraConfigError,
)

__all__ = [
    "DEFAULT_COMPATIBILITY_DATE",
    "ConsumerSettings",
    "HazeCloudflareApp",
    "HazeCloudflareQueue",
    "HazeCloudflareWorker",
    "QueueBinding",
    "worker_modules",
]

#: Used when ``dist/wrangler.json`` does not name one.
DEFAULT_COMPATIBILITY_DATE = "2025-11-01"
_QUEUE_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_CONTENT_TYPES = {".py": "text/x-python", ".wasm": "application/wasm"}


def _check(ok: bool, message: str, key: str) -> None:
    if not ok:
        raise InfraConfigError(message, source="haze_infra.cloudflare", key=key)


def _child(
    parent: pulumi.Resource, depends_on: Sequence[pulumi.Resource] | None = None
) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions(parent=parent, depends_on=list(depends_on or []))


class HazeCloudflareQueue(pulumi.ComponentResource):
    """A Cloudflare Queue (one haze ``cloudflare`` connection) and its dead-letter queue
    (``<queue_name>-dlq`` unless ``dead_letter_queue_name`` is given; ``dead_letter=False``
    for none)."""

    queue: cloudflare.Queue
    dlq: cloudflare.Queue | None

    def __init__(
        self,
        name: str,
        *,
        account_id: pulumi.Input[str],
        queue_name: str,
        dead_letter: bool = True,
        dead_letter_queue_name: str | None = None,
        message_retention_period: int | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("haze:cloudflare:HazeCloudflareQueue", name, None, opts)
        dlq_name = (dead_letter_queue_name or f"{queue_name}-dlq") if dead_letter else None
        for key, value in (("queue_name", queue_name), ("dead_letter_queue_name", dlq_name)):
            if value is not None:
                _check(
                    bool(_QUEUE_NAME.match(value)),
                    f"{value!r} is not a valid queue name "
                    "(lowercase letters, digits and -, at most 63)",
                    f"{name}.{key}",
                )
        self.queue_name = queue_name
        self.dlq_name = dlq_name
        settings: Any = (
            {"message_retention_period": message_retention_period}
            if message_retention_period is not None
            else None
        )
        self.queue = cloudflare.Queue(
            name, account_id=account_id, queue_name=queue_name, settings=settings, opts=_child(self)
        )
        self.dlq = None
        if dlq_name is not None:
            self.dlq = cloudflare.Queue(
                f"{name}-dlq",
                account_id=account_id,
                queue_name=dlq_name,
                settings=settings,
                opts=_child(self),
            )
        self.register_outputs(
            {
                "queue_id": self.queue.queue_id,
                "queue_name": queue_name,
                "dead_letter_queue": dlq_name,
            }
        )


@dataclass(frozen=True)
class ConsumerSettings:
    """The Worker's consumer of one queue. ``max_retries`` None: ``max_tries - 1``."""

    max_tries: int | None = 1
    max_retries: int | None = None
    max_batch_size: int = CF_DEFAULT_BATCH_SIZE
    max_batch_timeout: float = CF_DEFAULT_BATCH_TIMEOUT
    max_concurrency: int | None = None
    retry_delay: int | None = None

    def retries(self) -> int:
        return (
            cloudflare_max_retries(self.max_tries)
            if self.max_retries is None
            else (self.max_retries)
        )


@dataclass(frozen=True)
class QueueBinding:
    """A queue the Worker produces to (``binding``) and, with ``consumer``, consumes."""

    binding: str
    queue: HazeCloudflareQueue
    consumer: ConsumerSettings | None = ConsumerSettings()


def _content_type(path: Path) -> str:
    return _CONTENT_TYPES.get(
        path.suffix,
        "text/plain"
        if path.suffix in (".txt", ".json", ".sql", ".toml", ".cfg", ".lua")
        else "application/octet-stream",
    )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def worker_modules(dist_dir: str | Path) -> tuple[Path, dict[str, Path]]:
    """The main module (``src/entry.py``) and the other modules of a ``dist/cloudflare``
    directory, by upload name: the files under ``src/`` by their path there, and
    vendored packages under ``python_modules/`` by ``python_modules/<path>``."""
    base = Path(dist_dir)
    main = base / "src" / "entry.py"
    if not main.is_file():
        raise InfraConfigError(
            f"no Worker entry point at {main}; run `haze build --preset cloudflare` in the "
            "app first, or pass dist_dir="
        )
    files: dict[str, Path] = {}
    for folder, prefix in ((base / "src", ""), (base / "python_modules", "python_modules/")):
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            part = prefix + path.relative_to(folder).as_posix()
            if part != "entry.py":
                files[part] = path
    return main, files


def _wrangler_settings(dist_dir: Path) -> dict[str, Any]:
    for path in (dist_dir.parent / "wrangler.json", dist_dir / "wrangler.json"):
        if path.is_file():
            try:
                data = json.loads(path.read_text())
            except ValueError:
                return {}
            return data if isinstance(data, dict) else {}
    return {}


class HazeCloudflareWorker(pulumi.ComponentResource):
    """The haze Worker (``class Default(QueueWorker)`` in ``dist/cloudflare/src/entry.py``),
    bound to its queues, D1 databases and KV namespaces, and consuming its queues.

    ``crons``: the Worker's Cron Triggers (default: ``triggers.crons`` of the build's
    ``dist/wrangler.json``, one per distinct cron of ``config/schedule.py``).

    ``d1_databases`` / ``kv_namespaces``: binding name -> database name / namespace title
    (None: derived from the Worker name), created here. ``vars`` are plain-text bindings,
    ``secrets`` secret-text ones (e.g. ``HAZE_HTTP_SECRET``).

    Each consumer is checked: ``max_retries`` >= ``max_tries - 1`` and <= 100,
    ``max_batch_size`` 1-100, ``max_batch_timeout`` 0-60 s.
    """

    script: cloudflare.WorkersScript
    consumers: dict[str, cloudflare.QueueConsumer]
    d1: dict[str, cloudflare.D1Database]
    kv: dict[str, cloudflare.WorkersKvNamespace]

    def __init__(
        self,
        name: str,
        *,
        account_id: pulumi.Input[str],
        script_name: str,
        queues: Sequence[QueueBinding] = (),
        dist_dir: str | Path | None = None,
        app_root: str | Path | None = None,
        d1_databases: Mapping[str, str | None] | None = None,
        kv_namespaces: Mapping[str, str | None] | None = None,
        vars: Mapping[str, pulumi.Input[str]] | None = None,
        secrets: Mapping[str, pulumi.Input[str]] | None = None,
        compatibility_date: str | None = None,
        compatibility_flags: Sequence[str] | None = None,
        crons: Sequence[str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("haze:cloudflare:HazeCloudflareWorker", name, None, opts)
        _check_bindings(name, queues, d1_databases, kv_namespaces, vars, secrets)
        base = (
            Path(dist_dir)
            if dist_dir is not None
            else Path(app_root or ".") / "dist" / ("cloudflare")
        )
        main, modules = worker_modules(base)
        wrangler = _wrangler_settings(base)
        date, flags = _compatibility(wrangler, compatibility_date, compatibility_flags)
        self.script_name = script_name
        self._storage(name, account_id, d1_databases, kv_namespaces)
        self.script = cloudflare.WorkersScript(
            name,
            account_id=account_id,
            script_name=script_name,
            main_module="entry.py",
            content_file=str(main),
            content_sha256=_sha256(main),
            content_type="text/x-python",
            files=_module_files(modules),
            compatibility_date=date,
            compatibility_flags=flags,
            bindings=_bindings(queues, self.d1, self.kv, vars, secrets),
            opts=_child(self, [q.queue for q in queues]),
        )
        self.cron_trigger = self._cron_trigger(name, account_id, wrangler, crons)
        self.consumers = {
            q.binding: self._consumer(name, account_id, q) for q in queues if q.consumer is not None
        }
        self.register_outputs(
            {
                "script_name": script_name,
                "d1": {b: db.uuid for b, db in self.d1.items()},
                "kv": {b: ns.id for b, ns in self.kv.items()},
            }
        )

    def _cron_trigger(
        self,
        name: str,
        account_id: pulumi.Input[str],
        wrangler: Mapping[str, Any],
        crons: Sequence[str] | None,
    ) -> cloudflare.WorkersCronTrigger | None:
        """The Cron Triggers of config/schedule.py: ``triggers.crons`` of the build's
        wrangler.json unless given; ``scheduled()`` dispatches the schedules of each."""
        if crons is None:
            triggers = wrangler.get("triggers")
            crons = list((triggers or {}).get("crons") or []) if isinstance(triggers, dict) else []
        if not crons:
            return None
        return cloudflare.WorkersCronTrigger(
            f"{name}-crons",
            account_id=account_id,
            script_name=self.script.script_name,
            schedules=[{"cron": str(c)} for c in crons],
            opts=_child(self, [self.script]),
        )

    def _storage(
        self,
        name: str,
        account_id: pulumi.Input[str],
        d1_databases: Mapping[str, str | None] | None,
        kv_namespaces: Mapping[str, str | None] | None,
    ) -> None:
        """The D1 databases and KV namespaces (named after the Worker unless given)."""
        self.d1 = {
            b: cloudflare.D1Database(
                f"{name}-d1-{b.lower()}",
                account_id=account_id,
                name=db or f"{self.script_name}-{b.lower()}",
                opts=_child(self),
            )
            for b, db in (d1_databases or {}).items()
        }
        self.kv = {
            b: cloudflare.WorkersKvNamespace(
                f"{name}-kv-{b.lower()}",
                account_id=account_id,
                title=title or f"{self.script_name}-{b.lower()}",
                opts=_child(self),
            )
            for b, title in (kv_namespaces or {}).items()
        }

    def _consumer(
        self, name: str, account_id: pulumi.Input[str], q: QueueBinding
    ) -> cloudflare.QueueConsumer:
        """The Worker consuming ``q`` with its (checked) consumer settings."""
        c = q.consumer
        assert c is not None
        settings: Any = {
            "batch_size": c.max_batch_size,
            "max_retries": c.retries(),
            "max_wait_time_ms": int(c.max_batch_timeout * 1000),
        }
        if c.max_concurrency is not None:
            settings["max_concurrency"] = c.max_concurrency
        if c.retry_delay is not None:
            settings["retry_delay"] = c.retry_delay
        return cloudflare.QueueConsumer(
            f"{name}-consumer-{q.binding.lower()}",
            account_id=account_id,
            queue_id=q.queue.queue.queue_id,
            type="worker",
            script_name=self.script.script_name,
            dead_letter_queue=q.queue.dlq_name,
            settings=settings,
            opts=_child(self, [self.script]),
        )


def _check_bindings(
    name: str,
    queues: Sequence[QueueBinding],
    d1_databases: Mapping[str, str | None] | None,
    kv_namespaces: Mapping[str, str | None] | None,
    vars: Mapping[str, pulumi.Input[str]] | None,
    secrets: Mapping[str, pulumi.Input[str]] | None,
) -> None:
    """Each binding name once; each consumer within Cloudflare's and the jobs' limits."""
    names = (
        [q.binding for q in queues]
        + list(d1_databases or {})
        + list(kv_namespaces or {})
        + list(vars or {})
        + list(secrets or {})
    )
    dup = sorted({b for b in names if names.count(b) > 1})
    _check(not dup, f"binding names used twice: {', '.join(dup)}", f"{name}.bindings")
    for q in queues:
        if q.consumer is not None:
            _check_consumer(name, q)


def _compatibility(
    wrangler: Mapping[str, Any], date: str | None, flags: Sequence[str] | None
) -> tuple[str, list[str]]:
    """The compatibility date and flags: given, else the build's wrangler.json's (with
    ``python_workers`` always on)."""
    chosen = date or wrangler.get("compatibility_date") or (DEFAULT_COMPATIBILITY_DATE)
    all_flags = list(flags if flags is not None else (wrangler.get("compatibility_flags") or []))
    if "python_workers" not in all_flags:
        all_flags.append("python_workers")
    return str(chosen), all_flags


def _module_files(modules: Mapping[str, Path]) -> Any:
    """The Worker's other modules (the vendored runtime, the app), or None."""
    files = {
        part: {
            "content_type": _content_type(p),
            "content_file": str(p),
            "content_sha256": _sha256(p),
        }
        for part, p in modules.items()
    }
    return files or None


def _bindings(
    queues: Sequence[QueueBinding],
    d1: Mapping[str, cloudflare.D1Database],
    kv: Mapping[str, cloudflare.WorkersKvNamespace],
    vars: Mapping[str, pulumi.Input[str]] | None,
    secrets: Mapping[str, pulumi.Input[str]] | None,
) -> list[Any]:
    """The script's bindings: queues, D1, KV, plain-text vars and secrets."""
    bindings: list[Any] = []
    for q in queues:
        bindings.append(
            {"name": q.binding, "type": "queue", "queue_name": q.queue.queue.queue_name}
        )
    for b, db in d1.items():
        bindings.append({"name": b, "type": "d1", "id": db.uuid})
    for b, ns in kv.items():
        bindings.append({"name": b, "type": "kv_namespace", "namespace_id": ns.id})
    for k, v in (vars or {}).items():
        bindings.append({"name": k, "type": "plain_text", "text": v})
    for k, v in (secrets or {}).items():
        bindings.append({"name": k, "type": "secret_text", "text": v})
    return bindings


def _check_consumer(worker: str, q: QueueBinding) -> None:
    c = q.consumer
    assert c is not None
    key = f"{worker}.queues.{q.binding}"
    need = cloudflare_max_retries(c.max_tries)
    retries = c.retries()
    _check(
        c.max_tries is None or c.max_tries - 1 <= CF_MAX_RETRIES,
        f"queue {q.queue.queue_name!r}: jobs of {c.max_tries} tries need "
        f"{(c.max_tries or 1) - 1} retries; Cloudflare allows at most {CF_MAX_RETRIES} "
        f"(over Cloudflare's {CF_MAX_RETRIES}): lower tries",
        f"{key}.max_retries",
    )
    _check(
        retries >= need,
        f"queue {q.queue.queue_name!r}: max_retries {retries} is below "
        f"tries - 1 = {need} for jobs of {c.max_tries} tries (Cloudflare counts retries, "
        "haze counts tries): Cloudflare would dead-letter messages haze still retries",
        f"{key}.max_retries",
    )
    _check(
        retries <= CF_MAX_RETRIES,
        f"queue {q.queue.queue_name!r}: max_retries {retries} "
        f"is over Cloudflare's {CF_MAX_RETRIES}",
        f"{key}.max_retries",
    )
    _check(
        1 <= c.max_batch_size <= CF_MAX_BATCH_SIZE,
        f"max_batch_size {c.max_batch_size} is outside 1-{CF_MAX_BATCH_SIZE}",
        f"{key}.max_batch_size",
    )
    _check(
        0 <= c.max_batch_timeout <= CF_MAX_BATCH_TIMEOUT,
        f"max_batch_timeout {c.max_batch_timeout:g}s is outside 0-{CF_MAX_BATCH_TIMEOUT}s",
        f"{key}.max_batch_timeout",
    )


class HazeCloudflareApp(pulumi.ComponentResource):
    """Everything a haze app needs on Cloudflare, from its :class:`StackConfig`: a
    :class:`HazeCloudflareQueue` per ``cloudflare`` connection (named by the
    ``cloudflare.wrangler`` producers of ``haze.config.py``, else
    ``<name_prefix>-<connection>``) and one :class:`HazeCloudflareWorker` producing to
    and consuming all of them with the derived consumer settings, binding the D1
    databases (``d1://`` connections) and KV namespaces (``kv`` cache stores) the app
    uses, plus ``d1_databases`` / ``kv_namespaces`` given here.
    """

    queues: dict[str, HazeCloudflareQueue]
    worker: HazeCloudflareWorker

    def __init__(
        self,
        name: str,
        *,
        stack: StackConfig,
        account_id: pulumi.Input[str],
        dist_dir: str | Path | None = None,
        script_name: str | None = None,
        name_prefix: str | None = None,
        connections: Sequence[str] | None = None,
        d1_databases: Mapping[str, str | None] | None = None,
        kv_namespaces: Mapping[str, str | None] | None = None,
        vars: Mapping[str, pulumi.Input[str]] | None = None,
        secrets: Mapping[str, pulumi.Input[str]] | None = None,
        compatibility_date: str | None = None,
        compatibility_flags: Sequence[str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("haze:cloudflare:HazeCloudflareApp", name, None, opts)
        prefix = name_prefix or name
        self.queues = {}
        bindings = [
            self._queue(name, prefix, account_id, plan, stack)
            for plan in _plans(stack, connections)
        ]
        d1: dict[str, str | None] = {d.binding: None for d in stack.d1}
        d1.update(d1_databases or {})
        kv: dict[str, str | None] = {k.binding: None for k in stack.kv}
        kv.update(kv_namespaces or {})
        base = (
            Path(dist_dir)
            if dist_dir is not None
            else Path(stack.app_root or ".") / ("dist") / "cloudflare"
        )
        self.worker = HazeCloudflareWorker(
            f"{name}-worker",
            account_id=account_id,
            script_name=script_name or prefix,
            queues=bindings,
            dist_dir=base,
            d1_databases=d1,
            kv_namespaces=kv,
            vars=vars,
            secrets=secrets,
            compatibility_date=compatibility_date,
            compatibility_flags=compatibility_flags,
            opts=_child(self),
        )
        self.register_outputs(
            {
                "script_name": self.worker.script_name,
                "queues": {c: q.queue_name for c, q in self.queues.items()},
            }
        )

    def _queue(
        self,
        name: str,
        prefix: str,
        account_id: pulumi.Input[str],
        plan: ConnectionPlan,
        stack: StackConfig,
    ) -> QueueBinding:
        """The queue of one ``cloudflare`` connection, bound and consumed by the Worker."""
        cf = plan.cloudflare
        if cf is None:
            raise InfraConfigError(
                f"connection {plan.name!r} uses the {plan.driver} driver, not cloudflare",
                source=stack.source,
                key="connections",
            )
        queue = HazeCloudflareQueue(
            f"{name}-{plan.name}",
            account_id=account_id,
            queue_name=cf.queue_name or f"{prefix}-{plan.name}",
            dead_letter_queue_name=cf.dead_letter_queue,
            opts=_child(self),
        )
        self.queues[plan.name] = queue
        consumer = ConsumerSettings(
            max_tries=plan.max_tries,
            max_retries=cf.max_retries,
            max_batch_size=cf.max_batch_size,
            max_batch_timeout=cf.max_batch_timeout,
            max_concurrency=cf.max_concurrency,
            retry_delay=cf.retry_delay,
        )
        return QueueBinding(cf.binding, queue, consumer)


def _plans(stack: StackConfig, connections: Sequence[str] | None) -> list[ConnectionPlan]:
    """The connections to deploy: those named, else every ``cloudflare`` one."""
    plans = (
        [stack.connection(c) for c in connections]
        if connections is not None
        else (stack.by_driver("cloudflare"))
    )
    if not plans:
        raise InfraConfigError(
            "nothing to deploy on Cloudflare: config/queue.py has no cloudflare connection",
            source=stack.source,
            key="connections",
        )
    return list(plans)
