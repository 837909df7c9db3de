//! The folders `plugin new --lang python|js` writes: a starter handler that
//! does what the Rust template's does, its tests, the test host they import,
//! the WIT it is built against, a README of the next commands and a
//! .gitignore. Every file is built into the binary, so a folder made
//! anywhere is complete: it needs nothing of an acemq-host checkout.

use super::render;

/// The contract the new plugin is built against, copied into its `wit/`.
pub const WIT: &str = include_str!("../../../../wit/plugin.wit");

/// Python: the test host, as the repository's Python plugins use it.
const PY_TESTING: &str = include_str!("../../../../guest-sdk/python/acemq_testing.py");
const PY_APP: &str = include_str!("../../../templates/plugin-python/app.py");
const PY_TEST: &str = include_str!("../../../templates/plugin-python/test_app.py");
const PY_README: &str = include_str!("../../../templates/plugin-python/README.md");
const PY_GITIGNORE: &str = include_str!("../../../templates/plugin-python/gitignore");

/// JavaScript: the test host, as the repository's JavaScript plugins use it.
const JS_TESTING: &str = include_str!("../../../../guest-sdk/js/acemq-testing.mjs");
const JS_APP: &str = include_str!("../../../templates/plugin-js/app.js");
const JS_TEST: &str = include_str!("../../../templates/plugin-js/test/app.test.mjs");
const JS_PACKAGE: &str = include_str!("../../../templates/plugin-js/package.json");
const JS_README: &str = include_str!("../../../templates/plugin-js/README.md");
const JS_GITIGNORE: &str = include_str!("../../../templates/plugin-js/gitignore");
/// The lock of the repository's JavaScript example, whose tools are the
/// ones the template pins (a unit test holds the two to the same set): a
/// new plugin installs exactly the versions the example is built and tested
/// with, and `npm ci` works in it.
const JS_LOCK: &str = include_str!("../../../../plugins/order-router-js/package-lock.json");
/// The example's name and license in its lock: the new plugin's lock has
/// its own name and, as its package.json, no license.
const JS_LOCK_NAME: &str = "\"name\": \"order-router-js\"";
const JS_LOCK_LICENSE: &str = "      \"license\": \"Apache-2.0\",\n";

/// The Python plugin's files, relative to its folder, with their text.
pub fn python_files(name: &str) -> Vec<(&'static str, String)> {
    let vars = [("name", name)];
    vec![
        ("src/app.py", render(PY_APP, &vars)),
        ("test_app.py", render(PY_TEST, &vars)),
        // Verbatim: the test host is no template (its f-strings have braces).
        ("acemq_testing.py", PY_TESTING.to_string()),
        ("wit/plugin.wit", WIT.to_string()),
        ("README.md", render(PY_README, &vars)),
        (".gitignore", PY_GITIGNORE.to_string()),
    ]
}

/// The JavaScript plugin's files, relative to its folder, with their text.
/// The test host sits beside app.js, not in test/: `node --test test/`
/// counts every module in test/ as a test file.
pub fn js_files(name: &str) -> Vec<(&'static str, String)> {
    let vars = [("name", name)];
    vec![
        ("app.js", render(JS_APP, &vars)),
        ("test/app.test.mjs", render(JS_TEST, &vars)),
        ("acemq-testing.mjs", JS_TESTING.to_string()),
        ("package.json", render(JS_PACKAGE, &vars)),
        ("package-lock.json", package_lock(name)),
        ("wit/plugin.wit", WIT.to_string()),
        ("README.md", render(JS_README, &vars)),
        (".gitignore", JS_GITIGNORE.to_string()),
    ]
}

/// The example's lock with the plugin's name (a valid plugin name needs no
/// JSON escaping) and without the example's license.
pub fn package_lock(name: &str) -> String {
    JS_LOCK
        .replace(JS_LOCK_NAME, &format!("\"name\": \"{name}\""))
        .replacen(JS_LOCK_LICENSE, "", 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file<'a>(files: &'a [(&'static str, String)], name: &str) -> &'a str {
        &files.iter().find(|(f, _)| *f == name).unwrap().1
    }

    #[test]
    fn every_file_is_filled_in_and_the_verbatim_ones_are_unchanged() {
        for (files, testing) in [
            (
                python_files("order-audit"),
                ("acemq_testing.py", PY_TESTING),
            ),
            (js_files("order-audit"), ("acemq-testing.mjs", JS_TESTING)),
        ] {
            for (name, text) in &files {
                if *name != testing.0 {
                    assert!(!text.contains("{{"), "{name} is not filled in: {text}");
                }
            }
            assert_eq!(file(&files, testing.0), testing.1);
            assert_eq!(file(&files, "wit/plugin.wit"), WIT);
            assert!(WIT.contains("package acemq:plugin@0.4.0;"));
            assert!(file(&files, "README.md").starts_with("# order-audit\n"));
            assert!(file(&files, ".gitignore").contains("/target/"));
        }
    }

    #[test]
    fn the_starters_do_what_the_rust_template_does() {
        let rust = include_str!("../../../templates/plugin/handler.rs");
        let python = python_files("a");
        let js = js_files("a");
        // The same config key, rejection, log line and capitals.
        for (text, upper) in [
            (rust, "to_uppercase()"),
            (file(&python, "src/app.py"), "upper()"),
            (file(&js, "app.js"), "toUpperCase()"),
        ] {
            assert!(text.contains("\"forward_to\"") || text.contains("'forward_to'"));
            assert!(text.contains("the body is empty"), "{text}");
            assert!(text.contains("bytes with routing key '"), "{text}");
            assert!(text.contains(upper), "{text}");
        }
        assert!(file(&python, "src/app.py").contains("class Handler(exports.Handler)"));
        assert!(file(&js, "app.js").contains("export const handler"));
    }

    #[test]
    fn the_package_json_is_the_plugins_and_tests_with_node() {
        let package: serde_json::Value =
            serde_json::from_str(file(&js_files("order-audit"), "package.json")).unwrap();
        assert_eq!(package["name"], "order-audit");
        assert_eq!(package["type"], "module");
        assert_eq!(package["scripts"]["test"], "node --test test/");
    }

    #[test]
    fn the_lock_pins_the_tools_the_package_json_names_and_nothing_else_changes() {
        let lock: serde_json::Value = serde_json::from_str(&package_lock("order-audit")).unwrap();
        let example: serde_json::Value = serde_json::from_str(JS_LOCK).unwrap();
        let package: serde_json::Value = serde_json::from_str(JS_PACKAGE).unwrap();
        assert_eq!(lock["name"], "order-audit");
        let root = &lock["packages"][""];
        assert_eq!(root["name"], "order-audit");
        assert!(root.get("license").is_none(), "{root}");
        // `npm ci` refuses a lock whose root does not match package.json.
        assert_eq!(root["devDependencies"], package["devDependencies"]);
        // The example pins the same tools: one install serves both.
        assert_eq!(
            root["devDependencies"],
            example["packages"][""]["devDependencies"]
        );
        let without_root = |lock: &serde_json::Value| {
            let mut packages = lock["packages"].as_object().unwrap().clone();
            packages.remove("");
            packages
        };
        assert_eq!(without_root(&lock), without_root(&example));
    }
}
