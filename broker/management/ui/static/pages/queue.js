// One queue: figures, consumers, bindings and RabbitMQ's "Add binding to this queue"; peek (Leveret: read
// without taking, so nothing is redelivered or reordered), get (RabbitMQ's: changes the queue), move, purge and
// delete (both confirmed). A stream's page offers none of peek, get, move and purge: the server refuses them
// (540 NOT_IMPLEMENTED over AMQP, as RabbitMQ; a stream is read from an offset by a consumer).
import { api, get } from "../api.js";
import { facts, field, h, replace, section, table } from "../dom.js";
import { detail, enc, num, rate, bytes } from "../format.js";
import { confirmAction } from "../dialog.js";
import { History, lineChart } from "../chart.js";
import { parseHeaders } from "./exchanges.js";

export function renderMessage(m, i) {
  const props = Object.entries(m.properties || {}).filter(([k]) => k !== "headers");
  const headers = Object.entries((m.properties || {}).headers || {});
  return h("div", { class: "message", "data-index": i },
    facts(null, [
      ["Exchange", m.exchange || "(default)"], ["Routing key", m.routing_key],
      ["Redelivered", String(m.redelivered), "redelivered"], ["Size", bytes(m.payload_bytes)],
      ...props.map(([k, v]) => [k, typeof v === "object" ? JSON.stringify(v) : String(v)]),
      ...headers.map(([k, v]) => ["header " + k, typeof v === "object" ? JSON.stringify(v) : String(v)]),
    ]),
    h("pre", { class: "payload", "data-encoding": m.payload_encoding }, m.payload));
}

export async function mount(root, [vhost, name], _params, ctx) {
  const base = "/api/queues/" + enc(vhost) + "/" + enc(name);
  const info = h("div");
  const consumers = h("div");
  const bindings = h("div");
  const stream = h("div", { id: "stream-box" });
  const history = new History(["messages_ready", "messages_unacknowledged"]);
  const isStream = (await get(base)).type === "stream";
  root.append(
    h("h1", {}, "Queue ", h("span", { id: "queue-name" }, name), h("span", { class: "muted" }, " in " + vhost)),
    h("div", { class: "grid2" }, info, h("div", {}, consumers, bindings)), stream,
    addBindingCard(vhost, name, () => refresh()),
    ...(isStream ? [] : [peekCard(base), getCard(base), moveCard(base)]),
    dangerCard(base, name, vhost, ctx, { purge: !isStream }));

  async function refresh() {
    const [q, bs] = await Promise.all([get(base), get(base + "/bindings")]);
    history.add(q);
    replace(info, section("Details",
      facts("queue-facts", [
        ["Type", q.type, "type"], ["State", q.state, "state"], ["Durable", String(q.durable), "durable"],
        ["Auto-delete", String(q.auto_delete), "auto_delete"], ["Exclusive", String(q.exclusive), "exclusive"],
        ["Policy", q.policy || "–", "policy"],
        ["Arguments", JSON.stringify(q.arguments || {}), "arguments"],
        ["Ready", num(q.messages_ready), "messages_ready"],
        ["Unacked", num(q.messages_unacknowledged), "messages_unacknowledged"],
        ["Total", num(q.messages), "messages"], ["Bytes", bytes(q.message_bytes), "message_bytes"],
        ["Consumers", num(q.consumers), "consumers"],
        ["Publish rate", rate(detail(q.message_stats, "publish")), "publish_rate"],
        ["Deliver rate", rate(detail(q.message_stats, "deliver_get")), "deliver_rate"],
      ]),
      lineChart("queue-lengths-chart", [
        { name: "messages_ready", label: "Ready", points: history.points.messages_ready },
        { name: "messages_unacknowledged", label: "Unacked", points: history.points.messages_unacknowledged },
      ])));
    if (q.type === "stream") replace(stream, streamCard(q));
    replace(consumers, section("Consumers", table("consumers", [
      ["Channel", (c) => (c.channel_details || {}).name], ["Tag", (c) => c.consumer_tag],
      ["Ack required", (c) => String(c.ack_required)], ["Prefetch", (c) => num(c.prefetch_count), { numeric: true }],
    ], q.consumer_details || [], { empty: "No consumers." })));
    replace(bindings, section("Bindings", table("queue-bindings", [
      ["From", (b) => b.source || "(default exchange)"], ["Routing key", (b) => b.routing_key],
      ["Arguments", (b) => JSON.stringify(b.arguments || {})],
    ], bs)));
  }
  await refresh();
  return refresh;
}

// A stream's offsets and its consumer groups with their lag (Leveret's stream groups: docs/decisions/streams.md).
function streamCard(q) {
  return section("Stream",
    facts("stream-facts", [
      ["First offset", num(q.first_offset), "first_offset"], ["Last offset", num(q.last_offset), "last_offset"],
      ["Next offset", num(q.next_offset), "next_offset"], ["Segments", num(q.segments), "segments"],
      ["Bytes retained", bytes(q.stream_bytes), "stream_bytes"], ["Readers", num(q.readers), "readers"],
    ]),
    table("stream-groups", [
      ["Group", (g) => g.name], ["Committed offset", (g) => num(g.committed_offset), { numeric: true }],
      ["Lag", (g) => num(g.lag), { numeric: true }], ["Outstanding", (g) => num(g.outstanding), { numeric: true }],
      ["Consumers", (g) => num(Array.isArray(g.consumers) ? g.consumers.length : g.consumers), { numeric: true }],
    ], q.consumer_groups || [], { empty: "No consumer groups." }));
}

