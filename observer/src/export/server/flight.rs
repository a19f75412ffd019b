//! The shared collection: concurrent scrapes of `/metrics` share one
//! collection (a singleflight), run on the blocking pool one at a time and
//! counted once, its result gzipped once if any of them asked.

use std::sync::{Arc, Mutex};

use hyper::body::Bytes;
use tokio::sync::watch;

use super::{Server, body::gzip, lock};
use crate::export::registry;

/// One collection's result, shared by every request that waited for it.
pub(super) struct Collected {
    pub(super) plain: Bytes,
    /// Compressed when a request of the flight asked for gzip.
    pub(super) gzip: Option<Bytes>,
}

/// The collection under way.
pub(super) struct Flight {
    result: watch::Receiver<Option<Arc<Collected>>>,
    /// Whether any request of this flight wants gzip.
    gzip: bool,
}

impl Server {
    /// Joins the collection under way, or starts one.
    pub(super) async fn collect(self: &Arc<Self>, gzip: bool) -> Option<Arc<Collected>> {
        let mut result = {
            let mut flight = lock(&self.flight);
            match flight.as_mut() {
                Some(f) => {
                    f.gzip |= gzip;
                    f.result.clone()
                }
                None => {
                    let (tx, rx) = watch::channel(None);
                    *flight = Some(Flight {
                        result: rx.clone(),
                        gzip,
                    });
                    let me = self.clone();
                    // Detached: it completes, and is counted, even if every
                    // client waiting for it goes away.
                    tokio::task::spawn_blocking(move || me.run_collection(tx));
                    rx
                }
            }
        };
        let r = result.wait_for(Option::is_some).await.ok()?;
        r.clone()
    }

    /// One collection, on the blocking pool.
    fn run_collection(&self, tx: watch::Sender<Option<Arc<Collected>>>) {
        /// Ends the flight if the collection panics, so the next request
        /// starts a new one instead of joining a dead one.
        struct EndFlight<'a>(Option<&'a Mutex<Option<Flight>>>);
        impl Drop for EndFlight<'_> {
            fn drop(&mut self) {
                if let Some(f) = self.0 {
                    lock(f).take();
                }
            }
        }
        let mut end = EndFlight(Some(&self.flight));
        let text = lock(&self.state).scrape();
        registry::count_scrape();
        // Requests from now on start a new collection; those that joined
        // this one have said whether they want gzip.
        end.0 = None;
        let want_gzip = lock(&self.flight).take().is_some_and(|f| f.gzip);
        let plain = Bytes::from(text);
        let gzip = if want_gzip { gzip(&plain) } else { None };
        let _ = tx.send(Some(Arc::new(Collected { plain, gzip })));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::export::{
        registry::State,
        server::{bind, serve},
    };

    /// Requests that arrive while a collection runs share it: with the
    /// state held, eight scrapes come in; released, one collection answers
    /// them all with the same body.
    #[test]
    fn concurrent_scrapes_share_one_collection() {
        use std::io::{Read as _, Write as _};

        use crate::export::metrics::RenderOptions;

        let state = Arc::new(Mutex::new(State::new(
            None,
            Vec::new(),
            true,
            RenderOptions::default(),
        )));
        let (tx, rx) = std::sync::mpsc::channel();
        let served = state.clone();
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async move {
                    let l = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
                    tx.send(l.local_addr().unwrap()).unwrap();
                    serve(l, served, None).await;
                });
        });
        let addr = rx.recv().unwrap();
        let get = move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out.split_once("\r\n\r\n").unwrap().1.to_string()
        };
        get();
        let before = registry::scrapes_total();
        let held = state.lock().unwrap();
        let clients: Vec<_> = (0..8).map(|_| std::thread::spawn(get)).collect();
        // Generous: every request must have arrived and joined.
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(
            registry::scrapes_total(),
            before,
            "nothing completes while held"
        );
        drop(held);
        let bodies: Vec<String> = clients.into_iter().map(|c| c.join().unwrap()).collect();
        assert_eq!(
            registry::scrapes_total(),
            before + 1,
            "one collection for all eight"
        );
        assert!(bodies.iter().all(|b| *b == bodies[0]), "one shared result");
        assert!(bodies[0].contains("mpi_observer_scrapes_total"));
    }
}
