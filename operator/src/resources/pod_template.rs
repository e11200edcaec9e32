//! `spec.podTemplate` merged into the worker pod template the way a strategic merge patch
//! merges a pod (`kubectl patch --type=strategic`), so that adding one env var or a sidecar
//! adds it instead of replacing the worker container (a JSON merge patch replaces lists):
//!
//! - `containers` and `initContainers` merge by `name`: a container named like one of ours
//!   merges into it, recursively by these rules; others are added, starting from the
//!   `restricted` security context so a sidecar is admitted where the workers are;
//! - in a container, `env` merges by `name`, `volumeMounts` by `mountPath`, `ports` by
//!   `containerPort`: an entry with the key of an existing one replaces it, others are added;
//! - `volumes` merge by `name` the same way (a volume of the same name replaces ours whole,
//!   so its source is not mixed with ours);
//! - other maps merge recursively, `null` removes a key, other values and lists replace.

use serde_json::Value;

/// Where in a pod template a value sits: decides how its lists merge.
#[derive(Clone, Copy, Debug, PartialEq)]
enum At {
    Template,
    Pod,
    Container,
    Other,
}

/// How the items of a list merge: matched by `key`; a match merges recursively (`deep`) or
/// is replaced.
struct ListRule {
    key: &'static str,
    deep: bool,
}

fn list_rule(at: At, field: &str) -> Option<ListRule> {
    let (key, deep) = match (at, field) {
        (At::Pod, "containers" | "initContainers") => ("name", true),
        (At::Pod, "volumes") => ("name", false),
        (At::Container, "env") => ("name", false),
        (At::Container, "volumeMounts") => ("mountPath", false),
        (At::Container, "ports") => ("containerPort", false),
        _ => return None,
    };
    Some(ListRule { key, deep })
}

fn child(at: At, field: &str) -> At {
    match (at, field) {
        (At::Template, "spec") => At::Pod,
        (At::Pod, "containers" | "initContainers") => At::Container,
        _ => At::Other,
    }
}

/// Merge `patch` (a PodTemplateSpec as JSON) into `base` (ours).
pub fn merge(base: &mut Value, patch: &Value) {
    merge_at(base, patch, At::Template);
}

fn merge_at(base: &mut Value, patch: &Value, at: At) {
    let (Value::Object(b), Value::Object(p)) = (&mut *base, patch) else {
        *base = patch.clone();
        return;
    };
    for (k, v) in p {
        if v.is_null() {
            b.remove(k);
            continue;
        }
        match (list_rule(at, k), b.get_mut(k), v) {
            (Some(rule), Some(Value::Array(items)), Value::Array(patch_items)) => {
                merge_list(items, patch_items, &rule, child(at, k));
            }
            (_, Some(slot), _) => merge_at(slot, v, child(at, k)),
            (_, None, _) => {
                let mut fresh = Value::Object(Default::default());
                if let (Some(_), Value::Array(items)) = (list_rule(at, k), v) {
                    // A list we had none of: its items still get their defaults.
                    fresh = Value::Array(items.iter().map(|i| added(i, child(at, k))).collect());
                } else {
                    merge_at(&mut fresh, v, child(at, k));
                }
                b.insert(k.clone(), fresh);
            }
        }
    }
}

fn merge_list(items: &mut Vec<Value>, patch: &[Value], rule: &ListRule, at: At) {
    for p in patch {
        let existing = p
            .get(rule.key)
            .and_then(|key| items.iter_mut().find(|i| i.get(rule.key) == Some(key)));
        match existing {
            Some(item) if rule.deep => merge_at(item, p, at),
            Some(item) => *item = p.clone(),
            None => items.push(added(p, at)),
        }
    }
}

/// An item the patch adds: a container starts from the restricted security context.
fn added(item: &Value, at: At) -> Value {
    if at != At::Container {
        return item.clone();
    }
    let mut base = serde_json::json!({
        "securityContext": serde_json::to_value(super::container_security()).unwrap_or(Value::Null),
    });
    merge_at(&mut base, item, At::Container);
    base
}

#[cfg(test)]
mod tests {
    use super::merge;
    use serde_json::json;

