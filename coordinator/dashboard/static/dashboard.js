// knnmon dashboard: the map (Leaflet, canvas), the side panel, and the live feed (server-sent events).
// Reads only the app's own endpoints (/api/...): see coordinator/dashboard/app.py.
"use strict";

const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                 "#bcbd22", "#17becf"];
const colorOf = (w) => (w >= 0 ? PALETTE[w % PALETTE.length] : "#444");
const $ = (id) => document.getElementById(id);
const fmt = (x, d = 0) => (x === null || x === undefined ? "–" : Number(x).toLocaleString(undefined,
  {maximumFractionDigits: d, minimumFractionDigits: d}));
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})[c]);

const state = {selected: null, feed: null, measured: [], objectsSeen: 0, queriesShown: 0};
window.knnmon = state;  // for a look from the browser's console

const renderer = L.canvas({padding: 0.3});
const map = L.map("map", {preferCanvas: true, renderer, worldCopyJump: true, minZoom: 2}).setView([39, -96], 4);
map.attributionControl.setPrefix(false);
const base = L.layerGroup().addTo(map);
const heat = L.layerGroup().addTo(map);
const queries = L.layerGroup().addTo(map);
const arrivals = L.layerGroup().addTo(map);
const selection = L.layerGroup().addTo(map);
L.control.layers(null, {"worker heat": heat, "queries": queries, "objects arriving": arrivals}).addTo(map);
L.control.scale().addTo(map);

