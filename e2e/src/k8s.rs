//! A local Kubernetes control plane (`e2e/k8s/cluster.sh`) for tests and benchmarks: started
//! under a name of its own, driven with its kubectl and helm, stopped when dropped.

use crate::repo_root;
use anyhow::{Context as _, Result, bail, ensure};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The pod annotation where the pod runner writes the address a pod's `EDDY_HTTP_ADDR` moved
/// to (`127.0.0.1:<port>`): its IP and container port do not say where it listens.
pub const POD_HTTP_ANNOTATION: &str = "e2e.eddy.dev/http-addr";
/// The pod annotation where the pod runner writes the address of a pod's query API.
pub const POD_QUERY_ANNOTATION: &str = "e2e.eddy.dev/query-addr";

pub struct ControlPlane {
    name: String,
    pub kubeconfig: PathBuf,
    /// Directory of kubectl, helm and the control plane binaries.
    pub bin: PathBuf,
}

impl ControlPlane {
    pub fn start(name: &str) -> Result<Self> {
        Self::start_with(name, &[])
    }

    /// [`Self::start`] with more `cluster.sh start` options, e.g. `--node` (a control plane
    /// for a real node: `e2e/k8s/node.sh`).
    pub fn start_with(name: &str, options: &[&str]) -> Result<Self> {
        let script = repo_root().join("e2e/k8s/cluster.sh");
        let out = Command::new("bash")
            .arg(&script)
            .args(["start", "--name", name])
            .args(options)
            .stderr(Stdio::inherit())
            .output()?;
        ensure!(out.status.success(), "e2e/k8s/cluster.sh start failed");
        let kubeconfig = PathBuf::from(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .unwrap_or_default()
                .trim(),
        );
        let out = Command::new("bash")
            .arg(&script)
            .arg("bin")
            .stderr(Stdio::inherit())
            .output()?;
        let bin = PathBuf::from(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .unwrap_or_default()
                .trim(),
        );
        Ok(Self {
            name: name.to_string(),
            kubeconfig,
            bin,
        })
    }

    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        self.tool("kubectl", args, stdin)
    }

    pub fn tool(&self, tool: &str, args: &[&str], stdin: Option<&str>) -> Result<String> {
        let mut child = Command::new(self.bin.join(tool))
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .current_dir(repo_root())
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        if let (Some(text), Some(mut s)) = (stdin, child.stdin.take()) {
            s.write_all(text.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "{tool} {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    }

    /// Apply the StatefulStreamApp CRD from `path` (a file or a directory) and wait until the
    /// API server serves it.
    pub fn install_crd(&self, path: &Path) -> Result<()> {
        self.kubectl(
            &["apply", "--server-side", "-f", &path.to_string_lossy()],
            None,
        )?;
        // `kubectl wait` fails at once ("<nil> is of the type <nil>") while a fresh CRD has no
        // conditions yet: ask again.
        let mut last = None;
        crate::wait_until(Duration::from_secs(60), || {
            let r = self.kubectl(
                &[
                    "wait",
                    "--for=condition=Established",
                    "crd/statefulstreamapps.eddy.dev",
                    "--timeout=60s",
                ],
                None,
            );
            let ok = r.is_ok();
            last = r.err();
            Ok(ok)
        })
        .map_err(|e| last.unwrap_or(e))?;
        Ok(())
    }

    /// `kubectl -n NS get WHAT -o jsonpath=PATH`, or "" if it fails (e.g. not found yet).
    pub fn jsonpath(&self, ns: &str, what: &str, path: &str) -> String {
        self.kubectl(
            &["-n", ns, "get", what, "-o", &format!("jsonpath={path}")],
            None,
        )
        .unwrap_or_default()
    }

    /// The leader-election Lease the chart's RBAC of release `t` lets its operator hold (pass
    /// it as `--lease-name`).
    pub const LEASE: &'static str = "t-eddy-operator-leader";

    /// What `helm install` of the chart sets up around the operator in `ns`: the namespace,
    /// the CRD, the operator's ServiceAccount and RBAC, and the admission policy that keeps
    /// each worker pod to its own report in the status (so every operated test runs under
    /// it). Returns a kubeconfig with exactly the ServiceAccount's rights, to run the operator
    /// as a local process (release name `t`).
    pub fn install_operator_rbac(&self, ns: &str, dir: &Path) -> Result<PathBuf> {
        self.install_operator_rbac_with(ns, dir, &[])
    }

    /// [`Self::install_operator_rbac`] with chart values (`--set` arguments, e.g.
    /// `watchNamespaces={a,b}`: those namespaces must exist).
    pub fn install_operator_rbac_with(
        &self,
        ns: &str,
        dir: &Path,
        values: &[&str],
    ) -> Result<PathBuf> {
        self.kubectl(&["create", "namespace", ns], None)?;
        self.install_crd(&repo_root().join("charts/eddy-operator/crds"))?;
        let mut args = vec![
            "template",
            "t",
            "charts/eddy-operator",
            "--namespace",
            ns,
            "--show-only",
            "templates/serviceaccount.yaml",
            "--show-only",
            "templates/rbac.yaml",
            "--show-only",
            "templates/worker-status-policy.yaml",
            // The roles for people and query clients (`t-eddy-operator-query`).
            "--show-only",
            "templates/user-roles.yaml",
        ];
        for v in values {
            args.extend(["--set", v]);
        }
        let rbac = self.tool("helm", &args, None)?;
        self.kubectl(&["apply", "-f", "-"], Some(&rbac))?;
        self.wait_for_status_policy()?;
        self.kubeconfig_for(ns, "t-eddy-operator", dir)
    }

    /// The API server loads an admission policy and its binding a moment after they are
    /// created: wait until the policy has been type-checked (its status says which generation
    /// it checked), so the tests run under it from their start.
    fn wait_for_status_policy(&self) -> Result<()> {
        let checked = || {
            self.kubectl(
                &[
                    "get",
                    "validatingadmissionpolicy",
                    "t-eddy-operator-worker-status",
                    "-o",
                    "jsonpath={.status.observedGeneration}/{.metadata.generation}",
                ],
                None,
            )
            .map(|s| {
                let (seen, generation) = s.split_once('/').unwrap_or_default();
                !seen.is_empty() && seen == generation
            })
        };
        crate::wait_until(Duration::from_secs(60), || Ok(checked().unwrap_or(false)))
            .context("the worker status policy was never type-checked")?;
        // An expression that does not type-check against the CRD's schema would fail (and so
        // deny) every worker's report.
        let warnings = self.kubectl(
            &[
                "get",
                "validatingadmissionpolicy",
                "t-eddy-operator-worker-status",
                "-o",
                "jsonpath={.status.typeChecking.expressionWarnings}",
            ],
            None,
        )?;
        ensure!(
            warnings.trim().is_empty(),
            "the worker status policy does not type-check: {warnings}"
        );
        Ok(())
    }

    /// A kubeconfig holding a token of a ServiceAccount: whoever uses it has exactly its rights.
    pub fn kubeconfig_for(&self, ns: &str, sa: &str, dir: &Path) -> Result<PathBuf> {
        let token = self.kubectl(&["-n", ns, "create", "token", sa, "--duration", "2h"], None)?;
        let server = self.kubectl(
            &[
                "config",
                "view",
                "--raw",
                "-o",
                "jsonpath={.clusters[0].cluster.server}",
            ],
            None,
        )?;
        let ca = self.kubectl(
            &[
                "config",
                "view",
                "--raw",
                "-o",
                "jsonpath={.clusters[0].cluster.certificate-authority-data}",
            ],
            None,
        )?;
        let path = dir.join(format!("{sa}.kubeconfig"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: {server}, certificate-authority-data: {ca}}}}}]\nusers: [{{name: u, user: {{token: {}}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u, namespace: {ns}}}}}]\ncurrent-context: x\n",
                token.trim()
            ),
        )?;
        Ok(path)
    }
}

