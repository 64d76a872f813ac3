--[[
  haze redis driver: which of the adds whose reply was lost (their connection died
  while Redis ran them, or before) wrote their job. Every add of a queue takes the next
  id of the queue's 'id' counter (INCR), so a job written is among the newest ids: they
  are read from the counter down until every job asked for is found, or a job added
  well before the lost adds is reached (then the others were not written: Redis never
  runs a command of a connection it has closed).
    KEYS[1]   the queue's 'id' counter
    ARGV[1]   the job key prefix ("<prefix>:<queue>:")
    ARGV[2]   a job whose timestamp (ms) is below this was added before the lost adds
    ARGV[3]   how many ids are read, at most
    ARGV[4..] the haze message ids asked for
  Returns {final, found id...}: final is 1 when the ids not found were not written,
  0 when the limit was reached first (not known).
]]
local rcall = redis.call
local wanted = {}
local left = 0
for i = 4, #ARGV do
  if not wanted[ARGV[i]] then
    wanted[ARGV[i]] = true
    left = left + 1
  end
end
local before = tonumber(ARGV[2])
local id = tonumber(rcall("GET", KEYS[1]) or "0")
local last = id - tonumber(ARGV[3])
local out = {1}
while id > 0 and left > 0 do
  if id <= last then
    out[1] = 0
    return out
  end
  local row = rcall("HMGET", ARGV[1] .. id, "data", "timestamp")
  local data, ts = row[1], tonumber(row[2])
  if data then
    local found = string.match(data, '"id":"([^"]*)"')
    if found and wanted[found] then
      local ok, decoded = pcall(cjson.decode, data)
      if ok and type(decoded) == "table" and tostring(decoded["id"]) == found then
        wanted[found] = nil
        left = left - 1
        out[#out + 1] = found
      end
    end
  end
  if ts and ts < before then
    return out
  end
  id = id - 1
end
return out
