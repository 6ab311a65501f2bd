// Exchanges: the list with RabbitMQ's "Add a new exchange" form, and one exchange with its bindings both ways,
// an "Add binding from this exchange" form and a publish form (routing key, properties, headers, payload as text
// or base64; the answer says whether the message was routed).
import { api, get } from "../api.js";
import { facts, field, h, replace, section, table } from "../dom.js";
import { bytes, detail, enc, num, rate } from "../format.js";
import { confirmAction } from "../dialog.js";

function shownName(name) { return name === "" ? "(AMQP default)" : name; }

export function exchangeLink(vhost, name) {
  return h("a", { href: "#/exchanges/" + enc(vhost) + "/" + enc(name === "" ? "amq.default" : name),
    class: "exchange-link" }, shownName(name));
}

export async function mountList(root) {
  const box = h("div");
  root.append(h("h1", {}, "Exchanges"), box, addExchangeCard(() => refresh()));
  async function refresh() {
    const data = await get("/api/exchanges?page=1&page_size=500&sort=name");
    replace(box, section(`${data.filtered_count} exchanges`, table("exchanges", [
      ["Virtual host", (x) => x.vhost], ["Name", (x) => exchangeLink(x.vhost, x.name)], ["Type", (x) => x.type],
      ["Features", (x) => [x.durable ? "D" : "", x.auto_delete ? " AD" : "", x.internal ? " I" : ""].join("").trim()],
      ["In", (x) => rate(detail(x.message_stats, "publish_in")), { numeric: true }],
      ["Out", (x) => rate(detail(x.message_stats, "publish_out")), { numeric: true }],
    ], data.items)));
  }
  await refresh();
  return refresh;
}

export async function mountDetail(root, [vhost, name]) {
  const base = "/api/exchanges/" + enc(vhost) + "/" + enc(name);
  const info = h("div");
  const bindings = h("div");
  const delayed = h("div", { id: "delayed-box" });
  // The default exchange takes no bindings (403 ACCESS_REFUSED, as in RabbitMQ): no form for it.
  const bindForm = name === "amq.default" ? null : addBindingCard(vhost, name, () => refresh());
  root.append(h("h1", {}, "Exchange ", h("span", { id: "exchange-name" }, name), h("span", { class: "muted" }, " in " + vhost)),
    h("div", { class: "grid2" }, info, bindings), ...(bindForm ? [bindForm] : []), delayed, publishCard(base));
  async function refresh() {
    const [x, src, dst] = await Promise.all([get(base), get(base + "/bindings/source"), get(base + "/bindings/destination")]);
    replace(info, section("Details", facts("exchange-facts", [
      ["Type", x.type, "type"], ["Durable", String(x.durable), "durable"], ["Auto-delete", String(x.auto_delete)],
      ["Internal", String(x.internal)], ["Arguments", JSON.stringify(x.arguments || {})], ["Policy", x.policy || "–"],
    ])));
    if (x.type === "x-delayed-message") replace(delayed, await delayedCard(base, refresh));
    replace(bindings, section("Bindings from this exchange", table("bindings-source", [
      ["To", (b) => b.destination_type === "queue"
        ? h("a", { href: "#/queues/" + enc(b.vhost) + "/" + enc(b.destination) }, b.destination)
        : exchangeLink(b.vhost, b.destination)],
      ["Routing key", (b) => b.routing_key], ["Arguments", (b) => JSON.stringify(b.arguments || {})],
    ], src, { empty: "No bindings." })), section("Bindings to this exchange", table("bindings-destination", [
      ["From", (b) => exchangeLink(b.vhost, b.source)], ["Routing key", (b) => b.routing_key],
    ], dst, { empty: "No bindings." })));
  }
  await refresh();
  return refresh;
}

// "name = value" lines as an arguments table (typed as the publish form's headers); "" is none.
function argumentsOf(text) { return parseHeaders(text || ""); }

