-- complete: the Lua twin of dedupe.ApplyCompletion, for a batch. Only the
-- owner token that holds a PENDING entry may finish it; anyone else is
-- fenced. Finishing it again the same way is accepted.
--
-- KEYS[i]  the entry of completion i
-- ARGV     7 values per completion: key, holder, source, state (SUCCESS or
--          FAILED), result partition, result offset, failed ttl ms
-- returns  per completion: "ok", or "fenced:<state>:<holder>@<source>"
local out = {}
for i = 1, #KEYS do
  local b = (i - 1) * 7
  local name = KEYS[i]
  local e = load(name)
  if e == nil or e.k ~= ARGV[b + 1] or now >= tonumber(e.ex) then
    out[i] = 'fenced:'
  elseif e.s == ARGV[b + 4] and e.oh == ARGV[b + 2] and e.os == ARGV[b + 3] and e.rp == ARGV[b + 5] and e.ro == ARGV[b + 6] then
    -- The same completion again: a retry after a timeout whose first
    -- attempt did reach the server.
    out[i] = 'ok'
  elseif e.s ~= 'PENDING' or e.oh ~= ARGV[b + 2] or e.os ~= ARGV[b + 3] then
    out[i] = 'fenced:' .. e.s .. ':' .. e.oh .. '@' .. e.os
  else
    e.s, e.rp, e.ro, e.lu = ARGV[b + 4], ARGV[b + 5], ARGV[b + 6], '0'
    if ARGV[b + 4] == 'FAILED' then
      e.ex = tostring(now + tonumber(ARGV[b + 7]))
    end
    save(name, e)
    out[i] = 'ok'
  end
end
return out
