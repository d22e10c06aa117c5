// metaq broker dashboard: polls /api/state and /api/history every second and redraws in place.
// No framework, no build: the DOM is updated row by row (keyed by data attributes) so that a form
// being filled in is never replaced under the operator's hands; the charts are drawn on <canvas>.
"use strict";

const POLL_MS = 1000;
const HISTORY_MAX = 600;
const COLORS = ["#2b6cb0", "#dd6b20", "#2f855a", "#b83280", "#6b46c1", "#c53030", "#319795", "#975a16"];

const state = { history: [], lastT: 0, data: null, busy: false };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function fmtRate(v) {
  if (v === null || v === undefined) return "-";
  if (v >= 1e6) return (v / 1e6).toFixed(2) + " M";
  if (v >= 1e3) return (v / 1e3).toFixed(1) + " k";
  return v.toFixed(v < 10 && v > 0 ? 1 : 0);
}
function fmtBytes(v) {
  if (v === null || v === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i ? v.toFixed(1) : v.toFixed(0)) + " " + units[i];
}
function fmtDuration(s) {
  s = Math.floor(s);
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  return `${m}m ${s % 60}s`;
}
function plural(count, noun) { return `${count} ${count === 1 ? noun : noun + "s"}`; }

// A chart's y-axis: four steps of a round size (1, 2, 2.5 or 5 times a power of ten), the top at or above the
// largest value, so the labels read 250, 500, 750, 1.0 k rather than 249, 499, 748, 997.
function niceStep(raw) {
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 2.5, 5]) if (raw <= m * power * (1 + 1e-9)) return m * power;
  return 10 * power;
}
function fmtTick(v, step) {
  if (v >= 1e3) return fmtRate(v);
  let digits = 0;
  while (digits < 6 && Math.abs(Math.round(step * 10 ** digits) - step * 10 ** digits) > 1e-9) digits++;
  return v.toFixed(digits);
}
function setText(node, text) { if (node && node.textContent !== String(text)) node.textContent = text; }

// -- notices and confirmation -----------------------------------------------------------------

function notice(text, isError) {
  const n = document.getElementById("notice");
  n.textContent = text;
  n.className = isError ? "error" : "";
  n.hidden = false;
}

function confirmAction(text) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.returnValue = "cancel";
    dialog.showModal();
  });
}

async function post(path, body) {
  const init = { method: "POST", headers: {} };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const reply = await fetch(path, init);
  const doc = await reply.json().catch(() => ({ error: { message: `HTTP ${reply.status}` } }));
  if (!reply.ok) throw new Error((doc.error && doc.error.message) || `HTTP ${reply.status}`);
  return doc;
}

async function togglePartition(topic, partition, open) {
  const verb = open ? "open" : "close";
  const what = open ? "Producers may write to it again." : "Producers are refused until it is opened again; consumers still read it.";
  if (!await confirmAction(`${verb[0].toUpperCase() + verb.slice(1)} partition ${partition} of topic ${topic}? ${what}`)) return;
  try {
    const done = await post(`/api/topics/${encodeURIComponent(topic)}/partitions/${encodeURIComponent(partition)}/${verb}`);
    notice(`partition ${done.partition} of ${done.topic} is ${done.state}`);
  } catch (err) {
    notice(`cannot ${verb} ${topic} ${partition}: ${err.message}`, true);
  }
  poll();
}

async function resetGroup(group, form) {
  const topic = form.querySelector("select[name=topic]").value;
  let to = form.querySelector("select[name=to]").value;
  if (to === "offset") to = form.querySelector("input[name=offset]").value.trim();
  if (!topic) { notice("choose a topic to reset", true); return; }
  if (!await confirmAction(`Reset group ${group}'s offsets on ${topic} to ${to}? The group must have no active members; its consumers will start from there.`)) return;
  try {
    const done = await post(`/api/groups/${encodeURIComponent(group)}/reset`, { topic, to });
    const moved = Object.entries(done.moved).map(([p, m]) => `${p}: ${m.from} → ${m.to}`).join(", ");
    notice(`reset ${group} on ${topic}: ${moved}`);
  } catch (err) {
    notice(`cannot reset ${group}: ${err.message}`, true);
  }
  poll();
}

// -- views ------------------------------------------------------------------------------------

