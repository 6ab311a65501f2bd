// Numbers formatted the same way everywhere.

export function num(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  return Number(n).toLocaleString("en-US");
}

export function rate(r) {
  if (r === null || r === undefined) return "–";
  const v = Number(r);
  if (v >= 1000) return (v / 1000).toFixed(1) + "k/s";
  return v.toFixed(1) + "/s";
}

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Number(n);
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return (i === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + units[i];
}

export function detail(obj, name) {
  const d = obj && obj[name + "_details"];
  return d ? d.rate : 0;
}

export function enc(s) {
  return encodeURIComponent(s);
}
