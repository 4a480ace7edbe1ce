// Shared by the ops pages: JSON over fetch, safe DOM building, polling and formatting.
// Text from the API (error messages, ids) only ever goes into text nodes and attributes, never innerHTML.

export async function getJSON(url) {
  const response = await fetch(url, { headers: { Accept: "application/json" } });
  if (!response.ok) throw new Error(await describe(response));
  return response.json();
}

export async function postJSON(url) {
  const response = await fetch(url, { method: "POST", headers: { Accept: "application/json" } });
  if (!response.ok) throw new Error(await describe(response));
  return response.json();
}

async function describe(response) {
  try {
    return `${response.status}: ${(await response.json()).detail}`;
  } catch {
    return `${response.status} ${response.statusText}`;
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

export function formatFactor(factor) {
  return factor === null || factor === undefined ? "–" : `${factor.toFixed(2)}×`;
}

export function shortId(id) {
  return id.length > 12 ? `${id.slice(0, 12)}…` : id;
}

export const TERMINAL = ["completed", "failed", "cancelled"];