function showView() {
  const view = (location.hash || "#overview").slice(1);
  for (const s of document.querySelectorAll("section.view")) s.hidden = s.id !== "view-" + view;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === view);
  drawCharts();
}

function renderBroker(b) {
  setText(document.getElementById("broker-title"), `broker ${b.id}`);
  document.title = `metaq broker ${b.id}`;
  const facts = document.getElementById("broker-facts");
  setText(facts.querySelector("[data-field=role]"), b.role);
  setText(facts.querySelector("[data-field=version]"), b.version);
  setText(facts.querySelector("[data-field=uptime]"), fmtDuration(b.uptime_s));
  setText(facts.querySelector("[data-field=connections]"), b.connections);
  setText(facts.querySelector("[data-field=cluster_mode]"), b.cluster_mode);
  setText(document.getElementById("rate-in-msg"), fmtRate(b.rates.in_msg_s));
  setText(document.getElementById("rate-out-msg"), fmtRate(b.rates.out_msg_s));
  setText(document.getElementById("rate-in-bytes"), fmtBytes(b.rates.in_bytes_s));
  setText(document.getElementById("rate-out-bytes"), fmtBytes(b.rates.out_bytes_s));
  setText(document.getElementById("fsync-mean"), b.fsync.mean_ms === null ? "-" : b.fsync.mean_ms.toFixed(2) + " ms");
  setText(document.getElementById("waiting-fetches"), b.waiting_fetches);
  const rg = document.getElementById("replica-group");
  if (b.replica_group) {
    const g = b.replica_group;
    const slaves = g.slaves && typeof g.slaves === "object"
      ? Object.entries(g.slaves).map(([id, s]) => `slave ${id}: ${s.in_sync ? "in sync" : "not in sync"}, ${s.messages_behind || 0} behind`).join("; ")
      : "";
    setText(rg, `replica group: ${g.role || b.role}, epoch ${g.epoch}${slaves ? " — " + slaves : ""}`);
  } else setText(rg, "");
}

// One block per item (topic or group), created once and updated in place.
function syncBlocks(container, items, key, create, update) {
  const seen = new Set();
  for (const item of items) {
    const id = item[key];
    seen.add(id);
    let block = [...container.children].find((c) => c.dataset.key === id);
    if (!block) { block = create(item); block.dataset.key = id; container.append(block); }
    update(block, item);
  }
  for (const block of [...container.children]) if (block.dataset && block.dataset.key !== undefined && !seen.has(block.dataset.key)) block.remove();
  if (!items.length && !container.querySelector(".empty")) container.append(el("p", { class: "empty" }, "none yet"));
  if (items.length) for (const e of container.querySelectorAll(".empty")) e.remove();
}

// Rows of a table body keyed by ``keyOf``; ``cells`` lists [field, text, class?] per row.
function syncRows(tbody, rows, keyOf, attrsOf, cells, extra) {
  const seen = new Set();
  for (const row of rows) {
    const k = keyOf(row);
    seen.add(k);
    let tr = [...tbody.children].find((r) => r.dataset.key === k);
    if (!tr) {
      tr = el("tr", attrsOf(row));
      tr.dataset.key = k;
      for (const [field, , cls] of cells(row)) tr.append(el("td", { "data-field": field, class: cls || "" }));
      if (extra) tr.append(el("td", { class: "actions" }));
      tbody.append(tr);
    }
    for (const [field, text, cls] of cells(row)) {
      const td = tr.querySelector(`td[data-field="${field}"]`);
      setText(td, text);
      if (cls !== undefined && td.className !== cls) td.className = cls;
    }
    if (extra) extra(tr.lastElementChild, row, tr);
  }
  for (const tr of [...tbody.children]) if (!seen.has(tr.dataset.key)) tr.remove();
}

const PARTITION_COLUMNS = ["partition", "state", "start offset", "end offset", "messages", "size", "segments",
  "in msg/s", "out msg/s", "in B/s", "out B/s", ""];

