//! What a setting is: one declaration ([`Setting`]) carrying its key, environment variables,
//! default, what it accepts, its README text, its parser (bounds included) and how
//! `--check-config` shows it; the layers' merged values ([`Layers`]), read only through a
//! declaration, so a value comes out typed and a bad one names its setting; and the parsers
//! several declarations share.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;

use super::types::{redact_userinfo, Config};

/// Why a parser refused a value, which decides what the error shows.
#[derive(Debug)]
pub(crate) enum Bad {
    /// The whole value is refused, and shown.
    Whole,
    /// This entry of a comma-separated value is refused, and shown instead of the whole.
    Entry(String),
    /// The value is refused and described by this text instead (it is never shown).
    Described(&'static str),
}

/// What every setting has whatever its type: the README row, the `--check-config` line, and
/// the setting's name in errors.
pub(crate) struct Doc {
    pub(crate) key: &'static str,
    /// The first name is the documented one; the others are accepted aliases.
    pub(crate) env: &'static [&'static str],
    pub(crate) default: Option<&'static str>,
    pub(crate) accepts: &'static str,
    pub(crate) help: &'static str,
    pub(crate) secret: bool,
    /// The effective value as `--check-config` prints it; `<…>` marks a description.
    pub(super) show: fn(&Config) -> String,
}

/// One setting, declared once: its [`Doc`] and the parser that makes its typed value (and
/// holds its bounds).
pub(crate) struct Setting<T> {
    pub(crate) doc: Doc,
    parse: fn(&str) -> Result<T, Bad>,
}

/// A setting's declaration, in the order the README columns read.
pub(super) const fn setting<T>(
    key: &'static str,
    env: &'static [&'static str],
    default: Option<&'static str>,
    accepts: &'static str,
    help: &'static str,
    parse: fn(&str) -> Result<T, Bad>,
    show: fn(&Config) -> String,
) -> Setting<T> {
    Setting {
        doc: Doc {
            key,
            env,
            default,
            accepts,
            help,
            secret: false,
            show,
        },
        parse,
    }
}

impl<T> Setting<T> {
    /// The same declaration, its value never shown (in errors nor by `--check-config`).
    pub(super) const fn secret(self) -> Self {
        let Setting { doc, parse } = self;
        Setting {
            doc: Doc {
                secret: true,
                ..doc
            },
            parse,
        }
    }
}