    fn worker() -> serde_json::Value {
        json!({
            "metadata": {"labels": {"app": "pv"}, "annotations": {"eddy.dev/spec-hash": "1"}},
            "spec": {
                "serviceAccountName": "pv-worker",
                "containers": [{
                    "name": "worker",
                    "image": "eddy",
                    "args": ["run"],
                    "env": [{"name": "EDDY_APP_FILE", "value": "/etc/eddy/app.yaml"},
                            {"name": "EDDY_STATE_DIR", "value": "/var/lib/eddy"}],
                    "volumeMounts": [{"name": "state", "mountPath": "/var/lib/eddy"}],
                    "ports": [{"name": "http", "containerPort": 9090}],
                    "resources": {"requests": {"cpu": "1"}},
                }],
                "volumes": [{"name": "app", "configMap": {"name": "pv-app"}}],
            },
        })
    }

    #[test]
    fn env_and_a_sidecar_add_to_the_worker_container() {
        let mut t = worker();
        merge(
            &mut t,
            &json!({"spec": {"containers": [
                {"name": "worker", "env": [{"name": "EXTRA", "value": "1"}]},
                {"name": "proxy", "image": "envoy", "args": ["-c", "/etc/envoy.yaml"]},
            ]}}),
        );
        let c = &t["spec"]["containers"];
        assert_eq!(c.as_array().map(Vec::len), Some(2));
        assert_eq!(c[0]["name"], "worker");
        assert_eq!(c[0]["image"], "eddy", "the worker keeps its image");
        assert_eq!(c[0]["args"], json!(["run"]), "and its args");
        let env: Vec<&str> = c[0]["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["name"].as_str())
            .collect();
        assert_eq!(env, ["EDDY_APP_FILE", "EDDY_STATE_DIR", "EXTRA"]);
        assert_eq!(c[1]["image"], "envoy");
        assert_eq!(
            c[1]["securityContext"]["capabilities"]["drop"],
            json!(["ALL"]),
            "a sidecar starts from the restricted security context"
        );
    }

    #[test]
    fn keyed_entries_replace_theirs_and_maps_merge() {
        let mut t = worker();
        merge(
            &mut t,
            &json!({
                "metadata": {"labels": {"team": "a"}},
                "spec": {
                    "nodeSelector": {"disk": "ssd"},
                    "containers": [{
                        "name": "worker",
                        "args": ["run", "--verbose"],
                        "env": [{"name": "EDDY_STATE_DIR", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}],
                        "volumeMounts": [{"name": "fast", "mountPath": "/var/lib/eddy"},
                                         {"name": "cache", "mountPath": "/cache"}],
                        "ports": [{"name": "metrics", "containerPort": 9090}],
                        "resources": {"limits": {"memory": "1Gi"}},
                    }],
                    "volumes": [{"name": "app", "secret": {"secretName": "s"}},
                                {"name": "cache", "emptyDir": {}}],
                    "initContainers": [{"name": "init", "image": "busybox"}],
                },
            }),
        );
        let s = &t["spec"];
        let c = &s["containers"][0];
        assert_eq!(t["metadata"]["labels"], json!({"app": "pv", "team": "a"}));
        assert_eq!(t["metadata"]["annotations"]["eddy.dev/spec-hash"], "1");
        assert_eq!(s["nodeSelector"]["disk"], "ssd");
        assert_eq!(
            c["args"],
            json!(["run", "--verbose"]),
            "other lists replace"
        );
        assert_eq!(
            c["env"][1],
            json!({"name": "EDDY_STATE_DIR", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}),
            "an env entry of the same name replaces ours whole (no value next to valueFrom)"
        );
        assert_eq!(c["volumeMounts"][0]["name"], "fast");
        assert_eq!(c["volumeMounts"][1]["mountPath"], "/cache");
        assert_eq!(c["ports"].as_array().map(Vec::len), Some(1));
        assert_eq!(c["ports"][0]["name"], "metrics");
        assert_eq!(
            c["resources"],
            json!({"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}})
        );
        assert_eq!(
            s["volumes"][0],
            json!({"name": "app", "secret": {"secretName": "s"}}),
            "a volume of the same name replaces ours, sources are not mixed"
        );
        assert_eq!(s["volumes"][1]["name"], "cache");
        assert_eq!(s["initContainers"][0]["image"], "busybox");
        assert_eq!(
            s["initContainers"][0]["securityContext"]["allowPrivilegeEscalation"],
            false
        );
        assert_eq!(s["serviceAccountName"], "pv-worker");
    }

    #[test]
    fn null_removes_a_key() {
        let mut t = worker();
        merge(
            &mut t,
            &json!({"spec": {"containers": [{"name": "worker", "resources": null}]}}),
        );
        assert!(t["spec"]["containers"][0].get("resources").is_none());
    }
}