// RabbitMQ's "Add binding to this queue": from an exchange, with a routing key and arguments.
function addBindingCard(vhost, queue, refresh) {
  const source = h("input", { id: "new-binding-source", required: true });
  const key = h("input", { id: "new-binding-routing-key" });
  const args = h("textarea", { id: "new-binding-arguments", placeholder: "name = value (one per line)" });
  const result = h("p", { id: "new-binding-result", role: "status" });
  const form = h("form", { id: "add-binding", onsubmit: async (ev) => {
    ev.preventDefault();
    result.className = "";
    try {
      await api("POST", "/api/bindings/" + enc(vhost) + "/e/" + enc(source.value) + "/q/" + enc(queue),
        { routing_key: key.value, arguments: parseHeaders(args.value) });
    } catch (e) {
      result.className = "error";
      result.textContent = "Could not bind: " + e.message;
      return;
    }
    result.className = "ok";
    result.textContent = "Bound from " + source.value + ".";
    await refresh();
  } },
  h("div", { class: "inline" }, field("From exchange", source), field("Routing key", key)),
  field("Arguments", args), h("button", { type: "submit", id: "add-binding-button" }, "Bind"));
  return section("Add binding to this queue", form, result);
}

function peekCard(base) {
  const count = h("input", { id: "peek-count", type: "number", min: 1, max: 100, value: 10 });
  const out = h("div", { id: "peek-results" });
  const form = h("form", { id: "peek-form", class: "inline", onsubmit: async (ev) => {
    ev.preventDefault();
    try {
      const msgs = await api("POST", base + "/peek", { count: Number(count.value), encoding: "auto", truncate: 50000 });
      replace(out, h("p", { class: "muted", id: "peek-summary" }, `${msgs.length} message(s), left in the queue.`),
        msgs.map(renderMessage));
    } catch (e) {
      replace(out, h("p", { class: "error" }, "Peek failed: " + e.message));
    }
  } }, field("Messages", count), h("button", { type: "submit", id: "peek" }, "Peek"));
  return section("Peek at messages",
    h("p", { class: "muted" }, "Shows the first messages without taking them: nothing is redelivered or reordered."),
    form, out);
}

function getCard(base) {
  const count = h("input", { id: "get-count", type: "number", min: 1, value: 1 });
  const mode = h("select", { id: "get-ackmode" }, [
    ["ack_requeue_true", "Nack, requeue true"], ["ack_requeue_false", "Automatic ack"],
    ["reject_requeue_true", "Reject, requeue true"], ["reject_requeue_false", "Reject, requeue false"],
  ].map(([v, l]) => h("option", { value: v }, l)));
  const out = h("div", { id: "get-results" });
  const form = h("form", { id: "get-form", class: "inline", onsubmit: async (ev) => {
    ev.preventDefault();
    try {
      const msgs = await api("POST", base + "/get", { count: Number(count.value), ackmode: mode.value, encoding: "auto" });
      replace(out, msgs.length ? msgs.map(renderMessage) : h("p", { class: "muted" }, "Queue is empty."));
    } catch (e) {
      replace(out, h("p", { class: "error" }, "Get failed: " + e.message));
    }
  } }, field("Ack mode", mode), field("Messages", count), h("button", { type: "submit", id: "get-messages" }, "Get"));
  return section("Get messages",
    h("p", { class: "muted" }, "Get takes messages: requeued ones come back marked redelivered."), form, out);
}

function moveCard(base) {
  const dest = h("input", { id: "move-destination", required: true });
  const count = h("input", { id: "move-count", type: "number", min: 1, value: 100 });
  const result = h("p", { id: "move-result", role: "status" });
  const form = h("form", { id: "move-form", class: "inline", onsubmit: async (ev) => {
    ev.preventDefault();
    try {
      const answer = await api("POST", base + "/move", { destination: dest.value, count: Number(count.value) });
      result.className = answer.refused ? "error" : "ok";
      result.textContent = `Moved ${answer.moved} message(s) to ${dest.value}.` +
        (answer.refused ? " Stopped: " + answer.refused : "");
    } catch (e) {
      result.className = "error";
      result.textContent = "Move failed: " + e.message;
    }
  } }, field("To queue", dest), field("Messages", count), h("button", { type: "submit", id: "move" }, "Move"));
  return section("Move messages",
    h("p", { class: "muted" }, "Moves ready messages, in order, to another queue of this virtual host (at least once)."),
    form, result);
}

function dangerCard(base, name, vhost, ctx, { purge: canPurge }) {
  const result = h("p", { id: "danger-result" });
  const purge = h("button", { type: "button", id: "purge", class: "danger", onclick: async () => {
    if (!(await confirmAction(`Purge every ready message of queue “${name}”?`))) {
      result.textContent = "Purge cancelled.";
      return;
    }
    try {
      await api("DELETE", base + "/contents");
      result.className = "ok";
      result.textContent = "Queue purged.";
    } catch (e) {
      result.className = "error";
      result.textContent = "Purge failed: " + e.message;
    }
  } }, "Purge messages");
  const del = h("button", { type: "button", id: "delete-queue", class: "danger", onclick: async () => {
    if (!(await confirmAction(`Delete queue “${name}” in “${vhost}” and its messages?`, name))) {
      result.textContent = "Delete cancelled.";
      return;
    }
    try {
      await api("DELETE", base);
      ctx.navigate("/queues");
    } catch (e) {
      result.className = "error";
      result.textContent = "Delete failed: " + e.message;
    }
  } }, "Delete queue");
  return section(canPurge ? "Purge or delete" : "Delete", h("div", { class: "inline" }, canPurge ? purge : null, del),
    result);
}
