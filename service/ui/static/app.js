// The run inspector: hash routes to views, each drawn into <main> from the /v1 API.
//   #/runs                          the tenant's runs
//   #/runs/<id>?steps=N             a run's step charts and the sentinel's alerts
//   #/runs/<id>/rollouts?step=...   the rollout browser (filters and cursor in the query)
//   #/runs/<id>/replay              start a replay (POST /v1/runs/<id>/reverify)
//   #/runs/<id>/replay/<job>        its progress, summary and flips (also #/jobs/<job>)

import {forgetKey, hasKey} from "./api.js";
import {h} from "./dom.js";
import {replayView, jobView} from "./replay.js";
import {rolloutsView} from "./rollouts.js";
import {runView} from "./run.js";
import {runsView} from "./runs.js";

const NAME = "rewardd run inspector";

const ROUTES = [
  [/^\/runs$/, runsView],
  [/^\/runs\/([^/]+)$/, runView],
  [/^\/runs\/([^/]+)\/rollouts$/, rolloutsView],
  [/^\/runs\/([^/]+)\/replay$/, replayView],
  [/^\/runs\/([^/]+)\/replay\/([^/]+)$/, (view, run, job) => jobView(view, job, run)],
  [/^\/jobs\/([^/]+)$/, jobView],
];

/** What a view draws into: the page's <main>, while it is the current view (a view whose
 * route was left stops: its signal aborts its requests and polling, and it adds nothing). */
class View {
  constructor(main, params) {
    this.main = main;
    this.params = params;
    this.controller = new AbortController();
    this.cleanups = [];
    this.focusTarget = null;
  }

  get signal() {
    return this.controller.signal;
  }

  /** The view's heading (an <h1>, focused when the view is drawn) and the tab's title. */
  title(text) {
    if (this.signal.aborted) return;
    this.heading = h("h1", {tabindex: "-1"}, text);
    this.main.prepend(this.heading);
    document.title = `${text} · ${NAME}`;
  }

  add(...nodes) {
    if (!this.signal.aborted) this.main.append(...nodes);
  }

  /** Runs `fn` when the view is left (charts destroyed, timers stopped). */
  onLeave(fn) {
    this.cleanups.push(fn);
  }

  leave() {
    this.controller.abort();
    for (const fn of this.cleanups) fn();
  }

  fail(error) {
    if (this.signal.aborted || error.name === "AbortError") return;
    if (!this.heading) this.title("Something went wrong");
    this.add(h("p", {class: "error", role: "alert"}, error.message || String(error)));
    console.warn(error);
  }
}

let current = null;

async function render() {
  const main = document.getElementById("main");
  const [path, query = ""] = (location.hash.replace(/^#/, "") || "/runs").split("?");
  current?.leave();
  const view = current = new View(main, new URLSearchParams(query));
  main.replaceChildren();
  main.setAttribute("aria-busy", "true");
  for (const link of document.querySelectorAll(".top nav a")) {
    if (link.hash === `#${path}`) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  const match = ROUTES.map(([pattern, fn]) => [path.match(pattern), fn]).find(([m]) => m);
  try {
    if (!match) throw new Error(`No such page: #${path}. Start from the runs.`);
    const [found, fn] = match;
    await fn(view, ...found.slice(1).map(decodeURIComponent));
  } catch (error) {
    view.fail(error);
  }
  if (view !== current) return;
  main.removeAttribute("aria-busy");
  document.getElementById("forget-key").hidden = !hasKey();
  (view.focusTarget || view.heading || main).focus();
}

document.getElementById("forget-key").addEventListener("click", () => {
  forgetKey();
  render();
});
window.addEventListener("hashchange", render);
if (!location.hash) history.replaceState(null, "", "#/runs");
render();
