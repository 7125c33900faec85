//! Who holds a service's connections, so that one client cannot keep the others out: at most
//! `per_client` connections from one client (an IPv4 address, or an IPv6 /64, which one host
//! usually holds whole) and `total` in all.
//!
//! A connection between requests (waiting for a TLS hello, for a request's headers, or idle on
//! keep-alive) holds its slot only until someone needs it: a new connection that would pass a
//! limit takes the place of the oldest such connection, from its own client when it is at its
//! client's limit, else from the client holding the most. Only when every connection it could
//! displace is in the middle of a request is it refused. So half-sent requests, however many
//! and from however few addresses, keep nobody out; they only churn among themselves.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// The client a connection counts against: an IPv4 address, or the /64 of an IPv6 one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ClientKey(u128);

impl ClientKey {
    pub(crate) fn of(addr: IpAddr) -> Self {
        match addr.to_canonical() {
            IpAddr::V4(v4) => ClientKey(u128::from(u32::from(v4))),
            // The top bit set keeps a /64 apart from every IPv4 address.
            IpAddr::V6(v6) => ClientKey((u128::from(v6) >> 64) | (1 << 127)),
        }
    }
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Its client holds `per_client` connections, each in a request.
    ClientFull,
    /// The service holds `total` connections, each in a request.
    ServiceFull,
}

/// What one connection shares with the registry: whether it is in a request, and the signal
/// that tells it to give its slot up.
#[derive(Default)]
pub(crate) struct Activity {
    requests: AtomicUsize,
    evicted: Notify,
}

impl Activity {
    /// Marks a request begun; the request ends when the returned guard drops.
    pub(crate) fn begin_request(self: &Arc<Self>) -> InRequest {
        self.requests.fetch_add(1, Ordering::AcqRel);
        InRequest(Arc::clone(self))
    }

    pub(crate) fn in_request(&self) -> bool {
        self.requests.load(Ordering::Acquire) > 0
    }

    /// Resolves when the registry gave this connection's slot to another.
    pub(crate) async fn evicted(&self) {
        self.evicted.notified().await;
    }
}

pub(crate) struct InRequest(Arc<Activity>);

impl Drop for InRequest {
    fn drop(&mut self) {
        self.0.requests.fetch_sub(1, Ordering::AcqRel);
    }
}

struct Entry {
    id: u64,
    activity: Arc<Activity>,
}

#[derive(Default)]
struct Held {
    next_id: u64,
    open: usize,
    /// Each client's connections, oldest first.
    by_client: HashMap<ClientKey, Vec<Entry>>,
}

/// The connections a service holds. Cheap to share; every method takes one short lock.
pub(crate) struct Registry {
    per_client: usize,
    total: usize,
    held: Mutex<Held>,
}

/// A connection's slot: released when dropped (the connection ended, or was evicted).
pub(crate) struct Slot {
    registry: Arc<Registry>,
    client: ClientKey,
    id: u64,
    pub(crate) activity: Arc<Activity>,
}

/// The outcome of admitting one connection.
pub(crate) struct Admitted {
    pub(crate) slot: Slot,
    /// Whether an idle connection was told to give its place up for this one.
    pub(crate) displaced: bool,
}

