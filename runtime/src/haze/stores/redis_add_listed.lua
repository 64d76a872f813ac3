--[[
  haze redis store: add a key and number it in a listing, atomically (AddsListed).
    KEYS[1]  the key, set only when absent
    KEYS[2]  the listing's counter; the entry is KEYS[2] .. ":" .. n
    ARGV[1]  the key's value (JSON)
    ARGV[2]  the listing entry's value (JSON)
  Returns 1 when the key was added, 0 when it was there already.
]]
if not redis.call("SET", KEYS[1], ARGV[1], "NX") then
  return 0
end
local n = redis.call("INCR", KEYS[2])
redis.call("SET", KEYS[2] .. ":" .. n, ARGV[2])
return 1