impl ControlPlane {
    /// Stop the control plane (idempotent): for one shared by a whole test binary, which
    /// lives in a static and is never dropped.
    pub fn stop(&self) {
        let _ = Command::new("bash")
            .arg(repo_root().join("e2e/k8s/cluster.sh"))
            .args(["stop", "--name", &self.name])
            .output();
    }
}

/// A process of the workspace (the operator, the pod runner) with its stderr in a log file:
/// SIGTERM when dropped, SIGKILL after 20 s.
pub struct Process(Child);

impl Process {
    pub fn spawn(bin: &str, args: &[&str], envs: &[(&str, &Path)], log: &Path) -> Result<Self> {
        let out = std::fs::File::create(log)?;
        let child = Command::new(crate::binary(bin)?)
            .args(args)
            .envs(envs.iter().map(|(k, v)| (*k, *v)))
            .env("EDDY_LOG", "info,kube=warn")
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()?;
        Ok(Process(child))
    }

    /// SIGTERM, without waiting (to stop several processes at once before dropping them).
    pub fn term(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
    }

    /// Its exit status once it exited, waiting at most `timeout`; None if it still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Option<std::process::ExitStatus>> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.0.try_wait()? {
                return Ok(Some(status));
            }
            if std::time::Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.0.try_wait() {
            return;
        }
        self.term();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}
