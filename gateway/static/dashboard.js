// The warmfleet dashboard: reads the fleet stream (GET /dashboard/events, one `fleet`
// message a second) and draws it. No framework and no build step; the DOM is updated in
// place so that buttons, focus and the search box survive each update.
"use strict";

const KEY_STORAGE = "warmfleet-key";
const HISTORY_S = 600; // what the charts and the error table cover
const STALL_MS = 20000; // no byte for this long (keep-alives come every 15 s): reconnect
const FRESH_MS = 3500; // no update for this long: the data on show is marked stale
const BACKOFF_MS = [1000, 2000, 4000, 8000]; // reconnect delays, then the last one each time
const CHART_HEIGHT = 180; // px
const TIERS = ["hot", "warm", "spilling", "disk", "gone"];
const KV_COUNTERS = ["spills", "restores", "rejected_files", "failed_writes", "budget_deletions"];

const state = {
  controller: null, // aborts the stream being read
  retryTimer: null,
  backoffIndex: 0,
  lastUpdateAt: 0, // performance.now() of the latest fleet message
  history: [], // POINTs, oldest first
  previousWorkers: new Map(), // id -> the worker in the snapshot before, for step times
  charts: null, // {tokens, waiting} once there is data to draw
};
const rowItems = new WeakMap(); // table row -> the item it shows now

// ---- formatting

function formatBytes(n) {
  if (n == null) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = Number(n);
  let i = 0;
  while (value >= 1024 && i < units.length - 1) {
    value /= 1024;
    i += 1;
  }
  return i === 0 ? `${value} B` : `${value.toFixed(value < 10 ? 1 : 0)} ${units[i]}`;
}

function formatAge(seconds) {
  if (seconds == null) return "–";
  const s = Math.max(0, Number(seconds));
  if (s < 10) return `${s.toFixed(1)} s`;
  const whole = Math.round(s);
  if (whole < 60) return `${whole} s`;
  if (whole < 3600) return `${Math.floor(whole / 60)} min ${whole % 60} s`;
  if (whole < 86400) return `${Math.floor(whole / 3600)} h ${Math.floor((whole % 3600) / 60)} min`;
  return `${Math.floor(whole / 86400)} d ${Math.floor((whole % 86400) / 3600)} h`;
}

function formatRate(x) {
  if (x == null) return "–";
  const value = Number(x);
  return value < 10 ? value.toFixed(1) : Math.round(value).toLocaleString("en");
}

function formatUsage(usedBytes, budgetBytes) {
  const budget = Number(budgetBytes);
  return `${formatBytes(usedBytes)} / ${budget ? formatBytes(budget) : "no budget"}`;
}

function formatCount(n) {
  return n == null ? "–" : Number(n).toLocaleString("en");
}

// ---- small DOM helpers

function byId(id) {
  return document.getElementById(id);
}

function setText(element, text) {
  if (element.textContent !== text) element.textContent = text;
}

function setFigure(containerId, name, text, bad = false) {
  const dd = byId(containerId).querySelector(`[data-figure="${name}"]`);
  setText(dd, text);
  dd.classList.toggle("bad", bad);
}

// A meter of value against max (hidden when there is no max: no budget), and its label.
function setMeter(element, value, max, text) {
  const meter = element.querySelector("meter");
  meter.hidden = !(Number(max) > 0);
  meter.max = Math.max(1, Number(max));
  meter.value = Math.min(Number(value), meter.max);
  setText(element.querySelector("span"), text);
}

function showEmpty(tableId, empty) {
  document.querySelector(`[data-empty-for="${tableId}"]`).hidden = !empty;
  byId(tableId).hidden = empty;
}

// A cell's content is a string, or {value, max, text} for a meter with its label.
function createCell(name, numeric, content) {
  const td = document.createElement("td");
  td.dataset.col = name;
  if (numeric) td.className = "num";
  if (typeof content === "object") {
    td.append(document.createElement("meter"), " ", document.createElement("span"));
  }
  return td;
}

function fillCell(td, content) {
  if (typeof content === "object") setMeter(td, content.value, content.max, content.text);
  else setText(td, content);
}

// ---- tables: rows kept by key, in the order of the items

