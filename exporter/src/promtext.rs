//! A parser of the Prometheus text exposition format (0.0.4, and the OpenMetrics subset
//! exporters emit), enough to read a dcgm-exporter page: samples with labels and values,
//! comments skipped. Every error names the line.

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A line that is not a sample.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Parses a whole page. `# EOF` (OpenMetrics) ends it.
pub fn parse(text: &str) -> Result<Vec<Sample>, ParseError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line == "# EOF" {
            break;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(parse_line(line).map_err(|message| ParseError {
            line: i + 1,
            message,
        })?);
    }
    Ok(out)
}

fn parse_line(line: &str) -> Result<Sample, String> {
    let name_end = line
        .char_indices()
        .find(|(_, c)| !is_name_char(*c))
        .map_or(line.len(), |(i, _)| i);
    let name = &line[..name_end];
    if !name.starts_with(is_name_start) {
        return Err(format!(
            "`{}` does not start with a metric name",
            short(line)
        ));
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let (parsed, remaining) = parse_labels(after)?;
        labels = parsed;
        rest = remaining;
    }
    let mut fields = rest.split_whitespace();
    let value_text = fields
        .next()
        .ok_or_else(|| format!("`{name}` has no value"))?;
    let value = parse_value(value_text)
        .ok_or_else(|| format!("`{name}`: `{value_text}` is not a number"))?;
    if let Some(ts) = fields.next() {
        ts.parse::<f64>()
            .map_err(|_| format!("`{name}`: `{ts}` is not a timestamp"))?;
    }
    if fields.next().is_some() {
        return Err(format!("`{name}`: unexpected text after the value"));
    }
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

fn parse_value(text: &str) -> Option<f64> {
    match text {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        t => t.parse().ok(),
    }
}

fn short(text: &str) -> String {
    text.chars().take(60).collect()
}

type Labels = Vec<(String, String)>;

/// Parses `k="v",k2="v2"}` and returns the labels and what follows the `}`.
fn parse_labels(mut s: &str) -> Result<(Labels, &str), String> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start();
        if let Some(rest) = s.strip_prefix('}') {
            return Ok((labels, rest));
        }
        let key_end = s
            .char_indices()
            .find(|(_, c)| !is_name_char(*c))
            .map(|(i, _)| i)
            .ok_or("labels end before `}` (truncated line?)")?;
        let key = &s[..key_end];
        if key.is_empty() {
            return Err(format!("expected a label name at `{}`", short(s)));
        }
        s = s[key_end..]
            .trim_start()
            .strip_prefix('=')
            .ok_or_else(|| format!("label `{key}` has no `=`"))?
            .trim_start()
            .strip_prefix('"')
            .ok_or_else(|| format!("label `{key}`'s value is not quoted"))?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            match chars.next() {
                None => {
                    return Err(format!(
                        "label `{key}`'s value is not closed (truncated line?)"
                    ))
                }
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => return Err(format!("label `{key}` ends in an escape")),
                },
                Some((_, c)) => value.push(c),
            }
        };
        labels.push((key.to_owned(), value));
        s = s[end + 1..].trim_start();
        if let Some(rest) = s.strip_prefix(',') {
            s = rest;
        } else if !s.starts_with('}') {
            return Err(format!("expected `,` or `}}` after label `{key}`"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_with_labels_escapes_and_timestamps() {
        let page = "# HELP x help\n# TYPE x gauge\nx{a=\"1\",b=\"q\\\"uote\\\\\"} 2.5 1700000000000\ny 3\nz{} NaN\n";
        let s = parse(page).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].label("b"), Some("q\"uote\\"));
        assert_eq!(s[0].value, 2.5);
        assert_eq!(s[1].name, "y");
        assert!(s[2].value.is_nan());
    }

    #[test]
    fn a_truncated_line_is_named() {
        let page = "x{a=\"1\"} 2\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UU";
        let e = parse(page).unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("truncated"), "{e}");
        assert_eq!(parse("x{a=\"1\"}\n").unwrap_err().line, 1);
        assert!(parse("x 12abc\n").is_err());
    }
}
