// The official BullMQ (Node) Worker on a haze queue of grouped jobs: what it counts,
// then the order it runs them in (one at a time) until the queue is empty.
// usage: node groups_worker.mjs <redis url> <prefix> <queue>
import { Queue, Worker } from "bullmq";

const [url, prefix, queueName] = process.argv.slice(2);
const u = new URL(url);
const connection = {
  host: u.hostname,
  port: Number(u.port || 6379),
  db: Number((u.pathname || "/0").slice(1) || 0),
};

const queue = new Queue(queueName, { connection, prefix });
const counts = await queue.getJobCounts("wait", "prioritized", "delayed");
const order = [];
const worker = new Worker(
  queueName,
  async (job) => {
    order.push([job.data.payload.tenant, job.data.payload.k]);
  },
  { connection, prefix, concurrency: 1, autorun: false },
);
const drained = new Promise((resolve) => worker.on("drained", resolve));
worker.run();
await drained;
await worker.close();
await queue.close();
console.log(JSON.stringify({ counts, order }));
