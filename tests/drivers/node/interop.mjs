// The official BullMQ (Node) on haze's redis queues: read what haze queued and failed,
// then queue a job with haze's envelope for haze to run.
// usage: node interop.mjs <redis url> <prefix> <queue> <json of the job to add>
import { Queue } from "bullmq";

const [url, prefix, queueName, toAdd] = process.argv.slice(2);
const u = new URL(url);
const connection = {
  host: u.hostname,
  port: Number(u.port || 6379),
  db: Number((u.pathname || "/0").slice(1) || 0),
};

const queue = new Queue(queueName, { connection, prefix });
try {
  const counts = await queue.getJobCounts("wait", "delayed", "active", "completed", "failed");
  const jobs = [];
  for (const job of await queue.getJobs(["wait", "delayed"], 0, -1, true)) {
    jobs.push({ id: job.id, name: job.name, data: job.data, state: await job.getState(),
                delay: job.delay, attemptsMade: job.attemptsMade });
  }
  const failed = (await queue.getFailed()).map((job) => ({
    id: job.id, name: job.name, data: job.data, failedReason: job.failedReason,
    stacktrace: job.stacktrace, attemptsMade: job.attemptsMade,
  }));
  const spec = JSON.parse(toAdd);
  const added = await queue.add(spec.job, spec);
  console.log(JSON.stringify({ counts, jobs, failed, added: added.id }));
} finally {
  await queue.close();
}
