// #/runs/<id>/replay: start a replay of a recorded run (POST /v1/runs/<id>/reverify) with
// changed verifier parameters; #/runs/<id>/replay/<job> (and #/jobs/<job>): its progress
// (GET /v1/jobs/<job>, polled), then the summary and every flipped verdict with both receipts.

import {api} from "./api.js";
import {facts, fragment, h, json, navigate, num, route, runNav, table} from "./dom.js";

const POLL_MS = 500;
const ACTIVE = new Set(["queued", "running"]);

export async function replayView(view, runId) {
  view.title(`Replay run ${runId}`);
  const first = h("input", {id: "replay-first", name: "first", type: "number", min: 0});
  const last = h("input", {id: "replay-last", name: "last", type: "number", min: 0});
  const overrides = h("textarea", {id: "replay-set", name: "set", rows: 4, spellcheck: "false",
                                   "aria-describedby": "replay-set-help"});
  const problem = h("p", {class: "error", role: "alert", hidden: true});
  const submit = h("button", {type: "submit"}, "Start replay");
  const form = h("form", {class: "replay", "aria-labelledby": "replay-form-title",
                          on: {submit: async (event) => {
    event.preventDefault();
    problem.hidden = true;
    submit.disabled = true;
    try {
      const body = {set: parseOverrides(overrides.value)};
      const steps = stepRange(first.value, last.value);
      if (steps) body.steps = steps;
      const job = await api(`/v1/runs/${encodeURIComponent(runId)}/reverify`,
                            {method: "POST", body, signal: view.signal});
      navigate(route("runs", runId, "replay", job.id));
    } catch (error) {
      if (error.name === "AbortError") return;
      problem.textContent = error.message;
      problem.hidden = false;
      submit.disabled = false;
    }
  }}},
    h("h2", {id: "replay-form-title"}, "Re-score the run's recorded rollouts"),
    h("p", {}, "Every rollout recorded with its completion is checked again with today's "
               + "verifiers, its parameters changed as you say; the run's record is not "
               + "touched. Leave the steps empty for the whole run."),
    h("div", {class: "field"}, h("label", {for: first.id}, "First step"), first),
    h("div", {class: "field"}, h("label", {for: last.id}, "Last step"), last),
    h("div", {class: "field wide"}, h("label", {for: overrides.id}, "Parameter overrides"),
      overrides,
      h("p", {id: "replay-set-help", class: "muted"}, "One per line, ",
        h("code", {}, "component.param=value"), "; a value that reads as JSON is taken as JSON ",
        "(8, true, {\"a\": 1}), anything else as text. Example: ",
        h("code", {}, "math.extract=boxed"), ".")),
    h("div", {class: "actions"}, submit), problem);
  view.add(runNav(runId, "replay"), form);
}

/** `component.param=value` lines as the request's `set` (as `rewardd reverify --set`). */
export function parseOverrides(text) {
  const set = {};
  for (const line of text.split("\n").map((l) => l.trim()).filter(Boolean)) {
    const at = line.indexOf("=");
    if (at < 1) throw new Error(`"${line}": write component.param=value`);
    const value = line.slice(at + 1).trim();
    try {
      set[line.slice(0, at).trim()] = JSON.parse(value);
    } catch {
      set[line.slice(0, at).trim()] = value;
    }
  }
  return set;
}

function stepRange(first, last) {
  if (first === "" && last === "") return null;
  const a = Number(first === "" ? last : first);
  const b = Number(last === "" ? first : last);
  return [a, b];
}

