//! Worker pods' memory from the app's state memory (`spec.memory`): the requests and limits
//! a pod gets when the app sets no `spec.resources` (so it is not BestEffort, the first pod a
//! node evicts), and the warning when a limit set by hand leaves the budget too little room.

use eddy_crds::spec::AppSpec;
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// What a worker uses besides its state memory (librdkafka's buffers, the processing
/// thread's values, the allocator's pages), measured well under this: the least a limit
/// must leave beside the budget.
pub const OVERHEAD: u64 = 128 << 20;

/// The memory a pod gets by default: twice the budget, and at least the budget plus 256Mi
/// (RSS of a worker with the default 256Mi budget peaks near 270-350 MiB in the benchmarks).
pub fn default_memory(budget: u64) -> u64 {
    budget
        .saturating_mul(2)
        .max(budget.saturating_add(256 << 20))
}

/// The `resources` the app's `podTemplate` gives the worker container, merged over ours.
fn template_resources(spec: &AppSpec) -> Option<&serde_json::Value> {
    spec.pod_template.as_ref()?["spec"]["containers"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == crate::resources::WORKER_CONTAINER)?
        .get("resources")
}

/// The worker container's resources: `spec.resources` when set; none of ours when the
/// `podTemplate` sets the worker's (merged map by map, ours could leave a limit below its
/// request); else a memory request and limit of [`default_memory`] and a CPU request of
/// 100m (no CPU limit: throttling stalls commits and probes). None too when the memory
/// settings are invalid (the spec is refused).
pub fn resources(spec: &AppSpec) -> Option<ResourceRequirements> {
    if let Some(r) = &spec.resources {
        return Some(r.clone());
    }
    if template_resources(spec).is_some() {
        return None;
    }
    let memory = Quantity(mebibytes(default_memory(spec.memory_bytes().ok()?.budget)));
    Some(ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity("100m".into())),
            ("memory".to_string(), memory.clone()),
        ])),
        limits: Some(BTreeMap::from([("memory".to_string(), memory)])),
        ..Default::default()
    })
}

/// Why the memory limit of `spec.resources` is too low for the budget, if it is.
pub fn limit_warning(spec: &AppSpec) -> Option<String> {
    let memory = spec.memory_bytes().ok()?;
    // The podTemplate's wins: it is merged over spec.resources.
    let limit = template_resources(spec)
        .and_then(|r| r["limits"]["memory"].as_str())
        .map(str::to_string)
        .or_else(|| {
            let r = spec.resources.as_ref()?;
            Some(r.limits.as_ref()?.get("memory")?.0.clone())
        })?;
    let bytes = eddy_crds::quantity::bytes(&limit).ok()?;
    let needs = memory.budget.saturating_add(OVERHEAD);
    (bytes < needs).then(|| {
        format!(
            "resources.limits.memory ({}) leaves memory.budget ({}) less than {} for the rest of the worker: it may be OOM-killed as its state grows; raise the limit to at least {} (or lower the budget)",
            limit,
            mebibytes(memory.budget),
            mebibytes(OVERHEAD),
            mebibytes(needs)
        )
    })
}

/// Bytes as a quantity in whole Mi (rounded up).
fn mebibytes(bytes: u64) -> String {
    format!("{}Mi", bytes.div_ceil(1 << 20))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> AppSpec {
        serde_yaml::from_str(&format!("topology: [{{from: {{topic: a}}}}]\n{yaml}")).expect("spec")
    }

    #[test]
    fn pods_without_resources_get_memory_from_the_budget() {
        let memory = |yaml: &str| {
            let r = resources(&spec(yaml)).expect("resources");
            let get = |m: &Option<BTreeMap<String, Quantity>>, k: &str| {
                m.as_ref().and_then(|m| m.get(k)).map(|q| q.0.clone())
            };
            (
                get(&r.requests, "memory"),
                get(&r.limits, "memory"),
                get(&r.requests, "cpu"),
                get(&r.limits, "cpu"),
            )
        };
        let mi = |s: &str| Some(s.to_string());
        assert_eq!(memory(""), (mi("512Mi"), mi("512Mi"), mi("100m"), None));
        assert_eq!(
            memory("memory: {budget: 1.5Gi}"),
            (mi("3072Mi"), mi("3072Mi"), mi("100m"), None)
        );
        assert_eq!(
            memory("memory: {budget: 64Mi}"),
            (mi("320Mi"), mi("320Mi"), mi("100m"), None)
        );
        // The app's own resources win, whatever they say.
        let own = resources(&spec("resources: {requests: {cpu: '2'}}")).expect("resources");
        assert_eq!(own.limits, None);
        assert!(resources(&spec("memory: {budget: 1GB}")).is_none());
        // Resources set through the podTemplate are the pod's alone.
        let tmpl = "podTemplate: {spec: {containers: [{name: worker, resources: {requests: {memory: 2Gi}}}]}}";
        assert!(resources(&spec(tmpl)).is_none());
        let sidecar = "podTemplate: {spec: {containers: [{name: proxy, resources: {requests: {memory: 2Gi}}}]}}";
        assert!(resources(&spec(sidecar)).is_some());
    }

    #[test]
    fn a_limit_below_the_budget_and_its_overhead_is_warned_of() {
        let warn = |yaml: &str| limit_warning(&spec(yaml));
        assert_eq!(warn(""), None);
        assert_eq!(warn("resources: {limits: {memory: 1Gi}}"), None);
        assert_eq!(warn("resources: {limits: {memory: 384Mi}}"), None);
        let w = warn("memory: {budget: 1Gi}\nresources: {limits: {memory: 1Gi}}").expect("warned");
        assert!(w.contains("(1Gi)") && w.contains("at least 1152Mi"), "{w}");
        assert_eq!(
            warn("resources: {requests: {memory: 64Mi}}"),
            None,
            "no limit, no warning"
        );
        assert!(
            warn("podTemplate: {spec: {containers: [{name: worker, resources: {limits: {memory: 200Mi}}}]}}")
                .is_some(),
            "a limit in the podTemplate counts"
        );
    }
}