function renderTopics(topics) {
  syncBlocks(document.getElementById("topics-list"), topics, "name", (t) => {
    const table = el("table", {}, el("thead", {}, el("tr", {}, ...PARTITION_COLUMNS.map((c) => el("th", {}, c)))), el("tbody"));
    return el("div", { class: "block topic", "data-topic": t.name }, el("h2", {}, t.name), el("div", { class: "meta" }), table);
  }, (block, t) => {
    setText(block.querySelector(".meta"), `${plural(t.num_partitions, "partition")} here, ${plural(t.messages, "message")} stored, ` +
      `${fmtBytes(t.size_bytes)}, ${t.closed} closed — in ${fmtRate(t.in_msg_s)} msg/s, out ${fmtRate(t.out_msg_s)} msg/s`);
    syncRows(block.querySelector("tbody"), t.partitions, (p) => p.partition,
      (p) => ({ "data-topic": t.name, "data-partition": p.partition }),
      (p) => [["partition", p.partition], ["state", p.state, "text state-" + p.state], ["start_offset", p.start_offset],
        ["end_offset", p.end_offset], ["messages", p.messages], ["size", fmtBytes(p.size_bytes)], ["segments", p.segments],
        ["in_msg_s", fmtRate(p.in_msg_s)], ["out_msg_s", fmtRate(p.out_msg_s)], ["in_bytes_s", fmtBytes(p.in_bytes_s)],
        ["out_bytes_s", fmtBytes(p.out_bytes_s)]],
      (td, p, tr) => {
        tr.classList.toggle("closed", p.state === "closed");
        const wanted = p.state === "closed" ? "open" : "close";
        let button = td.querySelector("button");
        if (!button || button.dataset.action !== wanted) {
          td.replaceChildren(el("button", { "data-action": wanted, class: wanted === "close" ? "" : "",
            onclick: () => togglePartition(t.name, p.partition, wanted === "open") }, wanted === "close" ? "Close" : "Open"));
        }
      });
  });
}

const GROUP_COLUMNS = ["topic", "partition", "owner", "committed", "end offset", "lag"];

function renderGroups(groups, topics) {
  syncBlocks(document.getElementById("groups-list"), groups, "name", (g) => {
    const form = el("form", { class: "reset", "data-group": g.name },
      el("span", {}, "Reset offsets of"), el("select", { name: "topic" }), el("span", {}, "to"),
      el("select", { name: "to" }, el("option", { value: "earliest" }, "earliest"), el("option", { value: "latest" }, "latest"),
        el("option", { value: "offset" }, "offset…")),
      el("input", { name: "offset", type: "number", min: "0", placeholder: "offset" }),
      el("button", { type: "submit", class: "danger" }, "Reset…"));
    form.addEventListener("submit", (ev) => { ev.preventDefault(); resetGroup(g.name, form); });
    const table = el("table", {}, el("thead", {}, el("tr", {}, ...GROUP_COLUMNS.map((c) => el("th", {}, c)))), el("tbody"));
    return el("div", { class: "block group", "data-group": g.name }, el("h2", {}, g.name), el("div", { class: "meta" }),
      el("ul", { class: "members" }), table, form);
  }, (block, g) => {
    setText(block.querySelector(".meta"), `${g.state}, generation ${g.generation}, ${plural(g.members.length, "member")}, lag ${g.lag}`);
    block.dataset.lag = g.lag;
    const ul = block.querySelector(".members");
    const lines = g.members.map((m) => `${m.id} (${m.client_id}): ${m.owns.join(", ") || "nothing"}`);
    if (ul.dataset.text !== lines.join("\n")) {
      ul.dataset.text = lines.join("\n");
      ul.replaceChildren(...lines.map((l) => el("li", {}, l)));
    }
    syncRows(block.querySelector("tbody"), g.partitions, (p) => p.topic + ":" + p.partition,
      (p) => ({ "data-group": g.name, "data-topic": p.topic, "data-partition": p.partition }),
      (p) => [["topic", p.topic, "text"], ["partition", p.partition], ["owner", p.owner || "-"], ["committed", p.committed],
        ["end_offset", p.end_offset === null ? "-" : p.end_offset], ["lag", p.lag]]);
    const select = block.querySelector("select[name=topic]");
    const names = topics.map((t) => t.name);
    if (select.dataset.names !== names.join(",")) {
      const chosen = select.value || (g.partitions[0] && g.partitions[0].topic) || "";
      select.dataset.names = names.join(",");
      select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
      if (names.includes(chosen)) select.value = chosen;
    }
  });
}

