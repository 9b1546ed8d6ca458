// The status page: renders each document /admin/live sends (the /admin/status document).
// Every figure shown from the document carries its path in data-figure; figures worked
// out here (shares, totals over the history) carry data-derived.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const SERIES = [
  ["offered", "offered"],
  ["accepted", "accepted"],
  ["met", "goodput (met its SLOs)"],
];
const HISTORY_S = 300;
const SMOOTH_S = 5;
const CHART = { width: 720, height: 180, left: 44, right: 8, top: 10, bottom: 22 };

function at(doc, path) {
  return path.reduce((node, key) => (node === null || node === undefined ? undefined : node[key]), doc);
}

function fmt(value) {
  return value === null || value === undefined ? "–" : String(value);
}

function cell(text, tag = "td") {
  const element = document.createElement(tag);
  element.textContent = text;
  return element;
}

function figure(doc, path, tag = "td") {
  const element = cell(fmt(at(doc, path)), tag);
  element.dataset.figure = JSON.stringify(path);
  return element;
}

function derived(name, value, tag = "td") {
  const element = cell(fmt(value), tag);
  element.dataset.derived = name;
  return element;
}

function row(cells) {
  const tr = document.createElement("tr");
  tr.append(...cells);
  return tr;
}

function fill(id, rows) {
  document.querySelector(`#${id} tbody`).replaceChildren(...rows);
}

function lanes(doc) {
  const rows = [];
  for (const [model, entry] of Object.entries(doc.models)) {
    for (const [lane, figures] of Object.entries(entry.lanes)) {
      const base = ["models", model, "lanes", lane];
      const slo = ["slo", "models", model, lane];
      const counters = cell("");
      for (const tenant of Object.keys(figures.service)) {
        const span = figure(doc, [...base, "service", tenant], "span");
        counters.append(cell(`${tenant} `, "span"), span, cell(" ", "span"));
      }
      rows.push(row([
        cell(model), cell(lane),
        figure(doc, [...base, "queued"]), figure(doc, [...base, "oldest_age_s"]),
        figure(doc, [...base, "in_flight"]),
        figure(doc, [...slo, "offered"]), figure(doc, [...slo, "accepted"]),
        figure(doc, [...slo, "met"]), figure(doc, [...slo, "attainment"]),
        derived(JSON.stringify(["micro_per_success", model, lane]), microPerSuccess(at(doc, slo))),
        counters,
      ]));
    }
  }
  fill("lanes", rows);
}

function tenants(doc) {
  const byTenant = doc.slo.tenants;
  const laneTotals = {};
  for (const lanes of Object.values(byTenant)) {
    for (const [lane, figures] of Object.entries(lanes)) {
      laneTotals[lane] = (laneTotals[lane] || 0) + figures.accepted;
    }
  }
  const rows = [];
  for (const [tenant, lanes] of Object.entries(byTenant)) {
    for (const [lane, figures] of Object.entries(lanes)) {
      const base = ["slo", "tenants", tenant, lane];
      const total = laneTotals[lane];
      const share = total ? (figures.accepted / total).toFixed(3) : null;
      rows.push(row([
        cell(tenant), cell(lane),
        figure(doc, [...base, "offered"]), figure(doc, [...base, "accepted"]),
        figure(doc, [...base, "met"]), figure(doc, [...base, "attainment"]),
        derived(JSON.stringify(["share", tenant, lane]), share),
      ]));
    }
  }
  fill("tenants", rows);
}

function microPerSuccess(figures) {
  if (!figures || !figures.priced_successes) return null;
  return (figures.success_nanos / figures.priced_successes / 1000).toFixed(3);
}

// Whole nanodollars as exact dollars: no float rounding on the way.
function dollars(nanos) {
  return `${Math.floor(nanos / 1e9)}.${String(nanos % 1e9).padStart(9, "0")}`;
}

function spend(doc) {
  const rows = [];
  const spent = doc.spend || { tenants: {} };
  for (const [tenant, models] of Object.entries(spent.tenants)) {
    for (const [model, figures] of Object.entries(models)) {
      const base = ["spend", "tenants", tenant, model];
      rows.push(row([
        cell(tenant), cell(model),
        derived(JSON.stringify(["dollars", tenant, model]), dollars(figures.nanos)),
        derived(JSON.stringify(["estimated_dollars", tenant, model]), dollars(figures.estimated_nanos)),
        figure(doc, [...base, "prompt_tokens"]), figure(doc, [...base, "output_tokens"]),
        figure(doc, [...base, "attempts"]),
      ]));
    }
  }
  fill("spend", rows);
  const unpriced = spent.unpriced_deployments || "none";
  document.getElementById("unpriced").replaceChildren(derived(JSON.stringify(["unpriced"]), unpriced, "span"));
}

function pools(doc) {
  fill("pools", Object.keys(doc.pools).map((pool) => row([
    cell(pool),
    figure(doc, ["pools", pool, "active"]), figure(doc, ["pools", pool, "limit"]),
    figure(doc, ["pools", pool, "cooldown_s"]),
  ])));
}

