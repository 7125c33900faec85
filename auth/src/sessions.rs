//! Sign-in sessions of the status page. The cookie carries a random session id, never the
//! token: the token stays in the service's memory and is checked again on every request, so
//! revoking it ends its sessions. A session ends at sign-out or after its lifetime; the cookie
//! is `HttpOnly` and `SameSite=Strict`, and `Secure` when the service serves HTTPS.

use std::collections::HashMap;
use std::sync::Mutex;

/// The cookie's name.
pub const SESSION_COOKIE: &str = "gpuledger_session";

/// Sessions held at once; past it the one closest to expiring is ended.
pub const MAX_SESSIONS: usize = 10_000;

struct Session {
    token: String,
    expires_ms: i64,
}

/// The sessions a service holds, by id.
pub struct Sessions {
    lifetime_ms: i64,
    secure: bool,
    by_id: Mutex<HashMap<String, Session>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("lifetime_ms", &self.lifetime_ms)
            .field("secure", &self.secure)
            .finish_non_exhaustive()
    }
}

impl Sessions {
    /// Sessions lasting `lifetime_s`; `secure`: the service serves HTTPS, so the cookie is
    /// sent over HTTPS only.
    pub fn new(lifetime_s: u32, secure: bool) -> Self {
        Sessions {
            lifetime_ms: i64::from(lifetime_s) * 1000,
            secure,
            by_id: Mutex::new(HashMap::new()),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        self.by_id.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a session for `token` (already checked) at `now_ms`; its id.
    pub fn open(&self, token: &str, now_ms: i64) -> crate::Result<String> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| crate::Error::Random(e.to_string()))?;
        let id = hex::encode(bytes);
        let mut held = self.held();
        held.retain(|_, s| s.expires_ms > now_ms);
        if held.len() >= MAX_SESSIONS {
            let soonest = held
                .iter()
                .min_by_key(|(_, s)| s.expires_ms)
                .map(|(id, _)| id.clone());
            if let Some(soonest) = soonest {
                held.remove(&soonest);
            }
        }
        held.insert(
            id.clone(),
            Session {
                token: token.to_owned(),
                expires_ms: now_ms.saturating_add(self.lifetime_ms),
            },
        );
        Ok(id)
    }

    /// The token of a session that has not expired at `now_ms`.
    pub fn token(&self, id: &str, now_ms: i64) -> Option<String> {
        let mut held = self.held();
        match held.get(id) {
            Some(s) if s.expires_ms > now_ms => Some(s.token.clone()),
            Some(_) => {
                held.remove(id);
                None
            }
            None => None,
        }
    }

    /// Ends a session (sign-out); an unknown id is ignored.
    pub fn close(&self, id: &str) {
        self.held().remove(id);
    }

    /// The `Set-Cookie` value that gives a browser session `id`.
    pub fn set_cookie(&self, id: &str) -> String {
        self.cookie(id, self.lifetime_ms / 1000)
    }

    /// The `Set-Cookie` value that clears it.
    pub fn clear_cookie(&self) -> String {
        self.cookie("", 0)
    }

    fn cookie(&self, value: &str, max_age_s: i64) -> String {
        let secure = if self.secure { "; Secure" } else { "" };
        format!("{SESSION_COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age_s}{secure}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_holds_its_token_until_it_expires_or_is_closed() {
        let sessions = Sessions::new(60, false);
        let id = sessions.open("gpl_x_y", 1_000).unwrap();
        assert_eq!(id.len(), 64);
        assert!(!id.contains("gpl_"));
        assert_eq!(sessions.token(&id, 60_999).as_deref(), Some("gpl_x_y"));
        assert_eq!(sessions.token(&id, 61_000), None, "expired");
        let other = sessions.open("gpl_x_y", 1_000).unwrap();
        assert_ne!(other, id);
        sessions.close(&other);
        assert_eq!(sessions.token(&other, 2_000), None, "signed out");
        assert_eq!(sessions.token("nonsense", 2_000), None);
    }

    #[test]
    fn the_cookie_is_secure_over_https_and_never_lasts_past_the_session() {
        let plain = Sessions::new(43_200, false).set_cookie("abc");
        assert_eq!(
            plain,
            "gpuledger_session=abc; Path=/; HttpOnly; SameSite=Strict; Max-Age=43200"
        );
        let secure = Sessions::new(600, true);
        assert_eq!(
            secure.set_cookie("abc"),
            "gpuledger_session=abc; Path=/; HttpOnly; SameSite=Strict; Max-Age=600; Secure"
        );
        assert!(secure.clear_cookie().contains("Max-Age=0; Secure"));
    }

    #[test]
    fn past_the_most_sessions_the_one_closest_to_expiring_ends() {
        let sessions = Sessions::new(60, false);
        let first = sessions.open("t", 0).unwrap();
        for k in 1..MAX_SESSIONS {
            sessions.open("t", k as i64).unwrap();
        }
        let newest = sessions.open("t", MAX_SESSIONS as i64).unwrap();
        assert_eq!(sessions.token(&first, 10), None);
        assert!(sessions.token(&newest, 10).is_some());
    }
}
