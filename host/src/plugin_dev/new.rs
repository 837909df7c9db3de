//! `acemq-host plugin new NAME [--lang rust|python|js] [--codec]`: a plugin
//! that builds and passes its tests as it is. A Rust one is a crate from the
//! templates in `host/templates/plugin`; a Python or JavaScript one a folder
//! from `host/templates/plugin-python` or `plugin-js` ([`langs`]), with the
//! WIT and the test host of its language, and no dependency on a checkout.
//!
//! Where a Rust crate lands decides how it depends on the SDK:
//! - in a folder whose `Cargo.toml` is a workspace that takes every folder
//!   as a member and provides `acemq-guest` (this repository's `plugins/`),
//!   it joins that workspace and inherits its SDK, profile and lockfile;
//! - anywhere else it is a workspace of its own, with a path dependency on
//!   the SDK of the checkout this binary was built from (or `--sdk`), the
//!   plugin release profile, and the lockfile of this repository's plugins,
//!   so it builds offline with the versions the SDK is tested with.

use std::path::PathBuf;

use anyhow::{Context as _, anyhow};

use super::{Failure, shown};

mod langs;

const HANDLER: &str = include_str!("../../templates/plugin/handler.rs");
const CODEC: &str = include_str!("../../templates/plugin/codec.rs");
const MEMBER_MANIFEST: &str = include_str!("../../templates/plugin/member.Cargo.toml");
const STANDALONE_MANIFEST: &str = include_str!("../../templates/plugin/standalone.Cargo.toml");
const GITIGNORE: &str = include_str!("../../templates/plugin/gitignore");
/// The versions the SDK and the example plugins are built and tested with.
const LOCKFILE: &str = include_str!("../../../plugins/Cargo.lock");

/// The language of the new plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// A crate depending on the guest SDK (acemq-guest).
    Rust,
    /// A Python module built with componentize-py.
    Python,
    /// A JavaScript module built with componentize-js.
    Js,
}

impl Lang {
    pub fn describe(self) -> &'static str {
        match self {
            Self::Rust => "Rust",
            Self::Python => "Python",
            Self::Js => "JavaScript",
        }
    }

    /// The `--lang` value that names it.
    fn flag(self) -> &'static str {
        match self {
            Self::Rust => "rust",
            Self::Python => "python",
            Self::Js => "js",
        }
    }
}

/// What `plugin new` was asked for.
#[derive(Debug, Clone)]
pub struct NewRequest {
    pub name: String,
    pub lang: Lang,
    pub codec: bool,
    /// The folder the crate's folder is created in.
    pub parent: PathBuf,
    /// The guest SDK for a standalone crate; `None`: the build checkout's.
    pub sdk: Option<PathBuf>,
}

/// How the new crate gets the SDK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// A member of the workspace of the parent folder.
    Member,
    /// A workspace of its own, the SDK at this path.
    Standalone { sdk: PathBuf },
}

/// Checks that the options go with the language: `--codec` and `--sdk` are
/// the Rust crate's (a codec is Rust-only; only a crate has an SDK).
pub fn check_options(lang: Lang, codec: bool, sdk: bool) -> Result<(), String> {
    let rust_only = match (codec, sdk) {
        (true, _) => "--codec",
        (false, true) => "--sdk",
        (false, false) => return Ok(()),
    };
    match lang {
        Lang::Rust => Ok(()),
        other => Err(format!(
            "{rust_only} is for Rust plugins only, not with --lang {}: codecs are written in \
             Rust, and only a Rust crate depends on the guest SDK (drop {rust_only}, or use \
             --lang rust)",
            other.flag()
        )),
    }
}

/// Checks that `name` can be a package name, a library name and a file
/// name, and says which rule it breaks.
pub fn validate_name(name: &str) -> Result<(), String> {
    const RESERVED: &[&str] = &[
        // Rust's own crates: a package of that name cannot be built.
        "std",
        "core",
        "alloc",
        "test",
        "proc_macro",
        "proc-macro",
        // The SDK it depends on.
        "acemq-guest",
        "acemq_guest",
    ];
    const KEYWORDS: &[&str] = &[
        "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum",
        "extern", "false", "fn", "for", "if", "impl", "in", "let", "loop", "match", "mod", "move",
        "mut", "pub", "ref", "return", "self", "Self", "static", "struct", "super", "trait",
        "true", "type", "unsafe", "use", "where", "while", "abstract", "become", "box", "do",
        "final", "gen", "macro", "override", "priv", "try", "typeof", "unsized", "virtual",
        "yield",
    ];
    let why = if name.is_empty() {
        Some("it is empty".to_string())
    } else if name.len() > 64 {
        Some(format!("it is {} characters long; at most 64", name.len()))
    } else if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '_'))
    {
        Some(format!("it contains {c:?}"))
    } else if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        Some("it does not start with a letter".to_string())
    } else if KEYWORDS.contains(&name) {
        Some("it is a Rust keyword".to_string())
    } else if RESERVED.contains(&name) {
        Some("it is the name of a crate every plugin already uses".to_string())
    } else {
        None
    };
    match why {
        Some(why) => Err(format!(
            "'{name}' cannot be a plugin name: {why}. Use lowercase letters, digits, '-' and '_', \
             starting with a letter (for example: order-audit)"
        )),
        None => Ok(()),
    }
}