// spec: {key: data-attribute name, keyOf(item), columns: {name: (item, ctx) => content},
//        numeric: [names], marks(item): more data-attributes of the row (optional),
//        action: {name, label, enabled(item), run(item, button)} (optional)}
function createRow(spec, item, key, ctx) {
  const row = document.createElement("tr");
  row.dataset[spec.key] = key;
  for (const [name, content] of Object.entries(spec.columns)) {
    row.append(createCell(name, spec.numeric.includes(name), content(item, ctx)));
  }
  if (spec.action) {
    const button = document.createElement("button");
    button.type = "button";
    button.dataset.action = spec.action.name;
    button.textContent = spec.action.label;
    button.addEventListener("click", () => spec.action.run(rowItems.get(row), button));
    const td = document.createElement("td");
    td.append(button);
    row.append(td);
  }
  return row;
}

function fillRow(spec, row, item, ctx) {
  rowItems.set(row, item);
  Object.assign(row.dataset, spec.marks ? spec.marks(item) : {});
  for (const [name, content] of Object.entries(spec.columns)) {
    fillCell(row.querySelector(`[data-col="${name}"]`), content(item, ctx));
  }
  if (spec.action) {
    row.querySelector("button").disabled = !spec.action.enabled(item);
  }
}

// Makes the table's rows match `items`, reusing each row by its key.
function syncTable(tableId, spec, items, ctx) {
  const table = byId(tableId);
  const tbody = table.tBodies[0];
  const old = new Map([...tbody.rows].map((row) => [row.dataset[spec.key], row]));
  items.forEach((item, i) => {
    const key = spec.keyOf(item);
    let row = old.get(key);
    old.delete(key);
    if (!row) row = createRow(spec, item, key, ctx);
    fillRow(spec, row, item, ctx);
    if (tbody.rows[i] !== row) tbody.insertBefore(row, tbody.rows[i] || null);
  });
  for (const row of old.values()) row.remove();
  showEmpty(tableId, items.length === 0);
}

// ---- the panels

const LANES = {
  key: "lane",
  keyOf: (lane) => `${lane.priority}/${lane.tenant}`,
  columns: {
    priority: (lane) => lane.priority,
    tenant: (lane) => lane.tenant,
    depth: (lane) => formatCount(lane.depth),
    oldest: (lane) => formatAge(lane.oldest_age_s),
  },
  numeric: ["depth", "oldest"],
};

function renderQueues(queues, rates) {
  const running = Object.entries(queues.running).map(([tenant, n]) => `${tenant} ${n}`);
  setFigure("queues-panel", "waiting", formatCount(queues.waiting));
  setFigure("queues-panel", "admitted", rates ? formatRate(rates.admitted_per_s) : "–");
  setFigure("queues-panel", "refused", rates ? formatRate(rates.refused_per_s) : "–",
    Boolean(rates && rates.refused_per_s > 0));
  setFigure("queues-panel", "running", running.join(", ") || "0");
  syncTable("queues", LANES, queues.lanes, null);
}

const WORKERS = {
  key: "worker",
  keyOf: (w) => w.id,
  columns: {
    id: (w) => w.id,
    state: (w) => w.state,
    running: (w) => ({ value: w.running, max: w.slots, text: `${w.running} / ${w.slots}` }),
    paused: (w) => formatCount(w.paused),
    tokens: (w, ctx) => formatRate(ctx.rates && ctx.rates.tokens_per_s_by_worker[w.id]),
    step: (w, ctx) => formatStepMs(ctx.stepMs.get(w.id)),
    pool: (w) => ({
      value: w.pool_bytes, max: w.warm_budget, text: formatUsage(w.pool_bytes, w.warm_budget),
    }),
    sessions: (w) => formatCount(w.sessions),
    kv: (w) => w.kv_dtype || "–",
    perGib: (w) => formatRate(w.sessions_per_gib),
    heartbeat: (w) => `${formatAge(w.heartbeat_age_s)} ago`,
  },
  numeric: ["paused", "tokens", "step", "sessions", "perGib", "heartbeat"],
  marks: (w) => ({ state: w.state, stale: String(w.heartbeat_age_s > 5) }),
  action: { name: "drain", label: "drain", enabled: (w) => w.state === "alive", run: drainWorker },
};

function formatStepMs(ms) {
  return ms == null ? "–" : `${Number(ms).toFixed(1)} ms`;
}


// Mean step time per worker since the snapshot before (the rates' own when they have it).
function stepTimes(workers, rates) {
  const fromRates = rates && rates.step_ms_by_worker;
  const times = new Map();
  for (const w of workers) {
    const before = state.previousWorkers.get(w.id);
    const steps = before ? w.steps - before.steps : 0;
    const ms = steps > 0 ? ((w.step_seconds - before.step_seconds) * 1000) / steps : null;
    times.set(w.id, fromRates ? fromRates[w.id] : ms);
  }
  state.previousWorkers = new Map(workers.map((w) => [w.id, w]));
  return times;
}