function table(columns, rows, attrsOf) {
  return el("table", {}, el("thead", {}, el("tr", {}, ...columns.map(([, title]) => el("th", {}, title)))),
    el("tbody", {}, ...rows.map((r) => el("tr", attrsOf ? attrsOf(r) : {},
      ...columns.map(([field, , fmt]) => el("td", { "data-field": field, class: typeof r[field] === "string" ? "text" : "" },
        fmt ? fmt(r[field], r) : (r[field] === null || r[field] === undefined ? "-" : r[field])))))));
}

function renderCluster(doc) {
  const root = document.getElementById("cluster-list");
  const text = JSON.stringify(doc, (k, v) => (k === "read_at_ms" ? undefined : v));
  if (root.dataset.text === text) return;
  root.dataset.text = text;
  if (doc.mode !== "zookeeper") {
    root.replaceChildren(el("p", { class: "empty" }, `mode ${doc.mode}: ${doc.note || ""}`));
    return;
  }
  const blocks = [];
  if (doc.error) blocks.push(el("div", { class: "block error", id: "cluster-error" }, doc.error));
  for (const p of doc.problems || []) blocks.push(el("div", { class: "block error" }, p));
  blocks.push(el("div", { class: "block", id: "cluster-brokers" }, el("h2", {}, `Brokers (ZooKeeper ${doc.zookeeper}${doc.root})`),
    table([["broker_id", "broker id"], ["master", "master"], ["slaves", "slaves", (s) => Object.entries(s).map(([i, a]) => `${i}: ${a}`).join(", ") || "-"]],
      doc.brokers, (b) => ({ "data-broker": String(b.broker_id) }))));
  blocks.push(el("div", { class: "block", id: "cluster-topics" }, el("h2", {}, "Topics"),
    table([["topic", "topic"], ["partitions", "partitions"],
      ["publish", "publish (broker: partitions)", (m) => Object.entries(m).map(([b, n]) => `${b}: ${n}`).join(", ") || "-"],
      ["subscribe", "subscribe (broker: partitions)", (m) => Object.entries(m).map(([b, n]) => `${b}: ${n}`).join(", ") || "-"]],
    doc.topics, (t) => ({ "data-topic": t.topic }))));
  for (const g of doc.groups) {
    blocks.push(el("div", { class: "block cluster-group", "data-group": g.group }, el("h2", {}, `Group ${g.group}`),
      el("div", { class: "meta" }, `${plural(Object.keys(g.members).length, "member")}, lag ${g.lag}`),
      el("ul", { class: "members" }, ...Object.entries(g.members).map(([id, topics]) => el("li", {}, `${id}: ${topics.join(", ")}`))),
      table([["topic", "topic"], ["partition", "partition"], ["owner", "owner"], ["committed", "committed"],
        ["log_end", "end offset"], ["lag", "lag"]], g.partitions,
      (p) => ({ "data-group": g.group, "data-topic": p.topic, "data-partition": p.partition }))));
  }
  for (const r of doc.replication || []) {
    blocks.push(el("div", { class: "block" }, el("h2", {}, `Replica group ${r.broker_id}`),
      el("div", { class: "meta" }, `master ${r.master || "not registered"}${r.ha ? `, epoch ${r.ha.epoch}, in sync: ${r.ha.in_sync.join(", ") || "none"}` : ""}`),
      table([["slave_id", "slave"], ["address", "address"], ["following", "following"], ["max_lag_messages", "lag (messages)"],
        ["max_lag_ms", "lag (ms)"], ["error", "error"]], r.slaves)));
  }
  root.replaceChildren(...blocks);
}

// -- charts -----------------------------------------------------------------------------------

