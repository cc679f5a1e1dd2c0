// MultiPilot console page: plain JS over /api/v1, no build step, nothing from outside this server.
'use strict';

const TOKEN_KEY = 'multipilot.token';
const $ = (sel, root = document) => root.querySelector(sel);
const state = { clusters: [], incidents: new Map(), fleet: [], whoami: null, source: null, fresh: new Set() };

function token() { return localStorage.getItem(TOKEN_KEY) || ''; }

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k.startsWith('data')) e.setAttribute(k.replace(/[A-Z]/g, (m) => '-' + m.toLowerCase()), v);
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

const SVG_NS = 'http://www.w3.org/2000/svg';
// an SVG element: attributes as given, children appended (text for strings)
function svg(tag, attrs = {}, ...children) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) e.setAttribute(k, v);
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function banner(msg) {
  const b = $('#banner');
  b.textContent = msg || '';
  b.hidden = !msg;
}

async function api(path, opts = {}) {
  const headers = Object.assign({ Accept: 'application/json' }, opts.headers || {});
  if (token()) headers.Authorization = 'Bearer ' + token();
  const resp = await fetch(path, Object.assign({}, opts, { headers }));
  let body = null;
  try { body = await resp.json(); } catch (_) { body = null; }
  if (resp.status === 401) {
    $('#token-form').hidden = false;
    banner('This console needs a token: paste one above (it is kept in this browser only).');
    throw new Error('unauthorized');
  }
  if (!resp.ok) throw new Error((body && body.error) || resp.statusText);
  return body;
}

function ago(iso) {
  if (!iso) return '';
  const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (s < 120) return s + 's';
  if (s < 7200) return Math.round(s / 60) + 'm';
  if (s < 172800) return Math.round(s / 3600) + 'h';
  return Math.round(s / 86400) + 'd';
}

// how long until a time to come: 'in 3h'
function fromNow(iso) {
  if (!iso) return '';
  const s = Math.max(0, Math.round((Date.parse(iso) - Date.now()) / 1000));
  if (s < 120) return 'in ' + s + 's';
  if (s < 7200) return 'in ' + Math.round(s / 60) + 'm';
  if (s < 172800) return 'in ' + Math.round(s / 3600) + 'h';
  return 'in ' + Math.round(s / 86400) + 'd';
}

// a moment in this browser's time zone, short: 'Fri 4 Dec, 22:00'
function fmtWhen(iso) {
  return new Date(iso).toLocaleString([], { weekday: 'short', day: 'numeric', month: 'short', hour: '2-digit', minute: '2-digit' });
}

function fmtLag(ms) {
  if (ms === null || ms === undefined) return 'lag n/a';
  if (Math.abs(ms) < 1000) return 'lag ' + ms + 'ms';
  return 'lag ' + (ms / 1000).toFixed(1) + 's';
}

// ------------------------------------------------------------------------------------------------ tabs
function showTab(name) {
  for (const b of document.querySelectorAll('#tabs button')) b.classList.toggle('active', b.dataset.tab === name);
  for (const s of document.querySelectorAll('section.tab')) s.hidden = s.id !== 'tab-' + name;
  if (name === 'fleet') loadVitals();
  if (name === 'gpu') loadGpu();
  if (name === 'compliance') loadCompliance();
  if (name === 'releases') loadReleases();
  if (name === 'gitops') loadGitops();
  if (name === 'capacity') loadCapacity();
  if (name === 'compare') fillClusterSelects();
}

// ------------------------------------------------------------------------------------------------ fleet
async function loadClusters() {
  const q = $('#cluster-filter').value.trim();
  const sort = $('#cluster-sort').value;
  const params = new URLSearchParams({ sort });
  if (q) params.set('q', q);
  try {
    state.clusters = await api('/api/v1/clusters?' + params);
  } catch (e) { if (e.message !== 'unauthorized') banner('clusters: ' + e.message); return; }
  const tbody = $('#clusters-table tbody');
  tbody.replaceChildren(...state.clusters.map((c) => {
    const n = c.nodes || {};
    const cert = c.apiserver_cert_expiry
      ? el('span', { title: c.apiserver_cert_expiry, class: c.cert_days_left < 14 ? 'health-unhealthy' : '' }, c.cert_days_left + 'd')
      : '';
    const baseline = c.compliant === null || c.compliant === undefined ? el('span', { class: 'muted' }, 'n/a')
      : c.compliant ? el('span', { class: 'health-healthy' }, 'compliant')
      : el('span', { class: 'health-degraded', title: c.failing_rules.join(', ') }, 'drift (' + c.failing_rules.length + ')');
    return el('tr', { dataCluster: c.name, dataHealth: c.health },
      el('td', {}, el('a', { onclick: () => filterIncidents(c.name) }, c.name)),
      el('td', { class: 'health-' + c.health, title: c.failing_probes.join(', ') }, c.health,
        c.failing_probes.length ? el('span', { class: 'muted' }, ' (' + c.failing_probes.join(', ') + ')') : null),
      el('td', {}, c.version || ''),
      el('td', {}, c.labels.env || ''), el('td', {}, c.labels.region || ''), el('td', {}, c.labels.owner || ''),
      el('td', {}, n.total !== undefined ? n.ready + '/' + n.total : ''),
      el('td', {}, c.cni || ''), el('td', {}, c.ingress || ''),
      el('td', {}, cert), el('td', {}, baseline),
      el('td', { class: 'incident-count' }, c.open_incidents ? el('span', { class: 'pill sev-' + (c.worst_severity || 'info') }, c.open_incidents) : '0'));
  }));
  $('#cluster-count').textContent = state.clusters.length + ' clusters';
  fillClusterSelects();
}

function filterIncidents(cluster) {
  $('#incident-filter').value = cluster;
  renderIncidents();
  $('#incident-list').scrollIntoView({ behavior: 'smooth' });
}

// ------------------------------------------------------------------------------------------------ incidents
function upsertIncident(inc, fresh) {
  const old = state.incidents.get(inc.id);
  if (old && old.revision >= inc.revision) return false;
  state.incidents.set(inc.id, inc);
  if (fresh) state.fresh.add(inc.id);
  return true;
}

async function loadIncidents() {
  try {
    const list = await api('/api/v1/incidents?status=all&limit=2000');
    for (const inc of list) upsertIncident(inc, false);
    renderIncidents();
  } catch (e) { if (e.message !== 'unauthorized') banner('incidents: ' + e.message); }
  loadFleetIncidents();
}

// fleet incidents change with their members: read again (at most every 2 s) when an incident changes
let fleetTimer = null;
function fleetSoon() {
  if (fleetTimer) return;
  fleetTimer = setTimeout(() => { fleetTimer = null; loadFleetIncidents(); }, 2000);
}

