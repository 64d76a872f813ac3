--[[
  haze: BullMQ's moveToActive-11.lua (bullmq 3.4.4) for the claims haze's worker makes:
  a lock token that is never "0", no worker name, no limiter in the options (a rate
  limit set on the queue's meta by a BullMQ user is still honoured). Every write below
  is one that moveToActive makes for those options, with the same arguments and in the
  same order; what is left out is the msgpack decoding of the options (plain arguments
  here), the branches those options never take, and the ~10 local functions of its
  includes that Lua would define again on every call. The driver only uses this script
  while the installed moveToActive is the exact one it was written against (by SHA),
  and tests/drivers/test_redis_lite_claim.py compares what both scripts write.

  An empty timestamp is read from the server's clock (the claim written behind a
  blocking wait runs when the wait returns, maybe seconds after haze wrote it), in ms
  rounded as haze rounds its own.

    KEYS[1] wait key
    KEYS[2] active key
    KEYS[3] prioritized key
    KEYS[4] stream events key
    KEYS[5] stalled key (unused, as in moveToActive)
    KEYS[6] rate limiter key
    KEYS[7] delayed key
    KEYS[8] paused key (unused, as in moveToActive)
    KEYS[9] meta key
    KEYS[10] pc priority counter
    KEYS[11] marker key
    ARGV[1] key prefix ('<prefix>:<queue>:')
    ARGV[2] timestamp (ms), or '' for the server's clock
    ARGV[3] lock token
    ARGV[4] lock duration (ms)
  Output: moveToActive's: {job hash, job id, 0, 0}, {0, 0, rate limit ttl, 0} or
  {0, 0, 0, next delayed timestamp or 0}.
]]
local rcall = redis.call
local waitKey = KEYS[1]
local activeKey = KEYS[2]
local eventsKey = KEYS[4]
local limiterKey = KEYS[6]
local delayedKey = KEYS[7]
local markerKey = KEYS[11]
local prefix = ARGV[1]
local now = ARGV[2]
if now == '' then
  local t = rcall('TIME')
  now = string.format('%d', t[1] * 1000 + math.floor((t[2] + 500) / 1000))
end

local meta = rcall("HMGET", KEYS[9], "paused", "concurrency", "max", "duration")
local pausedOrMaxed = false
if meta[1] then
  pausedOrMaxed = true
elseif meta[2] then
  pausedOrMaxed = rcall("LLEN", activeKey) >= tonumber(meta[2])
end

-- promoteDelayedJobs: due delayed jobs to wait (or prioritized), up to 1000 at once
local due = rcall("ZRANGEBYSCORE", delayedKey, 0, (now + 1) * 0x1000 - 1, "LIMIT", 0, 1000)
if #due > 0 then
  rcall("ZREM", delayedKey, unpack(due))
  for _, dueId in ipairs(due) do
    local dueKey = prefix .. dueId
    local priority = tonumber(rcall("HGET", dueKey, "priority")) or 0
    if priority == 0 then
      rcall("LPUSH", waitKey, dueId)
    else
      local counter = rcall("INCR", KEYS[10])
      rcall("ZADD", KEYS[3], priority * 0x100000000 + counter % 0x100000000, dueId)
    end
    rcall("XADD", eventsKey, "*", "event", "waiting", "jobId", dueId, "prev", "delayed")
    rcall("HSET", dueKey, "delay", 0)
  end
  if not pausedOrMaxed then
    rcall("ZADD", markerKey, 0, "0")
  end
end

-- getRateLimitTTL: only a queue with a global rate limit (meta "max") has one
local maxJobs = tonumber(meta[3])
if maxJobs and maxJobs <= tonumber(rcall("GET", limiterKey) or 0) then
  local pttl = rcall("PTTL", limiterKey)
  if pttl == 0 then
    rcall("DEL", limiterKey)
  end
  if pttl > 0 then
    return {0, 0, pttl, 0}
  end
end
if pausedOrMaxed then
  return {0, 0, 0, 0}
end

local jobId = rcall("RPOPLPUSH", waitKey, activeKey)
-- a marker left in wait by BullMQ before v5
if jobId and string.sub(jobId, 1, 2) == "0:" then
  rcall("LREM", activeKey, 1, jobId)
  jobId = rcall("RPOPLPUSH", waitKey, activeKey)
end
if not jobId then
  local prioritized = rcall("ZPOPMIN", KEYS[3])
  if #prioritized > 0 then
    jobId = prioritized[1]
    rcall("LPUSH", activeKey, jobId)
  else
    rcall("DEL", KEYS[10])
  end
end

if jobId then
  -- prepareJobForProcessing
  local jobKey = prefix .. jobId
  if maxJobs then
    if rcall("HEXISTS", jobKey, "defa") ~= 1 then
      if tonumber(rcall("INCR", limiterKey)) == 1 then
        rcall("PEXPIRE", limiterKey, math.floor(math.abs(meta[4])))
      end
    end
  end
  rcall("SET", jobKey .. ':lock', ARGV[3], "PX", ARGV[4])
  rcall("XADD", eventsKey, "*", "event", "active", "jobId", jobId, "prev", "waiting")
  rcall("HMSET", jobKey, "processedOn", now)
  rcall("HINCRBY", jobKey, "ats", 1)
  rcall("ZADD", markerKey, 0, "0")
  return {rcall("HGETALL", jobKey), jobId, 0, 0}
end

-- getNextDelayedTimestamp
local nextDelayed = rcall("ZRANGE", delayedKey, 0, 0, "WITHSCORES")
local nextTimestamp = tonumber(nextDelayed[2])
if nextTimestamp ~= nil then
  return {0, 0, 0, nextTimestamp / 0x1000}
end
return {0, 0, 0, 0}
