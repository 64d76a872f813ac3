"""The three workflow recipes of docs/workflows.md, in one definition file.

Every engine runs these same definitions: haze's store engine (memory, SQL, Redis, D1
in a Worker's ``queue()``, the Lambda SQS handler) and the platforms' own engines. The
docs page shows each recipe between its ``# --- recipe: NAME`` markers verbatim
(``tests/workflows/test_docs_recipes.py`` checks that they have not drifted apart).

The side effects are plain functions that count their calls in ``CALLS`` (per
process; ``reset()`` clears it), so a test can tell "a step's result was kept" from "a
step ran again". Each also returns what it did, so an engine in another process (a
Worker in Miniflare) shows its work in the run's result and step records.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from haze import define_job, workflow

#: How many times each side effect ran in this process, by name (``"mail:welcome"``).
CALLS: Counter[str] = Counter()


def reset() -> None:
    """Forget the counts (call at the start of each test)."""
    CALLS.clear()


# The side effects. Real code would call a mail service, a payment provider, a CSV
# store; here they count and return plain JSON.


def create_account(email: str) -> dict[str, Any]:
    CALLS["create_account"] += 1
    return {"id": sum(map(ord, email)), "email": email}


def send_mail(template: str, to: str) -> str:
    CALLS[f"mail:{template}"] += 1
    return f"{template}->{to}"


def has_logged_in(user_id: int) -> bool:
    CALLS["has_logged_in"] += 1
    return False


def create_payment_intent(order_id: str, cents: int) -> dict[str, Any]:
    CALLS["create_payment_intent"] += 1
    return {"intent": f"pi_{order_id}", "cents": cents}


def ship_order(order_id: str) -> str:
    CALLS["ship_order"] += 1
    return f"shipped {order_id}"


def cancel_order(order_id: str) -> str:
    CALLS["cancel_order"] += 1
    return f"cancelled {order_id}"


def list_chunks(source: str, chunks: int) -> list[str]:
    CALLS["list_chunks"] += 1
    return [f"{source}#{i}" for i in range(chunks)]


def import_chunk(chunk: str) -> int:
    CALLS[f"import:{chunk}"] += 1
    return 100 + int(chunk.rsplit("#", 1)[1])


@define_job(name="recipes.receipt")
def send_receipt(payload: dict[str, Any]) -> None:
    CALLS["receipt"] += 1


# --- recipe: sign-up
@workflow(name="signup")
async def signup(run, email: str):
    user = await run.step("create-account", create_account, email)
    await run.step("welcome-mail", send_mail, "welcome", email)
    await run.sleep("two-days", "2d")  # no worker is held while it sleeps
    logged_in = await run.step("logged-in?", has_logged_in, user["id"])
    if not logged_in:
        await run.step("nudge-mail", send_mail, "nudge", email)
    return {"user": user["id"], "nudged": not logged_in}


# --- end


# --- recipe: payment
@workflow(name="payment")
async def payment(run, order_id: str, cents: int):
    intent = await run.step("intent", create_payment_intent, order_id, cents)
    paid = await run.wait_for_event("paid", timeout="3d")  # the provider's webhook
    if paid is None:
        await run.step("cancel", cancel_order, order_id)
        return {"order": order_id, "state": "cancelled"}
    await run.step("ship", ship_order, order_id)
    await run.dispatch(send_receipt.with_({"order": order_id, "intent": intent["intent"]}))
    return {"order": order_id, "state": "shipped", "paid": paid}


# --- end


# --- recipe: import
@workflow(name="import")
async def import_file(run, source: str, chunks: int = 3):
    names = await run.step("list", list_chunks, source, chunks)
    counts = await run.gather(*[run.step(f"chunk {n}", import_chunk, n) for n in names])
    return {"source": source, "rows": sum(counts), "chunks": len(counts)}


# --- end


#: The recipes by workflow name, for tests that loop over them.
RECIPES = {"signup": signup, "payment": payment, "import": import_file}