async function getJSON(url) {
  const r = await fetch(url);
  const body = await r.json().catch(() => ({error: r.statusText}));
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

function showError(msg) {
  $("error").textContent = msg || "";
  $("error").hidden = !msg;
}

// -- basemap: outlines shipped with the app; web tiles only when configured ------------------------
async function loadBasemap(cfg) {
  if (cfg.tiles) {
    L.tileLayer(cfg.tiles, {maxZoom: 19, attribution: "tiles: " + esc(new URL(cfg.tiles.replace(/[{}]/g, "")).host)})
      .addTo(base);
  }
  const outline = (path, obj, style) => getJSON(path).then((t) =>
    L.geoJSON(topojson.feature(t, t.objects[obj]), {style, interactive: false, renderer}).addTo(base));
  await outline("/static/vendor/world-atlas/countries-110m.json", "countries",
    {color: "#9aa", weight: 1, fillColor: "#f6f5f0", fillOpacity: cfg.tiles ? 0 : 1});
  await outline("/static/vendor/us-atlas/states-10m.json", "states",
    {color: "#bbb", weight: 0.7, fill: false});
  map.attributionControl.addAttribution("outlines: Natural Earth, US Census (us-atlas, world-atlas)");
}

// -- queries: thinned by the server for the view, heat cells by worker --------------------------------
let loadTimer = null;
function scheduleQueries() {
  clearTimeout(loadTimer);
  loadTimer = setTimeout(loadQueries, 200);
}

async function loadQueries() {
  const b = map.getBounds();
  const clamp = (x, lo, hi) => Math.max(lo, Math.min(hi, x));
  const bbox = [clamp(b.getWest(), -180, 180), clamp(b.getSouth(), -90, 90), clamp(b.getEast(), -180, 180),
                clamp(b.getNorth(), -90, 90)].map((x) => x.toFixed(5)).join(",");
  let got;
  try {
    got = await getJSON(`/api/queries?bbox=${bbox}&limit=2000`);
  } catch (e) {
    showError(`queries: ${e.message}`);
    return;
  }
  heat.clearLayers();
  const maxCell = Math.max(1, ...got.cells.map((c) => c[4]));
  for (const [w, s, e, n, count, worker] of got.cells) {
    const load = state.measured[worker] ?? 0;
    L.rectangle([[s, w], [n, e]], {renderer, stroke: false, fillColor: colorOf(worker),
      fillOpacity: 0.08 + 0.4 * Math.sqrt(count / maxCell) * (0.5 + load), interactive: false}).addTo(heat);
  }
  queries.clearLayers();
  for (const q of got.queries) {
    L.circleMarker([q.lat, q.lon], {renderer, radius: 3, weight: 1, color: colorOf(q.worker), fillOpacity: 0.8})
      .bindTooltip(`${esc(q.id)} · k=${q.k} · ${esc(q.keywords)} · worker ${q.worker}`)
      .on("click", () => select(q.id)).addTo(queries);
  }
  state.queriesShown = got.returned;
  $("view").textContent = `${fmt(got.returned)} of ${fmt(got.total)} queries in view shown ` +
    `(${fmt(got.registered)} registered${got.truncated ? ", list truncated" : ""})`;
}

// -- one query: its point, kNN markers with distances, the kNN circle, its changes ------------------
async function select(qid) {
  showError("");
  let got;
  try {
    got = await getJSON(`/api/results/${encodeURIComponent(qid)}`);
  } catch (e) {
    showError(e.message);
    return;
  }
  const first = state.selected !== qid;
  state.selected = qid;
  drawSelection(got, first);
  if (first) {
    $("q-changes").innerHTML = "";
    openFeed();
  }
}

function drawSelection(got, fit) {
  const q = got.query;
  selection.clearLayers();
  $("selected").hidden = false;
  $("q-id").textContent = q.id;
  $("q-meta").textContent = `keywords ${q.keywords.join(" ")} · k = ${q.k} · worker ${q.worker} · kNN radius ` +
    (got.radius_m === null ? "∞ (fewer than k matches)" : `${fmt(got.radius_m)} m`);
  const pts = [[q.lat, q.lon]];
  if (got.radius_m !== null) {
    L.circle([q.lat, q.lon], {radius: got.radius_m, color: "#c2185b", weight: 1.5, fillOpacity: 0.05,
      interactive: false}).addTo(selection);
  }
  const rows = [];
  got.result.forEach((o, i) => {
    rows.push(`<tr><td>${i + 1}</td><td title="${esc(o.id)}">${esc(o.id)}</td><td class="num">${fmt(o.distance_m)} m</td></tr>`);
    if (o.lat === undefined) return;
    pts.push([o.lat, o.lon]);
    L.marker([o.lat, o.lon], {icon: L.divIcon({className: "knn-result", html: String(i + 1), iconSize: [14, 14]}),
      title: `${o.id}: ${fmt(o.distance_m)} m`}).addTo(selection);
  });
  L.marker([q.lat, q.lon], {icon: L.divIcon({className: "knn-query", iconSize: [12, 12]}), title: q.id,
    zIndexOffset: 1000}).addTo(selection);
  $("q-result").querySelector("tbody").innerHTML = rows.join("");
  if (fit) map.fitBounds(L.latLngBounds(pts).pad(0.4), {maxZoom: 15});
}

// -- the live feed ----------------------------------------------------------------------------------
function openFeed() {
  if (state.feed) state.feed.close();
  const url = state.selected ? `/api/changes?qid=${encodeURIComponent(state.selected)}` : "/api/changes";
  const feed = state.feed = new EventSource(url);
  feed.addEventListener("objects", (ev) => onObjects(JSON.parse(ev.data)));
  feed.addEventListener("changes", (ev) => onChanges(JSON.parse(ev.data)));
  feed.addEventListener("status", (ev) => onStatus(JSON.parse(ev.data)));
}

function onObjects(msg) {
  const list = $("objects");
  for (const [id, lon, lat] of msg.objects) {
    const m = L.circleMarker([lat, lon], {renderer, radius: 5, color: "#e65100", weight: 1, fillOpacity: 0.9,
      interactive: false}).addTo(arrivals);
    let t = 0;
    const fade = setInterval(() => {  // fades over ~4 s, then goes
      t += 1;
      m.setStyle({opacity: 1 - t / 16, fillOpacity: 0.9 * (1 - t / 16)});
      if (t >= 16) { clearInterval(fade); arrivals.removeLayer(m); }
    }, 250);
    const li = document.createElement("li");
    li.textContent = id;
    list.prepend(li);
    state.objectsSeen += 1;
  }
  while (list.children.length > 15) list.lastChild.remove();
}

function onChanges(msg) {
  if (!state.selected || (!msg.query.length && !msg.behind)) return;
  const log = $("q-changes");
  for (const [, entered, left, version] of msg.query) {
    const li = document.createElement("li");
    li.textContent = `v${version}: ` + [entered.length ? `+ ${entered.join(" ")}` : "",
      left.length ? `− ${left.join(" ")}` : ""].filter(Boolean).join("  ");
    log.prepend(li);
  }
  while (log.children.length > 30) log.lastChild.remove();
  getJSON(`/api/results/${encodeURIComponent(state.selected)}`).then((got) => drawSelection(got, false))
    .catch((e) => showError(e.message));
}

function onStatus(s) {
  const svc = s.service;
  $("service").textContent = svc ? `${s.running ? "running" : "not running"} · ${svc.algorithm} on ` +
    `${svc.workers} workers` : "no service in this namespace";
  const w = s.workers;
  state.measured = w.measured_load || [];
  const pct = (xs, i) => (xs ? `${fmt(100 * (xs[i] ?? 0), 1)} %` : "–");
  $("workers").querySelector("tbody").innerHTML = w.queries.map((n, i) =>
    `<tr><td><span class="swatch" style="background:${colorOf(i)}"></span></td><td>${i}</td>` +
    `<td class="num">${fmt(n)}</td><td class="num">${pct(w.predicted_load, i)}</td>` +
    `<td class="num">${pct(w.measured_load, i)}</td></tr>`).join("");
  const r = s.recent, lag = s.objects_stream || {};
  const items = [
    ["queries", fmt(s.queries)],
    ["throughput", r.objects_per_s === null ? "–" : `${fmt(r.objects_per_s)} objects/s`],
    ["response p50 / p99", `${fmt(r.latency_ms_p50, 1)} / ${fmt(r.latency_ms_p99, 1)} ms`],
    ["stream lag", `${fmt(lag.undelivered)} waiting` + (lag.oldest_waiting_ms ? `, oldest ${fmt(lag.oldest_waiting_ms)} ms` : "")],
    ["rejects", fmt(s.rejects)],
    ["changes feed", `${fmt(s.changes)} entries`],
  ];
  $("stats").innerHTML = items.map(([k, v]) => `<dt>${k}</dt><dd>${v}</dd>`).join("");
}

// -- search --------------------------------------------------------------------------------------------
$("search-box").addEventListener("input", async (ev) => {
  const text = ev.target.value.trim();
  if (!text) return;
  try {
    const got = await getJSON(`/api/search?q=${encodeURIComponent(text)}`);
    $("search-ids").innerHTML = got.ids.map((id) => `<option value="${esc(id)}">`).join("");
  } catch (e) { /* the search list is a convenience */ }
});
$("search").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const qid = $("search-box").value.trim();
  if (qid) select(qid);
});

// -- start ---------------------------------------------------------------------------------------------
(async () => {
  const cfg = await getJSON("/api/config");
  document.title = `knnmon · ${cfg.namespace}`;
  map.on("moveend", scheduleQueries);
  await loadBasemap(cfg).catch((e) => showError(`basemap: ${e.message}`));
  await loadQueries();
  openFeed();
  const qid = new URLSearchParams(location.search).get("q");
  if (qid) select(qid);
})();