// RabbitMQ's "Add a new exchange": virtual host, name, type (the node's types), durability, auto-delete,
// internal and arguments (x-delayed-type, alternate-exchange, ...), declared with PUT /api/exchanges/{vhost}/{name}.
function addExchangeCard(refresh) {
  const vhost = h("select", { id: "new-exchange-vhost" });
  const name = h("input", { id: "new-exchange-name", required: true });
  const type = h("select", { id: "new-exchange-type" },
    ["direct", "fanout", "headers", "topic"].map((t) => h("option", { value: t }, t)));
  const durable = h("select", { id: "new-exchange-durable" },
    h("option", { value: "true" }, "Durable"), h("option", { value: "false" }, "Transient"));
  const autoDelete = h("input", { type: "checkbox", id: "new-exchange-auto-delete" });
  const internal = h("input", { type: "checkbox", id: "new-exchange-internal" });
  const args = h("textarea", { id: "new-exchange-arguments", placeholder: "name = value (one per line), e.g. alternate-exchange = unrouted" });
  const result = h("p", { id: "new-exchange-result", role: "status" });
  get("/api/vhosts").then((vhs) => replace(vhost, vhs.map((v) => h("option", { value: v.name }, v.name)))).catch(() => {});
  get("/api/overview").then((o) => {
    const types = (o.exchange_types || []).map((t) => t.name).filter(Boolean);
    if (types.length) replace(type, types.map((t) => h("option", { value: t, selected: t === "direct" }, t)));
  }).catch(() => {});
  const form = h("form", { id: "add-exchange", onsubmit: async (ev) => {
    ev.preventDefault();
    result.className = "";
    try {
      await api("PUT", "/api/exchanges/" + enc(vhost.value) + "/" + enc(name.value), {
        type: type.value, durable: durable.value === "true", auto_delete: autoDelete.checked,
        internal: internal.checked, arguments: argumentsOf(args.value) });
    } catch (e) {
      result.className = "error";
      result.textContent = "Could not declare the exchange: " + e.message;
      return;
    }
    result.className = "ok";
    result.textContent = "Exchange " + name.value + " declared.";
    await refresh();
  } },
  h("div", { class: "inline" }, field("Virtual host", vhost), field("Name", name), field("Type", type),
    field("Durability", durable), h("label", {}, autoDelete, " Auto-delete"), h("label", {}, internal, " Internal")),
  field("Arguments", args), h("button", { type: "submit", id: "add-exchange-button" }, "Add exchange"));
  return section("Add a new exchange", form, result);
}

// RabbitMQ's "Add binding from this exchange": to a queue or an exchange, with a routing key and arguments
// (POST /api/bindings/{vhost}/e/{source}/q|e/{destination}).
function addBindingCard(vhost, source, refresh) {
  const kind = h("select", { id: "new-binding-destination-type" },
    h("option", { value: "q" }, "To queue"), h("option", { value: "e" }, "To exchange"));
  const destination = h("input", { id: "new-binding-destination", required: true });
  const key = h("input", { id: "new-binding-routing-key" });
  const args = h("textarea", { id: "new-binding-arguments", placeholder: "name = value (one per line), e.g. x-match = any" });
  const result = h("p", { id: "new-binding-result", role: "status" });
  const form = h("form", { id: "add-binding", onsubmit: async (ev) => {
    ev.preventDefault();
    result.className = "";
    try {
      await api("POST", "/api/bindings/" + enc(vhost) + "/e/" + enc(source) + "/" + kind.value + "/" +
        enc(destination.value), { routing_key: key.value, arguments: argumentsOf(args.value) });
    } catch (e) {
      result.className = "error";
      result.textContent = "Could not bind: " + e.message;
      return;
    }
    await refresh();
    const shown = document.getElementById("new-binding-result") || result;
    shown.className = "ok";
    shown.textContent = "Bound to " + destination.value + ".";
  } },
  h("div", { class: "inline" }, field("Destination", kind), field("Name", destination), field("Routing key", key)),
  field("Arguments", args), h("button", { type: "submit", id: "add-binding-button" }, "Bind"));
  return section("Add binding from this exchange", form, result);
}

