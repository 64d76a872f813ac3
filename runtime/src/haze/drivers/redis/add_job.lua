--[[
  haze: BullMQ's addStandardJob-9.lua (bullmq 3.4.4) for the one job shape haze sends on
  a single dispatch: an auto-increment id, opts {"attempts":1}, no delay, no priority,
  no lifo, no parent, no repeat key, no deduplication. Every write below is one that
  addStandardJob makes for that shape, with the same arguments and in the same order;
  what is left out is only the code of the branches that shape never takes, and the
  msgpack/cjson decoding of arguments that are constants for it. The Redis server time
  per job is roughly halved. The driver only uses this script while the installed
  addStandardJob is the exact one it was written against (by SHA), and
  tests/drivers/test_redis_lite_add.py compares what both scripts write.

  The two reads of the queue's meta hash (opts.maxLenEvents, then paused/concurrency)
  are one HMGET here: nothing in between writes those fields.

    KEYS[1] 'wait'
    KEYS[2] 'meta'
    KEYS[3] 'id'
    KEYS[4] 'active'
    KEYS[5] events stream key
    KEYS[6] marker key
    ARGV[1] key prefix ('<prefix>:<queue>:')
    ARGV[2] JSON opts (what addStandardJob's cjson.encode of the same opts gives)
    ARGV[3] job name
    ARGV[4] JSON job data
    ARGV[5] timestamp (ms)
  Output: the job id.
]]
local rcall = redis.call
local eventsKey = KEYS[5]
local jobId = rcall("INCR", KEYS[3]) .. ""
local meta = rcall("HMGET", KEYS[2], "opts.maxLenEvents", "paused", "concurrency")
local maxEvents = meta[1]
if not maxEvents then
  maxEvents = 10000
  rcall("HSET", KEYS[2], "opts.maxLenEvents", maxEvents)
end
rcall("HMSET", ARGV[1] .. jobId, "name", ARGV[3], "data", ARGV[4], "opts", ARGV[2],
      "timestamp", ARGV[5], "delay", 0, "priority", 0)
rcall("XADD", eventsKey, "*", "event", "added", "jobId", jobId, "name", ARGV[3])
local pausedOrMaxed = meta[2] and true or false
if not pausedOrMaxed and meta[3] then
  pausedOrMaxed = rcall("LLEN", KEYS[4]) >= tonumber(meta[3])
end
rcall("LPUSH", KEYS[1], jobId)
if not pausedOrMaxed then
  rcall("ZADD", KEYS[6], 0, "0")
end
rcall("XADD", eventsKey, "MAXLEN", "~", maxEvents, "*", "event", "waiting", "jobId", jobId)
return jobId
