-- decide: the Lua twin of dedupe.Apply. One call decides a batch of
-- records in order, each atomically (the whole call is); the window and the
-- lease run on the server's clock. One call per batch, not per record:
-- the cost of a script call dwarfs the cost of one decision.
--
-- KEYS[i]  the entry of record i
-- ARGV     7 values shared by the batch: semantics, window ms, lease ms,
--          holder, rules digest, dedupe.PendingRetention in ms, "c" to
--          write compact entries ("t": text); then 7 per record: key, fingerprint,
--          source, intent partition, intent floor, event time ms ("" for
--          the store clock), final ("0" or "1", plus 2 when the caller
--          checked the first copy under the current rules: "2", "3";
--          or "r" for a renewal)
-- returns  {now ms, then per record: verdict, flags, entry} where verdict
--          is first, replay, conflict, pending, unreadable (a value load
--          does not read, left as it is) or error, and flags is
--          a string of four digits: resumed, rerun, mismatch, rules changed,
--          and entry is "" for a new entry (the caller rebuilds it)
local sem, window, lease, holder, rd = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
RETENTION_MS, COMPACT = tonumber(ARGV[6]), ARGV[7] == 'c'
local out = {int(now)}
local lu, nex = int(now + lease), int(now + window)

local function decide(name, key, fp, source, ip, ifl, event, final)
  local clock = now
  if event ~= '' then clock = tonumber(event) end
  local ctx = {key = key, holder = holder, rd = rd, topic = string.match(source, '^(.*)/[^/]*/[^/]*$')}

  -- final 'r': a renewal (dedupe.DecideRequest.RenewOnly) extends only the
  -- lease its owner holds, and changes nothing else.
  if final == 'r' then
    local e, raw = load(name, ctx)
    if not e and raw then return 'unreadable', '0000', '' end
    if e and e.k == key and e.s == 'PENDING' and e.oh == holder and e.os == source and now < retain_until(e) then
      e.lu = lu
      return 'first', '1000', save(name, e)
    end
    return 'pending', '0000', raw or ''
  end

  -- Most records carry a new key: one SET NX decides them.
  local fresh = encode({s = 'PENDING', fp = fp, rd = rd, oh = holder, os = source, fs = source, ip = ip, ifl = ifl,
    rp = '-1', ro = '-1', ws = int(clock), lu = lu, ex = nex, k = key})
  local keep = math.max(now + window, now + lease + RETENTION_MS)
  if redis.call('SET', name, fresh, 'NX', 'PXAT', keep) then
    return 'first', '0000', ''
  end

  local e, raw = load(name, ctx)
  if not e and raw then return 'unreadable', '0000', '' end
  if e then
    if e.k ~= key then
      return 'error', '0000', 'entry ' .. name .. ' holds another key'
    end
    -- dedupe.expired: PENDING lives until retain_until, FAILED until ex,
    -- SUCCESS until its window ends, except for its own record.
    if now >= retain_until(e) then
      e = nil
    -- clock - ws, not ws + window: two event times beyond 2^53 ms are
    -- doubles whose difference is exact, where their sum with the window
    -- would be rounded (dedupe.expired compares exactly).
    elseif e.s == 'SUCCESS' and clock - tonumber(e.ws) >= window and e.os ~= source and e.fs ~= source then
      e = nil
    end
  end
  if e == nil then
    redis.call('SET', name, fresh, 'PXAT', keep)
    return 'first', '0000', ''
  end

  local changed = e.rd ~= rd
  local mismatch = e.fp ~= fp
  local same = (not mismatch) or changed or sem ~= 'strict'
  -- dedupe.DecideRequest.RulesChecked: a rerun or a takeover acts on the
  -- key, and needs the same request under the current rules.
  local checked = final == '2' or final == '3'
  local same_to_act = (not mismatch) or checked or sem ~= 'strict'
  local is_final = final == '1' or final == '3'
  local tail = (mismatch and '1' or '0') .. (changed and '1' or '0')
  local judge = 'conflict'
  if same then judge = 'replay' end

  if e.s == 'SUCCESS' then
    return judge, '00' .. tail, raw
  end
  if e.s == 'FAILED' then
    -- The record whose own decision failed, delivered again: a replay.
    if e.os == source or e.fs == source then return 'replay', '00' .. tail, raw end
    if not same_to_act then return 'conflict', '00' .. tail, raw end
    e.s, e.fp, e.rd, e.oh, e.os = 'PENDING', fp, rd, holder, source
    e.ip, e.ifl, e.rp, e.ro = ip, ifl, '-1', '-1'
    e.lu, e.ws, e.ex = lu, int(clock), nex
    return 'first', '01' .. tail, save(name, e)
  end

  -- PENDING
  if e.oh == holder and e.os == source then
    e.lu = lu
    return 'first', '10' .. tail, save(name, e)
  end
  if e.os == source then
    -- The owner's own record at another holder: never a replay; it waits
    -- for the lease, Final or not, then takes the key over below.
    if now < tonumber(e.lu) then return 'pending', '00' .. tail, raw end
  elseif e.oh == holder then
    return judge, '00' .. tail, raw
  elseif now < tonumber(e.lu) then
    if not is_final then return 'pending', '00' .. tail, raw end
    return judge, '00' .. tail, raw
  end
  if e.os ~= source and not same_to_act then
    return 'conflict', '00' .. tail, raw
  end
  e.oh, e.os, e.lu = holder, source, lu
  if e.ifl == '-1' then e.ip, e.ifl = ip, ifl end
  return 'first', '10' .. tail, save(name, e)
end

for i = 1, #KEYS do
  local b = 7 + (i - 1) * 7
  local verdict, flags, entry = decide(KEYS[i], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4],
    ARGV[b + 5], ARGV[b + 6], ARGV[b + 7])
  out[#out + 1] = verdict
  out[#out + 1] = flags
  out[#out + 1] = entry
end
return out
