from app.job.sched_jobs import tick
from haze import schedule

schedule(tick.with_({"from": "every"}), every="1s", name="every-second")
schedule(tick.with_({"from": "cron"}), cron="*/2 * * * * *", name="cron-two-seconds")
