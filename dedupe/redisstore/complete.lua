-- complete: the Lua twin of dedupe.ApplyCompletion, for a batch. Only the
-- owner token that holds a PENDING entry may finish it; anyone else is
-- fenced. Finishing it again the same way is accepted.
--
-- A completion with state PENDING releases the key: its lease ends now
-- and the next holder takes it over at once (dedupe.ApplyCompletion).
--
-- KEYS[i]  the entry of completion i
-- ARGV     8 values per completion: key, holder, source, state (SUCCESS,
--          FAILED or PENDING), result partition, result offset, failed ttl
--          ms, keep-at-least ms
-- returns  per completion: "ok", or "fenced:<state>:<holder>@<source>"
local out = {}
for i = 1, #KEYS do
  local b = (i - 1) * 8
  local name = KEYS[i]
  local st = ARGV[b + 4]
  local e = load(name)
  if e == nil or e.k ~= ARGV[b + 1] or now >= retain_until(e) then
    out[i] = 'fenced:'
  elseif st ~= 'PENDING' and e.s == st and e.oh == ARGV[b + 2] and e.os == ARGV[b + 3] and e.rp == ARGV[b + 5] and e.ro == ARGV[b + 6] then
    -- The same completion again: a retry after a timeout whose first
    -- attempt did reach the server.
    out[i] = 'ok'
  elseif e.s ~= 'PENDING' or e.oh ~= ARGV[b + 2] or e.os ~= ARGV[b + 3] then
    out[i] = 'fenced:' .. e.s .. ':' .. e.oh .. '@' .. e.os
  elseif st == 'PENDING' then
    if now < tonumber(e.lu) then
      e.lu = tostring(now)
      save(name, e)
    end
    out[i] = 'ok'
  else
    e.s, e.rp, e.ro, e.lu = st, ARGV[b + 5], ARGV[b + 6], '0'
    if st == 'FAILED' then
      e.ex = tostring(now + tonumber(ARGV[b + 7]))
    else
      e.ex = tostring(math.max(tonumber(e.ex), now + tonumber(ARGV[b + 8])))
    end
    save(name, e)
    out[i] = 'ok'
  end
end
return out
