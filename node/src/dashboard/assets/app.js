// gridlease dashboard: reads the node's control API (passed through by `gridlease dashboard`)
// every 1.5 s and draws it. No libraries, no external resources; everything is built with DOM
// calls (text is never parsed as HTML). Values the node cannot measure are null in the API
// and shown as "n/a", never 0.
"use strict";

const REFRESH_MS = 1500;
const UNIT = "GLU";
const DAYS = 14;

// The token comes in the URL's fragment (never sent to the server), is kept for this tab in
// sessionStorage and taken out of the address bar.
(function takeToken() {
  const m = /[#&]token=([^&]*)/.exec(location.hash);
  if (m) {
    sessionStorage.setItem("gridlease-token", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
})();
const token = () => sessionStorage.getItem("gridlease-token") || "";

// Anything the Content-Security-Policy blocked (there should be nothing: all is bundled);
// counted for the browser test.
window.cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.cspViolations.push(`${e.violatedDirective} ${e.blockedURI}`);
});

const $ = (id) => document.getElementById(id);
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}
const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

const na = (v, f) => (v === null || v === undefined ? "n/a" : f(v));
const money = (micros) => (micros / 1e6).toFixed(6) + " " + UNIT;
const short = (id) => (id.length > 12 ? id.slice(0, 12) : id);
// A time: the clock time for today, else the date too.
function when(ms) {
  if (!ms) return "—";
  const d = new Date(ms);
  const t = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  return dayKey(d) === dayKey(new Date()) ? t : `${d.getMonth() + 1}/${d.getDate()} ${t}`;
}
const dayKey = (d) =>
  d.getFullYear() + "-" + String(d.getMonth() + 1).padStart(2, "0") + "-" + String(d.getDate()).padStart(2, "0");

class Unauthorized extends Error {}
class ApiProblem extends Error {
  constructor(status, problem) {
    super((problem && problem.detail) || "HTTP " + status);
    this.status = status;
    this.problem = problem || {};
  }
}

async function api(path, opts) {
  const init = Object.assign({ headers: {} }, opts || {});
  init.headers.Authorization = "Bearer " + token();
  if (init.body) init.headers["Content-Type"] = "application/json";
  const r = await fetch(path, init);
  const text = await r.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (_) { body = null; }
  if (r.status === 401) throw new Unauthorized();
  if (!r.ok) throw new ApiProblem(r.status, body);
  return body;
}

// Live telemetry per running lease: the newest sample, and when it was taken.
const live = new Map();

async function refresh() {
  const [status, gpus, leases, ledger, volumes] = await Promise.all([
    api("/v1/status"), api("/v1/gpus"), api("/v1/leases"), api("/v1/ledger"), api("/v1/volumes"),
  ]);
  const running = leases.filter((l) => l.state === "running" && !l.volume);
  for (const id of [...live.keys()]) {
    if (!running.some((l) => l.lease_id === id)) live.delete(id);
  }
  await Promise.all(running.map(async (l) => {
    const prev = live.get(l.lease_id);
    try {
      const t = await api(`/v1/leases/${l.lease_id}/telemetry?after_ms=${prev ? prev.sample.at_ms : 0}`);
      const sample = t.samples.length ? t.samples[t.samples.length - 1] : prev && prev.sample;
      live.set(l.lease_id, { source: t.source, models: t.gpus, sample, lease: l });
    } catch (e) {
      if (e instanceof Unauthorized) throw e;
      if (prev) prev.lease = l; // keep the last sample; the next refresh asks again
    }
  }));
  drawHeader(status);
  drawGpus(gpus);
  drawLive();
  drawOffer(status.own_offer, status.schedule);
  drawLeases(leases.filter((l) => !l.volume));
  drawVolumes(volumes);
  drawChart(ledger, leases);
  $("updated").textContent = "updated " + new Date().toLocaleTimeString();
}

function drawHeader(s) {
  const up = s.uptime_s;
  $("node").textContent =
    `node ${short(s.peer_id)} · ${s.network} · v${s.version} · ${s.connected_peers} peer(s) · up ${Math.floor(up / 60)} min`;
}

function drawGpus(v) {
  const box = $("gpus");
  box.replaceChildren();
  if (!v.gpus.length) box.append(el("p", { class: "muted", text: v.note || "no GPUs" }));
  // Only a node with GPUs can offer: no settings to change otherwise.
  $("settings-section").hidden = !v.gpus.length;
  for (const g of v.gpus) {
    box.append(el("div", { class: "card gpu", "data-gpu": g.id },
      el("h3", { text: g.model }, el("span", { class: "tag", text: g.source })),
      el("div", { class: "muted small", text: g.id }),
      el("div", { text: `VRAM ${g.vram_mib} MiB` })));
  }
}

