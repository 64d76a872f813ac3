import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from haze import define_job
from records import record


@define_job(queue="bench")
async def noop(payload: dict) -> None:
    record(payload["t"])