// The messages an x-delayed-message exchange holds (Leveret's /delayed endpoints): due time, cancel.
async function delayedCard(base, refresh) {
  const page = await get(base + "/delayed?page_size=100");
  const result = h("p", { id: "delayed-result" });
  return section(`Delayed messages (${num(page.total_count)} pending)`, table("delayed", [
    ["Due", (m) => m.due], ["Routing key", (m) => m.routing_key], ["Size", (m) => bytes(m.size), { numeric: true }],
    ["", (m) => h("button", { type: "button", class: "danger", "data-cancel": m.id, onclick: async () => {
      if (!(await confirmAction(`Cancel delayed message ${m.id}?`))) return;
      try {
        await api("DELETE", base + "/delayed/" + enc(m.id));
      } catch (e) {
        result.className = "error";
        result.textContent = "Cancel failed: " + e.message;
        return;
      }
      // The refresh draws a new card (its own, empty result line): say it there, or it would vanish as soon
      // as the list came back (a test that looked for it in between failed on a loaded machine).
      await refresh();
      const shown = document.getElementById("delayed-result") || result;
      shown.className = "ok";
      shown.textContent = "Cancelled " + m.id + ".";
    } }, "Cancel")],
  ], page.items, { empty: "No pending messages." }), page.next ? h("p", { class: "muted" }, "Showing the first 100.") : null,
  result);
}

// "key = value" per line; numbers and true/false become typed values, as RabbitMQ's form offers.
export function parseHeaders(text) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line.trim()) continue;
    const at = line.indexOf("=");
    if (at < 1) throw new Error("a header line is “name = value”: " + line);
    const key = line.slice(0, at).trim();
    const raw = line.slice(at + 1).trim();
    if (/^-?\d+$/.test(raw)) out[key] = Number(raw);
    else if (raw === "true" || raw === "false") out[key] = raw === "true";
    else out[key] = raw;
  }
  return out;
}

const PROPS = ["content_type", "content_encoding", "correlation_id", "reply_to", "expiration", "message_id",
  "type", "app_id", "priority"];

function publishCard(base) {
  const key = h("input", { id: "publish-routing-key" });
  const mode = h("select", { id: "publish-delivery-mode" },
    h("option", { value: "1" }, "1 - non-persistent"), h("option", { value: "2" }, "2 - persistent"));
  const headers = h("textarea", { id: "publish-headers", placeholder: "name = value (one per line)" });
  const props = Object.fromEntries(PROPS.map((p) => [p, h("input", { id: "publish-prop-" + p })]));
  const payload = h("textarea", { id: "publish-payload" });
  const encoding = h("select", { id: "publish-encoding" },
    h("option", { value: "string" }, "String"), h("option", { value: "base64" }, "Base64"));
  const result = h("p", { id: "publish-result", role: "status" });
  const form = h("form", { id: "publish-form", onsubmit: async (ev) => {
    ev.preventDefault();
    result.className = "";
    try {
      const properties = { delivery_mode: Number(mode.value), headers: parseHeaders(headers.value) };
      for (const p of PROPS) {
        const v = props[p].value.trim();
        if (v) properties[p] = p === "priority" ? Number(v) : v;
      }
      const answer = await api("POST", base + "/publish",
        { routing_key: key.value, properties, payload: payload.value, payload_encoding: encoding.value });
      result.className = answer.routed ? "ok" : "error";
      result.textContent = answer.routed ? "Message published and routed." : "Message published, but not routed.";
    } catch (e) {
      result.className = "error";
      result.textContent = "Publish failed: " + e.message;
    }
  } },
  h("div", { class: "inline" }, field("Routing key", key), field("Delivery mode", mode)),
  h("div", { class: "inline" }, PROPS.map((p) => field(p, props[p]))),
  field("Headers", headers), h("div", { class: "inline" }, field("Payload encoding", encoding)),
  field("Payload", payload), h("button", { type: "submit", id: "publish" }, "Publish message"));
  return section("Publish message", form, result);
}