// A labelled value with a bar; no bar where there is no scale (an unknown limit, n/a).
function metric(label, fraction, value) {
  const bar = el("div");
  if (fraction !== null) bar.style.width = Math.max(0, Math.min(100, fraction * 100)).toFixed(1) + "%";
  return el("div", { class: "metric" },
    el("span", { class: "muted", text: label }),
    el("div", { class: fraction === null ? "meter none" : "meter" }, bar),
    el("span", { class: "value", text: value }));
}

function drawLive() {
  const box = $("live");
  box.replaceChildren();
  if (!live.size) box.append(el("p", { class: "muted", text: "no running lease" }));
  for (const [id, t] of live) {
    const s = t.sample;
    t.models.forEach((model, i) => {
      const g = (s && s.gpus[i]) || {};
      const tag = t.source === "scripted"
        ? el("span", { class: "tag scripted", text: "SCRIPTED: not a real GPU" })
        : el("span", { class: "tag", text: t.source === "none" ? "declared: not measured" : "driver" });
      const vram = g.vram_used_mib != null && g.vram_total_mib ? g.vram_used_mib / g.vram_total_mib : null;
      const power = g.power_w != null && g.power_limit_w ? g.power_w / g.power_limit_w : null;
      box.append(el("div", { class: "card live", "data-lease": id },
        el("h3", { text: `GPU ${i} · ${model}` }, tag),
        el("div", { class: "muted small", text: `lease ${short(id)} (${t.lease.role})` }),
        metric("utilisation", g.util_percent == null ? null : g.util_percent / 100, na(g.util_percent, (v) => v + " %")),
        metric("VRAM", vram, na(g.vram_used_mib, (v) => v + " MiB") + " / " + na(g.vram_total_mib, (v) => v + " MiB")),
        metric("power", power, na(g.power_w, (v) => v + " W")),
        metric("temperature", g.temp_c == null ? null : g.temp_c / 100, na(g.temp_c, (v) => v + " C")),
        metric("SM clock", null, na(g.sm_clock_mhz, (v) => v + " MHz")),
        el("div", { class: "muted small", text:
          `container CPU ${na(s && s.cpu_millicores, (v) => (v / 1000).toFixed(2) + " cores")}, memory ` +
          `${na(s && s.mem_used_mib, (v) => v + " MiB")} / ${na(s && s.mem_limit_mib, (v) => v + " MiB")}` })));
    });
  }
}

function drawOffer(o, schedule) {
  const box = $("offer");
  box.replaceChildren();
  if (!o) {
    const hint = $("settings-section").hidden ? "" : " (set a price below)";
    box.append(el("p", { class: "muted", text: "not offering anything" + hint }));
    return;
  }
  box.append(el("div", { class: "card offer", "data-offer": o.id },
    el("h3", { text: `offer ${short(o.id)}` }, el("span", { class: "tag", text: `seq ${o.seq}` })),
    el("div", { text: `${o.gpus} GPU(s) at ${o.price_per_gpu_hour} ${UNIT}/GPU-hour` }),
    el("div", { class: "muted small", text:
      `per GPU: ${o.ram_mib_per_gpu} MiB RAM, ${(o.cpu_millicores_per_gpu / 1000).toFixed(2)} cores, ${o.disk_gib_per_gpu} GiB disk` }),
    el("div", { class: "muted small", text:
      `reputation ${o.rep.toFixed(2)} (${o.completed} completed) · expires ${when(o.expires_at_ms)}` }),
    el("div", { class: "muted small schedule", text: schedule
      ? `hours ${schedule.hours} (${schedule.tz}): ${schedule.text}`
      : "hours: always" })));
  const price = $("set-price");
  if (document.activeElement !== price && !price.value) price.value = o.price_per_gpu_hour;
}

function timeline(l) {
  const w = 160, h = 14;
  const s = svg("svg", { width: w, height: h, viewBox: `0 0 ${w} ${h}`, class: "timeline" });
  s.append(svg("rect", { x: 0, y: 3, width: w, height: 8, rx: 3, fill: "#e8ecf1" }));
  if (l.started_at) {
    const total = l.duration_s * 1000;
    const end = l.closed_at || Date.now();
    const frac = Math.max(0, Math.min(1, (end - l.started_at) / total));
    const color = l.state === "running" ? "#2e9b57" : l.state === "failed" ? "#b3261e" : "#8a94a3";
    s.append(svg("rect", { x: 0, y: 3, width: (frac * w).toFixed(1), height: 8, rx: 3, fill: color }));
    s.append(svg("title", {}, `${Math.round(frac * 100)} % of ${l.duration_s} s`));
  }
  return s;
}

