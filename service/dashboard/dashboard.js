// pipetune dashboard: tasks, the selected task's best-so-far curve and measured-vs-predicted
// scatter, the best-in-k curves per strategy, and the workers. Refreshes incrementally: a
// task's trials are fetched from the first one not yet final (`after=`), its curve from the
// last point drawn, so a refresh costs the new rows only, however many trials the database
// holds. Latencies are labelled by the runner that produced them (measured, simulated,
// replayed), as the CLI does; a banner says so when every trial on screen is simulated.
// Workloads and schedules of every kernel family are shown by the labels the service gives
// (the family's own: a GEMM tile, a memory-intensive thread mapping), throughput in the unit
// it gives (TFLOP/s for GEMMs, GB/s for memory-intensive operators).
"use strict";

(() => {
  const params = new URLSearchParams(location.search);
  // ?refresh=MS, at least 250; anything that is not a positive number is the default (NaN
  // made setTimeout fire at once: a page polling the service without a pause).
  const askedMs = Number(params.get("refresh"));
  const REFRESH_MS = Number.isFinite(askedMs) && askedMs > 0 ? Math.max(250, askedMs) : 2000;
  const PAGE = 2000;
  // The service's root as this page was reached: its links are relative to it, so the page
  // works behind a proxy that serves the service under a path prefix (/pipetune/dashboard).
  const ROOT = location.pathname.replace(/dashboard\/?$/, "");
  // States and runner names come from the service (model/states.py, model/trials.py).
  const VOCABULARY = JSON.parse(document.getElementById("vocabulary").textContent);
  const FINAL = new Set(VOCABULARY.final_job_states);
  const ENDED = new Set(VOCABULARY.final_task_states);
  const SIMULATED = VOCABULARY.simulated;
  const MEASURED = VOCABULARY.measured;
  const PLOT_CONFIG = { displaylogo: false, responsive: true };
  // A request with no answer in a few refresh periods is given up, and said so: without a
  // limit one that hung (a stopped service, a connection dropped silently on the way) held
  // the page on its last "updated" time until TCP gave up, minutes later.
  const TIMEOUT_MS = Math.max(15000, 5 * REFRESH_MS);
  // A trial's or a task's error is shown up to this long (a compiler's log can be pages).
  const ERROR_CHARS = 300;

  // The key as typed after #key=: the fragment is not a form (URLSearchParams turned a
  // base64 key's "+" into a space and cut "p&q=r" at "&"). Only percent-escapes are undone,
  // as the browser writes a space, `"`, `<`, `>` or a backtick as one; so a "%" followed by
  // two hex digits is written %25 (README), and a "%" that starts no escape is kept as typed.
  function keyFromFragment(hash) {
    const match = /^#key=(.*)$/s.exec(hash);
    if (!match) return "";
    return match[1].replace(/(?:%[0-9A-Fa-f]{2})+/g, (run) => {
      try {
        return decodeURIComponent(run);
      } catch {
        return run;  // escapes that are not UTF-8: kept as typed rather than thrown
      }
    });
  }

  // An API key, if the service requires one, comes as #key=... and stays in this tab. Taken
  // out of the address at once: it stayed in the address bar and the history, on screen
  // shares and screenshots, longer than the tab's session.
  // Read again when the fragment changes: a key given in a tab that had a wrong one or none
  // was refused until the page was reloaded.
  function takeKeyFromAddress() {
    const hashKey = keyFromFragment(location.hash);
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
  // An error the service answered (a 503 during a database stall, a 404): the service was
  // reached, and says why (it was worded "cannot reach the service").
  class ServiceAnswered extends Error {
    constructor(message, status) {
      super(message);
      this.status = status;
    }
  }
  // No answer within TIMEOUT_MS.
  class NoAnswer extends Error {}

  const state = {
    tasks: [], listed: false, detail: null, tick: 0, aggregateDue: 0, workersDue: 0,
    aggregateSeen: null, aggregateStale: 0, aggregateGpu: "",
    wanted: Number(params.get("task")) || null, curveRunners: [],
  };
  let lastAnswer = new Date();  // the service's last answer of any kind (or the page's load)

  async function get(path) {
    const apiKey = sessionStorage.getItem("pipetune-api-key");
    try {
      const response = await fetch(ROOT + path.replace(/^\//, ""), {
        headers: apiKey ? { "X-API-Key": apiKey } : {},
        signal: AbortSignal.timeout(TIMEOUT_MS),
      });
      lastAnswer = new Date();
      if (response.status === 401) {
        throw new KeyRefused(apiKey
          ? `the service refused this tab's API key: open ${location.pathname}#key=KEY with a valid one`
          : `this service needs an API key: open ${location.pathname}#key=KEY`);
      }
      if (!response.ok) {
        const why = await answerDetail(response);
        throw new ServiceAnswered(
          `the service answered ${response.status} for ${path}${why ? `: ${why}` : ""}; retrying`,
          response.status);
      }
      return await response.json();  // awaited here: the limit covers the body too
    } catch (error) {
      if (error.name !== "TimeoutError") throw error;
      throw new NoAnswer(`no answer from the service since ${lastAnswer.toLocaleTimeString()}`);
    }
  }

  // The service's reason for an error: its JSON `detail`, or a validation error's `reason`;
  // "" where the answer has none (a proxy's HTML page: the status code says enough).
  async function answerDetail(response) {
    try {
      const body = await response.json();
      if (typeof body.detail === "string") return cut(body.detail);
      if (typeof body.reason === "string") return cut(body.reason);
    } catch {
      // not JSON
    }
    return "";
  }

  const cut = (text) => (text.length > ERROR_CHARS ? `${text.slice(0, ERROR_CHARS)}…` : text);

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

  // A throughput with its unit: GB/s without decimals, TFLOP/s with one, two significant
  // digits where those would show 0 (as the CLI's format_rate: 0.0052 TFLOP/s read 0.0).
  function rate(value, unit) {
    if (value == null) return "–";
    const digits = unit === "GB/s" ? 0 : 1;
    const x = Number(value);
    if (x > 0 && x < 0.5 * 10 ** -digits) return `${x.toPrecision(2)} ${unit}`;
    return `${fixed(value, digits)} ${unit}`;
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

  // The trials the task runs: its whole space where that is smaller than its budget (as the
  // CLI says it); a finished task of a 42-schedule space read 42/50.
  const wholeSpace = (task) => task.trials_target != null && task.trials_target < task.budget;
  const target = (task) => (wholeSpace(task) ? task.trials_target : task.budget);

  // An ended task none of whose trials succeeded found nothing: not to be read as a green
  // "done" (an all-failed task looked like a success with empty plots).
  const noSuccess = (task) =>
    ENDED.has(task.state) && task.trials_done > 0 && task.trials_failed >= task.trials_done;

  function stateClass(task) {
    return noSuccess(task) ? `state-${task.state} no-success` : `state-${task.state}`;
  }

  function note(parent, className, text) {
    const div = document.createElement("div");
    div.className = className;
    div.textContent = text;
    parent.appendChild(div);
  }

  // One task's row, built afresh; renderTasks keeps what of it did not change.
  function taskRow(task) {
    const tr = document.createElement("tr");
    tr.dataset.task = task.id;
    cell(tr, String(task.id));
    cell(tr, workloadLabel(task));
    cell(tr, task.gpu);
    cell(tr, strategyLabel(task));
    const stateCell = cell(tr, task.state, stateClass(task));
    if (noSuccess(task)) note(stateCell, "no-success-note", "no successful trial");
    // Why a task failed (the service's error, e.g. "cannot propose: ..."), as the CLI says it.
    if (task.error) note(stateCell, "task-error", cut(task.error));
    // A task no live worker can take says why (the service's no_worker), as text.
    if (task.no_worker) note(stateCell, "no-worker", `waiting: ${task.no_worker}`);
    const progress = cell(tr, "");
    const bar = document.createElement("span");
    bar.className = "bar";
    const fill = document.createElement("span");
    fill.style.width = `${Math.min(100, (100 * task.trials_done) / target(task))}%`;
    bar.appendChild(fill);
    progress.append(bar, `${task.trials_done}/${target(task)}`);
    // Failed trials count as done: without this, 3 failures of 10 read as a clean 10/10.
    if (task.trials_failed > 0) {
      const failed = document.createElement("span");
      failed.className = "failed-count";
      failed.textContent = `${task.trials_failed} failed`;
      progress.append(", ", failed);
    }
    if (wholeSpace(task)) note(progress, "muted", `its whole space; budget ${task.budget}`);
    const bestRunner = task.best && task.best.runner;
    const best = task.best;
    latencyCell(tr, best ? rate(best.throughput, best.throughput_unit) : "–", bestRunner);
    latencyCell(tr, fixed(best && best.latency_us, 2), bestRunner);
    cell(tr, best ? scheduleLabel(best.schedule, best.schedule_label) : "–");
    return tr;
  }

  // The row's cells are kept, and their content replaced only where it changed: rebuilt
  // every refresh, the table dropped a text selection (a schedule could not be copied) and
  // lost a click whose press and release fell on either side of a refresh.
  function patchRow(tr, fresh) {
    [...fresh.cells].forEach((td, i) => {
      const old = tr.cells[i];
      if (!old) {
        tr.appendChild(td);
      } else if (!old.isEqualNode(td)) {
        old.className = td.className;
        old.replaceChildren(...td.childNodes);
      }
    });
    return tr;
  }

  let shownTasks = null;  // what the table shows now, as JSON: unchanged, nothing is redrawn

  function renderTasks() {
    const selected = state.detail && state.detail.id;
    const shown = JSON.stringify([selected, state.tasks]);
    if (shown === shownTasks) return;
    shownTasks = shown;
    const body = document.querySelector("#tasks tbody");
    const rows = new Map([...body.rows].map((tr) => [tr.dataset.task, tr]));
    let previous = null;
    for (const task of state.tasks) {
      const kept = rows.get(String(task.id));
      rows.delete(String(task.id));
      const tr = kept ? patchRow(kept, taskRow(task)) : taskRow(task);
      tr.classList.toggle("selected", task.id === selected);
      const place = previous ? previous.nextSibling : body.firstChild;
      if (place !== tr) body.insertBefore(tr, place);  // moved only where the order changed
      previous = tr;
    }
    for (const tr of rows.values()) tr.remove();
    document.getElementById("no-tasks").hidden = state.tasks.length > 0;
  }

  // One listener for every row, present or to come. A click that ends a text selection (a
  // drag over a cell to copy it) is not a choice of task. One inside a selection made before
  // is (Chrome keeps that selection until after the click).
  const tbody = document.querySelector("#tasks tbody");
  let selectedAtPress = "";
  tbody.addEventListener("mousedown", () => {
    selectedAtPress = String(getSelection());
  });
  tbody.addEventListener("click", (event) => {
    const tr = event.target.closest("tr[data-task]");
    const selection = getSelection();
    if (!tr || (!selection.isCollapsed && String(selection) !== selectedAtPress)) return;
    select(Number(tr.dataset.task));
  });

  function newDetail(id, task) {
    return { id, task, trials: [], cursor: 0, curve: [], unit: null };
  }

  function select(taskId) {
    if (state.detail && state.detail.id === taskId) return;
    state.detail = newDetail(taskId, state.tasks.find((t) => t.id === taskId));
    renderTasks();
    refresh();
  }

  async function refreshDetail(detail) {
    // The task itself: the list's row, else read on its own (a task older than the 100
    // listed, or one that dropped out of the list): it had no state, progress or best on the
    // page, and lost its title.
    const listed = state.listed && state.tasks.find((t) => t.id === detail.id);
    detail.task = listed || await get(`/v1/tasks/${detail.id}`);
    let after = detail.cursor - 1;
    for (;;) {
      // Errors cut by the service to what the page shows: a task of failed compiles sent
      // every compiler log whole, megabytes a refresh.
      const query = `after=${after}&limit=${PAGE}&error_chars=${ERROR_CHARS}`;
      const page = (await get(`/v1/tasks/${detail.id}/trials?${query}`)).trials;
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

  // The task's state, progress, best and error above its plots, as its row says them: a
  // task not in the table had them nowhere on the page.
  function showSummary(task) {
    const summary = document.getElementById("task-summary");
    const error = document.getElementById("task-error");
    error.textContent = task && task.error ? cut(task.error) : "";
    error.hidden = !error.textContent;
    if (!task) {
      summary.replaceChildren();
      return;
    }
    const word = document.createElement("span");
    word.className = stateClass(task);
    word.textContent = task.state;
    const facts = [`${task.trials_done}/${target(task)} trials`];
    if (task.trials_failed > 0) facts.push(`${task.trials_failed} failed`);
    if (noSuccess(task)) facts.push("no successful trial");
    const best = task.best;
    if (best) {
      const label = runnerLabel(best.runner);
      const tag = label === MEASURED ? "" : ` (${label})`;
      facts.push(`best ${rate(best.throughput, best.throughput_unit)} at ` +
        `${fixed(best.latency_us, 2)} µs${tag}`);
    }
    if (task.no_worker) facts.push(`waiting: ${task.no_worker}`);
    summary.replaceChildren(word, `, ${facts.join(", ")}`);
  }

  // How many of the trials failed and how, and the latest failure's error: the plots draw
  // successful trials only, so a failed one was nowhere on the page.
  function showFailures(results) {
    const line = document.getElementById("task-failures");
    const failed = results.filter((t) => t.status !== "ok");
    line.hidden = failed.length === 0;
    if (!failed.length) {
      line.textContent = "";
      return;
    }
    const counts = new Map();
    for (const t of failed) counts.set(t.status, (counts.get(t.status) || 0) + 1);
    const how = [...counts].map(([status, n]) => `${status} ×${n}`).join(", ");
    const last = failed[failed.length - 1];
    const latest = last.error ? `; latest, trial ${last.trial}: ${cut(last.error)}` : "";
    line.textContent = `${failed.length} of ${results.length} trials failed (${how})${latest}`;
  }

  function drawDetail(detail) {
    const task = detail.task;
    document.getElementById("task-section").hidden = false;
    // The strategy as the task's row words it (an imported dataset read "grid" here).
    document.getElementById("task-title").textContent = task
      ? `Task ${task.id}: ${workloadLabel(task)} on ${task.gpu} (${strategyLabel(task)})`
      : `Task ${detail.id}`;
    showSummary(task);
    const results = detail.trials.filter((t) => t && t.status);
    // "simulated", or e.g. "measured or simulated" when the task's trials mix runners.
    showFailures(results);
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
    // (an all-failed simulated task read "Measured vs predicted"); with no result at all,
    // the runner the task asked for, else plain latency (a cancelled task that never ran
    // read "Measured vs predicted").
    const asked = task && task.runner ? runnerLabel(task.runner) : "latency";
    const latency = labelWords([...groups.keys()]) || words || asked;
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

  // The GPUs of the listed tasks (and the one chosen) as the aggregate's choices: it pooled
  // every GPU's tasks and said nothing of it.
  const gpuSelect = document.getElementById("aggregate-gpu");
  function listGpuChoices() {
    const gpus = [...new Set(state.tasks.map((t) => t.gpu))];
    if (state.aggregateGpu && !gpus.includes(state.aggregateGpu)) gpus.push(state.aggregateGpu);
    const wanted = ["", ...gpus.sort()];
    if (JSON.stringify([...gpuSelect.options].map((o) => o.value)) === JSON.stringify(wanted)) {
      return;
    }
    gpuSelect.replaceChildren(...wanted.map((gpu) => {
      const option = document.createElement("option");
      option.value = gpu;
      option.textContent = gpu || "every GPU";
      return option;
    }));
    gpuSelect.value = state.aggregateGpu;
  }
  gpuSelect.addEventListener("change", () => {
    state.aggregateGpu = gpuSelect.value;
    state.aggregateSeen = null;  // (asked again now, whatever the tasks did)
    state.aggregateDue = 0;
    refresh();
  });

  async function refreshAggregate() {
    const gpu = state.aggregateGpu;
    const doc = await get(gpu ? `/v1/curves?gpu=${encodeURIComponent(gpu)}` : "/v1/curves");
    if (gpu !== state.aggregateGpu) return false;  // another GPU chosen meanwhile: asked next
    state.curveRunners = doc.runners || [];
    const words = labelWords(state.curveRunners.map(runnerLabel));
    const suffix = words && words !== MEASURED ? ` (${words} trials)` : "";
    const pooled = new Set(state.tasks.map((t) => t.gpu)).size > 1 ? ", every GPU's tasks" : "";
    document.getElementById("aggregate-title").textContent =
      `Best-in-k${gpu ? ` on ${gpu}` : pooled}${suffix}`;
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
    return true;
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
      // No such task (404), or not a task id the service takes (422); any other failure is
      // tried again at the next refresh.
      if (error instanceof ServiceAnswered && [404, 422].includes(error.status)) return null;
      throw error;
    }
  }

  async function refreshList() {
    state.listed = false;  // (a failed list is not the tasks' current rows)
    state.tasks = (await get("/v1/tasks?limit=100")).tasks;
    state.listed = true;
    renderTasks();
    listGpuChoices();
  }

  async function refreshSelected() {
    if (!state.detail) {
      // ?task=ID: a task older than the newest listed is read by itself (before, the
      // page fell back to the newest task); one the service does not have, the newest.
      const listed = state.tasks.find((t) => t.id === state.wanted);
      const task = listed || (state.wanted ? await findTask(state.wanted) : null)
        || state.tasks[0];
      if (!task) return;
      state.detail = newDetail(task.id, task);
      renderTasks();
    }
    const detail = state.detail;
    try {
      await refreshDetail(detail);
    } finally {
      if (detail === state.detail) drawDetail(detail);  // what it has, even if a part failed
    }
  }

  // The workers, as GET /v1/workers answers: the most recently heard from first, each in
  // its state by the service's clock (the states and their order are the service's).
  const WORKER_ROWS = 100;

  function workerRow(worker) {
    const tr = document.createElement("tr");
    tr.dataset.worker = worker.id;
    cell(tr, worker.name);
    cell(tr, worker.gpu);
    cell(tr, worker.runner);
    cell(tr, worker.state || "–", worker.state ? `worker-${worker.state}` : "");
    cell(tr, String(worker.busy_jobs));
    cell(tr, new Date(worker.last_heartbeat).toLocaleString());
    return tr;
  }

  async function refreshWorkers() {
    const doc = await get(`/v1/workers?limit=${WORKER_ROWS}`);
    const counts = Object.entries(doc.counts || {});
    const total = counts.reduce((sum, [, n]) => sum + n, 0);
    let words = counts.map(([s, n]) => `${n} ${s}`).join(", ");
    if (total === 0) {
      words = "No worker has registered: run pipetune worker on each GPU node.";
    } else if (total > doc.workers.length) {
      words += ` (below, the ${doc.workers.length} most recently heard from)`;
    }
    document.getElementById("worker-counts").textContent = words;
    // Kept rows patched in place, as the tasks' (a name can be selected and copied).
    const body = document.querySelector("#workers tbody");
    const rows = new Map([...body.rows].map((tr) => [tr.dataset.worker, tr]));
    let previous = null;
    for (const worker of doc.workers) {
      const kept = rows.get(String(worker.id));
      rows.delete(String(worker.id));
      const tr = kept ? patchRow(kept, workerRow(worker)) : workerRow(worker);
      const place = previous ? previous.nextSibling : body.firstChild;
      if (place !== tr) body.insertBefore(tr, place);
      previous = tr;
    }
    for (const tr of rows.values()) tr.remove();
  }

  async function refreshWorkersWhenDue() {
    if (state.tick < state.workersDue) return;
    await refreshWorkers();
    state.workersDue = state.tick + 3;  // a failed one is tried again at the next refresh
  }

  // What the listed tasks say that the aggregate depends on: their set, states, progress and
  // bests.
  const listSignature = () => JSON.stringify(state.tasks.map(
    (t) => [t.id, t.state, t.trials_done, t.best && t.best.latency_us]));

  // The aggregate reads every task the database holds (about 80 µs each for the service:
  // half a second at 6,000 tasks, every 10 s for each open page, even when nothing ran). It
  // is asked again when a listed task has moved, else once a minute: a task older than the
  // listed ones may still be running.
  async function refreshAggregateWhenDue() {
    if (state.tick < state.aggregateDue) return;
    const signature = listSignature();
    if (signature === state.aggregateSeen && state.tick < state.aggregateStale) {
      state.aggregateDue = state.tick + 5;
      return;
    }
    // (A GPU chosen while the answer was on its way: still due, asked at the next refresh;
    // marked seen, the choice waited up to a minute.)
    if (!(await refreshAggregate())) return;
    state.aggregateSeen = signature;
    state.aggregateDue = state.tick + 5;  // a failed one is tried again at the next refresh
    state.aggregateStale = state.tick + 30;
  }

  function problemText(error) {
    if (error instanceof KeyRefused || error instanceof ServiceAnswered
        || error instanceof NoAnswer) return error.message;
    return `cannot reach the service: ${error.message}`;
  }

  // The table, the selected task and the aggregate each on its own: one that fails (a 503
  // of a task's trials during a database stall) kept the others, and the banner, from being
  // drawn at all. The status says what failed.
  async function refreshOnce() {
    const problems = [];
    for (const part of [refreshList, refreshSelected, refreshAggregateWhenDue,
      refreshWorkersWhenDue]) {
      try {
        await part();
      } catch (error) {
        problems.push(problemText(error));
        // A service that does not answer one part would keep the others waiting as long
        // (the status then said so only after three times the limit).
        if (error instanceof NoAnswer) break;
      }
    }
    showBanner();
    state.tick += 1;
    document.getElementById("status").textContent = problems.length
      ? [...new Set(problems)].join("; ") : `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.refreshes = String(state.tick);
  }

  async function loop() {
    await refresh();
    setTimeout(loop, REFRESH_MS);
  }

  loop();
})();