export async function jobView(view, jobId, runId = null) {
  const path = `/v1/jobs/${encodeURIComponent(jobId)}`;
  let job = await api(path, {signal: view.signal});
  view.title(`Replay job ${jobId}`);
  if (runId) view.add(runNav(runId, "replay"));
  const bar = h("progress", {id: "job-progress", max: 1, value: 0});
  const state = h("p", {id: "job-state", role: "status"});
  const cancel = h("button", {type: "button", class: "secondary", on: {click: async () => {
    cancel.disabled = true;
    try {
      await api(path, {method: "DELETE", signal: view.signal});
    } catch (error) {
      view.fail(error);
    }
  }}}, "Cancel replay");
  const result = h("div", {id: "job-result"});
  view.add(h("section", {"aria-labelledby": "job-progress-label", class: "job"},
    h("h2", {id: "job-progress-label"}, h("label", {for: bar.id}, "Progress")),
    bar, state, cancel), result);
  for (;;) {
    const {done, total} = job.progress;
    bar.max = Math.max(total, 1);
    bar.value = done;
    state.textContent = `${job.state}: ${done} of ${total} rollout(s) checked`
      + (job.error ? ` (${job.error})` : "");
    if (!ACTIVE.has(job.state)) break;
    await sleep(POLL_MS, view.signal);
    job = await api(path, {signal: view.signal});
  }
  cancel.hidden = true;
  if (job.state !== "succeeded" || !job.result) return;
  result.append(Array.isArray(job.result.flips) ? replayResult(job.result)
    : h("p", {}, "This job is not a replay: its result is a scoring answer (GET ", path, ")."));
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      reject(signal.reason);
    }, {once: true});
  });
}

function replayResult(result) {
  const s = result.summary;
  const counts = (title, by) => table(title, [
    {label: "Name", cell: ([name]) => name || "(none)"},
    {label: "Re-scored", numeric: true, cell: ([, c]) => num(c.rescored)},
    {label: "Flipped", numeric: true, cell: ([, c]) => num(c.flipped)},
    {label: "Up", numeric: true, cell: ([, c]) => num(c.up)},
    {label: "Down", numeric: true, cell: ([, c]) => num(c.down)},
  ], Object.entries(by));
  return fragment(
    h("h2", {}, "Summary"),
    facts([["Run", h("a", {href: route("runs", result.run_id)}, result.run_id)],
           ["Steps", result.steps ? `${result.steps[0]} to ${result.steps[1]}` : "all"],
           ["Overrides", Object.keys(result.set).length ? json(result.set) : "none"],
           ["Rollouts", num(s.rollouts)], ["Re-scored", num(s.rescored)],
           ["Skipped (no completion kept)", num(s.skipped)], ["Checks", num(s.checks)],
           ["Flips", num(s.flips)]], {id: "replay-summary"}),
    counts("Per component", s.components),
    counts("Per source", s.sources),
    h("h2", {}, `Flips (${result.flips.length})`),
    result.flips_truncated ? h("p", {}, "More flips than listed; the summary counts them all.")
                           : null,
    result.flips.length ? flipTable(result.flips) : h("p", {}, "No verdict flipped."));
}

function flipTable(flips) {
  return table("Every verdict whose reward or outcome changed", [
    {label: "Step", numeric: true, cell: (f) => num(f.step)},
    {label: "Group", cell: (f) => f.group_id},
    {label: "Rollout", cell: (f) => f.rollout_id},
    {label: "Component", cell: (f) => f.component},
    {label: "Source", cell: (f) => f.source ?? "–"},
    {label: "Before → after", cell: (f) => verdictChange(f)},
    {label: "What changed", cell: (f) => changed(f.receipts).join(", ") || "nothing in the receipt"},
    {label: "Receipt before", cell: (f) => receipt(f.receipts.before, changed(f.receipts))},
    {label: "Receipt after", cell: (f) => receipt(f.receipts.after, changed(f.receipts))},
  ], flips, {id: "flips"});
}

function verdictChange(flip) {
  const {before, after} = flip.outcomes;
  const side = (reward, outcome) => (outcome === "ok" ? num(reward) : outcome);
  return `${side(flip.before, before)} → ${side(flip.after, after)}`;
}

function changed({before, after}) {
  const keys = new Set([...Object.keys(before ?? {}), ...Object.keys(after ?? {})]);
  return [...keys].filter((k) => JSON.stringify(before?.[k]) !== JSON.stringify(after?.[k]));
}

function receipt(value, highlight) {
  if (!value) return "none";
  const shown = highlight.filter((k) => k in value)
    .map((k) => `${k} ${String(value[k]).slice(0, 8)}`).join(", ");
  return h("details", {}, h("summary", {}, shown || "receipt"),
           facts(Object.entries(value).map(([k, v]) =>
             [k, typeof v === "object" ? json(v) : String(v)])));
}