async function loadFleetIncidents() {
  let list;
  try { list = await api('/api/v1/fleet-incidents?status=all'); } catch (e) { return; }
  state.fleet = list;
  renderTimeline();
  const want = $('#incident-status').value;
  list = list.filter((f) => want === 'all' || (want === 'resolved' ? f.status === 'resolved' : f.status !== 'resolved'));
  $('#fleet-count').textContent = list.length ? list.length + ' shown' : 'none';
  // an event problem that is part of cluster incidents (the coredns pods where DNS fails) comes after the
  // failures themselves, greyed: it pages nobody
  const part = new Map(list.map((f) => [f.id, partOf(f)]));
  list = list.filter((f) => !part.get(f.id)).concat(list.filter((f) => part.get(f.id)));
  $('#fleet-list').replaceChildren(...list.slice(0, 100).map((f) => {
    const open = f.members.filter((m) => !m.left_at && m.status !== 'resolved').length;
    // an event problem's cluster may be several members (one per message of one failure)
    const clusters = new Set(f.members.map((m) => m.cluster)).size;
    return el('li', { class: 'incident fleet-incident severity-' + f.severity + (part.get(f.id) ? ' part' : ''), dataFleetId: f.id, dataKind: f.kind, dataStatus: f.status },
      el('div', { class: 'head' },
        el('span', { class: 'pill sev-' + f.severity }, f.severity),
        el('b', { class: 'st-' + f.status + ' status' }, f.status),
        el('code', {}, f.kind),
        el('span', {}, 'on ' + clusters + ' of ' + f.fleet_size + ' clusters: ' + f.members.length + ' member' + (f.members.length === 1 ? '' : 's') + ' (' + open + ' open)'),
        el('span', { class: 'muted', title: 'opened ' + f.opened_at + ' (hub clock)' }, 'opened ' + ago(f.opened_at) + ' ago'),
        el('span', { class: 'muted' }, 'rev ' + f.revision)),
      el('div', { class: 'summary' }, f.summary),
      f.blast_radius ? el('div', { class: 'blast' }, el('b', {}, 'blast radius: '), f.blast_radius.summary) : null,
      part.get(f.id),
      el('ul', { class: 'members' }, f.members.map((m) => el('li', { dataCluster: m.cluster, dataStatus: m.status },
        el('b', {}, m.cluster), ' ', el('span', { class: 'st-' + m.status }, m.status),
        m.left_at ? el('span', { class: 'muted' }, ' left: ' + (m.left_because || 'resolved')) : null,
        el('span', { class: 'muted' }, ' — ' + m.summary)))),
      f.shared && f.shared.length ? el('div', { class: 'shared' }, el('b', {}, 'shared: '),
        f.shared.slice(0, 3).map((a, i) => el('span', { dataAttribute: a.attribute }, (i ? '; ' : '') + a.support))) : null,
      f.suspects && f.suspects.length ? el('ol', { class: 'suspects' }, f.suspects.map((x) =>
        el('li', { class: 'verdict-' + x.verdict }, '[' + x.verdict + '] ', x.summary, ' — ', objLink(x.object)))) : null);
  }));
}

// an event problem whose open members (digests) are each what an open cluster incident found
// (`explains`: the coredns pods failing readiness where DNS fails) is part of those: its alerts are muted
function partOf(f) {
  if (f.kind !== 'event') return null;
  const by = [];
  for (const m of f.members.filter((m) => !m.left_at && m.status !== 'resolved')) {
    const i = [...state.incidents.values()].find((i) => i.status !== 'resolved' && i.cluster === m.cluster
      && (i.explains || []).includes(m.incident_id));
    if (!i) return null;
    if (!by.includes(i)) by.push(i);
  }
  if (!by.length) return null;
  return el('div', { class: 'part-of' }, el('b', {}, 'part of: '),
    by.map((i) => i.kind + ' on ' + i.cluster).join(', '), el('span', { class: 'muted' }, ' (what each found)'));
}

function canOperate() { return state.whoami && (state.whoami.role === 'operator' || state.whoami.role === 'releaser'); }

async function incidentAction(id, action, button) {
  button.disabled = true;
  try {
    const r = await api('/api/v1/incidents/' + encodeURIComponent(id) + '/' + action, { method: 'POST' });
    if (r && r.incident) { upsertIncident(r.incident, true); renderIncidents(); }
    banner('');
  } catch (e) {
    banner(action + ' failed: ' + e.message);
  } finally { button.disabled = false; }
}

function objLink(o) {
  const label = o.kind + ' ' + (o.namespace ? o.namespace + '/' : '') + o.name;
  return el('a', { class: 'object-link', onclick: () => searchResource(o) }, label);
}

function renderIncidents() {
  const want = $('#incident-status').value;
  const text = $('#incident-filter').value.trim().toLowerCase();
  const list = [...state.incidents.values()].filter((i) => {
    if (want === 'active' && i.status === 'resolved') return false;
    if (want !== 'active' && want !== 'all' && i.status !== want) return false;
    if (text && !(i.cluster + ' ' + i.kind + ' ' + i.summary).toLowerCase().includes(text)) return false;
    return true;
  });
  // the timeline: newest change first, in the clusters' clocks
  list.sort((a, b) => Date.parse(b.updated_at) - Date.parse(a.updated_at) || a.id.localeCompare(b.id));
  const ol = $('#incident-list');
  ol.replaceChildren(...list.slice(0, 500).map((i) => {
    const actions = el('span', { class: 'actions' });
    if (canOperate() && i.status === 'open') {
      actions.append(el('button', { dataAction: 'ack', onclick: (ev) => incidentAction(i.id, 'ack', ev.target) }, 'acknowledge'));
    }
    if (canOperate() && i.status !== 'resolved') {
      actions.append(el('button', { dataAction: 'resolve', onclick: (ev) => incidentAction(i.id, 'resolve', ev.target) }, 'resolve'));
    }
    const li = el('li', {
      class: 'incident severity-' + i.severity + (state.fresh.has(i.id) ? ' fresh' : ''),
      dataIncidentId: i.id, dataKind: i.kind, dataCluster: i.cluster, dataStatus: i.status,
    },
      el('div', { class: 'head' },
        el('span', { class: 'pill sev-' + i.severity }, i.severity),
        el('b', { class: 'st-' + i.status + ' status' }, i.status),
        el('span', {}, i.cluster), el('code', {}, i.kind),
        el('span', { class: 'muted', title: 'opened ' + i.opened_at + ' (cluster clock)' }, 'opened ' + ago(i.opened_at) + ' ago'),
        el('span', { class: 'muted lag', title: 'JetStream stored the triggering observation this long after it happened in the cluster' }, fmtLag(i.delivery_lag_ms)),
        i.acknowledged_by ? el('span', { class: 'muted' }, 'ack by ' + i.acknowledged_by) : null,
        el('span', { class: 'muted' }, 'rev ' + i.revision),
        actions),
      el('div', { class: 'summary' }, i.summary),
      i.evidence && i.evidence.length ? el('ol', { class: 'evidence' }, i.evidence.map((e) =>
        el('li', { title: e.why || '' }, '[' + e.kind + '] ', e.summary, e.object ? el('span', {}, ' — ', objLink(e.object)) : null,
          e.why ? el('span', { class: 'why' }, ' (' + e.why + ')') : null))) : null);
    return li;
  }));
  state.fresh.clear();
  $('#incident-count').textContent = list.length + ' shown';
  renderTimeline();
}

function connectStream() {
  if (state.source) state.source.close();
  const url = '/api/v1/incidents/stream' + (token() ? '?access_token=' + encodeURIComponent(token()) : '');
  const src = new EventSource(url);
  state.source = src;
  const live = $('#live-status');
  src.addEventListener('hello', () => { live.textContent = 'live'; live.dataset.state = 'live'; loadIncidents(); });
  src.addEventListener('incident', (ev) => {
    const inc = JSON.parse(ev.data);
    if (upsertIncident(inc, true)) { renderIncidents(); loadClusters(); }
  });
  src.addEventListener('resync', () => loadIncidents());
  src.addEventListener('incident', () => fleetSoon());
  src.onerror = () => { live.textContent = 'reconnecting'; live.dataset.state = 'down'; };
}