/// Declares a group's settings, each a typed constant, and the group's table (`&[&Doc]`, in
/// declaration order) for the README and `--check-config`: a setting is written once.
macro_rules! settings {
    ($(#[$meta:meta])* $vis:vis $group:ident { $($name:ident: $ty:ty = $decl:expr,)* }) => {
        $($vis const $name: $crate::config::setting::Setting<$ty> = $decl;)*
        $(#[$meta])*
        $vis const $group: &[&$crate::config::setting::Doc] = &[$(&$name.doc),*];
    };
}
pub(super) use settings;

impl Doc {
    /// How errors name the setting.
    pub(super) fn name(&self) -> String {
        format!("{} (config key `{}`)", self.env[0], self.key)
    }

    /// `value` is refused; a secret's value is not shown.
    pub(super) fn invalid(&self, value: &str) -> ConfigError {
        ConfigError::Invalid {
            name: self.name(),
            value: if self.secret {
                "<redacted>".to_owned()
            } else {
                redact_userinfo(value).into_owned()
            },
            accepts: self.accepts,
        }
    }

    pub(super) fn missing(&self) -> ConfigError {
        ConfigError::Missing {
            name: self.name(),
            accepts: self.accepts,
        }
    }
}

/// A setting that could not be used, naming it and what it accepts. Secret values are not shown.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    #[error("{name}: `{value}` is not valid; expected {accepts}")]
    Invalid {
        name: String,
        value: String,
        accepts: &'static str,
    },
    #[error("{name} is required: {accepts}")]
    Missing { name: String, accepts: &'static str },
    #[error("configuration file {path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("the environment variable {name} is not valid UTF-8 text (its value is not shown); set it to text or unset it")]
    NotText { name: String },
    #[error("{what} `{name}` is not a setting{hint}")]
    Unknown {
        what: &'static str,
        name: String,
        hint: String,
    },
}

/// Every setting's value as the layers give it (the highest layer that has the key wins),
/// before it is parsed. Read only through a declaration.
#[derive(Debug, Default)]
pub(crate) struct Layers {
    values: BTreeMap<&'static str, String>,
}

impl Layers {
    /// Puts a layer's value over the lower layers' (a blank one too: it then reads as unset).
    pub(super) fn set(&mut self, key: &'static str, value: String) {
        self.values.insert(key, value);
    }

    /// The setting's value as text, trimmed; blank counts as unset.
    pub(super) fn text<T>(&self, s: &Setting<T>) -> Option<String> {
        self.values
            .get(s.doc.key)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    }

    /// The setting's typed value, when it is set.
    pub(super) fn optional<T>(&self, s: &Setting<T>) -> Result<Option<T>, ConfigError> {
        let Some(text) = self.text(s) else {
            return Ok(None);
        };
        match (s.parse)(&text) {
            Ok(v) => Ok(Some(v)),
            Err(Bad::Whole) => Err(s.doc.invalid(&text)),
            Err(Bad::Entry(entry)) => Err(s.doc.invalid(&entry)),
            Err(Bad::Described(value)) => Err(ConfigError::Invalid {
                name: s.doc.name(),
                value: value.to_owned(),
                accepts: s.doc.accepts,
            }),
        }
    }

    /// The setting's typed value, its declared default when it is set blank in a layer (a
    /// setting whose blank value means its default rather than "required").
    pub(super) fn get_or_default<T>(&self, s: &Setting<T>) -> Result<T, ConfigError> {
        match (self.optional(s)?, s.doc.default) {
            (Some(v), _) => Ok(v),
            (None, Some(d)) => (s.parse)(d).map_err(|_| s.doc.invalid(d)),
            (None, None) => Err(s.doc.missing()),
        }
    }

    /// The setting's typed value; unset is an error (every setting with a default has one).
    pub(super) fn get<T>(&self, s: &Setting<T>) -> Result<T, ConfigError> {
        self.optional(s)?.ok_or_else(|| s.doc.missing())
    }
}

// The parsers declarations share. Each refuses with `Bad::Whole` unless it says otherwise.

/// A number within `range`.
pub(super) fn number<T: std::str::FromStr + PartialOrd>(
    v: &str,
    range: RangeInclusive<T>,
) -> Result<T, Bad> {
    v.parse()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or(Bad::Whole)
}

/// A duration such as `30s` within `range`.
pub(super) fn duration_in(v: &str, range: RangeInclusive<Duration>) -> Result<Duration, Bad> {
    humantime::parse_duration(v)
        .ok()
        .filter(|d| range.contains(d))
        .ok_or(Bad::Whole)
}

/// A duration of at least a millisecond: a zero timeout would fail every request.
pub(super) fn positive_duration(v: &str) -> Result<Duration, Bad> {
    duration_in(v, Duration::from_millis(1)..=Duration::MAX)
}

pub(super) fn any_duration(v: &str) -> Result<Duration, Bad> {
    duration_in(v, Duration::ZERO..=Duration::MAX)
}

/// `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`, in any case.
pub(super) fn boolean(v: &str) -> Result<bool, Bad> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(Bad::Whole),
    }
}

/// The text itself (a setting whose every non-blank value is good).
pub(super) fn text(v: &str) -> Result<String, Bad> {
    Ok(v.to_owned())
}

/// A comma-separated list, blank entries left out.
pub(super) fn split_list(raw: &str) -> Vec<String> {
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A duration as `--check-config` shows it.
pub(super) fn duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}
