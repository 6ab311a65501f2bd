// A tiny DOM builder. Data reaches the page only as text nodes and attribute values: there is no
// innerHTML anywhere in the UI (tests/ui checks), so a queue named "<img onerror=...>" stays text.

export function h(tag, attrs, ...children) {
  const el = tag.startsWith("svg:")
    ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
    : document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function replace(el, ...children) {
  clear(el);
  append(el, children);
  return el;
}

// A table: columns are [title, row => cell content, {numeric, sort}] triples.
export function table(id, columns, rows, opts = {}) {
  const head = h("tr", {}, columns.map(([title, , o = {}]) => {
    if (!o.sort || !opts.onSort) return h("th", { class: o.numeric ? "num" : null }, title);
    const active = opts.sort === o.sort;
    const mark = active ? (opts.reverse ? " ▼" : " ▲") : "";
    return h("th", { class: o.numeric ? "num" : null },
      h("button", { type: "button", class: "sort", "data-sort": o.sort, onclick: () => opts.onSort(o.sort) },
        title + mark));
  }));
  const body = rows.length
    ? rows.map((row) => h("tr", {}, columns.map(([, cell, o = {}]) => h("td", { class: o.numeric ? "num" : null }, cell(row)))))
    : [h("tr", {}, h("td", { colspan: columns.length, class: "empty" }, opts.empty || "Nothing to show."))];
  return h("table", { id, class: "data" }, h("thead", {}, head), h("tbody", {}, body));
}

export function field(label, input) {
  return h("label", { class: "field" }, h("span", {}, label), input);
}

// Key/value pairs shown as a definition list (each value's <dd> has data-field for tests and styling).
export function facts(id, pairs) {
  return h("dl", { id, class: "facts" }, pairs.map(([k, v, name]) => [
    h("dt", {}, k), h("dd", { "data-field": name || k }, v === null || v === undefined ? "–" : v),
  ]));
}

export function section(title, ...children) {
  return h("section", { class: "card" }, h("h2", {}, title), children);
}
