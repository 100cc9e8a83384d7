// #/runs: the tenant's recorded runs, the most recently scored first.

import {api} from "./api.js";
import {h, num, route, table, when} from "./dom.js";

export async function runsView(view) {
  const {runs} = await api("/v1/runs");
  view.title("Runs");
  if (!runs.length) {
    view.add(h("p", {}, "No runs recorded yet. A scoring request that names a ",
                     h("code", {}, "run_id"), " is recorded."));
    return;
  }
  view.add(table(`${runs.length} run(s), the most recently scored first`, [
    {label: "Run", cell: (r) => h("a", {href: route("runs", r.run_id)}, r.run_id)},
    {label: "Last step", numeric: true, cell: (r) => num(r.last_step)},
    {label: "Rollouts", numeric: true, cell: (r) => num(r.rollouts)},
    {label: "Last scored", cell: (r) => when(r.last_at)},
  ], runs, {id: "runs"}));
}
