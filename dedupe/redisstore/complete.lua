-- complete: the Lua twin of dedupe.ApplyCompletion, for a batch. Only the
-- owner token that holds a PENDING entry may finish it; anyone else is
-- fenced. Finishing it again the same way is accepted.
--
-- A completion with state PENDING releases the key: its lease ends now
-- and the next holder takes it over at once (dedupe.ApplyCompletion).
--
-- KEYS[i]  the entry of completion i
-- ARGV     dedupe.PendingRetention in ms and "c" to write compact entries
--          ("t": text), then 8 values per completion: key, holder, source, state (SUCCESS,
--          FAILED or PENDING), result partition, result offset, failed ttl
--          ms, keep-at-least ms
-- returns  per completion: "ok", or "fenced:<state>:<holder>@<source>"
-- finish is the common case, without splitting the entry into a table:
-- a PENDING entry owned by holder@source becomes SUCCESS or FAILED. It
-- returns nil when the entry is not that (the general code below decides).
-- The owner is checked by position: fields never contain the separator.
local function finish(name, raw, key, holder, source, st, rp, ro, ttl, keep)
  -- A text entry only, written back as text: a store that writes compact
  -- entries takes the general code, which writes one.
  if COMPACT or st == 'PENDING' or string.find(raw, 'PENDING' .. SEP, 1, true) ~= 1 then return nil end
  local p = 8 -- the separator after the state
  for _ = 1, 2 do p = string.find(raw, SEP, p + 1, true) end -- after fp, rd
  local owner = holder .. SEP .. source .. SEP
  if string.find(raw, owner, p + 1, true) ~= p + 1 then return nil end
  p = p + #owner -- the separator after the owner source
  local at = {}
  for j = 6, 13 do -- fs ip ifl rp ro ws lu ex: the separator after each
    p = string.find(raw, SEP, p + 1, true)
    at[j] = p
  end
  if string.sub(raw, at[13] + 1) ~= key then return nil end
  local ex = tonumber(string.sub(raw, at[12] + 1, at[13] - 1))
  if now >= ex and now >= tonumber(string.sub(raw, at[11] + 1, at[12] - 1)) + RETENTION_MS then return nil end
  if st == 'FAILED' then
    ex = now + tonumber(ttl)
  else
    ex = math.max(ex, now + tonumber(keep))
  end
  local saved = st .. string.sub(raw, 8, at[8]) .. rp .. SEP .. ro .. string.sub(raw, at[10], at[11]) .. '0' .. SEP .. int(ex) .. string.sub(raw, at[13])
  redis.call('SET', name, saved, 'PXAT', ex)
  return 'ok'
end

RETENTION_MS, COMPACT = tonumber(ARGV[1]), ARGV[2] == 'c'
local out = {}
for i = 1, #KEYS do
  local b = 2 + (i - 1) * 8
  local name = KEYS[i]
  local st = ARGV[b + 4]
  local raw = redis.call('GET', name)
  local done = raw and finish(name, raw, ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], st, ARGV[b + 5], ARGV[b + 6], ARGV[b + 7], ARGV[b + 8])
  local e = nil
  if not done then
    local source = ARGV[b + 3]
    e = load(name, {key = ARGV[b + 1], holder = ARGV[b + 2], topic = string.match(source, '^(.*)/[^/]*/[^/]*$')})
  end
  if done then
    out[i] = done
  elseif e == nil or e.k ~= ARGV[b + 1] or now >= retain_until(e) then
    out[i] = 'fenced:'
  elseif st ~= 'PENDING' and e.s == st and e.oh == ARGV[b + 2] and e.os == ARGV[b + 3] and e.rp == ARGV[b + 5] and e.ro == ARGV[b + 6] then
    -- The same completion again: a retry after a timeout whose first
    -- attempt did reach the server. Saved again, unchanged, so that the
    -- WAIT behind this call (replica acknowledgement) covers it: a WAIT
    -- counts this connection's writes, and the first attempt's may have
    -- gone out on another one. A longer keep-at-least (an abandoned
    -- batch, whose records will be read again) is granted.
    if st == 'SUCCESS' then
      e.ex = int(math.max(tonumber(e.ex), now + tonumber(ARGV[b + 8])))
    end
    save(name, e)
    out[i] = 'ok'
  elseif e.s ~= 'PENDING' or e.oh ~= ARGV[b + 2] or e.os ~= ARGV[b + 3] then
    out[i] = 'fenced:' .. e.s .. ':' .. e.oh .. '@' .. e.os
  elseif st == 'PENDING' then
    -- A release: the lease ends now. Saved even when it had ended, so
    -- that the WAIT behind a retried release covers it.
    if now < tonumber(e.lu) then
      e.lu = int(now)
    end
    save(name, e)
    out[i] = 'ok'
  else
    e.s, e.rp, e.ro, e.lu = st, ARGV[b + 5], ARGV[b + 6], '0'
    if st == 'FAILED' then
      e.ex = int(now + tonumber(ARGV[b + 7]))
    else
      e.ex = int(math.max(tonumber(e.ex), now + tonumber(ARGV[b + 8])))
    end
    save(name, e)
    out[i] = 'ok'
  end
end
return out