// ------------------------------------------------------------------------------------------------ resources
function searchResource(o) {
  $('#res-kind').value = o.kind || '';
  $('#res-namespace').value = o.namespace || '';
  $('#res-name').value = (o.name || '').replace(/-?\*$/, '');
  $('#res-selector').value = '';
  $('#res-cluster').value = o.cluster || '';
  showTab('resources');
  loadResources();
}

async function loadResources(ev) {
  if (ev) ev.preventDefault();
  const p = new URLSearchParams();
  for (const [id, key] of [['#res-kind', 'kind'], ['#res-namespace', 'namespace'], ['#res-name', 'name'], ['#res-selector', 'selector'], ['#res-cluster', 'cluster']]) {
    const v = $(id).value.trim();
    if (v) p.set(key, v);
  }
  p.set('limit', '500');
  let r;
  try { r = await api('/api/v1/resources?' + p); } catch (e) { banner('resources: ' + e.message); return; }
  banner('');
  $('#res-count').textContent = r.total + ' found' + (r.total > r.items.length ? ', first ' + r.items.length + ' shown' : '');
  $('#resources-table tbody').replaceChildren(...r.items.map((o) => el('tr', { dataCluster: o.cluster, dataKind: o.kind, dataName: o.name },
    el('td', {}, o.cluster), el('td', {}, o.kind), el('td', {}, o.namespace || ''), el('td', {}, o.name),
    el('td', {}, o.replicas || (o.ready === null || o.ready === undefined ? (o.phase || '') : (o.ready ? 'ready' : 'not ready'))),
    el('td', {}, el('code', {}, o.spec_hash.slice(0, 12))),
    el('td', { class: 'mono' }, Object.entries(o.labels).map(([k, v]) => k + '=' + v).join(', ')),
    el('td', {}, el('a', { class: 'diff-link', onclick: () => openDiff(o.namespace, o.kind, o.name, '') }, 'diff across clusters')))));
}

// ------------------------------------------------------------------------------------------------ diff
function openDiff(ns, kind, name, clusters) {
  $('#diff-object').value = (ns || '_') + '/' + kind + '/' + name;
  $('#diff-clusters').value = clusters || '';
  showTab('diff');
  runDiff();
}

function show(v) {
  if (v === null || v === undefined) return el('span', {}, '(absent)');
  return el('code', {}, typeof v === 'string' ? v : JSON.stringify(v));
}

function diffTable(id, title, rows, clusters) {
  if (!rows.length) return el('p', { class: 'muted', id }, title + ': the same everywhere');
  return el('div', {},
    el('h3', {}, title),
    el('table', { id },
      el('thead', {}, el('tr', {}, el('th', {}, 'path'), clusters.map((c) => el('th', {}, c)))),
      el('tbody', {}, rows.map((f) => el('tr', { class: 'diff-field', dataPath: f.path },
        el('td', {}, el('code', {}, f.path)),
        f.values.map((v) => el('td', { class: 'differs' + (v === null ? ' absent' : '') }, show(v))))))));
}

async function runDiff(ev) {
  if (ev) ev.preventDefault();
  const parts = $('#diff-object').value.trim().split('/');
  if (parts.length !== 3) { banner('diff: give the object as namespace/Kind/name (_ for cluster-scoped)'); return; }
  const [ns, kind, name] = parts;
  const p = new URLSearchParams({ kind, name });
  if (ns && ns !== '_') p.set('namespace', ns);
  const cl = $('#diff-clusters').value.trim();
  if (cl) p.set('clusters', cl);
  let d;
  try { d = await api('/api/v1/diff?' + p); } catch (e) { banner('diff: ' + e.message); return; }
  banner('');
  const names = d.clusters.map((c) => c.cluster);
  const out = $('#diff-result');
  out.dataset.identical = d.identical;
  out.replaceChildren(
    el('p', {}, el('b', {}, d.kind + ' ' + (d.namespace ? d.namespace + '/' : '') + d.name), ' — ',
      d.identical ? el('span', { class: 'health-healthy', id: 'diff-verdict' }, 'same spec in every cluster')
        : el('span', { class: 'health-degraded', id: 'diff-verdict' }, 'spec differs')),
    el('table', { id: 'diff-hashes' },
      el('thead', {}, el('tr', {}, el('th', {}, 'cluster'), el('th', {}, 'spec hash'), el('th', {}, 'metadata hash'), el('th', {}, 'version'))),
      el('tbody', {}, d.clusters.map((c) => el('tr', { dataCluster: c.cluster },
        el('td', {}, c.cluster),
        el('td', {}, c.present ? el('code', {}, c.spec_hash) : el('span', { class: 'muted' }, 'absent')),
        el('td', {}, c.present ? el('code', {}, c.metadata_hash) : ''),
        el('td', {}, c.api_version || ''))))),
    diffTable('diff-fields', 'Spec fields that differ', d.fields, names),
    diffTable('diff-labels', 'Labels that differ', d.labels, names),
    diffTable('diff-annotations', 'Annotations that differ', d.annotations, names));
}

// ------------------------------------------------------------------------------------------------ compare
function fillClusterSelects() {
  const names = state.clusters.map((c) => c.name);
  for (const [id, idx, keepEmpty] of [['#cmp-a', 0, false], ['#cmp-b', 1, false], ['#cap-cluster', -1, true]]) {
    const s = $(id);
    const cur = s.value;
    const opts = keepEmpty ? [el('option', { value: '' }, 'whole fleet')] : [];
    for (const n of names) opts.push(el('option', { value: n }, n));
    s.replaceChildren(...opts);
    if (cur && (names.includes(cur) || (keepEmpty && cur === ''))) s.value = cur;
    else if (idx >= 0 && names[idx]) s.value = names[idx];
  }
}

async function runCompare(ev) {
  if (ev) ev.preventDefault();
  const a = $('#cmp-a').value, b = $('#cmp-b').value;
  const p = new URLSearchParams({ a, b });
  if ($('#cmp-kind').value.trim()) p.set('kind', $('#cmp-kind').value.trim());
  if ($('#cmp-namespace').value.trim()) p.set('namespace', $('#cmp-namespace').value.trim());
  let r;
  try { r = await api('/api/v1/compare?' + p); } catch (e) { banner('compare: ' + e.message); return; }
  banner('');
  const label = (o) => o.kind + ' ' + (o.namespace ? o.namespace + '/' : '') + o.name;
  const list = (items, diffable) => el('ul', {}, items.map((o) => el('li', { dataKind: o.kind, dataName: o.name },
    diffable ? el('a', { onclick: () => openDiff(o.namespace, o.kind, o.name, a + ',' + b) }, label(o)) : label(o),
    o.metadata_differs ? el('span', { class: 'muted' }, ' (labels/annotations differ too)') : null)));
  const c = r.counts;
  $('#compare-result').replaceChildren(
    el('p', {}, c.same + ' objects identical; ', c.differ + ' differ, ', c.only_in_a + ' only in ' + a + ', ', c.only_in_b + ' only in ' + b + '.',
      r.skipped_kinds.length ? el('span', { class: 'muted' }, ' (not compared unless asked by kind: ' + r.skipped_kinds.join(', ') + ')') : null),
    el('div', { class: 'cols' },
      el('div', { class: 'box', id: 'cmp-differ' }, el('h3', {}, 'spec differs (click for the fields)'), list(r.differ, true)),
      el('div', { class: 'box', id: 'cmp-only-a' }, el('h3', {}, 'only in ' + a), list(r.only_in_a, false)),
      el('div', { class: 'box', id: 'cmp-only-b' }, el('h3', {}, 'only in ' + b), list(r.only_in_b, false))));
}

