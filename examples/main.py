"""The example app, end to end on the embedded SQLite default.

1. ``haze db:migrate``: create the queue tables (and this app's ``outcomes`` table);
2. dispatch a chain, a batch, a unique job (twice) and a job that fails;
3. ``haze queue:work --stop-when-empty`` works them off in a separate process while
   a progress bar follows the batch;
4. print what happened, read back from the database.

Run it with the README's first command (``./scripts/demo``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

from haze import App, Db, Queue, short_id
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

ROOT = Path(__file__).resolve().parent
console = Console()


def haze_cli(*args: str, quiet: bool = False) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "haze.cli", "--root", str(ROOT), *args]
    console.print(f"[dim]$ haze {' '.join(args)}[/dim]")
    out = subprocess.DEVNULL if quiet else None
    return subprocess.Popen(cmd, stdout=out, stderr=out)


async def main() -> None:
    shutil.rmtree(ROOT / "storage", ignore_errors=True)  # a fresh database every run
    if haze_cli("db:migrate").wait() != 0:
        raise SystemExit("db:migrate failed")

    async with App(root=ROOT) as app:
        from app.job.billing import charge_card
        from app.job.feeds import sync_feed
        from app.job.imports import import_finished, import_rows
        from app.job.media import notify_author, publish_post, resize_image

        console.rule(f"dispatching on the {app.queue_config.default!r} connection")
        chain = await Queue.chain(
            [
                resize_image.with_({"post_id": 7}),
                publish_post.with_({"post_id": 7}),
                notify_author.with_({"post_id": 7}),
            ]
        ).dispatch()
        console.print(
            f"chain    {short_id(chain.chain_id)}: resize_image → publish_post → notify_author"
        )
        batch = await (
            Queue.batch([import_rows.with_({"row": i}) for i in range(60)])
            .name("customers.csv")
            .then(import_finished.with_({"name": "customers.csv"}))
            .dispatch()
        )
        console.print(f"batch    {short_id(batch.id)}: {batch.total} import_rows jobs")
        first = await sync_feed.with_({"feed_id": 1}).dispatch()
        second = await sync_feed.with_({"feed_id": 1}).dispatch()
        console.print(
            f"unique   sync_feed #1 queued ({short_id(first.id)}); "
            f"second dispatch skipped={second.skipped}"
        )
        await charge_card.dispatch({"card": "4000-0000-0000-0002"})
        console.print("failing  charge_card (2 tries)")

        console.rule("working")
        worker = haze_cli(
            "queue:work",
            "--stop-when-empty",
            "--concurrency",
            "4",
            "--queue",
            "high,default",
            quiet=True,
        )
        columns = (TextColumn("batch {task.description}"), BarColumn(), MofNCompleteColumn())
        with Progress(*columns, console=console) as bar:
            task = bar.add_task(batch.name or batch.id, total=batch.total)
            while worker.poll() is None:
                fresh = await batch.fresh()
                bar.update(task, completed=fresh.total - fresh.pending)
                await asyncio.sleep(0.05)
            fresh = await batch.fresh()
            bar.update(task, completed=fresh.total - fresh.pending)
        if worker.returncode != 0:
            raise SystemExit(f"queue:work exited with {worker.returncode}")

        console.rule("what happened")
        table = Table("job", "attempt", "outcome")
        for job, attempt, what in await Db.connection().fetchall(
            "SELECT job, attempt, what FROM outcomes ORDER BY id"
        ):
            table.add_row(job, str(attempt), what)
        console.print(table)
        console.print(
            f"batch    {fresh.name}: {fresh.processed}/{fresh.total} processed, "
            f"{fresh.failed} failed, finished={fresh.finished}"
        )
        for f in await Queue.failed():
            console.print(f"failed   {f.name}: {f.exception.strip().splitlines()[-1]}")
        console.print(
            f"left     {await Queue.size('default') + await Queue.size('high')} queued jobs"
        )


if __name__ == "__main__":
    os.chdir(ROOT)
    asyncio.run(main())
