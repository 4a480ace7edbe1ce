// The node registry, refreshed every two seconds (as often as nodes report).
import { el, every, formatDuration, formatTime, getJSON, shortId, statusBadge } from "./common.js";

const SILENT_AFTER_S = 10;

function row(node) {
  const silent = node.status !== "stopped" && node.heartbeat_age_s > SILENT_AFTER_S;
  const sessions = node.sessions.flatMap((id, i) => [
    i ? ", " : "",
    el("a", { href: `/ops/sessions/${id}`, title: id }, el("code", {}, shortId(id))),
  ]);
  return el(
    "tr",
    { "data-node": node.id, class: silent ? "silent" : null },
    el("th", { scope: "row" }, node.id),
    el("td", {}, statusBadge(node.status), silent ? " " : null, silent ? statusBadge("silent") : null),
    el("td", {}, `${node.sessions.length}/${node.capacity}`, node.sessions.length ? " · " : "", ...sessions),
    el("td", {}, `${formatDuration(node.heartbeat_age_s)} ago`),
    el("td", {}, node.chunks_per_minute.toFixed(1)),
    el("td", {}, String(node.chunks_done)),
    el("td", {}, node.memory_mb === null ? "–" : `${Math.round(node.memory_mb)} MB`),
    el("td", {}, formatTime(node.started_at)),
  );
}

every(2000, async () => {
  const { items } = await getJSON("/ops/api/nodes");
  // Rebuilt whole unless a session link inside has the keyboard focus (rebuilding would drop it).
  const body = document.getElementById("nodes-body");
  if (!body.contains(document.activeElement)) body.replaceChildren(...items.map(row));
  document.getElementById("empty").hidden = items.length > 0;
  document.getElementById("updated").textContent = `Live · updated ${new Date().toLocaleTimeString()}`;
});
