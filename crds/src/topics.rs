//! Names of the internal topics eddy creates for an application.

/// Compacted changelog of a store; partition = task partition.
pub fn changelog(application_id: &str, store: &str) -> String {
    format!("{application_id}-{store}-changelog")
}

/// Repartition topic written by a re-key at topology step `step` (0-based index).
pub fn repartition(application_id: &str, step: usize) -> String {
    format!("{application_id}-{step}-repartition")
}

/// Dead-letter topic for records that `onError: deadLetter` sets aside.
pub fn dead_letter(application_id: &str) -> String {
    format!("{application_id}-dlq")
}

/// Kafka's rule for topic names, so a bad store or app name fails at start, not at create time.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 249 {
        return Err(format!("{name:?} must be 1 to 249 characters long"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "{name:?} contains {c:?}: only ASCII letters, digits, '.', '_' and '-' are allowed"
        ));
    }
    Ok(())
}
