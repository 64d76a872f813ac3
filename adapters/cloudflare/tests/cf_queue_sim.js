// A STAND-IN for Cloudflare Queues and Workers KV, in JavaScript, for harness (a).
//
// It is not Cloudflare: it reproduces the documented producer/consumer surface so the
// haze adapter can be driven inside real Pyodide with real JS objects crossing the
// boundary:
//   Queue binding   send(body, {contentType, delaySeconds}), sendBatch([{body, ...}])
//                   (at most 100 messages per call, delaySeconds at most 43200)
//   MessageBatch    {queue, messages, ackAll(), retryAll()}
//   Message         {id, timestamp, body, attempts, ack(), retry({delaySeconds})}
//                   attempts starts at 1; the first ack/retry call wins; a message the
//                   handler left unsettled is acked when queue() resolves and retried
//                   when it throws; after max_retries retries a message goes to the
//                   dead-letter queue (when one is configured) or is dropped.
//   KV binding      get(key), put(key, value, {expirationTtl >= 60}), delete(key)
// Bodies are copied as Cloudflare serialises them: "json" through JSON, "text" as a
// string, anything else (v8) with structuredClone. A v8 body reaches the Python
// handler as real workerd hands it over: each JS Date in it already turned into its
// ISO 8601 string (seen in workerd with Pyodide 0.28); other values stay JS objects. One simulated second is SCALE_MS ms
// (a queue's scaleMs option overrides it: 1000 runs on the real clock).
(() => {
  const SCALE_MS = 10;
  let seq = 0;
  const now = () => performance.now();

  function asWorkerdDelivers(value) {
    if (value instanceof Date) return value.toISOString();
    if (Array.isArray(value)) return value.map(asWorkerdDelivers);
    if (value !== null && typeof value === "object" && Object.getPrototypeOf(value) === Object.prototype) {
      return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, asWorkerdDelivers(v)]));
    }
    return value;
  }

  function copyBody(body, contentType) {
    if (contentType === "json") return JSON.parse(JSON.stringify(body));
    if (contentType === "text") {
      if (typeof body !== "string") throw new TypeError("text messages must be strings");
      return body;
    }
    return structuredClone(body);
  }

  class SimQueue {
    constructor(name, { maxRetries = 3, deadLetter = null, scaleMs = SCALE_MS } = {}) {
      this.name = name;
      this.scaleMs = scaleMs;
      this.maxRetries = maxRetries;
      this.deadLetter = deadLetter;
      this.stored = [];
      this.sends = []; // every message put on the queue: {via, id, contentType, delaySeconds, body}
      this.batchCalls = []; // sizes of sendBatch calls
      this.calls = []; // [messageId, "ack"] / [messageId, "retry", delaySeconds]
      this.dead = []; // ids moved to the dead-letter queue
      this.acked = [];
    }

    _put(body, options, via) {
      const contentType = options?.contentType ?? "v8";
      const delay = options?.delaySeconds ?? 0;
      if (!(delay >= 0 && delay <= 43200)) {
        throw new RangeError(`delaySeconds must be between 0 and 43200, got ${delay}`);
      }
      const stored = {
        id: `msg${++seq}`,
        body: copyBody(body, contentType),
        contentType,
        attempts: 0,
        availableAt: now() + delay * this.scaleMs,
        timestamp: new Date(),
        inflight: false,
        settled: null,
      };
      this.stored.push(stored);
      this.sends.push({
        via,
        id: stored.id,
        contentType,
        delaySeconds: options?.delaySeconds ?? null,
        body: contentType === "v8" ? null : JSON.parse(JSON.stringify(stored.body)),
      });
      return stored;
    }

    async send(body, options) {
      this._put(body, options, "send");
    }

    async sendBatch(messages, options) {
      if (messages.length > 100) throw new RangeError("sendBatch: at most 100 messages");
      this.batchCalls.push(messages.length);
      for (const m of messages) {
        this._put(
          m.body,
          {
            contentType: m.contentType ?? options?.contentType,
            delaySeconds: m.delaySeconds ?? options?.delaySeconds,
          },
          "sendBatch",
        );
      }
    }

    // A raw message as a foreign producer might send it (e.g. not haze JSON).
    inject(body, contentType = "json") {
      return this._put(body, { contentType }, "inject").id;
    }

    nextBatch(max = 10) {
      const t = now();
      const ready = this.stored.filter((m) => !m.inflight && m.availableAt <= t).slice(0, max);
      if (ready.length === 0) return null;
      const queue = this;
      const messages = ready.map((m) => {
        m.inflight = true;
        m.attempts += 1;
        m.settled = null;
        return {
          id: m.id,
          timestamp: m.timestamp,
          body: m.contentType === "v8" ? asWorkerdDelivers(m.body) : m.body,
          attempts: m.attempts,
          ack() {
            queue.calls.push([m.id, "ack"]);
            if (!m.settled) m.settled = { ack: true };
          },
          retry(options) {
            queue.calls.push([m.id, "retry", options?.delaySeconds ?? null]);
            if (!m.settled) m.settled = { retry: true, delaySeconds: options?.delaySeconds ?? 0 };
          },
        };
      });
      return {
        queue: this.name,
        messages,
        _stored: ready,
        ackAll() {
          for (const m of ready) if (!m.settled) m.settled = { ack: true };
        },
        retryAll(options) {
          for (const m of ready) {
            if (!m.settled) m.settled = { retry: true, delaySeconds: options?.delaySeconds ?? 0 };
          }
        },
      };
    }

    settle(batch, threw) {
      for (const m of batch._stored) {
        const verdict = m.settled ?? (threw ? { retry: true, delaySeconds: 0 } : { ack: true });
        m.inflight = false;
        if (verdict.ack) {
          this.stored.splice(this.stored.indexOf(m), 1);
          this.acked.push(m.id);
        } else if (m.attempts > this.maxRetries) {
          this.stored.splice(this.stored.indexOf(m), 1);
          this.dead.push(m.id);
          if (this.deadLetter) this.deadLetter._put(m.body, { contentType: m.contentType }, "dlq");
        } else {
          m.availableAt = now() + (verdict.delaySeconds ?? 0) * this.scaleMs;
        }
      }
    }

    // ms until the next stored message is deliverable; -1 when the queue is empty
    nextIn() {
      if (this.stored.length === 0) return -1;
      const t = now();
      return Math.max(0, Math.min(...this.stored.map((m) => m.availableAt - t)));
    }

    get size() {
      return this.stored.length;
    }
  }

  class SimKV {
    constructor() {
      this.map = new Map();
      this.puts = [];
    }
    async get(key) {
      return this.map.has(key) ? this.map.get(key) : null;
    }
    async put(key, value, options) {
      if (typeof value !== "string") throw new TypeError("this stand-in stores strings only");
      const ttl = options?.expirationTtl;
      if (ttl !== undefined && ttl < 60) throw new RangeError("expirationTtl must be >= 60");
      this.puts.push([key, ttl ?? null]);
      this.map.set(key, value);
    }
    async delete(key) {
      this.map.delete(key);
    }
  }

  globalThis.cfSim = { SimQueue, SimKV, SCALE_MS };
})();