function deployments(doc) {
  const rows = [];
  for (const [model, entry] of Object.entries(doc.models)) {
    for (const deployment of Object.keys(entry.deployments)) {
      const base = ["models", model, "deployments", deployment];
      rows.push(row([
        cell(model), cell(deployment),
        figure(doc, [...base, "gate"]), figure(doc, [...base, "circuit"]),
        figure(doc, [...base, "backend", "running"]), figure(doc, [...base, "backend", "waiting"]),
        figure(doc, [...base, "backend", "kv_usage"]), figure(doc, [...base, "backend", "tpot_s"]),
      ]));
    }
  }
  fill("deployments", rows);
}

function svg(tag, attributes, text) {
  const element = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, value);
  if (text !== undefined) element.textContent = text;
  return element;
}

function smoothed(values) {
  // Requests are counted as they end, so a second's count comes in bursts: each point is
  // the mean of its second and the SMOOTH_S - 1 before it.
  return values.map((_, i) => {
    const from = Math.max(0, i - SMOOTH_S + 1);
    const window = values.slice(from, i + 1);
    return window.reduce((a, b) => a + b, 0) / window.length;
  });
}

function chart(history) {
  const span = HISTORY_S;
  const first = history.now_s - span + 1;
  const series = SERIES.map(([key]) => {
    const values = new Array(span).fill(0);
    for (const [second, counts] of Object.entries(history.seconds)) {
      const index = Number(second) - first;
      if (index >= 0 && index < span) values[index] = counts[key];
    }
    return smoothed(values);
  });
  const top = Math.max(1, ...series.flat());
  const { width, height, left, right, top: pad, bottom } = CHART;
  const x = (index) => left + (index * (width - left - right)) / (span - 1);
  const y = (value) => height - bottom - (value * (height - bottom - pad)) / top;
  const picture = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", class: "chart" });
  picture.append(svg("title", {}, "requests per second: offered, accepted and goodput"));
  for (const value of [0, top / 2, top]) {
    picture.append(svg("line", { x1: left, x2: width - right, y1: y(value), y2: y(value), class: "grid" }));
    picture.append(svg("text", { x: left - 4, y: y(value) + 4, class: "axis" }, fmt(Math.round(value * 10) / 10)));
  }
  picture.append(svg("text", { x: left, y: height - 4, class: "axis start" }, `-${HISTORY_S} s`));
  picture.append(svg("text", { x: width - right, y: height - 4, class: "axis" }, "now"));
  series.forEach((values, index) => {
    const points = values.map((value, i) => `${x(i).toFixed(1)},${y(value).toFixed(1)}`).join(" ");
    picture.append(svg("polyline", { points, class: `series s${index}` }));
  });
  document.getElementById("chart").replaceChildren(picture);
  totals(history);
}

function totals(history) {
  const sums = { offered: 0, accepted: 0, met: 0 };
  for (const counts of Object.values(history.seconds)) {
    for (const key of Object.keys(sums)) sums[key] += counts[key];
  }
  const last = history.seconds[String(history.now_s - 1)] || { offered: 0, accepted: 0, met: 0 };
  const parts = [cell(`last ${HISTORY_S} s: `, "span")];
  SERIES.forEach(([key, label], index) => {
    const name = cell(` ${label} `, "span");
    name.classList.add("key", `s${index}`);
    parts.push(name, derived(JSON.stringify(["history", key]), sums[key], "span"));
    parts.push(cell(" (last second ", "span"));
    parts.push(derived(JSON.stringify(["last_second", key]), last[key], "span"));
    parts.push(cell(`/s)${index < SERIES.length - 1 ? "," : ""}`, "span"));
  });
  document.getElementById("totals").replaceChildren(...parts);
}

function render(document_) {
  const doc = document_.server || document_;
  const overload = [figure(doc, ["overload", "state"], "strong"), figure(doc, ["overload", "pressure"], "strong")];
  document.getElementById("state").replaceWith(overload[0]);
  overload[0].id = "state";
  document.getElementById("pressure").replaceWith(overload[1]);
  overload[1].id = "pressure";
  chart(doc.history);
  lanes(doc);
  tenants(doc);
  spend(doc);
  pools(doc);
  deployments(doc);
  document.getElementById("window").textContent = fmt(doc.slo.window_s);
  const feed = document.getElementById("feed");
  feed.dataset.updates = String(Number(feed.dataset.updates) + 1);
  const workers = document_.workers;
  const whom = workers ? `, ${workers.answered.length} of ${workers.count} workers answering` : "";
  feed.textContent = `live${whom}, updated ${new Date().toLocaleTimeString()}`;
}

function follow() {
  const source = new EventSource("/admin/live");
  const feed = document.getElementById("feed");
  source.onmessage = (event) => render(JSON.parse(event.data).status);
  source.onerror = () => {
    if (source.readyState === EventSource.CLOSED) {
      feed.textContent = "the feed closed (logged out, or too many viewers); reloading in 5 s";
      setTimeout(() => location.reload(), 5000);
    } else {
      feed.textContent = "reconnecting…";
    }
  };
}

follow();
