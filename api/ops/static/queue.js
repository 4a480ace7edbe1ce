// The lease queue on the sessions page: sessions waiting for a node by class × tenant, and those running by class,
// refreshed every two seconds. Classes come from the Python enum (enums.js), most urgent first.
import { el, every, getJSON } from "./common.js";
import { QUEUE_CLASSES } from "./enums.js";

function table(queue) {
  const tenants = [...new Set(queue.waiting.map((entry) => entry.tenant))].sort();
  const waiting = new Map(queue.waiting.map((entry) => [`${entry.class}/${entry.tenant}`, entry.sessions]));
  const running = new Map(queue.running.map((entry) => [entry.class, entry.sessions]));
  const head = [
    el("th", { scope: "col" }, "Class"),
    ...tenants.map((tenant) => el("th", { scope: "col" }, tenant)),
    el("th", { scope: "col" }, "Waiting"),
    el("th", { scope: "col" }, "Running"),
  ];
  const rows = QUEUE_CLASSES.map((queueClass) => {
    const counts = tenants.map((tenant) => waiting.get(`${queueClass}/${tenant}`) ?? 0);
    return el(
      "tr",
      { "data-class": queueClass },
      el("th", { scope: "row" }, queueClass),
      ...counts.map((count, i) => el("td", { "data-tenant": tenants[i] }, count ? String(count) : "–")),
      el("td", { class: "total" }, String(counts.reduce((sum, count) => sum + count, 0))),
      el("td", { class: "running" }, String(running.get(queueClass) ?? 0)),
    );
  });
  return { head, rows };
}

every(2000, async () => {
  const queue = await getJSON("/ops/api/queue");
  const { head, rows } = table(queue);
  document.getElementById("queue-head").replaceChildren(...head);
  document.getElementById("queue-body").replaceChildren(...rows);
  const chunk = queue.seconds_per_chunk === null ? "no chunk time yet" : `${queue.seconds_per_chunk.toFixed(2)} s a chunk`;
  document.getElementById("queue-slots").textContent = `${queue.slots} slots on the nodes up · ${chunk}.`;
});