function renderWorkers(workers, rates) {
  syncTable("workers", WORKERS, workers, { rates, stepMs: stepTimes(workers, rates) });
}

const SESSIONS = {
  key: "session",
  keyOf: (s) => `${s.tenant}/${s.session_id}`,
  columns: {
    id: (s) => s.session_id,
    tenant: (s) => s.tenant,
    tier: (s) => s.tier,
    worker: (s) => s.worker || "–",
    tokens: (s) => formatCount(s.tokens),
    bytes: (s) => formatBytes(s.bytes),
    last_use: (s, now) => `${formatAge(now - s.last_used)} ago`,
  },
  numeric: ["tokens", "bytes", "last_use"],
  marks: (s) => ({ tier: s.tier }),
  action: { name: "evict", label: "evict", enabled: (s) => s.tier === "warm", run: evictSession },
};

function renderSessions(sessions, now) {
  setText(byId("session-total"), `${formatCount(sessions.total)} in all`);
  renderTiers(sessions.tiers);
  syncTable("sessions", SESSIONS, sessions.recent, now);
  filterSessions();
}

function renderTiers(tiers) {
  const items = Object.keys(tiers).length === 0
    ? [Object.assign(document.createElement("li"), { textContent: "tiers unknown (kvstore down)" })]
    : TIERS.map((tier) => {
      const li = document.createElement("li");
      li.dataset.tier = tier;
      li.textContent = `${tier} ${formatCount(tiers[tier] || 0)}`;
      return li;
    });
  byId("session-tiers").replaceChildren(...items);
}

// Hides the rows that do not contain the search text (in id, tenant, tier or worker).
function filterSessions() {
  const query = byId("session-search").value.trim().toLowerCase();
  const rows = [...byId("sessions").tBodies[0].rows];
  let shown = 0;
  for (const row of rows) {
    const s = rowItems.get(row);
    const text = `${s.tenant}/${s.session_id} ${s.tier} ${s.worker}`.toLowerCase();
    row.hidden = query !== "" && !text.includes(query);
    if (!row.hidden) shown += 1;
  }
  const counted = query ? `${shown} of ${rows.length} shown` : `${rows.length} listed`;
  setText(byId("session-shown"), counted);
}

function renderKvstore(kvstore) {
  const pill = byId("kvstore-state");
  setText(pill, kvstore.alive ? "alive" : "down");
  pill.dataset.state = kvstore.alive ? "alive" : "down";
  const usage = kvstore.usage;
  const counters = usage ? usage.counters : {};
  for (const name of KV_COUNTERS) {
    setFigure("kvstore", name, usage ? formatCount(counters[name]) : "–",
      name !== "spills" && name !== "restores" && Number(counters[name]) > 0);
  }
  setFigure("kvstore", "num_files", usage ? formatCount(usage.disk.num_files) : "–");
  setFigure("kvstore", "events_behind", usage ? formatCount(usage.events_behind) : "–");
  const disk = document.querySelector('#kvstore [data-figure="disk"]');
  if (!usage) return setMeter(disk, 0, 0, "no report");
  const { used_bytes: used, budget_bytes: budget } = usage.disk;
  setMeter(disk, used, budget, formatUsage(used, budget));
}

// ---- errors by status, over the history

const ERRORS = {
  key: "code",
  keyOf: (e) => e.code,
  columns: {
    code: (e) => e.code,
    total: (e) => formatCount(Math.round(e.total)),
    last_min: (e) => formatCount(Math.round(e.lastMinute)),
    now: (e) => formatRate(e.now),
  },
  numeric: ["total", "last_min", "now"],
};

// Counts per status code: each point's rate times the time since the point before.
function countErrors(history) {
  const byCode = new Map();
  const latest = history.length ? history[history.length - 1] : null;
  history.forEach((point, i) => {
    const dt = i === 0 ? 1 : point.time - history[i - 1].time;
    for (const [code, perS] of Object.entries(point.errors_per_s || {})) {
      const e = byCode.get(code) || { code, total: 0, lastMinute: 0, now: 0 };
      e.total += perS * dt;
      if (latest.time - point.time < 60) e.lastMinute += perS * dt;
      if (point === latest) e.now = perS;
      byCode.set(code, e);
    }
  });
  return [...byCode.values()].filter((e) => e.total >= 0.5).sort((a, b) => b.total - a.total);
}

// ---- charts (uPlot)

