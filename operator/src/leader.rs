//! Leader election on a `coordination.k8s.io` Lease, so two operator replicas never
//! reconcile at once: the holder renews the lease; another replica takes it over only once
//! it expired. A leader that cannot renew in time stops, and Kubernetes restarts it as a
//! follower.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, PostParams};
use std::time::Duration;

pub const LEASE_SECONDS: i32 = 15;

/// Try once to take or renew the lease; true if `me` holds it afterwards.
pub async fn try_acquire(api: &Api<Lease>, name: &str, me: &str) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    let spec = LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(LEASE_SECONDS),
        renew_time: Some(MicroTime(now)),
        ..Default::default()
    };
    match api.get_opt(name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    acquire_time: Some(MicroTime(now)),
                    ..spec
                }),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
        Some(mut lease) => {
            let cur = lease.spec.clone().unwrap_or_default();
            let holder = cur.holder_identity.clone().unwrap_or_default();
            let expired = cur.renew_time.as_ref().is_none_or(|t| {
                let ttl = SignedDuration::from_secs(i64::from(
                    cur.lease_duration_seconds.unwrap_or(LEASE_SECONDS),
                ));
                t.0.checked_add(ttl).is_ok_and(|end| end < now)
            });
            if holder != me && !expired {
                return Ok(false);
            }
            let acquire = if holder == me {
                cur.acquire_time.clone()
            } else {
                Some(MicroTime(now))
            };
            lease.spec = Some(LeaseSpec {
                acquire_time: acquire,
                lease_transitions: Some(
                    cur.lease_transitions.unwrap_or(0) + i32::from(holder != me),
                ),
                ..spec
            });
            // The resourceVersion in `lease` makes this a compare-and-swap.
            match api.replace(name, &PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
}

/// Block until this replica holds the lease, then keep renewing it in the background;
/// the returned future resolves if leadership is lost.
pub async fn lead(
    client: Client,
    namespace: &str,
    name: &str,
    me: &str,
) -> tokio::task::JoinHandle<()> {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    loop {
        match try_acquire(&api, name, me).await {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => tracing::warn!("leader election: {e}"),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    tracing::info!(identity = me, "became the leader");
    let (name, me) = (name.to_string(), me.to_string());
    tokio::spawn(async move {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(Duration::from_secs(
                u64::try_from(LEASE_SECONDS / 3).unwrap_or(5),
            ))
            .await;
            match try_acquire(&api, &name, &me).await {
                Ok(true) => last_ok = tokio::time::Instant::now(),
                Ok(false) => return,
                Err(e) => tracing::warn!("renewing the lease: {e}"),
            }
            if last_ok.elapsed()
                > Duration::from_secs(u64::try_from(LEASE_SECONDS).unwrap_or(15) * 2 / 3)
            {
                return;
            }
        }
    })
}
