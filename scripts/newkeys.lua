-- wrk script of scripts/bench-compare.sh: POST /transfers, every request with a new
-- Idempotency-Key, a UUIDv7 as the Go client mints them (the thread's start time, 40 random bits
-- per thread read from /dev/urandom, and a counter), accounts
-- spread over 1..100000 so that no account is hot. Prints the latency percentiles and the
-- completed requests (new 201s, 503s of a router shedding load, anything else) on one line, for
-- the script to read.
local threads = {}
local counter = 0
local prefix

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  local f = assert(io.open("/dev/urandom", "rb"))
  local bytes = f:read(5)
  f:close()
  local hex = bytes:gsub(".", function(c) return string.format("%02x", c:byte()) end)
  local ms = os.time() * 1000
  -- unix_ts_ms (48 bits) - version 7, 12 random bits - variant 10, 12 random bits - 16 random bits
  -- and the counter
  prefix = string.format("%08x-%04x-7%s-%x%s-%s", math.floor(ms / 65536), ms % 65536, hex:sub(1, 3),
    8 + bytes:byte(5) % 4, hex:sub(4, 6), hex:sub(7, 10))
  -- each thread its own accounts: unseeded, every thread would draw the same sequence
  math.randomseed(bytes:byte(1) * 16777216 + bytes:byte(2) * 65536 + bytes:byte(3) * 256 + bytes:byte(4))
  created, shed, other = 0, 0, 0
end

function request()
  counter = counter + 1
  local src = math.random(1, 100000)
  local body = string.format('{"src":%d,"dst":%d,"amount":%d}', src, src % 100000 + 1, math.random(1, 100000))
  return wrk.format("POST", "/transfers", {
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = prefix .. string.format("%08x", counter),
  }, body)
end

function response(status, headers, body)
  if status == 201 and headers["Idempotent-Replayed"] == nil then
    created = created + 1
  elseif status == 503 then
    shed = shed + 1
  else
    other = other + 1
  end
end

function done(summary, latency, requests)
  local c, s, o = 0, 0, 0
  for _, t in ipairs(threads) do
    c = c + t:get("created")
    s = s + t:get("shed")
    o = o + t:get("other")
  end
  io.write(string.format("p50_ms=%.3f p99_ms=%.3f created=%d shed=%d other=%d\n",
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, c, s, o))
end
