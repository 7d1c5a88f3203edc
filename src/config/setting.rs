//! What a setting is: one declaration ([`Setting`]) carrying its key, environment variables,
//! default, what it accepts (for a number, a duration or a size, its bounds: [`Accepts`], the
//! check and the text stating it in one value), its README text, its parser and how
//! `--check-config` shows it; the layers' merged values ([`Layers`]), read only through a
//! declaration, so a value comes out typed and a bad one names its setting, every mistake
//! kept and reading going on past it (the list is [`ConfigErrors`]); and the parsers several
//! declarations share.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use super::types::{redact_url, Config};
use crate::feedback::capability::has_key_shape;

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

/// What a setting accepts, as its errors and the README say it. A bounded kind is also the
/// check the value must pass before the setting's parser reads it, so the bounds and the text
/// stating them come from the same numbers.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Accepts {
    /// Said in words; the setting's parser checks what they say.
    Prose(&'static str),
    /// A whole number of `unit` (empty for a count) from `min` to `max` (`u64::MAX`: no upper
    /// bound), or `word` (such as `auto`) when there is one.
    Whole {
        word: Option<&'static str>,
        unit: &'static str,
        min: u64,
        max: u64,
    },
    /// A duration such as `30s` from `min` to `max` (`Duration::MAX`: no upper bound).
    Duration {
        min: Duration,
        max: Duration,
        such_as: &'static str,
    },
    /// A number of bytes, with a unit or without (`512KiB`, `1MB`), from `min` to `max`.
    Size {
        min: u64,
        max: u64,
        such_as: &'static str,
    },
}

impl Accepts {
    pub(super) const fn whole(unit: &'static str, min: u64, max: u64) -> Accepts {
        Accepts::Whole {
            word: None,
            unit,
            min,
            max,
        }
    }

    /// The same numbers, or `word`.
    pub(super) const fn or(self, word: &'static str) -> Accepts {
        match self {
            Accepts::Whole { unit, min, max, .. } => Accepts::Whole {
                word: Some(word),
                unit,
                min,
                max,
            },
            other => other,
        }
    }

    pub(super) const fn duration(min: Duration, max: Duration, such_as: &'static str) -> Accepts {
        Accepts::Duration { min, max, such_as }
    }

    pub(super) const fn size(min: u64, max: u64, such_as: &'static str) -> Accepts {
        Accepts::Size { min, max, such_as }
    }

    /// Whether `v` is within the bounds (prose leaves the whole check to the parser).
    fn admits(&self, v: &str) -> bool {
        match *self {
            Accepts::Prose(_) => true,
            Accepts::Whole {
                word,
                unit,
                min,
                max,
            } => {
                // A percentage may be written with its sign (`50%`) or without.
                let n = match unit {
                    "%" => v.trim().strip_suffix('%').unwrap_or(v).trim(),
                    _ => v,
                };
                word == Some(v) || n.parse::<u64>().is_ok_and(|n| (min..=max).contains(&n))
            }
            Accepts::Duration { min, max, .. } => {
                // A bare number is milliseconds, for the settings whose parser takes it (the
                // OpenTelemetry variables' form); the others' parsers refuse it.
                let d = humantime::parse_duration(v)
                    .ok()
                    .or_else(|| v.trim().parse::<u64>().ok().map(Duration::from_millis));
                d.is_some_and(|d| (min..=max).contains(&d))
            }
            Accepts::Size { min, max, .. } => {
                bytes_with_unit(v).is_some_and(|n| (min..=max).contains(&n))
            }
        }
    }

    /// The text errors and the README show.
    pub(crate) fn text(&self) -> Cow<'static, str> {
        let such = |such_as: &str| {
            if such_as.is_empty() {
                String::new()
            } else {
                format!(", such as {such_as}")
            }
        };
        match *self {
            Accepts::Prose(text) => text.into(),
            Accepts::Whole {
                word,
                unit,
                min,
                max,
            } => {
                let number = match unit {
                    "" => "a whole number".to_owned(),
                    "%" => return format!("a whole percentage from {min}% to {max}%").into(),
                    unit => format!("a whole number of {unit}"),
                };
                let range = match (min, max) {
                    (0, u64::MAX) => format!("{number}, 0 or more"),
                    (min, u64::MAX) => format!("{number}, at least {min}"),
                    (min, max) => format!("{number} from {min} to {max}"),
                };
                match word {
                    Some(word) => format!("{word} or {range}").into(),
                    None => range.into(),
                }
            }
            Accepts::Duration { min, max, such_as } => {
                match (min.is_zero(), max == Duration::MAX) {
                    (true, true) => format!("a duration such as {such_as}"),
                    (false, true) => {
                        format!("a duration of at least {}{}", short(min), such(such_as))
                    }
                    (true, false) => format!("a duration up to {}{}", short(max), such(such_as)),
                    (false, false) => format!(
                        "a duration from {} to {}{}",
                        short(min),
                        short(max),
                        such(such_as)
                    ),
                }
                .into()
            }
            Accepts::Size { min, max, such_as } => format!(
                "a size from {} to {}{}",
                size_shown(min),
                size_shown(max),
                such(such_as)
            )
            .into(),
        }
    }
}

