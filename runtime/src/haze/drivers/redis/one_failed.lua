--[[
  haze redis driver: one failed record per haze message id. Run after a job's failure
  is recorded (fail(), record()): the record the id had before, when it is another
  BullMQ job still in a failed set with that id in its data (a copy of the message
  queued twice, a failure recorded beside BullMQ's), is deleted as forget_failed.lua
  deletes one, and the index points at the new record.
    KEYS[1]   the index: haze message id -> "<queue>:<job id>" of its failed record
    ARGV[1]   the haze message id
    ARGV[2]   the connection's key prefix and a colon ("<prefix>:"); queue names hold
              no colon, so "<prefix>:<queue>:failed" and "<prefix>:<queue>:<job id>"
              are the keys of a queue's failed set and of a job
    ARGV[3]   the queue of the new record
    ARGV[4]   the BullMQ job id of the new record
  Returns 1 when an older record was deleted, else 0. An index entry whose record is
  gone (flushed, trimmed by BullMQ) is only overwritten: every entry is checked.
]]
local rcall = redis.call
local id, prefix, queue, jobId = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if not rcall("ZSCORE", prefix .. queue .. ":failed", jobId) then
  return 0
end
local new = queue .. ":" .. jobId
local old = rcall("HGET", KEYS[1], id)
rcall("HSET", KEYS[1], id, new)
if not old or old == new then
  return 0
end
local sep = string.find(old, ":", 1, true)
if not sep then
  return 0
end
local oldQueue, oldId = string.sub(old, 1, sep - 1), string.sub(old, sep + 1)
local failedKey, jobKey = prefix .. oldQueue .. ":failed", prefix .. oldQueue .. ":" .. oldId
if not rcall("ZSCORE", failedKey, oldId) then
  return 0
end
local data = rcall("HGET", jobKey, "data")
if not data or not string.find(data, id, 1, true) then
  return 0
end
local ok, decoded = pcall(cjson.decode, data)
if not ok or type(decoded) ~= "table" or tostring(decoded["id"]) ~= id then
  return 0
end
rcall("ZREM", failedKey, oldId)
rcall("DEL", jobKey, jobKey .. ":logs")
return 1
