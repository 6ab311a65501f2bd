// Traffic: the picture `leveret-pipeline traffic --out DIR` draws (per queue and minute: rates, latency,
// acks) and its last micro-batch, served from the directory named by leveret.traffic_dir
// (broker/management/traffic.py). The broker only serves the files; the pipeline makes them.
import { get } from "../api.js";
import { facts, h, replace, section } from "../dom.js";
import { num } from "../format.js";

export async function mount(root) {
  const box = h("div");
  root.append(h("h1", {}, "Traffic"), box);
  let shown = null; // the picture's versioned URL now on the page: an unchanged one is not reloaded

  async function refresh() {
    const t = await get("/api/leveret/traffic");
    const batch = t.last_batch;
    const about = facts("traffic-facts", [
      ["Directory", t.directory, "directory"],
      ["Picture drawn", t.picture ? t.picture.modified : null, "modified"],
      ["Last micro-batch", batch ? "#" + batch.batch + ", " + new Date(batch.done_ms).toISOString() : null, "batch"],
      ["Events in it", batch ? num(batch.events) : null, "events"],
      ["Minutes it touched", batch ? num(batch.minutes) : null, "minutes"],
    ]);
    if (!t.picture) {
      shown = null;
      replace(box, section("No traffic pictures", h("p", { id: "traffic-none", class: "muted" }, t.hint),
        t.configured ? about : null));
      return;
    }
    if (shown === t.picture.url) {
      replace(box.querySelector("#traffic-facts-box"), about);
      return;
    }
    shown = t.picture.url;
    replace(box, section("Traffic per queue and minute",
      h("img", { id: "traffic-picture", class: "traffic", src: t.picture.url,
        alt: "Messages, latency and acks per queue and minute, drawn by leveret-pipeline traffic" })),
    section("From the pipeline", h("div", { id: "traffic-facts-box" }, about)));
  }
  await refresh();
  return refresh;
}
