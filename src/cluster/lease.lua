-- shmsched cluster lease script (revision 2): one call renews (or
-- registers) one host's block lease of a cluster-wide budget, in
-- O(log hosts) Redis work whatever the number of hosts.
--
-- KEYS (one hash tag, so Redis Cluster and Valkey keep them in one slot):
--   KEYS[1] = {shmsched:BUDGET}:meta   hash: epoch, learn_until, capacity,
--             reserve, token (the fencing counter) and the aggregates below
--   KEYS[2] = {shmsched:BUDGET}:hosts  hash: host id -> its record
--   KEYS[3] = {shmsched:BUDGET}:dl     sorted set: host id by deadline
--   KEYS[3+b] = {shmsched:BUDGET}:band:b  sorted set, one per priority
--             band b (highest first): the hosts with a want in band b, by
--             their saturation level r = want / weight (ties by host id, as
--             Redis orders equal scores)
-- A record is "token grant has safe deadline weight w1,...,wB seq target":
-- the host's fencing token, the units last granted, the units it last
-- reported it has (what it may hold now), its safe capacity, its deadline
-- (ms, Redis time), its weight, its wants per band, the sequence number of
-- the last request accepted and its last water-filling target.
--
-- AGGREGATES (meta fields, kept exact by every change): held = Σ max(grant,
-- has), safe = Σ safe, tsum = Σ targets; per band b one field 'b'..b of
-- seven numbers "w u q n c sw su": Σ wants, Σ weights, Σ weight², hosts
-- with a want in b, and the level boundary c, sw, su: the first c hosts of
-- the band's sorted set are taken as saturated (they get their whole want);
-- sw, su are their wants' and weights' sums.
--
-- Units: capacity C minus the safe reserve S is the pool P that is leased.
-- Each host's safe capacity lies outside the pool (the live hosts' safe
-- capacities must fit in S), so a host's ceiling is safe + grant while
-- leased and safe once its lease lapses.
--
-- Time comes only from TIME, here: hosts' clocks may differ.
--
-- A renewal:
--  1. EPOCH. The meta hash missing means Redis lost its state or the
--     budget is new: a new epoch (every key cleared, the token counter past
--     any older token) in LEARNING MODE for one TTL. A capacity or reserve
--     that differs from the stored one is refused (status 3).
--  2. EXPIRY. At most 64 records whose deadline has passed are dropped
--     (the oldest first, from the deadline set); their units return to the
--     pool. Until it is dropped an expired record still counts as holding:
--     the safe side.
--  3. FENCING AND SEQUENCING. Token 0 registers (a new token by HINCRBY,
--     replacing any record of that host); a nonzero token must equal the
--     record's, else the renewal is refused (status 2: stale) and the agent
--     registers again. Every request carries a sequence number that grows
--     per request of a client; one not above the record's last accepted
--     one is refused (status 6, {6, last seq}): a renewal delayed in the
--     network that arrives after a later one can never overwrite it.
--  4. WATER-FILLING, incrementally. Bands are served highest first: a band
--     whose total want fits in what is left is met in full; the first one
--     that does not is shared by weight at the water level L such that
--     Σ min(want, weight·L) = what is left (the later bands get nothing).
--     The level comes from the band's boundary: L = (left - sw) / (u - su);
--     the boundary moves by at most 32 hosts per call (a host whose r is at
--     most L goes in, the last one in with r above L goes out). Every
--     move raises L, and L never exceeds the exact level, so a boundary
--     still moving only gives the partial band's hosts less. Whole units:
--     where the partial band's hosts share one weight, its unsaturated
--     hosts, in the band's order, get floor((j+1)s) - floor(js) for
--     position j and share s (they add up to what is left, each within one
--     unit of s); with mixed weights, floor(exact) plus one unit while
--     Σ targets leaves one.
--  5. GRANT. min(target, P - Σ over the other hosts of max(grant, has)).
--     A host being shrunk keeps its holders until they release (its `has`
--     reports show it), so Σ max(grant, has) never exceeds P. ACKNOWLEDGING:
--     every request carries `ack`, the sequence number of the last reply its
--     client read. The client reads replies in order on one connection and
--     drops the connection on any error, and the agent never has two
--     requests in flight, so a request whose ack is below the record's last
--     accepted seq proves that reply will never be read: its grant was not
--     learned. Such a host is granted at most what it reports it has, so a
--     grant it did not learn is reclaimed at its next request (within one
--     renew period R), not credited for as long as its requests arrive. In
--     learning mode the grant is what the host reports it has.
--  6. Stores the record with deadline now + TTL; every key expires if no
--     host renews for a long while.
--
-- COST: steady renewals (wants unchanged) are a fixed number of O(1) or
-- O(log hosts) calls; a change of wants moves the host in its bands'
-- sorted sets (O(log hosts) each; a want that stays above 0 is one ZADD
-- updating the score, and the host's rank from it is reused by the
-- water-filling); boundary moves and expiries are bounded per call (32 and
-- 64, each O(log hosts); one ZRANGE reads both neighbours of the boundary).
-- Only 'peek' and the rebuild after a corrupt record read every record.
-- A renewal with a new want is 12 Redis commands, a small part of the
-- call's Redis time: most is this script's Lua, so the per-call Lua is
-- kept small. No tables of field names are built per call, a record is one
-- pattern match (a boundary move matches only the weight and one want),
-- whole numbers are written with '%d' (read back exactly, several times
-- cheaper than '%.17g') and passed to redis.call as text (a Lua number
-- would be formatted with '%.14g'), and only changed meta fields are
-- written. The formats are revision 2's as they were: older builds of
-- revision 2 and this one can share a budget.
--
-- Ops: ARGV[1] = 'renew', 'leave' (a renewal with no wants that deletes
-- the record once the host holds nothing from the pool) or 'peek'.
-- ARGV (renew/leave): 2 host, 3 token, 4 capacity, 5 reserve, 6 weight,
--   7 has, 8 safe, 9 ttl_ms, 10 wants (comma separated, one per band),
--   11 seq, 12 ack
-- Reply (renew/leave): {status, grant, deadline_ms, token, mode, now_ms,
--   target, Σ max(grant, has) over hosts, hosts, seq}
--   status 1 ok, 2 stale token, 3 capacity/reserve mismatch ({3, stored
--   capacity, stored reserve}), 4 safe capacities exceed the reserve ({4,
--   sum, reserve}), 5 bad argument ({5, argument index}), 6 out of sequence
--   ({6, last accepted seq}); mode 1 normal, 2 learning.
-- Reply (peek): {now_ms, epoch, learn_until, capacity, reserve,
--   host1, record1, host2, record2, ...} (live records only; epoch 0 if
--   there is no state). Peek reads every record: O(hosts).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op = ARGV[1]
local META, HOSTS, DL = KEYS[1], KEYS[2], KEYS[3]
local NB = #KEYS - 3
local EXPIRE_PER_CALL = '64' -- (text: a redis.call argument)
local MOVES_PER_CALL = 32
local EPS = 1e-9
local WANTS_FMT = string.rep('%d,', NB - 1) .. '%d'

