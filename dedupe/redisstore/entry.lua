-- An entry is one string in one of two formats, told apart by its first
-- byte (entry.go and compact.go are their Go twins; both must write the
-- same bytes):
--
-- text: its fields in a fixed order, separated by the unit separator
-- (\31), the idempotency key last so that it may contain any byte. The
-- fields other than the key never contain \31 (entry.go checks them).
--  1 s   state             2 fp  fingerprint      3 rd  rules digest
--  4 oh  owner holder      5 os  owner source     6 fs  first source
--  7 ip  intent part.      8 ifl intent floor     9 rp  result partition
-- 10 ro  result offset    11 ws  window start ms 12 lu  lease until ms
-- 13 ex  window (FAILED: failed_ttl) end ms     14 k  key
--
-- compact: byte 1 the state (1 PENDING, 2 SUCCESS, 3 FAILED), byte 2
-- flags, then binary fields (compact.go has the layout). load() reads it
-- into the same table of text fields, given back from what the caller
-- knows (ctx: the holder, the rules digest, the record's source), so
-- that the scripts' rules read one shape.
--
-- A script sets RETENTION_MS (dedupe.PendingRetention) and COMPACT (write
-- compact entries) from its arguments before it loads or saves.
local FIELDS = {'s', 'fp', 'rd', 'oh', 'os', 'fs', 'ip', 'ifl', 'rp', 'ro', 'ws', 'lu', 'ex'}
local SEP = '\31'
local RETENTION_MS, COMPACT = nil, false

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local STATES = {'PENDING', 'SUCCESS', 'FAILED'}
local STATE_BYTE = {PENDING = 1, SUCCESS = 2, FAILED = 3}
local F_FP, F_RD, F_HOLDER, F_SRC, F_FIRST_SAME, F_FIRST_NUM, F_LEASE, F_KEY = 1, 2, 4, 8, 16, 32, 64, 128

local function hex(b)
  return (string.gsub(b, '.', function(c) return string.format('%02x', string.byte(c)) end))
end
local function unhex(h)
  return (string.gsub(h, '..', function(c) return string.char(tonumber(c, 16)) end))
end
local function hash4(s) return string.sub(redis.sha1hex(s), 1, 8) end
local function int(n) return string.format('%.0f', n) end
local function has(flags, f) return flags % (2 * f) >= f end

-- A reader of the compact fields; r.pos moves on, r.bad is set on an
-- entry that does not decode.
local function reader(raw, pos) return {raw = raw, pos = pos, bad = false} end
local function take(r, n)
  if r.bad or n < 0 or r.pos + n - 1 > #r.raw then r.bad = true return '' end
  local s = string.sub(r.raw, r.pos, r.pos + n - 1)
  r.pos = r.pos + n
  return s
end
local function uvarint(r)
  local v, mul = 0, 1
  for i = r.pos, r.pos + 9 do
    local b = string.byte(r.raw, i)
    if not b or r.bad then r.bad = true return 0 end
    if b < 128 then
      v = v + b * mul
      if v >= 9007199254740992 then r.bad = true return 0 end
      r.pos = i + 1
      return v
    end
    v = v + (b - 128) * mul
    mul = mul * 128
  end
  r.bad = true
  return 0
end
local function zigzag(r)
  local z = uvarint(r)
  if z % 2 == 0 then return z / 2 end
  return -(z + 1) / 2
end
local function text(r) return take(r, uvarint(r)) end
local function int32(r)
  local v = zigzag(r)
  if v < -2147483648 or v > 2147483647 then r.bad = true end
  return v
end
local function is_hash(s) return #s == 9 and string.find(s, '^#[0-9a-f]+$') ~= nil end
-- int64_text: s is an int64 as strconv.FormatInt writes it.
local function int64_text(s)
  if s == '0' then return true end
  local digits = string.match(s, '^%-?([1-9]%d*)$')
  if not digits or #digits > 19 then return false end
  if #digits < 19 then return true end
  if string.sub(s, 1, 1) == '-' then return digits <= '9223372036854775808' end
  return digits <= '9223372036854775807'
end
local function decimal(s) return #s <= 15 and (s == '0' or string.find(s, '^[1-9][0-9]*$') ~= nil) end
local function is_digest(s, n)
  return (#s == 71 or #s == 7 + n) and string.find(s, '^sha256:[0-9a-f]+$') ~= nil
end
-- split_source is compact.go's splitSource: topic, partition, offset of
-- a source written as numbers, or nil.
local function split_source(s)
  local topic, p, o = string.match(s, '^(.*)/([^/]*)/([^/]*)$')
  if topic and topic ~= '' and (string.find(topic, '^[%w%._%-]+$') or is_hash(topic)) and
      decimal(p) and decimal(o) and tonumber(p) <= 2147483647 and tonumber(o) < 1e15 then
    return topic, tonumber(p), tonumber(o)
  end
  return nil
end
local function topic_of(h, ctx)
  if ctx.topic and ctx.topic ~= '' and hash4(ctx.topic) == h then return ctx.topic end
  return '#' .. h
end
local function source(r, num, ctx)
  if not num then
    local s = text(r)
    if split_source(s) then r.bad = true end
    return s
  end
  local h = hex(take(r, 4))
  local p = uvarint(r)
  local o = uvarint(r)
  if p > 2147483647 or o >= 1e15 then r.bad = true end
  return topic_of(h, ctx) .. '/' .. int(p) .. '/' .. int(o)
end

-- decode_compact reads a compact entry into text fields; nil if it does
-- not decode. ctx: key, holder, rd, topic (any may be nil).
local function decode_compact(name, raw, ctx)
  local b0 = string.byte(raw, 1)
  local st = STATES[b0 % 4]
  local flags = string.byte(raw, 2)
  if not st or not flags or b0 >= 32 then return nil end
  -- The intent's flags (compact.go: compactIntent, compactIntentRel,
  -- compactFloorText).
  local kept, rel, ftext = has(b0, 4), has(b0, 8), has(b0, 16)
  if st == 'PENDING' and kept or st ~= 'PENDING' and b0 >= 4 and not kept or rel and ftext then return nil end
  local r = reader(raw, 3)
  local e = {s = st}
  -- Each field in the one form encode_compact writes it in (compact.go).
  if has(flags, F_FP) then
    e.fp = 'sha256:' .. hex(take(r, 32))
  else
    e.fp = text(r)
    if is_digest(e.fp, 64) then return nil end
  end
  if has(flags, F_RD) then
    e.rd = 'sha256:' .. hex(take(r, 8))
    if ctx.rd and #ctx.rd == 71 and string.sub(ctx.rd, 1, 23) == e.rd then e.rd = ctx.rd end
  else
    e.rd = text(r)
    if is_digest(e.rd, 16) then return nil end
  end
  if has(flags, F_HOLDER) ~= (st ~= 'PENDING') then return nil end
  if has(flags, F_HOLDER) then
    local h = hex(take(r, 4))
    if ctx.holder and ctx.holder ~= '' and hash4(ctx.holder) == h then e.oh = ctx.holder else e.oh = '#' .. h end
  else
    e.oh = text(r)
  end
  e.os = source(r, has(flags, F_SRC), ctx)
  if has(flags, F_FIRST_SAME) then
    if has(flags, F_FIRST_NUM) then return nil end
    e.fs = e.os
  else
    e.fs = source(r, has(flags, F_FIRST_NUM), ctx)
    if e.fs == e.os then return nil end
  end
  local ro
  e.rp, ro = int(int32(r)), zigzag(r)
  e.ro = int(ro)
  e.ip, e.ifl = '-1', '-1'
  if st == 'PENDING' or kept then
    if rel then
      e.ip, e.ifl = e.rp, int(ro - zigzag(r))
    else
      e.ip = int(int32(r))
      if ftext then
        e.ifl = text(r)
        if not int64_text(e.ifl) then return nil end
      else
        e.ifl = int(zigzag(r))
      end
    end
  end
  local ws = zigzag(r)
  e.ws = int(ws)
  e.ex = int(ws + zigzag(r))
  e.lu = '0'
  if has(flags, F_LEASE) then e.lu = int(ws + zigzag(r)) end
  if has(flags, F_KEY) then
    e.k = string.sub(raw, r.pos)
    r.pos = #raw + 1
    if #e.k <= 64 then return nil end
  else
    local n = uvarint(r)
    if n > 64 or n > #name - 1 then return nil end
    e.k = string.sub(name, #name - n, #name - 1)
  end
  if r.bad or r.pos ~= #raw + 1 then return nil end
  return e
end

-- load reads the entry stored at name: (entry, raw), or (nil, nil) when
-- there is none, or (nil, raw) when the value stored there is no entry this
-- release reads (a later release's format, or not idemstream's). Such a
-- value is never written over: decide answers the verdict 'unreadable'.
local function load(name, ctx)
  local raw = redis.call('GET', name)
  if not raw then return nil, nil end
  if #raw > 0 and string.byte(raw, 1) < 32 then
    local e = decode_compact(name, raw, ctx or {})
    if not e then return nil, raw end
    e.compact = true
    return e, raw
  end
  local e, pos = {}, 1
  for i = 1, 13 do
    local j = string.find(raw, SEP, pos, true)
    if not j then return nil, raw end
    e[FIELDS[i]] = string.sub(raw, pos, j - 1)
    pos = j + 1
  end
  e.k = string.sub(raw, pos)
  -- A state this release does not know: taken for PENDING, the key would
  -- be taken over and the value written over (entry.go, decodeText).
  if e.s ~= 'PENDING' and e.s ~= 'SUCCESS' and e.s ~= 'FAILED' then return nil, raw end
  return e, raw
end

local function retain_until(e)
  local ex = tonumber(e.ex)
  if e.s == 'PENDING' then
    local keep = tonumber(e.lu) + RETENTION_MS
    if keep > ex then return keep end
  end
  return ex
end

-- The writers of the compact fields, into a table of strings.
local function put_uvarint(out, v)
  while v >= 128 do
    out[#out + 1] = string.char(v % 128 + 128)
    v = math.floor(v / 128)
  end
  out[#out + 1] = string.char(v)
end
local function put_zigzag(out, v)
  if v >= 0 then put_uvarint(out, 2 * v) else put_uvarint(out, -2 * v - 1) end
end
local function put_text(out, s)
  put_uvarint(out, #s)
  out[#out + 1] = s
end
local function put_hash(out, s)
  if is_hash(s) then out[#out + 1] = unhex(string.sub(s, 2)) else out[#out + 1] = unhex(hash4(s)) end
end
-- put_source writes a source as numbers where compact.go's splitSource
-- would, and says whether it did.
local function put_source(out, s)
  local topic, p, o = split_source(s)
  if topic then
    put_hash(out, topic)
    put_uvarint(out, p)
    put_uvarint(out, o)
    return true
  end
  put_text(out, s)
  return false
end

-- in_range is compact.go's inCompactRange: within 2^52.
local function in_range(v) return v > -4503599627370496 and v < 4503599627370496 end

-- compactable is compact.go's: every number within 2^52 (but an
-- intent's floor, written as text beyond), or the entry is written as
-- text.
local function compactable(e)
  local ws, lease = tonumber(e.ws), 0
  if tonumber(e.lu) > 0 then lease = tonumber(e.lu) - ws end
  for _, v in ipairs({tonumber(e.ro), ws, tonumber(e.ex) - ws, lease}) do
    if not in_range(v) then return false end
  end
  return true
end

local function encode_compact(e)
  local out, flags = {'', ''}, 0
  if is_digest(e.fp, 64) then
    flags = flags + F_FP
    out[#out + 1] = unhex(string.sub(e.fp, 8))
  else
    put_text(out, e.fp)
  end
  if is_digest(e.rd, 16) then
    flags = flags + F_RD
    out[#out + 1] = unhex(string.sub(e.rd, 8, 23))
  else
    put_text(out, e.rd)
  end
  if e.s ~= 'PENDING' then
    flags = flags + F_HOLDER
    put_hash(out, e.oh)
  else
    put_text(out, e.oh)
  end
  if put_source(out, e.os) then flags = flags + F_SRC end
  if e.fs == e.os then
    flags = flags + F_FIRST_SAME
  elseif put_source(out, e.fs) then
    flags = flags + F_FIRST_NUM
  end
  put_zigzag(out, tonumber(e.rp))
  put_zigzag(out, tonumber(e.ro))
  local b0 = STATE_BYTE[e.s]
  local finished = e.s ~= 'PENDING'
  if not finished or e.ip ~= '-1' or e.ifl ~= '-1' then
    if finished then b0 = b0 + 4 end
    local floor, ro = tonumber(e.ifl), tonumber(e.ro)
    if finished and e.ip == e.rp and in_range(floor) and in_range(ro - floor) and e.ifl == int(floor) then
      b0 = b0 + 8
      put_zigzag(out, ro - floor)
    elseif in_range(floor) and e.ifl == int(floor) then
      put_zigzag(out, tonumber(e.ip))
      put_zigzag(out, floor)
    else
      b0 = b0 + 16
      put_zigzag(out, tonumber(e.ip))
      put_text(out, e.ifl)
    end
  end
  out[1] = string.char(b0)
  local ws = tonumber(e.ws)
  put_zigzag(out, ws)
  put_zigzag(out, tonumber(e.ex) - ws)
  if tonumber(e.lu) > 0 then
    flags = flags + F_LEASE
    put_zigzag(out, tonumber(e.lu) - ws)
  end
  if #e.k > 64 then
    flags = flags + F_KEY
    out[#out + 1] = e.k
  else
    put_uvarint(out, #e.k)
  end
  out[2] = string.char(flags)
  return table.concat(out)
end

-- unresolved is entry.go's: e holds a hash its reader did not resolve,
-- which a text entry would keep as it reads.
local function unresolved_source(s)
  local topic = split_source(s)
  return topic ~= nil and is_hash(topic)
end
local function unresolved(e)
  return is_hash(e.oh) or #e.rd == 23 and is_digest(e.rd, 16) or unresolved_source(e.os) or unresolved_source(e.fs)
end

-- encode writes an entry in the store's format; an entry read compact
-- stays compact while it holds a hash its reader did not resolve.
local function encode(e)
  if (COMPACT or e.compact and unresolved(e)) and compactable(e) then return encode_compact(e) end
  return table.concat({e.s, e.fp, e.rd, e.oh, e.os, e.fs, e.ip, e.ifl, e.rp, e.ro, e.ws, e.lu, e.ex, e.k}, SEP)
end

local function save(name, e)
  local raw = encode(e)
  redis.call('SET', name, raw, 'PXAT', retain_until(e))
  return raw
end