// The history's span (at least a minute, at most HISTORY_S), ending at the newest point.
function timeRange(u, min, max) {
  return [Math.min(Math.max(min, max - HISTORY_S), max - 60), max];
}

function createChart(containerId, label, color) {
  const container = byId(containerId);
  const options = {
    title: label,
    width: container.clientWidth,
    height: CHART_HEIGHT,
    scales: {
      x: { time: true, range: timeRange },
      y: { range: (u, min, max) => [0, Math.max(1, (max || 0) * 1.1)] },
    },
    series: [{}, { label, stroke: color, fill: `${color}22`, width: 2, points: { show: false } }],
    axes: [{}, { size: 56 }],
    legend: { show: false }, // the title names the one series
  };
  return new uPlot(options, [[], []], container);
}

function updateCharts(history) {
  if (history.length === 0) return;
  if (!state.charts) {
    state.charts = {
      tokens: createChart("chart-tokens", "tokens / s", "#2563eb"),
      waiting: createChart("chart-waiting", "requests waiting", "#d97706"),
    };
  }
  const times = history.map((p) => p.time);
  state.charts.tokens.setData([times, history.map((p) => p.tokens_per_s)]);
  state.charts.waiting.setData([times, history.map((p) => p.waiting)]);
}

function resizeCharts() {
  for (const chart of Object.values(state.charts || {})) {
    chart.setSize({ width: chart.root.parentElement.clientWidth, height: CHART_HEIGHT });
  }
}

// ---- one fleet message

// The first message brings the history (which may end with its own point); later ones a point.
function addPoints(message) {
  if (message.history) state.history = message.history.slice();
  const last = state.history[state.history.length - 1];
  if (message.point && (!last || message.point.time > last.time)) state.history.push(message.point);
  const newest = state.history[state.history.length - 1];
  while (newest && state.history[0].time < newest.time - HISTORY_S) state.history.shift();
}

function onFleet(message) {
  state.backoffIndex = 0;
  state.lastUpdateAt = performance.now();
  setConnection("live", "");
  addPoints(message);
  const { snapshot, rates } = message;
  if (!snapshot) return; // the gateway has not read the fleet yet
  renderQueues(snapshot.queues, rates);
  renderWorkers(snapshot.workers, rates);
  renderSessions(snapshot.sessions, snapshot.time);
  renderKvstore(snapshot.kvstore);
  syncTable("errors", ERRORS, countErrors(state.history), null);
  updateCharts(state.history);
  setText(byId("updated"), `updated ${new Date(snapshot.time * 1000).toLocaleTimeString()}`);
}

// ---- the event stream: fetch (it can send the key; EventSource cannot) and SSE parsing

// Splits text/event-stream into messages ({event, data}); feed it text as it arrives.
function createSseParser() {
  let buffer = "";
  let event = "message";
  let data = [];
  return function push(text) {
    buffer += text;
    // a "\r" at the very end may be the first half of "\r\n": keep it for the next chunk
    const end = buffer.endsWith("\r") ? buffer.length - 1 : buffer.length;
    const lines = buffer.slice(0, end).split(/\r\n|\r|\n/);
    buffer = lines.pop() + buffer.slice(end);
    const messages = [];
    for (const line of lines) {
      if (line === "") {
        if (data.length) messages.push({ event, data: data.join("\n") });
        event = "message";
        data = [];
      } else if (!line.startsWith(":")) {
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") event = value;
        else if (field === "data") data.push(value);
      }
    }
    return messages;
  };
}

// Aborts `controller` when reset() has not been called for STALL_MS.
function startWatchdog(controller) {
  let timer = null;
  const reset = () => {
    clearTimeout(timer);
    timer = setTimeout(() => controller.abort(new Error("the stream went silent")), STALL_MS);
  };
  reset();
  return { reset, stop: () => clearTimeout(timer) };
}

async function readStream(body, watchdog) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  const parse = createSseParser();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    watchdog.reset();
    for (const message of parse(decoder.decode(value, { stream: true }))) {
      if (message.event === "fleet") onFleet(JSON.parse(message.data));
    }
  }
}