function drawLeases(leases) {
  const body = $("leases").tBodies[0];
  body.replaceChildren();
  $("no-leases").hidden = leases.length > 0;
  // Newest first.
  for (const l of [...leases].reverse()) {
    const deadline = l.started_at ? l.started_at + l.duration_s * 1000 : null;
    const left = l.time_left_s != null ? ` (${l.time_left_s} s left)` : "";
    const price = (l.price_per_gpu_hour / 1e6).toFixed(2);
    // The report's GPU figures do not say whether they were measured (declared GPUs report
    // 0): the live state above shows the GPUs, with n/a where unmeasured.
    const usage = l.usage
      ? `report #${l.usage.seq} · ${(l.usage.wall_ms / 1000).toFixed(0)} s · CPU ${(l.usage.cpu_ms / 1000).toFixed(1)} s`
      : "no report yet";
    body.append(el("tr", { "data-lease": l.lease_id },
      el("td", { title: l.lease_id, text: short(l.lease_id) }),
      el("td", { text: l.role }),
      el("td", { class: "state state-" + l.state, text: l.state }),
      el("td", { class: "num", text: String(l.gpus) }),
      el("td", { class: "num", text: price }),
      el("td", { text: when(l.started_at) }),
      el("td", { text: deadline ? when(deadline) + left : "—" }),
      el("td", {}, timeline(l)),
      el("td", { class: "usage", text: usage }),
      el("td", { class: "num cost", text: money(l.cost_so_far) }),
      el("td", { class: "num paid", text: money(l.paid) })));
  }
}

// A duration in seconds, as a person reads it (`6 d 23 h`, `12 min`).
function span(s) {
  if (s >= 86400) return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  if (s >= 3600) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  if (s >= 60) return `${Math.floor(s / 60)} min`;
  return `${s} s`;
}

// Volumes, live ones first, each with its renter or provider, what it costs and when it goes.
function drawVolumes(volumes) {
  const body = $("volumes").tBodies[0];
  body.replaceChildren();
  $("no-volumes").hidden = volumes.length > 0;
  const live = (v) => !["settled", "failed", "rejected"].includes(v.state);
  for (const v of [...volumes].sort((a, b) => live(b) - live(a))) {
    const vol = v.volume;
    const deleted = live(v)
      ? (v.time_left_s != null ? "in " + span(v.time_left_s) : "—")
      : "deleted";
    // What the renter has signed for, as time kept at this price.
    const rate = (vol.price_per_gib_hour * vol.size_gib) / 3600;
    const ahead = rate > 0 && v.started_at && live(v)
      ? when(v.started_at + Math.floor(v.authorised / rate) * 1000)
      : "—";
    const from = vol.from_lease ? ` (disk of lease ${short(vol.from_lease)})` : "";
    body.append(el("tr", { "data-volume": v.lease_id },
      el("td", { class: "name", text: vol.name + from }),
      el("td", { title: v.lease_id, text: short(v.lease_id) }),
      el("td", { text: v.role === "provider" ? "kept here" : "rented" }),
      el("td", { title: v.counterparty, text: short(v.counterparty) }),
      el("td", { class: "num", text: `${vol.size_gib} GiB` }),
      el("td", { class: "state state-" + v.state, text: v.state }),
      el("td", { class: "num", text: (vol.price_per_gib_hour / 1e6).toFixed(4) }),
      el("td", { class: "num cost", text: money(v.cost_so_far) }),
      el("td", { class: "paid-until", text: ahead }),
      el("td", { class: "deleted", text: deleted })));
  }
}

