// MultiPilot console page: plain JS over /api/v1, no build step, nothing from outside this server.
'use strict';

const TOKEN_KEY = 'multipilot.token';
const $ = (sel, root = document) => root.querySelector(sel);
const state = { clusters: [], incidents: new Map(), whoami: null, source: null, fresh: new Set() };

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

function fmtLag(ms) {
  if (ms === null || ms === undefined) return 'lag n/a';
  if (Math.abs(ms) < 1000) return 'lag ' + ms + 'ms';
  return 'lag ' + (ms / 1000).toFixed(1) + 's';
}

// ------------------------------------------------------------------------------------------------ tabs
function showTab(name) {
  for (const b of document.querySelectorAll('#tabs button')) b.classList.toggle('active', b.dataset.tab === name);
  for (const s of document.querySelectorAll('section.tab')) s.hidden = s.id !== 'tab-' + name;
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
  const want = $('#incident-status').value;
  list = list.filter((f) => want === 'all' || (want === 'resolved' ? f.status === 'resolved' : f.status !== 'resolved'));
  $('#fleet-count').textContent = list.length ? list.length + ' shown' : 'none';
  $('#fleet-list').replaceChildren(...list.slice(0, 100).map((f) => {
    const open = f.members.filter((m) => !m.left_at && m.status !== 'resolved').length;
    return el('li', { class: 'incident fleet-incident severity-' + f.severity, dataFleetId: f.id, dataKind: f.kind, dataStatus: f.status },
      el('div', { class: 'head' },
        el('span', { class: 'pill sev-' + f.severity }, f.severity),
        el('b', { class: 'st-' + f.status + ' status' }, f.status),
        el('code', {}, f.kind),
        el('span', {}, f.members.length + ' member' + (f.members.length === 1 ? '' : 's') + ' (' + open + ' open) of ' + f.fleet_size + ' clusters'),
        el('span', { class: 'muted', title: 'opened ' + f.opened_at + ' (hub clock)' }, 'opened ' + ago(f.opened_at) + ' ago'),
        el('span', { class: 'muted' }, 'rev ' + f.revision)),
      el('div', { class: 'summary' }, f.summary),
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
  box.replaceChildren(...r.releases.map((rel) => el('div', { class: 'box', dataRelease: rel.release },
    el('h3', {}, rel.release, ' ', el('span', { class: 'muted' }, 'last change ' + ago(rel.last_change) + ' ago; clusters: ' + rel.clusters.join(', '))),
    el('table', {}, el('tbody', {}, rel.records.map((x) => el('tr', {},
      el('td', {}, ago(x.ingest_time)), el('td', {}, x.what), el('td', {}, x.cluster), el('td', {}, x.schema),
      el('td', { class: 'mono' }, JSON.stringify(x.payload).slice(0, 240)))))))));
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
  const rows = [];
  for (const rel of r.releases) {
    for (const c of rel.clusters) {
      const drift = (c.drift || []).map((d) => d.object.kind + ' ' + (d.object.namespace ? d.object.namespace + '/' : '') + d.object.name
        + (d.deleted ? ' deleted' : ': ' + d.fields.map((f) => f.path + ' = ' + JSON.stringify(f.live) + ' (applied ' + JSON.stringify(f.applied) + (f.managers.length ? ', by ' + f.managers.join(', ') : '') + ')').join('; ')));
      rows.push(el('tr', { dataRelease: rel.release, dataCluster: c.cluster, dataStatus: c.status },
        el('td', {}, rel.release, rel.policy ? el('span', { class: 'muted' }, ' (policy)') : null),
        el('td', {}, c.cluster), el('td', { class: SYNC_CLASS[c.status] || '' }, c.status),
        el('td', {}, c.revision ?? '-'), el('td', { class: 'mono' }, c.commit || '-'),
        el('td', {}, drift.length ? drift.join(' | ') : c.message || '')));
    }
  }
  $('#gitops-table tbody').replaceChildren(...rows);
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
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('width', W); svg.setAttribute('height', H); svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
  const box = el('div', { class: 'chart', dataChart: title }, el('h3', {}, title), svg,
    el('div', { class: 'legend' }, series.map((s, i) => el('span', { style: 'color:' + COLORS[i % 2] }, '● ' + s.metric + (s.points.length ? ' ' + (s.points[s.points.length - 1][1] * scale).toFixed(1) : '')))));
  if (!pts.length) {
    const t = document.createElementNS(ns, 'text');
    t.setAttribute('x', W / 2); t.setAttribute('y', H / 2); t.setAttribute('text-anchor', 'middle'); t.setAttribute('fill', '#6b7280');
    t.textContent = 'no data yet';
    svg.append(t);
    return box;
  }
  const t0 = Math.min(...pts.map((p) => p[0])), t1 = Math.max(...pts.map((p) => p[0]));
  const vmax = Math.max(...pts.map((p) => p[1] * scale)) * 1.1 || 1;
  const x = (t) => P + (t1 === t0 ? 0 : (t - t0) / (t1 - t0)) * (W - P - 6);
  const y = (v) => H - 18 - (v * scale / vmax) * (H - 28);
  const axis = document.createElementNS(ns, 'path');
  axis.setAttribute('d', `M${P} 6 V${H - 18} H${W - 6}`); axis.setAttribute('stroke', '#dde1e7'); axis.setAttribute('fill', 'none');
  svg.append(axis);
  for (const [v, yy] of [[vmax, 10], [0, H - 18]]) {
    const t = document.createElementNS(ns, 'text');
    t.setAttribute('x', 2); t.setAttribute('y', yy + 4); t.setAttribute('font-size', '10'); t.setAttribute('fill', '#6b7280');
    t.textContent = v >= 100 ? v.toFixed(0) : v.toFixed(1);
    svg.append(t);
  }
  series.forEach((s, i) => {
    if (!s.points.length) return;
    const path = document.createElementNS(ns, 'path');
    path.setAttribute('d', s.points.map((p, j) => (j ? 'L' : 'M') + x(p[0]).toFixed(1) + ' ' + y(p[1]).toFixed(1)).join(' '));
    path.setAttribute('stroke', COLORS[i % 2]); path.setAttribute('fill', 'none'); path.setAttribute('stroke-width', '1.6');
    path.setAttribute('data-metric', s.metric);
    svg.append(path);
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
  // the open report tab follows the fleet too (compliance verdicts, GPU state and sync status change)
  setInterval(() => {
    if (!state.whoami) return;
    if (!$('#tab-compliance').hidden) loadCompliance();
    if (!$('#tab-gpu').hidden) loadGpu();
    if (!$('#tab-gitops').hidden) loadGitops();
  }, 10000);
  start();
});