/// A bound as a person writes it: `24h`, `1m`, `100ms`, the largest unit that divides it.
fn short(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0 => "0s".to_owned(),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
}

/// A size bound: `1GiB`, `512KiB`, `1 byte`.
fn size_shown(n: u64) -> String {
    const KIB: u64 = 1 << 10;
    match n {
        1 => "1 byte".to_owned(),
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{}GiB", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{}MiB", n >> 20),
        n if n >= KIB && n % KIB == 0 => format!("{}KiB", n >> 10),
        n => format!("{n} bytes"),
    }
}

/// What every setting has whatever its type: the README row, the `--check-config` line, and
/// the setting's name in errors.
pub(crate) struct Doc {
    pub(crate) key: &'static str,
    /// The first name is the documented one; the others are accepted aliases.
    pub(crate) env: &'static [&'static str],
    pub(crate) default: Option<&'static str>,
    pub(crate) accepts: Accepts,
    pub(crate) help: &'static str,
    pub(crate) secret: bool,
    /// The effective value as `--check-config` prints it; `<…>` marks a description.
    pub(super) show: fn(&Config) -> String,
    /// How the command line sets it, for the few settings that are also a flag.
    pub(crate) flag: Option<Flag>,
}

/// A setting that is also a command-line flag, as `--help` shows it: `--listen <ADDR>  Listen
/// address (EPODE_SIDECAR_LISTEN)`; the variable's name comes from the declaration.
pub(crate) struct Flag {
    /// `--` and the key with dashes (a test holds the two together).
    pub(crate) long: &'static str,
    /// The value's name; `None` for a switch, which sets the setting to `true`.
    pub(crate) value_name: Option<&'static str>,
    pub(crate) help: &'static str,
}

/// One setting, declared once: its [`Doc`] and the parser that makes its typed value (and
/// holds its bounds).
pub(crate) struct Setting<T> {
    pub(crate) doc: Doc,
    parse: fn(&str) -> Result<T, Bad>,
}

/// A setting's declaration, in the order the README columns read; what it accepts is said in
/// words, and `parse` checks it.
pub(super) const fn setting<T>(
    key: &'static str,
    env: &'static [&'static str],
    default: Option<&'static str>,
    accepts: &'static str,
    help: &'static str,
    parse: fn(&str) -> Result<T, Bad>,
    show: fn(&Config) -> String,
) -> Setting<T> {
    bounded(
        key,
        env,
        default,
        Accepts::Prose(accepts),
        help,
        parse,
        show,
    )
}

