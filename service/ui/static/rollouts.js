// #/runs/<id>/rollouts?step=&source=&component=&outcome=&q=&cursor=: the rollout browser
// (GET /v1/runs/<id>/rollouts). The filters live in the query, so a filtered page is a link
// and Back works; a page is followed by the next through the API's `next_cursor`. A rollout
// opens below the table: its completion (as text), its verdicts, receipts and summary.

import {api} from "./api.js";
import {facts, fragment, h, json, navigate, num, route, runNav, table} from "./dom.js";

const FILTERS = ["step", "source", "component", "outcome", "q", "limit"];
const OUTCOMES = ["ok", "failed", "timeout", "crashed", "error", "invalid_reference",
                  "unavailable", "missing", "judge_unparseable", "judge_refused",
                  "judge_unavailable"];
const PAGE_SIZES = ["10", "50", "100", "500"];
const DEFAULT_PAGE = "50";

export async function rolloutsView(view, runId) {
  const filters = Object.fromEntries(FILTERS.map((name) => [name, view.params.get(name) ?? ""]));
  const cursor = view.params.get("cursor") ?? "";
  const base = `/v1/runs/${encodeURIComponent(runId)}`;
  const [page, run] = await Promise.all([
    api(`${base}/rollouts`, {params: {...filters, cursor, limit: filters.limit || DEFAULT_PAGE},
                             signal: view.signal}),
    // the run's recent sources and components, suggested in the filters
    api(base, {params: {steps: 20}, signal: view.signal}),
  ]);
  view.title(`Rollouts of ${runId}`);
  const detail = h("section", {id: "rollout", class: "rollout-detail",
                               "aria-labelledby": "rollout-title", hidden: true});
  const results = h("h2", {id: "results-title", tabindex: "-1"}, "Rollouts");
  view.add(runNav(runId, "rollouts"), filterForm(runId, filters, run.steps),
           h("section", {"aria-labelledby": results.id}, results,
             rolloutTable(page.rollouts, cursor, detail), pager(runId, filters, cursor, page)),
           detail);
  if (Object.values(filters).some(Boolean) || cursor) view.focusTarget = results;
}

function filterForm(runId, filters, steps) {
  const known = (pick) => [...new Set(steps.flatMap(pick))].filter(Boolean).sort();
  const field = (name, label, control) => h("div", {class: "field"},
    h("label", {for: `filter-${name}`}, label), control);
  const text = (name, attrs = {}) => h("input", {id: `filter-${name}`, name, value: filters[name],
                                                 ...attrs});
  const outcome = h("select", {id: "filter-outcome", name: "outcome"},
    h("option", {value: ""}, "any"),
    OUTCOMES.map((o) => h("option", {value: o, selected: o === filters.outcome}, o)));
  const form = h("form", {class: "filters", "aria-label": "Filter rollouts", on: {submit: (e) => {
    e.preventDefault();
    const query = new URLSearchParams();
    for (const [name, value] of new FormData(form)) if (value) query.set(name, value);
    navigate(`${route("runs", runId, "rollouts")}${query.size ? `?${query}` : ""}`);
  }}},
    field("step", "Step", text("step", {type: "number", min: 0, inputmode: "numeric"})),
    field("source", "Source", text("source", {list: "known-sources"})),
    field("component", "Component", text("component", {list: "known-components"})),
    field("outcome", "Outcome", outcome),
    field("q", "Completion contains", text("q", {type: "search", maxlength: 256})),
    field("limit", "Rows per page", h("select", {id: "filter-limit", name: "limit"},
      PAGE_SIZES.map((n) => h("option", {value: n, selected: n === (filters.limit || DEFAULT_PAGE)},
                              n)))),
    h("datalist", {id: "known-sources"},
      known((s) => Object.keys(s.sources)).map((v) => h("option", {value: v}))),
    h("datalist", {id: "known-components"},
      known((s) => Object.keys(s.components)).map((v) => h("option", {value: v}))),
    h("div", {class: "actions"}, h("button", {type: "submit"}, "Apply filters"),
      h("a", {href: route("runs", runId, "rollouts")}, "Clear")));
  return form;
}

function rolloutTable(rollouts, cursor, detail) {
  if (!rollouts.length) return h("p", {id: "rollouts-empty"}, "No rollouts match these filters.");
  let selected = null;
  const open = (rollout, row) => {
    selected?.removeAttribute("aria-current");
    row.setAttribute("aria-current", "true");
    selected = row;
    detail.replaceChildren(rolloutDetail(rollout));
    detail.hidden = false;
    detail.querySelector("h2").focus();
  };
  const caption = `${rollouts.length} rollout(s)${cursor ? " after the earlier pages" : ""}; `
    + "open one for its completion, verdicts and receipts";
  return table(caption, [
    {label: "Rollout", cell: (r) => h("button", {type: "button", class: "link",
                                                 "aria-controls": "rollout",
                                                 on: {click: (e) => open(r, e.target.closest("tr"))}},
                                       r.rollout_id)},
    {label: "Step", numeric: true, cell: (r) => num(r.step)},
    {label: "Source", cell: (r) => r.source ?? "–"},
    {label: "Group", cell: (r) => r.group_id},
    {label: "Outcome", cell: (r) => h("span", {class: `outcome ${r.outcome}`}, r.outcome)},
    {label: "Reward", numeric: true, cell: (r) => num(r.summary?.reward)},
    {label: "Advantage mean", numeric: true, cell: (r) => num(r.summary?.advantage_mean)},
    {label: "Tokens", numeric: true, cell: (r) => num(r.num_tokens)},
  ], rollouts, {id: "rollouts"});
}

