--[[
  haze redis store: atomic increment with a TTL set only when the key is created.
    KEYS[1]  the key
    ARGV[1]  the amount to add (may be negative)
    ARGV[2]  TTL in milliseconds, "" for none
  Returns the new value.
]]
local created = redis.call("EXISTS", KEYS[1]) == 0
local value = redis.call("INCRBY", KEYS[1], ARGV[1])
if created and ARGV[2] ~= "" then
  redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return value
