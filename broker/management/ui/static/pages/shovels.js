// Shovels: the node's dynamic shovels (GET /api/shovels, rabbitmq_shovel_management's fields) with their
// state, source, destination and the messages moved so far, restart and delete buttons, and RabbitMQ's
// "Add a new shovel" form, which writes the shovel's runtime parameter (PUT /api/parameters/shovel/...).
import { api, get } from "../api.js";
import { field, h, replace, section, table } from "../dom.js";
import { enc, num } from "../format.js";
import { confirmAction } from "../dialog.js";

function resultLine(id) {
  const p = h("p", { id, role: "status" });
  p.show = (ok, text) => { p.className = ok ? "ok" : "error"; p.textContent = text; };
  return p;
}

// A URI without its user and password, as GET /api/shovels shows it (broker/shovel/uri.py's redact): a
// shovel that is not running has no URI in its status, so the page reads it from the parameter, whose
// value holds the credentials.
export function withoutCredentials(uri) {
  return String(uri).replace(/^([a-z0-9+.-]+:\/\/)[^/?#]*@/i, "$1");
}

function firstUri(value) {
  const uri = Array.isArray(value) ? value[0] : value;
  return uri === undefined || uri === null ? "" : withoutCredentials(uri);
}

// "queue q" or "exchange x (key k)" on one side of a shovel: the status's names when running, else the
// parameter's.
function endpoint(status, value, side) {
  const get1 = (k) => status[side + "_" + k.replace(/-/g, "_")] ?? value[side + "-" + k];
  const uri = status[side + "_uri"] ?? firstUri(value[side + "-uri"]);
  const queue = get1("queue");
  const exchange = get1("exchange");
  const key = get1("exchange-key");
  const what = queue !== undefined && queue !== null ? "queue " + queue
    : exchange !== undefined && exchange !== null ? "exchange " + (exchange === "" ? "(AMQP default)" : exchange)
      + (key !== undefined && key !== null ? " (key " + key + ")" : "") : "";
  return h("span", { "data-side": side }, h("code", { class: "uri" }, uri), what ? [" ", what] : null);
}

// What a shovel has moved: with no-ack nothing is acknowledged at the source, so what it published.
function moved(s) {
  return s.ack_mode === "no-ack" ? s.messages_published : s.messages_acked;
}

export async function mount(root, _args, _params, ctx) {
  const box = h("div");
  const result = resultLine("shovels-result");
  const tags = new Set(ctx.user.tags);
  const canChange = tags.has("administrator") || tags.has("policymaker");
  root.append(h("h1", {}, "Shovels"), result, box, canChange ? addShovelCard(() => refresh()) : null);

  async function refresh() {
    const [shovels, parameters] = await Promise.all([
      get("/api/shovels"), canChange ? get("/api/parameters/shovel").catch(() => []) : Promise.resolve([])]);
    const values = new Map(parameters.map((p) => [p.vhost + "\u0000" + p.name, p.value || {}]));
    const valueOf = (s) => values.get(s.vhost + "\u0000" + s.name) || {};
    const columns = [
      ["Name", (s) => h("span", { class: "shovel-name" }, s.name)], ["Virtual host", (s) => s.vhost],
      ["State", (s) => h("span", { class: "shovel-state state-" + s.state }, s.state,
        s.state === "terminated" && s.reason ? h("span", { class: "muted shovel-reason" }, ": " + s.reason) : null)],
      ["Source", (s) => endpoint(s, valueOf(s), "src")],
      ["Destination", (s) => endpoint(s, valueOf(s), "dest")],
      ["Moved", (s) => h("span", { class: "shovel-moved" }, num(moved(s))), { numeric: true }],
    ];
    if (canChange) {
      columns.push(["", (s) => h("span", { class: "inline" },
        h("button", { type: "button", "data-restart": s.name, onclick: async () => {
          try {
            await api("DELETE", "/api/shovels/vhost/" + enc(s.vhost) + "/" + enc(s.name) + "/restart");
            result.show(true, "Shovel " + s.name + " restarted.");
            await refresh();
          } catch (e) {
            result.show(false, "Restart failed: " + e.message);
          }
        } }, "Restart"),
        h("button", { type: "button", class: "danger", "data-delete": s.name, onclick: async () => {
          if (!(await confirmAction(`Delete shovel ${s.name} in ${s.vhost}?`))) return;
          try {
            await api("DELETE", "/api/parameters/shovel/" + enc(s.vhost) + "/" + enc(s.name));
            result.show(true, "Shovel " + s.name + " deleted.");
            await refresh();
          } catch (e) {
            result.show(false, "Delete failed: " + e.message);
          }
        } }, "Delete"))]);
    }
    replace(box, section(`${shovels.length} shovels`, table("shovels", columns, shovels, { empty: "No shovels." })));
  }
  await refresh();
  return refresh;
}

// One side of the form: URI, then a queue, or an exchange and a routing key (RabbitMQ's form's rows).
function sideFields(side, label) {
  const uri = h("input", { id: `new-shovel-${side}-uri`, value: "amqp://", required: true, size: 40 });
  const kind = h("select", { id: `new-shovel-${side}-type` },
    h("option", { value: "queue" }, "Queue"), h("option", { value: "exchange" }, "Exchange"));
  const queue = h("input", { id: `new-shovel-${side}-queue` });
  const exchange = h("input", { id: `new-shovel-${side}-exchange` });
  const key = h("input", { id: `new-shovel-${side}-key` });
  const queueField = field("Queue", queue);
  const exchangeFields = h("span", { class: "inline" }, field("Exchange", exchange), field("Routing key", key));
  const show = () => {
    queueField.hidden = kind.value !== "queue";
    exchangeFields.hidden = kind.value !== "exchange";
  };
  kind.addEventListener("change", show);
  show();
  const row = h("div", { class: "inline" }, h("strong", {}, label), field("URI", uri), field("Type", kind),
    queueField, exchangeFields);
  // The parameter's keys for this side (src-queue or src-exchange + src-exchange-key, ...).
  row.value = () => {
    const out = { [`${side}-uri`]: uri.value.trim() };
    if (kind.value === "queue") out[`${side}-queue`] = queue.value;
    else {
      out[`${side}-exchange`] = exchange.value;
      if (key.value !== "") out[`${side}-exchange-key`] = key.value;
    }
    return out;
  };
  return row;
}

// RabbitMQ's "Add a new shovel": name, source, destination, prefetch, ack mode, auto-delete, forward
// headers, reconnect delay. The server validates (400 with rabbitmq_shovel's reasons, shown on the form).
function addShovelCard(refresh) {
  const vhost = h("select", { id: "new-shovel-vhost" });
  const name = h("input", { id: "new-shovel-name", required: true, autocomplete: "off" });
  const src = sideFields("src", "Source");
  const dest = sideFields("dest", "Destination");
  const prefetch = h("input", { id: "new-shovel-prefetch", type: "number", min: "0", placeholder: "1000" });
  const ackMode = h("select", { id: "new-shovel-ack-mode" },
    h("option", { value: "on-confirm" }, "On confirm"), h("option", { value: "on-publish" }, "On publish"),
    h("option", { value: "no-ack" }, "No ack"));
  const deleteAfter = h("select", { id: "new-shovel-delete-after" },
    h("option", { value: "never" }, "Never"), h("option", { value: "queue-length" }, "After initial length transferred"),
    h("option", { value: "count" }, "After N messages"));
  const deleteCount = h("input", { id: "new-shovel-delete-count", type: "number", min: "0", hidden: true });
  deleteAfter.addEventListener("change", () => { deleteCount.hidden = deleteAfter.value !== "count"; });
  const forward = h("input", { type: "checkbox", id: "new-shovel-forward-headers" });
  const reconnect = h("input", { id: "new-shovel-reconnect-delay", type: "number", min: "0", placeholder: "5" });
  const result = resultLine("new-shovel-result");
  get("/api/vhosts").then((vhs) => replace(vhost, vhs.map((v) => h("option", { value: v.name }, v.name)))).catch(() => {});
  const form = h("form", { id: "add-shovel", onsubmit: async (ev) => {
    ev.preventDefault();
    const value = { ...src.value(), ...dest.value(), "ack-mode": ackMode.value };
    if (prefetch.value !== "") value["src-prefetch-count"] = Number(prefetch.value);
    if (reconnect.value !== "") value["reconnect-delay"] = Number(reconnect.value);
    if (forward.checked) value["dest-add-forward-headers"] = true;
    value["src-delete-after"] = deleteAfter.value === "count" ? Number(deleteCount.value) : deleteAfter.value;
    try {
      await api("PUT", "/api/parameters/shovel/" + enc(vhost.value) + "/" + enc(name.value),
        { component: "shovel", vhost: vhost.value, name: name.value, value });
    } catch (e) {
      result.show(false, "Could not add the shovel: " + e.message);
      return;
    }
    result.show(true, "Shovel " + name.value + " added.");
    await refresh();
  } },
  h("div", { class: "inline" }, field("Virtual host", vhost), field("Name", name)),
  src, dest,
  h("div", { class: "inline" }, field("Prefetch count", prefetch), field("Acknowledgement mode", ackMode),
    field("Auto-delete", h("span", { class: "inline" }, deleteAfter, deleteCount)),
    field("Reconnect delay (s)", reconnect), h("label", {}, forward, " Add forwarding headers")),
  h("button", { type: "submit", id: "add-shovel-button" }, "Add shovel"));
  return section("Add a new shovel", form, result);
}
