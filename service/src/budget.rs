//! One budget of buffered request bytes per service, so memory stays bounded whatever the
//! number of connections: a request with a body takes its share of the budget (its
//! `content-length`, or the largest body the service takes when it gives none) before a byte of
//! the body is read, and gives it back once answered. Past the budget a request is told 503
//! with `Retry-After` at once; a body declared larger than the service takes is told 413 at
//! once. The services run this after their own check of the caller's token, so an anonymous
//! client never holds any of the budget.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gpuledger_model::units::ByteSize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget is counted in KiB.
const UNIT: u64 = 1024;

/// The request bytes a service holds at once, and the largest body it takes.
#[derive(Clone, Debug)]
pub struct BodyBudget {
    permits: Arc<Semaphore>,
    total: ByteSize,
    max_body: u64,
}

impl BodyBudget {
    /// `total` bytes in all, bodies of at most `max_body` bytes each.
    pub fn new(total: ByteSize, max_body: u64) -> Self {
        let units = total.0.div_ceil(UNIT).min(Semaphore::MAX_PERMITS as u64) as usize;
        BodyBudget {
            permits: Arc::new(Semaphore::new(units)),
            total,
            max_body,
        }
    }

    /// What a request may hold: `Ok(None)` for one without a body.
    pub fn admit(&self, headers: &HeaderMap) -> Result<Option<OwnedSemaphorePermit>, Refused> {
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let chunked = headers.contains_key(header::TRANSFER_ENCODING);
        let bytes = match declared {
            Some(n) => n,
            None if chunked => self.max_body,
            // No length and no chunks: no body.
            None => 0,
        };
        if bytes == 0 {
            return Ok(None);
        }
        if bytes > self.max_body {
            return Err(Refused::TooLarge {
                bytes,
                max: self.max_body,
            });
        }
        let units = bytes.div_ceil(UNIT).min(u32::MAX as u64) as u32;
        Arc::clone(&self.permits)
            .try_acquire_many_owned(units)
            .map(Some)
            .map_err(|_| {
                tracing::warn!(
                    bytes,
                    budget_bytes = self.total.0,
                    "request refused: the buffered-bytes budget is in use"
                );
                Refused::OverBudget { total: self.total }
            })
    }

    /// Bytes of the budget free now.
    pub fn available_bytes(&self) -> u64 {
        self.permits.available_permits() as u64 * UNIT
    }
}

/// Why a request was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Its body is declared larger than the service takes (413).
    TooLarge { bytes: u64, max: u64 },
    /// The budget is in use (503, Retry-After: 1).
    OverBudget { total: ByteSize },
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            Refused::TooLarge { bytes, max } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("a body of {bytes} bytes is more than the {max} this service takes"),
            ),
            Refused::OverBudget { total } => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the service holds as many request bytes as it may ({total}); try again shortly"
                ),
            ),
        };
        let mut r = (status, Json(serde_json::json!({ "error": message }))).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        r
    }
}

/// The middleware: admits a request against the budget before its body is read, and holds its
/// share until it is answered.
pub async fn hold_body_budget(
    State(budget): State<BodyBudget>,
    request: Request,
    next: Next,
) -> Response {
    match budget.admit(request.headers()) {
        Ok(permit) => {
            let response = next.run(request).await;
            drop(permit);
            response
        }
        Err(refused) => refused.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_length(n: u64) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, n.to_string().parse().unwrap());
        h
    }

    #[test]
    fn bodies_take_their_share_until_the_budget_is_spent() {
        let budget = BodyBudget::new(ByteSize(8 << 20), 4 << 20);
        let first = budget.admit(&with_length(3 << 20)).unwrap();
        let second = budget.admit(&with_length(3 << 20)).unwrap();
        assert!(first.is_some() && second.is_some());
        let refused = budget
            .admit(&with_length(3 << 20))
            .unwrap_err()
            .into_response();
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
        assert!(
            budget.admit(&HeaderMap::new()).unwrap().is_none(),
            "no body, no share"
        );
        drop(first);
        assert!(budget.admit(&with_length(3 << 20)).is_ok());
        let too_big = budget.admit(&with_length(5 << 20)).unwrap_err();
        assert_eq!(
            too_big,
            Refused::TooLarge {
                bytes: 5 << 20,
                max: 4 << 20
            }
        );
        assert_eq!(
            too_big.into_response().status(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
        let mut chunked = HeaderMap::new();
        chunked.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        drop(second);
        let whole = budget.admit(&chunked).unwrap();
        assert!(
            whole.is_some(),
            "a body of unknown length takes the largest share"
        );
        assert_eq!(budget.available_bytes(), (8 << 20) - (4 << 20));
    }
}