function drawChart(canvas, series, unit) {
  if (!canvas.offsetParent) return; // hidden view: drawn when shown
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (canvas.width !== w * dpr || canvas.height !== h * dpr) { canvas.width = w * dpr; canvas.height = h * dpr; }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const left = 48, right = 8, top = 18, bottom = 18;
  const points = series.flatMap((s) => s.points);
  const now = Date.now();
  const t0 = points.length ? Math.min(...points.map((p) => p[0])) : now - 60000;
  const t1 = points.length ? Math.max(...points.map((p) => p[0])) : now;
  const step = niceStep(Math.max(1, ...points.map((p) => p[1])) / 4), vmax = 4 * step;
  const x = (t) => left + (t1 === t0 ? 0 : (t - t0) / (t1 - t0)) * (w - left - right);
  const y = (v) => top + (1 - v / vmax) * (h - top - bottom);
  ctx.strokeStyle = "#d9dde5"; ctx.fillStyle = "#6a7285"; ctx.font = "11px system-ui, sans-serif"; ctx.lineWidth = 1;
  const ticks = [];
  for (let i = 0; i <= 4; i++) {
    const v = step * i, yy = y(v);
    ctx.beginPath(); ctx.moveTo(left, yy); ctx.lineTo(w - right, yy); ctx.stroke();
    ticks.push(fmtTick(v, step));
    ctx.fillText(ticks[i], 2, yy + 4);
  }
  canvas.dataset.ticks = ticks.join(",");
  const span = Math.round((t1 - t0) / 1000);
  ctx.fillText(`last ${fmtDuration(span)}`, left, h - 4);
  let lx = left;
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    ctx.strokeStyle = color; ctx.lineWidth = 1.5; ctx.beginPath();
    s.points.forEach(([t, v], j) => (j ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v))));
    ctx.stroke();
    ctx.fillStyle = color; ctx.fillText(s.name, lx, 12); lx += ctx.measureText(s.name).width + 14;
  });
  if (!points.length) { ctx.fillStyle = "#6a7285"; ctx.fillText("no samples yet", w / 2 - 30, h / 2); }
  const last = state.history.length ? state.history[state.history.length - 1].t : 0;
  canvas.dataset.samples = String(state.history.length);
  canvas.dataset.lastT = String(last);
  canvas.dataset.unit = unit;
}

function drawCharts() {
  const hist = state.history;
  drawChart(document.getElementById("chart-rates"), [
    { name: "produce msg/s", points: hist.map((s) => [s.t, s.in_msg_s]) },
    { name: "fetch msg/s", points: hist.map((s) => [s.t, s.out_msg_s]) }], "msg/s");
  drawChart(document.getElementById("chart-fsync"), [
    { name: "mean ms", points: hist.filter((s) => s.fsync_mean_ms !== null).map((s) => [s.t, s.fsync_mean_ms]) },
    { name: "slowest bucket ms", points: hist.filter((s) => s.fsync_max_ms !== null).map((s) => [s.t, s.fsync_max_ms]) }], "ms");
  const groups = [...new Set(hist.flatMap((s) => Object.keys(s.lag)))].sort().slice(0, COLORS.length);
  drawChart(document.getElementById("chart-lag"),
    groups.map((g) => ({ name: g, points: hist.filter((s) => g in s.lag).map((s) => [s.t, s.lag[g]]) })), "messages");
}

// -- polling ----------------------------------------------------------------------------------

async function getJSON(path) {
  const reply = await fetch(path, { cache: "no-store" });
  if (!reply.ok) throw new Error(`${path}: HTTP ${reply.status}`);
  return reply.json();
}

async function poll() {
  if (state.busy) return;
  state.busy = true;
  const live = document.getElementById("live");
  try {
    const [doc, hist] = await Promise.all([getJSON("/api/state"), getJSON(`/api/history?since=${state.lastT}`)]);
    state.data = doc;
    for (const s of hist.samples) if (s.t > state.lastT) state.history.push(s);
    if (state.history.length > HISTORY_MAX) state.history.splice(0, state.history.length - HISTORY_MAX);
    if (state.history.length) state.lastT = state.history[state.history.length - 1].t;
    renderBroker(doc.broker);
    renderTopics(doc.topics);
    renderGroups(doc.groups, doc.topics);
    document.getElementById("groups-note").hidden = doc.broker.cluster_mode !== "zookeeper";
    drawCharts();
    if (!document.getElementById("view-cluster").hidden) renderCluster(await getJSON("/api/cluster"));
    live.className = "live";
    setText(live, "live " + new Date().toLocaleTimeString());
    document.body.dataset.updated = String(Date.now());
  } catch (err) {
    live.className = "live off";
    setText(live, "disconnected: " + err.message);
  } finally {
    state.busy = false;
  }
}

window.addEventListener("hashchange", showView);
window.addEventListener("resize", drawCharts);
showView();
poll();
setInterval(poll, POLL_MS);
