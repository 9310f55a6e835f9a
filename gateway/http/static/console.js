// The Tollgate console: one page over the gateway's own JSON API (the routes automation calls), with the
// session cookie the console's sign-in set. Everything shown is put in with textContent: nothing a tenant,
// a key's name or the audit log holds is ever read as HTML.
"use strict";

const body = document.body;
const ROLE = body.dataset.role;
const TENANT = body.dataset.tenant || null;
const LANG = body.dataset.lang === "ko" ? "ko" : "en";

const WORDS = {
  en: {
    keys: "Keys", tenants: "Tenants", policy: "Policy", queues: "Queues", cache: "Cache", audit: "Audit log",
    alerts: "Alerts", usage: "Usage", costs: "Costs", create: "Create key", tenant: "Tenant", name: "Name",
    budget: "Monthly budget (USD)", rpm: "Requests per minute", models: "Models (comma-separated)",
    expires: "Expires in (days)", status: "Status", spent: "Spent this month (USD)", actions: "Actions",
    revoke: "Revoke", rotate: "Rotate", expire: "Expire now", newkey: "The new key, shown once: copy it now.",
    check: "Check", apply: "Apply", reload: "Reload the live policy", rollback: "Roll back",
    valid: "Valid. What would change:", applied: "Applied. What changed:", nochange: "Nothing would change.",
    rejected: "Rejected; the running policy stays.", history: "History", when: "When", who: "Who",
    what: "What", changes: "Changes", path: "Path", old: "Old", new: "New", tier: "Tier", limits: "Limits",
    requests: "Requests", cost: "Spend (USD)", depth: "Depth", oldest: "Oldest wait (s)", held: "In flight",
    queued: "Queued", klass: "Class", pool: "Pool", purge: "Purge this tenant's entries", audited: "Audited",
    disagreed: "Disagreed", bound: "Upper bound", state: "State", on: "on", off: "off", more: "More",
    filter: "Action", from: "From", to: "To", show: "Show", kind: "Kind", message: "Message", none: "None yet.",
    day: "Day", model: "Model", tokens_in: "Input tokens", tokens_out: "Output tokens", live: "Live: every 2 s",
    confirm_revoke: "Revoke this key? Requests with it are refused from now on.",
    confirm_rollback: "Undo this change on the live policy?", scope: "Scope", line: "line",
    signed_in_as: "Signed in as", expires_col: "Expires", models_col: "Models", budget_col: "Budget",
    status_active: "active", status_revoked: "revoked", status_expired: "expired", per_month: "month",
    per_day: "day",
  },
  ko: {
    keys: "키", tenants: "테넌트", policy: "정책", queues: "대기열", cache: "캐시", audit: "감사 로그",
    alerts: "알림", usage: "사용량", costs: "비용", create: "키 만들기", tenant: "테넌트", name: "이름",
    budget: "월 예산 (USD)", rpm: "분당 요청 수", models: "모델 (쉼표로 구분)", expires: "만료까지 (일)",
    status: "상태", spent: "이번 달 지출 (USD)", actions: "작업", revoke: "폐기", rotate: "교체",
    expire: "지금 만료", newkey: "새 키입니다. 한 번만 보여 주니 지금 복사하세요.", check: "검사",
    apply: "적용", reload: "현재 정책 다시 읽기", rollback: "되돌리기", valid: "유효합니다. 바뀔 내용:",
    applied: "적용했습니다. 바뀐 내용:", nochange: "바뀌는 것이 없습니다.",
    rejected: "거부되었습니다. 현재 정책이 그대로 유지됩니다.", history: "이력", when: "시각", who: "누가",
    what: "무엇을", changes: "변경", path: "경로", old: "이전 값", new: "새 값", tier: "등급", limits: "한도",
    requests: "요청 수", cost: "지출 (USD)", depth: "대기 수", oldest: "가장 오래 기다린 시간 (초)",
    held: "처리 중", queued: "대기", klass: "클래스", pool: "풀", purge: "이 테넌트의 항목 삭제",
    audited: "감사 수", disagreed: "불일치", bound: "상한", state: "상태", on: "켜짐", off: "꺼짐",
    more: "더 보기", filter: "작업", from: "부터", to: "까지", show: "보기", kind: "종류", message: "내용",
    none: "아직 없습니다.", day: "날짜", model: "모델", tokens_in: "입력 토큰", tokens_out: "출력 토큰",
    live: "2초마다 갱신", confirm_revoke: "이 키를 폐기할까요? 지금부터 이 키의 요청은 거부됩니다.",
    confirm_rollback: "이 변경을 현재 정책에서 되돌릴까요?", scope: "범위", line: "줄",
    signed_in_as: "로그인:", expires_col: "만료", models_col: "모델", budget_col: "예산",
    status_active: "사용 중", status_revoked: "폐기됨", status_expired: "만료됨", per_month: "월", per_day: "일",
  },
};
const T = WORDS[LANG];

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "testid") node.dataset.testid = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function table(heads, rows, testid) {
  if (!rows.length) return el("p", {class: "muted"}, T.none);
  return el("table", {testid},
    el("thead", {}, el("tr", {}, heads.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}

async function api(method, path, data, contentType) {
  const init = {method, credentials: "same-origin", headers: {"X-Tollgate-Console": "1"}};
  if (data !== undefined) {
    init.headers["Content-Type"] = contentType || "application/json";
    init.body = contentType ? data : JSON.stringify(data);
  }
  const answer = await fetch(path, init);
  const text = await answer.text();
  let parsed = text;
  try { parsed = JSON.parse(text); } catch (e) { /* YAML or text */ }
  if (!answer.ok) {
    const error = new Error((parsed && parsed.error && parsed.error.message) || answer.statusText);
    error.status = answer.status;
    error.details = (parsed && parsed.error && parsed.error.details) || [];
    throw error;
  }
  return parsed;
}

function month() {
  return new Date().toISOString().slice(0, 7);
}

function usd(value) {
  return value === null || value === undefined ? "" : Number(value).toLocaleString("en-US",
    {minimumFractionDigits: 2, maximumFractionDigits: 2});
}

function shown(value) {
  if (value === null || value === undefined) return "—";
  return typeof value === "string" ? value : JSON.stringify(value);
}

const main = document.getElementById("main");
const notice = document.getElementById("notice");
let timer = null;

function say(text, kind) {
  notice.textContent = text || "";
  notice.className = kind || "";
}

async function guarded(fn) {
  try {
    await fn();
  } catch (error) {
    say(error.message, "error");
  }
}

// ---- keys ---------------------------------------------------------------------------------------------------

async function keysView() {
  const [policy, listed, costs] = await Promise.all([
    api("GET", "/admin/policy"), api("GET", "/admin/keys?limit=1000"),
    api("GET", `/admin/reports/costs?month=${month()}&group_by=key`)]);
  const spent = Object.fromEntries(costs.data.map((r) => [r.key_id, r.cost_usd]));
  const form = el("form", {testid: "create-key", class: "card"},
    el("h2", {}, T.create),
    el("label", {}, T.tenant, el("select", {name: "tenant"},
      Object.keys(policy.tenants).map((t) => el("option", {value: t}, t)))),
    el("label", {}, T.name, el("input", {name: "name", maxlength: 128, required: true})),
    el("label", {}, T.budget, el("input", {name: "budget", type: "number", min: "0.01", step: "0.01"})),
    el("label", {}, T.rpm, el("input", {name: "rpm", type: "number", min: 1, step: 1})),
    el("label", {}, T.models, el("input", {name: "models"})),
    el("label", {}, T.expires, el("input", {name: "expires", type: "number", min: "0.01", step: "any"})),
    el("button", {type: "submit"}, T.create));
  const made = el("div", {testid: "new-key-box"});
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    guarded(async () => {
      const f = new FormData(form);
      const spec = {tenant: f.get("tenant"), name: f.get("name")};
      if (f.get("budget")) spec.budget = {period: "month", limit_usd: Number(f.get("budget"))};
      if (f.get("rpm")) spec.rate_limit = {requests_per_minute: Number(f.get("rpm"))};
      const models = String(f.get("models") || "").split(",").map((m) => m.trim()).filter(Boolean);
      if (models.length) spec.models = models;
      if (f.get("expires")) spec.expires_in_s = Number(f.get("expires")) * 86400;
      const key = await api("POST", "/admin/keys", spec);
      await show("keys");
      showKey(key);
    });
  });
  const rows = listed.data.map((k) => el("tr", {testid: "key-row", "data-key-id": k.id},
    el("td", {testid: "key-name"}, k.name), el("td", {}, el("code", {}, k.id)), el("td", {}, k.tenant),
    el("td", {testid: "key-status", "data-status": k.status, class: `status-${k.status}`},
      T[`status_${k.status}`] || k.status),
    el("td", {class: "num"}, k.budget ? `${usd(k.budget.limit_usd)} / ${T[`per_${k.budget.period}`]}` : "—"),
    el("td", {class: "num", testid: "key-spent"}, usd(spent[k.id] || 0)),
    el("td", {}, k.rate_limit ? Object.entries(k.rate_limit).map(([n, v]) =>
      `${v} ${n === "requests_per_minute" ? "rpm" : "tpm"}`).join(", ") : "—"),
    el("td", {}, k.models ? k.models.join(", ") : "*"),
    el("td", {}, k.expires_at || "—"),
    el("td", {}, k.status === "active" ? [
      el("button", {testid: "revoke", onclick: () => guarded(async () => {
        if (!confirm(T.confirm_revoke)) return;
        await api("POST", `/admin/keys/${k.id}/revoke`, {});
        await show("keys");
      })}, T.revoke),
      el("button", {testid: "rotate", onclick: () => guarded(async () => {
        const key = await api("POST", `/admin/keys/${k.id}/rotate`, {});
        await show("keys");
        showKey(key);
      })}, T.rotate),
      el("button", {onclick: () => guarded(async () => {
        await api("PATCH", `/admin/keys/${k.id}`, {expires_in_s: 0});
        await show("keys");
      })}, T.expire)] : null)));
  main.replaceChildren(form, made, el("h2", {}, T.keys),
    table([T.name, "id", T.tenant, T.status, T.budget_col, T.spent, T.limits, T.models_col, T.expires_col, T.actions], rows,
      "keys-table"));
}

function showKey(key) {
  const box = document.querySelector('[data-testid="new-key-box"]');
  box.replaceChildren(el("div", {class: "card ok"}, el("p", {}, T.newkey),
    el("code", {testid: "new-key"}, key.key), " ", el("span", {class: "muted"}, `${key.name} · ${key.id}`)));
}

// ---- tenants ------------------------------------------------------------------------------------------------

async function tenantsView() {
  const costs = await api("GET", `/admin/reports/costs?month=${month()}&group_by=tenant`);
  const policy = ROLE === "admin" ? await api("GET", "/admin/policy") : null;
  const byTenant = Object.fromEntries(costs.data.map((r) => [r.tenant, r]));
  const names = policy ? Object.keys(policy.tenants) : Object.keys(byTenant);
  const rows = names.map((name) => {
    const t = policy ? policy.tenants[name] : null;
    const use = byTenant[name] || {};
    const limits = t ? [t.budget ? `${usd(t.budget.limit_usd)} USD / ${t.budget.period}` : null,
      t.rate_limit ? Object.entries(t.rate_limit).filter(([, v]) => v).map(([n, v]) => `${v} ${n}`).join(", ")
        : null, t.max_tokens_cap ? `max_tokens ≤ ${t.max_tokens_cap}` : null].filter(Boolean).join("; ") : "";
    return el("tr", {testid: "tenant-row"}, el("td", {}, name), el("td", {}, t ? t.tier : ""),
      el("td", {}, limits || "—"), el("td", {class: "num"}, use.requests || 0),
      el("td", {class: "num"}, usd(use.cost_usd || 0)));
  });
  main.replaceChildren(el("h2", {}, `${T.tenants} · ${month()}`),
    table([T.tenant, T.tier, T.limits, T.requests, T.cost], rows, "tenants-table"),
    el("p", {}, el("a", {href: "/reports"}, `${T.costs} →`)));
}

// ---- policy -------------------------------------------------------------------------------------------------

async function policyView() {
  const text = await api("GET", "/admin/policy?format=yaml");
  const editor = el("textarea", {testid: "policy-editor", spellcheck: "false", rows: 30}, text);
  const gutter = el("pre", {class: "gutter", "aria-hidden": "true"});
  const numbered = () => {
    gutter.textContent = editor.value.split("\n").map((_, i) => i + 1).join("\n");
  };
  editor.addEventListener("input", numbered);
  editor.addEventListener("scroll", () => { gutter.scrollTop = editor.scrollTop; });
  numbered();
  const result = el("div", {testid: "policy-result"});
  const send = (dry) => guarded(async () => {
    try {
      const answer = await api("PUT", `/admin/policy${dry ? "?dry_run=true" : ""}`, editor.value,
        "application/yaml");
      result.replaceChildren(el("p", {class: "ok"}, answer.changes_total ? (dry ? T.valid : T.applied)
        : T.nochange), changesTable(answer.changes));
      say("");
      if (!dry) await history();
    } catch (error) {
      if (error.status !== 400 || !error.details.length) throw error;
      result.replaceChildren(el("p", {class: "error"}, T.rejected), el("ul", {testid: "policy-errors"},
        error.details.map((d) => {
          const line = /\(line (\d+)\)/.exec(d.message);
          return el("li", {}, el("code", {}, d.path), " ", d.message, line ? [" ", el("button", {
            class: "link", onclick: () => goToLine(editor, Number(line[1]))}, `${T.line} ${line[1]}`)] : null);
        })));
      const first = error.details.map((d) => /\(line (\d+)\)/.exec(d.message)).find(Boolean);
      if (first) goToLine(editor, Number(first[1]));
    }
  });
  const log = el("div", {testid: "policy-history"});
  const history = async () => {
    const entries = (await api("GET", "/admin/audit?action=policy&limit=20")).data;
    const undoable = entries.find((e) => e.action !== "policy.reject");
    log.replaceChildren(el("h2", {}, T.history), table([T.when, T.who, T.what, T.changes, ""],
      entries.map((e) => el("tr", {testid: "history-row", "data-action": e.action},
        el("td", {}, e.time), el("td", {}, e.actor), el("td", {}, e.action),
        el("td", {}, e.action === "policy.reject" ? (e.details.errors || []).join(", ")
          : changesTable(e.details.changes || [])),
        el("td", {}, e === undoable ? el("button", {testid: "rollback", onclick: () => guarded(async () => {
          if (!confirm(T.confirm_rollback)) return;
          const answer = await api("POST", "/admin/policy/rollback", {entry: e.id});
          editor.value = await api("GET", "/admin/policy?format=yaml");
          numbered();
          result.replaceChildren(el("p", {class: "ok"}, T.applied), changesTable(answer.changes));
          await history();
        })}, T.rollback) : null))), "history-table"));
  };
  main.replaceChildren(el("div", {class: "editor"}, gutter, editor),
    el("p", {}, el("button", {testid: "policy-check", onclick: () => send(true)}, T.check), " ",
      el("button", {testid: "policy-apply", onclick: () => send(false)}, T.apply), " ",
      el("button", {onclick: () => guarded(async () => {
        editor.value = await api("GET", "/admin/policy?format=yaml");
        numbered();
        result.replaceChildren();
      })}, T.reload)),
    result, log);
  await history();
}

function changesTable(changes) {
  if (!changes || !changes.length) return el("span", {class: "muted"}, "—");
  return el("table", {class: "changes", testid: "changes"},
    el("thead", {}, el("tr", {}, [T.path, T.old, T.new].map((h) => el("th", {}, h)))),
    el("tbody", {}, changes.map((c) => el("tr", {testid: "change"},
      el("td", {}, el("code", {}, c.path)), el("td", {class: "old"}, shown(c.old)),
      el("td", {class: "new"}, shown(c.new))))));
}

function goToLine(editor, line) {
  const lines = editor.value.split("\n");
  const start = lines.slice(0, line - 1).reduce((n, l) => n + l.length + 1, 0);
  editor.focus();
  editor.setSelectionRange(start, start + (lines[line - 1] || "").length);
  const height = editor.scrollHeight / Math.max(lines.length, 1);
  editor.scrollTop = Math.max(0, (line - 5) * height);
}

// ---- queues, cache, audit, alerts ---------------------------------------------------------------------------

async function queuesView() {
  const draw = async () => {
    const data = await api("GET", "/admin/queues");
    const rows = [];
    for (const [pool, view] of Object.entries(data.pools)) {
      for (const [klass, q] of Object.entries(view.classes)) {
        const flows = Object.entries(q.flows);
        rows.push(el("tr", {testid: "queue-row"}, el("td", {}, pool), el("td", {}, klass),
          el("td", {class: "num"}, q.depth), el("td", {class: "num"}, q.oldest_wait_s),
          el("td", {}, flows.length ? flows.map(([t, f]) => `${t}: ${f.held} / ${f.queued}`).join("; ") : "—")));
      }
    }
    main.replaceChildren(el("h2", {}, T.queues), el("p", {class: "muted"}, T.live),
      table([T.pool, T.klass, T.depth, T.oldest, `${T.tenant}: ${T.held} / ${T.queued}`], rows, "queues-table"));
  };
  await draw();
  timer = setInterval(() => guarded(draw), 2000);
}

async function cacheView() {
  const data = await api("GET", "/admin/cache");
  const rows = data.scopes.map((s) => el("tr", {testid: "scope-row"},
    el("td", {}, s.tenant), el("td", {}, s.model || ""),
    el("td", {class: "num"}, s.audited), el("td", {class: "num"}, s.disagreed),
    el("td", {class: "num"}, `${shown(s.upper_bound)} ≤ ${s.max_false_hit_rate}?`),
    el("td", {}, s.semantic ? T.on : `${T.off} (${s.off_reason})`)));
  const tenants = Object.keys(data.tenants).map((t) => el("li", {}, `${t}: ${data.tenants[t].answers} `,
    el("button", {onclick: () => guarded(async () => {
      const answer = await api("DELETE", `/admin/cache?tenant=${encodeURIComponent(t)}`);
      say(`${t}: ${answer.purged}`, "ok");
    })}, T.purge)));
  main.replaceChildren(el("h2", {}, T.cache),
    el("p", {}, `${data.embedder || "—"} · ${data.entries} · threshold ${data.threshold}`),
    el("ul", {}, tenants),
    table([T.tenant, T.scope, T.audited, T.disagreed, T.bound, T.state], rows, "cache-table"));
}

async function auditView() {
  const form = el("form", {class: "card"},
    el("label", {}, T.filter, el("input", {name: "action", placeholder: "policy, key, cache ..."})),
    el("label", {}, T.from, el("input", {name: "from", type: "date"})),
    el("label", {}, T.to, el("input", {name: "to", type: "date"})),
    el("button", {type: "submit"}, T.show));
  const list = el("div");
  let cursor = null;
  const load = async (more) => {
    const f = new FormData(form);
    const q = new URLSearchParams({limit: "50"});
    for (const name of ["action", "from", "to"]) if (f.get(name)) q.set(name, f.get(name));
    if (more && cursor) q.set("cursor", cursor);
    const page = await api("GET", `/admin/audit?${q}`);
    cursor = page.next_cursor;
    const rows = page.data.map((e) => el("tr", {testid: "audit-row"}, el("td", {}, e.time), el("td", {}, e.actor),
      el("td", {}, e.client || ""), el("td", {}, e.action), el("td", {}, e.target || ""),
      el("td", {}, e.details.changes ? changesTable(e.details.changes) : el("code", {}, JSON.stringify(e.details)))));
    if (!more) list.replaceChildren(table([T.when, T.who, "client", T.what, "target", T.changes], rows, "audit-table"));
    else list.querySelector("tbody").append(...rows);
    const button = el("button", {onclick: () => guarded(() => load(true))}, T.more);
    list.querySelector("button.more")?.remove();
    if (page.has_more) { button.className = "more"; list.append(button); }
  };
  form.addEventListener("submit", (event) => { event.preventDefault(); guarded(() => load(false)); });
  main.replaceChildren(el("h2", {}, T.audit), form, list);
  await load(false);
}

async function alertsView() {
  const data = await api("GET", "/admin/anomalies");
  main.replaceChildren(el("h2", {}, T.alerts), table([T.when, T.kind, T.tenant, T.message],
    data.data.map((a) => el("tr", {testid: "alert-row"}, el("td", {}, a.time || a.at || ""), el("td", {}, a.kind),
      el("td", {}, a.tenant || ""), el("td", {}, a.message || JSON.stringify(a)))), "alerts-table"));
}

// ---- a tenant's own usage -----------------------------------------------------------------------------------

async function usageView() {
  const data = await api("GET", `/v1/usage?month=${month()}`);
  main.replaceChildren(el("h2", {}, `${T.usage} · ${data.tenant} · ${month()}`),
    el("p", {testid: "usage-total"}, `${T.requests}: ${data.total.requests || 0} · ${T.cost}: ${usd(data.total.cost_usd || 0)}`),
    table([T.day, T.model, T.requests, T.tokens_in, T.tokens_out, T.cost], data.data.map((r) =>
      el("tr", {testid: "usage-row"}, el("td", {}, r.day), el("td", {}, r.model), el("td", {class: "num"}, r.requests),
        el("td", {class: "num"}, r.prompt_tokens), el("td", {class: "num"}, r.completion_tokens),
        el("td", {class: "num"}, usd(r.cost_usd)))), "usage-table"));
}

// ---- the frame ----------------------------------------------------------------------------------------------

const VIEWS = {
  admin: {keys: keysView, tenants: tenantsView, policy: policyView, queues: queuesView, cache: cacheView,
    audit: auditView, alerts: alertsView},
  finance: {tenants: tenantsView},
  tenant: {usage: usageView},
}[ROLE] || {};

async function show(name) {
  if (timer) { clearInterval(timer); timer = null; }
  for (const tab of document.querySelectorAll("#tabs button")) tab.classList.toggle("active", tab.dataset.view === name);
  history.replaceState(null, "", `#${name}`);
  say("");
  await guarded(() => VIEWS[name]());
}

const tabs = document.getElementById("tabs");
for (const name of Object.keys(VIEWS)) {
  tabs.append(el("button", {"data-view": name, testid: `tab-${name}`, onclick: () => show(name)}, T[name]));
}
if (ROLE !== "tenant") tabs.append(el("a", {href: "/reports"}, T.costs));
const first = location.hash.slice(1);
show(VIEWS[first] ? first : Object.keys(VIEWS)[0]);
