-- The lease script of revision 2 as first written (before its per-call
-- Lua cost was cut), kept as the reference tests/cluster_script.rs holds
-- src/cluster/lease.lua to: the same replies, records, sets and
-- aggregates for the same requests. Not loaded by the library.
--
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
-- sorted sets (O(log hosts) each); boundary moves and expiries are bounded
-- per call (32 and 64, each O(log hosts)). Only 'peek' and the rebuild
-- after a corrupt record read every record.
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
local EXPIRE_PER_CALL = 64
local MOVES_PER_CALL = 32
local EPS = 1e-9

local function parse(rec)
  if not rec then return nil end
  local f = {}
  for w in string.gmatch(rec, '%S+') do f[#f + 1] = w end
  if #f ~= 9 then return nil end
  local r = {
    token = tonumber(f[1]), grant = tonumber(f[2]), has = tonumber(f[3]),
    safe = tonumber(f[4]), deadline = tonumber(f[5]), weight = tonumber(f[6]),
    seq = tonumber(f[8]), target = tonumber(f[9]), wants = {}
  }
  if not (r.token and r.grant and r.has and r.safe and r.deadline and r.weight
      and r.seq and r.target) or r.weight <= 0 then
    return nil
  end
  for w in string.gmatch(f[7], '[^,]+') do
    local v = tonumber(w)
    if not v then return nil end
    r.wants[#r.wants + 1] = v
  end
  if #r.wants > NB then return nil end
  return r
end

local function encode(r)
  local ws = {}
  for i = 1, #r.wants do ws[i] = string.format('%d', r.wants[i]) end
  if #ws == 0 then ws[1] = '0' end
  return string.format('%d %d %d %d %d %.17g %s %d %d', r.token, r.grant,
    r.has, r.safe, r.deadline, r.weight, table.concat(ws, ','), r.seq,
    r.target)
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
local BF = {'w', 'u', 'q', 'n', 'c', 'sw', 'su'}
-- A band's seven aggregates are one meta field, 'b' .. band: "w u q n c sw
-- su". N.w[b] names band b's w in the table A, and so on.
local N, FB = {}, {}
for _, p in ipairs(BF) do N[p] = {} end
for b = 1, NB do
  FIELDS[NG + b] = 'b' .. b
  for _, p in ipairs(BF) do
    N[p][b] = p .. b
    FB[N[p][b]] = b
  end
end
local A, A0 = {}, {}
local mv = redis.call('HMGET', META, unpack(FIELDS))
for i = 1, NG do
  A[FIELDS[i]] = tonumber(mv[i]) or 0
  A0[FIELDS[i]] = mv[i]
end
-- Band fields are parsed on first use (most calls touch one or two bands).
local loaded, orig = {}, {}
local function load_band(b)
  loaded[b] = true
  local k, o = 0, {}
  for v in string.gmatch(mv[NG + b] or '', '%S+') do
    k = k + 1
    if BF[k] then o[k] = tonumber(v) or 0 end
  end
  for j = 1, #BF do
    o[j] = o[j] or 0
    rawset(A, N[BF[j]][b], o[j])
  end
  orig[b] = o
end
setmetatable(A, {__index = function(t, k)
  local b = FB[k]
  if b and not loaded[b] then
    load_band(b)
    return rawget(t, k)
  end
  return nil
end})
local fresh_epoch = not mv[1]
local created = false

-- 1. The epoch.
local learn_until
if fresh_epoch then
  redis.call('DEL', META, HOSTS, DL)
  for b = 1, NB do redis.call('DEL', KEYS[3 + b]) end
  for i = 1, NG do A[FIELDS[i]] = 0 end
  for b = 1, NB do
    load_band(b)
    for j = 1, #BF do
      A[N[BF[j]][b]] = 0
      orig[b][j] = nil
    end
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
local function band_out(id, r, b)
  local w = r.wants[b] or 0
  if w <= 0 then return end
  local z = KEYS[3 + b]
  local rank = redis.call('ZRANK', z, id)
  if not rank then return end
  if rank < A[N.c[b]] then
    A[N.c[b]] = A[N.c[b]] - 1
    A[N.sw[b]] = A[N.sw[b]] - w
    A[N.su[b]] = A[N.su[b]] - r.weight
  end
  redis.call('ZREM', z, id)
  A[N.w[b]] = A[N.w[b]] - w
  A[N.u[b]] = A[N.u[b]] - r.weight
  A[N.q[b]] = A[N.q[b]] - r.weight * r.weight
  A[N.n[b]] = A[N.n[b]] - 1
  if A[N.n[b]] <= 0 then
    A[N.w[b]], A[N.u[b]], A[N.q[b]], A[N.n[b]] = 0, 0, 0, 0
  end
  if A[N.c[b]] <= 0 then A[N.c[b]], A[N.sw[b]], A[N.su[b]] = 0, 0, 0 end
end

local function band_in(id, r, b)
  local w = r.wants[b] or 0
  if w <= 0 then return end
  local z = KEYS[3 + b]
  if redis.call('ZADD', z, string.format('%.17g', w / r.weight), id) == 1 then
    created = true
  end
  local rank = redis.call('ZRANK', z, id)
  if rank < A[N.c[b]] then
    A[N.c[b]] = A[N.c[b]] + 1
    A[N.sw[b]] = A[N.sw[b]] + w
    A[N.su[b]] = A[N.su[b]] + r.weight
  end
  A[N.w[b]] = A[N.w[b]] + w
  A[N.u[b]] = A[N.u[b]] + r.weight
  A[N.q[b]] = A[N.q[b]] + r.weight * r.weight
  A[N.n[b]] = A[N.n[b]] + 1
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
    for _, p in ipairs(BF) do A[N[p][b]] = 0 end
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
      out[#out + 1] = string.format('%.17g', v)
    end
  end
  for b = 1, NB do
    if loaded[b] then
      local vs, changed = {}, false
      for j, p in ipairs(BF) do
        local v = A[N[p][b]]
        if orig[b][j] ~= v then changed = true end
        vs[j] = v
      end
      if changed then
        for j = 1, #BF do vs[j] = string.format('%.17g', vs[j]) end
        out[#out + 1] = FIELDS[NG + b]
        out[#out + 1] = table.concat(vs, ' ')
      end
    end
  end
  if #out > 0 then redis.call('HSET', META, unpack(out)) end
  if created or A.kept == now + keep then
    for _, k in ipairs(KEYS) do redis.call('PEXPIRE', k, keep) end
  end
end

-- 2. Expiry (bounded per call).
local expired = redis.call('ZRANGEBYSCORE', DL, '-inf', now, 'LIMIT', 0, EXPIRE_PER_CALL)
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

-- Move this host in the bands whose want or weight changed.
for b = 1, NB do
  local wo = old and (old.wants[b] or 0) or 0
  local wn = wants[b] or 0
  if not old or wo ~= wn or old.weight ~= weight then
    if old then band_out(host, old, b) end
    band_in(host, me, b)
  end
end

-- 4. Water-filling.
local function want_weight(id, b)
  if id == host then return me.wants[b] or 0, me.weight end
  local r = parse(redis.call('HGET', HOSTS, id))
  if not r then return nil end
  return r.wants[b] or 0, r.weight
end

local function level(b, left)
  local d = A[N.u[b]] - A[N.su[b]]
  if d > EPS then return (left - A[N.sw[b]]) / d end
  if A[N.sw[b]] <= left + EPS then return math.huge end
  return -math.huge
end

local function converge(b, left)
  local z = KEYS[3 + b]
  for _ = 1, MOVES_PER_CALL do
    local lam = level(b, left)
    local c, n = A[N.c[b]], A[N.n[b]]
    local moved = false
    if c < n then
      local e = redis.call('ZRANGE', z, c, c, 'WITHSCORES')
      if #e == 2 and tonumber(e[2]) <= lam then
        local w, u = want_weight(e[1], b)
        if w then
          A[N.c[b]], A[N.sw[b]], A[N.su[b]] = c + 1, A[N.sw[b]] + w, A[N.su[b]] + u
          moved = true
        end
      end
    end
    if not moved and c > 0 then
      local e = redis.call('ZRANGE', z, c - 1, c - 1, 'WITHSCORES')
      if #e == 2 and tonumber(e[2]) > lam then
        local w, u = want_weight(e[1], b)
        if w then
          A[N.c[b]], A[N.sw[b]], A[N.su[b]] = c - 1, A[N.sw[b]] - w, A[N.su[b]] - u
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
  if A[N.w[b]] <= left + EPS then
    target = target + mine
    left = left - A[N.w[b]]
  else
    local lam, settled = converge(b, left)
    local share = math.max(0, math.min(mine, weight * lam))
    local n, c = A[N.n[b]], A[N.c[b]]
    local rank = nil
    if mine > 0 and mine > share + EPS and settled and n > c then
      rank = redis.call('ZRANK', KEYS[3 + b], host)
    end
    local u, q = A[N.u[b]], A[N.q[b]]
    local uniform = n > 0 and math.abs(n * q - u * u) <= 1e-9 * u * u
    if rank and rank >= c and uniform then
      -- One weight: cumulative rounding over the unsaturated hosts.
      local sh = (u - A[N.su[b]]) / (n - c) * lam
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
if redis.call('ZADD', DL, me.deadline, host) == 1 then created = true end
if op == 'leave' and has == 0 then
  drop(host, me)
  hlen = hlen - 1
end
save()
local mode = 1
if learning then mode = 2 end
return {1, g, me.deadline, me.token, mode, now, target, A.held, hlen, seq}
