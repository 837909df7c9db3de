//! The `[consumers.config]` keys a plugin says it reads.
//!
//! A plugin built with the guest SDK's `config_keys!` carries them in a
//! custom section of its core module (`acemq:config-keys`, the keys one per
//! line). A component keeps its core modules' custom sections, so the host
//! finds them without running anything, and warns of a config key the
//! plugin never reads: most often a typo, which would otherwise leave the
//! plugin on its default without a word. A plugin without the section
//! declares nothing, and nothing is warned about.

/// The custom section's name.
pub const SECTION: &str = "acemq:config-keys";

/// The keys declared anywhere in `bytes` (a component or a core module),
/// sorted and without repeats; `None` when nothing declares any.
pub fn declared(bytes: &[u8]) -> Option<Vec<String>> {
    let mut keys: Option<Vec<String>> = None;
    // parse_all walks nested modules and components too.
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        let Ok(wasmparser::Payload::CustomSection(section)) = payload else {
            continue;
        };
        if section.name() != SECTION {
            continue;
        }
        let text = String::from_utf8_lossy(section.data());
        keys.get_or_insert_with(Vec::new).extend(
            text.lines()
                .map(str::trim)
                .filter(|key| !key.is_empty())
                .map(str::to_string),
        );
    }
    keys.map(|mut keys| {
        keys.sort();
        keys.dedup();
        keys
    })
}

/// The keys of `given` that `declared` does not name, in `given`'s order.
pub fn unknown<'a>(
    declared: &[String],
    given: impl IntoIterator<Item = &'a String>,
) -> Vec<&'a str> {
    given
        .into_iter()
        .filter(|key| declared.binary_search(key).is_err())
        .map(String::as_str)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_read_from_the_custom_section_of_a_module() {
        let module = wat::parse_str(
            r#"(module (@custom "acemq:config-keys" "out_exchange\ntenant\n") (@custom "other" "x"))"#,
        )
        .unwrap();
        assert_eq!(
            declared(&module),
            Some(vec!["out_exchange".to_string(), "tenant".to_string()])
        );
        let bare = wat::parse_str("(module)").unwrap();
        assert_eq!(declared(&bare), None);
    }

    #[test]
    fn unknown_keys_are_those_not_declared() {
        let declared = vec!["out_exchange".to_string(), "tenant".to_string()];
        let given = ["tenant".to_string(), "out_exchnage".to_string()];
        assert_eq!(unknown(&declared, &given), vec!["out_exchnage"]);
    }
}
