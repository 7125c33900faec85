//! Query strings read as the services read JSON bodies: a bad one is a field and a message,
//! for the service to answer in its own error body. (axum's `Query` answers in plain text.)

use serde::de::DeserializeOwned;

/// A query string that does not read as the route's parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadQuery {
    /// The parameter at fault, where the message names one (an unknown or repeated one, a
    /// value of the wrong kind); `query` otherwise.
    pub field: String,
    pub message: String,
}

/// Reads `query` (a request URI's query, without the `?`) as `T`; none reads as empty.
pub fn parse_query<T: DeserializeOwned>(query: Option<&str>) -> Result<T, BadQuery> {
    let pairs = form_urlencoded::parse(query.unwrap_or_default().as_bytes());
    serde_path_to_error::deserialize(serde_urlencoded::Deserializer::new(pairs)).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        // A value that failed has its path; an unknown or repeated parameter is named in the
        // message itself.
        let named = ["unknown field `", "duplicate field `", "missing field `"]
            .iter()
            .find_map(|opening| message.strip_prefix(opening))
            .and_then(|rest| rest.split('`').next());
        let field = match (path.as_str(), named) {
            (".", Some(name)) => name.to_owned(),
            (".", None) => "query".to_owned(),
            (path, _) => path.to_owned(),
        };
        BadQuery { field, message }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Params {
        at: Option<String>,
        #[serde(default)]
        now: bool,
    }

    #[test]
    fn a_bad_query_names_its_parameter() {
        let read: Params = parse_query(Some("at=5&now=true")).unwrap();
        assert_eq!((read.at.as_deref(), read.now), (Some("5"), true));
        assert_eq!(parse_query::<Params>(None).unwrap().at, None);
        let unknown = parse_query::<Params>(Some("since=-1")).unwrap_err();
        assert_eq!(unknown.field, "since", "{unknown:?}");
        let twice = parse_query::<Params>(Some("at=1&at=2")).unwrap_err();
        assert_eq!(twice.field, "at", "{twice:?}");
        let kind = parse_query::<Params>(Some("now=maybe")).unwrap_err();
        assert_eq!(kind.field, "now", "{kind:?}");
    }
}