/// A setting whose value has bounds (a number, a duration, a size): `accepts` holds them,
/// checks them before `parse` converts the value, and states them in errors and the README.
pub(super) const fn bounded<T>(
    key: &'static str,
    env: &'static [&'static str],
    default: Option<&'static str>,
    accepts: Accepts,
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
            flag: None,
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

    /// The same declaration, also the flag `--long VALUE_NAME`.
    pub(super) const fn flag(
        self,
        long: &'static str,
        value_name: &'static str,
        help: &'static str,
    ) -> Self {
        self.with_flag(Flag {
            long,
            value_name: Some(value_name),
            help,
        })
    }

    /// The same declaration, also the switch `--long` (which sets it to `true`).
    pub(super) const fn switch(self, long: &'static str, help: &'static str) -> Self {
        self.with_flag(Flag {
            long,
            value_name: None,
            help,
        })
    }

    const fn with_flag(self, flag: Flag) -> Self {
        let Setting { doc, parse } = self;
        Setting {
            doc: Doc {
                flag: Some(flag),
                ..doc
            },
            parse,
        }
    }

    /// The typed value of `text`: within what the setting accepts, then parsed.
    pub(super) fn value(&self, text: &str) -> Result<T, Bad> {
        if self.doc.accepts.admits(text) {
            (self.parse)(text)
        } else {
            Err(Bad::Whole)
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

    /// `value` is refused; a secret's value is not shown, nor a URL's credentials and query,
    /// nor anything shaped like a product key.
    pub(super) fn invalid(&self, value: &str) -> ConfigError {
        ConfigError::Invalid {
            name: self.name(),
            value: if self.secret {
                "<redacted>".to_owned()
            } else if has_key_shape(value) {
                KEY_SHAPED.to_owned()
            } else {
                redact_url(value).into_owned()
            },
            accepts: self.accepts.text(),
        }
    }

    pub(super) fn missing(&self) -> ConfigError {
        ConfigError::Missing {
            name: self.name(),
            accepts: self.accepts.text(),
        }
    }
}

/// What an error shows instead of a value holding a product key, in whichever setting.
pub(super) const KEY_SHAPED: &str =
    "<redacted: it has the shape of an Epode product key, which belongs in EPODE_API_KEY only>";

/// A setting that could not be used, naming it and what it accepts. Secret values are not shown.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    #[error("{name}: `{value}` is not valid; expected {accepts}")]
    Invalid {
        name: String,
        value: String,
        accepts: Cow<'static, str>,
    },
    #[error("{name} is required: {accepts}")]
    Missing {
        name: String,
        accepts: Cow<'static, str>,
    },
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

impl ConfigError {
    /// The error with no value that holds `key` (the product key's text as configured, which
    /// may be malformed and so not key-shaped): a key put in another setting too stays unseen.
    pub(super) fn without_key(self, key: Option<&str>) -> ConfigError {
        match (self, key) {
            (
                ConfigError::Invalid {
                    name,
                    value,
                    accepts,
                },
                Some(key),
            ) if value.contains(key) => ConfigError::Invalid {
                name,
                value: HOLDS_THE_KEY.to_owned(),
                accepts,
            },
            (e, _) => e,
        }
    }
}

/// What an error shows instead of a value holding the configured product key.
const HOLDS_THE_KEY: &str = "<redacted: it holds the value of EPODE_API_KEY>";

/// Every mistake of a configuration, one a line in the order the settings are declared (a
/// misspelt variable last), so an operator fixes them all in one go.
/// Never empty: one mistake at least.
#[derive(Debug)]
pub(crate) struct ConfigErrors {
    first: ConfigError,
    more: Vec<ConfigError>,
}

impl ConfigErrors {
    /// The list of `mistakes`, when there is one.
    pub(super) fn new(mistakes: Vec<ConfigError>) -> Option<ConfigErrors> {
        let mut mistakes = mistakes.into_iter();
        let first = mistakes.next()?;
        Some(ConfigErrors {
            first,
            more: mistakes.collect(),
        })
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &ConfigError> {
        std::iter::once(&self.first).chain(&self.more)
    }

    /// The first mistake, for a caller that needs only one (the probe).
    pub(super) fn into_first(self) -> ConfigError {
        self.first
    }

    /// The list with no value that holds `key` (see [`ConfigError::without_key`]).
    pub(super) fn without_key(self, key: Option<&str>) -> ConfigErrors {
        ConfigErrors {
            first: self.first.without_key(key),
            more: self.more.into_iter().map(|e| e.without_key(key)).collect(),
        }
    }
}

impl From<ConfigError> for ConfigErrors {
    fn from(first: ConfigError) -> Self {
        ConfigErrors {
            first,
            more: Vec::new(),
        }
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.first)?;
        for e in &self.more {
            write!(f, "\n{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// A value that could not be read: its mistake is in the layers' list (only [`Layers`]
/// makes one, as it records the mistake), so a reader goes on and the list tells them all.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refused(());

/// Where a mistake is listed: the configuration file's first, then each setting's in
/// declaration order, then the misspelt variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    File,
    Setting(&'static str),
    Variable,
}

/// Builds a struct from fields each read as a `Result<_, Refused>`: every field is read (so
/// every mistake is recorded) before the struct is made, when all of them were. A field
/// without a value is the local of its name.
macro_rules! read_all {
    ($ty:ident { $($field:ident $(: $read:expr)?),* $(,)? }) => {{
        $(let $field = $crate::config::setting::read_all!(@value $field $($read)?);)*
        (|| -> Result<$ty, $crate::config::setting::Refused> {
            Ok($ty { $($field: $field?),* })
        })()
    }};
    (@value $field:ident) => { $field };
    (@value $field:ident $read:expr) => { $read };
}
pub(super) use read_all;

/// Every setting's value as the layers give it (the highest layer that has the key wins),
/// before it is parsed, and the mistakes found reading them. Read only through a declaration.
#[derive(Debug, Default)]
pub(crate) struct Layers {
    values: BTreeMap<&'static str, String>,
    mistakes: RefCell<Vec<(Place, ConfigError)>>,
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

    /// Records a mistake; reading goes on. A setting read twice (where two checks need it)
    /// is listed once.
    pub(super) fn record(&self, place: Place, e: ConfigError) -> Refused {
        let mut mistakes = self.mistakes.borrow_mut();
        let text = e.to_string();
        if !mistakes
            .iter()
            .any(|(p, m)| *p == place && m.to_string() == text)
        {
            mistakes.push((place, e));
        }
        Refused(())
    }

    /// Records a mistake in `doc`'s setting (a value refused, or a check between settings).
    pub(super) fn refuse(&self, doc: &Doc, e: ConfigError) -> Refused {
        self.record(Place::Setting(doc.key), e)
    }

    /// The mistakes recorded so far, each with its place, in the order found.
    pub(super) fn take_mistakes(&self) -> Vec<(Place, ConfigError)> {
        self.mistakes.take()
    }

    /// The setting's typed value, when it is set. A value shaped like a product key is
    /// refused in any setting but the key's own: it would be shown where a setting's value is
    /// (`--check-config`, the start line, a client's `serverInfo`).
    pub(super) fn optional<T>(&self, s: &Setting<T>) -> Result<Option<T>, Refused> {
        let Some(text) = self.text(s) else {
            return Ok(None);
        };
        if !s.doc.secret && has_key_shape(&text) {
            return Err(self.refuse(&s.doc, s.doc.invalid(&text)));
        }
        let e = match s.value(&text) {
            Ok(v) => return Ok(Some(v)),
            Err(Bad::Whole) => s.doc.invalid(&text),
            Err(Bad::Entry(entry)) => s.doc.invalid(&entry),
            Err(Bad::Described(value)) => ConfigError::Invalid {
                name: s.doc.name(),
                value: value.to_owned(),
                accepts: s.doc.accepts.text(),
            },
        };
        Err(self.refuse(&s.doc, e))
    }

    /// The setting's typed value, its declared default when it is set blank in a layer (a
    /// setting whose blank value means its default rather than "required").
    pub(super) fn get_or_default<T>(&self, s: &Setting<T>) -> Result<T, Refused> {
        match (self.optional(s)?, s.doc.default) {
            (Some(v), _) => Ok(v),
            (None, Some(d)) => s
                .value(d)
                .map_err(|_| self.refuse(&s.doc, s.doc.invalid(d))),
            (None, None) => Err(self.refuse(&s.doc, s.doc.missing())),
        }
    }

    /// The setting's typed value; unset is an error (every setting with a default has one).
    pub(super) fn get<T>(&self, s: &Setting<T>) -> Result<T, Refused> {
        self.optional(s)?
            .ok_or_else(|| self.refuse(&s.doc, s.doc.missing()))
    }
}

// The parsers declarations share. Each refuses with `Bad::Whole` unless it says otherwise.

/// A number (its bounds are the declaration's [`Accepts::whole`]).
pub(super) fn number<T: std::str::FromStr>(v: &str) -> Result<T, Bad> {
    v.parse().map_err(|_| Bad::Whole)
}

/// A duration such as `30s` (its bounds are the declaration's [`Accepts::duration`]).
/// A percentage, `50%` or `50`.
pub(super) fn percent(v: &str) -> Result<u8, Bad> {
    let v = v.trim();
    let n = v.strip_suffix('%').unwrap_or(v).trim();
    n.parse().map_err(|_| Bad::Whole)
}

pub(super) fn a_duration(v: &str) -> Result<Duration, Bad> {
    humantime::parse_duration(v).map_err(|_| Bad::Whole)
}

/// A duration of at least a millisecond: a zero timeout would fail every request.
pub(super) const AT_LEAST_1MS: Duration = Duration::from_millis(1);

/// A size in bytes (its bounds are the declaration's [`Accepts::size`]).
pub(super) fn a_size(v: &str) -> Result<u64, Bad> {
    bytes_with_unit(v).ok_or(Bad::Whole)
}

/// A whole number of bytes, or one with a unit (`KiB`, `MiB`, `GiB` are powers of 1024;
/// `kB`, `MB`, `GB` powers of 1000).
fn bytes_with_unit(v: &str) -> Option<u64> {
    let v = v.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (number, unit) = v.split_at(split);
    let number: u64 = number.parse().ok()?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return None,
    };
    number.checked_mul(scale)
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
