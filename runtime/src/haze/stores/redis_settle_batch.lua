--[[
  haze redis store: count one job of a batch, once, atomically (Store.settle_batch_job).
    KEYS[1]  <batch>:done:<job>      the per-job marker
    KEYS[2]  <batch>:processed       KEYS[3]  <batch>:failed
    KEYS[4]  <batch>:pending         KEYS[5]  <batch>:cancelled
    KEYS[6]  <batch>:recovered       KEYS[7]  <batch>:recovered:<job>
    ARGV[1]  the outcome, JSON-encoded ("done", "failed", "skipped")
    ARGV[2]  how many jobs to count
    ARGV[3]  TTL in milliseconds for keys created here, "" for none
    ARGV[4]  "1" to set <batch>:cancelled when a failure is counted
    ARGV[5]  the cancel time, JSON-encoded
    ARGV[6]  <batch>:failed: (the failed job list; the n-th entry is ARGV[6] .. n)
    ARGV[7]  the job id, JSON-encoded
    ARGV[8]  keep: list the first ARGV[8] jobs counted (KEYS[8] counts them; the n-th
             id goes to <batch>:jobs:n, built like the failed list's keys)
    KEYS[8]  <batch>:jobs
  Returns {1 if counted here else 0, pending after, the outcome counted (JSON)}.
]]
local ttl = ARGV[3]

local function incr(key, by)
  local created = redis.call("EXISTS", key) == 0
  local value = redis.call("INCRBY", key, by)
  if created and ttl ~= "" then
    redis.call("PEXPIRE", key, ttl)
  end
  return value
end

local function set(key, value, nx)
  if ttl ~= "" then
    if nx then return redis.call("SET", key, value, "NX", "PX", ttl) end
    return redis.call("SET", key, value, "PX", ttl)
  end
  if nx then return redis.call("SET", key, value, "NX") end
  return redis.call("SET", key, value)
end

local count = tonumber(ARGV[2])
if set(KEYS[1], ARGV[1], true) then
  if ARGV[1] == '"failed"' then
    local n = incr(KEYS[3], count)
    set(ARGV[6] .. n, ARGV[7], false)
    if ARGV[4] == "1" then
      set(KEYS[5], ARGV[5], true)
    end
  else
    incr(KEYS[2], count)
  end
  local keep = tonumber(ARGV[8] or "0")
  if keep > 0 then
    local n = incr(KEYS[8], 1)
    if n <= keep then
      set(KEYS[8] .. ":" .. n, ARGV[7], false)
    end
  end
  return {1, incr(KEYS[4], -count), ARGV[1]}
end

local first = redis.call("GET", KEYS[1])
if ARGV[1] == '"done"' and first == '"failed"' and set(KEYS[7], "1", true) then
  incr(KEYS[6], 1)
  incr(KEYS[2], 1)
end
return {0, tonumber(redis.call("GET", KEYS[4]) or "0"), first}
