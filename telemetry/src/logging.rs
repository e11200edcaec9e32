//! Where both binaries' logs go and in which shape: stderr, filtered by `EDDY_LOG` (tracing's
//! filter syntax), as human-readable text (the default) or as one JSON object per line
//! (`--log-format json`, `EDDY_LOG_FORMAT=json`) for log collectors that index fields:
//! `{"timestamp":"...","level":"INFO","message":"restored","task":"0_1","records":5,"target":"eddy_worker::restore"}`.
//! An event's fields sit next to `message` (flattened), so a collector can filter on `task`
//! or `app` without parsing the text.

use std::fmt;
use std::str::FromStr;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The environment variable both binaries read the format from (their `--log-format`).
pub const FORMAT_ENV: &str = "EDDY_LOG_FORMAT";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// One line of text per event, colored on a terminal.
    #[default]
    Text,
    /// One JSON object per event and line.
    Json,
}

impl LogFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown log format {0:?}: expected `text` or `json`")]
pub struct UnknownLogFormat(String);

impl FromStr for LogFormat {
    type Err = UnknownLogFormat;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(UnknownLogFormat(s.to_string())),
        }
    }
}

/// The subscriber for `format`, writing to `writer`, filtered by `filter`.
pub fn subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    writer: W,
    ansi: bool,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(builder.with_ansi(ansi).finish()),
        LogFormat::Json => Box::new(builder.json().flatten_event(true).with_ansi(false).finish()),
    }
}

/// Send the process' logs to stderr in `format`, filtered by `EDDY_LOG` or else by
/// `default_filter`. Also takes over what crates log through the `log` crate.
pub fn init(format: LogFormat, default_filter: &str) {
    let filter =
        EnvFilter::try_from_env("EDDY_LOG").unwrap_or_else(|_| EnvFilter::new(default_filter));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // Fails only if a subscriber is set already (a test harness): that one stays.
    let _ = subscriber(format, filter, std::io::stderr, ansi).try_init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("buffer").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged(format: LogFormat) -> String {
        let buffer = Buffer::default();
        let out = buffer.clone();
        let sub = subscriber(format, EnvFilter::new("info"), move || out.clone(), false);
        tracing::subscriber::with_default(sub, || {
            tracing::info!(task = "0_1", records = 5u64, "restored");
            tracing::debug!("filtered out");
        });
        String::from_utf8(buffer.0.lock().expect("buffer").clone()).expect("UTF-8")
    }

    #[test]
    fn json_logs_are_one_object_per_line_with_the_fields_beside_the_message() {
        let text = logged(LogFormat::Json);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        let line: serde_json::Value = serde_json::from_str(lines[0]).expect("a JSON object");
        assert_eq!(line["level"], "INFO", "{line}");
        assert_eq!(line["message"], "restored", "{line}");
        assert_eq!(line["task"], "0_1", "{line}");
        assert_eq!(line["records"], 5, "{line}");
        assert_eq!(line["target"], module_path!(), "{line}");
        assert!(line["timestamp"].is_string(), "{line}");
    }

    #[test]
    fn text_logs_stay_text_and_formats_parse_from_flags() {
        let text = logged(LogFormat::Text);
        assert!(
            text.contains("INFO") && text.contains("restored task=\"0_1\""),
            "{text}"
        );
        assert!(serde_json::from_str::<serde_json::Value>(text.trim()).is_err());
        assert_eq!("json".parse::<LogFormat>().expect("json"), LogFormat::Json);
        assert_eq!("TEXT".parse::<LogFormat>().expect("text"), LogFormat::Text);
        let e = "yaml"
            .parse::<LogFormat>()
            .expect_err("unknown")
            .to_string();
        assert!(e.contains("expected `text` or `json`"), "{e}");
    }
}