impl Registry {
    pub(crate) fn new(per_client: usize, total: usize) -> Arc<Self> {
        Arc::new(Registry {
            per_client: per_client.max(1),
            total: total.max(1),
            held: Mutex::new(Held::default()),
        })
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives a new connection from `client` a slot, displacing an idle connection when a
    /// limit is reached, or says why it cannot have one.
    pub(crate) fn admit(self: &Arc<Self>, client: ClientKey) -> Result<Admitted, Refusal> {
        let mut held = self.held();
        let own = held.by_client.get(&client).map_or(0, Vec::len);
        let mut displaced = false;
        if own >= self.per_client {
            if !evict_oldest_idle(&mut held, client) {
                return Err(Refusal::ClientFull);
            }
            displaced = true;
        } else if held.open >= self.total {
            let Some(heaviest) = heaviest_with_an_idle_connection(&held) else {
                return Err(Refusal::ServiceFull);
            };
            evict_oldest_idle(&mut held, heaviest);
            displaced = true;
        }
        let id = held.next_id;
        held.next_id += 1;
        held.open += 1;
        let activity = Arc::new(Activity::default());
        held.by_client.entry(client).or_default().push(Entry {
            id,
            activity: Arc::clone(&activity),
        });
        Ok(Admitted {
            slot: Slot {
                registry: Arc::clone(self),
                client,
                id,
                activity,
            },
            displaced,
        })
    }

    #[cfg(test)]
    fn open(&self) -> usize {
        self.held().open
    }
}

/// The client holding the most connections among those with one not in a request; of equals,
/// the one whose idle connection is the oldest.
fn heaviest_with_an_idle_connection(held: &Held) -> Option<ClientKey> {
    held.by_client
        .iter()
        .filter_map(|(key, entries)| {
            let oldest_idle = entries.iter().find(|e| !e.activity.in_request())?;
            Some((entries.len(), std::cmp::Reverse(oldest_idle.id), *key))
        })
        .max_by_key(|&(count, oldest, _)| (count, oldest))
        .map(|(_, _, key)| key)
}

/// Takes the oldest of `client`'s connections that is not in a request out of the registry
/// and tells it to close; false when every one is in a request.
fn evict_oldest_idle(held: &mut Held, client: ClientKey) -> bool {
    let Some(entries) = held.by_client.get_mut(&client) else {
        return false;
    };
    let Some(index) = entries.iter().position(|e| !e.activity.in_request()) else {
        return false;
    };
    let victim = entries.remove(index);
    if entries.is_empty() {
        held.by_client.remove(&client);
    }
    held.open -= 1;
    victim.activity.evicted.notify_one();
    true
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.registry.held();
        let Some(entries) = held.by_client.get_mut(&self.client) else {
            return;
        };
        // An evicted connection's entry is already gone.
        let Some(index) = entries.iter().position(|e| e.id == self.id) else {
            return;
        };
        entries.remove(index);
        if entries.is_empty() {
            held.by_client.remove(&self.client);
        }
        held.open -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the registry told this connection to give its place up.
    fn told_to_go(admitted: &Admitted) -> bool {
        admitted
            .slot
            .activity
            .evicted
            .notified()
            .now_or_never()
            .is_some()
    }

    fn client(last: u8) -> ClientKey {
        ClientKey::of(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn an_ipv6_client_is_its_64_and_never_an_ipv4_address() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(ClientKey::of(a), ClientKey::of(b));
        assert_ne!(ClientKey::of(a), ClientKey::of(c));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(ClientKey::of(mapped), client(1));
        let low: IpAddr = "::a00:1".parse().unwrap();
        assert_ne!(ClientKey::of(low), client(1));
    }

    #[test]
    fn a_client_at_its_limit_displaces_its_own_oldest_idle_connection() {
        let registry = Registry::new(2, 10);
        let first = registry.admit(client(1)).unwrap();
        let second = registry.admit(client(1)).unwrap();
        let _busy = first.slot.activity.begin_request();
        let third = registry.admit(client(1)).unwrap();
        assert!(third.displaced);
        // The first is in a request, so the second gave its place up.
        assert!(!told_to_go(&first));
        assert!(told_to_go(&second));
        assert_eq!(registry.open(), 2);
        drop(second);
        assert_eq!(registry.open(), 2, "an evicted slot is not released twice");
        // Now both are in requests: the next is refused.
        let _also_busy = third.slot.activity.begin_request();
        assert_eq!(registry.admit(client(1)).err(), Some(Refusal::ClientFull));
        // Another client is not affected.
        assert!(!registry.admit(client(2)).unwrap().displaced);
    }

    #[test]
    fn at_the_total_the_client_holding_the_most_gives_way() {
        let registry = Registry::new(10, 4);
        let heavy: Vec<Admitted> = (0..3).map(|_| registry.admit(client(1)).unwrap()).collect();
        let light = registry.admit(client(2)).unwrap();
        let newcomer = registry.admit(client(3)).unwrap();
        assert!(newcomer.displaced);
        assert!(!told_to_go(&light));
        assert!(told_to_go(&heavy[0]));
        assert_eq!(registry.open(), 4);
        let _busy: Vec<InRequest> = [&heavy[1], &heavy[2], &light, &newcomer]
            .iter()
            .map(|a| a.slot.activity.begin_request())
            .collect();
        assert_eq!(registry.admit(client(4)).err(), Some(Refusal::ServiceFull));
        drop(light);
        assert!(!registry.admit(client(4)).unwrap().displaced);
    }

    use futures_util_now::NowOrNever;
    mod futures_util_now {
        use std::future::Future;
        use std::pin::pin;
        use std::task::{Context, Poll, Waker};

        /// Polls a future once: Some if it was ready.
        pub(super) trait NowOrNever: Future + Sized {
            fn now_or_never(self) -> Option<Self::Output> {
                let mut future = pin!(self);
                match future
                    .as_mut()
                    .poll(&mut Context::from_waker(Waker::noop()))
                {
                    Poll::Ready(v) => Some(v),
                    Poll::Pending => None,
                }
            }
        }
        impl<F: Future> NowOrNever for F {}
    }
}
