--[[
  haze redis store: delete a key only while it holds the owner's value (a lock release).
    KEYS[1]  the key
    ARGV[1]  the owner, JSON-encoded as the store writes values
  Returns 1 when deleted, 0 otherwise.
]]
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0
