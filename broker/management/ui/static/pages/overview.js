// Overview: message rates and queued messages (charts of the server's sampled rates, one point per
// poll), object totals, alarms, the node's memory and disk, listeners, and definitions export/import.
// Delayed messages (held by x-delayed-message exchanges, not yet in any queue) are summed from the
// exchanges list, whose delayed exchanges carry ``delayed_pending``.
import { api, get } from "../api.js";
import { facts, h, replace, section, table } from "../dom.js";
import { bytes, detail, enc, num, rate } from "../format.js";
import { History, lineChart } from "../chart.js";

const RATES = [["publish", "Publish"], ["deliver_get", "Deliver / get"], ["ack", "Ack"],
  ["redeliver", "Redeliver"], ["confirm", "Confirm"], ["return_unroutable", "Unroutable (return)"]];
const LENGTHS = [["messages_ready", "Ready"], ["messages_unacknowledged", "Unacked"], ["messages", "Total"]];

const rateHistory = new History(RATES.map(([n]) => n));
const lengthHistory = new History(LENGTHS.map(([n]) => n));

export async function mount(root, _args, _params, ctx) {
  const charts = h("div", { class: "grid2" });
  const totals = h("div");
  const nodeBox = h("div");
  const listeners = h("div");
  root.append(h("h1", {}, "Overview"), charts, h("div", { class: "grid2" }, totals, nodeBox), listeners,
    definitionsCard(ctx));

  async function refresh() {
    const [ov, exchanges] = await Promise.all([get("/api/overview"),
      get("/api/exchanges?columns=" + enc("type,delayed_pending"))]);
    const delayed = exchanges.filter((x) => x.type === "x-delayed-message");
    let node = null;
    try {
      node = (await get("/api/nodes", { noRedirect: true }))[0];
    } catch (e) { /* node details need the monitoring tag */ }
    const ms = ov.message_stats || {};
    rateHistory.add(Object.fromEntries(RATES.map(([n]) => [n, detail(ms, n)])));
    const qt = ov.queue_totals || {};
    lengthHistory.add(Object.fromEntries(LENGTHS.map(([n]) => [n, qt[n] || 0])));
    replace(charts,
      section("Message rates", lineChart("rates-chart",
        RATES.map(([n, label]) => ({ name: n, label, points: rateHistory.points[n] })), "/s")),
      section("Queued messages", lineChart("lengths-chart",
        LENGTHS.map(([n, label]) => ({ name: n, label, points: lengthHistory.points[n] })))));
    const ot = ov.object_totals || {};
    replace(totals, section("Totals", facts("totals", [
      ["Connections", num(ot.connections), "connections"], ["Channels", num(ot.channels), "channels"],
      ["Exchanges", num(ot.exchanges), "exchanges"], ["Queues", num(ot.queues), "queues"],
      ["Consumers", num(ot.consumers), "consumers"],
      ["Ready messages", num(qt.messages_ready), "messages_ready"],
      ["Unacked messages", num(qt.messages_unacknowledged), "messages_unacknowledged"],
      ["Total messages", num(qt.messages), "messages"],
      ["Delayed messages", num(delayed.reduce((n, x) => n + (x.delayed_pending || 0), 0))
        + (delayed.length ? " in " + num(delayed.length) + " delayed exchange" + (delayed.length > 1 ? "s" : "") : ""),
      "messages_delayed"],
      ["Publish rate", rate(detail(ms, "publish")), "publish_rate"],
      ["Deliver rate", rate(detail(ms, "deliver_get")), "deliver_rate"],
      ["Version", ov.product_name + " " + ov.product_version, "version"],
    ])));
    if (node) {
      const alarms = [node.mem_alarm ? "memory" : null, node.disk_free_alarm ? "disk" : null].filter(Boolean);
      replace(nodeBox, section("Node " + node.name,
        h("p", { id: "alarms", class: alarms.length ? "alarm" : "ok" },
          alarms.length ? "Alarms: " + alarms.join(", ") : "No alarms"),
        facts("node", [
          ["Memory", bytes(node.mem_used) + " of " + bytes(node.mem_limit), "memory"],
          ["Disk free", bytes(node.disk_free) + " (limit " + bytes(node.disk_free_limit) + ")", "disk"],
          ["File descriptors", num(node.fd_used) + " of " + num(node.fd_total), "fds"],
          ["Uptime", Math.round(node.uptime / 1000) + " s", "uptime"],
        ])));
    } else {
      replace(nodeBox, section("Node", h("p", { class: "muted" }, "Node details need the monitoring tag.")));
    }
    replace(listeners, section("Listeners", table("listeners", [
      ["Protocol", (l) => l.protocol], ["Address", (l) => l.ip_address], ["Port", (l) => l.port, { numeric: true }],
    ], ov.listeners || [])));
  }
  await refresh();
  return refresh;
}

function definitionsCard(ctx) {
  const file = h("input", { type: "file", id: "definitions-file", accept: ".json,application/json" });
  const result = h("p", { id: "definitions-result" });
  const upload = h("button", { type: "button", id: "definitions-import", onclick: async () => {
    result.className = "";
    result.textContent = "";
    const f = file.files[0];
    if (!f) { result.className = "error"; result.textContent = "Choose a file first."; return; }
    let body;
    try {
      body = JSON.parse(await f.text());
    } catch (e) {
      result.className = "error";
      result.textContent = "Not a JSON file: " + e.message;
      return;
    }
    try {
      await api("POST", "/api/definitions", body);
      result.className = "ok";
      result.textContent = "Definitions imported.";
    } catch (e) {
      result.className = "error";
      result.textContent = "Import failed: " + e.message;
    }
  } }, "Import");
  const admin = ctx.user.tags.includes("administrator");
  return section("Definitions",
    h("p", {}, h("a", { href: "/api/definitions", download: "leveret-definitions.json", id: "definitions-export" },
      "Download the broker's definitions (JSON)")),
    admin ? h("div", { class: "inline" }, file, upload) : null, result);
}