function pager(runId, filters, cursor, page) {
  const query = (extra) => {
    const params = new URLSearchParams(Object.entries({...filters, ...extra}).filter(([, v]) => v));
    return `${route("runs", runId, "rollouts")}${params.size ? `?${params}` : ""}`;
  };
  return h("nav", {class: "pager", "aria-label": "Pages of rollouts"},
    cursor ? h("a", {href: query({})}, "First page") : null,
    page.next_cursor ? h("a", {href: query({cursor: page.next_cursor}), rel: "next"}, "Next page")
                     : h("span", {class: "muted"}, "Last page"));
}

function rolloutDetail(r) {
  const summary = r.summary ?? {};
  return fragment(
    h("h2", {id: "rollout-title", tabindex: "-1"}, `Rollout ${r.rollout_id}`),
    facts([["Group", r.group_id], ["Step", num(r.step)], ["Source", r.source ?? "–"],
           ["Outcome", r.outcome], ["Tokens", num(r.num_tokens)], ["Recorded", r.recorded_at]]),
    h("h3", {}, "Completion"),
    r.completion === null
      ? h("p", {}, "Not kept: the server's REWARDD_RECORD_COMPLETIONS left it out.")
      : h("pre", {class: "completion", tabindex: "0", "aria-label": "Completion"}, r.completion),
    h("h3", {}, "Summary"),
    facts([["Reward", num(summary.reward)], ["Excluded", summary.excluded ? "yes" : "no"],
           ["Advantage mean", num(summary.advantage_mean)],
           ["All advantages zero", r.zero_advantage === null ? "– (no advantages)"
                                   : r.zero_advantage ? "yes" : "no"]]),
    advantageStrip(summary),
    summary.canaries ? [h("h4", {}, "The batch's canaries"), json(summary.canaries)] : null,
    h("h3", {}, "Verdicts"),
    Object.entries(r.verdicts).map(([name, verdict]) => verdictOf(name, verdict)),
    summary.audit ? [
      h("h3", {}, "Audit verdicts (never in the reward)"),
      Object.entries(summary.audit).map(([name, audit]) => verdictOf(name, {
        reward: audit.reward, outcome: audit.ok ? "ok" : audit.error ?? "failed", status: audit,
      }, "audit"))] : null);
}

/** The rollout's per-token advantages as a strip: one segment per run of equal values,
 * as wide as its tokens, blue above zero and red below, stronger the larger |A| (the record
 * keeps them run-length encoded up to 256 runs: `summary.advantages`). */
function advantageStrip(summary) {
  const runs = summary.advantages;
  if (!Array.isArray(runs) || runs.length === 0) {
    return h("p", {class: "muted"}, summary.advantage_runs
      ? `Per-token advantages not kept: ${summary.advantage_runs} runs of values, over the `
        + "record's bound of 256 (only their mean is)."
      : "No per-token advantages recorded for this rollout (scalar output, or none).");
  }
  const tokens = runs.reduce((sum, [, n]) => sum + n, 0);
  const largest = Math.max(...runs.map(([v]) => Math.abs(v))) || 1;
  let start = 0;
  const segments = runs.map(([value, count]) => {
    const seg = h("span", {class: "run", title: `tokens ${start}–${start + count - 1}: ${value}`,
                           dataset: {value: String(value), tokens: String(count)}});
    const strength = 0.2 + 0.8 * Math.abs(value) / largest;  // CSSOM, allowed by the CSP
    seg.style.flexGrow = String(count);
    seg.style.backgroundColor = value > 0 ? `rgba(31, 119, 180, ${strength})`
      : value < 0 ? `rgba(214, 39, 40, ${strength})` : "rgba(128, 128, 128, 0.25)";
    start += count;
    return seg;
  });
  const low = Math.min(...runs.map(([v]) => v)), high = Math.max(...runs.map(([v]) => v));
  return fragment(
    h("h3", {}, "Per-token advantages"),
    h("div", {class: "strip", role: "img", "aria-label": `Per-token advantages over ${tokens} `
              + `tokens in ${runs.length} runs, from ${num(low)} to ${num(high)}`}, segments),
    h("details", {}, h("summary", {}, "Show the runs"),
      table("Runs of equal advantages", [
        {label: "Tokens", cell: ([, n]) => String(n), numeric: true},
        {label: "Advantage", cell: ([v]) => num(v), numeric: true}], runs)));
}

/** One component's verdict: a reward component's (`kind` "reward") or an audit's. */
function verdictOf(name, verdict, kind = "reward") {
  const status = verdict.status ?? {};
  const receipt = status.receipt;
  return h("section", {class: "verdict", dataset: {component: name, kind}},
    h("h4", {}, name),
    facts([["Reward", num(verdict.reward)], ["Outcome", verdict.outcome],
           ["Error", status.error ?? undefined]]),
    status.detail !== undefined && status.detail !== null
      ? [h("h5", {}, "Detail"), json(status.detail)] : null,
    status.evidence !== undefined ? [h("h5", {}, "Evidence"), json(status.evidence)] : null,
    h("h5", {}, "Receipt"),
    receipt ? facts(Object.entries(receipt).map(([k, v]) =>
      [k, typeof v === "object" ? json(v) : String(v)]), {class: "facts receipt"})
      : h("p", {}, "No receipt (a precomputed value)."));
}
