// Line charts over a run's steps, drawn by the vendored uPlot (static/vendor/, see
// docs/inspector.md), each with its text alternatives: a summary as the chart's accessible
// name and the plotted numbers as a table one button away. The sentinel's alerts are dashed
// vertical markers at their step.

import uPlot from "./vendor/uPlot.esm.js";
import {h, num} from "./dom.js";

// Okabe-Ito: told apart by readers with any common colour vision deficiency.
const COLOURS = ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000",
                 "#f0e442"];
const ALERT = "#b00020";
const HEIGHT = 220;
// Ticks on the step axis fall on whole steps.
const STEP_INCREMENTS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000,
                         10000, 20000, 25000, 50000, 100000];

// The y axis of a kind of value: shares and correlations keep their whole range in view,
// counts start at 0 (a flat 0 reads as 0 of 1, not as a band around 0).
const RANGES = {
  share: () => [0, 1],
  correlation: () => [-1, 1],
  count: (u, min, max) => [0, Math.max(1, Math.ceil(max * 1.1))],
};

/** A figure for one chart: `steps` ascending, each of `series` (`{label, values}`) one value
 * (or null) per step, on a y axis of `kind` (a key of RANGES, or fitted to the data). Says
 * "no data" when no series has a value. Call `draw()` on the result once it is in the
 * document. */
export function chartFigure({id, title, steps, series, kind = null, alerts = []}) {
  const plotted = series.filter((s) => s.values.some((v) => v !== null && v !== undefined));
  const heading = h("h3", {id: `chart-${id}-title`}, title);
  if (!steps.length || !plotted.length) {
    return {figure: h("figure", {class: "chart", dataset: {chart: id, state: "no-data"},
                                 "aria-labelledby": heading.id},
                      heading, h("p", {class: "no-data"}, "No data")),
            draw() {}, destroy() {}};
  }
  const markers = alerts.filter((a) => a.step >= steps[0] && a.step <= steps.at(-1));
  const canvas = h("div", {class: "plot", role: "img",
                           "aria-label": summary(title, steps, plotted, markers)});
  const data = dataTable(id, title, steps, plotted);
  const toggle = h("button", {type: "button", "aria-expanded": "false",
                              "aria-controls": data.id, class: "secondary",
                              on: {click: () => {
                                const open = data.hidden;
                                data.hidden = !open;
                                toggle.setAttribute("aria-expanded", String(open));
                                toggle.textContent = open ? "Hide data table" : "Show data table";
                              }}}, "Show data table");
  const figure = h("figure", {class: "chart", dataset: {chart: id, state: "pending"},
                              "aria-labelledby": heading.id},
                   heading, canvas, toggle, data);
  let plot = null;
  let resize = null;
  return {
    figure,
    draw() {
      plot = new uPlot(options(figure, canvas, plotted, markers, kind),
                       [steps, ...plotted.map((s) => s.values)], canvas);
      resize = new ResizeObserver(() => plot.setSize({width: width(canvas), height: HEIGHT}));
      resize.observe(canvas);
    },
    destroy() {
      resize?.disconnect();
      plot?.destroy();
    },
  };
}

function options(figure, canvas, plotted, markers, kind) {
  return {
    width: width(canvas),
    height: HEIGHT,
    scales: {x: {time: false}, y: kind ? {range: RANGES[kind]} : {}},
    axes: [{label: "step", incrs: STEP_INCREMENTS}, {}],
    series: [
      {label: "step"},
      ...plotted.map((s, i) => ({label: s.label, stroke: COLOURS[i % COLOURS.length], width: 2,
                                 points: {show: true, size: 5}})),
    ],
    hooks: {
      draw: [(u) => {
        drawMarkers(u, markers);
        // what the library drew, for readers of the page's state (the browser tests)
        Object.assign(figure.dataset, {state: "drawn", points: String(u.data[0].length),
                                       series: String(u.series.length - 1),
                                       markers: String(markers.length)});
      }],
    },
  };
}

function drawMarkers(u, markers) {
  const {ctx, bbox} = u;
  ctx.save();
  ctx.strokeStyle = ALERT;
  ctx.lineWidth = 2 * devicePixelRatio;
  ctx.setLineDash([6 * devicePixelRatio, 4 * devicePixelRatio]);
  for (const alert of markers) {
    const x = Math.round(u.valToPos(alert.step, "x", true));
    ctx.beginPath();
    ctx.moveTo(x, bbox.top);
    ctx.lineTo(x, bbox.top + bbox.height);
    ctx.stroke();
  }
  ctx.restore();
}

function width(el) {
  return Math.max(280, Math.floor(el.getBoundingClientRect().width) || 480);
}

function summary(title, steps, plotted, markers) {
  const last = steps.length - 1;
  const latest = plotted.map((s) => `${s.label} ${num(s.values[last])}`).join(", ");
  const alerts = markers.length ? `; ${markers.length} alert(s) marked` : "";
  return `${title}: ${steps.length} step(s), ${steps[0]} to ${steps[last]}; at step `
    + `${steps[last]}: ${latest}${alerts}. The data table below has every value.`;
}

function dataTable(id, title, steps, plotted) {
  return h("table", {id: `chart-${id}-data`, class: "chart-data", hidden: true},
    h("caption", {}, `${title}, per step`),
    h("thead", {}, h("tr", {}, h("th", {scope: "col"}, "Step"),
                     plotted.map((s) => h("th", {scope: "col", class: "num"}, s.label)))),
    h("tbody", {}, steps.map((step, i) => h("tr", {},
      h("th", {scope: "row"}, String(step)),
      plotted.map((s) => h("td", {class: "num", dataset: {value: String(s.values[i])}},
                           num(s.values[i])))))));
}
