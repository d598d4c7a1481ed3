-- An entry is one string: its fields in a fixed order, separated by the
-- unit separator (\31), the idempotency key last so that it may contain
-- any byte. A string costs a third of the memory of a hash whose values
-- pass Redis's listpack limit (fingerprints do), and splitting it is
-- cheaper than JSON. The fields other than the key never contain \31
-- (redisstore.go checks them).
--  1 s   state             2 fp  fingerprint      3 rd  rules digest
--  4 oh  owner holder      5 os  owner source     6 fs  first source
--  7 ip  intent part.      8 ifl intent floor     9 rp  result partition
-- 10 ro  result offset    11 ws  window start ms 12 lu  lease until ms
-- 13 ex  window (FAILED: failed_ttl) end ms     14 k  key
local FIELDS = {'s', 'fp', 'rd', 'oh', 'os', 'fs', 'ip', 'ifl', 'rp', 'ro', 'ws', 'lu', 'ex'}
local SEP = '\31'

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function load(name)
  local raw = redis.call('GET', name)
  if not raw then return nil, nil end
  local e, pos = {}, 1
  for i = 1, 13 do
    local j = string.find(raw, SEP, pos, true)
    if not j then return nil, nil end
    e[FIELDS[i]] = string.sub(raw, pos, j - 1)
    pos = j + 1
  end
  e.k = string.sub(raw, pos)
  return e, raw
end

-- PENDING_RETENTION_MS is dedupe.PendingRetention: a PENDING entry is
-- kept that long past its lease, whatever its window (dedupe.RetainUntil).
local PENDING_RETENTION_MS = 86400000

local function retain_until(e)
  local ex = tonumber(e.ex)
  if e.s == 'PENDING' then
    local keep = tonumber(e.lu) + PENDING_RETENTION_MS
    if keep > ex then return keep end
  end
  return ex
end

local function save(name, e)
  local raw = table.concat({e.s, e.fp, e.rd, e.oh, e.os, e.fs, e.ip, e.ifl, e.rp, e.ro, e.ws, e.lu, e.ex, e.k}, SEP)
  redis.call('SET', name, raw, 'PXAT', retain_until(e))
  return raw
end
