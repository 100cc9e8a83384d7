// Building the page's elements. Text goes in as text nodes only (never as HTML), so a
// completion, a run id or a verifier's evidence that contains markup shows as what it is.

/** An element: `h("a", {href: "#/runs"}, "Runs")`. Attributes whose value is null, undefined
 * or false are left out; `on` maps event names to listeners; children are nodes or text. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "on") {
      for (const [event, listener] of Object.entries(value)) el.addEventListener(event, listener);
    } else if (name === "dataset") {
      Object.assign(el.dataset, value);
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** A table with a caption, one header row and one row per item; `columns` are
 * `{label, cell: item => node or text, numeric?}`. */
export function table(caption, columns, items, attrs = {}) {
  return h("table", attrs,
    caption ? h("caption", {}, caption) : null,
    h("thead", {}, h("tr", {}, columns.map((c) =>
      h("th", {scope: "col", class: c.numeric ? "num" : null}, c.label)))),
    h("tbody", {}, items.map((item) => h("tr", {}, columns.map((c) =>
      h("td", {class: c.numeric ? "num" : null}, c.cell(item)))))));
}

/** A description list of `[term, description]` pairs (pairs whose description is undefined
 * are left out). */
export function facts(pairs, attrs = {}) {
  return h("dl", {class: "facts", ...attrs}, pairs
    .filter(([, value]) => value !== undefined)
    .map(([term, value]) => [h("dt", {}, term), h("dd", {}, value)]));
}

const NUMBER = new Intl.NumberFormat("en", {maximumFractionDigits: 4});

/** A number as shown in tables; "–" for none. */
export function num(value) {
  if (value === null || value === undefined) return "–";
  return typeof value === "number" ? NUMBER.format(value) : String(value);
}

/** A time from the API (RFC 3339) as a <time> element in the reader's locale. */
export function when(iso) {
  if (!iso) return "–";
  return h("time", {datetime: iso}, new Date(iso).toLocaleString());
}

/** JSON shown as text, indented. */
export function json(value) {
  return h("pre", {class: "json"}, JSON.stringify(value, null, 2));
}

/** The hash link of a view: `link("runs", id, "rollouts")` -> `#/runs/<id>/rollouts`. */
export function route(...parts) {
  return "#/" + parts.map((p) => encodeURIComponent(String(p))).join("/");
}

/** Goes to `hash`; when it is already the current one, its view is drawn again. */
export function navigate(hash) {
  if (location.hash === hash) window.dispatchEvent(new HashChangeEvent("hashchange"));
  else location.hash = hash;
}

/** The links between a run's views; `current` is the one shown. */
export function runNav(runId, current) {
  const links = [["charts", "Step charts", route("runs", runId)],
                 ["rollouts", "Rollouts", route("runs", runId, "rollouts")],
                 ["replay", "Replay", route("runs", runId, "replay")]];
  return h("nav", {"aria-label": `Run ${runId}`, class: "run-nav"}, h("ul", {},
    links.map(([key, label, href]) => h("li", {}, h("a", {
      href, "aria-current": key === current ? "page" : null}, label)))));
}

/** Nodes and text (nested lists, nulls left out) as one fragment, to put in place at once. */
export function fragment(...children) {
  const el = document.createDocumentFragment();
  append(el, children);
  return el;
}
