// The sessions table: filters and paging live in the URL's query; the table refreshes every second.
// (Polling, not server-sent events: filters change the request, and fetch can carry credentials.)
import {
  el, every, formatDuration, formatFactor, formatMs, getJSON, progressBar, shortId, statusBadge,
} from "./common.js";

const LIMIT = 25;
const form = document.getElementById("filters");
const body = document.getElementById("sessions-body");
const params = new URLSearchParams(location.search);
let offset = Number(params.get("offset")) || 0;

for (const field of form.elements) if (field.name) field.value = params.get(field.name) ?? "";

function filters() {
  const query = new URLSearchParams();
  for (const [name, value] of new FormData(form)) if (value) query.set(name, value);
  return query;
}

function remember() {
  const query = filters();
  if (offset) query.set("offset", offset);
  history.replaceState(null, "", query.toString() ? `?${query}` : location.pathname);
}

// One array entry per column: [a key that changes when the cell must be redrawn, a function drawing it].
function cells(item) {
  const { chunks_done: done, chunks_total: total } = item.progress;
  return [
    [item.id, () => el("a", { href: `/ops/sessions/${item.id}`, title: item.id }, el("code", {}, shortId(item.id)))],
    [item.status, () => statusBadge(item.status)],
    [item.kind, () => item.kind],
    [item.tenant, () => item.tenant],
    [item.node_id, () => item.node_id ?? "–"],
    [`${done}/${total}`, () => progressBar(done, total, `${done} of ${total ?? "?"} chunks`)],
    [formatFactor(item.realtime_factor), () => formatFactor(item.realtime_factor)],
    [formatMs(item.ttff_ms), () => formatMs(item.ttff_ms)],
    [formatDuration(item.age_s), () => formatDuration(item.age_s)],
    [item.error, () => (item.error ? el("span", { class: "error", title: item.error }, item.error) : "")],
  ];
}

// Rows are updated cell by cell, not rebuilt, so a focused link keeps its focus while the table refreshes.
function render(items) {
  const existing = new Map([...body.rows].map((row) => [row.dataset.session, row]));
  const rows = items.map((item) => {
    const row = existing.get(item.id) ?? el("tr", { "data-session": item.id });
    row.dataset.status = item.status;
    cells(item).forEach(([key, draw], column) => {
      const cell = row.cells[column] ?? row.appendChild(el("td"));
      if (cell.dataset.key !== String(key)) {
        cell.dataset.key = String(key);
        cell.replaceChildren(draw());
      }
    });
    return row;
  });
  const order = rows.map((row) => row.dataset.session).join();
  if ([...body.rows].map((row) => row.dataset.session).join() !== order) body.replaceChildren(...rows);
}

async function refresh() {
  const query = filters();
  query.set("limit", LIMIT);
  query.set("offset", offset);
  const page = await getJSON(`/ops/api/sessions?${query}`);
  render(page.items);
  document.getElementById("empty").hidden = page.items.length > 0;
  const last = offset + page.items.length;
  document.getElementById("page-info").textContent = page.total ? `${offset + 1}–${last} of ${page.total}` : "";
  document.getElementById("previous").disabled = offset === 0;
  document.getElementById("next").disabled = last >= page.total;
  document.getElementById("updated").textContent = `Live · updated ${new Date().toLocaleTimeString()}`;
}

const refreshNow = every(1000, refresh);

function goTo(newOffset) {
  offset = Math.max(0, newOffset);
  remember();
  refreshNow();
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  goTo(0);
});
form.addEventListener("change", (event) => event.target.tagName === "SELECT" && goTo(0));
form.addEventListener("reset", () => setTimeout(() => goTo(0))); // after the fields are cleared
document.getElementById("previous").addEventListener("click", () => goTo(offset - LIMIT));
document.getElementById("next").addEventListener("click", () => goTo(offset + LIMIT));
