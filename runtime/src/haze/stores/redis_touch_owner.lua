--[[
  haze redis store: renew a lease: set a key's expiry only while it holds the owner's value.
    KEYS[1]  the key
    ARGV[1]  the owner, JSON-encoded as the store writes values
    ARGV[2]  the new time to live, in milliseconds
  Returns 1 when renewed, 0 when the key is absent or held by another owner.
]]
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return 0
