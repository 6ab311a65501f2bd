// A small SVG line chart. Series are drawn as <path data-series="name" data-last-value="...">, so the
// browser tests can read what is drawn; colours come from the stylesheet (classes s0, s1, ...).
import { h } from "./dom.js";

const W = 600;
const H = 180;
const PAD = { l: 48, r: 8, t: 8, b: 20 };

function niceMax(v) {
  if (v <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

// series: [{name, label, points: [[t_ms, value], ...]}]
export function lineChart(id, series, unit = "") {
  const all = series.flatMap((s) => s.points);
  const t0 = all.length ? Math.min(...all.map((p) => p[0])) : 0;
  const t1 = all.length ? Math.max(...all.map((p) => p[0])) : 1;
  const vmax = niceMax(all.length ? Math.max(...all.map((p) => p[1])) : 0);
  const x = (t) => PAD.l + ((t - t0) / Math.max(1, t1 - t0)) * (W - PAD.l - PAD.r);
  const y = (v) => H - PAD.b - (v / vmax) * (H - PAD.t - PAD.b);
  const grid = [0, 0.5, 1].map((f) => [
    h("svg:line", { x1: PAD.l, x2: W - PAD.r, y1: y(vmax * f), y2: y(vmax * f), class: "grid" }),
    h("svg:text", { x: PAD.l - 4, y: y(vmax * f) + 4, class: "tick", "text-anchor": "end" },
      String(Math.round(vmax * f * 10) / 10) + unit),
  ]);
  const lines = series.map((s, i) => {
    // One sample so far: a level line across, so the chart is not blank until the second poll.
    const pts = s.points.length === 1 ? [[t0, s.points[0][1]], [t0 + 1, s.points[0][1]]] : s.points;
    const xs = s.points.length === 1 ? (p) => (p[0] === t0 ? PAD.l : W - PAD.r) : (p) => x(p[0]);
    const d = pts.map((p, j) => (j ? "L" : "M") + xs(p).toFixed(1) + "," + y(p[1]).toFixed(1)).join(" ");
    const last = s.points.length ? s.points[s.points.length - 1][1] : 0;
    return h("svg:path", { d: d || "M0,0", class: "line s" + i, "data-series": s.name,
      "data-last-value": last, "data-points": s.points.length });
  });
  const legend = h("ul", { class: "legend" }, series.map((s, i) => {
    const last = s.points.length ? s.points[s.points.length - 1][1] : 0;
    return h("li", { class: "s" + i }, h("span", { class: "swatch" }), s.label + ": " + last + unit);
  }));
  const svg = h("svg:svg", { id, viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img",
    "aria-label": series.map((s) => s.label).join(", ") }, grid, lines);
  return h("figure", { class: "chart-box" }, svg, legend);
}

// Points accumulated client-side from each poll of the server's sampled rates (the server keeps the
// last rate per counter; the page keeps 10 minutes of them, as LavinMQ's UI does).
export class History {
  constructor(names, maxAgeMs = 600000) {
    this.maxAgeMs = maxAgeMs;
    this.points = Object.fromEntries(names.map((n) => [n, []]));
  }
  add(values, now = Date.now()) {
    for (const [name, pts] of Object.entries(this.points)) {
      pts.push([now, Number(values[name] || 0)]);
      while (pts.length && pts[0][0] < now - this.maxAgeMs) pts.shift();
    }
  }
}
