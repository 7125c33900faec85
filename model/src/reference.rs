//! The configuration reference (`docs/configuration.md`), generated from the config types
//! themselves: their JSON Schema (serde's names, defaults and required keys, the doc comments
//! as descriptions) rendered as one table per TOML table. A test keeps the checked-in file equal
//! to what this renders, so the reference cannot drift from the code. The value types that
//! are strings in TOML (durations, sizes, ids, GPU models, currencies) describe themselves here.

use std::borrow::Cow;
use std::collections::BTreeSet;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde_json::{Map, Value};

use crate::config::ClusterConfig;
use crate::gpu::{GpuModel, GpuType};
use crate::ids::{AccountId, NodeId, ProjectId};
use crate::money::Currency;
use crate::units::{ByteSize, DurationSpec};

fn string_schema(format: &str, description: &str) -> Schema {
    json_schema!({ "type": "string", "format": format, "description": description })
}

macro_rules! string_schema {
    ($ty:ty, $name:literal, $description:expr) => {
        impl JsonSchema for $ty {
            fn schema_name() -> Cow<'static, str> {
                $name.into()
            }
            fn inline_schema() -> bool {
                true
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                string_schema($name, &$description)
            }
        }
    };
}

string_schema!(
    DurationSpec,
    "duration",
    "a duration: whole numbers with units `s`, `m`, `h`, `d` (`90s`, `1h30m`, `7d`)"
);
string_schema!(
    ByteSize,
    "size",
    "a size in bytes, with an SI or IEC unit (`500TB`, `10GiB`)"
);
const ID: &str = "letters, digits, `.`, `_` and `-`, not starting with `.`";
string_schema!(AccountId, "account id", format!("an account id: {ID}"));
string_schema!(ProjectId, "project id", format!("a project id: {ID}"));
string_schema!(NodeId, "node id", format!("a node name: {ID}"));
string_schema!(
    GpuModel,
    "GPU model",
    format!(
        "a GPU model: {}",
        GpuModel::ALL
            .iter()
            .map(|m| format!("`{}`", m.key()))
            .collect::<Vec<_>>()
            .join(", ")
    )
);
string_schema!(
    GpuType,
    "GPU type",
    "a GPU type: a model's key, or a site's own name (Slurm's GRES type): 1 to 32 letters, \
     digits, `.`, `_` and `-`"
);
string_schema!(
    Currency,
    "currency",
    "an ISO 4217 code: `CNY`, `USD`, `EUR`, `JPY`"
);

/// What a TOML table holds, for one section of the reference.
struct Section {
    /// `[cluster]`, `[[accounts]]`, `accounts.quota`, ...
    heading: String,
    schema: Map<String, Value>,
    /// The table's keys' defaults when the whole table has one (`[scheduler]`).
    defaults: Option<Value>,
}

/// The schema a property's value has, past `Option` (anyOf with null) and `$ref`.
fn resolve<'a>(value: &'a Value, defs: &'a Map<String, Value>) -> &'a Value {
    if let Some(r) = value.get("$ref").and_then(Value::as_str) {
        if let Some(d) = defs.get(r.trim_start_matches("#/$defs/")) {
            return resolve(d, defs);
        }
    }
    if let Some(any) = value.get("anyOf").and_then(Value::as_array) {
        if let Some(v) = any
            .iter()
            .find(|v| v.get("type") != Some(&Value::from("null")))
        {
            return resolve(v, defs);
        }
    }
    value
}

/// A property's type in words.
fn type_of(value: &Value, defs: &Map<String, Value>) -> String {
    let v = resolve(value, defs);
    if let Some(values) = enum_values(v) {
        return format!("one of {}", values.join(", "));
    }
    let types: Vec<&str> = match v.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .filter(|t| *t != "null")
            .collect(),
        _ => Vec::new(),
    };
    match types.first().copied() {
        Some("array") => match v.get("items") {
            Some(items) if is_table(items, defs) => "array of tables".into(),
            Some(items) => format!("array of {}", type_of(items, defs)),
            None => "array".into(),
        },
        Some("object") if v.get("properties").is_none() => {
            let of = v
                .get("additionalProperties")
                .map(|a| type_of(a, defs))
                .unwrap_or_default();
            format!("table of {of}")
        }
        Some("object") => "table".into(),
        Some("string") => v
            .get("format")
            .and_then(Value::as_str)
            .unwrap_or("string")
            .to_owned(),
        Some(t) => t.into(),
        None => "value".into(),
    }
}

/// The strings an enum may take, quoted.
fn enum_values(v: &Value) -> Option<Vec<String>> {
    if let Some(e) = v.get("enum").and_then(Value::as_array) {
        return Some(
            e.iter()
                .map(|x| format!("`{}`", x.as_str().unwrap_or("")))
                .collect(),
        );
    }
    let one_of = v.get("oneOf").and_then(Value::as_array)?;
    let mut out = Vec::new();
    for o in one_of {
        if let Some(c) = o.get("const").and_then(Value::as_str) {
            out.push(format!("`{c}`"));
        } else if let Some(e) = o.get("enum").and_then(Value::as_array) {
            out.extend(e.iter().map(|x| format!("`{}`", x.as_str().unwrap_or(""))));
        } else {
            return None;
        }
    }
    Some(out)
}