// ------------------------------------------------------------------------------------------------ compliance
async function loadCompliance() {
  let rules;
  try { rules = await api('/api/v1/compliance'); } catch (e) { banner('compliance: ' + e.message); return; }
  $('#compliance-table tbody').replaceChildren(...rules.map((r) => el('tr', { dataRule: r.rule },
    el('td', {}, el('code', {}, r.rule)),
    el('td', { class: r.failing.length ? 'health-degraded' : 'health-healthy' }, String(r.failing.length)),
    el('td', {}, String(r.passing) + (r.unknown ? ' (' + r.unknown + ' not judged)' : '')),
    el('td', {}, el('ul', { class: 'plain' }, ...r.failing.map((f) => el('li', {}, el('b', {}, f.cluster), ': ' + f.message)))))));
}

// ------------------------------------------------------------------------------------------------ gpu
async function loadGpu() {
  let pools;
  try { pools = await api('/api/v1/gpu'); } catch (e) { banner('gpu: ' + e.message); return; }
  $('#gpu-bars').replaceChildren(gpuBars(pools));
  $('#gpu-table tbody').replaceChildren(...pools.map((g) => el('tr', { dataCluster: g.cluster },
    el('td', {}, g.cluster), el('td', {}, el('b', {}, g.free)), el('td', {}, g.allocated), el('td', {}, g.allocatable),
    el('td', {}, g.models.map((m) => m.model + ' ×' + m.allocatable).join(', ')),
    el('td', {}, [...new Set(g.models.flatMap((m) => m.driver_versions))].join(', ')),
    el('td', {}, g.device_plugin ? g.device_plugin.name + ' ' + g.device_plugin.version + (g.device_plugin.ready ? ' (' + g.device_plugin.ready + ')' : '') : ''),
    el('td', { class: 'health-' + ({ healthy: 'healthy', degraded: 'degraded', unhealthy: 'unhealthy' }[g.plugin_health] || 'unknown'), title: g.plugin_detail || '' }, g.plugin_health || 'n/a'))));
}

// ------------------------------------------------------------------------------------------------ releases
async function loadReleases() {
  let r;
  try { r = await api('/api/v1/releases'); } catch (e) { banner('releases: ' + e.message); return; }
  const box = $('#releases-list');
  if (!r.releases.length) {
    box.replaceChildren(el('p', { class: 'muted', id: 'releases-empty' }, 'No releases recorded on FLEET_RELEASE yet.'));
    return;
  }
  box.replaceChildren(...r.releases.map((rel) => {
    const ro = rel.rollout;
    return el('div', { class: 'box', dataRelease: rel.release, dataState: ro ? ro.state : null },
      el('h3', {}, rel.release, ' ',
        ro && ro.state ? el('span', { class: 'pill release-state state-' + ro.state }, ro.state) : null, ' ',
        el('span', { class: 'muted' }, 'last change ' + ago(rel.last_change) + ' ago; clusters: ' + rel.clusters.join(', '))),
      ro && ro.reason ? el('p', { class: 'release-reason state-' + ro.state }, ro.reason) : null,
      ro && (ro.batches.length || ro.moments.length) ? rolloutPicture(rel.release, ro) : null,
      el('table', { class: 'release-history' }, el('tbody', {}, rel.records.map((x) => el('tr', { dataWhat: x.what, class: x.payload && x.payload.ok === false ? 'not-ok' : null },
        el('td', { title: x.ingest_time }, ago(x.ingest_time)), el('td', { class: 'what' }, x.what), el('td', {}, x.cluster), el('td', {}, x.schema),
        recordCell(x))))));
  }));
}

// a history entry for a person: an analysis round as its measurements, a waiting entry with what it
// waits for, anything else its summary (the whole entry as the cell's title)
function recordCell(x) {
  const p = x.payload || {};
  const full = JSON.stringify(p, null, 1).slice(0, 4000);
  const d = p.detail || {};
  if (x.what === 'analysis' && Array.isArray(d.measurements)) {
    return el('td', { class: 'analysis-record', title: full },
      el('div', {}, 'batch ' + p.batch + ' analysis, round ' + d.round + ' of ' + d.count + ': ',
        el('b', { class: 'conclusion conclusion-' + d.conclusion }, d.conclusion)),
      el('table', { class: 'measurements' },
        el('thead', {}, el('tr', {}, ['metric', 'cluster', 'value', 'baseline', 'verdict', 'why'].map((h) => el('th', {}, h)))),
        el('tbody', {}, d.measurements.map((m) => el('tr', { dataVerdict: m.verdict, dataCluster: m.cluster, dataMetric: m.metric },
          el('td', {}, m.metric), el('td', {}, m.cluster),
          el('td', { class: 'num' }, fmtNum(m.value)), el('td', { class: 'num' }, fmtNum(m.baseline)),
          el('td', { class: 'verdict-' + m.verdict }, m.verdict), el('td', { class: 'muted' }, m.reason || ''))))));
  }
  if (typeof p.summary === 'string') {
    const why = d.held ? 'held: ' + d.held : d.approval ? 'waits for approval ' + d.approval : null;
    return el('td', { title: full }, p.summary,
      x.what === 'waiting' && why && !p.summary.includes(d.held || d.approval) ? el('span', { class: 'muted' }, ' (' + why + ')') : null);
  }
  return el('td', { class: 'mono' }, JSON.stringify(p).slice(0, 240));
}

// a measured number, short (0.3012, 12.5, 1.2e-7); '?' for none
function fmtNum(v) {
  if (v === null || v === undefined) return '?';
  if (typeof v !== 'number') return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e6 || a < 1e-4)) return v.toExponential(2);
  return String(Number(v.toPrecision(4)));
}

// error: no number yet (no sample, the TSDB not answering), asked again at the next interval
const VERDICT_COLOR = { successful: 'var(--ok)', failed: 'var(--bad)', inconclusive: 'var(--warn)', error: 'var(--muted)' };

// an analysis round's verdict: its worst measurement
function roundVerdict(a) {
  const v = (a.measurements || []).map((m) => m.verdict);
  if (v.includes('failed')) return 'failed';
  if (v.includes('inconclusive') || (!v.length && a.ok === false)) return 'inconclusive';
  if (v.includes('error')) return 'error';
  return 'successful';
}

function measurementLine(m) {
  return m.metric + ' on ' + m.cluster + ': ' + fmtNum(m.value) + ' (baseline ' + (m.baseline === null || m.baseline === undefined ? 'none' : fmtNum(m.baseline)) + ') '
    + m.verdict + (m.verdict !== 'successful' && m.reason ? ' — ' + m.reason : '');
}

// ------------------------------------------------------------------------------------------------ gitops
const SYNC_CLASS = { Synced: 'health-healthy', OutOfSync: 'health-degraded', Progressing: 'health-unknown', Degraded: 'health-unhealthy' };

