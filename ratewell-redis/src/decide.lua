-- ratewell: decisions (and refunds) of one or more layers each, atomically, in the server.
--
-- One source, two ways in: loaded as a function library (`FUNCTION LOAD`; `src/script.rs`
-- prepends the library's name and appends `redis.register_function`), its top level runs once
-- and each `FCALL` runs only `batch`; sent as a script (`EVALSHA`, where `FUNCTION` is missing:
-- Redis 6, or a server that renames it), the same body ends in `return batch(KEYS, ARGV)`.
--
-- Numbers. Lua 5.1 numbers are IEEE doubles: integers are exact up to 2^53 and every operation
-- below is on integers, so the arithmetic is exact as long as no value (operand, intermediate or
-- result) exceeds 2^53. The argument, one bound at a time (`src/script.rs` checks the parameter
-- bounds when a limiter is built, and refuses a policy outside them):
--
-- * Absolute times are whole microseconds since the Unix epoch (the server's TIME) or since a
--   trace's start: below 2^53 us (285 years). No absolute time is ever multiplied.
-- * Every product of a time takes a difference first: (state time - now) in us, multiplied by
--   1000 * n (n <= 2^16, the rate's denominator in lowest terms), only after the difference is
--   known to be under the state's own span (checked before multiplying).
-- * GCRA and the exact leaky bucket keep the theoretical arrival time as (tu, tf): whole us plus a
--   remainder in 1/n ns, tf < 1000 n. A debt (or a leaky bucket's excess) is at most
--   B*d + c*d <= 2 B' d <= 2^52 units of 1/n ns, with B' the capacity (or burst + 1) and c <= B'
--   checked first (built only when B' d <= 2^51).
-- * Windows and fill intervals are whole microseconds; a window index is an absolute time
--   divided by the window. The sliding-window counter's products prev * (W - r) and
--   (a + 1) * W are up to (N + 1) * W_us < 2^33 * 2^43: `muldiv` divides them exactly (in
--   base-256 digits when they exceed 2^52), and their quotients are at most max(N + 1, W_us);
--   the nanosecond span ((a+1) W_ns - 1) / p is computed as 1000 q + ((1000 s - 1) / p) from
--   q, s = muldiv(a + 1, W_us, p), at most W_ns <= 2^52 (checked).
-- * compat=nginx: milli-requests; the rate (milli-requests per second) is at most 2^40 and the
--   burst at most 2^30. A gap since `last` is clamped first to `full_ms`, the time any excess
--   takes to leak, so rate * ms <= (burst + 1) * 10^6 + 2 rate < 2^53.
-- * Division is `divmod` below: floor(a / b) from the double quotient, corrected by the exact
--   remainder, so a quotient that rounds up to the next integer is never taken.
--
-- A call is a batch of requests (`batch`, at the end), each decided as its own call would be.
-- One request, as `decide_one` reads it:
-- K: one key per layer (on a cluster, every key of a batch in one hash slot).
-- A: now_us ('' = the server's TIME; else 8 bytes, a little-endian double), cost, op ('take' | 'peek' | 'refund'), ttl_ms ('' =
--    each key's own reset time; else this fixed TTL, for a trace's own clock), then per layer
--    2 fields: the policy ('algorithm p1 p2 p3 p4 p5 p6', `src/script.rs`) and the mode. The
--    mode is '0' (enforced: the request is admitted only if the layer admits it), '1' (dry
--    run: decided and charged if it fits, never rejecting), 'q' (quota: rejecting only when
--    every quota layer of the call rejects) or 'r' (read: decided, never charged, reported as
--    a peek is), optionally followed by ':<cost>', the layer's own cost instead of the call's.
--    For 'refund' the receipts ('after|before': the state the charge stored and the one it
--    replaced) follow the layers, one per layer.
-- Its fields in the reply: admitted (1/0), per layer: outcome, remaining, reset_ns, wait_ns,
--    replenish_ns (0 = none), receipt ('' when nothing was stored; the log's: the entry's
--    time). A refund's: 1.
-- Outcomes: 0 admitted, 1 rejected, 2 impossible.

-- The globals used on every decision, read once into upvalues by `init` (a function library's
-- top level runs at load, where only `redis.register_function` may be touched: globals are read
-- on the first call instead, and kept for every later one).
local floor, format, match, tonum, unpk, call, sub, find, byte, pack, sunpack

local function init()
  floor, format, match, tonum, unpk = math.floor, string.format, string.match, tonumber,
    unpack
  call, sub, find, byte = redis.call, string.sub, string.find, string.byte
  pack, sunpack = struct.pack, struct.unpack
end

-- Small numbers that arrive as text again and again (costs, TTLs, counts): converted once.
-- tonumber is C's strtod, a thousand instructions and more for a single digit.
local NUMS, nnums = {}, 0

local function num(s)
  local v = NUMS[s]
  if v then return v end
  v = tonum(s)
  if nnums < 4096 then NUMS[s] = v; nnums = nnums + 1 end
  return v
end

local function divmod(a, b)
  if b == 1 then return a, 0 end
  local q = floor(a / b)
  local r = a - q * b
  if r < 0 then q = q - 1; r = r + b elseif r >= b then q = q + 1; r = r - b end
  return q, r
end

local function ceildiv(a, b)
  if b == 1 then return a end
  local q, r = divmod(a, b)
  if r > 0 then q = q + 1 end
  return q
end

-- floor(x * y / z) and the remainder, exactly, for integers 0 <= x, y < 2^48 and 0 < z <= 2^45
-- whose quotient is below 2^53. A product up to 2^52 is exact as a double and divided at once;
-- a larger one is multiplied out in base-256 digits and divided digit by digit (each partial
-- remainder times 256 stays below 2^53).
local function muldiv(x, y, z)
  local prod = x * y
  if prod <= 4503599627370496 then return divmod(prod, z) end
  local xs, ys, d = {}, {}, {}
  local v = x
  while v > 0 do local q, r = divmod(v, 256); xs[#xs + 1] = r; v = q end
  v = y
  while v > 0 do local q, r = divmod(v, 256); ys[#ys + 1] = r; v = q end
  for k = 1, #xs + #ys do d[k] = 0 end
  for i = 1, #xs do
    for j = 1, #ys do d[i + j - 1] = d[i + j - 1] + xs[i] * ys[j] end
  end
  for k = 1, #d - 1 do
    local c, r = divmod(d[k], 256)
    d[k] = r; d[k + 1] = d[k + 1] + c
  end
  local q, r = 0, 0
  for k = #d, 1, -1 do
    local qd
    qd, r = divmod(r * 256 + d[k], z)
    q = q * 256 + qd
  end
  return q, r
end

local function fmt(a, b, c)
  if c then return format('%d %d %d', a, b, c) end
  if b then return format('%d %d', a, b) end
  return format('%d', a)
end

-- A state of one to three integers, as this code stores it: one byte, the count, then each
-- integer as a little-endian double (`struct`: no decimal conversion either way, which costs
-- more than deciding).
local function encode(st)
  local a, b, c = st[1], st[2], st[3]
  if c then return pack('<Bddd', 3, a, b, c) end
  if b then return pack('<Bdd', 2, a, b) end
  return pack('<Bd', 1, a)
end

local function exact(v)
  return v == floor(v) and v < 9007199254740992 and v > -9007199254740992
end

-- A state (or receipt) as `encode` writes it, or as decimal text (what earlier versions stored,
-- and the sliding log's entries): its integers; nil for anything else.
local function parse(s)
  if not s then return nil end
  local k = byte(s, 1)
  if k == 2 then
    if #s ~= 17 then return nil end
    local a, b = sunpack('<dd', s, 2)
    if exact(a) and exact(b) then return {a, b} end
    return nil
  elseif k == 3 then
    if #s ~= 25 then return nil end
    local a, b, c = sunpack('<ddd', s, 2)
    if exact(a) and exact(b) and exact(c) then return {a, b, c} end
    return nil
  elseif k == 1 then
    if #s ~= 9 then return nil end
    local a = sunpack('<d', s, 2)
    if exact(a) then return {a} end
    return nil
  end
  local a, b, c = match(s, '^(%-?%d+) ?(%-?%d*) ?(%-?%d*)$')
  if not a then return nil end
  if b == '' then return {tonum(a)} end
  if c == '' then return {tonum(a), tonum(b)} end
  return {tonum(a), tonum(b), tonum(c)}
end

-- A receipt: the state a charge stored, and ('|' after it) the state it replaced, or the stored
-- state alone (a receipt of part of a charge). Returns the two, and whether the second is there.
local function split_receipt(r)
  local k = byte(r, 1)
  if k and k >= 1 and k <= 3 then
    local len = 1 + 8 * k
    if byte(r, len + 1) == 124 then return sub(r, 1, len), sub(r, len + 2), true end
    return sub(r, 1, len), '', false
  end
  local bar = find(r, '|', 1, true)
  if bar then return sub(r, 1, bar - 1), sub(r, bar + 1), true end
  return r, '', false
end

-- A key whose state is not one this script wrote (something else overwrote it) is an error
-- reply, never a fresh key: a fresh key would hand its client a full budget. The client's
-- failover decides the request.
local function corrupt(key, raw)
  if #raw > 64 then raw = sub(raw, 1, 64) .. '...' end
  return redis.error_reply(format('ratewell: the state of %s does not parse: %q', key, raw))
end

-- Units of capacity `u`, `per` units a token, accruing `scale` units a ns: the whole tokens and
-- the ns until the next one (0 = none: full).
local function tokens(u, per, scale, limit)
  if u < 0 then u = 0 end
  local whole, rest = divmod(u, per)
  if whole >= limit then return whole, 0 end
  return whole, ceildiv(per - rest, scale)
end

-- Results are {outcome, remaining, reset, wait, replenish, state-or-nil, ttl_ns}.

-- GCRA. p = {B, n, d}. State {tu, tf}: TAT = tu us + tf/n ns.
local function gcra_debt(p, st, u)
  if not st or st[1] < u then return 0 end
  local span = st[1] - u
  if span > p[9] then span = p[9] end
  return span * p[7] + st[2]
end

local function make_gcra()
  local function gcra(p, st, u, c)
    local B, n, d, bd = p[1], p[2], p[3], p[8]
    local debt = gcra_debt(p, st, u)
    if c > B then
      local rem, nxt = tokens(bd - debt, d, n, B)
      return {2, rem, ceildiv(debt, n), 0, nxt}
    end
    local after = debt + c * d
    if after <= bd then
      local q, r = divmod(after, p[7])
      local rem, nxt = tokens(bd - after, d, n, B)
      local reset = ceildiv(after, n)
      return {0, rem, reset, 0, nxt, {u + q, r}, reset}
    end
    local rem, nxt = tokens(bd - debt, d, n, B)
    return {1, rem, ceildiv(debt, n), ceildiv(after - bd, n), nxt}
  end

  -- The part of a charge not yet refilled: min(c*d, TAT_charged - now), given back.
  local function gcra_refund(p, st, u, c, receipt)
    local debt = gcra_debt(p, st, u)
    local unpaid = gcra_debt(p, receipt, u)
    local charge = c * p[3]
    if charge > p[8] then charge = p[8] end
    if unpaid > charge then unpaid = charge end
    local left = debt - unpaid
    if left <= 0 then return nil, 0 end
    local q, r = divmod(left, p[7])
    return {u + q, r}, ceildiv(left, p[2])
  end
  return {gcra, gcra_refund}
end

-- Leaky bucket (exact). p = {burst, n, d, delay (-1 = nodelay)}. State {tu, tf} as GCRA's.
local function make_leaky()
  local function leaky_backlog(p, st, u)
    if not st then return 0 end
    if st[1] < u then
      -- TAT is before now: the backlog is d - (now - TAT)*n, positive only within one period.
      local behind = u - st[1]
      if behind > p[10] + 1 then return 0 end
      local b = p[3] - (behind * p[7] - st[2])
      if b < 0 then return 0 end
      return b
    end
    return gcra_debt(p, st, u) + p[3]
  end

  local function leaky(p, st, u, c)
    local burst, n, d = p[1], p[2], p[3]
    local limit, cap = burst + 1, p[8] - d
    local backlog = leaky_backlog(p, st, u)
    if c > limit then
      local rem, nxt = tokens(cap + d - backlog, d, n, limit)
      return {2, rem, ceildiv(backlog, n), 0, nxt}
    end
    local excess = backlog + (c - 1) * d
    if excess <= cap then
      local delay = 0
      if p[4] >= 0 then
        local queued = excess - p[4] * d
        if queued > 0 then delay = ceildiv(queued, n) end
      end
      local q, r = divmod(excess, p[7])
      local rem, nxt = tokens(cap - excess, d, n, limit)
      local reset = ceildiv(excess + d, n)
      return {0, rem, reset, delay, nxt, {u + q, r}, reset}
    end
    local rem, nxt = tokens(cap + d - backlog, d, n, limit)
    return {1, rem, ceildiv(backlog, n), ceildiv(excess - cap, n), nxt}
  end

  local function leaky_refund(p, st, u, c, receipt)
    local d = p[3]
    local backlog = leaky_backlog(p, st, u)
    local charge = c * d
    if charge > p[8] then charge = p[8] end
    local unpaid = leaky_backlog(p, receipt, u)
    if unpaid > charge then unpaid = charge end
    local left = backlog - unpaid
    if left <= 0 then return nil, 0 end
    -- Stored as TAT = now + (left - d)/n.
    local x = left - d
    local q, r = divmod(x, p[7])
    return {u + q, r}, ceildiv(left, p[2])
  end
  return {leaky, leaky_refund}
end

-- compat=nginx. p = {rate (milli-requests/s), burst, delay (-1 = nodelay)}.
-- State {excess, last_ms}. Times here are ms (now_ms = floor(u / 1000)); waits are ns.
local function make_nginx()
  local function ngx_at(ms, u)
    -- ms * 10^6 - now_ns, clamped at 0, from the difference in us.
    local t = (ms * 1000 - u) * 1000
    if t < 0 then return 0 end
    return t
  end

  local function ngx_leak(p, st, now_ms)
    -- {leaked (nil = fresh), last_ms, moves_last, excess_stored}
    if not st then return {nil, now_ms, true, 0} end
    local excess, last = st[1], st[2]
    local ms = now_ms - last
    local gap = ms
    if ms < 0 then ms = 0 end
    -- Beyond `p[4]` the whole excess (and the free request) has leaked: clamp first.
    local m = ms
    if m > p[4] then m = p[4] end
    local leak = divmod(p[1] * m, 1000)
    return {excess - leak, now_ms - gap, ms ~= 0, excess}
  end

  -- (need * 1000 + rate - 1) / rate, truncated toward zero as the engine's integer division is.
  local function ngx_ms_to_leak(p, need)
    local a = need * 1000 + p[1] - 1
    if a >= 0 then return (divmod(a, p[1])) end
    return -(divmod(-a, p[1]))
  end

  local function ngx_reset(p, L, u)
    if L[1] == nil then return 0 end
    -- leaked + leaked part = the stored excess.
    local need = L[4] + 1000
    return ngx_at(L[2] + ngx_ms_to_leak(p, need), u)
  end

  local function ngx_until_fits(p, L, c, u)
    if c > p[2] + 1 then return 0 end
    local excess = L[4]
    if L[1] == nil then excess = 0 end
    local need = excess + 1000 * c - p[2] * 1000
    local t = ngx_at(L[2] + ngx_ms_to_leak(p, need), u)
    if t < 1 then t = 1 end
    return t
  end

  local function nginx(p, st, u, c)
    local rate, burst = p[1], p[2]
    local now_ms = divmod(u, 1000)
    local limit, bound = burst + 1, burst * 1000
    local L = ngx_leak(p, st, now_ms)
    local e1 = 0
    if L[1] ~= nil then e1 = L[1] + 1000; if e1 < 0 then e1 = 0 end end
    local rem_now = 0
    if e1 <= bound then rem_now = divmod(bound - e1, 1000) + 1 end
    if c > limit then
      return {2, rem_now, ngx_reset(p, L, u), 0, ngx_until_fits(p, L, rem_now + 1, u)}
    end
    local ec = e1 + (c - 1) * 1000
    if ec <= bound then
      local last = L[2]
      if L[3] then last = now_ms end
      local delay = 0
      if p[3] >= 0 and ec > p[3] * 1000 then
        delay = divmod((ec - p[3] * 1000) * 1000, rate) * 1000000
      end
      local after = {ec, last, false, ec}
      local reset = ngx_reset(p, after, u)
      -- until_next
      local need = 1000 - (bound - ec) % 1000
      local ms = ceildiv(need * 1000, rate)
      local nxt = ngx_at(last + ms, u)
      if nxt < 1 then nxt = 1 end
      return {0, (divmod(bound - ec, 1000)), reset, delay, nxt, {ec, last}, reset}
    end
    local retry = ngx_until_fits(p, L, c, u)
    return {1, rem_now, ngx_reset(p, L, u), retry, ngx_until_fits(p, L, rem_now + 1, u)}
  end

  local function nginx_refund(p, st, u, c, receipt)
    if not st then return nil, 0 end
    local now_ms = divmod(u, 1000)
    local unpaid = 0
    local R = ngx_leak(p, receipt, now_ms)
    if receipt and R[1] ~= nil then
      local cc = c
      if cc > p[2] + 1 then cc = p[2] + 1 end
      unpaid = R[1] + 1000
      if unpaid < 0 then unpaid = 0 end
      if unpaid > cc * 1000 then unpaid = cc * 1000 end
    end
    local left = st[1] - unpaid
    if left < 0 then left = 0 end
    local ns = {left, st[2]}
    local L = ngx_leak(p, ns, now_ms)
    if L[1] <= -1000 then return nil, 0 end
    return ns, ngx_reset(p, L, u)
  end
  return {nginx, nginx_refund}
end

-- Discrete fill. p = {B, K, I_us}. State {deficit, k}.
local function make_discrete()
  local function disc_tokens(p, st, u)
    local B, K, I = p[1], p[2], p[3]
    local k_now = divmod(u, I)
    if not st then return B, k_now end
    local deficit = st[1]
    if deficit > B then deficit = B end
    if deficit == 0 then return B, k_now end
    local gap = k_now - st[2]
    if gap <= 0 then return B - deficit, st[2] end
    if gap >= ceildiv(deficit, K) then return B, k_now end
    return B - deficit + K * gap, k_now
  end

  local function disc_next(p, k, t, u)
    if t >= p[1] then return 0 end
    local at = ((k + 1) * p[3] - u) * 1000
    if at < 0 then return 0 end
    return at
  end

  local function disc_until(p, k, t, u)
    if t <= 0 then return 0 end
    local fills = ceildiv(t, p[2])
    local at = ((k + fills) * p[3] - u) * 1000
    if at < 0 then return 0 end
    return at
  end

  local function discrete(p, st, u, c)
    local B = p[1]
    local t, k = disc_tokens(p, st, u)
    if c > B then
      return {2, t, disc_until(p, k, B - t, u), 0, disc_next(p, k, t, u)}
    end
    if t >= c then
      local left = t - c
      local deficit = B - left
      local reset = disc_until(p, k, deficit, u)
      local ns = nil
      if deficit > 0 then ns = {deficit, k} end
      return {0, left, reset, 0, disc_next(p, k, left, u), ns, reset}
    end
    return {1, t, disc_until(p, k, B - t, u), disc_until(p, k, c - t, u), disc_next(p, k, t, u)}
  end

  local function discrete_refund(p, st, u, c, receipt)
    local B, K = p[1], p[2]
    local t, k = disc_tokens(p, st, u)
    if not receipt then return st, -1 end
    local left = B - receipt[1]
    if left < 0 then left = 0 end
    local gap = k - receipt[2]
    if gap < 0 then gap = 0 end
    local room = (B - left) - K * gap
    if room < 0 then room = 0 end
    local back = c
    if room < back then back = room end
    if B - t < back then back = B - t end
    local deficit = B - (t + back)
    if deficit == 0 then return nil, 0 end
    return {deficit, k}, disc_until(p, k, deficit, u)
  end
  return {discrete, discrete_refund}
end

-- Fixed window. p = {N, W_us, first (1/0)}. State {count, k} (clock) or {count, end_us} (first).
local function make_fixed()
  local function fixed_window(p, st, u)
    local N, W = p[1], p[2]
    local count = 0
    if st then count = st[1]; if count > N then count = N end end
    if p[3] == 0 then
      local k_now = divmod(u, W)
      local k = k_now
      if count > 0 then
        local gap = k_now - st[2]
        if gap > 0 then count = 0 elseif gap < 0 then k = st[2] end
      end
      local e = ((k + 1) * W - u) * 1000
      if e < 0 then e = 0 end
      return count, e, k
    end
    if count > 0 and st[2] > u then return count, (st[2] - u) * 1000, st[2] end
    return 0, W * 1000, u + W
  end

  local function fixed(p, st, u, c)
    local N = p[1]
    local count, e, low = fixed_window(p, st, u)
    local reset = 0
    if count > 0 then reset = e end
    if c > N then return {2, N - count, reset, 0, reset} end
    if count + c <= N then
      return {0, N - count - c, e, 0, e, {count + c, low}, e}
    end
    return {1, N - count, reset, e, e}
  end

  local function fixed_refund(p, st, u, c, receipt)
    local count, e, low = fixed_window(p, st, u)
    if not st then return nil, 0 end
    if count == 0 or not receipt or low ~= receipt[2] then return st, -1 end
    local back = c
    if back > count then back = count end
    if p[3] == 1 and receipt[1] == c then
      if count == back then return nil, 0 end
      return st, -1
    end
    count = count - back
    if count == 0 then return nil, 0 end
    return {count, low}, e
  end
  return {fixed, fixed_refund}
end

-- Sliding-window counter. p = {N, W_us}. State {prev, cur, k}.
local function make_sliding()
  local function sl_at(p, st, u)
    local W = p[2]
    local k_now, r = divmod(u, W)
    if not st or (st[1] == 0 and st[2] == 0) then return {0, 0, k_now, r} end
    local g = k_now - st[3]
    if g == 0 then return {st[1], st[2], k_now, r} end
    if g == 1 then return {st[2], 0, k_now, r} end
    if g > 1 then return {0, 0, k_now, r} end
    return {st[1], st[2], st[3], 0}
  end

  local function sl_estimate(p, at)
    return muldiv(at[1], p[2] - at[4], p[2]) + at[2]
  end

  -- W_ns - floor(((a+1) W_ns - 1) / q), at least 0 (ns).
  local function sl_first_r(p, q, a)
    if q == 0 then return 0 end
    local W = p[2]
    -- (a + 1) > q with W >= q makes the quotient above W: nothing to compute.
    if a + 1 > q and W >= q then return 0 end
    local qq, s = muldiv(a + 1, W, q)
    if qq > W then return 0 end
    local tail
    if s == 0 then tail = -1 else tail = divmod(1000 * s - 1, q) end
    local span = 1000 * qq + tail
    local r = W * 1000 - span
    if r < 0 then return 0 end
    return r
  end

  local function sl_wait(p, k, r, u)
    local t = (k * p[2] - u) * 1000 + r
    if t < 0 then return 0 end
    return t
  end

  local function sl_next_admit(p, at, c, u)
    local N, Wn = p[1], p[2] * 1000
    local a = N - (at[2] + c)
    if a >= 0 then
      local r = sl_first_r(p, at[1], a)
      if r < at[4] * 1000 then r = at[4] * 1000 end
      if r < Wn then return sl_wait(p, at[3], r, u) end
    end
    local r = sl_first_r(p, at[2], N - c)
    if r < Wn then return sl_wait(p, at[3] + 1, r, u) end
    return sl_wait(p, at[3] + 2, 0, u)
  end

  local function sl_reset(p, at, u)
    local Wn = p[2] * 1000
    if at[2] == 0 then
      local r = sl_first_r(p, at[1], 0)
      if r < at[4] * 1000 then r = at[4] * 1000 end
      if r > Wn then r = Wn end
      return sl_wait(p, at[3], r, u)
    end
    local r = sl_first_r(p, at[2], 0)
    if r < Wn then return sl_wait(p, at[3] + 1, r, u) end
    return sl_wait(p, at[3] + 2, 0, u)
  end

  local function sl_next_unit(p, at, est, u)
    if est == 0 then return 0 end
    local c = p[1] + 1 - est
    if c < 1 then c = 1 end
    return sl_next_admit(p, at, c, u)
  end

  local function sliding(p, st, u, c)
    local N = p[1]
    local at = sl_at(p, st, u)
    local est = sl_estimate(p, at)
    local remaining = N - est
    if remaining < 0 then remaining = 0 end
    if c > N then
      return {2, remaining, sl_reset(p, at, u), 0, sl_next_unit(p, at, est, u)}
    end
    if est + c <= N then
      local after = {at[1], at[2] + c, at[3], at[4]}
      local reset = sl_reset(p, after, u)
      return {0, remaining - c, reset, 0, sl_next_unit(p, after, est + c, u),
              {after[1], after[2], after[3]}, reset}
    end
    return {1, remaining, sl_reset(p, at, u), sl_next_admit(p, at, c, u),
            sl_next_unit(p, at, est, u)}
  end

  local function sliding_refund(p, st, u, c, receipt)
    if not st then return nil, 0 end
    local at = sl_at(p, st, u)
    if not receipt then return st, -1 end
    local g = at[3] - receipt[3]
    if g == 0 then
      local b = c; if b > at[2] then b = at[2] end; at[2] = at[2] - b
    elseif g == 1 then
      local b = c; if b > at[1] then b = at[1] end; at[1] = at[1] - b
    else
      return st, -1
    end
    if at[1] == 0 and at[2] == 0 then return nil, 0 end
    return {at[1], at[2], at[3]}, sl_reset(p, at, u)
  end
  return {sliding, sliding_refund}
end

-- Sliding log. p = {N, W_us}. The key is a list of "t_us cost" entries, oldest first.
local function make_log()
  local function log_decide(p, key, u, c, take)
    local N, W = p[1], p[2]
    local raw = call('LRANGE', key, 0, -1)
    local ts, cs = {}, {}
    local total = 0
    for i, e in ipairs(raw) do
      local f = parse(e)
      if not f or not f[2] then return nil, corrupt(key, e) end
      ts[i] = f[1]; cs[i] = f[2]; total = total + f[2]
    end
    local m = #ts
    local at = u
    if m > 0 and ts[m] > u then at = ts[m] end
    local oldest = at - W
    local expired, dead = 0, 0
    while expired < m and ts[expired + 1] < oldest do
      expired = expired + 1; dead = dead + cs[expired]
    end
    local live = total - dead
    local remaining = N - live
    local function reset_at(t) local x = (t - u) * 1000 + W * 1000 + 1; if x < 0 then return 0 end; return x end
    local reset = 0
    if live > 0 and m > 0 then reset = reset_at(ts[m]) end
    local nxt = 0
    if expired < m then nxt = reset_at(ts[expired + 1]) end
    if c > N then return {2, remaining, reset, 0, nxt} end
    if live + c <= N then
      if not take then return {0, remaining, reset, 0, nxt} end
      if live == 0 then nxt = reset_at(at) end
      if expired > 0 then call('LTRIM', key, expired, -1) end
      if m > expired and ts[m] == at then
        call('LSET', key, -1, fmt(at, cs[m] + c))
      else
        call('RPUSH', key, fmt(at, c))
      end
      local reset2 = reset_at(at)
      return {0, remaining - c, reset2, 0, nxt, 'log', reset2, {at}}
    end
    local freed, retry = 0, 0
    for i = expired + 1, m do
      freed = freed + cs[i]
      if live - freed + c <= N then retry = reset_at(ts[i]); break end
    end
    return {1, remaining, reset, retry, nxt}
  end

  local function log_refund(p, key, u, c, receipt)
    if not receipt then return end
    local raw = call('LRANGE', key, 0, -1)
    for i, e in ipairs(raw) do
      local f = parse(e)
      if f and f[2] and f[1] == receipt[1] then
        local left = f[2] - c
        if left <= 0 then
          call('LSET', key, i - 1, '')
          call('LREM', key, 1, '')
        else
          call('LSET', key, i - 1, fmt(f[1], left))
        end
        return
      end
    end
  end
  return {log_decide, log_refund}
end

-- The algorithms' functions are made when a call first needs them: a script's body runs on
-- every call, and making every algorithm's closures each time costs more than deciding.
local MAKERS = {
  gcra = make_gcra, leaky = make_leaky, nginx = make_nginx, discrete = make_discrete,
  fixed = make_fixed, sliding = make_sliding, log = make_log,
}
local made = {}
local function alg_of(name)
  local a = made[name]
  if not a then a = MAKERS[name](); made[name] = a end
  return a
end

-- A layer's policy arrives as one argument, 'algorithm p1 p2 p3 p4 p5 p6|policy' (after the bar,
-- the engine's text, which the native module decides with), and is parsed once:
-- a library keeps the parsed policies across calls (at most 1024, then it starts over), a
-- script for its one call. p[1..6] as given; p[7..10] derived (GCRA and the exact leaky
-- bucket: k = 1000 n, the full bucket's debt, the longest span ahead (us), one period (us)).
-- The algorithms only read p.
local POLICIES, npolicies = {}, 0

local function policy_of(text)
  local known = POLICIES[text]
  if known then return known[1], known[2] end
  local head = text
  local bar = find(text, '|', 1, true)
  if bar then head = sub(text, 1, bar - 1) end
  local alg, a, b, c, d, e, f = match(head,
    '^(%a+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+) (%-?%d+)$')
  if not alg or not MAKERS[alg] then
    error({err = format('ratewell: not a policy: %q', sub(text, 1, 64))})
  end
  local p = {tonum(a), tonum(b), tonum(c), tonum(d), tonum(e), tonum(f), 0, 0, 0, 0}
  if alg == 'gcra' or alg == 'leaky' then
    local k = 1000 * p[2]
    p[7] = k
    if alg == 'gcra' then p[8] = p[1] * p[3] else p[8] = (p[1] + 1) * p[3] end
    p[9] = divmod(p[5], k)
    p[10] = divmod(p[3], k)
  end
  if npolicies >= 1024 then POLICIES = {}; npolicies = 0 end
  POLICIES[text] = {alg, p}
  npolicies = npolicies + 1
  return alg, p
end

-- The batch's view of its string keys. `b.cache[key]` is the key's text, false when it is absent,
-- or true when it holds another type; `b.order` lists the keys written, `b.ms` their TTLs (ms).
-- Every request reads and writes here, so a later request of a batch sees an earlier one's
-- charge exactly as a later call would see it; the writes reach the keyspace once, when the
-- batch ends. The sliding log's lists are read and written in place.
local function read(b, key)
  local raw = b.cache[key]
  if raw == nil then raw = call('GET', key); b.cache[key] = raw end
  if raw == true then
    return nil, redis.error_reply(format('ratewell: %s holds another type, not a state', key))
  end
  if raw == false then return nil end
  return raw
end

local function write(b, key, text, ms)
  if b.ms[key] == nil then b.order[#b.order + 1] = key end
  b.cache[key] = text
  b.ms[key] = ms
end

-- Store `st` (nil: delete the key) with its TTL; returns the stored text.
local function store(b, key, st, ttl_ns, fixed_ttl)
  if st == nil then write(b, key, false, 0); return '' end
  local ms = fixed_ttl
  if not ms then ms = ceildiv(ttl_ns, 1000000); if ms < 1 then ms = 1 end end
  if st == 'log' then call('PEXPIRE', key, ms); return '' end
  local text = encode(st)
  write(b, key, text, ms)
  return text
end

-- A layer's mode and cost (see ARGV).
local function mode_of(flag, cost)
  if #flag == 1 then return flag, cost end
  local m, c = match(flag, '^([01qr]):(%d+)$')
  if m then return m, num(c) end
  return flag, cost
end

local PROBE = 1099511627776 -- 2^40: above every limit

-- The per-layer scratch of one request: a library reuses them across requests and calls (a
-- request reads only the entries 1..layers it wrote itself); `pending` is cleared of the
-- request's keys before it starts.
local results, states, seen, algs, ps, raws, modes, costs, pending = {}, {}, {}, {}, {}, {}, {},
  {}, {}

-- One request, its keys at keys[k + 1 .. k + layers] and its arguments at args[a + 1 ..] (`K`
-- and `A` above), appended to `out`; or an error reply, with nothing appended.
local function decide_one(b, keys, k, layers, args, a, out)
  local now
  local when = args[a + 1]
  if when == '' then
    if not b.now then
      local t = call('TIME')
      b.now = tonum(t[1]) * 1000000 + tonum(t[2])
    end
    now = b.now
  elseif #when == 8 then
    -- A time passed in: a little-endian double (whole microseconds), converted without strtod.
    now = sunpack('<d', when)
    if not exact(now) or now < 0 then error({err = 'ratewell: not a time'}) end
  else
    now = tonum(when)
  end
  local cost = num(args[a + 2])
  local op = args[a + 3]
  local ttl = args[a + 4]
  local fixed_ttl = nil
  if ttl ~= '' then fixed_ttl = num(ttl) end

  if op == 'refund' then
    for i = 1, layers do
      local alg, p = policy_of(args[a + 3 + 2 * i])
      -- A receipt is 'after|before': the state the charge stored and the one it replaced; a
      -- receipt of part of a charge is 'after' alone (it gives back only that part).
      local after_raw, before_raw, bar = split_receipt(args[a + 4 + 2 * layers + i])
      local receipt = nil
      if after_raw ~= '' then receipt = parse(after_raw) end
      local key = keys[k + i]
      if alg == 'log' then
        alg_of('log')[2](p, key, now, cost, receipt)
      else
        local raw, bad = read(b, key)
        if bad then return bad end
        local st = parse(raw)
        if st and receipt then
          if bar and raw == after_raw then
            -- Nothing since the charge: restore the state before it, bit for bit.
            if before_raw == '' then
              write(b, key, false, 0)
            else
              local before = parse(before_raw)
              local probe = alg_of(alg)[1](p, before, now, PROBE)
              store(b, key, before, probe[3], fixed_ttl)
            end
          else
            local ns, ttl_ns = alg_of(alg)[2](p, st, now, cost, receipt)
            if ttl_ns ~= -1 then store(b, key, ns, ttl_ns, fixed_ttl) end
          end
        end
      end
    end
    out[#out + 1] = 1
    return nil
  end

  -- Layers are decided in order, and a key named twice sees the charge its earlier layer would
  -- take (`pending`): two limits on one key count twice, as two calls would. Nothing is stored
  -- before every layer is decided.
  for i = 1, layers do pending[keys[k + i]] = nil end
  local all = true
  local quota_total, quota_rejected = 0, 0
  for i = 1, layers do
    local alg, p = policy_of(args[a + 3 + 2 * i])
    local mode, c = mode_of(args[a + 4 + 2 * i], cost)
    local key = keys[k + i]
    local r
    local st = nil
    raws[i] = nil
    if alg == 'log' then
      local bad
      r, bad = alg_of('log')[1](p, key, now, c, false)
      if bad then return bad end
    else
      local raw, bad = read(b, key)
      if bad then return bad end
      if raw then
        st = parse(raw)
        if not st then return corrupt(key, raw) end
        raws[i] = raw
      end
      local cur = st
      if pending[key] then cur = pending[key] end
      seen[i] = cur
      r = alg_of(alg)[1](p, cur, now, c)
      if mode ~= 'r' and r[1] == 0 and r[6] then pending[key] = r[6] end
    end
    results[i] = r; states[i] = st; algs[i] = alg; ps[i] = p; modes[i] = mode; costs[i] = c
    if mode == '0' then
      if r[1] ~= 0 then all = false end
    elseif mode == 'q' then
      quota_total = quota_total + 1
      if r[1] ~= 0 then quota_rejected = quota_rejected + 1 end
    end
  end
  if quota_total > 0 and quota_rejected == quota_total then all = false end

  -- A peek and every layer of a request that was not admitted (charged nothing) report the key's
  -- state as it is (remaining, reset and replenish before the request); a read layer of an
  -- admitted request, the state it was decided on: those of an impossible probe, with the
  -- request's own outcome and wait.
  for i = 1, layers do
    if op == 'peek' or not all or modes[i] == 'r' then
      local r = results[i]
      local s
      local st = states[i]
      if all and modes[i] == 'r' then st = seen[i] end
      if algs[i] == 'log' then s = alg_of('log')[1](ps[i], keys[k + i], now, PROBE, false)
      else s = alg_of(algs[i])[1](ps[i], st, now, PROBE) end
      r[2] = s[2]; r[3] = s[3]; r[5] = s[5]
    end
  end

  local at = #out + 1
  if all then out[at] = 1 else out[at] = 0 end
  for i = 1, layers do
    local r = results[i]
    local receipt = ''
    if op == 'take' and all and r[1] == 0 and modes[i] ~= 'r' then
      if algs[i] == 'log' then
        r = alg_of('log')[1](ps[i], keys[k + i], now, costs[i], true)
        -- The list exists now: it expires when its newest entry leaves the window.
        store(b, keys[k + i], 'log', r[7], fixed_ttl)
        receipt = fmt(r[8][1])
      else
        local text = store(b, keys[k + i], r[6], r[7], fixed_ttl)
        if r[6] then receipt = text .. '|' .. (raws[i] or '') end
      end
    end
    local base = at + 6 * (i - 1)
    out[base + 1] = r[1]; out[base + 2] = r[2]; out[base + 3] = r[3]
    out[base + 4] = r[4]; out[base + 5] = r[5]; out[base + 6] = receipt
  end
  return nil
end

-- A batch: requests decided in order, as if each were its own call made one after another, on
-- one reading of the server's clock. ARGV: the number of requests, then per request its number
-- of keys, its number of arguments and the arguments; KEYS: every request's keys, in order.
-- Returns one flat array: the server's time (us; 0 if no request read it), then per request its
-- fields (1 for a refund, 1 + 6 per layer otherwise), or an error reply and zeros in their place.
local function batch(keys, args)
  if not call then init() end
  local n = num(args[1])
  -- Where each request's keys and arguments start, and how many of each.
  local rk, rnk, ra, rna = {}, {}, {}, {}
  local ka, aa = 1, 2
  for r = 1, n do
    local nk, na = num(args[aa]), num(args[aa + 1])
    rk[r], rnk[r], ra[r], rna[r] = ka, nk, aa + 2, na
    ka = ka + nk; aa = aa + 2 + na
  end
  local b = {cache = {}, ms = {}, order = {}, now = nil}

  -- Every key not of the sliding log is read with one MGET, where a batch names two or more
  -- (one is read by its request, with GET). MGET answers nil for a key of another type as for
  -- an absent one: if any absent key exists, the types tell them apart.
  local want, wanted = {}, {}
  if n > 1 then
    for r = 1, n do
      local k0, a0 = rk[r] - 1, ra[r]
      for i = 1, rnk[r] do
        local key = keys[k0 + i]
        if not wanted[key] then
          local text = args[a0 + 2 + 2 * i]
          local known = POLICIES[text]
          local alg
          if known then
            alg = known[1]
          else
            local ok, parsed = pcall(policy_of, text)
            if ok then alg = parsed end
          end
          if alg and alg ~= 'log' then wanted[key] = true; want[#want + 1] = key end
        end
      end
    end
    if #want < 2 then want = {} end
  end
  -- (In chunks: Lua's stack holds some 8,000 values, and a batch may name more keys.)
  for from = 1, #want, 1000 do
    local to = from + 999
    if to > #want then to = #want end
    local got = call('MGET', unpk(want, from, to))
    local absent = {}
    for i = from, to do
      local raw = got[i - from + 1]
      b.cache[want[i]] = raw
      if not raw then absent[#absent + 1] = want[i] end
    end
    if #absent > 0 and call('EXISTS', unpk(absent)) > 0 then
      for i = 1, #absent do
        if call('TYPE', absent[i]).ok ~= 'none' then b.cache[absent[i]] = true end
      end
    end
  end

  local out = {0}
  for r = 1, n do
    local at = #out
    local ok, err = pcall(decide_one, b, keys, rk[r] - 1, rnk[r], args, ra[r] - 1, out)
    if not ok or err then
      if ok then
        -- An error reply, returned.
      elseif type(err) == 'table' and err.err then
        -- A command's error, raised.
      else
        err = redis.error_reply(tostring(err))
      end
      for j = #out, at + 1, -1 do out[j] = nil end
      out[at + 1] = err
      local len = 1 + 6 * rnk[r]
      if args[ra[r] + 2] == 'refund' then len = 1 end
      for j = 2, len do out[at + j] = 0 end
    end
  end

  local order, cache, ms = b.order, b.cache, b.ms
  for i = 1, #order do
    local key = order[i]
    local text = cache[key]
    if text then call('SET', key, text, 'PX', ms[key]) else call('DEL', key) end
  end
  if b.now then out[1] = b.now end
  return out
end
