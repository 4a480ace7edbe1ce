// Shared by the ops pages: authorised fetch, sign-in, server-sent events, safe DOM building, polling and
// formatting. Text from the API (error messages, ids) only ever goes into text nodes and attributes, never
// innerHTML.

// The API key lives in this tab only (sessionStorage) and goes with every request as a Bearer token. Without
// one, requests go out bare: the server admits those only when the ops UI is open on loopback.
const KEY = "monologue-ops-key";

/** `headers` plus the Authorization header when a key is stored. */
export function authorize(headers = {}) {
  const key = sessionStorage.getItem(KEY);
  return key ? { ...headers, Authorization: `Bearer ${key}` } : headers;
}

/** fetch() with the key; on 401 or 403 it asks for a key and tries again. Other failures throw. */
export async function request(url, { headers, ...options } = {}) {
  for (;;) {
    const sent = sessionStorage.getItem(KEY);
    const response = await fetch(url, { ...options, headers: authorize(headers) });
    if (response.status !== 401 && response.status !== 403) {
      if (!response.ok) throw new Error(`${response.status}: ${await detail(response)}`);
      return response;
    }
    // A key given while this request was out is tried before asking again.
    if (sessionStorage.getItem(KEY) === sent) await signIn(sent && (await detail(response)));
  }
}

export async function getJSON(url) {
  return (await request(url, { headers: { Accept: "application/json" } })).json();
}

export async function postJSON(url) {
  return (await request(url, { method: "POST", headers: { Accept: "application/json" } })).json();
}

async function detail(response) {
  try {
    return (await response.json()).detail;
  } catch {
    return response.statusText;
  }
}

// The header's "Sign out" button, shown while a key is stored; signing out reloads the page without it.
const signOut = document.getElementById("sign-out");
signOut?.addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  location.reload();
});
showSignOut();

function showSignOut() {
  if (signOut) signOut.hidden = !sessionStorage.getItem(KEY);
}

let signingIn = null;

/** Show the sign-in form (one, however many requests wait on it) and resolve once a key is given. */
function signIn(problem) {
  sessionStorage.removeItem(KEY);
  showSignOut();
  signingIn ??= new Promise((resolve) => {
    const input = el("input", { id: "api-key", type: "password", required: true, autocomplete: "off" });
    const form = el(
      "form",
      { class: "sign-in", "aria-labelledby": "sign-in-title" },
      el("h2", { id: "sign-in-title" }, "Sign in"),
      el("p", { role: "alert", class: problem ? "error" : null }, problem || "These pages need an API key."),
      el("p", { class: "muted" }, "Use an API key with the ops scope (monologue keys create --ops),",
        " or the embedded stack's key, in <home>/api-key. It is kept for this tab only."),
      el("label", { for: "api-key" }, "API key"),
      input,
      el("button", { type: "submit" }, "Sign in"),
    );
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      sessionStorage.setItem(KEY, input.value.trim());
      form.remove();
      signingIn = null;
      showSignOut();
      resolve();
    });
    document.querySelector("main").prepend(form);
    input.focus();
  });
  return signingIn;
}

/** Follow a server-sent event stream over fetch (EventSource cannot send the key): `onEvent({type, data})`
 * for each event, `onLost()` when the connection drops, then reconnect after 1 s, doubling up to 30 s (an
 * event resets it). The returned function stops it all. */
export function readEvents(url, onEvent, onLost) {
  const controller = new AbortController();
  const stopped = () => controller.signal.aborted;
  let lastId = null; // sent back as Last-Event-ID: a reconnect gets only what changed since
  (async () => {
    let delay = 1000;
    while (!stopped()) {
      try {
        const headers = { Accept: "text/event-stream", ...(lastId ? { "Last-Event-ID": lastId } : {}) };
        const response = await request(url, { headers, signal: controller.signal });
        if (response.status === 204) return; // ended, and nothing new since lastId
        for await (const event of parseEvents(response.body)) {
          delay = 1000;
          if (event.id) lastId = event.id;
          onEvent(event);
        }
      } catch {
        // Dropped, refused or stopped: the same backoff, unless stopped.
      }
      if (stopped()) return;
      onLost();
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 30_000);
    }
  })();
  return () => controller.abort();
}

/** The events of a text/event-stream body: their `event:`, `data:` and `id:` fields (comments are keep-alives). */
async function* parseEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let type = "message";
  let data = [];
  let id = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    const lines = (buffer + value).split("\n");
    buffer = lines.pop(); // the line still arriving
    for (const line of lines.map((text) => text.replace(/\r$/, ""))) {
      if (line === "") {
        if (data.length) yield { type, data: data.join("\n"), id };
        type = "message";
        data = [];
        id = null;
      } else if (line.startsWith("event:")) type = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      else if (line.startsWith("id:")) id = line.slice(3).trim();
    }
  }
}

/** el("a", {href: "/x", class: "y"}, "text", child): an element; false/null attributes are left out. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    node.setAttribute(name, value === true ? "" : String(value));
  }
  node.append(...children.filter((child) => child !== null && child !== undefined));
  return node;
}

/** Run `task` now and then every `ms` while the tab is visible. Calling the returned function refreshes at
 * once; runs never overlap (a call during a run makes one more run right after it). */
export function every(ms, task) {
  let timer = null;
  let running = false;
  let again = false;
  async function tick() {
    clearTimeout(timer);
    if (running) {
      again = true;
      return;
    }
    running = true;
    if (!document.hidden) {
      try {
        await task();
        notice("");
      } catch (error) {
        notice(`Could not refresh: ${error.message}`);
      }
    }
    running = false;
    if (again) {
      again = false;
      tick();
    } else {
      timer = setTimeout(tick, ms);
    }
  }
  document.addEventListener("visibilitychange", () => !document.hidden && tick());
  tick();
  return tick;
}

/** The page's status line (role=status): problems reaching the API, results of actions. */
export function notice(text) {
  const line = document.getElementById("notice");
  if (line && line.textContent !== text) line.textContent = text;
}

export function statusBadge(status) {
  return el("span", { class: `badge status-${status}` }, status);
}

export function progressBar(done, total, label) {
  const bar = el("progress", { max: total || null, value: total ? done : null, "aria-label": label });
  return el("span", { class: "progress" }, bar, el("span", { class: "progress-label" }, `${done}/${total ?? "?"}`));
}

export function formatDuration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 60) return `${Math.floor(seconds)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${Math.floor(seconds % 60)} s`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ${Math.floor((seconds % 3600) / 60)} min`;
  return `${Math.floor(seconds / 86400)} d ${Math.floor((seconds % 86400) / 3600)} h`;
}

export function formatMs(ms) {
  if (ms === null || ms === undefined) return "–";
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`;
}

export function formatTime(iso) {
  return iso ? new Date(iso).toLocaleString() : "–";
}

export function formatRatio(ratio) {
  return ratio === null || ratio === undefined ? "–" : `${ratio.toFixed(2)}×`;
}

export function shortId(id) {
  return id.length > 12 ? `${id.slice(0, 12)}…` : id;
}

export { TERMINAL } from "./enums.js"; // generated from the Python enums (api/routes/ops.py)