/// The handler or codec type's name: `order-audit` -> `OrderAudit`.
pub fn type_name(name: &str) -> String {
    name.split(['-', '_'])
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// Whether a crate named `name` created beside `parent_manifest` (the text
/// of the parent folder's `Cargo.toml`, if any) joins that workspace: it
/// must take the folder as a member (`members = ["*"]` or the name) and
/// provide the SDK as a workspace dependency, which the member template
/// inherits.
pub fn joins_workspace(parent_manifest: Option<&str>, name: &str) -> bool {
    let Some(manifest) = parent_manifest.and_then(|text| text.parse::<toml::Table>().ok()) else {
        return false;
    };
    let Some(workspace) = manifest.get("workspace").and_then(|w| w.as_table()) else {
        return false;
    };
    let member = workspace
        .get("members")
        .and_then(|m| m.as_array())
        .is_some_and(|members| {
            members
                .iter()
                .any(|m| m.as_str() == Some("*") || m.as_str() == Some(name))
        });
    let excluded = workspace
        .get("exclude")
        .and_then(|e| e.as_array())
        .is_some_and(|exclude| exclude.iter().any(|e| e.as_str() == Some(name)));
    let provides_sdk = workspace
        .get("dependencies")
        .and_then(|d| d.as_table())
        .is_some_and(|deps| deps.contains_key("acemq-guest"));
    member && !excluded && provides_sdk
}

/// `{{key}}` in `template` replaced by each value.
pub fn render(template: &str, vars: &[(&str, &str)]) -> String {
    vars.iter()
        .fold(template.to_string(), |text, (key, value)| {
            text.replace(&format!("{{{{{key}}}}}", key = key), value)
        })
}

/// The crate's files, relative to its folder, with their text.
pub fn files(name: &str, codec: bool, placement: &Placement) -> Vec<(&'static str, String)> {
    let type_name = type_name(name);
    let (kind, source) = match codec {
        true => ("codec", CODEC),
        false => ("handler", HANDLER),
    };
    let description = format!("An acemq-host {kind} plugin");
    let sdk = match placement {
        Placement::Standalone { sdk } => sdk.display().to_string(),
        Placement::Member => String::new(),
    };
    let vars = [
        ("name", name),
        ("type_name", type_name.as_str()),
        ("description", description.as_str()),
        // A TOML basic string: backslashes and quotes escaped.
        ("sdk", &sdk.replace('\\', "\\\\").replace('"', "\\\"")),
    ];
    let mut files = match placement {
        Placement::Member => vec![("Cargo.toml", render(MEMBER_MANIFEST, &vars))],
        Placement::Standalone { .. } => vec![
            ("Cargo.toml", render(STANDALONE_MANIFEST, &vars)),
            ("Cargo.lock", LOCKFILE.to_string()),
            (".gitignore", GITIGNORE.to_string()),
        ],
    };
    files.push(("src/lib.rs", render(source, &vars)));
    files
}

/// What `plugin new` made.
#[derive(Debug)]
pub struct Created {
    pub dir: PathBuf,
    pub lang: Lang,
    /// How a Rust crate gets the SDK (`None` for the other languages).
    pub placement: Option<Placement>,
    pub files: Vec<PathBuf>,
}

/// Creates the plugin's folder: `request.parent/request.name`.
pub fn create(request: &NewRequest) -> Result<Created, Failure> {
    check_options(request.lang, request.codec, request.sdk.is_some())
        .map_err(|e| Failure::input(anyhow!(e)))?;
    validate_name(&request.name).map_err(|e| Failure::input(anyhow!(e)))?;
    let parent = request.parent.canonicalize().map_err(|e| {
        Failure::input(anyhow!(
            "{}: cannot use it as the parent folder: {e}",
            request.parent.display()
        ))
    })?;
    let dir = parent.join(&request.name);
    if dir.exists() {
        return Err(Failure::input(anyhow!(
            "{} already exists; choose another name or remove it",
            dir.display()
        )));
    }
    let (files, placement) = match request.lang {
        Lang::Rust => {
            let placement = rust_placement(request, &parent)?;
            (
                files(&request.name, request.codec, &placement),
                Some(placement),
            )
        }
        Lang::Python => (langs::python_files(&request.name), None),
        Lang::Js => (langs::js_files(&request.name), None),
    };
    let mut written = Vec::new();
    for (relative, text) in files {
        let path = dir.join(relative);
        let write = || -> anyhow::Result<()> {
            if let Some(folder) = path.parent() {
                std::fs::create_dir_all(folder)?;
            }
            std::fs::write(&path, text)?;
            Ok(())
        };
        write()
            .with_context(|| format!("cannot write {}", path.display()))
            .map_err(Failure::failed)?;
        written.push(path);
    }
    Ok(Created {
        dir,
        lang: request.lang,
        placement,
        files: written,
    })
}

/// How a Rust crate created in `parent` gets the SDK.
fn rust_placement(request: &NewRequest, parent: &std::path::Path) -> Result<Placement, Failure> {
    let parent_manifest = std::fs::read_to_string(parent.join("Cargo.toml")).ok();
    let placement = if joins_workspace(parent_manifest.as_deref(), &request.name) {
        Placement::Member
    } else {
        let sdk = request
            .sdk
            .clone()
            .unwrap_or_else(|| super::build_checkout().join("guest-sdk"));
        let sdk = sdk
            .canonicalize()
            .ok()
            .filter(|sdk| sdk.join("Cargo.toml").is_file())
            .ok_or_else(|| {
                Failure::input(anyhow!(
                    "no guest SDK (acemq-guest) at {}: pass --sdk with the guest-sdk folder of \
                     an acemq-host checkout",
                    sdk.display()
                ))
            })?;
        Placement::Standalone { sdk }
    };
    Ok(placement)
}

/// What `plugin new` prints: what it made and the commands that follow.
pub fn next_steps(created: &Created, name: &str, codec: bool) -> String {
    let dir = shown(&created.dir);
    let kind = if codec { "codec" } else { "handler" };
    let lang = match created.lang {
        Lang::Rust => String::new(),
        other => format!("{} ", other.describe()),
    };
    let mut out = format!("created the {lang}{kind} plugin {name} in {dir}/\n");
    for file in &created.files {
        out.push_str(&format!("  {}\n", shown(file)));
    }
    match &created.placement {
        Some(Placement::Member) => {
            out.push_str("a member of the workspace around it (the SDK comes from there)\n")
        }
        Some(Placement::Standalone { sdk }) => out.push_str(&format!(
            "its own workspace; the guest SDK is {}\n",
            sdk.display()
        )),
        None => {}
    }
    let test = match created.lang {
        Lang::Rust => "cargo test",
        Lang::Python => "python3 -m unittest",
        Lang::Js => "node --test test/",
    };
    out.push_str("\nnext:\n");
    out.push_str(&format!(
        "  (cd {dir} && {test})          # its tests, natively\n"
    ));
    out.push_str(&format!(
        "  acemq-host plugin build {dir}     # the component; prints where it is\n"
    ));
    if !codec {
        out.push_str(
            "  acemq-host plugin run <component> --body 'hello' --config forward_to=out --publish-to out\n",
        );
    }
    match created.lang {
        Lang::Rust => out.push_str(
            "  then point a consumer's `plugin` at the component (see the README, \"Writing a plugin\")\n",
        ),
        _ => out.push_str(&format!(
            "  then point a consumer's `plugin` at the component; {dir}/README.md says how, and \
             what runs at build time and what at call time\n"
        )),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_name_is_refused_naming_it_and_the_rule() {
        for (name, rule) in [
            ("", "it is empty"),
            ("My-Plugin", "it contains 'M'"),
            ("audit.v2", "it contains '.'"),
            ("9lives", "does not start with a letter"),
            ("-x", "does not start with a letter"),
            ("fn", "Rust keyword"),
            ("test", "every plugin already uses"),
            ("acemq-guest", "every plugin already uses"),
        ] {
            let error = validate_name(name).unwrap_err();
            assert!(error.contains(&format!("'{name}'")), "{error}");
            assert!(error.contains(rule), "{name}: {error}");
        }
        assert!(
            validate_name(&"a".repeat(65))
                .unwrap_err()
                .contains("at most 64")
        );
        for name in ["order-audit", "echo2", "my_codec", "a"] {
            validate_name(name).unwrap();
        }
    }

    #[test]
    fn codec_and_sdk_are_refused_outside_rust_naming_the_option_and_the_language() {
        for lang in [Lang::Python, Lang::Js] {
            let error = check_options(lang, true, false).unwrap_err();
            assert!(
                error.starts_with("--codec is for Rust plugins only"),
                "{error}"
            );
            assert!(
                error.contains(&format!("--lang {}", lang.flag())),
                "{error}"
            );
            let error = check_options(lang, false, true).unwrap_err();
            assert!(
                error.starts_with("--sdk is for Rust plugins only"),
                "{error}"
            );
            check_options(lang, false, false).unwrap();
        }
        check_options(Lang::Rust, true, true).unwrap();
    }

    #[test]
    fn the_next_steps_are_the_languages_commands() {
        for (lang, test) in [
            (Lang::Rust, "cargo test"),
            (Lang::Python, "python3 -m unittest"),
            (Lang::Js, "node --test test/"),
        ] {
            let created = Created {
                dir: PathBuf::from("/elsewhere/audit"),
                lang,
                placement: None,
                files: vec![PathBuf::from("/elsewhere/audit/README.md")],
            };
            let steps = next_steps(&created, "audit", false);
            assert!(
                steps.contains(&format!("(cd /elsewhere/audit && {test})")),
                "{steps}"
            );
            assert!(
                steps.contains("acemq-host plugin build /elsewhere/audit "),
                "{steps}"
            );
            assert!(steps.contains("  /elsewhere/audit/README.md\n"), "{steps}");
            let said = format!(
                "created the {}handler",
                match lang {
                    Lang::Rust => String::new(),
                    other => format!("{} ", other.describe()),
                }
            );
            assert!(steps.starts_with(&said), "{steps}");
        }
    }

    #[test]
    fn the_type_is_named_after_the_crate() {
        assert_eq!(type_name("order-audit"), "OrderAudit");
        assert_eq!(type_name("my_codec_v2"), "MyCodecV2");
        assert_eq!(type_name("echo"), "Echo");
    }

    #[test]
    fn a_crate_joins_a_workspace_only_if_it_is_a_member_and_gets_the_sdk_there() {
        let plugins = "[workspace]\nmembers = [\"*\"]\nexclude = [\"target\"]\n\
                       [workspace.dependencies]\nacemq-guest = { path = \"../guest-sdk\" }\n";
        assert!(joins_workspace(Some(plugins), "audit"));
        assert!(!joins_workspace(Some(plugins), "target"));
        let listed =
            "[workspace]\nmembers = [\"a\"]\n[workspace.dependencies]\nacemq-guest = \"1\"\n";
        assert!(joins_workspace(Some(listed), "a"));
        assert!(!joins_workspace(Some(listed), "b"));
        let without_sdk = "[workspace]\nmembers = [\"*\"]\n";
        assert!(!joins_workspace(Some(without_sdk), "audit"));
        assert!(!joins_workspace(Some("[package]\nname = \"x\"\n"), "audit"));
        assert!(!joins_workspace(Some("not toml ["), "audit"));
        assert!(!joins_workspace(None, "audit"));
    }

    #[test]
    fn templates_are_filled_in_completely() {
        let standalone = Placement::Standalone {
            sdk: PathBuf::from("/src/acemq \"x\"/guest-sdk"),
        };
        for codec in [false, true] {
            for placement in [&Placement::Member, &standalone] {
                for (file, text) in files("order-audit", codec, placement) {
                    assert!(!text.contains("{{"), "{file}: {text}");
                    if file == "src/lib.rs" {
                        assert!(text.contains("struct OrderAudit;"), "{text}");
                    }
                    if file == "Cargo.toml" {
                        let manifest: toml::Table = text.parse().unwrap();
                        assert_eq!(manifest["package"]["name"].as_str(), Some("order-audit"));
                        assert_eq!(
                            manifest["lib"]["crate-type"].as_array().unwrap()[0].as_str(),
                            Some("cdylib")
                        );
                    }
                }
            }
        }
        let manifest: toml::Table = files("a", false, &standalone)
            .into_iter()
            .find(|(file, _)| *file == "Cargo.toml")
            .unwrap()
            .1
            .parse()
            .unwrap();
        assert_eq!(
            manifest["dependencies"]["acemq-guest"]["path"].as_str(),
            Some("/src/acemq \"x\"/guest-sdk")
        );
        assert!(manifest.contains_key("workspace"));
        assert_eq!(
            manifest["profile"]["release"]["panic"].as_str(),
            Some("abort")
        );
    }
}