function drawChart(ledger, leases) {
  const started = new Map(leases.map((l) => [l.lease_id, l.started_at || l.closed_at]));
  const days = [];
  const today = new Date();
  for (let i = DAYS - 1; i >= 0; i--) {
    const d = new Date(today.getFullYear(), today.getMonth(), today.getDate() - i);
    days.push({ key: dayKey(d), label: `${d.getMonth() + 1}/${d.getDate()}`, earned: 0, spent: 0 });
  }
  const byKey = new Map(days.map((d) => [d.key, d]));
  for (const st of ledger.leases) {
    const at = started.get(st.lease_id);
    const d = byKey.get(dayKey(at ? new Date(at) : today));
    if (!d) continue;
    if (st.role === "provider") d.earned += st.total;
    else d.spent += st.total;
  }
  const W = 760, H = 200, L = 80, B = 24, T = 12;
  const max = Math.max(1, ...days.map((d) => Math.max(d.earned, d.spent)));
  const s = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "earnings and spending per day" });
  const plotH = H - B - T, slot = (W - L - 10) / DAYS, bw = Math.max(2, slot / 2 - 3);
  for (const f of [0, 0.5, 1]) {
    const y = T + plotH * (1 - f);
    s.append(svg("line", { x1: L, x2: W - 10, y1: y, y2: y, stroke: "#dde1e6" }));
    s.append(svg("text", { x: L - 6, y: y + 4, "text-anchor": "end" }, (max * f / 1e6).toFixed(4)));
  }
  days.forEach((d, i) => {
    const x = L + i * slot + 2;
    for (const [v, dx, color, what] of [[d.earned, 0, "#2e9b57", "earned"], [d.spent, bw + 1, "#d9822b", "spent"]]) {
      const h = (v / max) * plotH;
      const r = svg("rect", { x: x + dx, y: T + plotH - h, width: bw, height: Math.max(h, v > 0 ? 1 : 0), fill: color, class: what });
      r.append(svg("title", {}, `${d.key}: ${what} ${money(v)}`));
      s.append(r);
    }
    if (i % 2 === 1 || DAYS <= 7) s.append(svg("text", { x: x + bw, y: H - 8, "text-anchor": "middle" }, d.label));
  });
  s.append(svg("rect", { x: L + 8, y: T, width: 10, height: 10, fill: "#2e9b57" }));
  s.append(svg("text", { x: L + 22, y: T + 9 }, "earned"));
  s.append(svg("rect", { x: L + 78, y: T, width: 10, height: 10, fill: "#d9822b" }));
  s.append(svg("text", { x: L + 92, y: T + 9 }, "spent"));
  $("chart").replaceChildren(s);
  $("totals").textContent =
    `total earned ${money(ledger.total_earned)} · total spent ${money(ledger.total_spent)} · ` +
    (ledger.balanced ? "ledger balanced" : "LEDGER NOT BALANCED");
}

// Settings go through the same route as `gridlease provide` (PUT /v1/provide).
async function provide(body) {
  const out = $("settings-result");
  out.className = "muted";
  try {
    const s = await api("/v1/provide", { method: "PUT", body: JSON.stringify(body) });
    out.textContent = s.own_offer
      ? `offering ${s.own_offer.gpus} GPU(s) at ${s.own_offer.price_per_gpu_hour} ${UNIT}/GPU-hour`
      : "not offering anything";
  } catch (e) {
    if (e instanceof Unauthorized) return showAuthError();
    out.className = "error";
    out.textContent = e.message + (e.problem && e.problem.hint ? ` (${e.problem.hint})` : "");
  }
}
function wireSettings() {
$("settings").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const body = {};
  const price = $("set-price").value.trim();
  const hours = $("set-hours").value.trim();
  const avail = $("set-avail").value.trim();
  if (price) body.price = price;
  if (hours) body.max_hours = Number(hours);
  // The offered hours, as `gridlease provide --hours` takes them (in the node's time zone).
  if (avail) body.hours = avail;
  provide(body);
});
$("set-off").addEventListener("click", () => provide({ off: true }));
}

function showAuthError() {
  $("auth-error").hidden = false;
  $("content").hidden = true;
  $("node").textContent = "not connected";
}

async function loop() {
  try {
    await refresh();
    $("api-error").hidden = true;
  } catch (e) {
    if (e instanceof Unauthorized) {
      showAuthError();
      return; // a wrong token stays wrong: stop asking
    }
    // A problem from the dashboard or the node says what and what to do; anything else means
    // the dashboard itself is gone.
    const p = e instanceof ApiProblem ? e.problem : {};
    $("api-error").hidden = false;
    $("api-error").textContent = p.title
      ? `${p.title}: ${p.detail}` + (p.hint ? ` (${p.hint})` : "")
      : "the dashboard does not answer: " + e.message;
  }
  setTimeout(loop, REFRESH_MS);
}
// Loaded in <head> (so the CSP listener above sees the whole page parse); starts once the
// page is there.
document.addEventListener("DOMContentLoaded", () => {
  wireSettings();
  if (!token()) showAuthError();
  else loop();
});
