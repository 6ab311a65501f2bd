// The UI's shell: login and logout, the hash router (#/queues?page=2 can be linked and survives a
// reload), and one poller that refreshes the current page's live parts.
import { api, get, setCsrf, setUnauthorisedHandler } from "./api.js";
import { replace } from "./dom.js";
import * as overview from "./pages/overview.js";
import * as queues from "./pages/queues.js";
import * as queue from "./pages/queue.js";
import * as exchanges from "./pages/exchanges.js";
import * as connections from "./pages/connections.js";
import * as admin from "./pages/admin.js";
import * as traffic from "./pages/traffic.js";
import * as shovels from "./pages/shovels.js";
import * as federation from "./pages/federation.js";

const ROUTES = [
  [/^\/$/, overview.mount, "overview"],
  [/^\/queues$/, queues.mount, "queues"],
  [/^\/queues\/([^/]+)\/([^/]+)$/, queue.mount, "queues"],
  [/^\/exchanges$/, exchanges.mountList, "exchanges"],
  [/^\/exchanges\/([^/]+)\/([^/]+)$/, exchanges.mountDetail, "exchanges"],
  [/^\/connections$/, connections.mountList, "connections"],
  [/^\/connections\/([^/]+)$/, connections.mountDetail, "connections"],
  [/^\/channels$/, connections.mountChannels, "channels"],
  [/^\/users$/, admin.mountUsers, "users"],
  [/^\/vhosts$/, admin.mountVhosts, "vhosts"],
  [/^\/policies$/, admin.mountPolicies, "policies"],
  [/^\/traffic$/, traffic.mount, "traffic"],
  [/^\/shovels$/, shovels.mount, "shovels"],
  [/^\/federation$/, federation.mount, "federation"],
];

const state = { user: null, refresh: null, timer: null, generation: 0 };

function $(id) { return document.getElementById(id); }

function showLogin(message) {
  state.user = null;
  setCsrf(null);
  stopTimer();
  $("nav").hidden = true;
  $("session").hidden = true;
  replace($("page"));
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("username").focus();
}

function loggedIn(who) {
  state.user = who;
  setCsrf(who.csrf_token);
  $("login").hidden = true;
  $("nav").hidden = false;
  $("session").hidden = false;
  $("whoami").textContent = who.name;
  const tags = new Set(who.tags);
  document.body.classList.toggle("is-admin", tags.has("administrator"));
  for (const a of document.querySelectorAll(".admin-only")) a.hidden = !tags.has("administrator");
  for (const a of document.querySelectorAll(".policy-only")) {
    a.hidden = !(tags.has("administrator") || tags.has("policymaker"));
  }
  for (const a of document.querySelectorAll(".monitor-only")) {
    a.hidden = !(tags.has("administrator") || tags.has("monitoring"));
  }
  route();
}

async function login(ev) {
  ev.preventDefault();
  $("login-error").textContent = "";
  try {
    const who = await api("POST", "/api/login", { username: $("username").value, password: $("password").value },
      { noRedirect: true });
    $("password").value = "";
    loggedIn(who);
  } catch (e) {
    $("login-error").textContent = loginFailure(e);
  }
}

// One sentence for a refused login. The server's reason for wrong credentials is itself "Login failed" (as
// RabbitMQ's), which the form once showed as "Login failed: Login failed".
function loginFailure(e) {
  if (e.status === 401 && (e.message === "Login failed" || !e.message)) {
    return "Login failed: wrong user name or password.";
  }
  if (e.message === "Not management user") {
    return "Login failed: this user has no management, policymaker, monitoring or administrator tag.";
  }
  return "Login failed: " + e.message.replace(/^Login failed:?\s*/i, "");
}

async function logout() {
  try { await api("DELETE", "/api/login", undefined, { noRedirect: true }); } catch (e) { /* gone already */ }
  window.location.hash = "#/";
  showLogin("Logged out.");
}

function parseHash() {
  const raw = window.location.hash.replace(/^#/, "") || "/";
  const [path, query] = raw.split("?");
  return { path, params: new URLSearchParams(query || "") };
}

export function navigate(path, params) {
  const q = params && params.toString();
  window.location.hash = "#" + path + (q ? "?" + q : "");
}

async function route() {
  if (!state.user) return;
  const { path, params } = parseHash();
  const generation = ++state.generation;
  stopTimer();
  state.refresh = null;
  const page = $("page");
  replace(page);
  for (const [re, mount, nav] of ROUTES) {
    const m = path.match(re);
    if (!m) continue;
    for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.nav === nav);
    const args = m.slice(1).map(decodeURIComponent);
    try {
      const refresh = await mount(page, args, params, { user: state.user, navigate });
      if (generation !== state.generation) return;
      state.refresh = refresh || null;
      $("banner").hidden = true;
    } catch (e) {
      if (generation !== state.generation) return;
      if (e.status !== 401) replace(page, errorBox(e));
    }
    startTimer();
    return;
  }
  replace(page, errorBox(new Error("No such page: " + path)));
}

function errorBox(e) {
  const div = document.createElement("div");
  div.className = "card error";
  div.id = "page-error";
  div.textContent = e.message;
  return div;
}

function stopTimer() {
  if (state.timer) clearTimeout(state.timer);
  state.timer = null;
}

function startTimer() {
  stopTimer();
  const every = Number($("refresh").value);
  if (!every || !state.refresh) return;
  state.timer = setTimeout(tick, every);
}

async function tick() {
  const busy = document.activeElement && ["INPUT", "TEXTAREA", "SELECT"].includes(document.activeElement.tagName)
    && document.activeElement.id !== "refresh";
  if (!document.hidden && !busy && !$("confirm").open && state.refresh) {
    const generation = state.generation;
    try {
      await state.refresh();
      if (generation === state.generation) $("banner").hidden = true;
    } catch (e) {
      if (e.status !== 401 && generation === state.generation) {
        $("banner").textContent = "Could not refresh: " + e.message;
        $("banner").hidden = false;
      }
    }
  }
  startTimer();
}

async function start() {
  setUnauthorisedHandler(() => showLogin("Your session has ended: please log in again."));
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", logout);
  const stored = window.localStorage.getItem("leveret.refresh");
  if (stored !== null && [...$("refresh").options].some((o) => o.value === stored)) $("refresh").value = stored;
  $("refresh").addEventListener("change", () => {
    window.localStorage.setItem("leveret.refresh", $("refresh").value);
    startTimer();
  });
  window.addEventListener("hashchange", route);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) startTimer(); });
  try {
    loggedIn(await get("/api/login", { noRedirect: true }));
  } catch (e) {
    showLogin("");
  }
}

start();
