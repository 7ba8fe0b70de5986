// pipetune dashboard: tasks, the selected task's best-so-far curve and measured-vs-predicted
// scatter, and the best-in-k curves per strategy. Refreshes incrementally: a task's trials
// are fetched from the first one not yet final (`after=`), its curve from the last point
// drawn, so a refresh costs the new rows only, however many trials the database holds.
// Latencies are labelled by the runner that produced them (measured, simulated, replayed),
// as the CLI does; a banner says so when every trial on screen is simulated. Workloads and
// schedules of every kernel family are shown by the labels the service gives (the family's
// own: a GEMM tile, a memory-intensive thread mapping), throughput in the unit it gives
// (TFLOP/s for GEMMs, GB/s for memory-intensive operators).
"use strict";

(() => {
  const params = new URLSearchParams(location.search);
  // ?refresh=MS, at least 250; anything that is not a positive number is the default (NaN
  // made setTimeout fire at once: a page polling the service without a pause).
  const askedMs = Number(params.get("refresh"));
  const REFRESH_MS = Number.isFinite(askedMs) && askedMs > 0 ? Math.max(250, askedMs) : 2000;
  const PAGE = 2000;
  // States and runner names come from the service (model/states.py, model/trials.py).
  const VOCABULARY = JSON.parse(document.getElementById("vocabulary").textContent);
  const FINAL = new Set(VOCABULARY.final_job_states);
  const SIMULATED = VOCABULARY.simulated;
  const MEASURED = VOCABULARY.measured;
  const PLOT_CONFIG = { displaylogo: false, responsive: true };

  // An API key, if the service requires one, comes as #key=... and stays in this tab. Taken
  // out of the address at once: it stayed in the address bar and the history, on screen
  // shares and screenshots, longer than the tab's session.
  // Read again when the fragment changes: a key given in a tab that had a wrong one or none
  // was refused until the page was reloaded.
  function takeKeyFromAddress() {
    const hashKey = new URLSearchParams(location.hash.slice(1)).get("key");
    if (!hashKey) return false;
    sessionStorage.setItem("pipetune-api-key", hashKey);
    history.replaceState(null, "", location.pathname + location.search);
    return true;
  }
  takeKeyFromAddress();
  window.addEventListener("hashchange", () => {
    if (takeKeyFromAddress()) refresh();
  });

  // A refusal of the key is not an outage: said as what it is, with what to do.
  class KeyRefused extends Error {}

  const state = {
    tasks: [], detail: null, tick: 0, wanted: Number(params.get("task")) || null,
    curveRunners: [],
  };

  async function get(path) {
    const apiKey = sessionStorage.getItem("pipetune-api-key");
    const response = await fetch(path, { headers: apiKey ? { "X-API-Key": apiKey } : {} });
    if (response.status === 401) {
      throw new KeyRefused(apiKey
        ? "the service refused this tab's API key: open /dashboard#key=KEY with a valid one"
        : "this service needs an API key: open /dashboard#key=KEY");
    }
    if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
    return response.json();
  }

  // The task's workload in words (the service's label), else its op.
  function workloadLabel(task) {
    return task.label || task.workload.op;
  }

  // A schedule: its family's one-cell label from the service, else its knobs.
  function scheduleLabel(schedule, label) {
    if (label) return label;
    return Object.entries(schedule).map(([k, v]) => `${k}=${v}`).join(" ");
  }

  const fixed = (x, digits) => (x == null ? "–" : Number(x).toFixed(digits));

  // A throughput with its unit: GB/s without decimals, TFLOP/s with one.
  function rate(value, unit) {
    if (value == null) return "–";
    return `${fixed(value, unit === "GB/s" ? 0 : 1)} ${unit}`;
  }

  // "measured", "simulated" or "replayed": how a runner's latencies are labelled. Simulated
  // wherever the simulated runner had a part ("replay:simulated", "cupy,simulated"), as the
  // service's is_simulated says. A result that names no runner known here is taken as
  // measured, as before runners were recorded.
  function runnerLabel(runner) {
    const parts = runner ? runner.split(/[:,]/) : [""];
    if (parts.includes(VOCABULARY.simulated_kind)) return SIMULATED;
    return VOCABULARY.runner_labels[parts[0]] || MEASURED;
  }

  // The words for a set of labels: "simulated", "measured or simulated" when they mix, ""
  // when there are none.
  function labelWords(labels) {
    return [...new Set(labels)].sort().join(" or ");
  }

  // A latency cell: the number, tagged with its label unless it was measured.
  function latencyCell(row, text, runner) {
    const td = cell(row, text);
    const label = runnerLabel(runner);
    if (text !== "–" && label !== MEASURED) {
      const tag = document.createElement("span");
      tag.className = "runner-tag";
      tag.textContent = label;
      td.append(" ", tag);
    }
    return td;
  }

  // Labels of every trial on screen: the tasks' best trials, the selected task's results,
  // the runners behind the best-in-k curves.
  function showBanner() {
    const labels = [];
    for (const task of state.tasks) if (task.best) labels.push(runnerLabel(task.best.runner));
    if (state.detail) {
      for (const t of state.detail.trials) if (t && t.status) labels.push(runnerLabel(t.runner));
    }
    for (const runner of state.curveRunners) labels.push(runnerLabel(runner));
    document.getElementById("simulated-banner").hidden = labelWords(labels) !== SIMULATED;
  }

  function cell(row, text, className) {
    const td = document.createElement("td");
    td.textContent = text;
    if (className) td.className = className;
    row.appendChild(td);
    return td;
  }

  // A task warm-started from another GPU's task says so beside its strategy; a dataset
  // imported as a task was not tuned here at all.
  function searchLabel(task) {
    if (task.imported_from) return "imported dataset";
    if (task.prior_task) return `${task.strategy} (prior: task ${task.prior_task})`;
    const learned = task.learned_from;
    if (!learned) return task.strategy;
    const from = learned.length === 1 ? `task ${learned[0]}` : `${learned.length} tasks`;
    return `${task.strategy} (prior: learned from ${from})`;
  }

  // A task with more than the default share of its GPU's workers says how much more.
  function strategyLabel(task) {
    const label = searchLabel(task);
    return task.priority > 1 ? `${label}, priority ${task.priority}` : label;
  }

  function renderTasks() {
    const body = document.querySelector("#tasks tbody");
    const rows = document.createDocumentFragment();
    for (const task of state.tasks) {
      const tr = document.createElement("tr");
      tr.dataset.task = task.id;
      if (state.detail && state.detail.id === task.id) tr.className = "selected";
      cell(tr, String(task.id));
      cell(tr, workloadLabel(task));
      cell(tr, task.gpu);
      cell(tr, strategyLabel(task));
      const stateCell = cell(tr, task.state, `state-${task.state}`);
      // A task no live worker can take says why (the service's no_worker), as text.
      if (task.no_worker) {
        const why = document.createElement("div");
        why.className = "no-worker";
        why.textContent = `waiting: ${task.no_worker}`;
        stateCell.appendChild(why);
      }
      // Of the trials the task runs: its whole space where that is smaller than its budget
      // (as the CLI says it); a finished task of a 42-schedule space read 42/50.
      const wholeSpace = task.trials_target != null && task.trials_target < task.budget;
      const target = wholeSpace ? task.trials_target : task.budget;
      const progress = cell(tr, "");
      const bar = document.createElement("span");
      bar.className = "bar";
      const fill = document.createElement("span");
      fill.style.width = `${Math.min(100, (100 * task.trials_done) / target)}%`;
      bar.appendChild(fill);
      progress.append(bar, `${task.trials_done}/${target}`);
      if (wholeSpace) {
        const note = document.createElement("div");
        note.className = "muted";
        note.textContent = `its whole space; budget ${task.budget}`;
        progress.appendChild(note);
      }
      const bestRunner = task.best && task.best.runner;
      const best = task.best;
      latencyCell(tr, best ? rate(best.throughput, best.throughput_unit) : "–", bestRunner);
      latencyCell(tr, fixed(best && best.latency_us, 2), bestRunner);
      cell(tr, best ? scheduleLabel(best.schedule, best.schedule_label) : "–");
      tr.addEventListener("click", () => select(task.id));
      rows.appendChild(tr);
    }
    body.replaceChildren(rows);
    document.getElementById("no-tasks").hidden = state.tasks.length > 0;
  }

  function select(taskId) {
    if (state.detail && state.detail.id === taskId) return;
    state.detail = { id: taskId, trials: [], cursor: 0, curve: [], unit: null };
    renderTasks();
    refresh();
  }

  async function refreshDetail(detail) {
    let after = detail.cursor - 1;
    for (;;) {
      const page = (await get(`/v1/tasks/${detail.id}/trials?after=${after}&limit=${PAGE}`))
        .trials;
      for (const t of page) detail.trials[t.trial] = t;
      if (page.length < PAGE) break;
      after = page[page.length - 1].trial;
    }
    while (detail.cursor < detail.trials.length &&
           detail.trials[detail.cursor] && FINAL.has(detail.trials[detail.cursor].state)) {
      detail.cursor += 1;
    }
    const lastTrial = () => (detail.curve.length ? detail.curve[detail.curve.length - 1].trial : -1);
    const curve = await get(`/v1/tasks/${detail.id}/curve?after=${lastTrial()}`);
    detail.unit = curve.throughput_unit;
    // Appended only past the last point held now (not when the request left): a point is
    // drawn once even if another refresh of this task added it meanwhile.
    for (const p of curve.points) if (p.trial > lastTrial()) detail.curve.push(p);
  }

  function drawDetail(detail) {
    const task = state.tasks.find((t) => t.id === detail.id) || detail.task;
    document.getElementById("task-section").hidden = false;
    document.getElementById("task-title").textContent = task
      ? `Task ${task.id}: ${workloadLabel(task)} on ${task.gpu} (${task.strategy})`
      : `Task ${detail.id}`;
    const results = detail.trials.filter((t) => t && t.status);
    // "simulated", or e.g. "measured or simulated" when the task's trials mix runners.
    const words = labelWords(results.map((t) => runnerLabel(t.runner)));
    const qualified = words && words !== MEASURED;
    const found = detail.curve.filter((p) => p.best_throughput != null);
    const unit = detail.unit || "TFLOP/s";
    document.getElementById("curve-title").textContent =
      qualified ? `Best so far (${words} trials)` : "Best so far";
    Plotly.react("curve-plot", [{
      x: found.map((p) => p.trial + 1),
      y: found.map((p) => p.best_throughput),
      mode: "lines+markers", line: { shape: "hv" }, marker: { size: 4 }, name: "best so far",
    }], {
      margin: { t: 30, r: 20 },
      xaxis: { title: { text: "trials" }, rangemode: "tozero" },
      yaxis: { title: { text: qualified ? `${words} ${unit}` : unit }, rangemode: "tozero" },
    }, PLOT_CONFIG);
    const timed = results.filter((t) => t.status === "ok" && t.predicted_us);
    const groups = new Map();  // label -> its trials: one trace each, named by the label
    for (const t of timed) {
      const key = runnerLabel(t.runner);
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(t);
    }
    const all = timed.map((t) => t.predicted_us).concat(timed.map((t) => t.latency_us));
    const lo = all.length ? Math.min(...all) : 1;
    const hi = all.length ? Math.max(...all) : 10;
    // With no successful trial, the task's results say what its latencies would have been
    // (an all-failed simulated task read "Measured vs predicted").
    const latency = labelWords([...groups.keys()]) || words || MEASURED;
    document.getElementById("scatter-title").textContent =
      `${latency[0].toUpperCase()}${latency.slice(1)} vs predicted`;
    Plotly.react("scatter-plot", [
      ...[...groups].map(([key, trials]) => ({
        x: trials.map((t) => t.predicted_us), y: trials.map((t) => t.latency_us),
        mode: "markers", name: `${key} trials`, marker: { size: 6, opacity: 0.7 },
        text: trials.map((t) => `trial ${t.trial}: ${scheduleLabel(t.schedule, t.schedule_label)}`),
      })),
      { x: [lo, hi], y: [lo, hi], mode: "lines", name: "latency = predicted",
        line: { dash: "dot", color: "#888" } },
    ], {
      margin: { t: 30, r: 20 },
      xaxis: { title: { text: "predicted µs" }, type: "log" },
      yaxis: { title: { text: `${latency} µs` }, type: "log" },
      showlegend: groups.size > 1,
    }, PLOT_CONFIG);
  }

  async function refreshAggregate() {
    const doc = await get("/v1/curves");
    state.curveRunners = doc.runners || [];
    const words = labelWords(state.curveRunners.map(runnerLabel));
    const suffix = words && words !== MEASURED ? ` (${words} trials)` : "";
    document.getElementById("aggregate-title").textContent = `Best-in-k${suffix}`;
    const traces = Object.entries(doc.curves).map(([strategy, points]) => ({
      x: points.map((p) => p.k), y: points.map((p) => p.best_in_k),
      mode: "lines", name: strategy,
      text: points.map((p) => `${p.tasks} task(s)`),
    }));
    Plotly.react("aggregate-plot", traces, {
      margin: { t: 30, r: 20 },
      xaxis: { title: { text: "k (trials)" } },
      yaxis: { title: { text: `best-in-k${suffix}` }, range: [0, 1.05] },
    }, PLOT_CONFIG);
  }

  // One refresh at a time: a click during a refresh asks for one more after it, instead of
  // a second running beside it on the same task.
  let inFlight = null;
  let again = false;
  function refresh() {
    if (inFlight) {
      again = true;
      return inFlight;
    }
    inFlight = (async () => {
      do {
        again = false;
        await refreshOnce();
      } while (again);
      inFlight = null;
    })();
    return inFlight;
  }

  async function findTask(id) {
    try {
      return await get(`/v1/tasks/${id}`);
    } catch (error) {
      if (error instanceof KeyRefused) throw error;
      return null;  // no such task (404), or not a task id the service takes (422)
    }
  }

  async function refreshOnce() {
    const status = document.getElementById("status");
    try {
      state.tasks = (await get("/v1/tasks?limit=100")).tasks;
      if (!state.detail) {
        // ?task=ID: a task older than the newest listed is read by itself (before, the
        // page fell back to the newest task); one the service does not have, the newest.
        const listed = state.tasks.find((t) => t.id === state.wanted);
        const task = listed || (state.wanted ? await findTask(state.wanted) : null)
          || state.tasks[0];
        if (task) state.detail = { id: task.id, task, trials: [], cursor: 0, curve: [], unit: null };
      }
      renderTasks();
      const detail = state.detail;
      if (detail) {
        await refreshDetail(detail);
        if (detail === state.detail) drawDetail(detail);
      }
      if (state.tick % 5 === 0) await refreshAggregate();
      showBanner();
      state.tick += 1;
      status.textContent = `updated ${new Date().toLocaleTimeString()}`;
      document.body.dataset.refreshes = String(state.tick);
    } catch (error) {
      status.textContent = error instanceof KeyRefused
        ? error.message : `cannot reach the service: ${error.message}`;
    }
  }

  async function loop() {
    await refresh();
    setTimeout(loop, REFRESH_MS);
  }

  loop();
})();
