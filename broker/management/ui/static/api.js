// Every request of the UI: same-origin, the session cookie sent by the browser (HttpOnly, so this code
// never sees it), the CSRF token (from the login answer, kept in memory only) on changes, and a header
// that asks the server for a plain 401 (no browser login box) when the session is gone.

let csrf = null;
let onUnauthorised = () => {};

export function setCsrf(token) { csrf = token; }
export function setUnauthorisedHandler(fn) { onUnauthorised = fn; }

export class ApiError extends Error {
  constructor(status, reason) {
    super(reason);
    this.status = status;
  }
}

export async function api(method, path, body, opts = {}) {
  const headers = { "X-Leveret-UI": "1", Accept: "application/json" };
  if (method !== "GET" && method !== "HEAD" && csrf) headers["X-CSRF-Token"] = csrf;
  if (opts.headers) Object.assign(headers, opts.headers);
  const init = { method, headers, credentials: "same-origin", signal: opts.signal };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  if (res.status === 401 && !opts.noRedirect) onUnauthorised();
  if (!res.ok) {
    let reason = res.statusText;
    try {
      const data = await res.json();
      reason = data.reason || data.error || reason;
    } catch (e) { /* not JSON */ }
    throw new ApiError(res.status, reason);
  }
  if (res.status === 204 || res.status === 201) return null;
  const text = await res.text();
  return text ? JSON.parse(text) : null;
}

export const get = (path, opts) => api("GET", path, undefined, opts);
