// One session: facts, the chunk timeline, the live HLS player and the event log. Server-sent progress
// events (GET /ops/api/sessions/{id}/events) drive the log and trigger a refresh of the rest; a slow poll
// covers the moments the event stream is down. Everything goes through /ops/api with the operator's key.
import {
  TERMINAL, authorize, el, every, formatDuration, formatMs, formatRatio, formatTime, getJSON, postJSON,
  progressBar, readEvents, request,
} from "./common.js";
import { RESUMABLE } from "./enums.js";
import { drawTimeline, setupTimeline } from "./timeline.js";

const sessionId = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop());
const $ = (id) => document.getElementById(id);
const timeline = $("timeline");
let detail = null;
let drawnKey = "";

$("session-id").textContent = sessionId;
document.title = `Session ${sessionId.slice(0, 8)} · Monologue ops`;
setupTimeline(timeline, $("chunk-detail"));

// The API's links carry its public URL; this page may be open under another allowed name, so it calls the
// same paths on its own origin (a cross-origin call would need CORS and could not carry the key).
const OWN_LINKS = ["stream", "events", "video", "cancel", "resume", "webhooks"];

async function refresh() {
  detail = await getJSON(`/ops/api/sessions/${encodeURIComponent(sessionId)}`);
  for (const name of OWN_LINKS) detail.links[name] = new URL(detail.links[name], location.href).pathname;
  const captioned = detail.links.captioned_stream;
  if (captioned) detail.links.captioned_stream = new URL(captioned, location.href).pathname;
  showFacts(detail);
  const key = JSON.stringify([detail.chunks, detail.checkpoints]);
  if (key !== drawnKey) {
    drawnKey = key;
    drawTimeline(timeline, detail.chunks, detail.checkpoints, detail.options.fps);
  }
  if (!stopEvents && !followed) follow();
  if (!player) startPlayer();
  showWebhooks((await getJSON(detail.links.webhooks)).items);
}

// Each webhook message of the session with its attempts: how many, and what the receiver said last.
function showWebhooks(deliveries) {
  $("webhooks-none").hidden = deliveries.length > 0;
  const rows = deliveries.map((delivery) => {
    const last = delivery.attempts.at(-1);
    // A delivery that ended without a 2xx says why (given up after its retry period, or refused) in its own error.
    const answer = delivery.error ?? (last ? (last.status_code ?? last.error ?? "–") : "not tried yet");
    return el(
      "tr",
      { "data-status": delivery.status },
      el("td", {}, el("code", {}, delivery.id)),
      el("td", {}, delivery.event),
      el("td", {}, el("span", { class: `badge status-${delivery.status}` }, delivery.status)),
      el("td", { class: "attempts" }, String(delivery.attempts.length)),
      el("td", {}, String(answer)),
    );
  });
  $("webhooks").tBodies[0].replaceChildren(...rows);
}

function showFacts({ session, links, chunks, width, height, options }) {
  $("status").className = `badge status-${session.status}`; // updated in place: it is a live region
  $("status").textContent = session.status;
  $("cancel").disabled = TERMINAL.includes(session.status);
  $("resume").disabled = !RESUMABLE.includes(session.status);
  $("temporal-link").href = links.temporal;
  $("video-link").href = links.video;
  $("video-link").hidden = session.status !== "completed";
  const { chunks_done: done, chunks_total: total } = session.progress;
  const retries = chunks.reduce((sum, chunk) => sum + Math.max(0, chunk.attempt - 1), 0);
  const facts = [
    ["Kind", session.kind],
    ["Tenant", session.tenant],
    ["Node", session.node_id ?? "–"],
    ["Progress", progressBar(done, total, `${done} of ${total ?? "?"} chunks`)],
    ["Realtime ratio", formatRatio(session.realtime_ratio)],
    ["Time to first frame", formatMs(session.ttff_ms)],
    ["Retries", String(retries)],
    ["Preempted", `${session.progress.preemptions}×`],
    ["Output", width ? `${width}×${height} at ${options.fps} fps` : "–"],
    ["Audio", session.audio_seconds ? `${session.audio_seconds.toFixed(2)} s` : "–"],
    ["Submitted", `${formatTime(session.created_at)} (${formatDuration(session.age_s)} ago)`],
    ["Finished", formatTime(session.finished_at)],
  ];
  if (session.error) facts.push(["Error", el("span", { class: "error" }, session.error)]);
  $("facts").replaceChildren(...facts.map(([name, value]) => el("div", {}, el("dt", {}, name), el("dd", {}, value))));
}

// The event log, from the session's server-sent progress events.
let stopEvents = null;
let followed = false;
let last = null;

function follow() {
  followed = true;
  stopEvents?.();
  stopEvents = readEvents(
    detail.links.events,
    (event) => {
      if (event.type !== "progress") return;
      const render = JSON.parse(event.data);
      changes(last, render).forEach(log);
      last = render;
      refreshNow();
      if (TERMINAL.includes(render.status)) {
        stopEvents();
        stopEvents = null;
      }
    },
    () => log("event stream lost; reconnecting"),
  );
}