async function loadGitops() {
  let r;
  try { r = await api('/api/v1/gitops'); } catch (e) { if (e.message !== 'unauthorized') banner('gitops: ' + e.message); return; }
  $('#gitops-repos tbody').replaceChildren(...(r.repos.length ? r.repos.map((x) => el('tr', { dataRepo: x.name },
    el('td', {}, x.name), el('td', {}, x.branch), el('td', { class: 'mono' }, x.head || '-'),
    el('td', { class: 'mono' }, x.synced || '-'), el('td', {}, x.fetched_at ? ago(x.fetched_at) + ' ago' : 'never'),
    el('td', { class: x.error ? 'health-unhealthy' : '' }, x.error || '')))
    : [el('tr', {}, el('td', { colspan: 6, class: 'muted' }, 'No fleet repository followed (release.gitops.repos).'))]));
  $('#gitops-windows tbody').replaceChildren(...syncWindowRows(r.windows || []));
  $('#gitops-matrix').replaceChildren(gitopsMatrix(r.releases));
  const rows = [];
  for (const rel of r.releases) {
    for (const c of rel.clusters) {
      const drift = (c.drift || []).map((d) => d.object.kind + ' ' + (d.object.namespace ? d.object.namespace + '/' : '') + d.object.name
        + (d.deleted ? ' deleted' : ': ' + d.fields.map((f) => f.path + ' = ' + JSON.stringify(f.live) + ' (applied ' + JSON.stringify(f.applied) + (f.managers.length ? ', by ' + f.managers.join(', ') : '') + ')').join('; ')));
      rows.push(el('tr', { dataRelease: rel.release, dataCluster: c.cluster, dataStatus: c.status },
        el('td', {}, rel.release, rel.policy ? el('span', { class: 'muted' }, ' (policy)') : null),
        el('td', {}, c.cluster), el('td', { class: SYNC_CLASS[c.status] || '' }, c.status, isHeld(c) ? el('span', { class: 'held' }, ' (held)') : null),
        el('td', {}, c.revision ?? '-'), el('td', { class: 'mono' }, c.commit || '-'),
        el('td', {}, drift.length ? drift.join(' | ') : c.message || '')));
    }
  }
  $('#gitops-table tbody').replaceChildren(...rows);
}

// a release the role holds on a cluster (a closed sync window, a release it depends on): its message says so
function isHeld(c) { return c.status === 'OutOfSync' && /^held: /.test(c.message || ''); }

// the sync windows: each one, open now (until when) or when it opens next
function syncWindowRows(windows) {
  if (!windows.length) {
    return [el('tr', { id: 'gitops-windows-empty' }, el('td', { colspan: 7, class: 'muted' }, 'No sync windows (release.windows): releases sync at any time.'))];
  }
  return windows.map((w) => {
    const until = w.end ? ' until ' + fmtWhen(w.end) : '';
    const now = w.active
      ? el('span', { class: w.kind === 'deny' ? 'health-degraded' : 'health-healthy', title: w.start + (w.end ? ' → ' + w.end : '') },
        'open now' + (w.end ? until + ' (closes ' + fromNow(w.end) + ')' : ', not closing within a year'))
      : el('span', { class: 'muted', title: w.start + (w.end ? ' → ' + w.end : '') }, 'opens ' + fmtWhen(w.start) + ' (' + fromNow(w.start) + ')' + until);
    return el('tr', { dataWindow: w.index, dataKind: w.kind, dataActive: String(w.active) },
      el('td', {}, el('b', { class: 'window-' + w.kind }, w.kind)),
      el('td', {}, el('code', {}, w.schedule), ' ' + (w.time_zone || 'UTC') + ', for ' + w.duration),
      el('td', { class: 'mono' }, w.clusters || 'all'),
      el('td', { class: 'mono' }, w.releases.length ? w.releases.join(', ') : 'all'),
      el('td', {}, now),
      el('td', {}, w.manual_sync ? 'allowed' : 'no'),
      el('td', {}, w.description || ''));
  });
}

// ------------------------------------------------------------------------------------------------ capacity
const CHARTS = [
  ['CPU (cores)', ['cpu_used', 'cpu_allocatable']],
  ['Memory (GiB)', ['memory_used', 'memory_allocatable'], 1 / 1073741824],
  ['Pods', ['pods', 'pods_allocatable']],
  ['GPUs', ['gpus_allocatable']],
];
const COLORS = ['#2457c5', '#9aa5b1'];

function svgChart(title, series, scale) {
  const W = 420, H = 160, P = 34;
  const pts = series.flatMap((s) => s.points);
  const chart = svg('svg', { width: W, height: H, viewBox: `0 0 ${W} ${H}` });
  const box = el('div', { class: 'chart', dataChart: title }, el('h3', {}, title), chart,
    el('div', { class: 'legend' }, series.map((s, i) => el('span', { style: 'color:' + COLORS[i % 2] }, '● ' + s.metric + (s.points.length ? ' ' + (s.points[s.points.length - 1][1] * scale).toFixed(1) : '')))));
  if (!pts.length) {
    chart.append(svg('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle' }, 'no data yet'));
    return box;
  }
  const t0 = Math.min(...pts.map((p) => p[0])), t1 = Math.max(...pts.map((p) => p[0]));
  const vmax = Math.max(...pts.map((p) => p[1] * scale)) * 1.1 || 1;
  const x = (t) => P + (t1 === t0 ? 0 : (t - t0) / (t1 - t0)) * (W - P - 6);
  const y = (v) => H - 18 - (v * scale / vmax) * (H - 28);
  chart.append(svg('path', { d: `M${P} 6 V${H - 18} H${W - 6}`, stroke: '#dde1e7', fill: 'none' }));
  for (const [v, yy] of [[vmax, 10], [0, H - 18]]) {
    chart.append(svg('text', { x: 2, y: yy + 4, 'font-size': 10 }, v >= 100 ? v.toFixed(0) : v.toFixed(1)));
  }
  series.forEach((s, i) => {
    if (!s.points.length) return;
    chart.append(svg('path', {
      d: s.points.map((p, j) => (j ? 'L' : 'M') + x(p[0]).toFixed(1) + ' ' + y(p[1]).toFixed(1)).join(' '),
      stroke: COLORS[i % 2], fill: 'none', 'stroke-width': 1.6, 'data-metric': s.metric,
    }));
  });
  return box;
}

async function loadCapacity() {
  const p = new URLSearchParams({ range: $('#cap-range').value });
  if ($('#cap-cluster').value) p.set('cluster', $('#cap-cluster').value);
  let r;
  try { r = await api('/api/v1/capacity?' + p); } catch (e) { $('#cap-note').textContent = e.message; return; }
  $('#cap-note').textContent = r.errors.length ? r.errors.length + ' series failed: ' + r.errors.map((e) => e.metric).join(', ') : '';
  const by = Object.fromEntries(r.series.map((s) => [s.metric, s]));
  $('#capacity-charts').replaceChildren(...CHARTS.map(([title, names, scale]) =>
    svgChart(title, names.map((n) => by[n] || { metric: n, points: [] }), scale || 1)));
}

// ------------------------------------------------------------------------------------------------ pictures
const SEV_COLOR = { critical: '#8b1d1d', warning: '#b7791f', info: '#9aa5b1' };
const SEV_RANK = { info: 0, warning: 1, critical: 2 };

function fmtVital(unit, v) {
  if (v === undefined || v === null) return 'no data';
  if (unit === 'seconds') return v < 1 ? (v * 1000).toFixed(0) + ' ms' : v.toFixed(2) + ' s';
  if (unit === 'ratio') return (v * 100).toFixed(v > 0 && v < 0.1 ? 2 : 0) + ' %';
  return v.toFixed(v > 0 && v < 10 && v % 1 ? 1 : 0);
}

// a last value that wants a look (the same limits as the shipped alert rules' spirit: errors, unready
// nodes, a slow API server, nearly full nodes, restarting containers)
function vitalBad(name, v) {
  if (v === undefined || v === null) return false;
  return { api_latency_p99: v > 1, api_error_ratio: v > 0.01, nodes_ready: v < 1, restarts: v >= 5 && v > 2 * (state.restartsMedian || 0),
    cpu_used: v > 0.9, memory_used: v > 0.9 }[name] || false;
}

