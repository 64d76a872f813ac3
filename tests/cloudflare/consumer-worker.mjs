// The JS Worker that Miniflare runs (in workerd) as the consumer of the local queues.
//
// It owns the REAL Cloudflare messages: for each delivery it hands the message's id,
// body and attempts to the haze adapter (the HAZE service binding, served by Node where
// haze_cloudflare.QueueWorker runs inside Pyodide), gets back one verdict per message,
// and applies it to the real message: message.ack() or message.retry({delaySeconds}).
// A message without a verdict is left to Cloudflare's default (acked when queue()
// returns). If the adapter call fails, queue() throws and the whole batch is retried.
// Deliveries from the dead-letter queue are reported to the harness and acked.
export default {
  // Cron Triggers: relayed to haze_cloudflare.QueueWorker.scheduled() in Node/Pyodide.
  async scheduled(controller, env) {
    const res = await env.HAZE.fetch("http://haze/scheduled", {
      method: "POST",
      body: JSON.stringify({ cron: controller.cron, scheduledTime: controller.scheduledTime }),
    });
    if (!res.ok) throw new Error(`haze adapter failed: HTTP ${res.status} ${await res.text()}`);
  },
  async queue(batch, env) {
    if (batch.queue === env.DLQ_NAME) {
      for (const m of batch.messages) {
        await env.HAZE.fetch("http://haze/dlq", {
          method: "POST",
          body: JSON.stringify({ id: m.id, attempts: m.attempts, body: m.body }),
        });
        m.ack();
      }
      return;
    }
    const res = await env.HAZE.fetch("http://haze/queue", {
      method: "POST",
      body: JSON.stringify({
        queue: batch.queue,
        messages: batch.messages.map((m) => ({
          id: m.id,
          body: m.body,
          attempts: m.attempts,
          timestamp: m.timestamp.getTime(),
        })),
      }),
    });
    if (!res.ok) throw new Error(`haze adapter failed: HTTP ${res.status} ${await res.text()}`);
    const verdicts = await res.json();
    for (const m of batch.messages) {
      const v = verdicts[m.id];
      if (!v) continue;
      if (v.action === "ack") m.ack();
      else if (v.action === "retry") {
        m.retry(v.delaySeconds == null ? undefined : { delaySeconds: v.delaySeconds });
      }
    }
  },
};