-- Parsing records is much of a call's Lua time: one pattern match takes a
-- record with up to 7 wants (the Rust client's bands) and single spaces
-- (as encode writes it) apart, wants and all; other records take the
-- general path (any whitespace, any number of wants).
local REC7 = '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+) ([^ ,]+),?([^ ,]*),?' ..
  '([^ ,]*),?([^ ,]*),?([^ ,]*),?([^ ,]*),?([^ ,]*) (%S+) (%S+)$'
local REC = '^%s*(%S+)%s+(%S+)%s+(%S+)%s+(%S+)%s+(%S+)%s+(%S+)%s+(%S+)%s+(%S+)%s+' ..
  '(%S+)%s*$'
local function parse(rec)
  if not rec then return nil end
  local a, b, c, d, e, f, w1, w2, w3, w4, w5, w6, w7, h, i = string.match(rec, REC7)
  local wants
  if a then
    local ws = {w1, w2, w3, w4, w5, w6, w7}
    wants = {}
    local n = 0
    for k = 1, 7 do
      local w = ws[k]
      if w ~= '' then
        -- An empty want before this one ("1,,2"): the general path.
        if n < k - 1 then a = nil break end
        local v = tonumber(w)
        if not v then return nil end
        n = k
        wants[k] = v
      end
    end
    if a and n > NB then return nil end
  end
  if not a then
    local ws
    a, b, c, d, e, f, ws, h, i = string.match(rec, REC)
    if not a then return nil end
    wants = {}
    local k = 0
    for w in string.gmatch(ws, '[^,]+') do
      local v = tonumber(w)
      if not v then return nil end
      k = k + 1
      wants[k] = v
    end
    if k > NB then return nil end
  end
  local r = {
    token = tonumber(a), grant = tonumber(b), has = tonumber(c),
    safe = tonumber(d), deadline = tonumber(e), weight = tonumber(f),
    seq = tonumber(h), target = tonumber(i), wants = wants
  }
  if not (r.token and r.grant and r.has and r.safe and r.deadline and r.weight
      and r.seq and r.target) or r.weight <= 0 then
    return nil
  end
  return r
end

-- A record's weight and its want in band b, for a boundary move (these two
-- fields only: a quarter of parse's cost). nil for a record without a
-- positive weight, with a want that is not a number or with more wants than
-- bands; the other fields are checked when the record's own renewal or
-- expiry parses it.
local LIGHT = '^%s*%S+%s+%S+%s+%S+%s+%S+%s+%S+%s+(%S+)%s+(%S+)%s+%S+%s+%S+%s*$'
local function weight_want(rec, b)
  if not rec then return nil end
  local wt, ws = string.match(rec, LIGHT)
  local u = tonumber(wt)
  if not u or u <= 0 then return nil end
  local k, want = 0, 0
  for w in string.gmatch(ws, '[^,]+') do
    k = k + 1
    local v = tonumber(w)
    if not v then return nil end
    if k == b then want = v end
  end
  if k > NB then return nil end
  return u, want
end

-- True for a whole number below 2^53 in magnitude: '%d' writes it exactly.
local function whole(v)
  return v == math.floor(v) and v < 9007199254740992 and v > -9007199254740992
end

-- A number as text that reads back exactly: '%d' (integer formatting, far
-- cheaper than '%.17g') for whole numbers.
local function numstr(v)
  if whole(v) then return string.format('%d', v) end
  return string.format('%.17g', v)
end

local function encode(r)
  local ws
  local nw = #r.wants
  if nw == 0 then
    ws = '0'
  elseif nw == NB then
    ws = string.format(WANTS_FMT, unpack(r.wants))
  else
    local t = {}
    for i = 1, nw do t[i] = string.format('%d', r.wants[i]) end
    ws = table.concat(t, ',')
  end
  return string.format('%d %d %d %d %d %s %s %d %d', r.token, r.grant,
    r.has, r.safe, r.deadline, numstr(r.weight), ws, r.seq, r.target)
end

if op == 'peek' then
  local m = redis.call('HMGET', META, 'epoch', 'learn_until', 'capacity', 'reserve')
  local out = {now, tonumber(m[1]) or 0, tonumber(m[2]) or 0,
    tonumber(m[3]) or 0, tonumber(m[4]) or 0}
  if m[1] then
    local raw = redis.call('HGETALL', HOSTS)
    for i = 1, #raw, 2 do
      local r = parse(raw[i + 1])
      if r and r.deadline > now then
        out[#out + 1] = raw[i]
        out[#out + 1] = raw[i + 1]
      end
    end
  end
  return out
end

if op ~= 'renew' and op ~= 'leave' then return {5, 1} end
if NB < 1 then return {5, 1} end

-- Arguments: whole numbers >= 0 (weight: a number > 0).
local host = ARGV[2]
if not host or #host == 0 then return {5, 2} end
local num = {}
for i = 3, 9 do
  local v = tonumber(ARGV[i])
  if not v or v < 0 or v ~= v then return {5, i} end
  if i ~= 6 and v ~= math.floor(v) then return {5, i} end
  num[i] = v
end
local token, cap, reserve, weight = num[3], num[4], num[5], num[6]
local has, safe, ttl = num[7], num[8], num[9]
if weight <= 0 or weight == math.huge or reserve > cap or ttl < 1 then return {5, 6} end
local wants = {}
for w in string.gmatch(ARGV[10] or '', '[^,]+') do
  local v = tonumber(w)
  if not v or v < 0 or v ~= math.floor(v) then return {5, 10} end
  wants[#wants + 1] = v
end
if #wants > NB then return {5, 10} end
local seq, ack = tonumber(ARGV[11]), tonumber(ARGV[12])
if not seq or seq < 1 or seq ~= math.floor(seq) then return {5, 11} end
if not ack or ack < 0 or ack ~= math.floor(ack) then return {5, 12} end
if op == 'leave' then
  for i = 1, #wants do wants[i] = 0 end
end
local pool = cap - reserve

-- The meta hash, read once and written once.
local FIELDS = {'epoch', 'learn_until', 'capacity', 'reserve', 'held', 'safe',
  'tsum', 'kept'}
local NG = #FIELDS
local BNAMES = {'b1', 'b2', 'b3', 'b4', 'b5', 'b6', 'b7', 'b8'}
for b = 1, NB do FIELDS[NG + b] = BNAMES[b] or ('b' .. b) end
local A, A0 = {}, {}
local mv = redis.call('HMGET', META, unpack(FIELDS))
for i = 1, NG do
  A[FIELDS[i]] = tonumber(mv[i]) or 0
  A0[FIELDS[i]] = mv[i]
end
-- A band's seven aggregates "w u q n c sw su", one array each, indexed by
-- band: Σ wants (W), Σ weights (U), Σ weight² (Q), hosts (NH), the
-- boundary (C) and the saturated hosts' wants and weights (SW, SU). Parsed
-- on first use (most calls touch a few bands): band(b) before any access.
local W, U, Q, NH, C, SW, SU = {}, {}, {}, {}, {}, {}, {}
local loaded, orig = {}, {}
local BAND = '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+)'
local ZERO = {0, 0, 0, 0, 0, 0, 0}
local function band(b)
  if loaded[b] then return end
  loaded[b] = true
  local s = mv[NG + b]
  local o = ZERO
  if s and s ~= '0 0 0 0 0 0 0' then
    local w, u, q, n, c, sw, su = string.match(s, BAND)
    if w then o = {tonumber(w) or 0, tonumber(u) or 0, tonumber(q) or 0, tonumber(n) or 0,
      tonumber(c) or 0, tonumber(sw) or 0, tonumber(su) or 0} end
  end
  W[b], U[b], Q[b], NH[b], C[b], SW[b], SU[b] = o[1], o[2], o[3], o[4], o[5], o[6], o[7]
  orig[b] = o
end
local fresh_epoch = not mv[1]
local created = false

-- 1. The epoch.
local learn_until
if fresh_epoch then
  redis.call('DEL', META, HOSTS, DL)
  for b = 1, NB do redis.call('DEL', KEYS[3 + b]) end
  for i = 1, NG do A[FIELDS[i]] = 0 end
  for b = 1, NB do
    loaded[b], orig[b] = true, {}
    W[b], U[b], Q[b], NH[b], C[b], SW[b], SU[b] = 0, 0, 0, 0, 0, 0, 0
  end
  learn_until = now + ttl
  A.epoch, A.learn_until, A.capacity, A.reserve = now, learn_until, cap, reserve
  redis.call('HSET', META, 'token', string.format('%d', now * 1000))
  created = true
else
  if A.capacity ~= cap or A.reserve ~= reserve then
    return {3, A.capacity, A.reserve}
  end
  learn_until = A.learn_until
  if now < learn_until and A.epoch + ttl > learn_until then
    -- A host with a longer TTL: learn for its TTL too.
    learn_until = A.epoch + ttl
    A.learn_until = learn_until
  end
end
local learning = now < learn_until

-- Band membership, keeping the boundary "the first c members are in".
-- stay: the host goes back in at once (band_in): its ZADD updates the
-- score, no ZREM.
local function band_out(id, r, b, stay)
  local w = r.wants[b] or 0
  if w <= 0 then return end
  band(b)
  local z = KEYS[3 + b]
  local rank = redis.call('ZRANK', z, id)
  if not rank then return end
  if rank < C[b] then
    C[b] = C[b] - 1
    SW[b] = SW[b] - w
    SU[b] = SU[b] - r.weight
  end
  if not stay then redis.call('ZREM', z, id) end
  W[b] = W[b] - w
  U[b] = U[b] - r.weight
  Q[b] = Q[b] - r.weight * r.weight
  NH[b] = NH[b] - 1
  if NH[b] <= 0 then
    W[b], U[b], Q[b], NH[b] = 0, 0, 0, 0
  end
  if C[b] <= 0 then C[b], SW[b], SU[b] = 0, 0, 0 end
end

local function band_in(id, r, b)
  local w = r.wants[b] or 0
  if w <= 0 then return end
  band(b)
  local z = KEYS[3 + b]
  -- A band with no hosts has no key: this ZADD creates it, without a TTL.
  -- (Moving a host within a live band needs no PEXPIRE of every key.)
  if redis.call('ZADD', z, numstr(w / r.weight), id) == 1 and NH[b] <= 0 then
    created = true
  end
  local rank = redis.call('ZRANK', z, id)
  if rank < C[b] then
    C[b] = C[b] + 1
    SW[b] = SW[b] + w
    SU[b] = SU[b] + r.weight
  end
  W[b] = W[b] + w
  U[b] = U[b] + r.weight
  Q[b] = Q[b] + r.weight * r.weight
  NH[b] = NH[b] + 1
  return rank
end

local function drop(id, r)
  for b = 1, NB do band_out(id, r, b) end
  A.held = A.held - math.max(r.grant, r.has)
  A.safe = A.safe - r.safe
  A.tsum = A.tsum - r.target
  redis.call('HDEL', HOSTS, id)
  redis.call('ZREM', DL, id)
end

-- Rebuilds every aggregate from the records: O(hosts), only when a record
-- is found corrupt (its contributions cannot be taken out one by one).
local function rebuild()
  redis.call('DEL', DL)
  for b = 1, NB do
    redis.call('DEL', KEYS[3 + b])
    if not loaded[b] then loaded[b], orig[b] = true, {} end
    W[b], U[b], Q[b], NH[b], C[b], SW[b], SU[b] = 0, 0, 0, 0, 0, 0, 0
  end
  A.held, A.safe, A.tsum = 0, 0, 0
  local raw = redis.call('HGETALL', HOSTS)
  for i = 1, #raw, 2 do
    local r = parse(raw[i + 1])
    if r == nil or r.deadline <= now then
      redis.call('HDEL', HOSTS, raw[i])
    else
      A.held = A.held + math.max(r.grant, r.has)
      A.safe = A.safe + r.safe
      A.tsum = A.tsum + r.target
      redis.call('ZADD', DL, r.deadline, raw[i])
      for b = 1, NB do band_in(raw[i], r, b) end
    end
  end
  created = true
end

-- Writes the meta hash (before every reply from here on: expiry and
-- rebuilds have changed the aggregates).
local function save()
  local keep = ttl * 10 + 60000
  if created or A.kept < now + keep / 2 then
    A.kept = now + keep
  end
  local out = {}
  for i = 1, NG do
    local f = FIELDS[i]
    local v = A[f]
    if A0[f] == nil or tonumber(A0[f]) ~= v then
      out[#out + 1] = f
      out[#out + 1] = numstr(v)
    end
  end
  for b = 1, NB do
    if loaded[b] then
      local o = orig[b]
      if o[1] ~= W[b] or o[2] ~= U[b] or o[3] ~= Q[b] or o[4] ~= NH[b] or
          o[5] ~= C[b] or o[6] ~= SW[b] or o[7] ~= SU[b] then
        out[#out + 1] = FIELDS[NG + b]
        local w, u, q, n, c, sw, su = W[b], U[b], Q[b], NH[b], C[b], SW[b], SU[b]
        if whole(w) and whole(u) and whole(q) and whole(n) and whole(c) and
            whole(sw) and whole(su) then
          -- Whole numbers (whole weights): one format call.
          out[#out + 1] = string.format('%d %d %d %d %d %d %d', w, u, q, n, c, sw, su)
        else
          out[#out + 1] = numstr(w) .. ' ' .. numstr(u) .. ' ' .. numstr(q) .. ' ' ..
            numstr(n) .. ' ' .. numstr(c) .. ' ' .. numstr(sw) .. ' ' .. numstr(su)
        end
      end
    end
  end
  if #out > 0 then redis.call('HSET', META, unpack(out)) end
  if created or A.kept == now + keep then
    for _, k in ipairs(KEYS) do redis.call('PEXPIRE', k, keep) end
  end
end

-- 2. Expiry (bounded per call).
local expired = redis.call('ZRANGEBYSCORE', DL, '-inf', numstr(now), 'LIMIT', '0',
  EXPIRE_PER_CALL)
for _, id in ipairs(expired) do
  local raw = redis.call('HGET', HOSTS, id)
  local r = parse(raw)
  if r then
    drop(id, r)
  elseif raw then
    rebuild()
    break
  else
    redis.call('ZREM', DL, id)
  end
end

-- 3. Fencing and sequencing.
local raw_me = redis.call('HGET', HOSTS, host)
local old = parse(raw_me)
if raw_me and not old then
  rebuild()
  raw_me = redis.call('HGET', HOSTS, host)
  old = parse(raw_me)
end
if old and old.deadline <= now then
  drop(host, old)
  old = nil
end
local hlen = redis.call('HLEN', HOSTS)
if old and seq <= old.seq then
  save()
  return {6, old.seq, 0, 0, 0, now, 0, 0, hlen}
end
if token ~= 0 and (old == nil or old.token ~= token) then
  save()
  return {2, 0, 0, 0, 0, now, 0, 0, hlen}
end
local sum_safe = A.safe - (old and old.safe or 0) + safe
if sum_safe > reserve then
  save()
  return {4, sum_safe, reserve}
end

local me = {has = has, safe = safe, weight = weight, wants = wants, seq = seq,
  deadline = now + ttl, target = 0, grant = 0}
local learned = true
if token == 0 then
  me.token = redis.call('HINCRBY', META, 'token', 1)
  if old then learned = true end
else
  me.token = token
  me.grant = old.grant
  learned = ack >= old.seq
end
if not old then hlen = hlen + 1 end

-- Move this host in the bands whose want or weight changed, keeping its
-- rank there (no set changes before the water-filling reads it).
local myrank = {}
for b = 1, NB do
  local wo = old and (old.wants[b] or 0) or 0
  local wn = wants[b] or 0
  if not old or wo ~= wn or old.weight ~= weight then
    if old then band_out(host, old, b, wn > 0) end
    myrank[b] = band_in(host, me, b)
  end
end

-- 4. Water-filling.
local function want_weight(id, b)
  if id == host then return me.wants[b] or 0, me.weight end
  local u, w = weight_want(redis.call('HGET', HOSTS, id), b)
  if not u or not w then return nil end
  return w, u
end

local function level(b, left)
  band(b)
  local d = U[b] - SU[b]
  if d > EPS then return (left - SW[b]) / d end
  if SW[b] <= left + EPS then return math.huge end
  return -math.huge
end

local function converge(b, left)
  band(b)
  local z = KEYS[3 + b]
  for _ = 1, MOVES_PER_CALL do
    local lam = level(b, left)
    local c, n = C[b], NH[b]
    local moved = false
    -- The members at c - 1 (the last one in) and c (the first one out),
    -- in one call.
    local e = {}
    if c < n or c > 0 then
      e = redis.call('ZRANGE', z, numstr(c > 0 and c - 1 or 0), numstr(c),
        'WITHSCORES')
    end
    local i = c > 0 and 3 or 1
    if c < n then
      if e[i + 1] and tonumber(e[i + 1]) <= lam then
        local w, u = want_weight(e[i], b)
        if w then
          C[b], SW[b], SU[b] = c + 1, SW[b] + w, SU[b] + u
          moved = true
        end
      end
    end
    if not moved and c > 0 then
      if e[2] and tonumber(e[2]) > lam then
        local w, u = want_weight(e[1], b)
        if w then
          C[b], SW[b], SU[b] = c - 1, SW[b] - w, SU[b] - u
          moved = true
        end
      end
    end
    if not moved then return lam, true end
  end
  return level(b, left), false
end

local target = 0
local left = pool
for b = 1, NB do
  if left <= EPS then break end
  local mine = wants[b] or 0
  band(b)
  if W[b] <= left + EPS then
    target = target + mine
    left = left - W[b]
  else
    local lam, settled = converge(b, left)
    local share = math.max(0, math.min(mine, weight * lam))
    local n, c = NH[b], C[b]
    local rank = nil
    if mine > 0 and mine > share + EPS and settled and n > c then
      rank = myrank[b] or redis.call('ZRANK', KEYS[3 + b], host)
    end
    local u, q = U[b], Q[b]
    local uniform = n > 0 and math.abs(n * q - u * u) <= 1e-9 * u * u
    if rank and rank >= c and uniform then
      -- One weight: cumulative rounding over the unsaturated hosts.
      local sh = (u - SU[b]) / (n - c) * lam
      local j = rank - c
      target = target + math.floor((j + 1) * sh + EPS) - math.floor(j * sh + EPS)
    else
      local f = math.floor(share + EPS)
      target = target + f
      if rank and share - f > EPS and
          pool - (A.tsum - (old and old.target or 0)) - (target + 1) >= 0 then
        target = target + 1
      end
    end
    left = 0
  end
end
target = math.min(target, pool)

-- 5. The grant.
local others = A.held - (old and math.max(old.grant, old.has) or 0)
local free = math.max(0, pool - others)
local g
if learning then
  g = math.min(has, free)
elseif not learned then
  g = math.min(target, free, has)
else
  g = math.min(target, free)
end
me.grant, me.target = g, target
A.held = others + math.max(g, has)
A.safe = sum_safe
A.tsum = A.tsum - (old and old.target or 0) + target

-- 6. Store.
if redis.call('HSET', HOSTS, host, encode(me)) == 1 then created = true end
if redis.call('ZADD', DL, numstr(me.deadline), host) == 1 then created = true end
if op == 'leave' and has == 0 then
  drop(host, me)
  hlen = hlen - 1
end
save()
local mode = 1
if learning then mode = 2 end
return {1, g, me.deadline, me.token, mode, now, target, A.held, hlen, seq}
