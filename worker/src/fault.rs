//! Kafka errors sorted the way the Java client and Kafka Streams sort them. Most go away by
//! themselves (a broker restarting, a leader moving, a coordinator loading, a transaction the
//! broker aborted, a fenced producer after a pause): the worker keeps its state, re-creates
//! what it must and retries. A few say the app or its credentials are wrong (not authorized,
//! authentication failed, an invalid setting): retrying cannot help, so the worker stops with
//! a message naming what to fix.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// True when retrying cannot help: the error names a configuration or permission to fix.
pub fn is_fatal_code(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode::*;
    matches!(
        code,
        TopicAuthorizationFailed
            | GroupAuthorizationFailed
            | ClusterAuthorizationFailed
            | TransactionalIdAuthorizationFailed
            | DelegationTokenAuthorizationFailed
            | SaslAuthenticationFailed
            | Authentication
            | UnsupportedSASLMechanism
            | IllegalSASLState
            | UnacceptableCredential
            | SecurityDisabled
            | InvalidTransactionTimeout
            | InvalidConfig
            | InvalidArgument
            | UnsupportedVersion
            | UnsupportedForMessageFormat
    )
}

/// True when retrying cannot help (see [`is_fatal_code`]); client creation and
/// configuration errors too.
pub fn is_fatal(e: &KafkaError) -> bool {
    match e {
        KafkaError::ClientConfig(..)
        | KafkaError::ClientCreation(_)
        | KafkaError::AdminOpCreation(_)
        | KafkaError::Nul(_) => true,
        // The transaction API reports a fenced producer as "fatal" for that producer
        // instance: a new one fixes it, so only the codes above stop the worker.
        KafkaError::Transaction(t) => is_fatal_code(t.code()),
        other => other.rdkafka_error_code().is_some_and(is_fatal_code),
    }
}

/// What a user should do about a fatal error, to append to its message.
pub fn hint(code: RDKafkaErrorCode) -> &'static str {
    use RDKafkaErrorCode::*;
    match code {
        TopicAuthorizationFailed => {
            "grant the app's principal READ on its input topics and WRITE on its output and internal topics"
        }
        GroupAuthorizationFailed => "grant the app's principal READ on the group <applicationId>",
        TransactionalIdAuthorizationFailed => {
            "grant the app's principal WRITE on transactional ids <applicationId>-*"
        }
        ClusterAuthorizationFailed => {
            "grant the app's principal IDEMPOTENT_WRITE (and CREATE for internal topics) on the cluster"
        }
        SaslAuthenticationFailed | Authentication | UnacceptableCredential => {
            "check kafka.sasl / kafka.tls and the Secrets they name"
        }
        InvalidTransactionTimeout => {
            "lower spec.transactionTimeoutMs below the brokers' transaction.max.timeout.ms"
        }
        _ => "check spec.kafka and the brokers' settings",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outages_are_retried_and_permissions_are_not() {
        use RDKafkaErrorCode::*;
        for transient in [
            BrokerTransportFailure,
            AllBrokersDown,
            MessageTimedOut,
            OperationTimedOut,
            RequestTimedOut,
            NotLeaderForPartition,
            CoordinatorLoadInProgress,
            NotCoordinator,
            NotEnoughReplicas,
            ProducerFenced,
            Fenced,
            InvalidProducerEpoch,
            State,
            Fatal,
        ] {
            assert!(!is_fatal_code(transient), "{transient:?}");
            assert!(!is_fatal(&KafkaError::MessageConsumption(transient)));
        }
        for fatal in [
            TopicAuthorizationFailed,
            SaslAuthenticationFailed,
            InvalidTransactionTimeout,
        ] {
            assert!(is_fatal(&KafkaError::Flush(fatal)), "{fatal:?}");
            assert!(!hint(fatal).is_empty());
        }
    }
}
