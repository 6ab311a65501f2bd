// Federation: the node's exchange federation links (GET /api/federation-links, rabbitmq_federation_management's
// fields) with their status, upstream and URI, and the messages each brought here. Upstreams are runtime
// parameters and the links follow policies: both are set on the Policies page or through the HTTP API.
import { get } from "../api.js";
import { h, replace, section, table } from "../dom.js";
import { num } from "../format.js";

export async function mount(root) {
  const box = h("div");
  root.append(h("h1", {}, "Federation status"), box);

  async function refresh() {
    const links = await get("/api/federation-links");
    const columns = [
      ["Upstream", (l) => h("span", { class: "federation-upstream" }, l.upstream)],
      ["URI", (l) => h("code", { class: "uri" }, l.uri)],
      ["Virtual host", (l) => l.vhost],
      ["Exchange", (l) => h("span", { class: "federation-exchange" }, l.exchange)],
      ["Upstream exchange", (l) => l.upstream_exchange],
      ["State", (l) => h("span", { class: "federation-status state-" + l.status }, l.status,
        l.status === "error" && l.error ? h("span", { class: "muted federation-error" }, ": " + l.error) : null)],
      ["Received", (l) => h("span", { class: "federation-received" }, num(l.messages_published)), { numeric: true }],
    ];
    replace(box, section(`${links.length} links`, table("federation-links", columns, links,
      { empty: "No federation links." })));
  }
  await refresh();
  return refresh;
}
