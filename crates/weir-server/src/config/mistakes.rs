//! A config's every mistake at once: serde stops at the first unknown field, so each one it
//! names is taken out and the rest read again.

/// Reads `value` as a `T`, listing every unknown field rather than the first: each one serde
/// names is reported (with the nearest field it expected, when one is close) and taken out, and
/// the rest read again. Another kind of mistake ends the list. The `T` read once every unknown
/// field is out, if it then reads.
pub(super) fn every_mistake<T: serde::de::DeserializeOwned>(
    mut value: toml::Value,
) -> (Option<T>, Vec<String>) {
    let mut mistakes = Vec::new();
    // Bounded: each round takes one field out of the value.
    for _ in 0..64 {
        let error = match value.clone().try_into::<T>() {
            Ok(read) => return (Some(read), mistakes),
            Err(error) => error.to_string(),
        };
        let error = error.trim_end().to_owned();
        let Some(field) = unknown_field(&error) else {
            mistakes.push(error);
            return (None, mistakes);
        };
        if !remove_first(&mut value, &field) {
            mistakes.push(error);
            return (None, mistakes);
        }
        mistakes.push(match nearest(&field, &error) {
            Some(meant) => format!("unknown field `{field}` (did you mean `{meant}`?)"),
            None => error,
        });
    }
    (None, mistakes)
}

/// The field serde's "unknown field `X`, expected …" names.
fn unknown_field(error: &str) -> Option<String> {
    let rest = error.split("unknown field `").nth(1)?;
    Some(rest.split('`').next()?.to_owned())
}

/// The expected field (from serde's "expected one of `a`, `b`" list) nearest to `field`, if one
/// is close.
fn nearest(field: &str, error: &str) -> Option<String> {
    let expected = error.split("expected").nth(1)?;
    crate::suggest::nearest_name(field, expected.split('`').skip(1).step_by(2)).map(str::to_owned)
}

/// Takes the first `key` out of `value`, its own keys first, then its tables' (depth first).
fn remove_first(value: &mut toml::Value, key: &str) -> bool {
    let Some(table) = value.as_table_mut() else {
        return false;
    };
    if table.remove(key).is_some() {
        return true;
    }
    table.iter_mut().any(|(_, inner)| remove_first(inner, key))
}
