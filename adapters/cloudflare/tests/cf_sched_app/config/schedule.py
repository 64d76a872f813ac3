from app.job.cf_sched_jobs import report
from haze import schedule

schedule(report.with_({"kind": "paris"}), cron="30 9 * * *", tz="Europe/Paris", name="paris")
schedule(report.with_({"kind": "quarter"}), every="15m", name="quarter")
schedule(report.with_({"kind": "hourly"}), cron="30 * * * *", name="hourly")
