//! "Did you mean": the known name nearest to a misspelt one, for config and RLS rule errors.

/// The name among `names` nearest to `given`, if one is within two edits — a typo, not another
/// word: what a "did you mean" suggests (config fields, RLS rule fields).
pub(crate) fn nearest_name<'a>(
    given: &str,
    names: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    names
        .into_iter()
        .map(|name| (strsim::damerau_levenshtein(given, name), name))
        .filter(|(distance, _)| *distance <= 2)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name)
}
