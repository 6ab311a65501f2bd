// Admin pages: users and their permissions, virtual hosts, policies. The server checks the tags and
// permissions of every call; the menu only hides what the user could not do anyway.
import { api, get } from "../api.js";
import { field, h, replace, section, table } from "../dom.js";
import { enc, num } from "../format.js";
import { confirmAction } from "../dialog.js";

function resultLine(id) {
  const p = h("p", { id, role: "status" });
  p.show = (ok, text) => { p.className = ok ? "ok" : "error"; p.textContent = text; };
  return p;
}

function deleteButton(id, what, path, after, result) {
  return h("button", { type: "button", class: "danger", "data-delete": id, onclick: async () => {
    if (!(await confirmAction(`Delete ${what}?`))) return;
    try {
      await api("DELETE", path);
      result.show(true, `Deleted ${what}.`);
      await after();
    } catch (e) {
      result.show(false, "Delete failed: " + e.message);
    }
  } }, "Delete");
}

export async function mountUsers(root) {
  const box = h("div");
  const perms = h("div");
  const result = resultLine("users-result");
  const name = h("input", { id: "new-user-name", required: true, autocomplete: "off" });
  const password = h("input", { id: "new-user-password", type: "password", autocomplete: "new-password" });
  const tags = h("input", { id: "new-user-tags", placeholder: "administrator, management" });
  const addUser = h("form", { id: "add-user", class: "inline", onsubmit: async (ev) => {
    ev.preventDefault();
    try {
      await api("PUT", "/api/users/" + enc(name.value), { password: password.value, tags: tags.value });
      result.show(true, "User " + name.value + " saved.");
      password.value = "";
      await refresh();
    } catch (e) {
      result.show(false, "Could not save the user: " + e.message);
    }
  } }, field("Username", name), field("Password", password), field("Tags", tags),
  h("button", { type: "submit" }, "Add user"));
  const pUser = h("input", { id: "perm-user" });
  const pVhost = h("input", { id: "perm-vhost", value: "/" });
  const pConf = h("input", { id: "perm-configure", value: ".*" });
  const pWrite = h("input", { id: "perm-write", value: ".*" });
  const pRead = h("input", { id: "perm-read", value: ".*" });
  const setPerm = h("form", { id: "set-permission", class: "inline", onsubmit: async (ev) => {
    ev.preventDefault();
    try {
      await api("PUT", "/api/permissions/" + enc(pVhost.value) + "/" + enc(pUser.value),
        { configure: pConf.value, write: pWrite.value, read: pRead.value });
      result.show(true, "Permissions set.");
      await refresh();
    } catch (e) {
      result.show(false, "Could not set permissions: " + e.message);
    }
  } }, field("User", pUser), field("Virtual host", pVhost), field("Configure", pConf), field("Write", pWrite),
  field("Read", pRead), h("button", { type: "submit" }, "Set permission"));
  root.append(h("h1", {}, "Users"), box, perms, section("Add or update a user", addUser),
    section("Set permissions", setPerm), result);
  async function refresh() {
    const [users, permissions] = await Promise.all([get("/api/users"), get("/api/permissions")]);
    replace(box, section("Users", table("users", [
      ["Name", (u) => u.name], ["Tags", (u) => (u.tags || []).map((t) => h("span", { class: "tag" }, t))],
      ["Can access", (u) => permissions.filter((p) => p.user === u.name).map((p) => p.vhost).join(", ")],
      ["", (u) => deleteButton(u.name, "user " + u.name, "/api/users/" + enc(u.name), refresh, result)],
    ], users)));
    replace(perms, section("Permissions", table("permissions", [
      ["User", (p) => p.user], ["Virtual host", (p) => p.vhost], ["Configure", (p) => p.configure],
      ["Write", (p) => p.write], ["Read", (p) => p.read],
    ], permissions)));
  }
  await refresh();
  return refresh;
}