/// A property whose value is a table of named keys (its own section).
fn is_table(value: &Value, defs: &Map<String, Value>) -> bool {
    let v = resolve(value, defs);
    v.get("properties").is_some()
}

fn one_line(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
        .replace("[`", "`")
        .replace("`]", "`")
}

/// A default as TOML would write it.
fn toml_value(v: &Value) -> String {
    match v {
        Value::String(s) => format!("`\"{s}\"`"),
        Value::Null => "none".into(),
        Value::Array(a) if a.is_empty() => "`[]`".into(),
        other => format!("`{other}`"),
    }
}

fn render_section(
    out: &mut String,
    section: &Section,
    defs: &Map<String, Value>,
    queue: &mut Vec<Section>,
) {
    out.push_str(&format!("\n## `{}`\n\n", section.heading));
    if let Some(d) = section.schema.get("description").and_then(Value::as_str) {
        out.push_str(&one_line(d));
        out.push_str("\n\n");
    }
    let required: BTreeSet<&str> = section
        .schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let defaults = section
        .defaults
        .as_ref()
        .or_else(|| section.schema.get("default"));
    out.push_str("| key | type | default | what it is |\n|---|---|---|---|\n");
    let Some(properties) = section.schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (key, value) in properties {
        let resolved = resolve(value, defs);
        let given = value
            .get("default")
            .or_else(|| defaults.and_then(|d| d.get(key)));
        let default =
            if is_table(value, defs) || resolved.get("items").is_some_and(|i| is_table(i, defs)) {
                if required.contains(key.as_str()) {
                    "required; its section below".to_owned()
                } else {
                    "its section below".to_owned()
                }
            } else if let Some(d) = given {
                toml_value(d)
            } else if required.contains(key.as_str()) {
                "required".to_owned()
            } else {
                "none".to_owned()
            };
        let description = value
            .get("description")
            .or_else(|| resolved.get("description"))
            .and_then(Value::as_str)
            .map(one_line)
            .unwrap_or_default();
        out.push_str(&format!(
            "| `{key}` | {} | {default} | {description} |\n",
            type_of(value, defs)
        ));
        let table = |heading: String, schema: &Value| -> Option<Section> {
            let v = resolve(schema, defs);
            v.get("properties").is_some().then(|| Section {
                heading,
                schema: v.as_object().cloned().unwrap_or_default(),
                defaults: given.filter(|d| d.is_object()).cloned(),
            })
        };
        let inner = section.heading.trim_matches(['[', ']']);
        let path = if section.heading == "(top level)" {
            key.clone()
        } else {
            format!("{inner}.{key}")
        };
        if let Some(items) = resolved.get("items") {
            if let Some(s) = table(format!("[[{path}]]"), items) {
                queue.push(s);
            }
        } else if let Some(s) = table(format!("[{path}]"), value) {
            queue.push(s);
        }
    }
}

/// `docs/configuration.md`: every key of the cluster config, table by table, with its type,
/// default and description.
pub fn configuration_reference() -> String {
    let schema = SchemaGenerator::default().into_root_schema_for::<ClusterConfig>();
    let root = schema.as_object().cloned().unwrap_or_default();
    let defs = root
        .get("$defs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from the config types by `gpuledger config-reference` (a test keeps this file\n\
         current); `gpuledger check-config FILE` checks a file against them, naming file, line\n\
         and key. `examples/seed-cluster.toml` is a complete cluster config. Unknown keys are\n\
         errors everywhere.\n",
    );
    let mut queue = vec![Section {
        heading: "(top level)".into(),
        schema: root.clone(),
        defaults: None,
    }];
    let mut i = 0;
    while i < queue.len() {
        let mut found = Vec::new();
        let section = Section {
            heading: queue[i].heading.clone(),
            schema: queue[i].schema.clone(),
            defaults: queue[i].defaults.clone(),
        };
        render_section(&mut out, &section, &defs, &mut found);
        queue.extend(found);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_configuration_md_is_what_the_types_say() {
        let checked_in = include_str!("../../docs/configuration.md");
        assert!(
            checked_in == configuration_reference(),
            "docs/configuration.md is out of date: run `gpuledger config-reference > docs/configuration.md`"
        );
    }

    #[test]
    fn the_reference_names_every_section_and_key_with_defaults() {
        let text = configuration_reference();
        for needle in [
            "## `[cluster]`",
            "## `[[node_pools]]`",
            "## `[[accounts]]`",
            "## `[accounts.quota]`",
            "## `[[accounts.projects]]`",
            "## `[scheduler]`",
            "| `max_gpus` |",
            "| `half_life` | duration | `\"7d\"` |",
            "| `quota` | table | its section below |",
            "one of `fair_tree`, `weighted`, `slurm_classic`",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }
}
