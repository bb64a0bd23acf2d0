-- shmsched cluster lease script: one call renews (or registers) one host's
-- block lease of a cluster-wide budget.
--
-- HOW IT WORKS
--
-- Keys (one hash tag, so Redis Cluster keeps them in one slot):
--   KEYS[1] = {shmsched:BUDGET}:meta   hash: epoch, learn_until (ms, Redis
--             time), capacity, reserve, token (the fencing counter)
--   KEYS[2] = {shmsched:BUDGET}:hosts  hash: host id -> its record
-- A record is "token grant has safe deadline weight w1,w2,...,wB": the
-- host's fencing token, the units it was last granted, the units it last
-- reported it has (what it may hold now: its ceiling, or more while holders
-- of a shrunk ceiling still run), its safe capacity, its deadline (ms,
-- Redis time), its weight and its wants per priority band (highest first).
--
-- Units: the budget's capacity C minus the safe reserve S is the pool P
-- that is leased. Each host's safe capacity lies outside the pool (the
-- safe capacities of all hosts must fit in S), so a host's ceiling is
-- safe + grant while leased and safe once its lease lapses, and the sum of
-- every host's ceiling stays within C whether leases lapse or not.
--
-- Time comes only from TIME, here: hosts' clocks may differ. A record
-- whose deadline has passed is dropped (its units return to the pool).
--
-- A renewal:
--  1. Reads the meta hash. Missing means Redis lost its state (restart,
--     failover to an empty replica) or the budget is new: the script
--     starts a new epoch (hosts hash cleared, token counter set past any
--     token of an older epoch) in LEARNING MODE for one TTL. A capacity or
--     reserve that differs from the stored one is refused (status 3).
--  2. Drops expired records.
--  3. FENCING: token 0 registers (a new token by HINCRBY on the counter,
--     replacing any record of that host); a nonzero token must equal the
--     record's, else the renewal is refused (status 2: stale, an old agent
--     after a takeover or a lease that expired and was dropped) and the
--     agent registers again.
--  4. WATER-FILLING: the pool is shared out over every live host's wants,
--     band by band (highest priority first): within a band each host gets
--     up to its want, in proportion to its weight, the water level rising
--     until either every want of the band is met or the pool is spent;
--     what is left flows to the next band. Targets are then made whole
--     units: floors, plus the units left over to the largest fractional
--     parts (ties by host id), so hosts of equal weight with unmet wants
--     end within one unit of each other.
--  5. GRANT: the renewing host is granted min(target, P - sum over the other
--     hosts of max(grant, has)). A host's max(grant, has) is what it may
--     hold: it moves to its grant on receipt, and a host being shrunk keeps
--     its holders (nothing is revoked) until they release, which its next
--     reports show as `has` coming down. So a shrinking host's surplus is
--     handed to others only once it reports it released it, and the sum of
--     what hosts may hold never exceeds P. In learning mode the grant is
--     only what the host reports it has (at most that free space), so
--     nobody grows while the picture rebuilds.
--  6. Stores the record with deadline now + TTL; both keys expire if no
--     host renews for a long while.
--
-- Ops: ARGV[1] = 'renew', 'leave' (a renewal with no wants that deletes
-- the record once the host holds nothing from the pool) or 'peek' (read
-- only: the budget's state).
-- ARGV (renew/leave): 2 host, 3 token, 4 capacity, 5 reserve, 6 weight,
--   7 has, 8 safe, 9 ttl_ms, 10 wants (comma separated, one per band)
-- Reply (renew/leave): {status, grant, deadline_ms, token, mode, now_ms,
--   target, sum of max(grant, has) over hosts, hosts}
--   status 1 ok, 2 stale token, 3 capacity/reserve mismatch ({3, stored
--   capacity, stored reserve}), 4 safe capacities exceed the reserve ({4,
--   sum, reserve}), 5 bad argument ({5, argument index}); mode 1 normal,
--   2 learning.
-- Reply (peek): {now_ms, epoch, learn_until, capacity, reserve,
--   host1, record1, host2, record2, ...} (live records only; epoch 0 if
--   there is no state).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op = ARGV[1]

local function parse(rec)
  local f = {}
  for w in string.gmatch(rec, '%S+') do f[#f + 1] = w end
  if #f ~= 7 then return nil end
  local r = {
    token = tonumber(f[1]), grant = tonumber(f[2]), has = tonumber(f[3]),
    safe = tonumber(f[4]), deadline = tonumber(f[5]), weight = tonumber(f[6]),
    wants = {}
  }
  if not (r.token and r.grant and r.has and r.safe and r.deadline and r.weight) then
    return nil
  end
  for w in string.gmatch(f[7], '[^,]+') do
    local v = tonumber(w)
    if not v then return nil end
    r.wants[#r.wants + 1] = v
  end
  return r
end

local function encode(r)
  local ws = {}
  for i = 1, #r.wants do ws[i] = string.format('%d', r.wants[i]) end
  if #ws == 0 then ws[1] = '0' end
  return string.format('%d %d %d %d %d %.17g %s', r.token, r.grant, r.has,
    r.safe, r.deadline, r.weight, table.concat(ws, ','))
end

if op == 'peek' then
  local m = redis.call('HMGET', KEYS[1], 'epoch', 'learn_until', 'capacity', 'reserve')
  local out = {now, tonumber(m[1]) or 0, tonumber(m[2]) or 0,
    tonumber(m[3]) or 0, tonumber(m[4]) or 0}
  if m[1] then
    local raw = redis.call('HGETALL', KEYS[2])
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
if weight <= 0 or reserve > cap or ttl < 1 then return {5, 6} end
local wants = {}
for w in string.gmatch(ARGV[10] or '', '[^,]+') do
  local v = tonumber(w)
  if not v or v < 0 or v ~= math.floor(v) then return {5, 10} end
  wants[#wants + 1] = v
end
if op == 'leave' then
  for i = 1, #wants do wants[i] = 0 end
end
local pool = cap - reserve

-- 1. The epoch.
local m = redis.call('HMGET', KEYS[1], 'epoch', 'learn_until', 'capacity', 'reserve')
local learn_until
if not m[1] then
  redis.call('DEL', KEYS[2])
  learn_until = now + ttl
  redis.call('HSET', KEYS[1], 'epoch', now, 'learn_until', learn_until,
    'capacity', cap, 'reserve', reserve, 'token', string.format('%d', now * 1000))
else
  if tonumber(m[3]) ~= cap or tonumber(m[4]) ~= reserve then
    return {3, tonumber(m[3]) or 0, tonumber(m[4]) or 0}
  end
  learn_until = tonumber(m[2]) or 0
  local epoch = tonumber(m[1]) or 0
  if now < learn_until and epoch + ttl > learn_until then
    -- A host with a longer TTL: learn for its TTL too.
    learn_until = epoch + ttl
    redis.call('HSET', KEYS[1], 'learn_until', learn_until)
  end
end
local learning = now < learn_until

-- 2. Live records.
local ids, recs = {}, {}
local raw = redis.call('HGETALL', KEYS[2])
for i = 1, #raw, 2 do
  local r = parse(raw[i + 1])
  if r == nil or r.deadline <= now then
    redis.call('HDEL', KEYS[2], raw[i])
  else
    ids[#ids + 1] = raw[i]
    recs[raw[i]] = r
  end
end

-- 3. Fencing.
local me = recs[host]
if token ~= 0 then
  if me == nil or me.token ~= token then return {2, 0, 0, 0, 0, now, 0, 0, #ids} end
else
  local fresh = redis.call('HINCRBY', KEYS[1], 'token', 1)
  if me == nil then ids[#ids + 1] = host end
  me = {token = fresh, grant = 0}
  recs[host] = me
end
me.has, me.safe, me.weight, me.wants = has, safe, weight, wants
me.deadline = now + ttl

local sum_safe = 0
for _, id in ipairs(ids) do sum_safe = sum_safe + recs[id].safe end
if sum_safe > reserve then return {4, sum_safe, reserve} end

-- 4. Water-filling.
local bands = 0
for _, id in ipairs(ids) do
  if #recs[id].wants > bands then bands = #recs[id].wants end
end
local target = {}
for _, id in ipairs(ids) do target[id] = 0 end
local left = pool
for b = 1, bands do
  if left <= 1e-9 then break end
  local act, need = {}, {}
  for _, id in ipairs(ids) do
    local w = recs[id].wants[b] or 0
    if w > 0 then
      act[#act + 1] = id
      need[id] = w
    end
  end
  while #act > 0 and left > 1e-9 do
    local wsum = 0
    for _, id in ipairs(act) do wsum = wsum + recs[id].weight end
    local level = left / wsum
    local rest, used = {}, 0
    for _, id in ipairs(act) do
      if need[id] <= recs[id].weight * level then
        target[id] = target[id] + need[id]
        used = used + need[id]
      else
        rest[#rest + 1] = id
      end
    end
    if #rest == #act then
      for _, id in ipairs(act) do
        target[id] = target[id] + recs[id].weight * level
      end
      left = 0
    else
      left = left - used
      act = rest
    end
  end
end
local total, floors, frac, order = 0, 0, {}, {}
for _, id in ipairs(ids) do
  total = total + target[id]
  local f = math.floor(target[id] + 1e-9)
  frac[id] = target[id] - f
  target[id] = f
  floors = floors + f
  if frac[id] > 1e-9 then order[#order + 1] = id end
end
local extra = math.floor(total + 1e-6) - floors
if extra > 0 then
  table.sort(order, function(a, b)
    if frac[a] ~= frac[b] then return frac[a] > frac[b] end
    return a < b
  end)
  for k = 1, math.min(extra, #order) do
    target[order[k]] = target[order[k]] + 1
  end
end

-- 5. The grant.
local others = 0
for _, id in ipairs(ids) do
  if id ~= host then
    local r = recs[id]
    others = others + math.max(r.grant, r.has)
  end
end
local free = math.max(0, pool - others)
local g
if learning then
  g = math.min(has, free)
else
  g = math.min(target[host], free)
end
me.grant = g

-- 6. Store.
if op == 'leave' and has == 0 then
  redis.call('HDEL', KEYS[2], host)
else
  redis.call('HSET', KEYS[2], host, encode(me))
end
local keep = ttl * 10 + 60000
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('PEXPIRE', KEYS[2], keep)
local mode = 1
if learning then mode = 2 end
return {1, g, me.deadline, me.token, mode, now, target[host],
  others + math.max(g, has), #ids}
