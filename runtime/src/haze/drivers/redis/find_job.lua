--[[
  haze redis driver: find a BullMQ job by the haze message id in its data, in the
  states a job is kept in (JobLookup.find_job, the dashboard's job lookup).
    KEYS[6i-5 .. 6i]  queue i's active, wait, paused, prioritized, delayed and
                      completed keys
    ARGV[1]           the haze message id
    ARGV[2]           how many jobs of each list or set are looked at, at most
    ARGV[i + 2]       the job key prefix of queue i ("<prefix>:<queue>:")
  Returns {i, jobId, state, score} for the first match (score: the delayed set's, or
  ""), or nil. Active jobs come first, completed ones last (newest first).
]]
local rcall = redis.call
local wanted = ARGV[1]
local last = tonumber(ARGV[2]) - 1
local needle = '"id":"' .. wanted .. '"'
local states = {"running", "ready", "ready", "ready", "delayed", "done"}

local function matches(prefix, jobId)
  local data = rcall("HGET", prefix .. jobId, "data")
  if data and string.find(data, needle, 1, true) then
    local ok, decoded = pcall(cjson.decode, data)
    return ok and type(decoded) == "table" and tostring(decoded["id"]) == wanted
  end
  return false
end

for i = 1, #KEYS / 6 do
  local prefix = ARGV[i + 2]
  for k = 1, 6 do
    local key = KEYS[6 * (i - 1) + k]
    local ids
    if k <= 3 then
      ids = rcall("LRANGE", key, 0, last)
    elseif k == 6 then
      ids = rcall("ZREVRANGE", key, 0, last)
    else
      ids = rcall("ZRANGE", key, 0, last)
    end
    for _, jobId in ipairs(ids) do
      if matches(prefix, jobId) then
        local score = ""
        if k == 5 then score = rcall("ZSCORE", key, jobId) end
        return {i, jobId, states[k], score}
      end
    end
  end
end
return nil
