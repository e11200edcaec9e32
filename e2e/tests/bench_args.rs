//! The benchmark commands refuse what they do not know, before doing anything, and print their
//! usage on `--help` instead of running: no broker, no build, no control plane needed.

use eddy_e2e::{binary, repo_root};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BINARIES: &[&str] = &[
    "eddy-bench",
    "eddy-vs-kstreams",
    "operator-bench",
    "scaling-bench",
    "bench-report",
];

/// Run `cmd`, killing it after 20 s: a benchmark that ignored `--help` would start running.
fn run(mut cmd: Command) -> Output {
    // An unreachable broker: a benchmark that ran anyway fails instead of starting one.
    cmd.env("EDDY_TEST_BOOTSTRAP", "127.0.0.1:1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let started = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "{cmd:?} still running after 20 s: it ignored its arguments\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn benchmarks_print_usage_on_help() {
    for name in BINARIES {
        let mut cmd = Command::new(binary(name).expect("built"));
        cmd.arg("--help");
        let out = run(cmd);
        assert!(
            out.status.success(),
            "{name} --help: {:?}\n{}",
            out.status,
            text(&out.stderr)
        );
        assert!(
            text(&out.stdout).contains(&format!("Usage: {name}")),
            "{name} --help printed:\n{}",
            text(&out.stdout)
        );
    }
    let mut cmd = Command::new("bash");
    cmd.arg(repo_root().join("bench/report")).arg("--help");
    let out = run(cmd);
    assert!(
        out.status.success(),
        "bench/report --help: {:?}",
        out.status
    );
    assert!(
        text(&out.stdout).contains("bench/report [--only"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn benchmarks_refuse_unknown_arguments() {
    for name in BINARIES {
        let mut cmd = Command::new(binary(name).expect("built"));
        cmd.args(["--recordz", "5"]);
        let out = run(cmd);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{name} --recordz 5: {:?}",
            out.status
        );
        let err = text(&out.stderr);
        assert!(
            err.contains("unexpected argument '--recordz'"),
            "{name} --recordz 5 said:\n{err}"
        );
    }
    // Options that only make sense together are refused, not ignored.
    for (name, args, says) in [
        ("eddy-bench", &["--tail", "5"][..], "--large-restore"),
        (
            "eddy-bench",
            &["--large-restore", "--records", "5"][..],
            "cannot be used with",
        ),
        ("eddy-vs-kstreams", &["--points", "4"][..], "--curve"),
        (
            "eddy-vs-kstreams",
            &["--curve", "keys", "--keys", "5", "--jar", "/none"][..],
            "--keys does not apply",
        ),
        (
            "operator-bench",
            &["--apps", "many"][..],
            "invalid value 'many'",
        ),
    ] {
        let mut cmd = Command::new(binary(name).expect("built"));
        cmd.args(args);
        let out = run(cmd);
        assert!(!out.status.success(), "{name} {args:?} ran");
        assert!(
            text(&out.stderr).contains(says),
            "{name} {args:?} said:\n{}",
            text(&out.stderr)
        );
    }
    for (args, says) in [
        (&["--recordz", "5"][..], "unknown argument '--recordz'"),
        (&["--only", "engine,speed"][..], "unknown benchmark 'speed'"),
        (&["--records", "lots"][..], "--records must be a number"),
    ] {
        let mut cmd = Command::new("bash");
        cmd.arg(repo_root().join("bench/report")).args(args);
        let out = run(cmd);
        assert_eq!(
            out.status.code(),
            Some(2),
            "bench/report {args:?}: {:?}",
            out.status
        );
        assert!(
            text(&out.stderr).contains(says),
            "bench/report {args:?} said:\n{}",
            text(&out.stderr)
        );
    }
}