async function connect() {
  clearTimeout(state.retryTimer);
  if (state.controller) state.controller.abort(new Error("replaced"));
  const controller = new AbortController();
  state.controller = controller;
  const watchdog = startWatchdog(controller);
  setConnection("connecting", "");
  try {
    const access = await fetch("/dashboard/access", {
      headers: authHeaders(), signal: controller.signal, cache: "no-store",
    });
    if (!access.ok) throw new Error(`the gateway answered ${access.status}`);
    const caller = await access.json();
    if (!caller.admin) {
      forgetKey();
      return askForKey(caller.message);
    }
    const response = await fetch("/dashboard/events", {
      headers: authHeaders(), signal: controller.signal, cache: "no-store",
    });
    if (response.status === 401 || response.status === 403) {
      forgetKey();
      return askForKey(await errorMessage(response));
    }
    if (!response.ok) throw new Error(`the gateway answered ${response.status}`);
    await readStream(response.body, watchdog);
    if (state.controller === controller) scheduleReconnect("the stream ended");
  } catch (error) {
    if (state.controller === controller) scheduleReconnect(describeError(error));
  } finally {
    watchdog.stop();
  }
}

function describeError(error) {
  if (error instanceof TypeError) return "cannot reach the gateway";
  return error && error.message ? error.message : String(error);
}

function scheduleReconnect(reason) {
  const delay = BACKOFF_MS[Math.min(state.backoffIndex, BACKOFF_MS.length - 1)];
  state.backoffIndex += 1;
  setConnection("disconnected", `${reason}; retrying in ${delay / 1000} s`);
  state.retryTimer = setTimeout(connect, delay);
}

// Marks the data stale while a connected stream brings no update (the gateway cannot read
// the fleet: Redis is down).
function checkFreshness() {
  const silentMs = performance.now() - state.lastUpdateAt;
  const status = document.body.dataset.connection;
  if ((status === "live" || status === "stale") && silentMs > FRESH_MS) {
    setConnection("stale", `no update for ${Math.round(silentMs / 1000)} s`);
  }
}

function setConnection(status, detail) {
  document.body.dataset.connection = status;
  setText(byId("connection"), detail ? `${status}: ${detail}` : status);
}

// ---- the admin key

function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORAGE);
  byId("forget-key").hidden = !key;
  return key ? { Authorization: `Bearer ${key}` } : {};
}

function forgetKey() {
  sessionStorage.removeItem(KEY_STORAGE);
  byId("forget-key").hidden = true;
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    return body.error.message;
  } catch {
    return `the gateway answered ${response.status}`;
  }
}

function askForKey(message) {
  if (state.controller) state.controller.abort(new Error("key needed"));
  state.controller = null;
  clearTimeout(state.retryTimer);
  setConnection("key needed", "");
  byId("key-form").hidden = false;
  setText(byId("key-message"), message);
  byId("key-input").focus();
}

function onKeySubmit(event) {
  event.preventDefault();
  const input = byId("key-input");
  const key = input.value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY_STORAGE, key);
  input.value = "";
  byId("key-form").hidden = true;
  connect();
}

// ---- actions

// POSTs JSON with the key; resolves to {ok, data} or {ok: false, message}.
async function postAction(path, body) {
  try {
    const response = await fetch(path, {
      method: "POST",
      headers: { "Content-Type": "application/json", ...authHeaders() },
      body: JSON.stringify(body),
    });
    if (response.ok) return { ok: true, data: await response.json() };
    const message = await errorMessage(response);
    if (response.status === 401 || response.status === 403) askForKey(message);
    return { ok: false, message };
  } catch (error) {
    return { ok: false, message: describeError(error) };
  }
}

function report(text) {
  setText(byId("action-status"), `${new Date().toLocaleTimeString()}: ${text}`);
}

async function evictSession(session, button) {
  const name = `${session.tenant}/${session.session_id}`;
  button.disabled = true;
  const result = await postAction("/dashboard/api/evict", {
    tenant: session.tenant, session_id: session.session_id,
  });
  report(result.ok ? `evicted ${name}: now ${result.data.tier}`
    : `evict ${name}: ${result.message}`);
}

async function drainWorker(worker, button) {
  const question = `Drain ${worker.id}? It takes no new requests, `
    + "finishes its running ones, then exits.";
  if (!window.confirm(question)) return;
  button.disabled = true;
  const result = await postAction("/dashboard/api/drain", { worker_id: worker.id });
  report(result.ok ? `${worker.id} is draining` : `drain ${worker.id}: ${result.message}`);
}

// ---- start

function start() {
  byId("key-form").addEventListener("submit", onKeySubmit);
  byId("session-search").addEventListener("input", filterSessions);
  byId("forget-key").addEventListener("click", () => {
    forgetKey();
    connect();
  });
  window.addEventListener("resize", resizeCharts);
  setInterval(checkFreshness, 1000);
  connect();
}

start();
