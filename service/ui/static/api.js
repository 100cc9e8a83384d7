// The /v1 API, as the page calls it: JSON in and out, the caller's API key as a bearer token.
// A 401 asks the reader for a key (the dialog of index.html), keeps it for this tab
// (sessionStorage: gone when the tab closes) and sends the request again.

const KEY = "rewardd.apiKey";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** `GET`s `path` (`params` as its query, empty values left out) or sends `body` as JSON;
 * resolves to the answer's JSON, or rejects with an ApiError naming the status and the
 * API's reason. */
export async function api(path, {method = "GET", params = {}, body, signal} = {}) {
  const url = new URL(path, location.origin);
  for (const [name, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== "") url.searchParams.set(name, value);
  }
  for (;;) {
    const key = sessionStorage.getItem(KEY);
    const headers = {Accept: "application/json"};
    if (key) headers.Authorization = `Bearer ${key}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const answer = await fetch(url, {
      method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (answer.status === 401) {
      sessionStorage.removeItem(KEY);
      sessionStorage.setItem(KEY, await askForKey(key !== null));
      continue;
    }
    const data = await answer.json().catch(() => null);
    if (!answer.ok) throw new ApiError(answer.status, reason(answer, data));
    return data;
  }
}

/** Forgets the key: the next call asks again. */
export function forgetKey() {
  sessionStorage.removeItem(KEY);
}

export function hasKey() {
  return sessionStorage.getItem(KEY) !== null;
}

function reason(answer, data) {
  const detail = data && data.detail;
  if (typeof detail === "string") return `${answer.status}: ${detail}`;
  if (Array.isArray(detail)) {
    return `${answer.status}: ` + detail
      .map((d) => `${(d.loc || []).join(".")}: ${d.msg}`).join("; ");
  }
  return `${answer.status} ${answer.statusText}`;
}

let pending = null;

// Escape does not close the prompt: the page can show nothing without a key.
document.getElementById("key-dialog").addEventListener("cancel", (e) => e.preventDefault());

/** One prompt at a time: calls that meet a 401 together wait for the same key. */
function askForKey(refused) {
  pending ??= new Promise((resolve) => {
    const dialog = document.getElementById("key-dialog");
    const form = document.getElementById("key-form");
    const input = document.getElementById("key-input");
    document.getElementById("key-reason").textContent = refused
      ? "The server refused that key. Enter another API key."
      : "This server asks for an API key. The page sends it to this server only, and "
        + "keeps it until this tab is closed.";
    input.value = "";
    const submitted = (event) => {
      event.preventDefault();
      if (!input.value) return;
      form.removeEventListener("submit", submitted);
      dialog.close();
      pending = null;
      resolve(input.value);
    };
    form.addEventListener("submit", submitted);
    dialog.showModal();
    input.focus();
  });
  return pending;
}