// a small line over [start, end] (every cluster's on the same time axis)
function sparkline(points, unit, name, start, end) {
  const W = 120, H = 26;
  const s = svg('svg', { class: 'spark', width: W, height: H, viewBox: `0 0 ${W} ${H}`, 'data-points': points.length });
  if (!points.length) { s.append(svg('text', { x: 2, y: 16 }, 'no data')); return s; }
  let lo = Math.min(...points.map((p) => p[1])), hi = Math.max(...points.map((p) => p[1]));
  if (unit !== 'seconds') lo = Math.min(lo, 0);
  if (name === 'nodes_ready' || (unit === 'ratio' && hi > 0.5)) hi = Math.max(hi, 1);
  if (hi === lo) hi = lo + (lo === 0 ? 1 : Math.abs(lo) * 0.1);
  const x = (t) => ((t - start) / Math.max(1, end - start)) * (W - 2) + 1;
  const y = (v) => H - 2 - ((v - lo) / (hi - lo)) * (H - 4);
  const line = points.map((p, j) => (j ? 'L' : 'M') + x(p[0]).toFixed(1) + ' ' + y(p[1]).toFixed(1)).join(' ');
  const color = vitalBad(name, points[points.length - 1][1]) ? 'var(--bad)' : 'var(--accent)';
  s.append(svg('path', { d: line + ` L${x(points[points.length - 1][0]).toFixed(1)} ${H - 1} L${x(points[0][0]).toFixed(1)} ${H - 1} Z`, fill: color, opacity: 0.12, stroke: 'none' }));
  s.append(svg('path', { d: line, fill: 'none', stroke: color, 'stroke-width': 1.3 }));
  s.append(svg('title', {}, name + ': ' + fmtVital(unit, lo) + ' … ' + fmtVital(unit, hi)));
  return s;
}

// a vital's value now: its last point, unless that is more than two minutes before the range's last
// evaluation (start + a whole number of steps; a failed scrape or two leaves a gap shorter than that) — the
// cluster's metrics stopped coming (unreachable, its agent gone): then no value, and since when
const VITAL_STALE_AFTER = 120;
function vitalNow(points, start, end, step) {
  if (!points.length) return { value: null, since: null };
  const [t, v] = points[points.length - 1];
  const lastEval = start + Math.floor((end - start) / step) * step;
  return t < lastEval - VITAL_STALE_AFTER ? { value: null, since: t } : { value: v, since: null };
}

// `t` as HH:MM, with its date when that is not `today`'s (unix seconds both)
function hhmm(t, today) {
  const d = new Date(t * 1000);
  const time = d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', hourCycle: 'h23' });
  return d.toDateString() === new Date(today * 1000).toDateString()
    ? time : d.toLocaleDateString([], { month: 'short', day: 'numeric' }) + ' ' + time;
}

async function loadVitals() {
  let r;
  try { r = await api('/api/v1/vitals?range=' + encodeURIComponent($('#vitals-range').value)); } catch (e) {
    $('#vitals-note').textContent = e.message === 'unauthorized' ? '' : 'vital signs: ' + e.message;
    return;
  }
  $('#vitals-note').textContent = r.errors.length ? r.errors.map((e) => e.vital + ': ' + e.error).join('; ') : 'updated ' + new Date().toLocaleTimeString();
  // restarts differ by workload mix: a cluster wants a look when it restarts far more than the fleet's median
  const lastOf = (c, name) => vitalNow(c.series[name] || [], r.start, r.end, r.step).value;
  const restarts = r.clusters.map((c) => lastOf(c, 'restarts')).filter((v) => v !== null).sort((a, b) => a - b);
  state.restartsMedian = restarts.length ? restarts[Math.floor(restarts.length / 2)] : 0;
  $('#vitals-table thead tr').replaceChildren(el('th', {}, 'cluster'), ...r.vitals.map((v) => el('th', { title: v.query }, v.title)));
  const order = state.clusters.map((c) => c.name);
  const rows = [...r.clusters].sort((a, b) => (order.indexOf(a.cluster) + 1 || 1e9) - (order.indexOf(b.cluster) + 1 || 1e9) || a.cluster.localeCompare(b.cluster));
  $('#vitals-table tbody').replaceChildren(...rows.map((c) => el('tr', { dataCluster: c.cluster },
    el('td', {}, c.cluster),
    ...r.vitals.map((v) => {
      const pts = c.series[v.name] || [];
      const now = vitalNow(pts, r.start, r.end, r.step);
      const text = now.since !== null ? 'none since ' + hhmm(now.since, r.end) : fmtVital(v.unit, now.value);
      return el('td', { class: 'vital', dataVital: v.name },
        sparkline(pts, v.unit, v.name, r.start, r.end),
        el('span', { class: 'last' + (vitalBad(v.name, now.value) ? ' bad' : '') + (now.since !== null ? ' stale' : ''),
          title: now.since !== null ? 'no value since: the cluster\'s metrics stopped coming (a rate carries on over its 5-minute window)' : '' }, text));
    }))));
}

