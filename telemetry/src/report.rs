//! How both binaries print an error: one line, `error: ` then the error and its causes
//! joined by `: `, each said once. eddy's own errors hold their cause in their text and do
//! not also return it as `source()` (except a crate's error whose own text leaves out its
//! cause, e.g. kube's); some crates' errors (kube's config inference, librdkafka's codes) do
//! both, so a cause whose text was just said, or said anywhere if it is long, is skipped.

use std::error::Error;
use std::fmt;

/// Displays `error` and its chain of causes, each once.
pub struct Report<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut said = self.0.to_string();
        let mut cause = self.0.source();
        while let Some(c) = cause {
            let text = c.to_string();
            // Said already: at the end (the usual `what: {cause}`), or anywhere if long enough
            // not to be a common phrase ("timed out") that could be a new cause.
            let repeated = said.ends_with(&text) || (text.len() >= 24 && said.contains(&text));
            if !text.is_empty() && !repeated {
                said.push_str(": ");
                said.push_str(&text);
            }
            cause = c.source();
        }
        f.write_str(&said)
    }
}

#[cfg(test)]
mod tests {
    use super::Report;

    #[derive(Debug, thiserror::Error)]
    #[error("reading {0}: {1}")]
    struct Says(&'static str, std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("reading {0}: {1}")]
    struct SaysAndReturns(&'static str, #[source] std::io::Error);

    fn not_found() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::NotFound, "no such file")
    }

    #[test]
    fn each_cause_is_said_once() {
        let own = anyhow::Error::new(Says("a.yaml", not_found())).context("checking the app");
        assert_eq!(
            Report(own.as_ref()).to_string(),
            "checking the app: reading a.yaml: no such file"
        );
        // A crate's error that says its cause and also returns it.
        let twice = anyhow::Error::new(SaysAndReturns("a.yaml", not_found()));
        assert_eq!(
            Report(twice.as_ref()).to_string(),
            "reading a.yaml: no such file"
        );
        // A cause only returned, not said, is printed.
        let io = anyhow::Error::new(not_found()).context("reading b.yaml");
        assert_eq!(
            Report(io.as_ref()).to_string(),
            "reading b.yaml: no such file"
        );
        // A short cause said earlier, not at the end, is a new cause.
        let again =
            anyhow::Error::new(not_found()).context("no such file in the index; reading c.yaml");
        assert_eq!(
            Report(again.as_ref()).to_string(),
            "no such file in the index; reading c.yaml: no such file"
        );
    }
}
