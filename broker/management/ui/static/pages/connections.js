// Connections (state, blocked or flow, close with a reason) and channels.
import { api, get } from "../api.js";
import { facts, field, h, replace, section, table } from "../dom.js";
import { bytes, detail, enc, num, rate } from "../format.js";
import { confirmAction } from "../dialog.js";

function clientName(c) {
  return ((c.client_properties || {}).connection_name) || "";
}

export async function mountList(root) {
  const box = h("div");
  root.append(h("h1", {}, "Connections"), box);
  async function refresh() {
    const data = await get("/api/connections?page=1&page_size=500");
    replace(box, section(`${data.filtered_count} connections`, table("connections", [
      ["Name", (c) => h("a", { href: "#/connections/" + enc(c.name), class: "connection-link" }, c.name)],
      ["Client name", clientName], ["User", (c) => c.user], ["Virtual host", (c) => c.vhost],
      ["State", (c) => c.state], ["TLS", (c) => (c.ssl ? "yes" : "no")],
      ["Channels", (c) => num(c.channels), { numeric: true }],
      ["From client", (c) => rate(detail(c, "recv_oct")) + " B", { numeric: true }],
      ["To client", (c) => rate(detail(c, "send_oct")) + " B", { numeric: true }],
    ], data.items, { empty: "No connections." })));
  }
  await refresh();
  return refresh;
}

export async function mountDetail(root, [name], _params, ctx) {
  const base = "/api/connections/" + enc(name);
  const info = h("div");
  const channels = h("div");
  const reason = h("input", { id: "close-reason", value: "Closed via management UI" });
  const result = h("p", { id: "close-result" });
  const close = h("form", { id: "close-connection", class: "inline", onsubmit: async (ev) => {
    ev.preventDefault();
    if (!(await confirmAction(`Close connection ${name}?`))) return;
    try {
      await api("DELETE", base, undefined, { headers: { "X-Reason": reason.value } });
      ctx.navigate("/connections");
    } catch (e) {
      result.className = "error";
      result.textContent = "Close failed: " + e.message;
    }
  } }, field("Reason", reason), h("button", { type: "submit", class: "danger", id: "close" }, "Force close"));
  root.append(h("h1", {}, "Connection ", h("span", { id: "connection-name" }, name)),
    h("div", { class: "grid2" }, info, channels), section("Close this connection", close, result));
  async function refresh() {
    const [c, chs] = await Promise.all([get(base), get(base + "/channels")]);
    replace(info, section("Details", facts("connection-facts", [
      ["User", c.user, "user"], ["Virtual host", c.vhost, "vhost"], ["State", c.state, "state"],
      ["Protocol", c.protocol], ["Peer", c.peer_host + ":" + c.peer_port], ["TLS", c.ssl ? "yes" : "no"],
      ["Channels", num(c.channels), "channels"], ["Received", bytes(c.recv_oct)], ["Sent", bytes(c.send_oct)],
      ["Heartbeat", c.timeout + " s"], ["Frame max", num(c.frame_max)],
      ...Object.entries(c.client_properties || {}).map(([k, v]) =>
        ["client " + k, typeof v === "object" ? JSON.stringify(v) : String(v), "client-" + k]),
    ])));
    replace(channels, section("Channels", channelTable("connection-channels", chs)));
  }
  await refresh();
  return refresh;
}

function channelTable(id, rows) {
  return table(id, [
    ["Channel", (c) => c.name], ["User", (c) => c.user], ["State", (c) => c.state],
    ["Confirm", (c) => String(c.confirm)], ["Prefetch", (c) => num(c.prefetch_count), { numeric: true }],
    ["Unacked", (c) => num(c.messages_unacknowledged), { numeric: true }],
    ["Unconfirmed", (c) => num(c.messages_unconfirmed), { numeric: true }],
    ["Consumers", (c) => num(c.consumer_count), { numeric: true }],
    ["Publish", (c) => rate(detail(c.message_stats, "publish")), { numeric: true }],
  ], rows, { empty: "No channels." });
}

export async function mountChannels(root) {
  const box = h("div");
  root.append(h("h1", {}, "Channels"), box);
  async function refresh() {
    const data = await get("/api/channels?page=1&page_size=500");
    replace(box, section(`${data.filtered_count} channels`, channelTable("channels", data.items)));
  }
  await refresh();
  return refresh;
}
