// The chunk timeline, drawn to scale: one box per chunk at its frames, in timeline order (N0 I0 N1 …).
// Colour says the status; ↻ marks retries, ⇢ a chunk made on another node than the one made before it,
// ◆ a checkpoint. Pointing at or focusing a chunk shows its per-stage timings below the timeline.
import { el, formatMs } from "./common.js";

const MIN_PX_PER_FRAME = 0.6; // long sessions scroll sideways rather than squeeze chunks below a pixel
const TICK_STEPS_S = [0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600];
const NOT_IN_TOTAL = new Set(["idle_before", "switch"]);

export function describeChunk(chunk, fps) {
  const last = chunk.first_frame + chunk.frames;
  const parts = [
    `${chunk.kind}${chunk.index}`,
    `frames ${chunk.first_frame}–${last - 1} (${seconds(chunk.first_frame / fps)}–${seconds(last / fps)})`,
    chunk.status,
  ];
  if (chunk.attempt > 1) parts.push(`attempt ${chunk.attempt} (${chunk.attempt - 1} retried)`);
  if (chunk.node_id) parts.push(`node ${chunk.node_id}${chunk.moved ? " (moved here)" : ""}`);
  const stages = Object.entries(chunk.stage_ms);
  if (stages.length) {
    // Not part of the total: idle_before (waiting, before the chunk ran) and switch (already inside the stages).
    const total = stages.reduce((sum, [name, ms]) => sum + (NOT_IN_TOTAL.has(name) ? 0 : ms), 0);
    parts.push(`${stages.map(([name, ms]) => `${name} ${formatMs(ms)}`).join(", ")}; total ${formatMs(total)}`);
  }
  return parts.join(" · ");
}

/** Wire the pointer and keyboard once; `draw` may then replace the boxes as often as it likes. */
export function setupTimeline(container, detail) {
  const show = (event) => {
    const box = event.target.closest?.(".chunk");
    if (box) detail.textContent = box.getAttribute("aria-label");
  };
  container.addEventListener("mouseover", show);
  container.addEventListener("focusin", show);
  container.addEventListener("keydown", (event) => {
    const boxes = [...container.querySelectorAll(".chunk")];
    const at = boxes.indexOf(document.activeElement);
    const to = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: boxes.length - 1 }[event.key];
    if (at < 0 || to === undefined || !boxes[to]) return;
    event.preventDefault();
    focusBox(boxes, to);
  });
}

function focusBox(boxes, index) {
  boxes.forEach((box, i) => box.setAttribute("tabindex", i === index ? "0" : "-1"));
  boxes[index].focus();
}

export function drawTimeline(container, chunks, checkpoints, fps) {
  const total = chunks.reduce((end, chunk) => Math.max(end, chunk.first_frame + chunk.frames), 0);
  if (!total) {
    container.replaceChildren(el("p", { class: "muted" }, "No chunks yet: the frame count is not known."));
    return;
  }
  const width = Math.max(container.clientWidth - 2, total * MIN_PX_PER_FRAME);
  const x = (frame) => (frame / total) * width;
  const focused = container.contains(document.activeElement) ? document.activeElement.dataset.chunk : null;
  const track = el("div", { class: "track", style: `width:${width}px` });
  for (const chunk of chunks) {
    const name = `${chunk.kind}${chunk.index}`;
    const classes = ["chunk", `kind-${chunk.kind}`, `status-${chunk.status}`];
    if (chunk.attempt > 1) classes.push("retried");
    if (chunk.moved) classes.push("moved");
    const boxWidth = Math.max(1, x(chunk.frames));
    const box = el("div", {
      class: classes.join(" "),
      style: `left:${x(chunk.first_frame)}px;width:${boxWidth}px`,
      tabindex: "-1",
      role: "img",
      "data-chunk": name,
      "data-status": chunk.status,
      "aria-label": describeChunk(chunk, fps),
      title: describeChunk(chunk, fps),
    });
    if (chunk.kind === "N" && boxWidth > 28) box.append(el("span", { class: "chunk-name" }, name));
    if (chunk.attempt > 1) box.append(el("span", { class: "mark-retry" }, `↻${chunk.attempt - 1}`));
    track.append(box);
    if (chunk.moved) {
      const left = `left:${x(chunk.first_frame)}px`;
      track.append(el("span", { class: "mark-moved", style: left, title: `made on ${chunk.node_id}` }, `⇢ ${chunk.node_id}`));
    }
  }
  for (const checkpoint of checkpoints) {
    const chunk = chunks.find((c) => c.kind === "N" && c.index === checkpoint.index);
    if (!chunk) continue;
    const title = `checkpoint after N${checkpoint.index} · sha256 ${checkpoint.sha256.slice(0, 16)}…`;
    const style = `left:${x(chunk.first_frame + chunk.frames)}px`;
    track.append(el("span", { class: "mark-checkpoint", style, title, "data-checkpoint": checkpoint.index }, "◆"));
  }
  track.append(axis(total, fps, width));
  container.replaceChildren(track);
  const boxes = [...track.querySelectorAll(".chunk")];
  const again = boxes.findIndex((box) => box.dataset.chunk === focused);
  if (again >= 0) focusBox(boxes, again);
  else boxes[0].setAttribute("tabindex", "0");
}

function axis(total, fps, width) {
  const pxPerSecond = (width / total) * fps;
  const step = TICK_STEPS_S.find((s) => s * pxPerSecond >= 70) ?? TICK_STEPS_S.at(-1);
  const ticks = el("div", { class: "axis", "aria-hidden": "true" });
  for (let t = 0; t * fps <= total; t += step) {
    ticks.append(el("span", { class: "tick", style: `left:${t * pxPerSecond}px` }, seconds(t)));
  }
  return ticks;
}

function seconds(value) {
  if (value < 60) return `${Number(value.toFixed(2))} s`;
  return `${Math.floor(value / 60)}:${String(Math.floor(value % 60)).padStart(2, "0")}`;
}
