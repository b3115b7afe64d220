
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("sweep-data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  var byId = {};
  data.trials.forEach(function (t) { byId[t.id] = t; });
  var state = { hl: null, pinned: null, brushes: {} };  // brushes: axis index -> [lo, hi] in axis positions

  // ---------------------------------------------------------------------------------------------- helpers
  function svgEl(tag, attrs, parent) {
    var node = document.createElementNS(NS, tag);
    for (var k in attrs) { if (attrs[k] !== null && attrs[k] !== undefined) node.setAttribute(k, attrs[k]); }
    if (parent) parent.appendChild(node);
    return node;
  }
  function text(parent, x, y, str, attrs) {
    var node = svgEl("text", Object.assign({ x: x, y: y }, attrs || {}), parent);
    node.textContent = str;
    return node;
  }
  function scale(d0, d1, r0, r1) {
    var span = d1 - d0 || 1;
    return function (v) { return r0 + (v - d0) / span * (r1 - r0); };
  }
  function fmt(v) {  // like Python's "{:.4g}"
    if (v === null || v === undefined || !isFinite(v)) return "\u2014";
    if (Number.isInteger(v) && Math.abs(v) < 1e6) return String(v);
    var a = Math.abs(v);
    if (a !== 0 && (a < 1e-4 || a >= 1e6)) return v.toExponential(3).replace(/\.?0+e/, "e");
    return String(Number(v.toPrecision(4)));
  }
  function niceTicks(lo, hi, count) {
    if (hi <= lo) return [lo];
    var step = Math.pow(10, Math.floor(Math.log10((hi - lo) / count)));
    var err = (hi - lo) / count / step;
    step *= err >= 7.5 ? 10 : err >= 3.5 ? 5 : err >= 1.5 ? 2 : 1;
    var out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
    return out;
  }
  function logTicks(lo, hi) {  // lo, hi: log10 of the range
    var out = [];
    for (var e = Math.floor(lo); e <= Math.ceil(hi); e++) {
      [1, 2, 5].forEach(function (m) {
        var v = m * Math.pow(10, e), l = Math.log10(v);
        if (l >= lo - 1e-9 && l <= hi + 1e-9 && (hi - lo > 2 ? m === 1 : true)) out.push(v);
      });
    }
    return out.length >= 2 ? out : [Math.pow(10, lo), Math.pow(10, hi)];
  }
  function width(container) { return Math.max(480, Math.floor(container.getBoundingClientRect().width)); }
  function newSvg(container, w, h, label) {
    container.textContent = "";
    return svgEl("svg", { viewBox: "0 0 " + w + " " + h, width: w, height: h, role: "img", "aria-label": label },
                 container);
  }
  function trialGroup(parent, t, order) {
    var cls = "trial" + (t.id === data.best ? " best-trial" : "");
    var g = svgEl("g", { "class": cls, "data-trial": t.id, "data-order": order }, parent);
    bindTrial(g, t.id);
    return g;
  }
  function pathD(points) {  // points: [x, y] or null (a gap)
    var d = "", pen = false;
    points.forEach(function (p) {
      if (!p) { pen = false; return; }
      d += (pen ? "L" : "M") + p[0].toFixed(1) + "," + p[1].toFixed(1);
      pen = true;
    });
    return d;
  }

  // ---------------------------------------------------------------------------------------------- tooltip
  var tip = document.getElementById("tip");
  function showTip(id, ev) {
    var t = byId[id];
    if (!t || !ev) return;
    tip.textContent = "";
    var head = document.createElement("div");
    head.className = "t";
    head.textContent = t.id + (t.id === data.best ? "  \u2605 best" : "");
    tip.appendChild(head);
    var lines = [t.statusWord + (t.stopReason ? " (" + t.stopReason + ")" : "") + " \u00b7 " + t.epochs + " report" +
                 (t.epochs === 1 ? "" : "s"),
                 "best " + data.metric + " " + (t.bestLabel || "\u2014") + (t.bestEpoch ? " at epoch " + t.bestEpoch : "")];
    Object.keys(t.config).forEach(function (k) { lines.push(k + " = " + t.config[k]); });
    if (t.error) lines.push(t.error);
    lines.forEach(function (line, i) {
      var div = document.createElement("div");
      if (i === 0) div.className = "s";
      div.textContent = line;
      tip.appendChild(div);
    });
    tip.hidden = false;
    moveTip(ev);
  }
  function moveTip(ev) {
    var r = tip.getBoundingClientRect(), x = ev.clientX + 14, y = ev.clientY + 14;
    if (x + r.width > window.innerWidth - 8) x = ev.clientX - r.width - 14;
    if (y + r.height > window.innerHeight - 8) y = ev.clientY - r.height - 14;
    tip.style.left = Math.max(4, x) + "px";
    tip.style.top = Math.max(4, y) + "px";
  }
  function hideTip() { tip.hidden = true; }

  // ---------------------------------------------------------------------------------------------- highlight
  var index = null;  // trial id -> its elements (plot groups, legend entry, table row); rebuilt after a render
  function members(id) {
    // One pass over the page per render, not one per trial: applyFilter asks for every trial's elements, and a
    // query per trial made a 10,000-trial page quadratic.
    if (!index) {
      index = {};
      document.querySelectorAll("[data-trial]").forEach(function (n) {
        var key = n.getAttribute("data-trial");
        (index[key] = index[key] || []).push(n);
      });
    }
    return index[id] || [];
  }
  function setHighlight(id) {
    if (id && !byId[id]) id = null;
    if (state.hl === id) return;
    document.querySelectorAll(".hl").forEach(function (n) { n.classList.remove("hl"); });
    restoreOrder();
    state.hl = id;
    document.body.classList.toggle("has-hl", !!id);
    document.body.setAttribute("data-highlight", id || "");
    if (!id) return;
    members(id).forEach(function (n) {
      n.classList.add("hl");
      if (n.tagName.toLowerCase() === "g" && n.parentNode) n.parentNode.appendChild(n);  // drawn on top
    });
  }
  function restoreOrder() {  // the drawing order a highlight changed: weaker trials below, the best on top
    document.querySelectorAll("g.layer").forEach(function (layer) {
      var kids = Array.prototype.slice.call(layer.children);
      kids.sort(function (a, b) { return a.getAttribute("data-order") - b.getAttribute("data-order"); });
      kids.forEach(function (k) { layer.appendChild(k); });
    });
  }
  function bindTrial(node, id) {
    node.addEventListener("pointerenter", function (ev) { setHighlight(id); showTip(id, ev); });
    node.addEventListener("pointermove", function (ev) { if (!tip.hidden) moveTip(ev); });
    node.addEventListener("pointerleave", function () { hideTip(); setHighlight(state.pinned); });
    node.addEventListener("click", function (ev) {
      if (ev.target.closest && ev.target.closest("a")) return;  // a link in a table row still opens
      state.pinned = state.pinned === id ? null : id;
      setHighlight(state.pinned || id);
      ev.stopPropagation();
    });
  }
  document.addEventListener("click", function () { if (state.pinned) { state.pinned = null; setHighlight(null); } });
  document.addEventListener("keydown", function (ev) {
    if (ev.key === "Escape") { state.pinned = null; setHighlight(null); hideTip(); }
  });

  // ---------------------------------------------------------------------------------------------- filter
  function passes(t) {
    for (var key in state.brushes) {
      var range = state.brushes[key], axis = data.axes[key], pos = axis ? axis.pos[t.id] : null;
      if (pos === null || pos === undefined || pos < range[0] - 1e-9 || pos > range[1] + 1e-9) return false;
    }
    return true;
  }
  function applyFilter() {
    var kept = 0;
    data.trials.forEach(function (t) {
      var ok = passes(t);
      if (ok) kept++;
      members(t.id).forEach(function (n) { n.classList.toggle("out", !ok); });
    });
    var any = Object.keys(state.brushes).length > 0;
    var words = document.getElementById("selection");
    if (words) {
      words.textContent = any ? kept + " of " + data.trials.length + " trials inside the selected ranges"
                              : "Drag along an axis to keep only the trials in a range.";
    }
    var clear = document.getElementById("clear-brushes");
    if (clear) clear.hidden = !any;
    document.body.setAttribute("data-selected", any ? String(kept) : "");
  }

  // ---------------------------------------------------------------------------------------------- learning curves
  function drawCurves(container) {
    var trials = data.trials.filter(function (t) { return t.curve.length; });
    if (!trials.length) return;
    var W = width(container), H = 390, m = { l: 62, r: 112, t: 12, b: 40 };
    var svg = newSvg(container, W, H, "Learning curves: " + data.metric + " per training iteration");
    var xs = [], ys = [], band = data.curveBand || [];
    trials.forEach(function (t) { t.curve.forEach(function (p) { xs.push(p[0]); ys.push(p[1]); }); });
    band.forEach(function (b) { xs.push(b[0]); ys.push(b[1], b[3]); });
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    if (x1 <= x0) { x0 -= 0.5; x1 += 0.5; }
    var log = data.curvesLog, ty = function (v) { return log ? Math.log10(v) : v; };
    var y0 = Math.min.apply(null, ys.map(ty)), y1 = Math.max.apply(null, ys.map(ty));
    var pad = (y1 - y0) * 0.06 || Math.abs(y0) * 0.05 || 1;
    y0 -= pad; y1 += pad;
    var X = scale(x0, x1, m.l, W - m.r), Y0 = scale(y0, y1, H - m.b, m.t), Y = function (v) { return Y0(ty(v)); };

    var grid = svgEl("g", { "class": "grid" }, svg), axis = svgEl("g", { "class": "axis" }, svg);
    var yt = log ? logTicks(y0, y1) : niceTicks(y0, y1, 6);
    yt.forEach(function (v) {
      svgEl("line", { x1: m.l, x2: W - m.r, y1: Y(v), y2: Y(v) }, grid);
      text(axis, m.l - 6, Y(v) + 4, fmt(v), { "text-anchor": "end" });
    });
    var xt = niceTicks(x0, x1, Math.min(10, Math.max(1, Math.round(x1 - x0)))).filter(Number.isInteger);
    xt.forEach(function (v) {
      svgEl("line", { x1: X(v), x2: X(v), y1: m.t, y2: H - m.b }, grid);
      text(axis, X(v), H - m.b + 16, String(v), { "text-anchor": "middle" });
    });
    svgEl("line", { x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b }, axis);
    svgEl("line", { x1: m.l, x2: m.l, y1: m.t, y2: H - m.b }, axis);
    text(axis, (m.l + W - m.r) / 2, H - 6, "training iteration", { "text-anchor": "middle", "class": "axis-title" });
    text(axis, 14, (m.t + H - m.b) / 2, data.metric + (log ? " (log)" : ""),
         { "text-anchor": "middle", "class": "axis-title", transform: "rotate(-90 14 " + (m.t + H - m.b) / 2 + ")" });

    if (band.length) {  // a sampled sweep: every trial's 10th-90th percentile and median, under the drawn lines
      var lo = band.map(function (b) { return [X(b[0]), Y(b[1])]; });
      var hi = band.map(function (b) { return [X(b[0]), Y(b[3])]; });
      if (band.length === 1) {  // one iteration: the band is a bar at it
        svgEl("rect", { x: lo[0][0] - 7, y: hi[0][1], width: 14, height: Math.max(1, lo[0][1] - hi[0][1]),
                        "class": "band" }, svg);
      } else {
        svgEl("path", { d: pathD(hi.concat(lo.reverse())) + "Z", "class": "band" }, svg);
      }
      var mid = band.map(function (b) { return [X(b[0]), Y(b[2])]; });
      if (mid.length === 1) mid = [[mid[0][0] - 9, mid[0][1]], [mid[0][0] + 9, mid[0][1]]];
      svgEl("path", { d: pathD(mid), "class": "band-median" }, svg);
    }
    var layer = svgEl("g", { "class": "layer" }, svg);
    var ends = [];
    trials.forEach(function (t, i) {
      var g = trialGroup(layer, t, t.id === data.best ? 1e6 : i);
      var pts = t.curve.map(function (p) { return [X(p[0]), Y(p[1])]; });
      var best = t.id === data.best;
      var wide = best ? 3.4 : (data.trials.length > 20 ? 1.2 : 1.8);
      svgEl("path", { d: pathD(pts), "class": "hit" }, g);
      svgEl("path", { d: pathD(pts), "class": "line", stroke: t.color, "stroke-width": wide,
                      "stroke-dasharray": t.status === "failed" ? "6 4" : null,
                      "stroke-opacity": best || data.trials.length <= 20 ? 1 : 0.7 }, g);
      if (pts.length === 1 && t.status !== "stopped") {
        svgEl("circle", { cx: pts[0][0], cy: pts[0][1], r: 3.5, fill: t.color, "class": "mark" }, g);
      }
      if (t.status === "stopped") {  // where the scheduler stopped it: an end mark in its colour, and its name
        var e = pts[pts.length - 1];
        svgEl("rect", { x: e[0] - 4, y: e[1] - 4, width: 8, height: 8, fill: "#fff", stroke: t.color,
                        "stroke-width": 2, "class": "mark stop-mark" }, g);
        ends.push({ t: t, g: g, x: e[0], y: e[1] });
      }
      if (best && t.bestPoint) {
        var c = [X(t.bestPoint[0]), Y(t.bestPoint[1])], star = [];
        for (var k = 0; k < 10; k++) {
          var r = k % 2 ? 4.2 : 10, a = Math.PI / 5 * k - Math.PI / 2;
          star.push((c[0] + r * Math.cos(a)).toFixed(1) + "," + (c[1] + r * Math.sin(a)).toFixed(1));
        }
        svgEl("polygon", { points: star.join(" "), fill: "#f5c518", stroke: "#1f2328", "stroke-width": 1.2,
                           "class": "mark best-star" }, g);
      }
    });
    labelStops(ends, m.t + 6, H - m.b - 4);
  }

  function labelStops(ends, top, bottom) {
    // Each early-stopped trial's end named beside it. Ends at (nearly) the same iteration form a column whose
    // labels are pushed apart (13 px at least) and joined to their marks by a leader line.
    if (!ends.length || ends.length > 40) return;
    ends.sort(function (a, b) { return a.x - b.x || a.y - b.y; });
    var columns = [];
    ends.forEach(function (e) {
      var col = columns[columns.length - 1];
      if (col && e.x - col[0].x < 30) col.push(e); else columns.push([e]);
    });
    columns.forEach(function (col) {
      col.sort(function (a, b) { return a.y - b.y; });
      var gap = 13, ys = col.map(function (e) { return e.y; });
      for (var i = 1; i < ys.length; i++) ys[i] = Math.max(ys[i], ys[i - 1] + gap);
      var shift = Math.max(0, ys[ys.length - 1] - bottom);  // back inside the plot, keeping the spacing
      for (i = 0; i < ys.length; i++) ys[i] -= shift;
      for (i = 0; i < ys.length; i++) ys[i] = Math.max(ys[i], top + i * gap);
      var lx = Math.max.apply(null, col.map(function (e) { return e.x; })) + 16;
      col.forEach(function (e, i) {
        if (Math.abs(ys[i] - e.y) > 2) {
          svgEl("line", { x1: e.x + 4, y1: e.y, x2: lx - 3, y2: ys[i], stroke: e.t.color, "class": "leader" }, e.g);
        }
        var label = text(e.g, lx, ys[i] + 4, e.t.id, { "class": "stop-label", fill: e.t.labelColor });
        label.setAttribute("data-stop-label", e.t.id);
      });
    });
  }

  // ---------------------------------------------------------------------------------------------- parallel coordinates
  function drawParallel(container) {
    var axes = data.axes;
    if (!axes.length) return;
    var W = width(container), H = 400, m = { l: 70, r: 70, t: 44, b: 18 };
    var svg = newSvg(container, W, H, "Parallel coordinates: hyperparameters and the best value");
    var n = axes.length;
    var AX = function (i) { return n === 1 ? W / 2 : m.l + i * (W - m.l - m.r) / (n - 1); };
    var P = scale(0, 1, H - m.b, m.t);
    var shown = data.trials.filter(function (t) {
      var p = axes[n - 1].pos[t.id];
      return t.drawn && p !== null && p !== undefined;
    });
    // Worst first, so better trials are drawn over weaker ones where lines cross; the best on top.
    shown.sort(function (a, b) { return data.mode === "min" ? b.best - a.best : a.best - b.best; });
    var layer = svgEl("g", { "class": "layer" }, svg);
    shown.forEach(function (t, i) {
      var g = trialGroup(layer, t, t.id === data.best ? 1e6 : i);
      var pts = axes.map(function (a, k) {
        var p = a.pos[t.id];
        return p === null || p === undefined ? null : [AX(k), P(p)];
      });
      var best = t.id === data.best;
      svgEl("path", { d: pathD(pts), "class": "hit" }, g);
      if (best) svgEl("path", { d: pathD(pts), "class": "line", stroke: "#1f2328", "stroke-width": 5.5 }, g);
      svgEl("path", { d: pathD(pts), "class": "line", stroke: t.color, "stroke-width": best ? 3.2 : 1.6,
                      "stroke-opacity": best ? 1 : (shown.length > 20 ? 0.55 : 0.85) }, g);
    });
    var axisLayer = svgEl("g", { "class": "axis" }, svg);
    axes.forEach(function (a, k) {
      var x = AX(k), last = k === n - 1;
      svgEl("line", { x1: x, x2: x, y1: P(0), y2: P(1), "stroke-width": 1.2 }, axisLayer);
      a.ticks.forEach(function (tk) {
        svgEl("line", { x1: x - 3, x2: x + 3, y1: P(tk[0]), y2: P(tk[0]) }, axisLayer);
        text(axisLayer, last ? x + 6 : x - 6, P(tk[0]) + 4, tk[1],
             { "text-anchor": last ? "start" : "end", "class": "tick-label" });
      });
      var title = text(axisLayer, x, m.t - 24, a.name, { "text-anchor": "middle", "class": "axis-title" });
      title.setAttribute("data-axis", a.name);
      var note = a.scale === "log" ? "log scale" : a.scale === "categorical" ? "categories" : last ? data.better + " is better" : "";
      if (note) text(axisLayer, x, m.t - 10, note, { "text-anchor": "middle", "class": "axis-note" });
      drawBrush(svg, k, x, P);
    });
  }

  function drawBrush(svg, k, x, P) {
    var g = svgEl("g", { "class": "brush-axis", "data-axis-index": k }, svg);
    var rect = svgEl("rect", { x: x - 9, width: 18, "class": "brush" }, g);
    function show() {
      var r = state.brushes[k];
      rect.style.display = r ? "" : "none";
      if (r) { rect.setAttribute("y", P(r[1])); rect.setAttribute("height", Math.max(1, P(r[0]) - P(r[1]))); }
    }
    var zone = svgEl("rect", { x: x - 14, y: P(1) - 6, width: 28, height: P(0) - P(1) + 12, "class": "brush-zone" }, g);
    var svgY = function (ev) {
      var box = svg.getBoundingClientRect(), vb = svg.viewBox.baseVal;
      return (ev.clientY - box.top) * vb.height / box.height;
    };
    var toPos = function (y) { return Math.min(1, Math.max(0, (P(0) - y) / (P(0) - P(1)))); };
    var start = null;
    zone.addEventListener("pointerdown", function (ev) {
      start = svgY(ev);
      zone.setPointerCapture(ev.pointerId);
      ev.preventDefault();
    });
    zone.addEventListener("pointermove", function (ev) {
      if (start === null) return;
      var y = svgY(ev);
      if (Math.abs(y - start) < 3) return;
      var a = toPos(start), b = toPos(y);
      state.brushes[k] = [Math.min(a, b), Math.max(a, b)];
      show();
      applyFilter();
    });
    zone.addEventListener("pointerup", function (ev) {
      if (start !== null && Math.abs(svgY(ev) - start) < 3) delete state.brushes[k];  // a click clears
      start = null;
      show();
      applyFilter();
    });
    zone.addEventListener("click", function (ev) { ev.stopPropagation(); });
    show();
  }

  // ---------------------------------------------------------------------------------------------- best so far
  function drawBestSoFar(container) {
    var b = data.bestSoFar;
    if (!b || !b.order.length) return;
    var W = width(container), H = 260, m = { l: 62, r: 16, t: 12, b: 40 };
    var svg = newSvg(container, W, H, "Best " + data.metric + " so far");
    var points = b.order.map(function (id, i) { return { t: byId[id], x: i + 1 }; });
    var vals = points.filter(function (p) { return p.t.best !== null; }).map(function (p) { return p.t.best; });
    if (!vals.length) return;
    var log = b.log, ty = function (v) { return log ? Math.log10(v) : v; };
    var y0 = Math.min.apply(null, vals.map(ty)), y1 = Math.max.apply(null, vals.map(ty));
    var pad = (y1 - y0) * 0.08 || Math.abs(y0) * 0.05 || 1;
    y0 -= pad; y1 += pad;
    var X = scale(0.5, points.length + 0.5, m.l, W - m.r), Y0 = scale(y0, y1, H - m.b, m.t);
    var Y = function (v) { return Y0(ty(v)); };
    var grid = svgEl("g", { "class": "grid" }, svg), axis = svgEl("g", { "class": "axis" }, svg);
    (log ? logTicks(y0, y1) : niceTicks(y0, y1, 5)).forEach(function (v) {
      svgEl("line", { x1: m.l, x2: W - m.r, y1: Y(v), y2: Y(v) }, grid);
      text(axis, m.l - 6, Y(v) + 4, fmt(v), { "text-anchor": "end" });
    });
    niceTicks(1, points.length, Math.min(points.length, 12)).filter(Number.isInteger).forEach(function (v) {
      text(axis, X(v), H - m.b + 16, String(v), { "text-anchor": "middle" });
    });
    svgEl("line", { x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b }, axis);
    svgEl("line", { x1: m.l, x2: m.l, y1: m.t, y2: H - m.b }, axis);
    text(axis, (m.l + W - m.r) / 2, H - 6, "trials, in the order they ended", { "text-anchor": "middle", "class": "axis-title" });
    var step = [], prev = null;
    b.running.forEach(function (v, i) {
      if (v === null) { step.push(null); prev = null; return; }
      var x = X(i + 1), xn = X(i + 2) - (i === b.running.length - 1 ? (X(i + 2) - X(i + 1)) / 2 : 0);
      if (prev !== null && prev !== v) step.push([x, Y(prev)]);
      step.push([x, Y(v)], [xn, Y(v)]);
      prev = v;
    });
    // A horizontal run kept by its two ends: 10,000 trials make 20,000 points, nearly all on a few flat steps.
    step = step.filter(function (p, i) {
      var a = step[i - 1], z = step[i + 1];
      return !(p && a && z && a[1] === p[1] && z[1] === p[1]);
    });
    svgEl("path", { d: pathD(step), fill: "none", stroke: "#1f2328", "stroke-width": 2 }, svg);
    var layer = svgEl("g", { "class": "layer" }, svg);
    var colors = { completed: "#1f77b4", stopped: "#ff7f0e", failed: "#d62728" };
    points.forEach(function (p, i) {
      if (p.t.best === null || !p.t.drawn) return;
      var g = trialGroup(layer, p.t, i), cx = X(p.x), cy = Y(p.t.best), c = colors[p.t.status] || "#8c959f";
      if (p.t.status === "failed") {
        svgEl("path", { d: "M" + (cx - 4) + "," + (cy - 4) + "l8,8m0,-8l-8,8", stroke: c, "stroke-width": 2,
                        "class": "mark" }, g);
      } else {
        svgEl("circle", { cx: cx, cy: cy, r: p.t.id === data.best ? 6 : 4.2, fill: p.t.status === "stopped" ? "#fff" : c,
                          stroke: c, "stroke-width": 2, "class": "mark" }, g);
      }
      svgEl("circle", { cx: cx, cy: cy, r: 9, fill: "transparent", "class": "mark" }, g);
    });
  }

  // ---------------------------------------------------------------------------------------------- Pareto front
  function drawPareto(container) {
    var p = data.pareto;
    if (!p || !p.points.length) return;
    var W = width(container), H = 380, m = { l: 66, r: 20, t: 14, b: 44 };
    var svg = newSvg(container, W, H, "Pareto front: " + p.x.metric + " against " + p.y.metric);
    function axisOf(vals, log) {  // a transform, its padded range and ticks
      var tv = function (v) { return log ? Math.log10(v) : v; };
      var lo = Math.min.apply(null, vals.map(tv)), hi = Math.max.apply(null, vals.map(tv));
      var pad = (hi - lo) * 0.07 || Math.abs(lo) * 0.05 || 1;
      lo -= pad; hi += pad;
      return { tv: tv, lo: lo, hi: hi, ticks: log ? logTicks(lo, hi) : niceTicks(lo, hi, 6) };
    }
    var ax = axisOf(p.points.map(function (q) { return q.x; }), p.xLog);
    var ay = axisOf(p.points.map(function (q) { return q.y; }), p.yLog);
    var X0 = scale(ax.lo, ax.hi, m.l, W - m.r), Y0 = scale(ay.lo, ay.hi, H - m.b, m.t);
    var X = function (v) { return X0(ax.tv(v)); }, Y = function (v) { return Y0(ay.tv(v)); };
    var grid = svgEl("g", { "class": "grid" }, svg), axis = svgEl("g", { "class": "axis" }, svg);
    ay.ticks.forEach(function (v) {
      svgEl("line", { x1: m.l, x2: W - m.r, y1: Y(v), y2: Y(v) }, grid);
      text(axis, m.l - 6, Y(v) + 4, fmt(v), { "text-anchor": "end" });
    });
    ax.ticks.forEach(function (v) {
      svgEl("line", { x1: X(v), x2: X(v), y1: m.t, y2: H - m.b }, grid);
      text(axis, X(v), H - m.b + 16, fmt(v), { "text-anchor": "middle" });
    });
    svgEl("line", { x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b }, axis);
    svgEl("line", { x1: m.l, x2: m.l, y1: m.t, y2: H - m.b }, axis);
    function words(o, log) { return o.metric + " (" + o.mode + ": " + o.better + " is better" + (log ? ", log" : "") + ")"; }
    text(axis, (m.l + W - m.r) / 2, H - 8, words(p.x, p.xLog), { "text-anchor": "middle", "class": "axis-title",
                                                                  "data-axis": "x" });
    text(axis, 14, (m.t + H - m.b) / 2, words(p.y, p.yLog),
         { "text-anchor": "middle", "class": "axis-title", "data-axis": "y",
           transform: "rotate(-90 14 " + (m.t + H - m.b) / 2 + ")" });
    if (p.step.length > 1) {
      svgEl("path", { d: pathD(p.step.map(function (q) { return [X(q[0]), Y(q[1])]; })), fill: "none",
                      stroke: "#1f2328", "stroke-width": 2, "class": "pareto-step" }, svg);
    }
    var layer = svgEl("g", { "class": "layer" }, svg);
    // The others first, so the front's rings are drawn over them.
    var ordered = p.points.filter(function (q) { return !q.front && byId[q.id].drawn; })
      .concat(p.points.filter(function (q) { return q.front; }));
    ordered.forEach(function (q, i) {
      var t = byId[q.id], g = trialGroup(layer, t, i), cx = X(q.x), cy = Y(q.y);
      if (q.front) {
        g.setAttribute("data-front", "true");
        svgEl("circle", { cx: cx, cy: cy, r: 7, fill: t.color, stroke: "#1f2328", "stroke-width": 2.2,
                          "class": "mark front-mark" }, g);
      } else {
        svgEl("circle", { cx: cx, cy: cy, r: 4.8, fill: t.color, "fill-opacity": 0.6, stroke: t.labelColor,
                          "stroke-width": 1.2, "class": "mark" }, g);
      }
      svgEl("circle", { cx: cx, cy: cy, r: 10, fill: "transparent", "class": "mark" }, g);
    });
  }

  // ---------------------------------------------------------------------------------------------- page
  function renderAll() {
    var plots = [["plot-curves", drawCurves], ["plot-parallel", drawParallel], ["plot-best-so-far", drawBestSoFar],
                 ["plot-pareto", drawPareto]];
    plots.forEach(function (p) {
      var node = document.getElementById(p[0]);
      if (node) p[1](node);
    });
    index = null;  // the plots' elements are new
    applyFilter();
    var keep = state.hl;
    state.hl = null;
    setHighlight(keep);
  }
  function readHash() {
    var params = new URLSearchParams(window.location.hash.replace(/^#/, ""));
    var brush = params.get("brush");
    state.brushes = {};
    if (brush) {
      brush.split(";").forEach(function (part) {
        var m = /^(.+):([0-9.]+)-([0-9.]+)$/.exec(part);
        if (!m) return;
        var k = data.axes.findIndex(function (a) { return a.name === m[1]; });
        if (k >= 0) state.brushes[k] = [Math.min(+m[2], +m[3]), Math.max(+m[2], +m[3])];
      });
    }
    state.pinned = params.get("highlight");
    if (state.pinned && !byId[state.pinned]) state.pinned = null;
    // A link to a trial whose row waits behind "show the other trials": its row is what the link is for.
    if (state.pinned && moreRows && members(state.pinned).some(function (n) { return moreRows.contains(n); })) {
      showAllRows();
    }
  }
  document.querySelectorAll("[data-trial]").forEach(function (n) { bindTrial(n, n.getAttribute("data-trial")); });
  var moreRows = document.getElementById("more-rows"), showRows = document.getElementById("show-rows");
  function showAllRows() {
    if (!moreRows || !moreRows.hidden) return;
    moreRows.hidden = false;
    showRows.closest("tbody").hidden = true;
  }
  if (showRows) showRows.addEventListener("click", function (ev) { showAllRows(); ev.stopPropagation(); });
  var clear = document.getElementById("clear-brushes");
  if (clear) clear.addEventListener("click", function (ev) { state.brushes = {}; renderAll(); ev.stopPropagation(); });
  if (window.self !== window.top) {  // e.g. MLflow's artifact viewer: a sandboxed frame where links cannot open
    var framed = document.getElementById("framed");
    if (framed) framed.hidden = false;
  }
  readHash();
  renderAll();
  setHighlight(state.pinned);
  window.addEventListener("hashchange", function () { readHash(); renderAll(); setHighlight(state.pinned); });
  var timer = null;
  window.addEventListener("resize", function () { clearTimeout(timer); timer = setTimeout(renderAll, 150); });
  document.body.setAttribute("data-rendered", "true");
  document.body.setAttribute("data-rendered-ms", String(Math.round(performance.now())));  // since navigation
})();
