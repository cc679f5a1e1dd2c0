//! Layered configuration: defaults < file (TOML or YAML) < environment.
//!
//! Environment variables are `<PREFIX><SECTION>__<KEY>`, e.g. `MULTIPILOT_NATS__URL` or
//! `MULTIPILOT_TSDB__RETENTION`; only variables with a `__` count, so plain settings of the scripts
//! (`MULTIPILOT_PROFILE`) never collide with the config. Unknown keys are rejected at every layer.

use std::path::Path;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml, Yaml};
use serde::{Serialize, de::DeserializeOwned};

/// Config loading failures.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The config file does not exist.
    #[error("config file {0} not found")]
    Missing(String),
    /// A value is of the wrong type, a key is unknown, or the file doesn't parse.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// Loads `C` from its defaults, then `file`, then the environment (`prefix` + `SECTION__KEY`).
///
/// `skip_env` lists environment prefixes (after `prefix`) that belong to other programs (the hub skips
/// `AGENT__`).
pub fn load<C>(file: Option<&Path>, prefix: &str, skip_env: &[&str]) -> Result<C, Error>
where
    C: Serialize + DeserializeOwned + Default,
{
    let mut fig = Figment::from(Serialized::defaults(C::default()));
    if let Some(path) = file {
        if !path.exists() {
            return Err(Error::Missing(path.display().to_string()));
        }
        fig = match path.extension().and_then(|e| e.to_str()) {
            Some("yaml" | "yml") => fig.merge(Yaml::file_exact(path)),
            _ => fig.merge(Toml::file_exact(path)),
        };
    }
    let skip: Vec<String> = skip_env.iter().map(|s| s.to_ascii_lowercase()).collect();
    let env = Env::prefixed(prefix)
        .filter(move |key| {
            let k = key.as_str().to_ascii_lowercase();
            k.contains("__") && !skip.iter().any(|s| k.starts_with(s.as_str()))
        })
        .split("__");
    fig = fig.merge(env);
    fig.extract::<C>()
        .map_err(|e| Error::Invalid(e.to_string()))
}

/// Environment variables that look meant for `C` but are ignored because they have one underscore where
/// the section and key need two (`MULTIPILOT_NATS_URL` for `MULTIPILOT_NATS__URL`): each with the name it
/// should have, so a typo is told instead of silently doing nothing.
pub fn misspelled_env<C>(prefix: &str) -> Vec<(String, String)>
where
    C: Serialize + Default,
{
    // YAML, as `render`: it takes every config (JSON refuses maps with non-string keys)
    let Ok(serde_yaml::Value::Mapping(sections)) = serde_yaml::to_value(C::default()) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for (name, _) in std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v))) {
        let Some(rest) = name.strip_prefix(prefix) else {
            continue;
        };
        if rest.contains("__") {
            continue;
        }
        let lower = rest.to_ascii_lowercase();
        for (section, keys) in &sections {
            let Some(section) = section.as_str() else {
                continue;
            };
            let Some(key) = lower
                .strip_prefix(section)
                .and_then(|k| k.strip_prefix('_'))
            else {
                continue;
            };
            if keys.as_mapping().is_some_and(|k| k.contains_key(key)) {
                let meant = format!("{prefix}{}__{}", section, key).to_ascii_uppercase();
                found.push((name.clone(), meant));
            }
        }
    }
    found.sort();
    found
}

/// The effective configuration as YAML, for `--print-config` (credentials show as `***`).
pub fn render<C: Serialize>(config: &C) -> String {
    serde_yaml::to_string(config).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Inner {
        url: String,
        limit: u32,
    }

    #[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Cfg {
        nats: Inner,
        other: Inner,
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's own Jail signature
    fn a_single_underscore_between_section_and_key_is_pointed_out() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("TESTMQ_NATS_URL", "nats://typo:4222");
            jail.set_env("TESTMQ_NATS__LIMIT", "3");
            jail.set_env("TESTMQ_PROFILE", "not a setting");
            assert_eq!(
                misspelled_env::<Cfg>("TESTMQ_"),
                vec![(
                    "TESTMQ_NATS_URL".to_string(),
                    "TESTMQ_NATS__URL".to_string()
                )]
            );
            Ok(())
        });
    }

    // figment::Jail isolates the environment and working directory per closure.
    #[test]
    #[allow(clippy::result_large_err)] // figment's own Jail signature
    fn layers_apply_in_order_and_unknown_keys_fail() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("c.toml", "[nats]\nurl = \"from-file\"\nlimit = 3\n")?;
            jail.set_env("TESTMP_NATS__LIMIT", "7");
            jail.set_env("TESTMP_PLAIN", "ignored: no section");
            jail.set_env("TESTMP_AGENT__NATS__URL", "skipped prefix");
            let c: Cfg = load(Some(Path::new("c.toml")), "TESTMP_", &["agent__"]).unwrap();
            assert_eq!(
                c.nats,
                Inner {
                    url: "from-file".into(),
                    limit: 7
                }
            );
            assert_eq!(c.other, Inner::default());

            jail.set_env("TESTMP_NATS__BOGUS", "1");
            let err = load::<Cfg>(Some(Path::new("c.toml")), "TESTMP_", &["agent__"]).unwrap_err();
            assert!(err.to_string().contains("bogus"), "{err}");
            Ok(())
        });
        figment::Jail::expect_with(|jail| {
            jail.create_file("bad.yaml", "nats:\n  unknown_key: 1\n")?;
            assert!(load::<Cfg>(Some(Path::new("bad.yaml")), "TESTMP_", &[]).is_err());
            assert!(matches!(
                load::<Cfg>(Some(Path::new("nope.toml")), "TESTMP_", &[]),
                Err(Error::Missing(_))
            ));
            Ok(())
        });
    }

    #[test]
    fn defaults_round_trip_through_the_rendered_form() {
        let c = Cfg {
            nats: Inner {
                url: "nats://x:1".into(),
                limit: 2,
            },
            other: Inner::default(),
        };
        let back: Cfg = serde_yaml::from_str(&render(&c)).unwrap();
        assert_eq!(back, c);
    }
}
