--[[
  haze redis driver: find a failed BullMQ job by the haze message id in its data.
    KEYS[i]       the failed set of queue i
    ARGV[1]       the haze message id
    ARGV[i + 1]   the job key prefix of queue i ("<prefix>:<queue>:")
  Returns {i, jobId} for the newest match, or nil.
]]
local rcall = redis.call
local wanted = ARGV[1]
local needle = '"id":"' .. wanted .. '"'
for i, failedKey in ipairs(KEYS) do
  local jobIds = rcall("ZREVRANGE", failedKey, 0, -1)
  for _, jobId in ipairs(jobIds) do
    local data = rcall("HGET", ARGV[i + 1] .. jobId, "data")
    if data and string.find(data, needle, 1, true) then
      local ok, decoded = pcall(cjson.decode, data)
      if ok and type(decoded) == "table" and tostring(decoded["id"]) == wanted then
        return {i, jobId}
      end
    end
  end
end
return nil
