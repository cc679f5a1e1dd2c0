//! The GPU pool: allocatable and allocated GPUs per model across the fleet.

use super::*;

// GPU pool

/// One cluster's GPUs.
#[derive(Debug, Clone, Serialize)]
pub struct GpuPool {
    /// Cluster.
    pub cluster: String,
    /// Cluster health (as in the overview).
    pub health: Health,
    /// `nvidia.com/gpu` allocatable.
    pub allocatable: u32,
    /// GPUs requested by scheduled pods.
    pub allocated: u32,
    /// allocatable − allocated.
    pub free: u32,
    /// Per GPU model.
    pub models: Vec<GpuModel>,
    /// Device plugin `name version` and readiness.
    pub device_plugin: Option<Value>,
    /// The gpu-device-plugin probe's latest status and detail.
    pub plugin_health: Option<ProbeStatus>,
    /// The probe's detail line.
    pub plugin_detail: Option<String>,
}

/// GPUs of one model in a cluster.
#[derive(Debug, Clone, Serialize)]
pub struct GpuModel {
    /// Model (`nvidia.com/gpu.product`).
    pub model: String,
    /// Nodes with it.
    pub nodes: usize,
    /// Allocatable.
    pub allocatable: u32,
    /// Allocated.
    pub allocated: u32,
    /// Free.
    pub free: u32,
    /// Driver versions on those nodes.
    pub driver_versions: Vec<String>,
}

/// Every cluster with GPUs, the most free GPUs first.
pub fn gpu_pools(st: &Store, now: DateTime<Utc>) -> Vec<GpuPool> {
    let mut out = Vec::new();
    for (name, c) in &st.clusters {
        let Some((facts, _)) = &c.facts else { continue };
        if facts.gpus.is_empty() {
            continue;
        }
        let mut models: BTreeMap<&str, GpuModel> = BTreeMap::new();
        for g in &facts.gpus {
            let m = models.entry(g.model.as_str()).or_insert_with(|| GpuModel {
                model: g.model.clone(),
                nodes: 0,
                allocatable: 0,
                allocated: 0,
                free: 0,
                driver_versions: Vec::new(),
            });
            m.nodes += 1;
            m.allocatable += g.allocatable;
            m.allocated += g.allocated;
            m.free = m.allocatable.saturating_sub(m.allocated);
            if !g.driver_version.is_empty() && !m.driver_versions.contains(&g.driver_version) {
                m.driver_versions.push(g.driver_version.clone());
            }
        }
        let models: Vec<GpuModel> = models.into_values().collect();
        let allocatable = models.iter().map(|m| m.allocatable).sum();
        let allocated = models.iter().map(|m| m.allocated).sum();
        let probe = c.probes.get("gpu-device-plugin");
        out.push(GpuPool {
            cluster: name.clone(),
            health: health_of(c, now).0,
            allocatable,
            allocated,
            free: u32::saturating_sub(allocatable, allocated),
            models,
            device_plugin: facts
                .gpu_device_plugin
                .as_ref()
                .map(|p| json!({"name": p.name, "version": p.version, "ready": p.ready})),
            plugin_health: probe.map(|p| p.status),
            plugin_detail: probe.map(|p| p.detail.clone()),
        });
    }
    out.sort_by(|a, b| b.free.cmp(&a.free).then(a.cluster.cmp(&b.cluster)));
    out
}

pub(super) async fn gpu(State(app): State<App>) -> ApiResult<Vec<GpuPool>> {
    let st = app.shared.store.read().unwrap_or_else(|e| e.into_inner());
    Ok(axum::Json(gpu_pools(&st, Utc::now())))
}