export async function mountVhosts(root) {
  const box = h("div");
  const result = resultLine("vhosts-result");
  const name = h("input", { id: "new-vhost-name", required: true });
  const add = h("form", { id: "add-vhost", class: "inline", onsubmit: async (ev) => {
    ev.preventDefault();
    try {
      await api("PUT", "/api/vhosts/" + enc(name.value), {});
      result.show(true, "Virtual host " + name.value + " added.");
      await refresh();
    } catch (e) {
      result.show(false, "Could not add the virtual host: " + e.message);
    }
  } }, field("Name", name), h("button", { type: "submit" }, "Add virtual host"));
  root.append(h("h1", {}, "Virtual hosts"), box, section("Add a virtual host", add), result);
  async function refresh() {
    const vhosts = await get("/api/vhosts");
    replace(box, section("Virtual hosts", table("vhosts", [
      ["Name", (v) => v.name], ["Messages", (v) => num(v.messages), { numeric: true }],
      ["Ready", (v) => num(v.messages_ready), { numeric: true }],
      ["Unacked", (v) => num(v.messages_unacknowledged), { numeric: true }],
      ["", (v) => deleteButton(v.name, "virtual host " + v.name, "/api/vhosts/" + enc(v.name), refresh, result)],
    ], vhosts)));
  }
  await refresh();
  return refresh;
}

// Policies and, for administrators, operator policies (RabbitMQ's /api/operator-policies: limits that
// clients' arguments and policies cannot exceed; they apply to queues only). One editor serves both:
// ``kind.id`` prefixes its elements' ids (policy-name, operator-policy-name, ...).
const POLICY_KINDS = [
  { id: "policy", table: "policies", path: "/api/policies", what: "policy", title: "Policies",
    applyTo: ["all", "queues", "exchanges", "classic_queues", "quorum_queues", "streams"],
    placeholder: "{\"max-length\": 10}", empty: "No policies." },
  { id: "operator-policy", table: "operator-policies", path: "/api/operator-policies", what: "operator policy",
    title: "Operator policies", applyTo: ["queues", "classic_queues", "quorum_queues", "streams"],
    placeholder: "{\"max-length\": 1000, \"message-ttl\": 3600000}", empty: "No operator policies." },
];

function policyEditor(kind) {
  const box = h("div");
  const result = resultLine(kind.table + "-result");
  const vhost = h("input", { id: kind.id + "-vhost", value: "/" });
  const name = h("input", { id: kind.id + "-name", required: true });
  const pattern = h("input", { id: kind.id + "-pattern", required: true });
  const applyTo = h("select", { id: kind.id + "-apply-to" }, kind.applyTo.map((v) => h("option", { value: v }, v)));
  const priority = h("input", { id: kind.id + "-priority", type: "number", value: 0 });
  const definition = h("textarea", { id: kind.id + "-definition", placeholder: kind.placeholder });
  const what = kind.what[0].toUpperCase() + kind.what.slice(1);
  const add = h("form", { id: "add-" + kind.id, onsubmit: async (ev) => {
    ev.preventDefault();
    try {
      await api("PUT", kind.path + "/" + enc(vhost.value) + "/" + enc(name.value), {
        pattern: pattern.value, "apply-to": applyTo.value, priority: Number(priority.value),
        definition: JSON.parse(definition.value || "{}"),
      });
      result.show(true, what + " " + name.value + " saved.");
      await refresh();
    } catch (e) {
      result.show(false, "Could not save the " + kind.what + ": " + e.message);
    }
  } }, h("div", { class: "inline" }, field("Virtual host", vhost), field("Name", name), field("Pattern", pattern),
    field("Apply to", applyTo), field("Priority", priority)), field("Definition (JSON)", definition),
  h("button", { type: "submit" }, "Add " + kind.what));
  async function refresh() {
    const policies = await get(kind.path);
    replace(box, section(kind.title, table(kind.table, [
      ["Virtual host", (p) => p.vhost], ["Name", (p) => p.name], ["Pattern", (p) => p.pattern],
      ["Apply to", (p) => p["apply-to"]], ["Priority", (p) => p.priority, { numeric: true }],
      ["Definition", (p) => JSON.stringify(p.definition)],
      ["", (p) => deleteButton(p.name, kind.what + " " + p.name,
        kind.path + "/" + enc(p.vhost) + "/" + enc(p.name), refresh, result)],
    ], policies, { empty: kind.empty })));
  }
  return { nodes: [box, section("Add or update " + (kind.id === "policy" ? "a " : "an ") + kind.what, add), result],
    refresh };
}

export async function mountPolicies(root, _args, _params, ctx) {
  const admin = ctx.user.tags.includes("administrator");
  const editors = POLICY_KINDS.filter((k) => admin || k.id === "policy").map(policyEditor);
  root.append(h("h1", {}, "Policies"), ...editors.flatMap((e) => e.nodes));
  async function refresh() {
    await Promise.all(editors.map((e) => e.refresh()));
  }
  await refresh();
  return refresh;
}
