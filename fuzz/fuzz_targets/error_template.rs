//! Error templates (`[errors]`): any template parses or is refused, never a panic, and no
//! value can change the shape of a body. A JSON template that `check` accepts (it is JSON once
//! filled with the sample values) stays JSON, with the same members, whatever the detail and
//! title hold; a text body never carries a control character a value brought.
#![no_main]

use idemgate::policy::errors::{BodyKind, Template, Values, sample_values};
use libfuzzer_sys::fuzz_target;

/// The document with every string emptied: its shape.
fn shape(value: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::String(_) => Value::String(String::new()),
        Value::Array(items) => Value::Array(items.iter().map(shape).collect()),
        Value::Object(members) => Value::Object(members.iter().map(|(k, v)| (k.clone(), shape(v))).collect()),
        other => other.clone(),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    // The template, then the values a client's request can steer (a detail echoes a path or a
    // header name), separated by NUL.
    let mut parts = text.splitn(3, '\0');
    let (template, detail, title) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let Ok(template) = Template::parse(template) else { return };
    let sample = sample_values(7);
    let values = Values { detail, title, ..sample };
    if let Ok(checked) = serde_json::from_str::<serde_json::Value>(&template.render(BodyKind::Json, &sample)) {
        let body = template.render(BodyKind::Json, &values);
        let filled: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert_eq!(shape(&filled), shape(&checked), "{body}");
    }
    let plain = template.render(BodyKind::Text, &values);
    let brought = detail.chars().chain(title.chars()).filter(|c| c.is_control()).count();
    let before = template.render(BodyKind::Text, &Values { detail: "", title: "", ..sample });
    assert_eq!(
        plain.chars().filter(|c| c.is_control()).count(),
        before.chars().filter(|c| c.is_control()).count(),
        "{brought} control characters from the values reached the body"
    );
});
