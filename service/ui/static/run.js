// #/runs/<id>?steps=N: a run's per-step charts (GET /v1/runs/<id>?steps=N, newest first)
// and the sentinel's alerts (GET /v1/runs/<id>/alerts), marked on every chart at their step.
// A chart whose data the server does not give yet says "No data".

import {ApiError, api} from "./api.js";
import {chartFigure} from "./charts.js";
import {facts, h, navigate, num, route, runNav, when} from "./dom.js";

const DEFAULT_STEPS = 20;
const MAX_STEPS = 1000;

export async function runView(view, runId) {
  const wanted = Number.parseInt(view.params.get("steps"), 10);
  const steps = Number.isFinite(wanted) ? Math.min(Math.max(wanted, 1), MAX_STEPS) : DEFAULT_STEPS;
  const path = `/v1/runs/${encodeURIComponent(runId)}`;
  const [run, alerts] = await Promise.all([
    api(path, {params: {steps}, signal: view.signal}),
    alertsOf(path, view.signal),
  ]);
  view.title(`Run ${runId}`);
  view.add(runNav(runId, "charts"), stepsForm(runId, steps), record(run));

  const ordered = run.steps.filter((s) => s.step !== null).reverse(); // oldest first
  const charts = chartsOf(ordered, alerts?.alerts ?? []);
  const section = h("section", {class: "charts", "aria-labelledby": "charts-title"},
    h("h2", {id: "charts-title"}, `Step charts (${ordered.length} step(s))`),
    ordered.length < run.steps.length
      ? h("p", {}, `${run.steps.length - ordered.length} summary without a step is not charted.`)
      : null,
    charts.map((c) => c.figure));
  view.add(h("div", {class: "run-layout"}, section, alertList(alerts)));
  for (const chart of charts) {
    chart.draw();
    view.onLeave(() => chart.destroy());
  }
}

/** The run's alerts, or null while the server has no alerts route (a 404 for a run the
 * view route just found). */
async function alertsOf(path, signal) {
  try {
    return await api(`${path}/alerts`, {signal});
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) return null;
    throw error;
  }
}

function stepsForm(runId, steps) {
  const input = h("input", {id: "steps", name: "steps", type: "number", min: 1, max: MAX_STEPS,
                            value: steps, required: true, inputmode: "numeric"});
  return h("form", {class: "inline", "aria-label": "Steps to chart", on: {submit: (event) => {
    event.preventDefault();
    navigate(`${route("runs", runId)}?steps=${input.value}`);
  }}}, h("label", {for: "steps"}, "Last steps to chart"), input,
     h("button", {type: "submit"}, "Show"));
}

function record(run) {
  const info = run.record;
  if (!info) return h("p", {}, "This run has state but no record.");
  return facts([["Rollouts recorded", num(info.rollouts)], ["Last step", num(info.last_step)],
                ["First scored", when(info.first_at)], ["Last scored", when(info.last_at)]]);
}

/** One value per step of `pick(step)` under each name `names(step)` gives. */
function byName(steps, names, pick) {
  const all = [...new Set(steps.flatMap((s) => names(s)))].sort();
  return all.map((name) => ({label: name, values: steps.map((s) => pick(s, name) ?? null)}));
}

function total(map, field) {
  const values = Object.values(map ?? {});
  return values.length ? values.reduce((sum, v) => sum + (v[field] ?? 0), 0) : null;
}

function chartsOf(steps, alerts) {
  const xs = steps.map((s) => s.step);
  const one = (label, pick) => [{label, values: steps.map((s) => pick(s) ?? null)}];
  const specs = [
    ["reward-components", "Reward mean per component", null,
     byName(steps, (s) => Object.keys(s.components), (s, n) => s.components[n]?.mean)],
    ["reward-total", "Combined reward mean", null, one("reward", (s) => s.reward_mean)],
    ["reward-sources", "Reward mean per source", null,
     byName(steps, (s) => Object.keys(s.source_rewards ?? {}), (s, n) => s.source_rewards?.[n])],
    ["failures", "Failures per kind", "count", [
      ...one("rollouts with a failure", (s) => s.failed_rollouts),
      ...byName(steps, (s) => Object.values(s.components).flatMap((c) => Object.keys(c.failures)),
                (s, kind) => Object.values(s.components)
                  .reduce((sum, c) => sum + (c.failures[kind] ?? 0), 0))]],
    ["zero-advantage", "Zero-advantage fraction", "share",
     one("zero-advantage fraction", (s) => s.zero_advantage_fraction)],
    ["length", "Mean length (tokens)", null, one("mean length", (s) => s.mean_length)],
    ["canaries", "Canaries", "count", [...one("passed", (s) => total(s.canaries, "passed")),
                              ...one("failed", (s) => total(s.canaries, "failed"))]],
    ["audit", "Audit agreement (rank correlation with the training reward)", "correlation",
     byName(steps, (s) => Object.keys(s.audit ?? {}), (s, n) => s.audit?.[n]?.agreement)],
    ["audit-gap", "Audit mean gap (training minus audit reward)", null,
     byName(steps, (s) => Object.keys(s.audit ?? {}), (s, n) => s.audit?.[n]?.mean_gap)],
    ["signals", "The sentinel's step statistics", null,
     byName(steps, (s) => Object.keys(s.signals ?? {}), (s, n) => s.signals?.[n])],
  ];
  return specs.map(([id, title, kind, series]) =>
    chartFigure({id, title, steps: xs, series, kind, alerts}));
}

function alertList(alerts) {
  const body = alerts === null
    ? h("p", {}, "No alerts available: this server does not report alerts.")
    : !alerts.alerts.length
      ? h("p", {}, "No alerts for this run.")
      : h("ol", {class: "alerts"}, alerts.alerts.map((a) => h("li", {dataset: {step: a.step}},
          h("p", {}, h("strong", {}, a.signal), ` at step ${a.step}`,
            a.onset !== null && a.onset !== undefined && a.onset !== a.step
              ? ` (since step ${a.onset})` : "",
            a.component ? `, component ${a.component}` : ""),
          h("p", {}, a.message),
          h("p", {class: "muted"}, `value ${num(a.value)}, threshold ${num(a.threshold)}`))));
  const signals = alerts?.signals?.length
    ? h("details", {}, h("summary", {}, "What is watched"),
        h("dl", {}, alerts.signals.map((s) => [h("dt", {}, s.name),
                                               h("dd", {}, `${s.description} (threshold `
                                                 + `${num(s.threshold)})`)])))
    : null;
  return h("aside", {class: "alert-list", "aria-labelledby": "alerts-title"},
           h("h2", {id: "alerts-title"}, "Alerts"), body, signals);
}