// when each cluster was hurting over the last 24 h (cluster clocks), fleet incidents in a lane on top
function renderTimeline() {
  const box = $('#incident-timeline');
  const now = Date.now(), from = now - 24 * 3600e3;
  const names = [...new Set([...state.clusters.map((c) => c.name), ...[...state.incidents.values()].map((i) => i.cluster)])].sort();
  const lanes = ['fleet', ...names];
  const LANE = 16, LEFT = 120, TOP = 16, RIGHT = 8;
  const W = Math.max(640, box.clientWidth - 16), H = TOP + lanes.length * LANE + 4;
  const x = (t) => LEFT + ((t - from) / (now - from)) * (W - LEFT - RIGHT);
  const y = (lane) => TOP + lanes.indexOf(lane) * LANE;
  const pic = svg('svg', { width: W, height: H, viewBox: `0 0 ${W} ${H}`, id: 'timeline-svg' });
  for (let h = 0; h <= 24; h += 3) {
    const t = from + h * 3600e3;
    pic.append(svg('line', { x1: x(t), x2: x(t), y1: TOP - 4, y2: H, stroke: '#eef0f3' }));
    pic.append(svg('text', { x: x(t), y: 11, 'text-anchor': h === 24 ? 'end' : 'middle' },
      h === 24 ? 'now' : new Date(t).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' })));
  }
  for (const lane of lanes) {
    pic.append(svg('text', { x: 2, y: y(lane) + 11, 'font-weight': lane === 'fleet' ? 600 : null }, lane === 'fleet' ? 'fleet incidents' : lane));
    pic.append(svg('line', { x1: LEFT, x2: W - RIGHT, y1: y(lane) + LANE - 1, y2: y(lane) + LANE - 1, stroke: '#f1f3f6' }));
  }
  const span = (i) => {
    const start = Date.parse(i.opened_at);
    const end = i.resolved_at ? Date.parse(i.resolved_at) : i.status === 'resolved' ? Date.parse(i.updated_at) : now;
    return [Math.max(start, from), Math.min(Math.max(end, start), now)];
  };
  const bar = (i, lane, attrs) => {
    const [a, b] = span(i);
    if (b < from) return null;
    return svg('rect', Object.assign({ x: x(a).toFixed(1), y: y(lane) + 2, width: Math.max(2, x(b) - x(a)).toFixed(1), height: LANE - 5, rx: 2,
      fill: SEV_COLOR[i.severity] || SEV_COLOR.info, opacity: i.status === 'resolved' ? 0.55 : 0.95 }, attrs),
    svg('title', {}, i.kind + ' (' + i.severity + ', ' + i.status + ') ' + i.opened_at + (i.resolved_at ? ' → ' + i.resolved_at : '') + '\n' + i.summary));
  };
  let drawn = 0;
  for (const f of state.fleet || []) {
    const r = bar(f, 'fleet', { class: 'tl-fleet', 'data-fleet-id': f.id, 'data-members': f.members.length });
    if (!r) continue;
    r.querySelector('title').textContent += '\nmembers: ' + f.members.map((m) => m.cluster).join(', ');
    pic.append(r);
    drawn++;
    // each member marked on its own lane where it joined: the same failure across clusters, seen at once
    for (const m of f.members) {
      if (!lanes.includes(m.cluster)) continue;
      const t = Math.max(Date.parse(m.joined_at), from);
      const mx = x(t), my = y(m.cluster);
      pic.append(svg('path', { class: 'tl-member', 'data-fleet-id': f.id, 'data-cluster': m.cluster,
        d: `M${mx.toFixed(1)} ${my} l4 -4 l-8 0 z`, fill: SEV_COLOR[f.severity] || SEV_COLOR.info },
      svg('title', {}, m.cluster + ' joined fleet incident ' + f.kind + ' at ' + m.joined_at)));
    }
  }
  const incs = [...state.incidents.values()].sort((a, b) => (SEV_RANK[a.severity] || 0) - (SEV_RANK[b.severity] || 0));
  for (const i of incs) {
    const r = bar(i, i.cluster, { class: 'tl-incident', 'data-incident-id': i.id, 'data-cluster': i.cluster, 'data-severity': i.severity });
    if (r) { pic.append(r); drawn++; }
  }
  box.dataset.bars = drawn;
  box.replaceChildren(pic, drawn ? '' : el('p', { class: 'muted' }, 'No incident in the last 24 hours.'));
}

// release × cluster, a cell per release on a cluster coloured by its sync status, its revision in it
function gitopsMatrix(releases) {
  const clusters = [...new Set(releases.flatMap((r) => r.clusters.map((c) => c.cluster)))].sort();
  if (!releases.length) return el('p', { class: 'muted' }, 'No release or policy bundle yet.');
  return el('table', { class: 'matrix', id: 'gitops-matrix-table' },
    el('thead', {}, el('tr', {}, el('th', {}, 'release'), clusters.map((c) => el('th', {}, c)))),
    el('tbody', {}, releases.map((rel) => {
      const by = Object.fromEntries(rel.clusters.map((c) => [c.cluster, c]));
      return el('tr', { dataRelease: rel.release },
        el('td', {}, rel.release, rel.policy ? el('span', { class: 'muted' }, ' (policy)') : null),
        clusters.map((c) => {
          const x = by[c];
          if (!x) return el('td', { class: 'cell none', dataCluster: c }, '—');
          const held = isHeld(x);
          return el('td', { class: 'cell ' + x.status + (held ? ' held' : ''), dataCluster: c, dataStatus: x.status, dataHeld: held ? 'true' : null,
            title: x.status + (x.commit ? ' at ' + x.commit : '') + (x.message ? ': ' + x.message : '') },
          held ? 'held' : x.revision !== null && x.revision !== undefined ? 'r' + x.revision : x.status);
        }));
    })));
}

// a release's newest revision: a lane per batch from its start to its gate, a tick per cluster applied, a dot
// per analysis round coloured by its worst verdict, the release's moments as lines
function rolloutPicture(name, r) {
  const times = [];
  for (const m of r.moments) times.push(Date.parse(m.at));
  for (const b of r.batches) {
    for (const t of [b.started_at, b.ended_at]) if (t) times.push(Date.parse(t));
    for (const s of b.steps) times.push(Date.parse(s.at));
    for (const a of b.analysis || []) times.push(Date.parse(a.at));
  }
  // a batch still soaking, or held by its analysis, reaches up to now
  const open = r.batches.some((b) => b.started_at && !b.ended_at && (b.outcome === 'running' || b.outcome === 'waiting'));
  if (open) times.push(Date.now());
  const t0 = Math.min(...times), t1 = Math.max(...times, t0 + 1000);
  const LANE = 18, LEFT = 170, TOP = 40, W = 900, H = TOP + Math.max(1, r.batches.length) * LANE + 8;
  const x = (t) => LEFT + ((t - t0) / (t1 - t0)) * (W - LEFT - 12);
  const pic = svg('svg', { class: 'rollout', width: W, height: H, viewBox: `0 0 ${W} ${H}`, 'data-release': name, 'data-revision': r.revision });
  const secs = (t1 - t0) / 1000;
  pic.append(svg('text', { x: LEFT, y: 10 }, new Date(t0).toLocaleString()), svg('text', { x: W - 12, y: 10, 'text-anchor': 'end' }, '+' + (secs < 120 ? secs.toFixed(0) + ' s' : (secs / 60).toFixed(1) + ' min')));
  // the moments' names on two rows, so that close ones stay readable; near the right edge, right-aligned
  r.moments.forEach((m, k) => {
    const xx = x(Date.parse(m.at));
    const color = m.what === 'waiting' || m.what === 'override' ? 'var(--warn)' : m.ok === false || /roll|fail|incident/.test(m.what) ? 'var(--bad)' : '#9aa5b1';
    pic.append(svg('line', { x1: xx, x2: xx, y1: 24 + (k % 2) * 10 - 8, y2: H, stroke: color, 'stroke-dasharray': '3 2', class: 'rollout-moment', 'data-what': m.what }, svg('title', {}, m.what + ': ' + m.summary)));
    const right = xx > W - 80;
    pic.append(svg('text', { x: right ? xx - 3 : xx + 3, y: 24 + (k % 2) * 10, fill: color, 'text-anchor': right ? 'end' : 'start' }, m.what));
  });
  const OUT = { passed: 'var(--ok)', failed: 'var(--bad)', running: 'var(--accent)', waiting: 'var(--warn)', pending: '#9aa5b1' };
  // a text cut to the room there is (about 7 px a character), the whole of it in its title
  const fit = (text, room) => (text.length * 7 > room ? text.slice(0, Math.max(8, Math.floor(room / 7) - 1)) + '…' : text);
  r.batches.forEach((b, k) => {
    const yy = TOP + k * LANE;
    const cl = b.clusters || [];
    pic.append(svg('text', { x: 2, y: yy + 12 }, 'batch ' + b.batch + ': ' + (cl.length > 2 ? cl.length + ' clusters' : cl.join(', ')), svg('title', {}, cl.join(', '))));
    // what it waits for, short (the whole gate in the title and above the picture)
    const waits = b.outcome !== 'waiting' ? null : b.held ? 'held: ' + b.held
      : b.approval ? 'waits for approval ' + b.approval : 'waits: ' + (b.gate || '');
    if (b.started_at) {
      const a = Date.parse(b.started_at), e = b.ended_at ? Date.parse(b.ended_at) : Date.now();
      pic.append(svg('rect', { class: 'rollout-batch', 'data-batch': b.batch, 'data-outcome': b.outcome, x: x(a).toFixed(1), y: yy + 3, width: Math.max(3, x(e) - x(a)).toFixed(1), height: LANE - 7, rx: 2, fill: OUT[b.outcome], opacity: 0.35 },
        svg('title', {}, 'batch ' + b.batch + ' ' + b.outcome + (b.gate ? ': ' + b.gate : ''))));
      if (b.ended_at) {
        const gx = x(e), gy = yy + LANE / 2 - 1;
        pic.append(svg('path', { class: 'rollout-gate', 'data-outcome': b.outcome, d: `M${gx} ${gy - 6} L${gx + 6} ${gy} L${gx} ${gy + 6} L${gx - 6} ${gy} Z`, fill: OUT[b.outcome] }, svg('title', {}, 'gate: ' + (b.gate || b.outcome))));
      } else if (waits) {
        // held by its analysis: soaked, waiting for a person; said inside the lane, up to its end
        const room = x(e) - x(a) - 8;
        if (room > 60) {
          pic.append(svg('text', { class: 'rollout-waits', 'data-batch': b.batch, x: x(e) - 4, y: yy + 12, fill: 'var(--warn)', 'text-anchor': 'end' }, fit(waits, room), svg('title', {}, b.gate || waits)));
        }
      }
    }
    if (!b.started_at) {
      const last = r.batches.slice(0, k).reverse().find((p) => p.ended_at);
      const wx = last ? x(Date.parse(last.ended_at)) + 8 : LEFT;
      const text = waits || 'not started';
      pic.append(svg('text', { class: 'rollout-batch', 'data-batch': b.batch, 'data-outcome': b.outcome, 'data-held': b.held ? 'true' : null, x: wx, y: yy + 12, fill: OUT[b.outcome] }, fit(text, W - wx - 4), svg('title', {}, b.gate || text)));
    }
    for (const s of b.steps) {
      const sx = x(Date.parse(s.at));
      pic.append(svg('line', { class: 'rollout-step', x1: sx, x2: sx, y1: yy + 2, y2: yy + LANE - 3, stroke: s.ok === false ? 'var(--bad)' : 'var(--fg)', 'stroke-width': 2 }, svg('title', {}, s.summary)));
    }
    // on the lane's lower edge: the last round and the gate often fall together
    for (const a of b.analysis || []) {
      const verdict = roundVerdict(a);
      const title = 'batch ' + b.batch + ' analysis ' + a.round + '/' + a.count + ' (' + a.conclusion + '), ' + new Date(a.at).toLocaleTimeString() + '\n'
        + (a.measurements.length ? a.measurements.map(measurementLine).join('\n') : a.summary || '');
      pic.append(svg('circle', { class: 'rollout-analysis', 'data-batch': b.batch, 'data-round': a.round, 'data-verdict': verdict, 'data-conclusion': a.conclusion,
        cx: x(Date.parse(a.at)).toFixed(1), cy: yy + LANE - 4, r: 3.5, fill: VERDICT_COLOR[verdict], stroke: '#fff', 'stroke-width': 1.2 }, svg('title', {}, title)));
    }
  });
  return el('div', { class: 'picture' }, el('div', {}, el('b', {}, 'revision ' + r.revision), ' ', el('span', { class: 'muted' }, r.state || '')), pic);
}

// the GPU pool: a bar per cluster, allocated then free, as long as its allocatable (one scale for all)
function gpuBars(pools) {
  if (!pools.length) return el('p', { class: 'muted' }, 'No cluster has nvidia.com/gpu.');
  const max = Math.max(1, ...pools.map((g) => g.allocatable));
  const ROW = 20, LEFT = 130, W = 720, H = pools.length * ROW + 4;
  const x = (n) => (n / max) * (W - LEFT - 120);
  const pic = svg('svg', { width: W, height: H, viewBox: `0 0 ${W} ${H}`, id: 'gpu-svg' });
  pools.forEach((g, k) => {
    const yy = k * ROW + 2;
    pic.append(svg('g', { class: 'gpu-bar', 'data-cluster': g.cluster, 'data-free': g.free, 'data-allocatable': g.allocatable },
      svg('text', { x: 2, y: yy + 13 }, g.cluster),
      svg('rect', { x: LEFT, y: yy + 2, width: x(g.allocated).toFixed(1), height: ROW - 6, fill: 'var(--accent)' }, svg('title', {}, g.allocated + ' allocated')),
      svg('rect', { x: (LEFT + x(g.allocated)).toFixed(1), y: yy + 2, width: x(g.free).toFixed(1), height: ROW - 6, fill: 'var(--ok)', opacity: 0.7 }, svg('title', {}, g.free + ' free')),
      svg('text', { x: LEFT + x(g.allocatable) + 6, y: yy + 13 }, g.free + ' free of ' + g.allocatable)));
  });
  return el('div', {}, pic, el('div', { class: 'legend' }, el('span', { style: 'color:var(--accent)' }, '■ allocated'), el('span', { style: 'color:var(--ok)' }, '■ free')));
}

// ------------------------------------------------------------------------------------------------ start
async function whoami() {
  try {
    state.whoami = await api('/api/v1/whoami');
    $('#whoami').textContent = state.whoami.auth_enabled ? state.whoami.subject + ' (' + state.whoami.role + ')' : 'auth off (loopback demo)';
    $('#token-form').hidden = true;
    $('#token-clear').hidden = !token();
    banner('');
    return true;
  } catch (e) {
    $('#whoami').textContent = 'not signed in';
    return false;
  }
}

async function start() {
  if (!(await whoami())) return;
  await loadClusters();
  loadVitals();
  // the list now, and again once the live stream is up (so nothing that changed in between is missed)
  loadIncidents();
  connectStream();
}

document.addEventListener('DOMContentLoaded', () => {
  for (const b of document.querySelectorAll('#tabs button')) b.addEventListener('click', () => showTab(b.dataset.tab));
  $('#token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    localStorage.setItem(TOKEN_KEY, $('#token-input').value.trim());
    $('#token-input').value = '';
    start();
  });
  $('#token-clear').addEventListener('click', () => { localStorage.removeItem(TOKEN_KEY); location.reload(); });
  $('#cluster-filter').addEventListener('input', () => loadClusters());
  $('#cluster-sort').addEventListener('change', () => loadClusters());
  $('#incident-status').addEventListener('change', () => { renderIncidents(); loadFleetIncidents(); });
  $('#incident-filter').addEventListener('input', () => renderIncidents());
  $('#res-form').addEventListener('submit', loadResources);
  $('#diff-form').addEventListener('submit', runDiff);
  $('#compare-form').addEventListener('submit', runCompare);
  $('#cap-refresh').addEventListener('click', loadCapacity);
  $('#cap-cluster').addEventListener('change', loadCapacity);
  $('#cap-range').addEventListener('change', loadCapacity);
  setInterval(() => { if (state.whoami) loadClusters(); }, 5000);
  setInterval(() => { if (state.whoami) renderIncidents(); }, 30000);
  // an event problem's fleet incident comes from digests, which the incident stream does not carry
  setInterval(() => { if (state.whoami) loadFleetIncidents(); }, 15000);
  setInterval(() => { if (state.whoami && !$('#tab-fleet').hidden) loadVitals(); }, 30000);
  $('#vitals-range').addEventListener('change', loadVitals);
  // the open report tab follows the fleet too (compliance verdicts, GPU state and sync status change)
  setInterval(() => {
    if (!state.whoami) return;
    if (!$('#tab-compliance').hidden) loadCompliance();
    if (!$('#tab-gpu').hidden) loadGpu();
    if (!$('#tab-gitops').hidden) loadGitops();
    if (!$('#tab-releases').hidden) loadReleases();
  }, 10000);
  start();
});
