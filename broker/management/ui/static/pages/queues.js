// Queues: filtered, sorted and paged by the server (/api/queues?page=&page_size=&name=&use_regex=&sort=
// &sort_reverse=); the list state lives in the hash, so a page can be linked and survives a reload.
import { api, get } from "../api.js";
import { field, h, replace, section, table } from "../dom.js";
import { detail, enc, num, rate } from "../format.js";

export function queueLink(q) {
  return h("a", { href: "#/queues/" + enc(q.vhost) + "/" + enc(q.name), class: "queue-link" }, q.name);
}

export async function mount(root, _args, params, ctx) {
  const page = Number(params.get("page") || 1);
  const size = Number(params.get("page_size") || 100);
  const name = params.get("name") || "";
  const regex = params.get("use_regex") === "true";
  const sort = params.get("sort") || "name";
  const reverse = params.get("sort_reverse") === "true";

  const go = (changes) => {
    const next = new URLSearchParams(params);
    for (const [k, v] of Object.entries(changes)) {
      if (v === null || v === "" || v === false) next.delete(k); else next.set(k, String(v));
    }
    ctx.navigate("/queues", next);
  };

  const filter = h("input", { id: "queue-filter", type: "search", value: name, placeholder: "Filter by name" });
  const regexBox = h("input", { id: "queue-regex", type: "checkbox", checked: regex });
  const form = h("form", { id: "queue-filter-form", class: "inline", onsubmit: (ev) => {
    ev.preventDefault();
    go({ name: filter.value, use_regex: regexBox.checked ? "true" : null, page: null });
  } }, field("Name", filter), h("label", {}, regexBox, " Regex"), h("button", { type: "submit" }, "Filter"));
  const listBox = h("div", { id: "queue-list" });
  const error = h("p", { id: "queue-error", class: "error", role: "alert" });
  root.append(h("h1", {}, "Queues"), h("div", { class: "card" }, form, error, listBox), addQueueCard(ctx));

  async function refresh() {
    const query = new URLSearchParams({ page, page_size: size, sort, sort_reverse: reverse, pagination: true });
    if (name) query.set("name", name);
    if (regex) query.set("use_regex", "true");
    let data;
    try {
      data = await get("/api/queues?" + query);
    } catch (e) {
      if (e.status === 400) { error.textContent = e.message; replace(listBox); return; }
      throw e;
    }
    error.textContent = "";
    const onSort = (col) => go({ sort: col, sort_reverse: col === sort ? String(!reverse) : null, page: null });
    const t = table("queues", [
      ["Virtual host", (q) => q.vhost, { sort: "vhost" }],
      ["Name", queueLink, { sort: "name" }],
      ["Type", (q) => q.type],
      ["Features", (q) => [q.durable ? "D" : "", q.auto_delete ? " AD" : "", q.exclusive ? " Excl" : "",
        q.policy ? " " + q.policy : ""].join("").trim()],
      ["Ready", (q) => num(q.messages_ready), { numeric: true, sort: "messages_ready" }],
      ["Unacked", (q) => num(q.messages_unacknowledged), { numeric: true, sort: "messages_unacknowledged" }],
      ["Total", (q) => num(q.messages), { numeric: true, sort: "messages" }],
      ["Consumers", (q) => num(q.consumers), { numeric: true, sort: "consumers" }],
      ["Incoming", (q) => rate(detail(q.message_stats, "publish")), { numeric: true }],
      ["Deliver / get", (q) => rate(detail(q.message_stats, "deliver_get")), { numeric: true }],
    ], data.items, { sort, reverse, onSort, empty: "No queues match." });
    const pager = h("div", { class: "pager", id: "pager" },
      h("button", { type: "button", id: "page-prev", disabled: page <= 1, onclick: () => go({ page: page - 1 }) }, "‹ Previous"),
      h("span", { id: "page-info" }, `Page ${data.page} of ${Math.max(1, data.page_count)}`),
      h("button", { type: "button", id: "page-next", disabled: page >= data.page_count,
        onclick: () => go({ page: page + 1 }) }, "Next ›"),
      h("span", { id: "count-info", class: "muted" },
        `${num(data.filtered_count)} of ${num(data.total_count)} queues`),
      h("label", {}, "Page size ", h("select", { id: "page-size", onchange: (ev) => go({ page_size: ev.target.value, page: null }) },
        [20, 50, 100, 200, 500].map((n) => h("option", { value: n, selected: n === size }, String(n))))));
    replace(listBox, pager, t);
  }
  await refresh();
  return refresh;
}

function addQueueCard(ctx) {
  const vhost = h("select", { id: "new-queue-vhost" });
  const name = h("input", { id: "new-queue-name", required: true });
  const type = h("select", { id: "new-queue-type" }, ["classic", "quorum", "stream"].map((t) => h("option", { value: t }, t)));
  const durable = h("input", { type: "checkbox", id: "new-queue-durable", checked: true });
  const result = h("p", { id: "new-queue-result" });
  get("/api/vhosts").then((vhs) => replace(vhost, vhs.map((v) => h("option", { value: v.name }, v.name)))).catch(() => {});
  const form = h("form", { id: "add-queue", class: "inline", onsubmit: async (ev) => {
    ev.preventDefault();
    try {
      await api("PUT", "/api/queues/" + enc(vhost.value) + "/" + enc(name.value),
        { durable: durable.checked, arguments: type.value === "classic" ? {} : { "x-queue-type": type.value } });
      result.className = "ok";
      result.textContent = "Queue " + name.value + " declared.";
    } catch (e) {
      result.className = "error";
      result.textContent = "Could not declare the queue: " + e.message;
    }
  } }, field("Virtual host", vhost), field("Name", name), field("Type", type),
  h("label", {}, durable, " Durable"), h("button", { type: "submit" }, "Add queue"));
  return section("Add a queue", form, result);
}
