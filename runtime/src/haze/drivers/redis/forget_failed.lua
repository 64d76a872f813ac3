--[[
  haze redis driver: delete the failed BullMQ jobs of one haze message id, in the
  transaction of a retry that queues the job again (RedisFailedJobs.requeue_claimed).
    KEYS[i]       the failed set of queue i
    ARGV[1]       the haze message id
    ARGV[2]       only those that failed at or before this time (epoch ms)
    ARGV[i + 2]   the job key prefix of queue i ("<prefix>:<queue>:")
  A job that failed again after the retry's claim keeps its record. Removes what
  BullMQ's removeJob removes for a failed job without parent or children: its entry in
  the failed set, its hash and its logs. Returns how many. (The id is looked for
  anywhere in the data before it is decoded: a record written by hand may space its
  JSON.)
]]
local rcall = redis.call
local wanted = ARGV[1]
local upTo = tonumber(ARGV[2])
local n = 0
for i, failedKey in ipairs(KEYS) do
  local prefix = ARGV[i + 2]
  local jobIds = rcall("ZRANGE", failedKey, 0, -1)
  for _, jobId in ipairs(jobIds) do
    local row = rcall("HMGET", prefix .. jobId, "data", "finishedOn")
    local data = row[1]
    if data and string.find(data, wanted, 1, true) and (tonumber(row[2]) or 0) <= upTo then
      local ok, decoded = pcall(cjson.decode, data)
      if ok and type(decoded) == "table" and tostring(decoded["id"]) == wanted then
        rcall("ZREM", failedKey, jobId)
        rcall("DEL", prefix .. jobId, prefix .. jobId .. ":logs")
        n = n + 1
      end
    end
  end
end
return n
