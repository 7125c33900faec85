//! SIGTERM and SIGINT (Ctrl-C): a service stops accepting, finishes what it holds, and exits.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::{Error, Result};

/// Installs the SIGTERM and SIGINT handlers now and returns a future that resolves on
/// either. Installing before the service announces itself matters: a signal that arrived
/// in between would otherwise take the default action and kill the process unflushed.
/// Must be called inside the runtime.
pub fn shutdown_signal() -> Result<impl Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term =
            signal(SignalKind::terminate()).map_err(|e| Error::io("listening for SIGTERM", e))?;
        let mut int =
            signal(SignalKind::interrupt()).map_err(|e| Error::io("listening for SIGINT", e))?;
        Ok(async move {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
        })
    }
    #[cfg(not(unix))]
    Ok(async move {
        let _ = tokio::signal::ctrl_c().await;
    })
}

/// For a service without a runtime of its own: a flag that turns true on SIGTERM or SIGINT.
/// The handlers are installed before this returns.
pub fn stop_flag() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
    let set = Arc::clone(&flag);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = ready_tx.send(Err(Error::io("starting the signal thread", e)));
                    return;
                }
            };
            runtime.block_on(async move {
                match shutdown_signal() {
                    Ok(signal) => {
                        let _ = ready_tx.send(Ok(()));
                        signal.await;
                        set.store(true, Ordering::Relaxed);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            });
        })
        .map_err(|e| Error::io("starting the signal thread", e))?;
    ready_rx
        .recv()
        .map_err(|_| Error::Usage("the signal thread ended".into()))??;
    Ok(flag)
}
