//! Leader election on a `coordination.k8s.io` Lease, so two operator replicas never
//! reconcile at once: the holder renews the lease; another replica takes it over once it
//! expired or was released. A leader that cannot renew in time stops, and Kubernetes restarts
//! it as a follower. A leader that stops on SIGTERM releases the lease (empty holder, as
//! client-go's `ReleaseOnCancel` does), so a follower takes over at its next try instead of
//! after the lease duration.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, PostParams};
use std::time::Duration;

pub const LEASE_SECONDS: i32 = 15;
/// How often a follower tries to take the lease: how soon it leads after a release.
pub const RETRY: Duration = Duration::from_secs(2);

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
            if !may_take(&cur, me, now) {
                return Ok(false);
            }
            let holder = cur.holder_identity.clone().unwrap_or_default();
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

/// Whether `me` may hold the lease now: it is `me`'s, released (no holder), or expired.
fn may_take(cur: &LeaseSpec, me: &str, now: Timestamp) -> bool {
    let holder = cur.holder_identity.as_deref().unwrap_or_default();
    let expired = cur.renew_time.as_ref().is_none_or(|t| {
        let ttl = SignedDuration::from_secs(i64::from(
            cur.lease_duration_seconds.unwrap_or(LEASE_SECONDS),
        ));
        t.0.checked_add(ttl).is_ok_and(|end| end < now)
    });
    holder == me || holder.is_empty() || expired
}

/// Give the lease up if `me` holds it: true if it was released. The holder is cleared, so
/// the next replica that tries takes it at once.
pub async fn release(api: &Api<Lease>, name: &str, me: &str) -> Result<bool, kube::Error> {
    let Some(mut lease) = api.get_opt(name).await? else {
        return Ok(false);
    };
    let cur = lease.spec.clone().unwrap_or_default();
    if cur.holder_identity.as_deref() != Some(me) {
        return Ok(false);
    }
    let now = MicroTime(Timestamp::now());
    lease.spec = Some(LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        acquire_time: Some(now.clone()),
        renew_time: Some(now),
        ..cur
    });
    // Compare-and-swap: a lease someone took meanwhile is not ours to clear.
    match api.replace(name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// This replica's leadership: the lease is renewed in the background until it is lost or
/// released.
pub struct Leadership {
    api: Api<Lease>,
    name: String,
    me: String,
    renewing: tokio::task::JoinHandle<()>,
}

impl Leadership {
    /// Resolves when the lease is lost (another replica holds it, or it could not be
    /// renewed in time).
    pub async fn lost(&mut self) {
        let _ = (&mut self.renewing).await;
    }

    /// Stop renewing and release the lease, so a follower leads at once.
    pub async fn release(mut self) -> Result<bool, kube::Error> {
        if !self.renewing.is_finished() {
            self.renewing.abort();
            let _ = (&mut self.renewing).await;
        }
        release(&self.api, &self.name, &self.me).await
    }
}

/// Block until this replica holds the lease, then keep renewing it in the background.
pub async fn lead(client: Client, namespace: &str, name: &str, me: &str) -> Leadership {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    loop {
        match try_acquire(&api, name, me).await {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => tracing::warn!("leader election: {e}"),
        }
        tokio::time::sleep(RETRY).await;
    }
    tracing::info!(identity = me, "became the leader");
    let renewing = tokio::spawn({
        let (api, name, me) = (api.clone(), name.to_string(), me.to_string());
        async move {
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
        }
    });
    Leadership {
        api,
        name: name.to_string(),
        me: me.to_string(),
        renewing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_or_expired_lease_may_be_taken_a_held_one_not() {
        let now: Timestamp = "2026-01-01T00:00:10Z".parse().expect("time");
        let lease = |holder: Option<&str>, renewed: &str, seconds: i32| LeaseSpec {
            holder_identity: holder.map(str::to_string),
            renew_time: Some(MicroTime(renewed.parse().expect("time"))),
            lease_duration_seconds: Some(seconds),
            ..Default::default()
        };
        let fresh = "2026-01-01T00:00:05Z";
        assert!(!may_take(&lease(Some("a"), fresh, 15), "b", now));
        assert!(may_take(&lease(Some("b"), fresh, 15), "b", now));
        // What `release` leaves: no holder, renewed just now.
        assert!(may_take(&lease(None, "2026-01-01T00:00:10Z", 1), "b", now));
        assert!(may_take(&lease(Some(""), fresh, 15), "b", now));
        assert!(may_take(
            &lease(Some("a"), "2026-01-01T00:00:00Z", 5),
            "b",
            now
        ));
    }
}
