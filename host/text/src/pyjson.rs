//! JSON written the way Python's `json.dumps` writes it, which is what the
//! `tojson` filter of transformers' chat templates does: `", "` and `": "`
//! separators (`","` between items when indented), non-ASCII kept, no HTML
//! escaping, keys in their given order unless sorted. Tool-using models were
//! trained on prompts rendered this way, so a template's `tools | tojson`
//! must give the same text here.
use serde_json::Value;

/// `json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=sort_keys)`.
pub fn dumps(v: &Value, indent: Option<usize>, sort_keys: bool) -> String {
    let mut out = String::new();
    write(&mut out, v, indent, sort_keys, 0);
    out
}

fn newline(out: &mut String, indent: Option<usize>, level: usize) {
    if let Some(n) = indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', n * level));
    }
}

fn write(out: &mut String, v: &Value, indent: Option<usize>, sort_keys: bool, level: usize) {
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        Value::Array(a) if !a.is_empty() => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, indent, level + 1);
                write(out, x, indent, sort_keys, level + 1);
            }
            newline(out, indent, level);
            out.push(']');
        }
        Value::Object(o) if !o.is_empty() => {
            let mut entries: Vec<(&String, &Value)> = o.iter().collect();
            if sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, x)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, indent, level + 1);
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(": ");
                write(out, x, indent, sort_keys, level + 1);
            }
            newline(out, indent, level);
            out.push('}');
        }
        // Scalars and empty containers: serde_json writes them as Python does.
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn writes_as_python_json_dumps() {
        let v = json!({"b": [1, 2.5, "é<"], "a": {}, "c": null, "d": [], "e": true});
        // json.dumps(v, ensure_ascii=False)
        assert_eq!(
            dumps(&v, None, false),
            r#"{"b": [1, 2.5, "é<"], "a": {}, "c": null, "d": [], "e": true}"#
        );
        assert_eq!(
            dumps(&v, None, true),
            r#"{"a": {}, "b": [1, 2.5, "é<"], "c": null, "d": [], "e": true}"#
        );
        // json.dumps({"a": [1, {"x": "\n"}]}, indent=2)
        assert_eq!(
            dumps(&json!({"a": [1, {"x": "\n"}]}), Some(2), false),
            "{\n  \"a\": [\n    1,\n    {\n      \"x\": \"\\n\"\n    }\n  ]\n}"
        );
    }
}
