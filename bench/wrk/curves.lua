-- wrk script for bench/curves.py: create N streams, or append to N streams.
--
-- The URL given to wrk is the base stream URL (http://127.0.0.1:P/v1/stream);
-- stream i is `{base}/{prefix}{i}`.
--
-- Parameters (after `--`):
--   mode=create    PUT streams 0..N-1 (application/octet-stream, no body), each once.
--                  Thread k of T creates [k*N/T, (k+1)*N/T).
--   mode=append    POST `size` bytes to a stream chosen at random in [0, N).
--                  With count=C the threads send C appends in total and stop;
--                  without it they run for wrk's -d.
--   streams=N  size=B  prefix=P  threads=T  count=C  seed=S
--
-- A thread that has had an answer to every request of its share prints
-- `CURVES_DONE <thread>` and stops; wrk itself only exits after -d or SIGINT,
-- so bench/curves.py sends SIGINT once every thread said it is done.
-- While the last answers of a share are outstanding, idle connections ask for
-- `GET /healthz` (fillers; their answers are not counted).
-- done() prints `BENCH_RESULT {json}` like append.lua (latency in microseconds;
-- fillers are in wrk's latency histogram, at most one per connection).

local threads = {}
local thread_count = 0

thread_id = 0
mode = "append"
first = 0          -- create: first stream of this thread's share
last = 0           -- create: one past the last one
share = -1         -- requests this thread must have answered (-1: run until -d)
issued = 0
calls = 0
answered = 0
ok_total = 0
non2xx_total = 0
non2xx = {}
finished = false
n_streams = 1
base = "/"
prefix = "c-"
put_headers = nil
post_headers = nil
body = ""
filler = nil

local function param(args)
  local p = { mode = "append", streams = 100, size = 256, prefix = "c-", threads = 1, count = -1, seed = 1 }
  for _, a in ipairs(args or {}) do
    local k, v = string.match(a, "^([%w_]+)=(.*)$")
    if k == "mode" or k == "prefix" then p[k] = v
    elseif k ~= nil then p[k] = tonumber(v)
    end
  end
  return p
end

function setup(thread)
  thread:set("thread_id", thread_count)
  thread_count = thread_count + 1
  table.insert(threads, thread)
end

function init(args)
  local p = param(args)
  mode = p.mode
  n_streams = p.streams
  prefix = p.prefix
  base = wrk.path or "/"
  if string.sub(base, -1) ~= "/" then base = base .. "/" end
  local t = p.threads
  if mode == "create" then
    first = math.floor(thread_id * n_streams / t)
    last = math.floor((thread_id + 1) * n_streams / t)
    share = last - first
  else
    if p.count >= 0 then
      share = math.floor((thread_id + 1) * p.count / t) - math.floor(thread_id * p.count / t)
    end
    body = string.rep("x", p.size)
  end
  put_headers = { ["Content-Type"] = "application/octet-stream", ["Content-Length"] = "0" }
  post_headers = { ["Content-Type"] = "application/octet-stream", ["Content-Length"] = tostring(p.size) }
  filler = wrk.format("GET", "/healthz")
  math.randomseed(p.seed * 1000 + thread_id)
end

function request()
  calls = calls + 1
  if calls == 1 then
    -- wrk calls request() once on thread 0 to check the script, and never sends
    -- that request: the first call of every thread is a filler, so no share is lost.
    return filler
  end
  if share >= 0 and issued >= share then
    return filler
  end
  issued = issued + 1
  if mode == "create" then
    return wrk.format("PUT", base .. prefix .. (first + issued - 1), put_headers, "")
  end
  return wrk.format("POST", base .. prefix .. math.random(0, n_streams - 1), post_headers, body)
end

function response(status, headers, rbody)
  if rbody ~= nil and string.find(rbody, '"store"', 1, true) then
    return -- a filler's answer
  end
  answered = answered + 1
  if status >= 200 and status < 300 then
    ok_total = ok_total + 1
  else
    non2xx_total = non2xx_total + 1
    local key = tostring(status)
    non2xx[key] = (non2xx[key] or 0) + 1
  end
  if share >= 0 and answered >= share and not finished then
    finished = true
    io.write(string.format("CURVES_DONE %d\n", thread_id))
    io.stdout:flush()
    pcall(function() wrk.thread:stop() end)
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
  for _, q in ipairs({50, 90, 99, 99.9}) do
    table.insert(pct, string.format('"%s": %d', tostring(q), latency:percentile(q)))
  end
  io.write(string.format(
    'BENCH_RESULT {"duration_us": %d, "requests": %d, "ok": %d, "non2xx": %d, ' ..
    '"non2xx_by_status": {%s}, ' ..
    '"socket_errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"min": %d, "mean": %.1f, "max": %d, "percentiles": {%s}}}\n',
    summary.duration, summary.requests, ok, bad, table.concat(status_parts, ", "),
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.mean, latency.max, table.concat(pct, ", ")))
end
