//! A string that must never reach a log: passwords, tokens, session keys.
//!
//! `Debug` and `Display` print `<redacted>`, so no `{:?}` of a request or a
//! response, at any verbosity, can show one. The value leaves the process
//! only through [`Secret::expose`] (to the SDK) and `Serialize` (the
//! response on stdout, which is the kubelet's and nobody else's).

use std::fmt;

use serde::{Serialize, Serializer};

#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Secret {
        Secret(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting_never_shows_the_value() {
        let secret = Secret::new("hunter2".into());
        assert_eq!(
            format!("{secret} {secret:?} {:?}", Some(&secret)),
            "<redacted> <redacted> Some(<redacted>)"
        );
        assert_eq!(secret.expose(), "hunter2");
        assert_eq!(serde_json::to_string(&secret).expect("JSON"), "\"hunter2\"");
    }
}
