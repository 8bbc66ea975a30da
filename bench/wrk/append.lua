-- wrk script: append load against a Durable Streams server.
--
-- Every request is `POST {base-path}/{name-prefix}{i}` with an
-- `application/octet-stream` body of SIZE bytes, where i walks the N streams
-- round-robin.  Each wrk thread starts at a different stream (thread k of T
-- starts at k*N/T) so the connections of all threads spread over all streams.
--
-- The URL given to wrk is the *base stream URL* (for example
-- http://127.0.0.1:8080/v1/stream); its path is used as the prefix of every
-- stream path, so the same script works for any server layout.
--
-- Parameters (wrk script arguments after `--` override environment variables):
--   streams=N    BENCH_STREAMS      number of streams (default 100)
--   size=B       BENCH_SIZE         body size in bytes (default 256)
--   prefix=P     BENCH_NAME_PREFIX  stream name prefix (default "bench-")
--   threads=T    BENCH_THREADS      wrk's -t value, used only to spread the
--                                   threads' starting streams (default 1)
--
-- The streams must already exist (bench/run.py creates them with PUT).
-- BENCH_AUTHORIZATION, when set, is sent as the Authorization header.
--
-- done() prints one machine-readable line:
--   BENCH_RESULT {json}
-- with request counts, per-status counts of non-2xx responses, socket errors
-- and latency percentiles in microseconds.  bench/run.py parses that line.
--
-- Example:
--   wrk -t2 -c64 -d10s --latency -s bench/wrk/append.lua \
--       http://127.0.0.1:8080/v1/stream -- streams=100 size=256 prefix=bench- threads=2

local threads = {}       -- setup/done environment: every thread object
local thread_count = 0   -- setup/done environment: threads seen so far

-- Per-thread globals (each wrk thread has its own Lua state).
thread_id = 0
requests_list = nil
next_index = 1
non2xx = {}              -- status code (as string) -> count
non2xx_total = 0
ok_total = 0

local function parse_params(args)
  local p = {
    streams = tonumber(os.getenv("BENCH_STREAMS") or "") or 100,
    size = tonumber(os.getenv("BENCH_SIZE") or "") or 256,
    prefix = os.getenv("BENCH_NAME_PREFIX") or "bench-",
    threads = tonumber(os.getenv("BENCH_THREADS") or "") or 1,
  }
  for _, a in ipairs(args or {}) do
    local k, v = string.match(a, "^([%w_]+)=(.*)$")
    if k == "streams" then p.streams = tonumber(v)
    elseif k == "size" then p.size = tonumber(v)
    elseif k == "prefix" then p.prefix = v
    elseif k == "threads" then p.threads = tonumber(v)
    else
      io.stderr:write("append.lua: ignoring unknown argument '" .. tostring(a) .. "'\n")
    end
  end
  if not p.streams or p.streams < 1 then error("append.lua: streams must be >= 1") end
  if not p.size or p.size < 1 then error("append.lua: size must be >= 1") end
  if not p.threads or p.threads < 1 then p.threads = 1 end
  return p
end

local function make_body(size)
  -- Deterministic, non-constant bytes (printable, so logs stay readable).
  local alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
  local parts = {}
  local n = #alphabet
  for i = 1, size do
    local j = ((i * 7) % n) + 1
    parts[i] = string.sub(alphabet, j, j)
  end
  return table.concat(parts)
end

function setup(thread)
  thread:set("thread_id", thread_count)
  thread_count = thread_count + 1
  table.insert(threads, thread)
end

function init(args)
  local p = parse_params(args)
  local base = wrk.path or "/"
  if string.sub(base, -1) ~= "/" then base = base .. "/" end
  local body = make_body(p.size)
  local headers = {
    ["Content-Type"] = "application/octet-stream",
    ["Content-Length"] = tostring(#body),
  }
  -- A server with --auth needs a credential (never on the command line: from the environment).
  local authorization = os.getenv("BENCH_AUTHORIZATION") or ""
  if authorization ~= "" then headers["Authorization"] = authorization end
  -- Pre-build every request once; request() is then a table lookup.
  requests_list = {}
  for i = 0, p.streams - 1 do
    requests_list[i + 1] = wrk.format("POST", base .. p.prefix .. i, headers, body)
  end
  -- init() runs right after setup() for the same thread, before later threads
  -- exist, so the thread count comes from the `threads=` argument.
  next_index = (math.floor(thread_id * p.streams / p.threads) % p.streams) + 1
end

function request()
  local r = requests_list[next_index]
  next_index = next_index + 1
  if next_index > #requests_list then next_index = 1 end
  return r
end

function response(status, headers, body)
  if status >= 200 and status < 300 then
    ok_total = ok_total + 1
  else
    non2xx_total = non2xx_total + 1
    local key = tostring(status)
    non2xx[key] = (non2xx[key] or 0) + 1
  end
end

function done(summary, latency, requests)
  local ok, bad = 0, 0
  local by_status = {}
  for _, t in ipairs(threads) do
    ok = ok + (t:get("ok_total") or 0)
    bad = bad + (t:get("non2xx_total") or 0)
    local m = t:get("non2xx") or {}
    for k, v in pairs(m) do by_status[k] = (by_status[k] or 0) + v end
  end
  local status_parts = {}
  for k, v in pairs(by_status) do
    table.insert(status_parts, string.format('"%s": %d', k, v))
  end
  local e = summary.errors
  local pct = {}
  for _, q in ipairs({50, 75, 90, 99, 99.9}) do
    table.insert(pct, string.format('"%s": %d', tostring(q), latency:percentile(q)))
  end
  io.write(string.format(
    'BENCH_RESULT {"duration_us": %d, "requests": %d, "ok": %d, "non2xx": %d, ' ..
    '"non2xx_by_status": {%s}, "bytes_received": %d, ' ..
    '"socket_errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"min": %d, "mean": %.1f, "max": %d, "stdev": %.1f, "percentiles": {%s}}}\n',
    summary.duration, summary.requests, ok, bad,
    table.concat(status_parts, ", "), summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.mean, latency.max, latency.stdev, table.concat(pct, ", ")))
  if bad > 0 then
    io.write(string.format("append.lua: %d non-2xx responses:", bad))
    for k, v in pairs(by_status) do io.write(string.format(" %s=%d", k, v)) end
    io.write("\n")
  end
end
