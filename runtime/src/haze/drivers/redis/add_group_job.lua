--[[
  haze: add a job of a tenant group. Grouped jobs live in BullMQ's prioritized set, and
  a group's job takes the turn (BullMQ's "priority") after the group's last one, never
  one before the queue's head: so any BullMQ claim (haze's or a Node worker's
  moveToActive, which pop the set's lowest score) takes the groups round-robin. The
  score is BullMQ's own for a priority (turn * 2^32 + the pc counter), so the jobs
  BullMQ itself puts back (a stalled job, a release via delayed) keep their turn.

  The head is the lowest turn in the set; with the set empty it is the one after the
  highest turn given so far (every job with a turn up to it has been claimed), so
  every group starts there alike. A delayed job takes
  the head's turn without moving its group's: when it is due it is taken next.

  Writes as addPrioritizedJob / addDelayedJob do for the job haze sends (opts
  {"attempts":1} and the delay), plus the group in the job's hash ("hzg", for the
  backlog per group), the group's last turn (hash KEYS[9]) and the highest turn given
  (KEYS[10]).

    KEYS[1] 'prioritized'   KEYS[2] 'delayed'  KEYS[3] 'meta'  KEYS[4] 'id'
    KEYS[5] 'active'        KEYS[6] events     KEYS[7] marker  KEYS[8] 'pc'
    KEYS[9] '<queue>:haze-groups'  KEYS[10] '<queue>:haze-turn'
    ARGV[1] key prefix  ARGV[2] JSON opts  ARGV[3] job name  ARGV[4] JSON job data
    ARGV[5] timestamp (ms)  ARGV[6] delay (ms)  ARGV[7] group
  Output: the job id.
]]
local rcall = redis.call
local eventsKey = KEYS[6]
local delay = tonumber(ARGV[6])
local jobId = rcall("INCR", KEYS[4]) .. ""
local meta = rcall("HMGET", KEYS[3], "opts.maxLenEvents", "paused", "concurrency")
local maxEvents = meta[1]
if not maxEvents then
  maxEvents = 10000
  rcall("HSET", KEYS[3], "opts.maxLenEvents", maxEvents)
end

local head
local first = rcall("ZRANGE", KEYS[1], 0, 0, "WITHSCORES")
if first[2] then
  head = math.floor(tonumber(first[2]) / 0x100000000)
else
  head = tonumber(rcall("GET", KEYS[10]) or 0) + 1
end
local turn = head
if delay == 0 then
  local last = tonumber(rcall("HGET", KEYS[9], ARGV[7]))
  if last and last + 1 > head then
    turn = last + 1
  end
  rcall("HSET", KEYS[9], ARGV[7], turn)
  if turn > tonumber(rcall("GET", KEYS[10]) or 0) then
    rcall("SET", KEYS[10], turn)
  end
end

rcall("HMSET", ARGV[1] .. jobId, "name", ARGV[3], "data", ARGV[4], "opts", ARGV[2],
      "timestamp", ARGV[5], "delay", delay, "priority", turn, "hzg", ARGV[7])
rcall("XADD", eventsKey, "*", "event", "added", "jobId", jobId, "name", ARGV[3])
if delay > 0 then
  local due = tonumber(ARGV[5]) + delay
  local score = due * 0x1000
  local top = rcall("ZREVRANGEBYSCORE", KEYS[2], (due + 1) * 0x1000 - 1, score,
                    "WITHSCORES", "LIMIT", 0, 1)
  if top[2] then
    score = math.min(tonumber(top[2]) + 1, (due + 1) * 0x1000 - 1)
  end
  rcall("ZADD", KEYS[2], score, jobId)
  rcall("XADD", eventsKey, "MAXLEN", "~", maxEvents, "*", "event", "delayed",
        "jobId", jobId, "delay", due)
  local next = rcall("ZRANGE", KEYS[2], 0, 0, "WITHSCORES")
  if next[2] then
    rcall("ZADD", KEYS[7], tonumber(next[2]) / 0x1000, "1")
  end
  return jobId
end
local pausedOrMaxed = meta[2] and true or false
if not pausedOrMaxed and meta[3] then
  pausedOrMaxed = rcall("LLEN", KEYS[5]) >= tonumber(meta[3])
end
local counter = rcall("INCR", KEYS[8])
rcall("ZADD", KEYS[1], turn * 0x100000000 + counter % 0x100000000, jobId)
if not pausedOrMaxed then
  rcall("ZADD", KEYS[7], 0, "0")
end
rcall("XADD", eventsKey, "MAXLEN", "~", maxEvents, "*", "event", "waiting", "jobId", jobId)
return jobId