function changes(before, now) {
  const progress = `${now.progress.chunks_done}/${now.progress.chunks_total ?? "?"} chunks`;
  if (!before) return [`${now.status} · ${progress}${now.node_id ? ` · on ${now.node_id}` : ""}`];
  const lines = [];
  if (now.status !== before.status) lines.push(`status ${before.status} → ${now.status}`);
  if (now.node_id !== before.node_id) lines.push(`node ${before.node_id ?? "–"} → ${now.node_id ?? "–"}`);
  if (now.progress.chunks_done !== before.progress.chunks_done) lines.push(progress);
  if (now.progress.retries > before.progress.retries) lines.push(`retries: ${now.progress.retries}`);
  if (now.progress.preemptions > before.progress.preemptions) {
    lines.push(`gave its slot to a live session (preemption ${now.progress.preemptions}); queued again as moving`);
  }
  if (now.ttff_ms !== null && before.ttff_ms === null) lines.push(`first chunk encoded after ${formatMs(now.ttff_ms)}`);
  if (now.error && now.error !== before.error) lines.push(`error: ${now.error}`);
  return lines;
}

function log(text) {
  const now = new Date();
  const events = $("events");
  events.prepend(el("li", {}, el("time", { datetime: now.toISOString() }, now.toLocaleTimeString()), " ", text));
  while (events.children.length > 300) events.lastChild.remove();
}

// The live player: hls.js over the session's EVENT playlist; it keeps polling the playlist as it grows. A session
// with captions plays its multivariant playlist, whose subtitle rendition hls.js shows (DEFAULT=YES).
let player = null;

function startPlayer() {
  const video = $("player");
  const state = (text) => ($("player-state").textContent = text);
  if (detail.links.player) {
    // A live WebRTC session: its own player page (WHEP, signed link), under this origin.
    const link = new URL(detail.links.player, location.href);
    const frame = el("iframe", {
      src: link.pathname + link.search,
      title: "Live session over WebRTC",
      class: "webrtc-player",
      allow: "autoplay; microphone",
    });
    video.replaceWith(frame);
    state("Live over WebRTC (WHEP).");
    player = "webrtc";
    return;
  }
  if (!window.Hls?.isSupported()) {
    // iOS Safari plays HLS itself, but sends no API key: that works only when the UI is open on loopback.
    if (video.canPlayType("application/vnd.apple.mpegurl")) video.src = playlist();
    else state("This browser cannot play HLS (no Media Source Extensions).");
    player = "native";
    return;
  }
  player = new Hls({
    xhrSetup(xhr, url) {
      xhr.open("GET", url, true); // hls.js calls this before open(), and headers can only be set after it
      for (const [name, value] of Object.entries(authorize())) xhr.setRequestHeader(name, value);
    },
  });
  player.on(Hls.Events.MANIFEST_PARSED, () => {
    state("Playing what has been published so far.");
    video.play().catch(() => state("Press play to watch."));
  });
  player.on(Hls.Events.ERROR, (_event, data) => {
    if (!data.fatal) return;
    player.destroy();
    const ended = TERMINAL.includes(detail.session.status);
    if (ended && detail.session.progress.chunks_done === 0) {
      state("Nothing was published.");
      return;
    }
    state(data.details === "manifestLoadError" ? "Waiting for the first segment…" : `Player: ${data.details}; retrying`);
    player = setTimeout(startPlayer, 1500); // a truthy placeholder until the retry
  });
  player.loadSource(playlist());
  player.attachMedia(video);
  video.addEventListener("ended", () => state("Played to the end."), { once: true });
}

function playlist() {
  return detail.links.captioned_stream ?? detail.links.stream;
}

function restartPlayer() {
  if (player?.destroy) player.destroy();
  else clearTimeout(player);
  player = null;
}

// Cancel and resume, each behind a confirmation dialog.
async function confirmThen(question, yes, action) {
  const dialog = $("confirm");
  $("confirm-text").textContent = question;
  $("confirm-yes").textContent = yes;
  dialog.returnValue = "";
  dialog.showModal();
  await new Promise((resolve) => dialog.addEventListener("close", resolve, { once: true }));
  if (dialog.returnValue !== "yes") return;
  try {
    await action();
  } catch (error) {
    $("action-status").textContent = error.message;
  }
  refreshNow();
}

$("cancel").addEventListener("click", () =>
  confirmThen(
    `Cancel session ${sessionId}? It stops within one chunk; what was published stays playable.`,
    "Cancel session",
    async () => {
      await postJSON(detail.links.cancel);
      $("action-status").textContent = "Cancel requested.";
      log("cancel requested");
    },
  ),
);

$("resume").addEventListener("click", () =>
  confirmThen(`Resume session ${sessionId} from its last checkpoint?`, "Resume session", async () => {
    await postJSON(detail.links.resume);
    $("action-status").textContent = "Resumed.";
    log("resume requested");
    follow();
    restartPlayer();
  }),
);

// The final MP4 is fetched (a plain link could not send the key) and handed to the browser as a download.
$("video-link").addEventListener("click", async (event) => {
  event.preventDefault();
  try {
    const video = URL.createObjectURL(await (await request(detail.links.video)).blob());
    el("a", { href: video, download: `${sessionId}.mp4` }).click();
    setTimeout(() => URL.revokeObjectURL(video), 60_000);
  } catch (error) {
    $("action-status").textContent = error.message;
  }
});

addEventListener("resize", () => detail && drawTimeline(timeline, detail.chunks, detail.checkpoints, detail.options.fps));

const refreshNow = every(5000, refresh);
