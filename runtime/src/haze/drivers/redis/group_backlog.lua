--[[
  haze: the queued jobs of each tenant group: the first ARGV[2] jobs of the prioritized
  set (where grouped jobs wait, in turn order) and of the delayed set, counted by the
  group in their hash ("hzg"; add_group_job.lua writes it).

    KEYS[1] 'prioritized'  KEYS[2] 'delayed'
    ARGV[1] key prefix  ARGV[2] most jobs looked at per set
  Output: group, count, group, count, ...
]]
local rcall = redis.call
local counts = {}
local names = {}
for i = 1, 2 do
  for _, jobId in ipairs(rcall("ZRANGE", KEYS[i], 0, tonumber(ARGV[2]) - 1)) do
    local group = rcall("HGET", ARGV[1] .. jobId, "hzg")
    if group then
      if not counts[group] then
        counts[group] = 0
        names[#names + 1] = group
      end
      counts[group] = counts[group] + 1
    end
  end
end
local out = {}
for _, group in ipairs(names) do
  out[#out + 1] = group
  out[#out + 1] = counts[group]
end
return out
